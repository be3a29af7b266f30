"""The member pipeline ("MemberGraph"): one reusable unit for single chat and every group speaker.

select memories -> compile persona + skills + style rules + memories + history + task ->
call the model through the harness (streaming deltas) -> validate -> emit the final.

It is a plain async pipeline called by the dispatch node rather than a compiled LangGraph
subgraph: the speaker is the unit of resume, so nothing inside it needs a checkpoint, and
a subgraph would add a few milliseconds and several checkpoint writes per speaker.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from opentelemetry.util.types import AttributeValue

from roundtable.domain.errors import ModelError
from roundtable.domain.events import (
    AssistantFinal,
    FinishReason,
    SpeakerFailed,
    SpeakerStarted,
    TokenUsage,
)
from roundtable.domain.plan import PlanStep, run_of_reply
from roundtable.domain.snapshot import Member, ModelRef
from roundtable.domain.tools import ToolCallRecord, ToolCallSummary
from roundtable.graph.context import GraphContext
from roundtable.graph.countoff import check_count_off, count_off_again
from roundtable.graph.memory_select import memory_query, select_memories
from roundtable.graph.prompts import member_messages
from roundtable.graph.state import ReplyDict
from roundtable.graph.tool_loop import BUDGET_SPENT, ToolLoop, tool_specs
from roundtable.harness.request import CallMeta, ModelRequest
from roundtable.models.base import (
    ChatCall,
    ChatMessage,
    ChatResult,
    ToolSpec,
    reply_char_bound,
    unheard,
)
from roundtable.telemetry.attributes import run_correlation

COUNT_OFF_MAX_RETRIES = 2
"""Times a count-off reply that fails its check is asked again before the bare number."""
MEMORY_TOP_K = 5
"""Memories of a member put into its prompt, at most."""
MEMORY_MAX_CHARS = 2_000
"""Characters of memories put into a member's prompt, at most."""
PROMPT_HISTORY = 20
"""History messages put into a member's prompt, at most."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SpeakerOutcome:
    """What one speaker's turn produced."""

    reply: ReplyDict
    usage: TokenUsage


def call_meta(ctx: GraphContext, caller_node: str) -> CallMeta:
    """The correlation fields of a model call made by `caller_node`."""
    run = ctx.request.context
    return CallMeta(
        thread_id=run.thread_id,
        run_id=run.run_id,
        request_id=run.request_id,
        tenant=run.tenant,
        caller_node=caller_node,
    )


async def speak(
    ctx: GraphContext, step: PlanStep, replies: list[ReplyDict], *, caller_node: str = "dispatch"
) -> SpeakerOutcome:
    """Runs one speaker's turn; emits speaker_started, deltas and assistant_final or speaker_failed.

    The turn is one GenAI agent span (`invoke_agent <name>`); its model calls nest inside.
    """
    resumed = await _resumed_tools(ctx, step, caller_node)
    waiting = resumed.waiting_only() if resumed is not None else None
    if waiting is not None:
        raise waiting
    started = time.perf_counter()
    if ctx.tracer is None:
        outcome = await _speak(ctx, step, replies, caller_node, resumed)
    else:
        member = ctx.request.snapshot.member(step.member_id)
        attributes: dict[str, AttributeValue] = {
            **run_correlation(ctx.request.context, caller_node),
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.id": member.member_id,
            "gen_ai.agent.name": member.display_name,
            "roundtable.step": step.index,
            "roundtable.reply_id": step.reply_id,
        }
        with ctx.tracer.start_as_current_span(
            f"invoke_agent {member.display_name}", attributes=attributes
        ):
            outcome = await _speak(ctx, step, replies, caller_node, resumed)
    ctx.metrics.speaker_duration.record(
        time.perf_counter() - started,
        {"roundtable.outcome": "failed" if outcome.reply["failed"] else "final"},
    )
    return outcome


async def _resumed_tools(ctx: GraphContext, step: PlanStep, caller_node: str) -> ToolLoop | None:
    """The tool loop of a resumed speaker whose requests are in the log (None otherwise:
    the store is read only then). A speaker whose calls all still wait for a person, each
    announced already, parks at once, emitting nothing (`ToolLoop.waiting_only`): a
    speaker_started would say it speaks while it waits (outside testing: each decision in
    a parallel group started every speaker still waiting again). One that goes on answers
    with this loop, so its records are read once."""
    runtime, prefix = ctx.tools, f"{step.reply_id}/"
    if runtime is None or not any(key.startswith(prefix) for key in ctx.prior.announced):
        return None
    member = ctx.request.snapshot.member(step.member_id)
    return await ToolLoop.open(ctx, runtime, step, member, call_meta(ctx, caller_node))


_ROOM_FOR_A_NUMBER = 8
"""Tokens past which a count-off reply cut at its budget was no short reply."""


class _Tally:
    """What a speaker's attempts add up to: tokens, model calls, the model that answered."""

    def __init__(self, tool_loop: ToolLoop | None = None) -> None:
        self.usage = TokenUsage()
        self.model_calls = 0
        """Model calls, the harness's retries and failovers included."""
        self.answered_by = ""
        """The model of the last answer, once there is one."""

        self.tool_loop = tool_loop
        """The speaker's tool calls, when it may make some (a resumed speaker's, read
        before it started)."""

    @property
    def tool_calls(self) -> tuple[ToolCallSummary, ...]:
        """The tool calls the reply made (this execution's and replayed ones)."""
        return tuple(self.tool_loop.summaries) if self.tool_loop is not None else ()

    def answered(self, result: ChatResult) -> None:
        self.model_calls += result.attempts
        self.answered_by = result.model
        self.usage = self.usage + result.usage

    def replayed(self, calls: list[ToolCallRecord]) -> None:
        """Counts a model turn an earlier execution asked (its calls' records keep what it
        cost): review found the tokens spent before a park missing from the reply's."""
        usage, model_calls = ToolLoop.turn_cost(calls)
        self.usage = self.usage + usage
        self.model_calls += model_calls


class _TextStream:
    """Streams a speaker's text as deltas; each attempt (and each restart of one inside
    the harness: a retry, a failover) is a new delta attempt, so a client drops the text
    of an abandoned one."""

    def __init__(self, ctx: GraphContext, step: PlanStep) -> None:
        self._sink = ctx.sink
        self._reply_id = step.reply_id
        self.attempt = 0
        # A sink even when no delta is streamed: the harness times a streamed attempt by
        # its silence and counts the chunks of one that breaks off (review: with deltas off
        # a steady answer was cut at the timeout, and a broken one cost nothing).
        self.on_text = self._text if ctx.request.options.stream_deltas else unheard

    def _text(self, text: str) -> None:
        self._sink.delta(self._reply_id, text, self.attempt)

    def restart(self) -> None:
        """A new attempt begins."""
        self.attempt += 1


async def _speak(
    ctx: GraphContext,
    step: PlanStep,
    replies: list[ReplyDict],
    caller_node: str,
    resumed: ToolLoop | None,
) -> SpeakerOutcome:
    snapshot = ctx.request.snapshot
    member = snapshot.member(step.member_id)
    words = _answered(ctx, step)
    memories = select_memories(
        member.memories, memory_query(words, step), top_k=MEMORY_TOP_K, max_chars=MEMORY_MAX_CHARS
    )
    messages = member_messages(
        member, snapshot, step, memories, replies, words=words, history_limit=PROMPT_HISTORY
    )
    ref = snapshot.model_for(member)
    number = step.count_off_number
    tries = 1 + (COUNT_OFF_MAX_RETRIES if number else 0)
    texts, tally = _TextStream(ctx, step), _Tally(resumed)
    # A speaker an earlier execution began and left unfinished (a crash, a restart, a wait
    # for a person) starts again numbered past the attempts in the log (review: it said
    # attempt 1 again), and its speaker_started tells a client to drop the text it holds.
    first = ctx.prior.started.get(step.reply_id, 0) + 1
    for attempt in range(first, first + tries):
        await ctx.sink.emit(
            SpeakerStarted(
                step=step.index, member_id=member.member_id, reply_id=step.reply_id, attempt=attempt
            )
        )
        texts.restart()
        ask = _Asker(ctx, ref, step, texts, caller_node)
        try:
            result = await _answer(ctx, step, member, messages, ask, tally)
        except ModelError as exc:
            tally.model_calls += exc.attempts
            tally.usage = tally.usage + exc.spent
            if number and tally.answered_by:
                # The member answered, wrongly, and asking again failed: the count-off
                # still gets its number (the contract's replacement), not a failure.
                return await _final(ctx, step, str(number), FinishReason.REPLACED, tally)
            return await _failed(ctx, step, exc, tally)
        tally.answered(result)
        content, finish = bounded_reply(result, step.token_budget)
        if number:
            # Cut at a budget a number fits in many times over (a tiny one cuts "3!" too).
            cut = finish is FinishReason.LENGTH and step.token_budget >= _ROOM_FOR_A_NUMBER
            problem = check_count_off(content, number, cut=cut)
            if problem and attempt < first + tries - 1:
                # Ask again with the wrong answer and the reason in view; the task itself
                # (and its number) never changes.
                messages = (
                    *messages,
                    ChatMessage("assistant", content),
                    ChatMessage("user", count_off_again(problem, number)),
                )
                continue
            if problem:
                content, finish = str(number), FinishReason.REPLACED
        return await _final(ctx, step, content, finish, tally)
    raise AssertionError("unreachable: the last attempt always returns")


def _answered(ctx: GraphContext, step: PlanStep) -> str:
    """The user's words a speaker answers: the turn's; for a step a continue turn took over
    from a stopped run (its reply id is that run's), the message that run was answering
    (outside testing: the speakers answered "继续" itself)."""
    if run_of_reply(step.reply_id) == ctx.request.context.run_id:
        return ctx.request.snapshot.user_turn.text
    return ctx.continued_words or ctx.request.snapshot.user_turn.text


class _Asker:
    """Asks the speaker's model through the harness, streaming its text as deltas."""

    def __init__(
        self, ctx: GraphContext, ref: ModelRef, step: PlanStep, texts: _TextStream, node: str
    ) -> None:
        self.ctx, self.ref, self.step, self.texts, self.node = ctx, ref, step, texts, node

    async def __call__(
        self, messages: tuple[ChatMessage, ...], tools: tuple[ToolSpec, ...] = ()
    ) -> ChatResult:
        request = ModelRequest(
            ref=self.ref,
            call=ChatCall(
                messages=messages,
                max_tokens=self.step.token_budget,
                temperature=self.ref.temperature,
                tools=tools,
            ),
            meta=call_meta(self.ctx, self.node),
            credentials=self.ctx.credentials,
            on_text=self.texts.on_text,
            on_restart=self.texts.restart,
        )
        return await self.ctx.harness.call(request)


async def _answer(
    ctx: GraphContext,
    step: PlanStep,
    member: Member,
    messages: tuple[ChatMessage, ...],
    ask: _Asker,
    tally: _Tally,
) -> ChatResult:
    """The model's answer: one call, or, for a member with tools, the tool loop's last turn
    (the turns before it, and their calls, replayed from the records when there are some).

    Raises:
        Parked: a call waits for a person's decision.
    """
    tools = ctx.request.snapshot.tools_of(member)
    runtime = ctx.tools
    if not tools or runtime is None or step.count_off_number:
        return await ask(messages)
    loop = tally.tool_loop
    if loop is None:
        loop = await ToolLoop.open(ctx, runtime, step, member, call_meta(ctx, ask.node))
        tally.tool_loop = loop
    specs = tool_specs(tools)
    turn = 1
    while True:
        calls = loop.recorded_turn(turn)
        if calls:
            tally.replayed(calls)
        else:
            if loop.calls_made >= loop.budget:
                return await ask((*messages, ChatMessage("user", BUDGET_SPENT)))
            result = await ask(messages, specs)
            if not result.tool_calls:
                return result
            tally.answered(result)
            calls = await loop.record_turn(turn, result)
        messages = (*messages, *await loop.run_turn(calls))
        ask.texts.restart()  # text the model said beside its calls is not the reply
        turn += 1


async def _final(
    ctx: GraphContext, step: PlanStep, content: str, finish: FinishReason, tally: _Tally
) -> SpeakerOutcome:
    await ctx.sink.emit(
        AssistantFinal(
            reply_id=step.reply_id,
            member_id=step.member_id,
            step=step.index,
            content=content,
            model=tally.answered_by,
            usage=tally.usage,
            finish_reason=finish,
            attempts=tally.model_calls,
            tool_calls=tally.tool_calls,
        )
    )
    return SpeakerOutcome(_reply(step, content, failed=False), tally.usage)


async def _failed(
    ctx: GraphContext, step: PlanStep, exc: ModelError, tally: _Tally
) -> SpeakerOutcome:
    # The error's text is ours (a status, "connection refused"), never the provider's
    # message or the prompt: safe for the event and the log alike.
    log.warning(
        "speaker %s failed (run %s, reply %s, %d attempt(s)): %s %s",
        step.member_id,
        ctx.request.context.run_id,
        step.reply_id,
        tally.model_calls,
        exc.code,
        exc,
    )
    await ctx.sink.emit(
        SpeakerFailed(
            reply_id=step.reply_id,
            member_id=step.member_id,
            step=step.index,
            code=exc.code,
            message=str(exc),
            attempts=tally.model_calls,
        )
    )
    return SpeakerOutcome(_reply(step, "", failed=True), tally.usage)


def bounded_reply(result: ChatResult, max_tokens: int) -> tuple[str, FinishReason]:
    """A model's answer as the reply it becomes, within the reply's character bound.

    The providers stop reading at the bound already; this holds it for any provider, so
    no final the server commits can outgrow what a default gRPC client accepts.
    """
    content = result.text.strip()
    bound = reply_char_bound(max_tokens)
    if len(content) > bound:
        return content[:bound], FinishReason.LENGTH
    return content, FinishReason.LENGTH if result.finish_reason == "length" else FinishReason.STOP


def _reply(step: PlanStep, content: str, *, failed: bool) -> ReplyDict:
    return ReplyDict(
        reply_id=step.reply_id,
        member_id=step.member_id,
        step=step.index,
        content=content,
        failed=failed,
    )
