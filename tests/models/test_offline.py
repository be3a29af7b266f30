"""The offline model: the same answers through LangChain and natively; faults on cue."""

from __future__ import annotations

import pytest
from roundtable.domain import prompt_sections as sections
from roundtable.domain.errors import ModelRejected, ModelUnavailable
from roundtable.domain.snapshot import Member, ModelTarget, Session, SessionKind, Snapshot, UserTurn
from roundtable.graph.countoff import count_off_task
from roundtable.graph.nodes.supervisor import SupervisorPlan
from roundtable.graph.prompts import supervisor_messages
from roundtable.models.base import ChatCall, ChatMessage
from roundtable.models.langchain_provider import LangChainProvider
from roundtable.models.offline import MAX_OFFLINE_MODELS, OfflineProvider, offline_factory
from roundtable.models.offline_script import PREFER, REMEMBER, remembered

TARGET = ModelTarget(provider="offline", model="m")
MEMBER = ChatCall(
    messages=(
        ChatMessage(
            "system", f"You are Lin.\n\n{sections.PERSONA}\nA calm tea master. Speaks softly."
        ),
        ChatMessage("user", f"what is for dinner?\n\n{sections.TASK}\nAnswer briefly."),
    )
)
COUNT = ChatCall(
    messages=(
        ChatMessage("system", "You are Lin."),
        ChatMessage("user", f"报数\n\n{sections.TASK}\n{count_off_task(3, 4)}"),
    )
)


@pytest.mark.parametrize("call", [MEMBER, COUNT])
async def test_native_and_langchain_paths_say_the_same(call) -> None:
    native, streamed = OfflineProvider(), []
    a = await native.complete(TARGET, call, api_key=None, on_text=streamed.append)
    b = await LangChainProvider("offline", offline_factory()).complete(
        TARGET, call, api_key=None, on_text=None
    )
    assert a.text == b.text and "".join(streamed) == a.text
    assert a.usage == b.usage


async def test_count_off_answer_and_a_voice_the_persona_picks_without_quoting_it() -> None:
    # Outside testing: the reply quoted the persona's first sentence, and the contract keeps
    # a persona out of events.
    count = await OfflineProvider().complete(TARGET, COUNT, api_key=None, on_text=None)
    assert count.text == "3!"
    member = await OfflineProvider().complete(TARGET, MEMBER, api_key=None, on_text=None)
    assert "dinner" in member.text and "tea master" not in member.text
    replies = set()
    for persona in ("A calm tea master.", "A loud pirate.", "A shy poet.", "A chef."):
        system = f"You are Lin.\n\n{sections.PERSONA}\n{persona}"
        call = ChatCall(messages=(ChatMessage("system", system), MEMBER.messages[1]))
        answer = await OfflineProvider().complete(TARGET, call, api_key=None, on_text=None)
        assert persona.rstrip(".") not in answer.text
        replies.add(answer.text)
    assert len(replies) > 1, "the persona changes the voice"


async def test_supervisor_plan_from_the_roster() -> None:
    roster = '[{"member_id":"a","display_name":"Lin","skills":["tea"]},{"member_id":"b","display_name":"Bo","skills":[]}]'
    call = ChatCall(
        messages=(
            ChatMessage("system", f"director\n{sections.ROSTER}\n{roster}"),
            ChatMessage("user", "tell me about tea"),
        ),
        schema=SupervisorPlan,
    )
    result = await OfflineProvider().complete(TARGET, call, api_key=None, on_text=None)
    assert isinstance(result.parsed, SupervisorPlan)
    assert [s.member_id for s in result.parsed.steps] == ["a"], (
        "whole words: 'Bo' is not in 'about'"
    )


async def test_the_offline_supervisor_plans_no_more_steps_than_the_prompt_allows() -> None:
    # Outside review: it always planned two, so at max_speakers 1 every open turn fell back.
    roster = (
        Member(member_id="a", display_name="Lin"),
        Member(member_id="b", display_name="Bo"),
        Member(member_id="c", display_name="Mei"),
    )
    snapshot = Snapshot(
        session=Session(kind=SessionKind.GROUP, primary_member_id="a"),
        members=roster,
        history=(),
        user_turn=UserTurn(text="what do you all think?"),
    )
    for most, planned in ((1, ["a"]), (2, ["a", "b"])):
        messages = supervisor_messages(snapshot, [], max_steps=most, round_no=1)
        call = ChatCall(messages=messages, schema=SupervisorPlan)
        result = await OfflineProvider().complete(TARGET, call, api_key=None, on_text=None)
        assert isinstance(result.parsed, SupervisorPlan)
        assert [s.member_id for s in result.parsed.steps] == planned


async def test_faults_follow_the_knobs_then_stop() -> None:
    flaky = ModelTarget(provider="offline", model="f", base_url="offline:?fail=error&fail_times=2")
    provider = OfflineProvider()
    for _ in range(2):
        with pytest.raises(ModelUnavailable):
            await provider.complete(flaky, COUNT, api_key=None, on_text=None)
    assert (await provider.complete(flaky, COUNT, api_key=None, on_text=None)).text == "3!"
    rejected = ModelTarget(provider="offline", model="r", base_url="offline:?fail=rejected")
    with pytest.raises(ModelRejected):
        await provider.complete(rejected, COUNT, api_key=None, on_text=None)


async def test_the_token_budget_cuts_the_reply() -> None:
    call = ChatCall(messages=MEMBER.messages, max_tokens=3)
    result = await OfflineProvider().complete(TARGET, call, api_key=None, on_text=None)
    assert result.finish_reason == "length" and result.usage.output_tokens == 3


async def test_an_open_question_about_a_number_is_not_read_as_a_count_off() -> None:
    # A supervisor's task carries the user's words; "number 7" in them is no count-off.
    task = "Give your view on: Is number 7 a lucky number?"
    call = ChatCall(
        messages=(
            ChatMessage("system", "You are Lin."),
            ChatMessage("user", f"Is number 7 a lucky number?\n\n{sections.TASK}\n{task}"),
        )
    )
    answer = await OfflineProvider().complete(TARGET, call, api_key=None, on_text=None)
    assert answer.text != "7!" and "lucky" in answer.text


@pytest.mark.parametrize(
    ("cue", "language"),
    [(w, lang) for row in REMEMBER for lang, side in enumerate(row) for w in side],
)
def test_every_remember_cue_in_either_language_keeps_what_follows(cue: str, language: int) -> None:
    fact = "green tea in the morning" if language == 0 else "早上喝绿茶"
    assert remembered(f"Hi. {cue} {fact}. Thanks") == [fact]


@pytest.mark.parametrize(
    ("text", "fact"),
    [
        # Outside testing: "please remember that X" proposed "that X" ("remember that X",
        # X); the polite cue keeps what follows "that" as the plain one does.
        ("@Mei please remember that I live in Paris", "I live in Paris"),
        ("Please remember that I live in Paris.", "I live in Paris"),
        ("remember that I live in Paris", "I live in Paris"),
        ("please remember: I live in Paris", "I live in Paris"),
        ("please remember Thatcher's speech", "Thatcher's speech"),
        ("@梅 请记住我住在巴黎", "我住在巴黎"),
        ("请记住：我住在巴黎。", "我住在巴黎"),
        ("记住，我住在巴黎", "我住在巴黎"),
    ],
)
def test_a_remembered_fact_is_what_follows_the_whole_cue(text: str, fact: str) -> None:
    assert remembered(text) == [fact]


@pytest.mark.parametrize(
    ("cue", "language"),
    [(w, lang) for row in PREFER for lang, side in enumerate(row) for w in side],
)
def test_every_preference_in_either_language_is_kept_whole(cue: str, language: int) -> None:
    thing = "green tea" if language == 0 else "绿茶"
    assert remembered(f"{cue} {thing}!") == [f"{cue} {thing}"]


@pytest.mark.parametrize(
    "text",
    ["Do you remember my cat?", "Remember that I like tea?", "你记住我的猫了吗？", "我喜欢猫吗？"],
)
def test_a_question_is_no_memory_in_either_language(text: str) -> None:
    # Outside review: "Do you remember my cat?" proposed the memory "my cat".
    assert remembered(text) == []
    assert remembered(f"{text} I like tea.") == ["I like tea"]


@pytest.mark.parametrize(
    "text",
    [
        # Outside testing: each was proposed as a memory.
        "don't remember that I live in Paris",
        "不要记住我住在巴黎",
        "Never remember my PIN",
        "别记住我的密码",
        "Do you remember my cat",
        "你记住我的猫了吗",
        "你有没有记住我的猫",
        "我喜欢吗",
    ],
)
def test_a_negation_or_a_question_without_its_mark_is_no_memory_in_either_language(
    text: str,
) -> None:
    assert remembered(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "请登记住址。",  # outside testing: 登记 + 住址 proposed the memory "址"
        "請登記住址",
        "别忘记住址",
        "书记住在北京",
        "I misremember that address.",  # the English twin: a cue inside another word
        "Nothing remembered that day.",
    ],
)
def test_a_cue_inside_another_word_is_no_memory_in_either_language(text: str) -> None:
    assert remembered(text) == []
    assert remembered(f"{text} 记住我住在巴黎") == ["我住在巴黎"]


@pytest.mark.parametrize(
    ("text", "fact"), [("每日记住一个单词", "一个单词"), ("请牢牢记住我的生日", "我的生日")]
)
def test_a_cue_after_a_word_that_ends_before_it_is_still_one(text: str, fact: str) -> None:
    assert remembered(text) == [fact]


def test_a_cue_in_traditional_characters_keeps_the_fact_as_written() -> None:
    assert remembered("記住我住在巴黎") == ["我住在巴黎"]
    assert remembered("你記住我的貓了嗎") == []  # review: 嗎 was not read as 吗
    assert remembered("我喜歡烏龍茶") == ["我喜歡烏龍茶"]


def test_every_memory_cue_has_both_languages() -> None:
    for english, chinese in (*REMEMBER, *PREFER):
        assert english and chinese, f"{english or chinese} has no twin in the other language"


@pytest.mark.parametrize("text", ["Is sushi like sashimi?", "I liked it", "Hi like you said"])
def test_an_english_cue_counts_only_as_whole_words(text: str) -> None:
    assert remembered(text) == []


async def test_the_least_recently_used_of_too_many_targets_starts_its_faults_over() -> None:
    # Requests name their own targets: the provider keeps MAX_OFFLINE_MODELS models (each
    # with its fault counter), so a flood of new names cannot grow it without end.
    flaky = ModelTarget(provider="offline", model="f", base_url="offline:?fail=error&fail_times=1")
    provider = OfflineProvider()

    async def fails() -> bool:
        try:
            await provider.complete(flaky, COUNT, api_key=None, on_text=None)
        except ModelUnavailable:
            return True
        return False

    assert await fails() and not await fails(), "its one fault is spent"
    others = [ModelTarget(provider="offline", model=f"m{i}") for i in range(2 * MAX_OFFLINE_MODELS)]
    for target in others[: MAX_OFFLINE_MODELS - 1]:  # the provider is full
        provider.model_for(target)
    assert not await fails()
    provider.model_for(others[MAX_OFFLINE_MODELS - 1])
    assert not await fails(), "the oldest target went, not the one used last: its counter kept"
    for target in others[MAX_OFFLINE_MODELS:]:
        provider.model_for(target)
    assert await fails(), "unused since, it went: a new model, with its fault again"


@pytest.mark.parametrize(
    ("name", "others", "text", "subject"),
    [
        ("张三", (), "@张三你好", "你好"),
        ("Mei", (), "@所有人你们好", "你们好"),
        ("Mei", (), "@Mei what do you think?", "what do you think?"),
        ("Bo", (), "@all hi there", "hi there"),
        # Another member's name run into Chinese text: the group line names them all.
        ("张三", ("李四", "李四光", "Mei"), "@李四光@张三你们好", "你们好"),
        ("Mei", ("李四",), "@李四@Mei 今天吃什么", "今天吃什么"),
    ],
)
async def test_a_reply_is_about_the_users_words_not_the_mention(
    name: str, others: tuple[str, ...], text: str, subject: str
) -> None:
    # Outside testing: an @ run into Chinese text ("@张三你好") took the whole message with
    # it, and the reply quoted the task's text instead of the user's words.
    system = f"You are {name}."
    if others:
        system += "\n\n" + sections.GROUP_CHAT.format(others=", ".join(others))
    call = ChatCall(
        messages=(
            ChatMessage("system", system),
            ChatMessage("user", f"{text}\n\n{sections.TASK}\nAnswer their latest message."),
        )
    )
    answer = await OfflineProvider().complete(TARGET, call, api_key=None, on_text=None)
    assert f"\u201c{subject}\u201d" in answer.text
