"""Durable storage: the run registry and the event log (and, by the root, the checkpointer)."""
