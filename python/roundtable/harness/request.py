"""What flows through the harness chain."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from roundtable.domain.snapshot import ModelRef, ModelTarget
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
