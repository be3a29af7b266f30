"""How a streamed reply is read, whichever client streams it: its output budget, how it is
stopped, and the result it ends in.

Both stream paths follow these rules: `LangChainProvider._stream` over LangChain's chunks, and
the OpenAI-compatible provider's tool stream over the openai SDK's own (models/openai_tools.py).
Kept apart from either so the two cannot drift: a reply is bounded, stopped and finished the
same way, tool calls or not.
"""

from __future__ import annotations

import asyncio

from roundtable.domain.errors import ModelUnavailable
from roundtable.domain.events import TokenUsage
from roundtable.models.base import ChatResult, ModelToolCall, reply_char_bound
from roundtable.models.tool_calls import ToolCallAccumulator

STOP_GRACE_CHUNKS = 256
"""Chunks a stream may still deliver after its budget is spent (already buffered when the
stop landed) before it is left without waiting for the stop."""


class OutputBudget:
    """A streamed reply's output budget: its call's `max_tokens`, counted by streamed
    chunks (one chunk is one token, as OpenAI-compatible servers stream them), and its
    character bound (`reply_char_bound`).

    The provider stops reading once the budget is spent, so a server that ignores
    `max_tokens` (or streams megabytes in one chunk) cannot make a reply unbounded.
    """

    __slots__ = ("chars_left", "chunks", "max_tokens", "overrun", "spent")

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.chars_left = reply_char_bound(max_tokens)
        self.chunks = 0
        """Chunks with text taken so far: the reply's output tokens when the server
        reports none."""
        self.spent = False
        self.overrun = 0
        """Chunks read after the budget was spent, before the stream stopped."""

    def take(self, text: str) -> str:
        """The part of a streamed chunk the budget admits ("" once spent)."""
        if self.max_tokens > 0 and self.chunks >= self.max_tokens:
            self.spent = True
            return ""
        if len(text) > self.chars_left:
            text = text[: self.chars_left]
            self.spent = True
        self.chunks += 1
        self.chars_left -= len(text)
        return text

    def admits(self, chars: int) -> bool:
        """Whether a streamed tool-call fragment of `chars` characters (its name and
        arguments) fits, counted as one chunk like text; a fragment that does not fit
        spends the budget, and is not cut: a call cut anywhere is no call."""
        if (self.max_tokens > 0 and self.chunks >= self.max_tokens) or chars > self.chars_left:
            self.spent = True
            return False
        self.chunks += 1
        self.chars_left -= chars
        return True


def stop_now(stop: asyncio.Timeout) -> None:
    """Ends a stream whose budget is spent by expiring its `stop` scope at once.

    A cancellation, not a `break`: it lands where the stream waits for bytes, so every
    generator of LangChain's and the SDK's stream unwinds and the HTTP response closes
    now, and the server stops generating. Leaving the loop would close only the
    outermost generator, and the connection whenever the garbage collector got to it.
    """
    stop.reschedule(asyncio.get_running_loop().time())


def finish_reply(
    parts: list[str],
    usage: TokenUsage | None,
    finish_reason: str,
    budget: OutputBudget,
    name: str,
    tool_calls: ToolCallAccumulator | None = None,
    *,
    ends_with_finish_reason: bool,
) -> ChatResult:
    """The result of a reply, once its stream ended (or, unstreamed, once it arrived whole).

    A reply cut at its budget finishes `length` and carries no tool calls: a call whose
    arguments were cut must not run, and the caller sees a reply that ran out of budget.

    Args:
        parts: The reply's text, as its chunks gave it (one part, unstreamed).
        usage: The usage the server reported; None to count the budget's chunks instead.
        finish_reason: The finish reason the stream named ("" when it named none).
        budget: The reply's output budget.
        name: The model's name for the result (`provider/model`).
        tool_calls: The tool calls assembled from the stream, when the call had tools.
        ends_with_finish_reason: The provider's streams end with a chunk naming a finish
            reason (OpenAI's do), so one without it was cut off.

    Raises:
        ModelUnavailable: the stream ended without a finish reason although
            `ends_with_finish_reason` (it was cut off).
    """
    if budget.spent:
        finish_reason = "length"
    if not finish_reason:
        if ends_with_finish_reason:
            # The connection closed before the stream's end (its finish reason; the
            # SDK hides the `[DONE]` after it): a malformed stream, not a whole reply.
            raise ModelUnavailable("stream ended before its finish_reason (cut off)")
        finish_reason = "stop"
    if usage is None:
        usage = TokenUsage(output_tokens=budget.chunks, counted=True)
    calls: tuple[ModelToolCall, ...] = ()
    if tool_calls is not None and not budget.spent:
        calls = tool_calls.calls()
    return ChatResult(
        text="".join(parts),
        usage=usage,
        finish_reason=finish_reason,
        model=name,
        tool_calls=calls,
    )
