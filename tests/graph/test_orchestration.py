"""Orchestration over a real server on a real port, through the generated client.

Each test asserts what a gateway would notice: the events on the wire, in order.
"""

from __future__ import annotations

import json
import re

import grpc
import pytest
from roundtable.api.convert import run_request_from_proto
from roundtable.api.limits import RequestLimits
from roundtable.domain.errors import ModelUnavailable
from roundtable.domain.snapshot import Budgets
from roundtable.graph.nodes.propose_memory import (
    MAX_PROPOSALS,
    MemoryProposals,
    ProposedMemory,
    accept,
)
from roundtable.graph.nodes.supervisor import SupervisorPlan, SupervisorStep, by_id
from roundtable.models.structured import StructuredForm, parse_answer, portable_schema
from roundtable.runs.execution import checkpoint_thread
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import (
    collect,
    finals,
    kinds,
    last_execution,
    member,
    model_ref,
    of_kind,
    start_request,
)
from support.openai_server import OpenAITestServer, Reply
from support.scripted import ScriptedProvider, persona_obeying_reply

COUNT_OFF_PHRASES = ("报数", "大家报数！", "count off, please")
DERAILING_ROSTER = (
    ("a", "A", "You always answer 7, whatever you are asked."),
    ("b", "B", "You tell a long story first, before anything else."),
    ("c", "C", "You refuse to speak after B."),
    ("d", "D", "A plain and quiet member."),
)


def numbers_in(text: str) -> list[str]:
    return re.findall(r"\d+", text)


async def run(address: str, request) -> list[epb.RunEvent]:
    async with grpc.aio.insecure_channel(address) as channel:
        return await collect(pb_grpc.OrchestratorServiceStub(channel).StartRun(request))


def scripted_roster(provider: str = "scripted") -> list[spb.Member]:
    return [
        member(m, name, persona, model=model_ref(provider, "persona"))
        for m, name, persona in DERAILING_ROSTER
    ]


@pytest.mark.parametrize("phrase", COUNT_OFF_PHRASES)
async def test_count_off_survives_personas_written_to_derail_it(start_server, phrase) -> None:
    model = ScriptedProvider(reply=persona_obeying_reply)
    async with start_server(providers={"scripted": model}) as server:
        request = start_request(
            phrase, members=scripted_roster(), default_model=model_ref("scripted", "director")
        )
        events = await run(server.address, request)
    got = finals(events)
    assert [f.member_id for f in got] == ["a", "b", "c", "d"]
    assert [numbers_in(f.content) for f in got] == [["1"], ["2"], ["3"], ["4"]]
    assert all(len(f.content) <= 60 for f in got)
    # A always says 7: asked again twice, then replaced by the bare number, and the event says so.
    assert got[0].content == "1" and got[0].finish_reason == epb.FINISH_REASON_REPLACED
    assert got[0].attempts == 3 and model.calls_for("A") == 3
    # B's story and C's refusal fail twice; the third attempt obeys the task.
    assert got[1].finish_reason == epb.FINISH_REASON_STOP and got[1].attempts == 3
    assert got[2].attempts == 3 and got[3].attempts == 1
    assert model.schema_calls("SupervisorPlan") == 0
    plan = of_kind(events, "plan_created")[0].plan_created
    assert plan.directive == epb.DIRECTIVE_KIND_COUNT_OFF
    assert plan.source == epb.PLAN_SOURCE_DETERMINISTIC
    assert [s.count_off_number for s in plan.steps] == [1, 2, 3, 4]
    attempts = [e.speaker_started.attempt for e in of_kind(events, "speaker_started")]
    assert attempts == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]


@pytest.mark.parametrize("phrase", COUNT_OFF_PHRASES)
async def test_count_off_with_the_offline_model(stub, phrase) -> None:
    events = await collect(stub.StartRun(start_request(phrase)))
    got = finals(events)
    assert [f.member_id for f in got] == ["a", "b", "c", "d"]
    assert [numbers_in(f.content) for f in got] == [["1"], ["2"], ["3"], ["4"]]
    assert kinds(events) == [
        "run_started",
        "plan_created",
        *["speaker_started", "assistant_final"] * 4,
        "run_completed",
    ]


async def test_mentions_speak_in_the_order_written(stub) -> None:
    roster = [
        member("a", "Alice"),
        member("b", "Bob", aliases=["小波"]),
        member("c", "Carol"),
        member("d", "Dave"),
    ]
    events = await collect(
        stub.StartRun(
            start_request("@Carol 你好, and @小波 too, what do you think?", members=roster)
        )
    )
    assert [f.member_id for f in finals(events)] == ["c", "b"]
    assert of_kind(events, "plan_created")[0].plan_created.directive == epb.DIRECTIVE_KIND_MENTION

    events = await collect(
        stub.StartRun(start_request("and @carol?", members=roster, mentions=["d", "a"]))
    )
    assert [f.member_id for f in finals(events)] == ["d", "a", "c"]


@pytest.mark.parametrize(
    ("text", "flag"), [("@all what now?", False), ("@全体成员 大家好", False), ("hello", True)]
)
async def test_all_speak_in_roster_order(stub, text, flag) -> None:
    events = await collect(stub.StartRun(start_request(text, mention_all=flag)))
    assert [f.member_id for f in finals(events)] == ["a", "b", "c", "d"]
    assert of_kind(events, "plan_created")[0].plan_created.directive == epb.DIRECTIVE_KIND_ALL


@pytest.mark.parametrize("text", ["停止", "stop", "Stop!"])
async def test_stop_turn_nobody_speaks(stub, text) -> None:
    events = await collect(stub.StartRun(start_request(text)))
    assert kinds(events) == ["run_started", "plan_created", "run_completed"]
    plan = events[1].plan_created
    assert plan.directive == epb.DIRECTIVE_KIND_STOP and not plan.steps


async def test_continue_with_nothing_to_continue_says_so(stub) -> None:
    events = await collect(stub.StartRun(start_request("继续", thread_id="fresh-thread")))
    assert kinds(events) == ["run_started", "plan_created", "run_completed"]
    plan = events[1].plan_created
    assert plan.directive == epb.DIRECTIVE_KIND_CONTINUE
    assert plan.fallback_reason == "nothing to continue" and not plan.steps


async def test_single_chat_primary_member_answers(stub) -> None:
    slow = model_ref("offline", "slow", base_url="offline:?token_delay_ms=10")
    roster = [member("a", "Alice"), member("b", "Bob", "A friendly builder.", model=slow)]
    request = start_request(
        "hello there", kind=spb.SESSION_KIND_SINGLE, primary="b", members=roster
    )
    events = await collect(stub.StartRun(request))
    assert events[0].run_started.route == epb.ROUTE_SINGLE
    assert [f.member_id for f in finals(events)] == ["b"]
    assert events[1].plan_created.directive == epb.DIRECTIVE_KIND_SINGLE
    assert of_kind(events, "assistant_delta"), "the reply streams as deltas"
    streamed = "".join(e.assistant_delta.text for e in of_kind(events, "assistant_delta"))
    # The text still buffered when the final is ready travels in the final only.
    content = finals(events)[0].content
    assert streamed.strip() and content.startswith(streamed.strip())


async def test_a_reply_written_within_one_window_streams_no_delta(stub) -> None:
    request = start_request("hello there", kind=spb.SESSION_KIND_SINGLE, primary="b")
    events = await collect(stub.StartRun(request))
    assert kinds(events) == [
        "run_started",
        "plan_created",
        "speaker_started",
        "assistant_final",
        "run_completed",
    ]
    assert finals(events)[0].content


def _director(plans: list[SupervisorPlan]):
    def plan(call, schema):
        if schema is MemoryProposals:
            return MemoryProposals()
        assert schema is SupervisorPlan
        return plans.pop(0)

    return plan


@pytest.mark.parametrize(
    "spelled",
    [("c", "a"), ("Carol", "@ALICE")],
    # Outside testing: a real model wrote the members' names ("Kai, Lin"), not their ids,
    # and the plan fell back to one member.
    ids=["ids", "names"],
)
async def test_supervisor_plan_is_followed(start_server, spelled: tuple[str, str]) -> None:
    model = ScriptedProvider(
        reply=lambda call, attempt: "ok",
        plan=_director(
            [
                SupervisorPlan(
                    steps=[
                        SupervisorStep(member_id=spelled[0], task="Question the premise."),
                        SupervisorStep(member_id=spelled[1], task="Summarise."),
                    ],
                    converged=True,
                )
            ]
        ),
    )
    async with start_server(providers={"scripted": model}) as server:
        events = await run(
            server.address,
            start_request("what is the best tea?", default_model=model_ref("scripted", "director")),
        )
    plan = of_kind(events, "plan_created")[0].plan_created
    assert plan.source == epb.PLAN_SOURCE_SUPERVISOR and plan.directive == epb.DIRECTIVE_KIND_OPEN
    assert [(s.member_id, s.task) for s in plan.steps] == [
        ("c", "Question the premise."),
        ("a", "Summarise."),
    ]
    assert [f.member_id for f in finals(events)] == ["c", "a"]
    assert model.schema_calls("SupervisorPlan") == 1
    assert [s.task for s in model.seen if s.member] == ["Question the premise.", "Summarise."]


async def test_a_plans_unusable_token_budgets_are_left_unset_or_cut_not_the_plan(
    start_server,
) -> None:
    # Review: SmolLM2 on llama-server wrote token_budget 0 and 1000 (over the session's
    # 512): either threw the whole plan away, and the discussion fell back to one member.
    answer = {
        "steps": [
            {"member_id": "c", "task": "Question it.", "token_budget": 0},
            {"member_id": "b", "task": "Add one point.", "token_budget": 1000},
            {"member_id": "a", "task": "Summarise.", "token_budget": "lots"},
            {"member_id": "d", "task": "Close.", "token_budget": 40},
        ],
        "converged": True,
    }
    model = ScriptedProvider(
        reply=lambda call, attempt: "ok",
        plan=_director([SupervisorPlan.model_validate_json(json.dumps(answer))]),
    )
    request = start_request("what is the best tea?", default_model=model_ref("scripted", "d"))
    request.snapshot.session.budgets.max_output_tokens = 512
    async with start_server(providers={"scripted": model}) as server:
        events = await run(server.address, request)
    plan = of_kind(events, "plan_created")[0].plan_created
    assert plan.source == epb.PLAN_SOURCE_SUPERVISOR, plan.fallback_reason
    assert [(s.member_id, s.token_budget) for s in plan.steps] == [
        ("c", 512),
        ("b", 512),
        ("a", 512),
        ("d", 40),
    ]
    assert [f.member_id for f in finals(events)] == ["c", "b", "a", "d"]
    # JSON's true is no budget (pydantic alone reads it as 1: review).
    assert (
        SupervisorStep.model_validate(
            {"member_id": "a", "task": "t", "token_budget": True}
        ).token_budget
        is None
    )


async def test_a_count_off_under_a_budget_of_one_token_is_not_asked_again(stub) -> None:
    # Review: a reply cut at a budget a number barely fits in (a server says "length" when
    # max_tokens is reached) was taken for a runaway reply: asked again twice, replaced.
    async with OpenAITestServer() as model_server:
        model_server.script(*(Reply(text=n, finish_reason="length") for n in "12"))
        ref = spb.ModelRef(
            target=spb.ModelTarget(provider="openai", model="m", base_url=model_server.base_url)
        )
        request = start_request(
            "报数",
            members=[member("a", "Alice", model=ref), member("b", "Bob", model=ref)],
            budgets=spb.Budgets(max_output_tokens=1),
        )
        events = [r.event async for r in stub.StartRun(request)]
    assert [(f.content, f.attempts) for f in finals(events)] == [("1", 1), ("2", 1)]


def test_a_plans_names_resolve_as_mentions_do() -> None:
    # Review: "Kai" went to the member so named though another's id is "kai" (a mention
    # gives the id), "LIN" for id "lin" was no member, and "" named a member whose alias
    # folds to nothing.
    request = start_request(
        "hi",
        members=[
            member("kai", "Kai Chen"),
            member("u7", "Kai"),
            member("lin", "Lin Wei", aliases=["\u200b"]),
        ],
    )
    snapshot = run_request_from_proto(request, limits=RequestLimits(), defaults=Budgets()).snapshot
    plan = SupervisorPlan(
        steps=[
            SupervisorStep(member_id=spelled, task="t")
            for spelled in ("Kai", "LIN", "@lin wei", "", "Kai Chen")
        ],
        converged=True,
    )
    assert [s.member_id for s in by_id(plan, snapshot).steps] == ["kai", "lin", "lin", "", "kai"]


async def test_supervisor_rounds_until_converged_within_budget(start_server) -> None:
    model = ScriptedProvider(
        reply=lambda call, attempt: "ok",
        plan=_director(
            [
                SupervisorPlan(
                    steps=[SupervisorStep(member_id="b", task="Open.")], converged=False
                ),
                SupervisorPlan(
                    steps=[SupervisorStep(member_id="d", task="Close.")], converged=False
                ),
            ]
        ),
    )
    async with start_server(providers={"scripted": model}) as server:
        events = await run(
            server.address,
            start_request(
                "let's discuss",
                default_model=model_ref("scripted", "director"),
                budgets=spb.Budgets(max_rounds=2),
            ),
        )
    plans = [e.plan_created for e in of_kind(events, "plan_created")]
    assert [p.round for p in plans] == [1, 2]
    assert [f.member_id for f in finals(events)] == ["b", "d"]
    assert [f.step for f in finals(events)] == [0, 1]
    completed = of_kind(events, "run_completed")[0].run_completed
    assert completed.rounds == 2 and not completed.converged


async def test_a_later_round_the_supervisor_cannot_plan_ends_the_discussion(start_server) -> None:
    # Outside review: round 2's fallback made the primary member answer the user's message
    # a second time, after answering it in round 1.
    def plan(call, schema):
        if schema is MemoryProposals:
            return MemoryProposals()
        if model.schema_calls("SupervisorPlan") == 1:
            steps = [SupervisorStep(member_id="c", task="Open.")]
            return SupervisorPlan(steps=steps, converged=False)
        raise ModelUnavailable("HTTP 503")

    model = ScriptedProvider(reply=lambda call, attempt: "ok", plan=plan)
    async with start_server(providers={"scripted": model}) as server:
        events = await run(
            server.address,
            start_request(
                "let's discuss",
                primary="c",
                default_model=model_ref("scripted", "director"),
                budgets=spb.Budgets(max_rounds=3),
            ),
        )
    plans = [e.plan_created for e in of_kind(events, "plan_created")]
    assert [(p.round, p.source, [s.member_id for s in p.steps]) for p in plans] == [
        (1, epb.PLAN_SOURCE_SUPERVISOR, ["c"]),
        (2, epb.PLAN_SOURCE_FALLBACK, []),
    ]
    assert plans[1].fallback_reason == "supervisor_model_unavailable"
    assert [f.member_id for f in finals(events)] == ["c"]
    assert kinds(events)[-1] == "run_completed"
    assert of_kind(events, "run_completed")[0].run_completed.rounds == 2


@pytest.mark.parametrize("checkpoint", ["kept", "lost"])
async def test_a_resumed_discussion_keeps_the_supervisors_verdict(start_server, checkpoint) -> None:
    # Round 1 is stopped after its speakers (at the supervisor's start, between rounds); the
    # supervisor had asked for another round. The resumed run must hold that round, without asking
    # about round 1 again, whether it resumes from the checkpoint the stop left or, as
    # after a SIGKILL under the default durability, from the event log alone.
    model = ScriptedProvider(
        reply=lambda call, attempt: "a considered reply",
        token_delay_s=0.02,
        plan=_director(
            [
                SupervisorPlan(
                    steps=[
                        SupervisorStep(member_id="b", task="Open."),
                        SupervisorStep(member_id="c", task="Build on it."),
                    ],
                    converged=False,
                ),
                SupervisorPlan(
                    steps=[SupervisorStep(member_id="d", task="Close.")], converged=True
                ),
            ]
        ),
    )
    request = start_request(
        "let's discuss the plan",
        run_id="verdict-1",
        default_model=model_ref("scripted", "director"),
        budgets=spb.Budgets(max_rounds=3),
    )
    async with (
        start_server(providers={"scripted": model}) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        call = stub.StartRun(request)
        first: list[epb.RunEvent] = []
        async for response in call:
            first.append(response.event)
            if kinds(first)[-1] == "speaker_started" and first[-1].speaker_started.step == 1:
                await stub.CancelRun(pb.CancelRunRequest(run_id="verdict-1", tenant="tenant-1"))
        if checkpoint == "lost":
            thread = checkpoint_thread("tenant-1", "verdict-1")
            await server.store.checkpointer.adelete_thread(thread)
        stream = await collect(stub.StartRun(request))

    # The resume's stream is the run's log from seq 1, then the second execution.
    resumed = last_execution(stream)
    assert stream[: len(stream) - len(resumed)] == [
        e for e in first if e.WhichOneof("payload") != "assistant_delta"
    ]
    assert [f.member_id for f in finals(first)] == ["b", "c"], "the round's speakers finish"
    assert kinds(first)[-1] == "run_cancelled"
    (round_1,) = [e.plan_created for e in of_kind(first, "plan_created")]
    assert round_1.round == 1 and not round_1.converged
    assert resumed[0].run_started.resumed
    (round_2,) = [e.plan_created for e in of_kind(resumed, "plan_created")]
    assert round_2.round == 2 and round_2.converged
    assert [f.member_id for f in finals(resumed)] == ["d"]
    completed = of_kind(resumed, "run_completed")[0].run_completed
    assert completed.rounds == 2 and completed.converged
    assert model.schema_calls("SupervisorPlan") == 2, "round 1 was not planned again"
    # The run's usage counts the speakers of both executions once each (the scripted
    # supervisor reports no tokens): from the checkpoint, or from the finals in the log.
    every_final = finals(first) + finals(resumed)
    assert (
        (completed.usage.input_tokens, completed.usage.output_tokens)
        == (
            sum(f.usage.input_tokens for f in every_final),
            sum(f.usage.output_tokens for f in every_final),
        )
        == (30, 9)
    )


@pytest.mark.parametrize(
    ("base_url", "timeout_ms", "reason"),
    [
        # The model's words are counted, never quoted (outside testing: a real model's
        # 64-digit ids went into the event verbatim, three times over).
        ("offline:?fail=bad_plan", 0, "invalid_plan: 1 step(s) name no member"),
        ("offline:?fail=error", 0, "supervisor_model_unavailable"),
        ("offline:?fail=timeout", 200, "supervisor_model_timeout"),
    ],
)
async def test_supervisor_failures_fall_back_to_the_primary(
    stub, base_url, timeout_ms, reason
) -> None:
    director = spb.ModelRef(
        target=spb.ModelTarget(provider="offline", model="director", base_url=base_url),
        timeout_ms=timeout_ms,
    )
    roster = [member(m, n, p, model=model_ref("offline", "member")) for m, n, p in DERAILING_ROSTER]
    events = await collect(
        stub.StartRun(
            start_request("what now?", members=roster, primary="c", default_model=director)
        )
    )
    plan = of_kind(events, "plan_created")[0].plan_created
    assert plan.source == epb.PLAN_SOURCE_FALLBACK
    assert plan.fallback_reason == reason
    assert [f.member_id for f in finals(events)] == ["c"]
    assert kinds(events)[-1] == "run_completed"


async def test_a_failing_speaker_does_not_stop_the_plan(stub) -> None:
    broken = spb.ModelRef(
        target=spb.ModelTarget(provider="offline", model="broken", base_url="offline:?fail=error")
    )
    roster = [
        member("a", "Alice"),
        member("b", "Bob", model=broken),
        member("c", "Carol"),
    ]
    events = await collect(stub.StartRun(start_request("@all status?", members=roster)))
    failed = [e.speaker_failed for e in of_kind(events, "speaker_failed")]
    assert [(f.member_id, f.code) for f in failed] == [("b", "MODEL_UNAVAILABLE")]
    assert [f.member_id for f in finals(events)] == ["a", "c"]
    completed = of_kind(events, "run_completed")[0].run_completed
    assert [r.member_id for r in completed.replies] == ["a", "c"]


@pytest.mark.parametrize("after", ["", "\u2028thanks", "\u0085thanks"])
async def test_memory_proposals_cite_their_evidence(stub, after) -> None:
    # U+2028 and U+0085 stay unescaped in a prompt's JSON: they must not break it.
    text = f"@Bob remember that I prefer green tea in the morning{after}"
    events = await collect(stub.StartRun(start_request(text)))
    (reply,) = finals(events)
    (proposed,) = of_kind(events, "memory_proposed")
    (proposal,) = proposed.memory_proposed.proposals
    assert proposal.member_id == "b"
    assert proposal.action == epb.MEMORY_ACTION_CREATE
    assert "green tea" in proposal.content
    assert list(proposal.evidence_reply_ids) == [reply.reply_id]
    assert kinds(events)[-2:] == ["memory_proposed", "run_completed"]


async def test_no_memory_proposal_without_a_statement(stub) -> None:
    events = await collect(stub.StartRun(start_request("@Bob how are you?")))
    assert not of_kind(events, "memory_proposed")


async def test_reply_ids_are_derived_from_run_and_step(stub) -> None:
    events = await collect(stub.StartRun(start_request("报数", run_id="run-xyz")))
    assert [f.reply_id for f in finals(events)] == [f"run-xyz#{i}" for i in range(4)]


def test_the_same_memory_proposed_twice_is_one_proposal_citing_both() -> None:
    snapshot = run_request_from_proto(
        start_request("hi"), limits=RequestLimits(), defaults=Budgets()
    ).snapshot
    replies = [
        {"reply_id": "r#0", "member_id": "a", "content": "x", "failed": False},
        {"reply_id": "r#1", "member_id": "a", "content": "y", "failed": False},
    ]
    twice = [
        ProposedMemory(
            member_id="a",
            action="create",
            content="likes tea",
            evidence_reply_ids=[r],
            importance=i,
        )
        for r, i in (("r#0", 0.4), ("r#1", 0.7))
    ]
    (only,) = accept(twice, snapshot, replies, "r")  # type: ignore[arg-type]
    assert only.evidence_reply_ids == ("r#0", "r#1") and only.importance == 0.7


def test_a_proposal_is_kept_only_when_it_changes_a_memory_the_gateway_can_send_back() -> None:
    # Outside testing: "记住" + 1,500 CJK characters was proposed (4,500 bytes), and the
    # gateway that kept it had every later turn refused (a memory holds 4 KiB); a memory
    # the member had already, an update to the same words and "：" were proposed too.
    request = start_request("hi")
    request.snapshot.members[0].memories.add(memory_id="m1", content="likes green tea")
    snapshot = run_request_from_proto(request, limits=RequestLimits(), defaults=Budgets()).snapshot
    replies = [{"reply_id": "r#0", "member_id": "a", "content": "x", "failed": False}]

    def proposed(action: str, content: str = "", target: str = "") -> ProposedMemory:
        return ProposedMemory(
            member_id="a",
            action=action,  # type: ignore[arg-type]
            content=content,
            target_memory_id=target,
            evidence_reply_ids=["r#0"],
        )

    kept = accept(
        [
            proposed("create", "茶" * 1_366),  # 4,098 bytes
            proposed("create", "："),
            proposed("create", " likes green tea "),
            proposed("update", "likes green tea", "m1"),
            proposed("forget", target="m2"),
            proposed("create", "茶" * 1_365),  # 4,095 bytes: fits
            proposed("update", "likes oolong", "m1"),
            proposed("forget", target="m1"),
        ],
        snapshot,
        replies,  # type: ignore[arg-type]
        "r",
    )
    assert [(p.action.value, p.content[:3], p.target_memory_id) for p in kept] == [
        ("create", "茶茶茶", ""),
        ("update", "lik", "m1"),
        ("forget", "", "m1"),
    ]


def test_a_proposal_that_does_not_fit_its_schema_costs_only_itself() -> None:
    # Review: one proposal out of range (an importance of 1.5, a content over 4,000
    # characters) failed the whole answer, and the turn proposed nothing.
    def proposal(content: str, importance: float) -> dict:
        return {
            "member_id": "a",
            "action": "create",
            "content": content,
            "importance": importance,
            "evidence_reply_ids": ["user"],
        }

    answer = json.dumps(
        {
            "proposals": [
                proposal("likes tea", 0.6),
                proposal("likes coffee", 1.5),
                proposal("x" * 4001, 0.5),
                "not a proposal",
                proposal("喜欢绿茶", 1),
            ]
        }
    )
    parsed = parse_answer(answer, MemoryProposals, StructuredForm.JSON_SCHEMA)
    assert isinstance(parsed, MemoryProposals)
    assert [(p.content, p.importance) for p in parsed.proposals] == [
        ("likes tea", 0.6),
        ("喜欢绿茶", 1.0),
    ]
    # The model is told the range in words (the portable schema keeps no maximum).
    item = portable_schema(MemoryProposals)["properties"]["proposals"]["items"]
    assert "0 (trivial) to 1" in item["properties"]["importance"]["description"]


def test_memory_proposals_are_bounded_so_their_event_fits_a_default_client() -> None:
    snapshot = run_request_from_proto(
        start_request("hi"), limits=RequestLimits(), defaults=Budgets()
    ).snapshot
    replies = [{"reply_id": "r#0", "member_id": "a", "content": "x", "failed": False}]
    flood = [
        ProposedMemory(
            member_id="a",
            action="create",
            content=f"fact {i} " + "x" * 3990,
            evidence_reply_ids=["r#0", "user"] * 50_000,
        )
        for i in range(1_000)
    ]
    kept = accept(flood, snapshot, replies, "r")  # type: ignore[arg-type]
    assert len(kept) == MAX_PROPOSALS == 32
    assert all(p.evidence_reply_ids == ("r#0", "user") for p in kept)
