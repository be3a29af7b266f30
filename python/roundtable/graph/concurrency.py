"""Which steps of a plan speak at once (SpeakerConcurrency.PARALLEL), and in what batches.

A plan marks independent steps with a shared `parallel_group`; `batches` turns the steps
still open into what dispatch runs: a batch of one (a step that runs alone, after everything
before it) or a batch of steps that start together. Groups are numbered per round, so the
leftover steps of two rounds never merge into one batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from roundtable.domain.plan import PlanStep
from roundtable.domain.snapshot import Session, SpeakerConcurrency

PARALLEL_HINT = (
    "Speakers of a round answer at once unless a step sets builds_on_previous to true: such "
    "a step waits for the replies before it in this round, and sees them."
)
"""What the supervisor is told in a PARALLEL session about its plan's independence marker."""


def parallel(session: Session) -> bool:
    """Whether the session's independent speakers answer at once."""
    return session.speaker_concurrency is SpeakerConcurrency.PARALLEL


def all_at_once(steps: list[PlanStep], session: Session) -> list[PlanStep]:
    """A deterministic plan's steps (count-off, @all, @mentions): one group in a PARALLEL
    session with more than one speaker, else unchanged."""
    if not parallel(session) or len(steps) < 2:
        return steps
    return [dataclasses.replace(s, parallel_group=1) for s in steps]


def by_marker(
    steps: list[PlanStep], builds_on_previous: Sequence[bool], session: Session
) -> list[PlanStep]:
    """A supervisor plan's steps grouped by its marker: a step that builds on the previous
    ones starts a new group; the others join the group before them."""
    if not parallel(session) or len(steps) < 2:
        return steps
    group, grouped = 1, []
    for i, step in enumerate(steps):
        if i and builds_on_previous[i]:
            group += 1
        grouped.append(dataclasses.replace(step, parallel_group=group))
    return grouped


def batches(steps: Sequence[PlanStep]) -> Iterator[list[PlanStep]]:
    """The open steps in the batches dispatch runs, in plan order."""
    batch: list[PlanStep] = []
    for step in steps:
        if batch and (
            step.parallel_group == 0
            or (step.round, step.parallel_group) != (batch[0].round, batch[0].parallel_group)
        ):
            yield batch
            batch = []
        batch.append(step)
        if step.parallel_group == 0:
            yield batch
            batch = []
    if batch:
        yield batch
