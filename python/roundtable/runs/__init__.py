"""Runs: the live-run registry, event numbering and write-ahead, fan-out, idempotent starts."""
