"""A run's progress, derived from its events: the plan so far and the replies done.

The event log is the source of truth for resume: a speaker is finished when its
assistant_final (or speaker_failed) is in the log, whatever any checkpoint says.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from roundtable.domain.events import (
    AssistantFinal,
    Envelope,
    Event,
    MemoryProposed,
    PermissionRequired,
    PlanCreated,
    ReplySummary,
    RunCancelled,
    RunCompleted,
    SpeakerFailed,
    SpeakerStarted,
    TokenUsage,
)
from roundtable.domain.plan import PlanSource, PlanStep


@dataclass(slots=True)
class Progress:
    """Plan steps in order, finished replies, rounds planned."""

    steps: list[PlanStep] = field(default_factory=list)
    finished: dict[str, str | None] = field(default_factory=dict)
    """reply_id -> final content, or None when the speaker failed."""
    usage: dict[str, TokenUsage] = field(default_factory=dict)
    """reply_id -> the tokens its final reports (a resumed run's usage counts them)."""
    rounds: int = 0
    memory_proposed: bool = False
    verdicts: dict[int, tuple[PlanSource, bool]] = field(default_factory=dict)
    """round -> (who planned it, whether the discussion was finished after it)."""
    permissions: dict[str, PermissionRequired] = field(default_factory=dict)
    """The permission requests in the log, by id (whether decided is the store's to say)."""
    started: dict[str, int] = field(default_factory=dict)
    """reply_id -> the attempt its last speaker_started in the log began."""

    @classmethod
    def of(cls, envelopes: Iterable[Envelope]) -> Progress:
        """The progress a run's logged events record."""
        progress = cls()
        for envelope in envelopes:
            progress.observe(envelope.event)
        return progress

    def observe(self, event: Event) -> None:
        """Updates the progress with one durable event (emitted here, or read from the log)."""
        if isinstance(event, SpeakerStarted):
            self.started[event.reply_id] = event.attempt
        elif isinstance(event, PlanCreated):
            self._plan(event.round, event.source, event.converged, event.steps)
        elif isinstance(event, AssistantFinal):
            self.finished[event.reply_id] = event.content
            self.usage[event.reply_id] = event.usage
        elif isinstance(event, SpeakerFailed):
            self.finished.setdefault(event.reply_id, None)
        elif isinstance(event, MemoryProposed):
            self.memory_proposed = True
        elif isinstance(event, PermissionRequired):
            self.permissions[event.permission_request_id] = event

    def _plan(
        self, round_: int, source: PlanSource, converged: bool, steps: Iterable[PlanStep]
    ) -> None:
        self.rounds = max(self.rounds, round_)
        # Only the supervisor asks for more rounds; any other plan is final.
        self.verdicts[round_] = (source, converged if source is PlanSource.SUPERVISOR else True)
        known = {s.reply_id for s in self.steps}
        self.steps.extend(s for s in steps if s.reply_id not in known)

    @property
    def steps_left(self) -> list[PlanStep]:
        """Planned steps without a final or failure yet."""
        return [s for s in self.steps if s.reply_id not in self.finished]

    @property
    def finished_reply_ids(self) -> list[str]:
        """Replies that are final (failed speakers excluded), in step order."""
        return [s.reply_id for s in self.steps if self.finished.get(s.reply_id) is not None]


def completed_event(state: dict[str, Any], progress: Progress) -> RunCompleted:
    """The run_completed of an execution whose graph ended with `state`."""
    replies = [r for r in state.get("replies", []) if not r["failed"]]
    return RunCompleted(
        replies=tuple(
            ReplySummary(reply_id=r["reply_id"], member_id=r["member_id"], step=r["step"])
            for r in sorted(replies, key=lambda r: r["step"])
        ),
        usage=TokenUsage(state.get("input_tokens", 0), state.get("output_tokens", 0)),
        converged=bool(state.get("converged", True)),
        rounds=max(progress.rounds, int(state.get("round", 0))),
    )


def cancelled_event(reason: str, progress: Progress) -> RunCancelled:
    """The run_cancelled of a run stopped for `reason`, with what it finished and left."""
    return RunCancelled(
        reason=reason,
        finished_reply_ids=tuple(progress.finished_reply_ids),
        steps_left=tuple(progress.steps_left),
    )
