"""Shared test helpers (real servers and fakes the test suites start)."""
