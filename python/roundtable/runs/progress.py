"""A run's progress, derived from its events: the plan so far and the replies done.

The event log is the source of truth for resume: a speaker is finished when its
assistant_final (or speaker_failed) is in the log, whatever any checkpoint says.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from roundtable.api.convert import plan_source_from_proto, plan_step_from_proto
from roundtable.domain.events import (
    AssistantFinal,
    Event,
    MemoryProposed,
    PlanCreated,
    SpeakerFailed,
    TokenUsage,
)
from roundtable.domain.plan import PlanSource, PlanStep
from roundtable.v1 import events_pb2 as epb


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

    def observe_emitted(self, event: Event) -> None:
        """Updates the progress with a durable event this process emits (`observe` reads
        logged ones): the plan's steps and the replies are the emitted objects, shared with
        the graph, rather than copies decoded from protobuf."""
        if isinstance(event, PlanCreated):
            self._plan(event.round, event.source, event.converged, event.steps)
        elif isinstance(event, AssistantFinal):
            self.finished[event.reply_id] = event.content
            self.usage[event.reply_id] = event.usage
        elif isinstance(event, SpeakerFailed):
            self.finished.setdefault(event.reply_id, None)
        elif isinstance(event, MemoryProposed):
            self.memory_proposed = True

    def _plan(
        self, round_: int, source: PlanSource, converged: bool, steps: Iterable[PlanStep]
    ) -> None:
        self.rounds = max(self.rounds, round_)
        # Only the supervisor asks for more rounds; any other plan is final.
        self.verdicts[round_] = (source, converged if source is PlanSource.SUPERVISOR else True)
        known = {s.reply_id for s in self.steps}
        self.steps.extend(s for s in steps if s.reply_id not in known)

    def observe(self, event: epb.RunEvent) -> None:
        """Updates the progress with one durable event."""
        kind = event.WhichOneof("payload")
        if kind == "plan_created":
            plan = event.plan_created
            self._plan(
                plan.round,
                plan_source_from_proto(plan.source),
                plan.converged,
                (plan_step_from_proto(s) for s in plan.steps),
            )
        elif kind == "assistant_final":
            final = event.assistant_final
            self.finished[final.reply_id] = final.content
            self.usage[final.reply_id] = TokenUsage(
                final.usage.input_tokens, final.usage.output_tokens
            )
        elif kind == "speaker_failed":
            self.finished.setdefault(event.speaker_failed.reply_id, None)
        elif kind == "memory_proposed":
            self.memory_proposed = True

    @property
    def steps_left(self) -> list[PlanStep]:
        """Planned steps without a final or failure yet."""
        return [s for s in self.steps if s.reply_id not in self.finished]

    @property
    def finished_reply_ids(self) -> list[str]:
        """Replies that are final (failed speakers excluded), in step order."""
        return [s.reply_id for s in self.steps if self.finished.get(s.reply_id) is not None]
