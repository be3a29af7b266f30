"""Graph state: plain, serializable data about the run's progress. No snapshot, no secrets.

Steps and replies are plain dicts (not dataclasses) so any checkpoint serializer stores
them without an import allow-list.
"""

from __future__ import annotations

from typing import TypedDict

from roundtable.domain.events import TokenUsage
from roundtable.domain.plan import PlanStep


class StepDict(TypedDict):
    """A `PlanStep` as plain data."""

    index: int
    member_id: str
    reply_id: str
    task: str
    token_budget: int
    round: int
    count_off_number: int
    parallel_group: int


class ReplyDict(TypedDict):
    """A finished reply, as later speakers and memory proposals see it."""

    reply_id: str
    member_id: str
    step: int
    content: str
    failed: bool


class ConversationState(TypedDict, total=False):
    """The run's progress. Each node returns only the keys it changes."""

    route: str
    directive: str
    source: str
    steps: list[StepDict]
    replies: list[ReplyDict]
    round: int
    converged: bool
    input_tokens: int
    output_tokens: int
    finished: bool
    """Set by the last node: the graph reached its end (no checkpoint is kept of it)."""


def step_to_dict(step: PlanStep) -> StepDict:
    """Plain data of a step."""
    return StepDict(
        index=step.index,
        member_id=step.member_id,
        reply_id=step.reply_id,
        task=step.task,
        token_budget=step.token_budget,
        round=step.round,
        count_off_number=step.count_off_number,
        parallel_group=step.parallel_group,
    )


def step_from_dict(data: StepDict) -> PlanStep:
    """The step of plain data (a checkpoint written before parallel groups has none)."""
    return PlanStep(**data)


def tokens_with(state: ConversationState, usage: TokenUsage) -> ConversationState:
    """The run's token counts with `usage` added: what a node that called models writes
    (every attempt's tokens, failed ones too)."""
    return {
        "input_tokens": state.get("input_tokens", 0) + usage.input_tokens,
        "output_tokens": state.get("output_tokens", 0) + usage.output_tokens,
    }
