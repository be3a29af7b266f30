"""What flows through the harness chain."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from roundtable.domain.snapshot import ModelRef, ModelTarget
from roundtable.domain.tools import ToolCallRef, ToolResult
from roundtable.models.base import ChatCall, ChatResult, TextSink


@dataclass(frozen=True, slots=True, kw_only=True)
class CallMeta:
    """Correlation fields of a call: what audit records and spans may carry, and nothing else."""

    thread_id: str
    run_id: str
    request_id: str
    tenant: str
    caller_node: str


class _Kept:
    """The default of `with_attempt`'s on_restart: the request's own is kept."""


KEPT = _Kept()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """One model call on its way through the chain.

    Outer layers fill in `target` (failover) and `attempt` (retry) as the call moves inward.
    `credentials` is excluded from repr so a logged request never shows a key.
    """

    ref: ModelRef
    call: ChatCall
    meta: CallMeta
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    on_text: TextSink | None = None
    on_restart: Callable[[], None] | None = None
    """Called before an attempt that follows one which already streamed text."""
    target: ModelTarget | None = None
    attempt: int = 1

    @property
    def resolved_target(self) -> ModelTarget:
        """The target this attempt goes to (the ref's own until failover picks another)."""
        return self.target or self.ref.target

    def with_attempt(
        self,
        *,
        target: ModelTarget | None,
        attempt: int,
        on_text: TextSink | None,
        on_restart: Callable[[], None] | _Kept | None = KEPT,
    ) -> ModelRequest:
        """This request bound for `target` as attempt `attempt`, streaming to `on_text`
        (and told to restart through `on_restart`, when given).

        Spelled out rather than `dataclasses.replace`, which introspects the fields on every
        call (≈10 µs; each model call makes two).
        """
        return ModelRequest(
            ref=self.ref,
            call=self.call,
            meta=self.meta,
            credentials=self.credentials,
            on_text=on_text,
            on_restart=self.on_restart if isinstance(on_restart, _Kept) else on_restart,
            target=target,
            attempt=attempt,
        )


Handler = Callable[[ModelRequest], Awaitable[ChatResult]]
"""Anything that takes a request to a result: a layer, or the provider call at the end."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolRequest:
    """One tool call on its way through the tool chain; the retry layer fills in `attempt`.

    Its repr names the tool, server, key and attempt, never the arguments (the model wrote
    them from the conversation) or the token.
    """

    ref: ToolCallRef
    meta: CallMeta
    token: str | None = field(default=None, repr=False)
    """The tool server's bearer token, resolved from the run's credentials."""
    attempt: int = 1

    def __repr__(self) -> str:
        ref = self.ref
        return (
            f"ToolRequest(tool={ref.tool.name!r}, server_id={ref.server.server_id!r}, "
            f"key={ref.key!r}, attempt={self.attempt}, meta={self.meta!r})"
        )

    def with_attempt(self, attempt: int) -> ToolRequest:
        """This request as attempt `attempt` (spelled out, as `ModelRequest.with_attempt`)."""
        return ToolRequest(ref=self.ref, meta=self.meta, token=self.token, attempt=attempt)


ToolHandler = Callable[[ToolRequest], Awaitable[ToolResult]]
"""A tool-chain layer, or the call to the tool server at the end."""
