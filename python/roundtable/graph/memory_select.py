"""Chooses which of a member's memories go into its prompt.

Ranked by relevance to the turn (shared words, or shared characters for CJK text), then
importance, then recency; bounded in count and size so a member with 1,000 memories
costs the prompt no more than one with five.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from roundtable.domain.plan import PlanStep
from roundtable.domain.snapshot import Memory
from roundtable.graph import tasks

_WORD = re.compile(r"[a-z0-9]+|[\u3400-\u9fff]", re.IGNORECASE)
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "of",
        "to",
        "in",
        "on",
        "at",
        "is",
        "are",
        "was",
        "were",
        "be",
        "i",
        "you",
        "we",
        "it",
        "that",
        "this",
        "for",
        "with",
        "my",
        "your",
    ]
)
"""English words too common to say what a text is about."""
_STOPWORDS_ZH = frozenset("一个这那和与跟或的地得到给在里上是我你您他她它们为同吗呢吧啊了着")
"""Their Chinese twins, single characters (CJK text is compared character by character):
without them "我的猫在哪" found "我住在上海" relevant through 我 and 在."""


def terms(text: str) -> set[str]:
    """The comparable terms of a text: lower-cased words and single CJK characters."""
    return {
        t
        for t in (w.lower() for w in _WORD.findall(text))
        if t not in _STOPWORDS and t not in _STOPWORDS_ZH
    }


def memory_query(user_text: str, step: PlanStep) -> str:
    """What a speaker's memories are ranked against: the user's turn, and the step's task
    when a supervisor wrote it (it says what this speaker is to talk about). A fixed task's
    words ("answer", "latest", "message") say nothing about the turn: with them, a memory
    that shared them outranked one about what the user asked."""
    if step.task in tasks.STANDING or step.count_off_number:
        return user_text
    return f"{user_text} {step.task}"


def select_memories(
    memories: Iterable[Memory], query: str, *, top_k: int, max_chars: int
) -> list[Memory]:
    """The most relevant memories for `query`, most relevant first."""
    memories = tuple(memories)
    if not memories:
        return []
    wanted = terms(query)
    scored = []
    for memory in memories:
        overlap = len(wanted & terms(memory.content))
        relevance = overlap / (1 + len(wanted)) if wanted else 0.0
        scored.append((relevance, memory.importance, memory.updated_at, memory))
    scored.sort(key=lambda item: item[:3], reverse=True)
    chosen: list[Memory] = []
    used = 0
    for _relevance, _importance, _updated, memory in scored[:top_k]:
        if used + len(memory.content) > max_chars:
            continue
        chosen.append(memory)
        used += len(memory.content)
    return chosen
