"""Directives are code, never a model.

Classification is a pure function of the snapshot, checked in a fixed order: stop,
continue, count-off, @all, @mentions; anything else is an open discussion (or, in a
single chat, the primary member answering).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from roundtable.domain.plan import DirectiveKind
from roundtable.domain.snapshot import Member, SessionKind, Snapshot

# A directive word must stand alone as the user's instruction, not be buried in a sentence
# about something else: "stop" but not "bus stop schedule?". Punctuation and a polite
# word around it are fine ("大家报数！", "count off, please").
_POLITE = r"(?:please|pls|now|everyone|everybody|all|大家|请|现在|一下|吧|们)?"
_EDGE = r"[\s,.!?;:~，。！？；：、…]*"


def _directive(words: str) -> re.Pattern[str]:
    return re.compile(
        rf"^{_EDGE}(?:@\S+\s+)*{_POLITE}{_EDGE}(?:{words}){_EDGE}{_POLITE}{_EDGE}$",
        re.IGNORECASE,
    )


_STOP = _directive(r"停止|停|stop|stop it|halt")
_CONTINUE = _directive(r"继续|continue|go on|keep going|carry on")
_COUNT_OFF = re.compile(r"报数|count(?:ing)?[\s-]*off|sound[\s-]*off", re.IGNORECASE)
_ALL = re.compile(r"@(?:全体成员|所有人|all|everyone|everybody)(?![\w])", re.IGNORECASE)
_MENTION = re.compile(r"@([^\s@,，。.!?！？:：;；]+)")


@dataclass(frozen=True, slots=True)
class Directive:
    """What the user's turn asks for, and whom it names (member ids, in order)."""

    kind: DirectiveKind
    member_ids: tuple[str, ...] = ()


def _name_index(members: tuple[Member, ...]) -> dict[str, str]:
    """Lower-cased display names and aliases to member ids (first one wins on a clash)."""
    index: dict[str, str] = {}
    for member in members:
        for name in (member.display_name, *member.aliases, member.member_id):
            index.setdefault(name.lower(), member.member_id)
    return index


MAX_MENTION_TOKENS = 256
"""How many @-words of a text are matched against names."""

MAX_COMMAND_CHARS = 64
"""A stop or continue is a short message of its own; longer text is never read as one (and
the anchored patterns above never see more than this, whatever the user sends)."""


def mentioned_members(snapshot: Snapshot) -> tuple[str, ...]:
    """Members named explicitly (ids first) or by @name / @alias in the text, in order, once each."""
    seen: dict[str, None] = dict.fromkeys(snapshot.user_turn.mentions)
    index = _name_index(snapshot.members)
    longest_first = sorted(index, key=len, reverse=True)
    everyone = len(snapshot.members)
    # Only the first MAX_MENTION_TOKENS @-words are read: a 32 KiB wall of "@x" costs nothing.
    for match in itertools.islice(_MENTION.finditer(snapshot.user_turn.text), MAX_MENTION_TOKENS):
        if len(seen) >= everyone:
            break  # everybody is named already: the rest of a long text changes nothing
        token = match.group(1).lower()
        # "@Lin的看法" or "@lin's": try the longest known name the token starts with.
        member_id = index.get(token) or next(
            (index[name] for name in longest_first if token.startswith(name)), None
        )
        if member_id is not None:
            seen.setdefault(member_id, None)
    return tuple(seen)


def classify(snapshot: Snapshot) -> Directive:
    """Classifies the user's turn. Pure: the same snapshot always gives the same directive."""
    text = snapshot.user_turn.text.strip()
    if len(text) <= MAX_COMMAND_CHARS:
        if _STOP.match(text):
            return Directive(DirectiveKind.STOP)
        if _CONTINUE.match(text):
            return Directive(DirectiveKind.CONTINUE)
    if snapshot.session.kind is SessionKind.SINGLE:
        return Directive(DirectiveKind.SINGLE, (snapshot.session.primary_member_id,))
    roster = tuple(m.member_id for m in snapshot.members)
    if _COUNT_OFF.search(text):
        return Directive(DirectiveKind.COUNT_OFF, roster)
    if snapshot.user_turn.mention_all or _ALL.search(text):
        return Directive(DirectiveKind.ALL, roster)
    mentioned = mentioned_members(snapshot)
    if mentioned:
        return Directive(DirectiveKind.MENTION, mentioned)
    return Directive(DirectiveKind.OPEN)
