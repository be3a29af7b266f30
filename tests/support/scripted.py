"""Scripted model providers for tests: they implement the same `ChatProvider` interface as
the real ones and count what they are asked, so a test can say "the supervisor was never
called" or "the model was called 0 times for speakers 1 to 3".
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel
from roundtable.domain import prompt_sections as sections
from roundtable.domain.events import TokenUsage
from roundtable.domain.snapshot import ModelTarget
from roundtable.models.base import ChatCall, ChatResult, TextSink

_NUMBER = re.compile(r"number (\d+)")


@dataclass
class Seen:
    """One call a scripted provider received."""

    member: str
    task: str
    schema: str
    attempt: int
    call: ChatCall


def member_name(call: ChatCall) -> str:
    """The display name a member prompt starts with ("You are X.")."""
    match = re.match(r"You are (.+?)\.", call.messages[0].content)
    return match.group(1) if match else ""


def task_of(call: ChatCall) -> str:
    """The task section of the prompt (the last message that has one)."""
    for message in reversed(call.messages):
        if sections.TASK in message.content:
            return message.content.split(sections.TASK, 1)[1].strip()
    return ""


def correction_count(call: ChatCall) -> int:
    """How many times the pipeline already asked again (count-off validation retries)."""
    return sum(1 for m in call.messages if m.role == "user" and m.content.startswith("That reply"))


@dataclass
class ScriptedProvider:
    """A provider whose answers come from Python functions.

    `reply(call, attempt)` returns the text of a member's reply; `plan(call)` returns the
    structured output object for a schema call. Tokens are streamed word by word.
    """

    reply: Callable[[ChatCall, int], str]
    plan: Callable[[ChatCall, type[BaseModel]], BaseModel] | None = None
    name: str = "scripted"
    token_delay_s: float = 0.0
    seen: list[Seen] = field(default_factory=list)

    def schema_calls(self, name: str) -> int:
        """Calls whose structured-output schema has this title."""
        return sum(1 for s in self.seen if s.schema == name)

    def calls_for(self, member: str) -> int:
        """Reply calls made for this member (by display name)."""
        return sum(1 for s in self.seen if s.member == member and not s.schema)

    async def complete(
        self, target: ModelTarget, call: ChatCall, *, api_key: str | None, on_text: TextSink | None
    ) -> ChatResult:
        schema = call.schema
        attempt = correction_count(call) + 1
        title = schema.model_config.get("title", schema.__name__) if schema is not None else ""
        self.seen.append(Seen(member_name(call), task_of(call), str(title or ""), attempt, call))
        if schema is not None:
            if self.plan is None:
                raise AssertionError(f"unexpected structured call {title}")
            return ChatResult(parsed=self.plan(call, schema), model=f"{self.name}/{target.model}")
        text = self.reply(call, attempt)
        for word in re.findall(r"\S+\s*", text):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            if on_text is not None:
                on_text(word)
        return ChatResult(
            text=text, usage=TokenUsage(10, len(text.split())), model=f"{self.name}/{target.model}"
        )


def persona_obeying_reply(call: ChatCall, attempt: int) -> str:
    """A model that obeys personas written to derail a count-off, on attempts 1 and 2."""
    system = call.messages[0].content
    match = _NUMBER.search(task_of(call))
    number = match.group(1) if match else "?"
    if "always answer 7" in system:
        return "7"
    if "tell a long story first" in system and attempt <= 2:
        return (
            "Once upon a time, in 1999, a traveller walked 40 miles through the rain to reach "
            f"a village where everyone was counting sheep, and so I say {number}."
        )
    if "refuse to speak after B" in system and attempt <= 2:
        return "I refuse to speak after B."
    return number
