"""Plans: who speaks, in what order, with what task."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Route(StrEnum):
    """The path a turn takes through the conversation graph."""

    SINGLE = "single"
    GROUP = "group"


class DirectiveKind(StrEnum):
    """What the user's turn asked for, read by code, never by a model."""

    SINGLE = "single"
    OPEN = "open"
    MENTION = "mention"
    ALL = "all"
    COUNT_OFF = "count_off"
    STOP = "stop"
    CONTINUE = "continue"


class PlanSource(StrEnum):
    """Who made a plan."""

    DETERMINISTIC = "deterministic"
    SUPERVISOR = "supervisor"
    FALLBACK = "fallback"
    CONTINUED = "continued"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanStep:
    """One speaker's turn."""

    index: int
    member_id: str
    reply_id: str
    task: str
    token_budget: int
    round: int = 1
    count_off_number: int = 0
    """For a count-off: the number this speaker must say (from 1); 0 otherwise."""
    parallel_group: int = 0
    """Steps with the same non-zero group start together; 0: the step runs alone."""


def reply_id_for(run_id: str, step_index: int) -> str:
    """The reply id of a step: derived, never random, so a replayed step keeps its id."""
    return f"{run_id}#{step_index}"


def run_of_reply(reply_id: str) -> str:
    """The run a reply id was made for (`reply_id_for`; run ids hold no "#"): another run's
    for a step a continue turn took over."""
    return reply_id.rpartition("#")[0]
