"""What the offline model says: deterministic answers read from Roundtable's own prompt
sections (`domain.prompt_sections`). `models.offline` wraps them in a LangChain chat model
(streaming, usage, faults and latency)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from roundtable.domain import prompt_sections as sections
from roundtable.domain.words import EVERYONE, Twins, alternation, simplified

# The count-off task as graph/countoff.count_off_task writes it, from its start: a user's
# question about "number 7" that a supervisor puts in a task is no count-off.
_NUMBER_TASK = re.compile(r"^Count-off \(报数\): you are number (\d+) of \d+\.")
# The supervisor prompt's step limit, as graph/prompts.supervisor_messages writes it.
_MAX_STEPS = re.compile(r"^Plan at most (\d+) steps\.", re.MULTILINE)
REMEMBER: Twins = (
    (("please remember that", "please remember"), ("请记住",)),
    (("remember that", "remember:", "remember"), ("记住",)),
)
"""Cues whose rest of the sentence the offline model proposes to remember ("remember that
X" keeps X). The longest cue is tried first, so each polite cue needs its own "that": with
"please remember" alone, "please remember that X" kept "that X"."""
PREFER: Twins = ((("I prefer",), ("我更喜欢",)), (("I like",), ("我喜欢",)))
"""Statements the offline model proposes to remember whole (the verb is the fact)."""


def _as_words(cue: str) -> str:
    """An English cue only as whole words ("I like", not "sushi like" or "I liked")."""
    return rf"(?<!\w){re.escape(cue)}" + (r"\b" if cue[-1].isalnum() else "")


CUE_INSIDE_WORDS = ("登", "忘", "书")
"""Characters before a Chinese cue that make it part of other words, as English cues are
read only as whole words: 登记 + 住址 ("请登记住址" asks to register an address, not to
remember "址"; outside testing), 忘记 + 住址 ("别忘记住址"), 书记 + 住在 ("书记住在北京": the
secretary lives in Beijing). Not 日 (每日记住一个词 is a cue) nor 牢 (牢牢记住 is one)."""


_EXPLICIT_MEMORY = re.compile(
    rf"(?<![{''.join(CUE_INSIDE_WORDS)}])"
    rf"(?:(?:{alternation(REMEMBER, _as_words)})[:：,，]?\s*([^.!?。！？\n]+))"
    rf"|((?:{alternation(PREFER, _as_words)})\s*[^.!?。！？\n]+)",
    re.IGNORECASE,
)


_OPENERS = ("Well,", "Honestly,", "Here is my take", "Let me add this", "If you ask me,")
_STANCES = (
    "I would start small and see what holds up.",
    "I'd first ask what could go wrong, then decide.",
    "there is a simple answer hiding in there; let's find it together.",
    "the facts matter most, so let's gather them first.",
    "every good plan starts with a good story, and this one has promise.",
    "patience will serve us better than haste here.",
)


def _sections(text: str) -> dict[str, str]:
    """Splits a prompt into its `## Heading` sections."""
    out: dict[str, str] = {}
    current = ""
    # "\n" only: splitlines() also splits at U+2028, U+0085 and friends, which JSON
    # sections carry unescaped (json.dumps with ensure_ascii=False) inside a user's text.
    for line in text.split("\n"):
        if line.startswith("## "):
            current = line.strip()
            out[current] = ""
        elif current:
            out[current] += line + "\n"
    return {k: v.strip() for k, v in out.items()}


def _mentions(text: str, word: str) -> bool:
    """Whether `word` occurs in `text` (whole words for Latin script, substrings for CJK)."""
    word = word.lower().strip()
    if not word:
        return False
    if word.isascii():
        return re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", text) is not None
    return word in text


def _seed(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("|".join(parts).encode(), digest_size=4).digest(), "big")


_EVERYONE = alternation(EVERYONE, re.escape)


_GROUP = re.compile(
    re.escape(sections.GROUP_CHAT).replace(re.escape("{others}"), "(.+?)"), re.MULTILINE
)


def _without_mentions(text: str, names: Sequence[str]) -> str:
    """The user's words without the @s that address members: the members' names (the
    speaker's and, in a group, the others' its prompt lists) and the words for everyone, in
    either language (CJK text runs on after them without a space: "@张三你好" is 你好,
    "@所有人你们好" is 你们好), and any other ASCII @name up to its end."""
    ordered = sorted({n for n in names if n}, key=len, reverse=True)
    members = "".join(f"{re.escape(n)}|" for n in ordered)
    pattern = rf"@(?:{members}{_EVERYONE}|[A-Za-z0-9_.\-]+)\s*"
    return re.sub(pattern, "", text, flags=re.IGNORECASE)


def reply(system: str, last_user: str) -> str:
    """A member's answer: its count-off number, or a line in a voice its persona picks."""
    task = _sections(last_user).get(sections.TASK, "") or last_user.strip()
    number = _NUMBER_TASK.search(task)
    if number:
        return f"{number.group(1)}!"
    secs = _sections(system)
    name_match = re.match(r"You are (.+?)\.", system)
    name = name_match.group(1) if name_match else "Assistant"
    # The persona picks the voice (opener and stance) but is never quoted: the contract
    # keeps it out of events, and this model's reply is one (outside testing).
    persona = secs.get(sections.PERSONA, "")
    topic = last_user.split(sections.TASK)[0].strip().splitlines()
    group = _GROUP.search(system)
    names = [name, *(group.group(1).split(", ") if group else ())]
    subject = _without_mentions(topic[0] if topic else task, names).strip()[:80] or task[:80]
    seed = _seed(name, subject, persona)
    reply = f"{_OPENERS[seed % len(_OPENERS)]} about \u201c{subject}\u201d: "
    reply += _STANCES[(seed // 7) % len(_STANCES)]
    memories = secs.get(sections.MEMORIES, "")
    if memories:
        reply += f" I remember: {memories.splitlines()[0].lstrip('- ')[:80]}"
    return reply


def tool_args(name: str, system: str, last_user: str, *, bad: bool) -> dict[str, Any]:
    """The arguments of a structured answer: a supervisor plan or memory proposals."""
    secs = _sections(system)
    if name == sections.SUPERVISOR_PLAN_TOOL:
        roster: list[dict[str, Any]] = json.loads(secs.get(sections.ROSTER, "[]") or "[]")
        most = _MAX_STEPS.search(system)
        return _plan(roster, last_user, bad=bad, max_steps=int(most.group(1)) if most else 2)
    if name == sections.MEMORY_PROPOSALS_TOOL:
        turn: dict[str, Any] = json.loads(secs.get(sections.TURN, "{}") or "{}")
        return _memories(turn)
    return {}


def _plan(roster: list[dict[str, Any]], text: str, *, bad: bool, max_steps: int) -> dict[str, Any]:
    if bad:
        return {"steps": [{"member_id": "no-such-member", "task": "speak"}], "converged": True}
    lowered = text.lower()
    chosen = [
        m
        for m in roster
        if any(_mentions(lowered, w) for w in [m.get("display_name", ""), *m.get("skills", [])])
    ] or roster[:2]
    chosen = chosen[: max(1, max_steps)]  # as the prompt's "Plan at most N steps" asks
    topic = re.sub(r"\s+", " ", text).strip()[:200]
    steps = [{"member_id": m["member_id"], "task": f"Give your view on: {topic}"} for m in chosen]
    return {"steps": steps, "converged": True}


def remembered(text: str) -> list[str]:
    """What the offline model proposes to remember from the user's text, in order: what
    a statement says, not a question ("Do you remember my cat?", "你记住我的猫了吗"), nor what
    it asks to be kept out ("don't remember that ...", "不要记住..."). Read in simplified
    characters too ("記住", "我喜歡"); what it keeps is the text as written."""
    read = simplified(text)
    kept = []
    for m in _EXPLICIT_MEMORY.finditer(read):
        group = 1 if m.group(1) is not None else 2
        if read[m.end() : m.end() + 1] in _QUESTION_MARKS or _NOT_A_STATEMENT.search(
            read, 0, m.start()
        ):
            continue
        if m.group(group).rstrip().endswith(QUESTION_PARTICLES):
            continue
        kept.append(text[m.start(group) : m.end(group)].strip())
    return kept


_QUESTION_MARKS = ("?", "？")
QUESTION_PARTICLES = ("吗", "么")
"""A Chinese sentence that ends so asks ("你记住我的猫了吗"), as "do you" starts one."""
NOT_A_STATEMENT: Twins = (
    (("don't", "do not", "never"), ("不要", "不用", "别")),
    (("do you", "did you"), ("你有没有",)),
)
"""Words right before a cue that make it no request to remember: a negation or a question."""
_NOT_A_STATEMENT = re.compile(
    rf"(?:{alternation(NOT_A_STATEMENT, _as_words)})\s*(?:please\s+|请)?$", re.IGNORECASE
)


def _memories(turn: dict[str, Any]) -> dict[str, Any]:
    text = str(turn.get("user_text", ""))
    replies: list[dict[str, str]] = turn.get("replies", [])
    proposals = []
    for content in remembered(text):
        for reply in replies:
            proposals.append(
                {
                    "member_id": reply["member_id"],
                    "action": "create",
                    "content": content,
                    "importance": 0.7,
                    "evidence_reply_ids": [reply["reply_id"]],
                }
            )
    return {"proposals": proposals}
