"""The model-call harness: timeout, retry, circuit breaker, failover and audit, as a chain."""
