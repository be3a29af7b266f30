"""The tasks code gives speakers (a supervisor writes its own): one home for their text, so
what reads a task can tell a written one from these."""

from __future__ import annotations

ANSWER = "Answer the user's latest message."
"""A single chat's speaker, a fallback's, a continue with nothing left to continue."""
MENTIONED = "The user addressed you by name. Answer their latest message."
"""Each member an @mention names."""
EVERYONE = "The user addressed everyone. Give your own answer to their latest message."
"""Each member of an @all."""

STANDING = frozenset({ANSWER, MENTIONED, EVERYONE})
"""Every fixed task but the count-off's (one text per number, see countoff.count_off_task)."""
