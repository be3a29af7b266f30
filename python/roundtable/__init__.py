"""Roundtable: an orchestration sidecar for multi-agent chat.

The gateway sends an immutable snapshot per user turn over gRPC; Roundtable runs the
conversation graph and streams typed events back. See README.md and docs/architecture.md.
"""

__version__ = "0.1.0"
