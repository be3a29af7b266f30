"""A speaker's tool loop: ask the model, run the calls it asks for, ask again.

Each call is a durable step of its reply (docs/architecture.md, "Tools"), keyed
`<reply_id>/<n>`:

1. the model turn's calls are recorded before any of them runs;
2. a call that needs approval is announced (permission_required, write-ahead) and the
   speaker parks: `Parked` ends the run's execution until a decision is recorded;
3. a write tool's call is marked started, with the idempotency key it is sent under
   (`ToolCallRecord.key_to_send`, in the MCP request's `_meta`), before it is sent, and
   every call's result is recorded before the model sees it.

A speaker that runs again (a resume after a crash, a cancel, a decision) replays its
recorded turns and results instead of asking the model or calling the tool again; a call
marked started without a result is sent again with the same key (at least once, with a
key). The final answer (the model turn with no tool calls) is never recorded here: the
speaker's assistant_final is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from roundtable.domain.errors import ToolError, ToolRateLimited, ToolTimeout, ToolUnavailable
from roundtable.domain.events import PermissionRequired, TokenUsage
from roundtable.domain.plan import PlanStep
from roundtable.domain.snapshot import Member, Snapshot
from roundtable.domain.tools import (
    ApprovalPolicy,
    CallStatus,
    Tool,
    ToolCallRecord,
    ToolCallRef,
    ToolCallSummary,
    ToolOutcome,
    Verdict,
    json_object,
    storable,
)
from roundtable.graph.context import GraphContext, Parked, ToolRuntime
from roundtable.harness.request import CallMeta, ToolRequest
from roundtable.models.base import ChatMessage, ChatResult, ModelToolCall, ToolSpec

BUDGET_SPENT = (
    "You have used all the tool calls you may make for this reply. "
    "Answer now with what you have. / 你已用完本次回复可调用的工具次数，请直接回答。"
)


def tool_specs(tools: tuple[Tool, ...]) -> tuple[ToolSpec, ...]:
    """The tools as a model is told of them."""
    return tuple(ToolSpec(t.name, t.description, t.input_schema_json) for t in tools)


@dataclass(slots=True)
class ToolLoop:
    """One speaker's tool calls in one execution: its records and what they came to."""

    ctx: GraphContext
    runtime: ToolRuntime
    step: PlanStep
    member: Member
    meta: CallMeta
    tools: dict[str, Tool]
    records: list[ToolCallRecord]
    """This reply's recorded calls, by number."""
    summaries: list[ToolCallSummary] = field(default_factory=list)

    @classmethod
    async def open(
        cls, ctx: GraphContext, runtime: ToolRuntime, step: PlanStep, member: Member, meta: CallMeta
    ) -> ToolLoop:
        """The loop of a speaker, with the calls an earlier execution recorded."""
        run = ctx.request.context
        recorded = await runtime.store.tool_calls(run.tenant, run.run_id)
        tools = {t.name: t for t in ctx.request.snapshot.tools_of(member)}
        mine = [r for r in recorded if r.reply_id == step.reply_id]
        return cls(ctx, runtime, step, member, meta, tools, mine)

    def waiting_only(self) -> Parked | None:
        """When every call the speaker recorded is answered or waits for a person, and each
        waiting one is announced already (in the log), unexpired and the run not stopped,
        the speaker would only park again: the Parked it would raise; None otherwise.
        A pure check over the records read: `_one` would find the same and wait."""
        announced = self.ctx.prior.announced
        open_calls = [r for r in self.records if r.status is not CallStatus.FINISHED]
        if not open_calls:
            return None
        for r in open_calls:
            if not (
                r.needs_approval
                and r.verdict is Verdict.PENDING
                and r.call_key in announced
                and r.tool in self.tools
                and self._lapse(r) is None
            ):
                return None
        keys = tuple(r.call_key for r in open_calls)
        return Parked(keys, min(r.expires_at for r in open_calls))

    @property
    def budget(self) -> int:
        """Tool calls this speaker may make in its reply."""
        return self.ctx.request.snapshot.session.budgets.max_tool_calls_per_speaker

    def recorded_turn(self, turn: int) -> list[ToolCallRecord]:
        """The calls model turn `turn` asked for in an earlier execution (empty: none)."""
        return [r for r in self.records if r.turn == turn]

    @staticmethod
    def turn_cost(calls: list[ToolCallRecord]) -> tuple[TokenUsage, int]:
        """What a recorded model turn cost: its tokens and its model calls."""
        usage = TokenUsage()
        for r in calls:
            usage = usage + TokenUsage(r.turn_input_tokens, r.turn_output_tokens, r.turn_counted)
        return usage, sum(r.turn_model_calls for r in calls)

    @property
    def calls_made(self) -> int:
        """Calls recorded so far in this reply."""
        return len(self.records)

    async def record_turn(self, turn: int, result: ChatResult) -> list[ToolCallRecord]:
        """Records the calls a model turn asked for (within the budget), before any runs."""
        run, now = self.ctx.request.context, self.runtime.clock()
        room = max(0, self.budget - self.calls_made)
        expires = now + self.ctx.request.snapshot.session.budgets.approval_timeout_s
        records: list[ToolCallRecord] = []
        for call in result.tool_calls[:room]:
            n = self.calls_made + len(records) + 1
            tool = self.tools.get(call.name)
            records.append(
                ToolCallRecord(
                    tenant=run.tenant,
                    run_id=run.run_id,
                    call_key=f"{self.step.reply_id}/{n}",
                    reply_id=self.step.reply_id,
                    n=n,
                    turn=turn,
                    tool=storable(call.name[:64]),
                    model_call_id=storable(call.call_id[:128]),
                    arguments_json=storable(call.arguments_json),
                    needs_approval=tool is not None and tool.approval is ApprovalPolicy.ALWAYS,
                    expires_at=expires,
                )
            )
        if records:
            first = records[0]
            first.turn_input_tokens = result.usage.input_tokens
            first.turn_output_tokens = result.usage.output_tokens
            first.turn_counted = result.usage.counted
            first.turn_model_calls = result.attempts
        await self.runtime.store.record_tool_calls(records)
        self.records.extend(records)
        return records

    async def run_turn(self, calls: list[ToolCallRecord]) -> tuple[ChatMessage, ...]:
        """Runs (or replays) a turn's calls; the assistant and tool messages they add.

        Raises:
            Parked: some call waits for a decision (each one announced); the others ran.
        """
        waiting: list[ToolCallRecord] = []
        answers: list[ChatMessage] = []
        for record in calls:
            answer = await self._one(record)
            if answer is None:
                waiting.append(record)
                continue
            text, outcome = answer
            self.summaries.append(ToolCallSummary(record.call_key, record.tool, outcome))
            answers.append(
                ChatMessage("tool", self._told(record, text), tool_call_id=_call_id(record))
            )
        if waiting:
            raise Parked(tuple(r.call_key for r in waiting), min(r.expires_at for r in waiting))
        asked = tuple(ModelToolCall(_call_id(r), r.tool, r.arguments_json) for r in calls)
        return (ChatMessage("assistant", "", tool_calls=asked), *answers)

    async def _one(self, record: ToolCallRecord) -> tuple[str, ToolOutcome] | None:
        """A call's answer for the model; None when it waits for a decision."""
        if record.status is CallStatus.FINISHED:
            return record.result_text, ToolOutcome(record.outcome or ToolOutcome.FAILED)
        tool = self.tools.get(record.tool)
        if tool is None:
            return await self._finish(
                record,
                f"No tool named {record.tool!r} is available to you. "
                f"/ 你没有名为 {record.tool!r} 的工具可用。",
                ToolOutcome.FAILED,
            )
        if record.needs_approval:
            record = await self._decided(record)
            if record.verdict is Verdict.PENDING:
                await self._announce(record)
                return None
            if record.verdict is not Verdict.APPROVE:
                return await self._finish(record, *_refusal(record))
        arguments = json_object(record.arguments_to_run)
        if arguments is None:
            return await self._finish(
                record,
                "The arguments were not a JSON object; the tool did not run. "
                "/ 参数不是 JSON 对象，工具未执行。",
                ToolOutcome.FAILED,
            )
        return await self._execute(record, tool, arguments)

    async def _decided(self, record: ToolCallRecord) -> ToolCallRecord:
        """The call's record with its decision as it stands now: a request past its expiry
        is recorded expired, and a stop of the run (cancel, 停止) counts as a denial."""
        if record.verdict is not Verdict.PENDING:
            return record
        store, run = self.runtime.store, self.ctx.request.context
        current = await store.tool_call(run.tenant, run.run_id, record.call_key) or record
        if current.verdict is Verdict.PENDING:
            verdict = self._lapse(current)
            if verdict is not None:
                await store.decide_tool_call(
                    run.tenant, run.run_id, record.call_key, verdict, reason=verdict.value
                )
                current = await store.tool_call(run.tenant, run.run_id, record.call_key) or current
        self._replace(current)
        return current

    def _lapse(self, record: ToolCallRecord) -> Verdict | None:
        """What a pending call comes to with no person deciding: cancelled when someone
        stopped the run (cancel, 停止; not a shutdown: `StopSignal.denies`), expired past
        its expiry; None while it may still wait."""
        if self.ctx.stop.denies:
            return Verdict.CANCELLED
        if self.runtime.clock() >= record.expires_at:
            return Verdict.EXPIRED
        return None

    async def _announce(self, record: ToolCallRecord) -> None:
        """Emits permission_required once per call (a resumed speaker's is in the log)."""
        if record.call_key in self.ctx.prior.announced:
            return
        await self.ctx.sink.emit(
            PermissionRequired(
                permission_request_id=record.call_key,
                reply_id=record.reply_id,
                member_id=self.member.member_id,
                step=self.step.index,
                tool_name=record.tool,
                arguments_json=record.arguments_json,
                expires_at=record.expires_at,
            )
        )

    async def _execute(
        self, record: ToolCallRecord, tool: Tool, arguments: dict[str, object]
    ) -> tuple[str, ToolOutcome]:
        run = self.ctx.request.context
        snapshot: Snapshot = self.ctx.request.snapshot
        server = snapshot.tool_server(tool.server_id)
        key = record.key_to_send if tool.read_only else self._write_key(record)
        if not tool.read_only:
            # Write-ahead: a crash after this line re-sends the call with the same key
            # (the server deduplicates on it); a read-only call is simply run again.
            await self.runtime.store.start_tool_call(
                run.tenant, run.run_id, record.call_key, sent_key=key
            )
            record.sent_key = key
        token = self.ctx.credentials.get(server.credential_ref) if server.credential_ref else None
        ref = ToolCallRef(tool=tool, server=server, arguments=arguments, key=key)
        try:
            result = await self.runtime.caller.call(
                ToolRequest(ref=ref, meta=self.meta, token=token)
            )
        except ToolError as exc:
            if _may_have_run(exc) and not tool.read_only:
                text = _may_have_run_text(exc.code)
            else:
                text = f"The tool could not be run ({exc.code}). / 工具无法运行（{exc.code}）。"
            return await self._finish(record, text, ToolOutcome.FAILED)
        outcome = ToolOutcome.FAILED if result.is_error else ToolOutcome.OK
        return await self._finish(record, result.text, outcome)

    def _write_key(self, record: ToolCallRecord) -> str:
        """The key a write call goes with: the key of the last call of an earlier turn of
        this reply to the same tool with the same arguments, when that one may have run (the
        model, told so, asks again), so a server that deduplicates runs it once; else its
        own. Not when that call got its answer (a call made again on purpose runs again),
        nor within one model turn (the model asked for it twice before hearing anything)."""
        if record.sent_key:
            return record.key_to_send
        same = [
            earlier
            for earlier in self.records
            if earlier.turn < record.turn
            and earlier.tool == record.tool
            and earlier.arguments_to_run == record.arguments_to_run
        ]
        if same and same[-1].sent_key and same[-1].result_text in _MAY_HAVE_RUN_TEXTS:
            return same[-1].sent_key
        return record.key_to_send

    async def _finish(
        self, record: ToolCallRecord, text: str, outcome: ToolOutcome
    ) -> tuple[str, ToolOutcome]:
        """Records what the call came to, before the model sees it."""
        text = storable(text)
        run = self.ctx.request.context
        await self.runtime.store.finish_tool_call(
            run.tenant, run.run_id, record.call_key, result_text=text, outcome=outcome.value
        )
        record.status, record.result_text, record.outcome = CallStatus.FINISHED, text, outcome.value
        return text, outcome

    def _told(self, record: ToolCallRecord, text: str) -> str:
        """What the model is told of a call's result: with the arguments it ran with when a
        person edited them (the model's own call, in its turn, still shows what it asked)."""
        current = next((r for r in self.records if r.call_key == record.call_key), record)
        if not current.edited_arguments_json or current.verdict is not Verdict.APPROVE:
            return text
        edited = current.edited_arguments_json
        return (
            f"The person approved this call with edited arguments; it ran with {edited}. "
            f"/ 审批人修改参数后批准了此调用，按 {edited} 执行。\n\n{text}"
        )

    def _replace(self, record: ToolCallRecord) -> None:
        for i, known in enumerate(self.records):
            if known.call_key == record.call_key:
                self.records[i] = record


def _may_have_run(exc: ToolError) -> bool:
    """Whether a failed call may have run: it timed out, or the server failed or the
    connection broke while it ran (a 429 or an open breaker says it did not)."""
    return isinstance(exc, ToolTimeout) or (
        isinstance(exc, ToolUnavailable) and not isinstance(exc, ToolRateLimited)
    )


def _may_have_run_text(code: str) -> str:
    """What the model is told of a write call that may have run (review: it was told the
    tool "could not be run", so it asked again, under a new key, and the write ran twice)."""
    return (
        f"The tool call was sent, but no answer came back ({code}): it may have run. Do not "
        "call it again unless you know it did not; called again in this answer with the same "
        "arguments, it goes with the same idempotency key, so a server that deduplicates "
        f"runs it once. / 工具调用已发出，但没有收到结果（{code}），它可能已经执行。除非确知它"
        "没有执行，否则不要再次调用；在本次回答中以相同参数再次调用时会使用同一个幂等键，"
        "支持去重的服务器只会执行一次。"
    )


_MAY_HAVE_RUN_TEXTS = frozenset(
    _may_have_run_text(code) for code in (ToolTimeout.code, ToolUnavailable.code)
)
"""The recorded results of calls that may have run (a tool's own answer never equals one)."""


def _call_id(record: ToolCallRecord) -> str:
    """The id the model knows the call by (our key when the model gave none)."""
    return record.model_call_id or record.call_key


def _refusal(record: ToolCallRecord) -> tuple[str, ToolOutcome]:
    """What the model is told of a call that was not approved."""
    if record.verdict is Verdict.EXPIRED:
        return (
            "Nobody approved this tool call in time; it did not run. "
            "/ 此工具调用未在时限内获批，未执行。",
            ToolOutcome.EXPIRED,
        )
    reason = record.reason or "no reason given"
    return (
        f"The person denied this tool call ({reason}); it did not run. "
        f"/ 此工具调用被拒绝（{reason}），未执行。",
        ToolOutcome.DENIED,
    )
