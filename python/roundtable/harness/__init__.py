"""The call harnesses: model calls (timeout, retry, circuit breaker, failover, audit) and
tool calls (the same without failover, retries for read-only tools only), as chains."""
