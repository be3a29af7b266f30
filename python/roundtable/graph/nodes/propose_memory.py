"""propose_memory: after the turn, suggest memories; the gateway decides what to keep.

The session's default model proposes through structured output (the offline model from
explicit statements: "remember that ...", "记住…", "I prefer ..."). Proposals are checked
against the snapshot: a proposal for a member who does not exist, citing a reply that
is not this run's, or updating a memory the member does not have, is dropped. A turn
with nothing to remember (a count-off, a stop, a turn with no reply, a resumed turn that
already proposed) costs no model call, and no super-step either: convergence then ends the
graph at dispatch (`nothing_to_remember`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Literal

from langgraph.runtime import Runtime
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from roundtable.domain import prompt_sections
from roundtable.domain.errors import ModelError
from roundtable.domain.events import MemoryAction, MemoryProposal, MemoryProposed, TokenUsage
from roundtable.domain.plan import DirectiveKind
from roundtable.domain.snapshot import MAX_MEMORY_BYTES, Member, Snapshot
from roundtable.graph.context import GraphContext
from roundtable.graph.member import call_meta
from roundtable.graph.prompts import memory_messages
from roundtable.graph.state import ConversationState, ReplyDict, tokens_with
from roundtable.harness.request import ModelRequest
from roundtable.models.base import ChatCall, unheard

log = logging.getLogger(__name__)

_NOTHING_TO_REMEMBER = {DirectiveKind.COUNT_OFF.value, DirectiveKind.STOP.value}


class ProposedMemory(BaseModel):
    """One memory the model suggests."""

    model_config = ConfigDict(extra="ignore")

    member_id: str = Field(description="The member who should remember it.", max_length=128)
    action: Literal["create", "update", "forget"]
    target_memory_id: str = Field(default="", description="For update and forget.", max_length=128)
    content: str = Field(default="", max_length=4000)
    importance: float = Field(
        default=0.5,
        ge=0,
        le=1,
        # Said in words: the portable schema a server is sent has no minimum or maximum.
        description="From 0 (trivial) to 1 (essential).",
    )
    evidence_reply_ids: list[str] = Field(default_factory=list)


class MemoryProposals(BaseModel):
    """The memories worth keeping from this turn (often none)."""

    model_config = ConfigDict(title=prompt_sections.MEMORY_PROPOSALS_TOOL, extra="ignore")

    proposals: list[ProposedMemory] = Field(default_factory=list)

    @field_validator("proposals", mode="wrap")
    @classmethod
    def _each_on_its_own(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        """Drops a proposal that does not fit its schema (an importance of 1.5, a content
        over 4,000 characters), keeping the others: one bad field failed the whole answer,
        and the turn proposed nothing (review). The schema the model sees is unchanged."""
        if not isinstance(value, list):
            return handler(value)
        kept = []
        for item in value:
            try:
                kept.append(ProposedMemory.model_validate(item))
            except ValidationError:
                continue
        return kept


MAX_PROPOSALS = 32
"""Proposals one MemoryProposed carries at most: with each content's 4,000 characters the
event stays far inside the 4 MiB a default gRPC client accepts."""


def accept(
    proposals: list[ProposedMemory], snapshot: Snapshot, replies: list[ReplyDict], run_id: str
) -> tuple[MemoryProposal, ...]:
    """Keeps the proposals that refer to real members, memories and this run's replies
    (the first `MAX_PROPOSALS` of them, each citing a reply at most once)."""
    reply_ids = {r["reply_id"] for r in replies if not r["failed"]}
    members = {m.member_id: m for m in snapshot.members}
    out: list[MemoryProposal] = []
    # The same memory proposed twice (a member who spoke in two rounds, say) is one
    # proposal, citing the evidence of both.
    same: dict[tuple[str, str, str, str], int] = {}
    for p in proposals:
        member = members.get(p.member_id)
        if len(out) >= MAX_PROPOSALS:
            break
        # dict.fromkeys: a model repeating one id a million times cites it once.
        evidence = tuple(
            dict.fromkeys(e for e in p.evidence_reply_ids if e in reply_ids or e == "user")
        )
        if member is None or not evidence or not _changes(p, member):
            continue
        key = (p.member_id, p.action, p.target_memory_id, p.content.strip())
        if key in same:
            first = out[same[key]]
            out[same[key]] = dataclasses.replace(
                first,
                importance=max(first.importance, p.importance),
                evidence_reply_ids=tuple(dict.fromkeys((*first.evidence_reply_ids, *evidence))),
            )
            continue
        same[key] = len(out)
        out.append(
            MemoryProposal(
                proposal_id=f"{run_id}:memory:{len(out)}",
                member_id=p.member_id,
                action=MemoryAction(p.action),
                target_memory_id=p.target_memory_id if p.action != "create" else "",
                content=p.content.strip() if p.action != "forget" else "",
                importance=p.importance,
                evidence_reply_ids=evidence,
            )
        )
    return tuple(out)


def _changes(p: ProposedMemory, member: Member) -> bool:
    """Whether the proposal would change what the member remembers, in a memory the
    gateway can send back: forgetting or updating one it has (not to the same words),
    creating one it does not have; content with a letter or a digit in it (not "：") and
    no longer than a memory may be (`MAX_MEMORY_BYTES`: 4,000 CJK characters are 12 KB,
    and the next turn that sent it back was refused, review)."""
    current = {m.memory_id: m.content.strip() for m in member.memories}
    content = p.content.strip()
    if p.action == "forget":
        return p.target_memory_id in current
    if not any(ch.isalnum() for ch in content) or len(content.encode()) > MAX_MEMORY_BYTES:
        return False
    if p.action == "update":
        return current.get(p.target_memory_id, content) != content
    return content not in current.values()


def nothing_to_remember(state: ConversationState, ctx: GraphContext) -> bool:
    """Whether this turn has nothing to propose memories from: a count-off or a stop, no
    reply that did not fail, or proposals already emitted by an earlier execution."""
    return (
        state.get("directive") in _NOTHING_TO_REMEMBER
        or ctx.prior.memory_proposed
        or all(r["failed"] for r in state.get("replies", []))
    )


async def propose_memory(
    state: ConversationState, runtime: Runtime[GraphContext]
) -> ConversationState:
    """Asks the default model for memory proposals and emits the valid ones.

    The graph's last node: it also marks the graph finished, which tells the checkpoint
    saver that this run will never resume (store/checkpoints.py).
    """
    update = await _propose(state, runtime.context)
    update["finished"] = True
    return update


async def _propose(state: ConversationState, ctx: GraphContext) -> ConversationState:
    if nothing_to_remember(state, ctx):
        return {}
    # A stop someone asked for during the last speaker: the plan is finished (the run
    # completes), but the person stopped it, so no more model calls (a bonus is not worth
    # one). A server's shutdown is nobody's stop: the proposal is still asked for in its
    # grace (review: else it was lost for good, the run having completed).
    await ctx.stop.refresh()
    if ctx.stop.denies:
        log.info("memory proposal skipped (run %s): stop requested", ctx.request.context.run_id)
        return {}
    replies = [r for r in state.get("replies", []) if not r["failed"]]
    snapshot = ctx.request.snapshot
    ref = snapshot.session.default_model
    try:
        result = await ctx.harness.call(
            ModelRequest(
                ref=ref,
                call=ChatCall(
                    # A continue turn's words are "继续": its speakers answer, and its
                    # memories come from, what the run it took over was answering (outside
                    # testing: stop, then continue, proposed nothing).
                    messages=memory_messages(
                        snapshot, replies, ctx.continued_words or snapshot.user_turn.text
                    ),
                    max_tokens=1024,
                    temperature=0.0,
                    schema=MemoryProposals,
                    choices=(
                        ("proposals.member_id", tuple(m.member_id for m in snapshot.members)),
                        (
                            "proposals.evidence_reply_ids",
                            (*(r["reply_id"] for r in replies), "user"),
                        ),
                    ),
                ),
                meta=call_meta(ctx, "propose_memory"),
                credentials=ctx.credentials,
                on_text=unheard,
            )
        )
    except ModelError as exc:
        # Memory is a bonus: the turn's replies are already delivered, so it still succeeds.
        # The error's text is Roundtable's own (a status, "connection refused"): it says
        # why without the provider's message, which may echo the prompt.
        log.warning(
            "memory proposal skipped (run %s): %s %s", ctx.request.context.run_id, exc.code, exc
        )
        return _spent(state, exc.spent)  # the run's usage counts the failed call's tokens
    assert isinstance(result.parsed, MemoryProposals)
    proposals = accept(result.parsed.proposals, snapshot, replies, ctx.request.context.run_id)
    if proposals:
        await ctx.sink.emit(MemoryProposed(proposals=proposals))
    return _spent(state, result.usage)


def _spent(state: ConversationState, usage: TokenUsage) -> ConversationState:
    """The run's token counts with `usage` added (nothing to write when it is none)."""
    if not (usage.input_tokens or usage.output_tokens):
        return {}
    return tokens_with(state, usage)
