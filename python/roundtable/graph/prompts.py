"""Prompt building: persona, skills, style rules, memories, history and the task.

One builder serves single chat and every group speaker, so a member behaves the same in
both. Prompts carry no credentials; they are the only place persona and memory text go.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from roundtable.domain import prompt_sections as sections
from roundtable.domain.plan import PlanStep
from roundtable.domain.snapshot import Member, Memory, MessageRole, SessionKind, Snapshot
from roundtable.graph.concurrency import PARALLEL_HINT, parallel
from roundtable.graph.state import ReplyDict
from roundtable.models.base import ChatMessage


def member_system_prompt(member: Member, snapshot: Snapshot, memories: Sequence[Memory]) -> str:
    """Who the member is: persona, skills, style rules, what it remembers, who else is here."""
    parts = [f"You are {member.display_name}."]
    if member.persona:
        parts.append(f"{sections.PERSONA}\n{member.persona}")
    if member.skills:
        skills = "\n".join(
            f"- {s.name}: {s.instructions}" if s.instructions else f"- {s.name}"
            for s in member.skills
        )
        parts.append(f"{sections.SKILLS}\n{skills}")
    if member.style_rules:
        parts.append(f"{sections.STYLE}\n" + "\n".join(f"- {r}" for r in member.style_rules))
    if memories:
        parts.append(f"{sections.MEMORIES}\n" + "\n".join(f"- {m.content}" for m in memories))
    others = [m.display_name for m in snapshot.members if m.member_id != member.member_id]
    if others and snapshot.session.kind is SessionKind.GROUP:  # a single chat is one-to-one
        parts.append(sections.GROUP_CHAT.format(others=", ".join(others)))
    return "\n\n".join(parts)


def member_messages(
    member: Member,
    snapshot: Snapshot,
    step: PlanStep,
    memories: Sequence[Memory],
    replies: Sequence[ReplyDict],
    *,
    words: str,
    history_limit: int,
) -> tuple[ChatMessage, ...]:
    """The whole prompt of one speaker's turn, answering the user's `words` (the turn's
    text, or the message a continue turn goes on with)."""
    names = {m.member_id: m.display_name for m in snapshot.members}
    messages = [ChatMessage("system", member_system_prompt(member, snapshot, memories))]
    for message in snapshot.history[-history_limit:] if history_limit else ():
        if message.role is MessageRole.USER:
            messages.append(ChatMessage("user", message.content))
        elif message.member_id == member.member_id:
            messages.append(ChatMessage("assistant", message.content))
        else:
            speaker = names.get(message.member_id, message.member_id or "someone")
            messages.append(ChatMessage("user", f"[{speaker}] {message.content}"))
    turn = words
    earlier = [r for r in replies if not r["failed"]]
    if earlier:
        said = "\n".join(
            f"[{names.get(r['member_id'], r['member_id'])}] {r['content']}" for r in earlier
        )
        turn = f"{turn}\n\nSo far in this turn:\n{said}"
    messages.append(ChatMessage("user", f"{turn}\n\n{sections.TASK}\n{step.task}"))
    return tuple(messages)


SUPERVISOR_INSTRUCTIONS = """You direct a group chat. You never speak to the user.
Decide who should answer the user's latest message, in what order, and give each speaker
a short task. Use only member ids from the roster. Keep the plan small: choose the
members whose persona or skills fit; one or two are usually enough. Set converged to true
when the speakers you chose will settle the question, false if another round is needed."""


def supervisor_messages(
    snapshot: Snapshot, replies: Sequence[ReplyDict], *, max_steps: int, round_no: int
) -> tuple[ChatMessage, ...]:
    """The supervisor's prompt: the roster (no personas' full text) and the conversation."""
    roster = [
        {
            "member_id": m.member_id,
            "display_name": m.display_name,
            "persona": m.persona[:200],
            "skills": [s.name for s in m.skills],
        }
        for m in snapshot.members
    ]
    hint = f"{PARALLEL_HINT}\n" if parallel(snapshot.session) else ""
    system = (
        f"{SUPERVISOR_INSTRUCTIONS}\nPlan at most {max_steps} steps. This is round {round_no}.\n"
        f"{hint}\n{sections.ROSTER}\n{json.dumps(roster, ensure_ascii=False)}"
    )
    user = snapshot.user_turn.text
    if replies:
        said = "\n".join(f"[{r['member_id']}] {r['content']}" for r in replies if not r["failed"])
        user = f"{user}\n\nAlready said this turn:\n{said}"
    return (ChatMessage("system", system), ChatMessage("user", user))


MEMORY_INSTRUCTIONS = """You propose memories for the members of a chat. Propose only facts
the user stated about themselves or explicitly asked to be remembered. Each proposal names
the member who should remember it, the action (create, update or forget), an importance
from 0 to 1, and the reply ids that support it. Propose nothing when nothing is worth it."""


def memory_messages(
    snapshot: Snapshot, replies: Sequence[ReplyDict], words: str
) -> tuple[ChatMessage, ...]:
    """The memory proposer's prompt: the user's `words` the replies answer (the turn's, or
    those of the stopped run a continue turn took over), and the replies, with ids to cite."""
    turn = {
        "user_text": words,
        "replies": [
            {"reply_id": r["reply_id"], "member_id": r["member_id"], "content": r["content"]}
            for r in replies
            if not r["failed"]
        ],
        "existing_memories": {
            m.member_id: [{"memory_id": x.memory_id, "content": x.content} for x in m.memories[:20]]
            for m in snapshot.members
            if m.memories
        },
    }
    system = f"{MEMORY_INSTRUCTIONS}\n\n{sections.TURN}\n{json.dumps(turn, ensure_ascii=False)}"
    return (ChatMessage("system", system), ChatMessage("user", words))
