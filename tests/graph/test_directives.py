"""Directive classification is code: the same text always gives the same directive."""

from __future__ import annotations

from dataclasses import replace

import pytest
from roundtable.domain.plan import DirectiveKind, PlanStep
from roundtable.domain.snapshot import (
    HistoryMessage,
    Member,
    Memory,
    MessageRole,
    Session,
    SessionKind,
    Snapshot,
    UserTurn,
)
from roundtable.domain.words import simplified
from roundtable.graph import tasks
from roundtable.graph.countoff import check_count_off, count_off_task
from roundtable.graph.directives import (
    COMMANDS,
    EVERYONE,
    FILLERS,
    classify,
    continued_text,
    is_cjk,
    words_hash,
)
from roundtable.graph.memory_select import memory_query, select_memories
from roundtable.models.offline_script import (
    NOT_A_STATEMENT,
    PREFER,
    QUESTION_PARTICLES,
    REMEMBER,
)
from support.bounded import call_bounded

ROSTER = (
    Member(member_id="a", display_name="Alice", aliases=("小爱",)),
    Member(member_id="b", display_name="Bob"),
    Member(member_id="c", display_name="Carol"),
)


def snap(
    text: str, *, kind: SessionKind = SessionKind.GROUP, mentions=(), mention_all=False
) -> Snapshot:
    return Snapshot(
        session=Session(kind=kind, primary_member_id="b"),
        members=ROSTER,
        history=(),
        user_turn=UserTurn(text=text, mentions=tuple(mentions), mention_all=mention_all),
    )


@pytest.mark.parametrize(
    ("text", "kind", "members"),
    [
        ("停止", DirectiveKind.STOP, ()),
        ("stop!", DirectiveKind.STOP, ()),
        ("@Alice stop", DirectiveKind.STOP, ()),
        ("继续", DirectiveKind.CONTINUE, ()),
        ("go on, please", DirectiveKind.CONTINUE, ()),
        ("报数", DirectiveKind.COUNT_OFF, ("a", "b", "c")),
        ("大家报数！", DirectiveKind.COUNT_OFF, ("a", "b", "c")),
        ("Sound off!", DirectiveKind.COUNT_OFF, ("a", "b", "c")),
        ("@everyone hi", DirectiveKind.ALL, ("a", "b", "c")),
        ("@全体成员 你好", DirectiveKind.ALL, ("a", "b", "c")),
        ("@Carol then @小爱", DirectiveKind.MENTION, ("c", "a")),
        ("@carol's view? and @CAROL again", DirectiveKind.MENTION, ("c",)),
        ("where is the bus stop?", DirectiveKind.OPEN, ()),
        ("email me at x@nobody.example", DirectiveKind.OPEN, ()),
    ],
)
def test_group_directives(text, kind, members) -> None:
    directive = classify(snap(text))
    assert directive.kind is kind
    assert directive.member_ids == members


NAMED = (
    Member(member_id="u-100", display_name="José"),
    Member(member_id="u-200", display_name="Lin"),
    Member(member_id="u-300", display_name="张三"),
    Member(member_id="u-400", display_name="Ann Lee"),
    Member(member_id="a", display_name="Alice"),
)


def named(text: str) -> Snapshot:
    return replace(snap(text), members=NAMED)


@pytest.mark.parametrize(
    "text",
    [
        "Is there a discount off the list price?",
        "the echo will resound off the walls",
        "don't count off yet",
        "what does 报数 mean?",
        "send it to lin@example.org",
        "@Lindsey said hi",
        "@anyone there?",
        "stop@example.org",
        "@u-2000 said hi",
        "@u-200_b said hi",
        "@u-200x你好",
    ],
)
def test_words_inside_other_words_or_sentences_are_no_directive(text) -> None:
    assert classify(named(text)).kind is DirectiveKind.OPEN


@pytest.mark.parametrize(
    ("text", "who"),
    [
        ("@Ann Lee what do you think?", ("u-400",)),  # a name with a space
        ("＠张三 你好", ("u-300",)),  # a full-width @, as CJK input methods type it
        ("@张三你好", ("u-300",)),  # CJK runs on after a name without a space
        ("@Lin的看法呢", ("u-200",)),
        ("@Jose\u0301 hi", ("u-100",)),  # the accent as a combining mark (NFD)
        ("@JOSÉ and @lin", ("u-100", "u-200")),
        ("@u-200 please", ("u-200",)),
        # Outside testing: an id run into Chinese text was none, a name so run on was one
        # (CJK never goes on an id: ids are ASCII).
        ("@u-200你好", ("u-200",)),
        ("@u-200的看法呢", ("u-200",)),
        ("@a, what now?", ("a",)),
        # Outside testing: "谢谢。@张三" was a mention, "Thanks.@Lin" not.
        ("Thanks.@Lin what now?", ("u-200",)),
        ("谢谢。@张三", ("u-300",)),
        # Outside testing: "@张三@李四" named both, its English twin only the first.
        ("@Lin@JOSÉ hi", ("u-200", "u-100")),
        ("@张三@Lin 你好", ("u-300", "u-200")),
    ],
)
def test_mentions_are_found_however_the_name_is_typed(text, who) -> None:
    directive = classify(named(text))
    assert directive.kind is DirectiveKind.MENTION
    assert directive.member_ids == who


CHAT = (
    Member(member_id="mei", display_name="Mei", aliases=("梅",)),
    Member(member_id="kai", display_name="Kai"),
    Member(member_id="bo", display_name="Bo"),
)
_EVERYONE_IN_CHAT = ("mei", "kai", "bo")


@pytest.mark.parametrize(
    ("text", "kind", "members"),
    [
        # Outside testing: an @ right after a Chinese character was taken for one inside a
        # word, so these were open discussions (or lost their second name), their English
        # twins not. Chinese needs no space before an @.
        ("@Mei和@Kai你们好", DirectiveKind.MENTION, ("mei", "kai")),
        ("@Mei and @Kai hi", DirectiveKind.MENTION, ("mei", "kai")),
        ("那@Bo怎么看？", DirectiveKind.MENTION, ("bo",)),
        ("what about @Bo?", DirectiveKind.MENTION, ("bo",)),
        ("请@Mei回答", DirectiveKind.MENTION, ("mei",)),
        ("please @Mei answer", DirectiveKind.MENTION, ("mei",)),
        ("问一下@梅", DirectiveKind.MENTION, ("mei",)),
        ("ask @梅", DirectiveKind.MENTION, ("mei",)),
        ("谢谢@全体成员！", DirectiveKind.ALL, _EVERYONE_IN_CHAT),
        ("thanks @all!", DirectiveKind.ALL, _EVERYONE_IN_CHAT),
        ("你好@大家", DirectiveKind.ALL, _EVERYONE_IN_CHAT),
        ("hi @everyone", DirectiveKind.ALL, _EVERYONE_IN_CHAT),
        # An @ inside a Latin word or an e-mail address is still none.
        ("bob@all.org", DirectiveKind.OPEN, ()),
        ("写信到bob@all.org", DirectiveKind.OPEN, ()),
        ("x@Mei", DirectiveKind.OPEN, ()),
        ("see mei.bo@kai", DirectiveKind.OPEN, ()),
        ("@allison hi", DirectiveKind.OPEN, ()),
        ("你好@allison", DirectiveKind.OPEN, ()),
        ("the @all-hands meeting", DirectiveKind.OPEN, ()),
        ("明天@all-hands开会", DirectiveKind.OPEN, ()),
        # Nor one whose name goes on as a domain: an address with a Chinese local part
        # (review: "mei" was mentioned). A dot that ends the sentence ends the name.
        ("写信到张三@mei.kr", DirectiveKind.OPEN, ()),
        ("write to 张三@mei.kr", DirectiveKind.OPEN, ()),
        ("写信到张三@Mei.kr.", DirectiveKind.OPEN, ()),
        ("写信到张三@mei-corp.kr", DirectiveKind.OPEN, ()),
        ("write to 张三@mei.co.uk", DirectiveKind.OPEN, ()),
        ("谢谢@mei.2号方案怎么样", DirectiveKind.MENTION, ("mei",)),
        ("thanks @mei.2nd plan?", DirectiveKind.MENTION, ("mei",)),
        ("@Mei-chan你好", DirectiveKind.MENTION, ("mei",)),
        ("谢谢@Mei.", DirectiveKind.MENTION, ("mei",)),
        ("thanks @Mei.", DirectiveKind.MENTION, ("mei",)),
        ("@Mei.你怎么看", DirectiveKind.MENTION, ("mei",)),
        ("@Mei. What do you think", DirectiveKind.MENTION, ("mei",)),
    ],
)
def test_an_at_right_after_chinese_text_is_a_mention(text, kind, members) -> None:
    directive = classify(replace(snap(text), members=CHAT))
    assert (directive.kind, directive.member_ids) == (kind, members), text


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("请大家报数", DirectiveKind.COUNT_OFF),
        ("@all count off, please", DirectiveKind.COUNT_OFF),
        ("大家报个数吧", DirectiveKind.COUNT_OFF),
        ("ｓｔｏｐ", DirectiveKind.STOP),
        ("＠全体成员 你好", DirectiveKind.ALL),
    ],
)
def test_directives_typed_with_full_width_or_polite_words(text, kind) -> None:
    assert classify(named(text)).kind is kind


def test_explicit_mentions_come_first_and_the_flag_means_all() -> None:
    assert classify(snap("and @Alice", mentions=["c"])).member_ids == ("c", "a")
    assert classify(snap("hello", mention_all=True)).kind is DirectiveKind.ALL


def test_single_chat_ignores_group_directives_but_not_stop() -> None:
    assert classify(snap("报数", kind=SessionKind.SINGLE)).kind is DirectiveKind.SINGLE
    assert classify(snap("停止", kind=SessionKind.SINGLE)).kind is DirectiveKind.STOP


@pytest.mark.parametrize(
    ("reply", "number", "problem"),
    [
        ("3", 3, ""),
        ("3！", 3, ""),
        ("第三", 3, ""),
        ("Three... I mean 3.", 3, ""),
        ("7", 3, "holds another number"),
        ("3, 4", 3, "holds another number"),
        ("I refuse.", 3, "misses its number"),
        ("3 " + "and a long story " * 5, 3, "too long"),
        ("１２", 12, ""),
        ("三号！", 3, ""),
        ("十二", 12, ""),
        ("十二", 2, "holds another number"),
        ("我是一号，不是二号", 1, "holds another number"),
        ("我来说一下：3", 3, ""),
        ("二十三号到", 23, ""),
        ("第一", 3, "holds another number"),
        # English number words, the twin of the Chinese numerals (outside review: "One!"
        # missed its number and was asked twice more).
        ("One!", 1, ""),
        ("Number one reporting!", 1, ""),
        ("Twenty-one!", 21, ""),
        ("thirty second", 32, ""),
        ("The fourth, here.", 4, ""),
        ("Two!", 3, "holds another number"),
        ("Someone says 3", 3, ""),
        ("Lin, number ELEVEN", 11, ""),
        # ... and not where English uses them for other things (outside review).
        ("3, no one else.", 3, ""),
        ("Bo here: 3! Hello, one and all.", 3, ""),
        ("4 — for the first time!", 4, ""),
        ("Wait a second: 2.", 2, ""),
        ("Bo here: one.", 1, ""),
        ("One here!", 1, ""),
        ("I'm one!", 1, ""),
        ("First here!", 1, ""),
        ("I'm second!", 2, ""),
        ("One - Mei", 1, ""),
        ("One second... 3!", 3, ""),
        ("On second thought: 4", 4, ""),
        ("3... or rather, one", 3, "holds another number"),
        ("Number one? No: 3", 3, "holds another number"),
    ],
)
def test_count_off_check(reply, number, problem) -> None:
    assert check_count_off(reply, number) == problem


def test_a_count_off_reply_cut_at_its_budget_or_echoing_the_prompt_is_too_long() -> None:
    # Outside testing (SmolLM2 on llama-server): both were accepted as the member's reply.
    assert check_count_off("你还可以只回复你的数字 3。\n\n## Your task\n[Ba", 3) == "too long"
    assert check_count_off("Number 4 of 4", 4, cut=True) == "too long"
    assert check_count_off("4!", 4, cut=False) == ""


def test_memories_ranked_by_relevance_then_importance() -> None:
    memories = [
        Memory(memory_id="1", content="likes hiking in the alps", importance=0.9),
        Memory(memory_id="2", content="prefers green tea", importance=0.2),
        Memory(memory_id="3", content="drinks black tea at night", importance=0.5),
        Memory(memory_id="4", content="has a cat", importance=0.1),
    ]
    chosen = select_memories(memories, "which tea should I drink?", top_k=2, max_chars=1000)
    assert [m.memory_id for m in chosen] == ["3", "2"]
    # Size-bounded: the 25-character memory does not fit in 20, the 17-character one does.
    assert select_memories(memories, "tea", top_k=5, max_chars=20) == [memories[1]]


def test_chinese_function_characters_make_no_memory_relevant() -> None:
    # The twin of the English stopwords: "我的猫在哪" shares only 我 and 在 with "我住在上海",
    # so the more important memory wins, as "Where is my cat?" lets it in English.
    memories = [
        Memory(memory_id="home", content="我住在上海", importance=0.1),
        Memory(memory_id="food", content="对花生过敏", importance=0.9),
        Memory(memory_id="pet", content="养了一只猫", importance=0.1),
    ]
    assert [
        m.memory_id for m in select_memories(memories, "我的猫在哪？", top_k=1, max_chars=99)
    ] == ["pet"]
    assert [
        m.memory_id for m in select_memories(memories[:2], "我的猫在哪？", top_k=1, max_chars=99)
    ] == ["food"]


def test_a_fixed_tasks_words_make_no_memory_relevant() -> None:
    # An @mention's task ("The user addressed you by name. Answer their latest message.")
    # shares "answer", "latest" and "message" with the first memory, nothing with the turn.
    memories = [
        Memory(memory_id="inbox", content="answers every message by the latest at noon"),
        *(Memory(memory_id=f"paris{i}", content=f"Paris fact {i}") for i in range(5)),
    ]
    turn = "@Mei what about Paris?"

    def chosen(step: PlanStep) -> set[str]:
        query = memory_query(turn, step)
        return {m.memory_id for m in select_memories(memories, query, top_k=5, max_chars=999)}

    for task in (tasks.MENTIONED, tasks.ANSWER, tasks.EVERYONE, count_off_task(1, 3)):
        number = 1 if task.startswith("Count") else 0
        step = PlanStep(
            index=0, member_id="m", reply_id="r", task=task, token_budget=9, count_off_number=number
        )
        assert chosen(step) == {f"paris{i}" for i in range(5)}, task
    # A supervisor's task says what to talk about: its words count.
    written = PlanStep(
        index=0, member_id="m", reply_id="r", task="Check the inbox message", token_budget=9
    )
    assert "inbox" in chosen(written)


def test_long_or_hostile_text_is_never_a_command() -> None:
    # A stop or continue is a short message of its own; a 30,000-character wall of
    # punctuation around "stop" is just text (and classifying it stays linear).
    assert classify(snap(", " * 15_000 + "stop")).kind is DirectiveKind.OPEN
    assert classify(snap("!" * 30_000)).kind is DirectiveKind.OPEN
    assert classify(snap("@nobody " * 4_000 + "@Bob")).kind is DirectiveKind.OPEN, (
        "only the first @-words are read"
    )


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        # Outside testing: each was an open discussion (its simplified twin is a directive).
        ("大家報數", DirectiveKind.COUNT_OFF),
        ("報數！", DirectiveKind.COUNT_OFF),
        ("繼續", DirectiveKind.CONTINUE),
        ("接著說", DirectiveKind.CONTINUE),
        ("別說了", DirectiveKind.STOP),
        ("停下來", DirectiveKind.STOP),
        ("請停止", DirectiveKind.STOP),
        ("@全體成員 你好", DirectiveKind.ALL),
        ("好的，麻煩報個數", DirectiveKind.COUNT_OFF),
    ],
)
def test_directives_in_traditional_characters(text: str, kind: DirectiveKind) -> None:
    assert classify(snap(text)).kind is kind


_SAME_IN_BOTH_SCRIPTS = set(
    "一上下不了人以你位住用要停全去可各吧呀呃哦啦喂喜嗯嘿噢在大好家就成我所打接是更有止然的行那都麻"
)


def test_every_rule_word_reads_in_traditional_characters() -> None:
    # Every CJK character of a rule's word is the same in both scripts or has its
    # traditional twin in `words.simplified`: a word added with a new character must say
    # which (the test's list, or the table).
    rows = (*FILLERS, *EVERYONE, *REMEMBER, *PREFER, *NOT_A_STATEMENT)
    rows += tuple(r for rows_ in COMMANDS.values() for r in rows_)
    rows += (((), QUESTION_PARTICLES),)
    characters = {ch for _, chinese in rows for word in chinese for ch in word if is_cjk(ch)}
    mapped = set(simplified("個麼們體別勞後員對報數來歡沒煩現著繼續記說請問題馬駕嗎"))
    assert characters - _SAME_IN_BOTH_SCRIPTS - mapped == set()


@pytest.mark.parametrize(
    ("text", "kind", "members"),
    [
        # Outside testing: a command's length counted the name before it, so with a long
        # name "@<name> 停止" stopped and "@<name> stop" did not.
        ("@Wolfgang Amadeus Mozart of Salzburg and Vienna the Second stop", "stop", ()),
        ("@Wolfgang Amadeus Mozart of Salzburg and Vienna the Second count off", "count", "w"),
        # Invisible format characters pasted with a command, or inside a mention.
        ("\u200b停止", "stop", ()),
        ("\ufeffcount off", "count", "w"),
        ("stop\u2060", "stop", ()),
        ("\u200e继续\u200f", "continue", ()),
        ("@\u200bBob hi", "mention", ("b",)),
        ("@Ann  Lee hi", "mention", ("l",)),
        ("@Ann\nLee hi", "mention", ("l",)),
        ("@Mei hi", "mention", ("m",)),  # a display name with spaces around it
        ("@Bob_ hi", "open", ()),  # a handle that goes on past the name
    ],
)
def test_long_names_invisible_characters_and_spaces_around_names(text, kind, members) -> None:
    roster = (
        *ROSTER,
        Member(
            member_id="w", display_name="Wolfgang Amadeus Mozart of Salzburg and Vienna the Second"
        ),
        Member(member_id="l", display_name="Ann Lee"),
        Member(member_id="n", display_name="Ann"),
        Member(member_id="m", display_name=" Mei "),
    )
    snapshot = replace(snap(text), members=roster)
    directive = classify(snapshot)
    expected = {
        "stop": DirectiveKind.STOP,
        "continue": DirectiveKind.CONTINUE,
        "count": DirectiveKind.COUNT_OFF,
        "mention": DirectiveKind.MENTION,
        "open": DirectiveKind.OPEN,
    }[kind]
    assert directive.kind is expected
    if kind == "mention":
        assert directive.member_ids == members


def test_a_command_after_mentions_longer_than_the_leading_allowance_is_text() -> None:
    assert classify(snap("@Bob " * 300 + "stop")).kind is DirectiveKind.MENTION


# -- fillers: one table per language, the same coverage ------------------------------------

_COMMANDS = {
    DirectiveKind.STOP: ("stop", "停止"),
    DirectiveKind.CONTINUE: ("continue", "继续"),
    DirectiveKind.COUNT_OFF: ("count off", "报数"),
}
_EN = sorted({word for row in FILLERS for word in row[0]})
_ZH = sorted({word for row in FILLERS for word in row[1]})


def test_every_filler_and_directive_meaning_has_both_languages() -> None:
    for english, chinese in (*FILLERS, *EVERYONE, *(r for rows in COMMANDS.values() for r in rows)):
        assert english and chinese, f"{english or chinese} has no twin in the other language"


_SPELLED = {r"count(?:ing)?[\s-]*off": "counting off", r"sound[\s-]*off": "sound-off"}
"""A way to write each English pattern of COMMANDS (the others are words)."""


@pytest.mark.parametrize(
    ("kind", "word", "language"),
    [
        (kind, word, language)
        for kind, rows in COMMANDS.items()
        for row in rows
        for language, words in enumerate(row)
        for word in words
    ],
)
def test_every_directive_word_in_either_language_is_its_directive(
    kind: DirectiveKind, word: str, language: int
) -> None:
    word = _SPELLED.get(word, word)
    for form in ("{w}", "{w}!", *_AROUND[language]):
        text = form.format(w=word, command=word, filler="please" if language == 0 else "请")
        assert classify(snap(text)).kind is kind, text


@pytest.mark.parametrize("word", [w for row in EVERYONE for words in row for w in words])
def test_every_word_for_everyone_after_an_at_is_all(word: str) -> None:
    assert classify(snap(f"@{word} 你好 hello")).kind is DirectiveKind.ALL
    # CJK runs on after it without a space, as after a member's name.
    assert classify(snap(f"@{word}你们好")).kind is DirectiveKind.ALL
    if not is_cjk(word[-1]):
        assert classify(snap(f"@{word}x hi")).kind is not DirectiveKind.ALL, "another word"


@pytest.mark.parametrize(
    ("text", "kind", "members"),
    [
        # A directive right after a leading @mention, CJK without a space (outside testing
        # found these planned as mentions or an open discussion).
        ("@Alice停止", DirectiveKind.STOP, ()),
        ("@小爱停下来", DirectiveKind.STOP, ()),
        ("@Bob继续说", DirectiveKind.CONTINUE, ()),
        ("@Carol报数", DirectiveKind.COUNT_OFF, ("a", "b", "c")),
        ("@全体成员请报数", DirectiveKind.COUNT_OFF, ("a", "b", "c")),
        ("@all请报数", DirectiveKind.COUNT_OFF, ("a", "b", "c")),
        ("@Alice @Bob，停止", DirectiveKind.STOP, ()),
        ("@a停止", DirectiveKind.STOP, ()),  # a member id, as a name
        ("@a stop", DirectiveKind.STOP, ()),
        ("@c报数", DirectiveKind.COUNT_OFF, ("a", "b", "c")),
        ("@所有人你们好", DirectiveKind.ALL, ("a", "b", "c")),
        ("@all请回答", DirectiveKind.ALL, ("a", "b", "c")),
        # Still no directive: a name that goes on, an @ of nobody before CJK, a sentence.
        ("@Alice你好", DirectiveKind.MENTION, ("a",)),
        ("@Alicestop", DirectiveKind.OPEN, ()),
        ("@allison hi", DirectiveKind.OPEN, ()),
        # A hyphen or dot and a letter go on, as after a member id (outside review).
        ("Is the @all-hands meeting today?", DirectiveKind.OPEN, ()),
        ("@everyone-else ignore this", DirectiveKind.OPEN, ()),
        ("@all. 你们好", DirectiveKind.ALL, ("a", "b", "c")),
        ("@Alice 停止的意思是什么", DirectiveKind.MENTION, ("a",)),
    ],
)
def test_a_directive_right_after_a_leading_mention_or_at_all(text, kind, members) -> None:
    directive = classify(snap(text))
    assert (directive.kind, directive.member_ids) == (kind, members), text


_AROUND = (
    ("{filler}, {command}!", "{filler} {command}", "{command}, {filler}"),
    ("{filler}，{command}！", "{filler}{command}", "{command}，{filler}"),
)
"""How people write a filler around a command, in English and in Chinese."""


@pytest.mark.parametrize("kind", list(_COMMANDS))
@pytest.mark.parametrize(("language", "filler"), [*((0, w) for w in _EN), *((1, w) for w in _ZH)])
def test_every_filler_around_every_directive(
    kind: DirectiveKind, language: int, filler: str
) -> None:
    command = _COMMANDS[kind][language]
    for form in _AROUND[language]:
        text = form.format(filler=filler, command=command)
        assert classify(snap(text)).kind is kind, text


_WRAPPED = (
    (
        "({command})",
        '"{command}"',
        "'{command}'",
        "\u201c{command}\u201d",
        "\u2018{command}\u2019",
        "[{command}]",
        "{command}\u2014",
        "{command} \u2013 ",
        "-- {command} --",
        "{command} \U0001f600",
        "\U0001f6d1 {command}!",
        "{command} \U0001f44b\U0001f3fb",
        "{command} {command}",
        "{command}, please {command}!",
    ),
    (
        "（{command}）",
        "「{command}」",
        "『{command}』",
        "【{command}】",
        "《{command}》",
        "\u201c{command}\u201d",
        "{command}——",
        "{command}\U0001f600",
        "\u270b{command}！",
        "{command}\u2764\ufe0f",
        "{command}{command}",
        "{command}！{command}！",
        "{command}，请{command}",
    ),
)
"""Quotes, brackets and dashes around a command, an emoji by it, the command said again:
punctuation and emphasis, in English and in Chinese."""


@pytest.mark.parametrize("kind", list(_COMMANDS))
@pytest.mark.parametrize(
    ("language", "form"), [(language, f) for language in (0, 1) for f in _WRAPPED[language]]
)
def test_quotes_brackets_dashes_emoji_or_a_repeat_leave_a_directive(
    kind: DirectiveKind, language: int, form: str
) -> None:
    # Outside testing: "(stop)", "（停止）", "「停止」", "stop—", "stop 😀", "停止停止" were
    # open discussions.
    text = form.format(command=_COMMANDS[kind][language])
    assert classify(snap(text)).kind is kind, text


@pytest.mark.parametrize("kind", list(_COMMANDS))
@pytest.mark.parametrize("filler", _EN)
def test_an_english_word_meets_chinese_without_a_space_but_not_another_english_word(
    kind: DirectiveKind, filler: str
) -> None:
    # Outside review: "please报数" and "ok停止" were open (while "好stop" was a stop), and
    # "stopnow" or "continueso" were commands.
    english, chinese = _COMMANDS[kind]
    assert classify(snap(f"{filler}{chinese}")).kind is kind
    assert classify(snap(f"{chinese}{filler}")).kind is kind
    assert classify(snap(f"{english}{filler.replace(' ', '')}")).kind is DirectiveKind.OPEN


@pytest.mark.parametrize(
    "text",
    ["好，报数", "好了，报数！", "好的，报数吧", "那么，继续", "嗯，停止", "行，停"],
)
def test_chinese_fillers_from_the_field(text: str) -> None:
    assert classify(snap(text)).kind in {
        DirectiveKind.COUNT_OFF,
        DirectiveKind.CONTINUE,
        DirectiveKind.STOP,
    }


@pytest.mark.parametrize(
    "text",
    [
        *("also stop", "不要停止", "别报数", "bus stop schedule?", "okaystop", "不停"),
        # Punctuation, emoji and a repeat make no sentence a command (outside testing).
        *("stop the music", "don't stop", "(stop) what?", "stop 😀 the music", "stopstop"),
        *("“停止”是什么意思？", "停止😀音乐", "不要停止停止", "「报数」是什么", "stop, continue"),
    ],
)
def test_a_filler_is_a_word_and_a_negation_is_no_filler(text: str) -> None:
    assert classify(snap(text)).kind not in {DirectiveKind.STOP, DirectiveKind.COUNT_OFF}


@pytest.mark.parametrize("filler", ["那就", "all right ", "好的，"])
def test_a_message_of_fillers_up_to_the_size_limit_is_classified_without_backtracking(
    filler: str,
) -> None:
    """Fillers made of fillers ("那就" = "那" + "就") once let the directive patterns try
    every split of them: 44 characters took 4 s, and it doubled with each filler more. A
    message of 32 KiB of them is classified at once (here: within 10 s, in a child process,
    so a regression fails instead of hanging the suite)."""
    text = filler * (32 * 1024 // len(filler.encode()))
    assert call_bounded("support.bounded:directive_kind", text + "x") == DirectiveKind.OPEN.name


def test_a_member_id_beats_another_members_name_or_alias_that_spells_it() -> None:
    # Outside testing: "@kai" reached lin, whose alias is "kai", not the member with id kai.
    members = (
        Member(member_id="lin", display_name="Lin", aliases=("kai",)),
        Member(member_id="kai", display_name="Kai K"),
        Member(member_id="mo", display_name="bo"),
        Member(member_id="bo", display_name="Bo B"),
        Member(member_id="s1", display_name="Sam"),
        Member(member_id="s2", display_name="Sam"),
    )
    for text, who in (("@kai hi", "kai"), ("@bo hi", "bo"), ("@Sam hi", "s1"), ("@lin", "lin")):
        directive = classify(replace(snap(text), members=members))
        assert directive.member_ids == (who,), text


def test_an_id_that_is_also_a_name_lets_cjk_run_on_and_a_name_beats_an_at_all_word() -> None:
    # The demo roster's shape (id "mei", name "Mei"): "@Mei停止" is a stop, "@Mei你好" names
    # her; and a member called 大家长 is named by "@大家长", not taken for "@大家" (everyone).
    members = (
        Member(member_id="mei", display_name="Mei"),
        Member(member_id="bob", display_name="Bob"),
        Member(member_id="dz", display_name="大家长"),
    )
    for text, kind, who in (
        ("@Mei停止", DirectiveKind.STOP, ()),
        ("@Mei你好", DirectiveKind.MENTION, ("mei",)),
        ("@Bob的看法呢？", DirectiveKind.MENTION, ("bob",)),
        ("@大家长 你怎么看", DirectiveKind.MENTION, ("dz",)),
        ("@大家长 停止", DirectiveKind.STOP, ()),
        ("@大家好", DirectiveKind.ALL, ("mei", "bob", "dz")),
        ("hi @大家长 and @all", DirectiveKind.ALL, ("mei", "bob", "dz")),
    ):
        directive = classify(replace(snap(text), members=members))
        assert (directive.kind, directive.member_ids) == (kind, who), text
    # A name shorter than the @all word it starts: the @all word, whole.
    members = (*members, Member(member_id="da", display_name="大"))
    everyone = ("mei", "bob", "dz", "da")
    for text, kind, who in (
        ("@大家停止", DirectiveKind.STOP, ()),
        ("@大家报数", DirectiveKind.COUNT_OFF, everyone),
        ("@大 停止", DirectiveKind.STOP, ()),
        ("@大你好", DirectiveKind.MENTION, ("da",)),
    ):
        directive = classify(replace(snap(text), members=members))
        assert (directive.kind, directive.member_ids) == (kind, who), text


def test_one_classify_builds_the_rosters_name_table_once(monkeypatch) -> None:
    # A leading mention, an @all word that turns out to be a name, then a mention: three
    # steps read names; the table of 32 members' spellings is built for the first only.
    from roundtable.graph import directives

    built: list[int] = []
    real = directives._names
    monkeypatch.setattr(directives, "_names", lambda members: built.append(1) or real(members))
    members = (
        *(
            Member(member_id=f"m{i}", display_name=f"Name{i}", aliases=(f"a{i}",))
            for i in range(31)
        ),
        Member(member_id="dz", display_name="大家长"),
    )
    directive = classify(replace(snap("@Name3 你看 @大家长 和 @a7"), members=members))
    assert (directive.kind, directive.member_ids) == (DirectiveKind.MENTION, ("m3", "dz", "m7"))
    assert len(built) == 1
    # And text that names nobody builds none.
    built.clear()
    assert classify(replace(snap("你们怎么看"), members=members)).kind is DirectiveKind.OPEN
    assert built == []


def test_a_wrong_count_off_is_asked_again_in_both_languages_whatever_its_problem() -> None:
    from roundtable.graph.countoff import count_off_again

    for reply in ("3 " + "and a long story " * 5, "7", "I refuse."):
        problem = check_count_off(reply, 3)
        assert problem
        again = count_off_again(problem, 3)
        assert f"That reply {problem}." in again and "请只回复你的数字 3" in again


USER, ASSISTANT = MessageRole.USER, MessageRole.ASSISTANT


Q1, Q2 = "what should we cook tonight?", "what is 2+2?"


@pytest.mark.parametrize(
    ("history", "answered", "continued"),
    [
        # The words the stopped run answered, found by the hash its row keeps, even with
        # a later question (answered by a run in between) after them.
        ([(USER, Q1), (USER, "停止"), (USER, Q2), (ASSISTANT, "4")], words_hash(Q1), Q1),
        ([(USER, Q1), (ASSISTANT, "Pasta."), (USER, Q1)], words_hash(Q1), Q1),
        # Not in the history (cut by the gateway's window): the turn's own words.
        ([(USER, Q2), (USER, "stop")], words_hash(Q1), "继续"),
        # A run that kept no hash: what it answered, past the replies it gave and the stop.
        ([(USER, Q1), (ASSISTANT, "Pasta."), (USER, "停止")], "", Q1),
        ([(USER, "今晚吃什么？"), (USER, "@Alice stop!"), (USER, "继续")], "", "今晚吃什么？"),
        ([(USER, "今晚吃什么？"), (USER, "请停止"), (USER, "go on, please")], "", "今晚吃什么？"),
        ([(USER, "stop"), (ASSISTANT, "Pasta.")], "", "继续"),
        ([], "", "继续"),
    ],
)
def test_a_continue_turn_answers_what_the_stopped_run_was_answering(
    history: list[tuple[MessageRole, str]], answered: str, continued: str
) -> None:
    # Outside testing: the speakers a continue turn took over answered "继续" itself.
    messages = tuple(HistoryMessage(role=role, content=text) for role, text in history)
    assert continued_text(replace(snap("继续"), history=messages), answered) == continued
