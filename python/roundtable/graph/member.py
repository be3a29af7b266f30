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
from roundtable.domain.plan import PlanStep
from roundtable.graph.context import GraphContext
from roundtable.graph.countoff import check_count_off
from roundtable.graph.memory_select import select_memories
from roundtable.graph.prompts import member_messages
from roundtable.graph.state import ReplyDict
from roundtable.harness.request import CallMeta, ModelRequest
from roundtable.models.base import ChatCall, ChatMessage, ChatResult, reply_char_bound
from roundtable.telemetry.attributes import run_correlation

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
    started = time.perf_counter()
    if ctx.tracer is None:
        outcome = await _speak(ctx, step, replies, caller_node)
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
            outcome = await _speak(ctx, step, replies, caller_node)
    ctx.metrics.speaker_duration.record(
        time.perf_counter() - started,
        {"roundtable.outcome": "failed" if outcome.reply["failed"] else "final"},
    )
    return outcome


async def _speak(
    ctx: GraphContext, step: PlanStep, replies: list[ReplyDict], caller_node: str
) -> SpeakerOutcome:
    snapshot = ctx.request.snapshot
    member = snapshot.member(step.member_id)
    settings = ctx.settings
    memories = select_memories(
        member.memories,
        f"{snapshot.user_turn.text} {step.task}",
        top_k=settings.memory_top_k,
        max_chars=settings.memory_max_chars,
    )
    messages = member_messages(
        member, snapshot, step, memories, replies, history_limit=settings.prompt_history
    )
    ref = snapshot.model_for(member)
    tries = 1 + (settings.count_off_max_retries if step.count_off_number else 0)
    usage = TokenUsage()
    stream = ctx.request.options.stream_deltas
    text_attempt = 0

    def on_text(text: str) -> None:
        ctx.sink.delta(step.reply_id, text, text_attempt)

    def on_restart() -> None:
        nonlocal text_attempt
        text_attempt += 1

    model_attempts = 0  # model calls, the harness's retries and failovers included
    answered_by = ""  # the model of the last answer, once there is one
    for attempt in range(1, tries + 1):
        await ctx.sink.emit(
            SpeakerStarted(
                step=step.index, member_id=member.member_id, reply_id=step.reply_id, attempt=attempt
            )
        )
        text_attempt += 1
        request = ModelRequest(
            ref=ref,
            call=ChatCall(
                messages=messages, max_tokens=step.token_budget, temperature=ref.temperature
            ),
            meta=call_meta(ctx, caller_node),
            credentials=ctx.credentials,
            on_text=on_text if stream else None,
            on_restart=on_restart,
        )
        try:
            result = await ctx.harness.call(request)
        except ModelError as exc:
            model_attempts += exc.attempts
            if step.count_off_number and answered_by:
                # The member answered, wrongly, and asking again failed: the count-off
                # still gets its number (the contract's replacement), not a failure.
                content, finish, model = str(step.count_off_number), FinishReason.REPLACED, ""
                break
            # The error's text is ours (a status, "connection refused"), never the
            # provider's message or the prompt: safe for the event and the log alike.
            log.warning(
                "speaker %s failed (run %s, reply %s, %d attempt(s)): %s %s",
                member.member_id,
                ctx.request.context.run_id,
                step.reply_id,
                model_attempts,
                exc.code,
                exc,
            )
            await ctx.sink.emit(
                SpeakerFailed(
                    reply_id=step.reply_id,
                    member_id=member.member_id,
                    step=step.index,
                    code=exc.code,
                    message=str(exc),
                    attempts=model_attempts,
                )
            )
            return SpeakerOutcome(_reply(step, "", failed=True), usage)
        model_attempts += result.attempts
        answered_by = result.model
        usage = usage + result.usage
        content, finish = bounded_reply(result, step.token_budget)
        if step.count_off_number:
            problem = check_count_off(content, step.count_off_number)
            if problem and attempt < tries:
                # Ask again with the wrong answer and the reason in view; the task itself
                # (and its number) never changes.
                messages = (
                    *messages,
                    ChatMessage("assistant", content),
                    ChatMessage(
                        "user",
                        f"That reply {problem}. Reply with exactly your number, "
                        f"{step.count_off_number}, and nothing else.",
                    ),
                )
                continue
            if problem:
                content, finish = str(step.count_off_number), FinishReason.REPLACED
        model = result.model
        break
    else:
        raise AssertionError("unreachable: the last attempt always breaks")
    await ctx.sink.emit(
        AssistantFinal(
            reply_id=step.reply_id,
            member_id=member.member_id,
            step=step.index,
            content=content,
            model=model or answered_by,
            usage=usage,
            finish_reason=finish,
            attempts=model_attempts,
        )
    )
    return SpeakerOutcome(_reply(step, content, failed=False), usage)


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
