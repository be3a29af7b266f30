"""The real llama-server the tests under tests/real_model run against."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LlamaServer:
    """The running llama-server: its OpenAI-compatible base URL, model name and log."""

    base_url: str
    model: str
    log: Path

    @property
    def root_url(self) -> str:
        """The server's own endpoints (/health, /slots) live beside /v1."""
        return self.base_url.removesuffix("/v1")

    def log_text(self) -> str:
        """What the server has logged so far."""
        return self.log.read_text("utf-8", "replace")
