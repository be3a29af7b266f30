"""Directives are code, never a model.

Classification is a pure function of the snapshot, checked in a fixed order: stop,
continue, count-off, @all, @mentions; anything else is an open discussion (or, in a
single chat, the primary member answering).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import unicodedata
from dataclasses import dataclass

from roundtable.domain.plan import DirectiveKind
from roundtable.domain.snapshot import Member, MessageRole, SessionKind, Snapshot
from roundtable.domain.words import EVERYONE, Twins, alternation, simplified

# A directive must stand alone as the user's instruction, not be buried in a sentence
# about something else: "stop" but not "bus stop schedule?", "报数" but not "what does 报数
# mean?" or "a discount off the list price". Punctuation, @mentions before it and the words
# people put around a command are fine ("大家报数！", "好了，停止", "ok, count off, please").

FILLERS: Twins = (
    # (English, Chinese): one row per meaning, so that each language accepts what the other does.
    (("ok", "okay", "k"), ("好", "好的", "好吧", "可以")),
    (("alright", "all right", "right"), ("好了", "行了", "对")),
    (("fine", "sure"), ("行", "没问题")),
    (("so", "then"), ("那", "那就", "然后")),
    (("well",), ("那么",)),
    (("um", "uh", "hmm", "oh"), ("嗯", "呃", "哦", "噢")),
    (("yes", "yeah", "yep"), ("是", "是的", "对的")),
    (("hey",), ("喂", "嘿")),
    (("now", "right now"), ("现在", "马上")),
    (("please", "pls", "kindly"), ("请", "麻烦", "劳驾")),
    (("everyone", "everybody", "all", "guys", "folks"), ("大家", "各位", "所有人", "们", "都")),
    (("just",), ("就",)),
    (("quickly",), ("一下", "吧", "啦", "呀")),
)
"""Words around a directive that leave it a directive: fillers, politeness, whom it is
for. English words stand as words (no "also" for "so"); Chinese ones need no spaces."""


_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002ffff"
"""The characters `is_cjk` accepts, as a regex class body."""
_ENGLISH_END = rf"(?![^\W{_CJK}])"
"""Where an English word may end: not before a letter or digit of a word that goes on
("stopnow" is no "stop"), but before CJK text, which needs no space ("please报数", "ok停止",
as "好stop" and "请count off" were already)."""


def _as_word(word: str) -> str:
    return re.escape(word).replace(r"\ ", r"\s+") + _ENGLISH_END


_POLITE = f"(?:{alternation(FILLERS, _as_word)})"
_PUNCTUATION = r"\s,.!?;:~，。！？；：、…\"'“”‘’()\[\]（）「」『』【】《》〈〉\-–—―"
"""Punctuation around a command, as a regex class body: quotes, brackets and dashes as well
("(stop)", "「停止」", "stop—", "停止——"), in both languages' forms."""
_EMOJI = "\u200d\ufe0f\u2300-\u23ff\u2600-\u27bf\u2b00-\u2bff\U0001f000-\U0001faff"
"""Emoji and symbols, with their joiner and presentation selector ("stop 😀", "✋停止",
"stop 👋🏻"): they say how a command is meant, not what else it asks."""
_EDGE = f"[{_PUNCTUATION}{_EMOJI}]*"


def _directive(words: str) -> re.Pattern[str]:
    # The fillers around the command are matched atomically (`(?>…)*+`): fillers that are
    # made of other fillers ("那就" = "那" + "就", "all right") would otherwise let the
    # engine try every split of a long run of them, exponentially (measured: 4 s for 44
    # characters). Each filler is tried longest first, so no match needs a second split.
    polite = rf"(?>{_POLITE}{_EDGE})*+"
    # The command may be said again, with fillers between ("stop stop", "停止停止", "停！停！",
    # "stop, please stop"): emphasis, not another request. Only the same kind: "stop,
    # continue" is no command, and a word that is neither ("stop the music") ends it.
    return re.compile(
        rf"^{_EDGE}(?:@\S+\s+)*+{polite}(?:(?:{words}){_EDGE}{polite})++$",
        re.IGNORECASE,
    )


COMMANDS: dict[DirectiveKind, Twins] = {
    # English entries are patterns (a space stands for any run of spaces; count-off also
    # takes "count-off" and "countoff"); Chinese ones are the words as written.
    DirectiveKind.STOP: (
        (("stop",), ("停止", "停")),
        (("stop it",), ("停下", "停下来")),
        (("stop talking",), ("别说了",)),
        (("halt",), ("打住",)),
    ),
    DirectiveKind.CONTINUE: (
        (("continue",), ("继续",)),
        (("go on", "keep going"), ("接着说", "继续说", "说下去")),
        (("carry on",), ("接着来",)),
    ),
    DirectiveKind.COUNT_OFF: (
        ((r"count(?:ing)?[\s-]*off",), ("报数", "报个数")),
        ((r"sound[\s-]*off",), ("报一下数",)),
    ),
}
"""The words of the directives that count only as the whole message."""


_DOMAIN_GOES_ON = re.compile(r"[-A-Za-z0-9]*(?:\.[-A-Za-z0-9]+)*\.[A-Za-z]{2,}(?![A-Za-z0-9])")
"""What follows a name in an e-mail address's domain: labels and dots up to a top-level
domain of letters ("mei.kr", "mei-corp.co.uk"), not a sentence's full stop ("@mei.2号方案")."""


def _words(rows: Twins) -> str:
    return alternation(rows, lambda pattern: pattern.replace(" ", r"\s+") + _ENGLISH_END)


_STOP = _directive(_words(COMMANDS[DirectiveKind.STOP]))
_CONTINUE = _directive(_words(COMMANDS[DirectiveKind.CONTINUE]))
_COUNT_OFF = _directive(_words(COMMANDS[DirectiveKind.COUNT_OFF]))
# An @ that starts a mention: not inside a word or an e-mail address ("bob@lin.org", "x@Mei"),
# but right after CJK text, which needs no space before it ("谢谢@全体成员", "请@Mei回答"),
# or a sentence's full stop, as after "。" ("Thanks.@Mei": no e-mail address has "." there).
_AT = rf"(?<![^\W{_CJK}])@"
# Not followed by a letter of a word that goes on ("@allison"), nor by a hyphen or dot and
# one ("@all-hands", "@everyone.else": as a member id goes on after "-"): CJK text runs on
# after it without a space ("@所有人你们好", "@all请回答"), as after a member's name.
_WORD_GOES_ON = rf"(?=[-.]?[^\W{_CJK}])"
_ALL = re.compile(rf"{_AT}(?:{_words(EVERYONE)})(?!{_WORD_GOES_ON})")
_MENTION_AT = re.compile(_AT)
_LEADING_ALL = re.compile(rf"{_EDGE}@(?:{_words(EVERYONE)})(?!{_WORD_GOES_ON})")
_LEADING_AT = re.compile(rf"{_EDGE}@")


_INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]")
"""Format characters that show nothing (zero-width spaces and joiners, direction marks, a
byte-order mark, a soft hyphen): pasted text carries them, and "\\u200b停止" is a stop."""
_SPACES = re.compile(r"\s+")


def fold(text: str) -> str:
    """Text as directives compare it: NFKC (full-width "＠张三" and "ｓｔｏｐ" as typed by
    CJK input methods, composed accents), without invisible format characters, each run of
    white space one space ("@Ann  Lee" and "@Ann\\nLee" are "@Ann Lee"), traditional
    characters of the rules' words simplified (`words.simplified`: "大家報數"), and
    case-folded. Names are folded alike, so a mention matches whichever form was typed."""
    text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))
    return simplified(_SPACES.sub(" ", text)).casefold()


def is_cjk(char: str) -> bool:
    """Whether a character is of a script written without spaces between words."""
    code = ord(char)
    return (
        0x3040 <= code <= 0x30FF  # kana
        or 0x3400 <= code <= 0x4DBF
        or 0x4E00 <= code <= 0x9FFF
        or 0xAC00 <= code <= 0xD7AF  # hangul
        or 0xF900 <= code <= 0xFAFF
        or 0x20000 <= code <= 0x2FFFF
    )


@dataclass(frozen=True, slots=True)
class Directive:
    """What the user's turn asks for, and whom it names (member ids, in order)."""

    kind: DirectiveKind
    member_ids: tuple[str, ...] = ()

    @property
    def stops(self) -> bool:
        """Whether the turn is a stop: nobody speaks, the thread's live runs stop. At the
        run limit it is still taken (outside testing: 停止 was refused TOO_MANY_RUNS, and
        the run it was sent to stop went on talking)."""
        return self.kind is DirectiveKind.STOP


@dataclass(frozen=True, slots=True)
class _Name:
    """A way to @ a member: a folded display name, alias or member id."""

    text: str
    member_id: str
    is_id: bool

    def ends_at(self, text: str, end: int) -> bool:
        """Whether a mention of this name may end at `end` of `text`.

        "@Lin" is not "@Lindsey", and "@a" is no "@anyone"; but "@Lin的看法", "@张三你好" and
        "@u123你好" are mentions: CJK text runs on after a name or an id without a space.
        Neither is "@mei.kr" in "张三@mei.kr", an e-mail address; "@Mei." ends a sentence.
        """
        if end >= len(text):
            return True
        following = text[end]
        if following in "-." and _DOMAIN_GOES_ON.match(text, end, end + 256):
            return False  # "张三@mei.kr", "张三@mei-corp.kr": an e-mail address, not "@mei"
        if self.is_id:
            # Ids are ASCII ([A-Za-z0-9._:-]): a CJK character can never go on one.
            return is_cjk(following) or not (following.isalnum() or following in "-_")
        if not (following.isalnum() or following == "_"):
            return True  # space, punctuation, "'s"; "@Mei_" is a handle that goes on
        return is_cjk(following) or is_cjk(self.text[-1])


def _names(members: tuple[Member, ...]) -> dict[str, list[_Name]]:
    """Every way to @ a member, by first character, longest first. A clash is settled the
    same way every time: a member id beats another member's name or alias (ids are the
    unique ones), and between names and aliases the member first in the roster wins. A
    text that is an id and also a name (id "mei", name "Mei") ends like a name: a hyphen
    may follow it ("@Mei-chan")."""
    spelled_as_name = {
        fold(spelled).strip() for m in members for spelled in (m.display_name, *m.aliases)
    }
    names: dict[str, _Name] = {}
    spellings = itertools.chain(
        ((m.member_id, m.member_id, True) for m in members),
        (
            (spelled, m.member_id, False)
            for m in members
            for spelled in (m.display_name, *m.aliases)
        ),
    )
    for spelled, member_id, is_id in spellings:
        folded = fold(spelled).strip()  # " Mei " is @Mei
        if folded and folded not in names:
            names[folded] = _Name(folded, member_id, is_id and folded not in spelled_as_name)
    by_first: dict[str, list[_Name]] = {}
    for name in sorted(names.values(), key=lambda n: len(n.text), reverse=True):
        by_first.setdefault(name.text[0], []).append(name)
    return by_first


class _Roster:
    """The roster's `_names` table, built when a text first needs it and then kept, so one
    `classify` builds it at most once however many of its steps read names."""

    __slots__ = ("_names", "members")

    def __init__(self, members: tuple[Member, ...]) -> None:
        self.members = members
        self._names: dict[str, list[_Name]] | None = None

    @property
    def names(self) -> dict[str, list[_Name]]:
        if self._names is None:
            self._names = _names(self.members)
        return self._names


def _name_at(text: str, start: int, names: dict[str, list[_Name]]) -> _Name | None:
    """The longest member name `text` goes on with at `start` (just after an @), if any."""
    for name in names.get(text[start : start + 1], ()):
        if text.startswith(name.text, start) and name.ends_at(text, start + len(name.text)):
            return name
    return None


def member_named(spelled: str, members: tuple[Member, ...]) -> str | None:
    """The id of the member `spelled` names whole ("Kai", "@梅", " kai "), read as a
    mention reads a name: folded, by the same table and clash rule (`_names`), so a plan's
    names and a user's @mentions can never name different members. None: nobody."""
    text = fold(spelled).strip().removeprefix("@")
    for name in _names(members).get(text[:1], ()):
        if name.text == text:
            return name.member_id
    return None


MAX_MENTION_TOKENS = 256
"""How many @-words of a text are matched against names."""

MAX_COMMAND_CHARS = 64
"""A stop or continue is a short message of its own; longer text is never read as one (and
the anchored patterns above never see more than this, whatever the user sends). Counted
past the @mentions it opens with: "@<a 59-character name> stop" is a stop (outside
testing: the cap counted the name, so the English twin of a Chinese stop was not one)."""
MAX_LEADING_MENTION_CHARS = 1_024
"""How much of a text the @mentions before a command may take (eight 128-character names)."""


def mentioned_members(snapshot: Snapshot) -> tuple[str, ...]:
    """Members named explicitly (ids first) or by @name / @alias in the text, in order, once each."""
    return _mentioned(snapshot, fold(snapshot.user_turn.text), _Roster(snapshot.members))


def _mentioned(snapshot: Snapshot, text: str, roster: _Roster) -> tuple[str, ...]:
    """`mentioned_members` of the folded `text`, with the roster's names built once."""
    seen: dict[str, None] = dict.fromkeys(snapshot.user_turn.mentions)
    everyone = len(snapshot.members)
    # Only the first MAX_MENTION_TOKENS @s are read: a 32 KiB wall of "@x" costs nothing.
    for match in itertools.islice(_MENTION_AT.finditer(text), MAX_MENTION_TOKENS):
        if len(seen) >= everyone:
            break  # everybody is named already: the rest of a long text changes nothing
        # The longest name the text goes on with ("@Ann Lee", a name with a space, too),
        # and those @-ed right after it: "@Mei@Kai" names both, as "@张三@李四" does (the
        # @ after a Latin name follows a letter, so `_AT` alone does not take it).
        at = match.end()
        while (name := _name_at(text, at, roster.names)) is not None:
            seen.setdefault(name.member_id, None)
            at += len(name.text)
            if text[at : at + 1] != "@" or len(seen) >= everyone:
                break
            at += 1
    return tuple(seen)


def _addresses_everyone(text: str, roster: _Roster) -> bool:
    """Whether an @ of `text` is an @all word, not the start of a member's name ("@大家长"
    names the member 大家长 where one is so called; "@大家" is everyone)."""
    for match in itertools.islice(_ALL.finditer(text), MAX_MENTION_TOKENS):
        name = _name_at(text, match.start() + 1, roster.names)
        if name is None or len(name.text) < match.end() - match.start() - 1:
            return True
    return False


def _after_leading_mentions(text: str, roster: _Roster) -> str:
    """`text` (folded) past the @mentions it opens with, of members or of everyone: "@Mei停止"
    and "@所有人请报数" are the directive that follows, as "@Mei 停止" is (CJK text runs on after
    a name without a space, so where a name ends needs the roster)."""
    while (at := _LEADING_AT.match(text)) is not None:
        # The longer of a member's name and an @all word, the name when they are as long
        # ("@大家长" is the member 大家长 where one is so called; "@大家停止" is everyone
        # even beside a member called 大), as `_addresses_everyone` decides.
        name = _name_at(text, at.end(), roster.names)
        everyone = _LEADING_ALL.match(text)
        if name is not None and (everyone is None or at.end() + len(name.text) >= everyone.end()):
            text = text[at.end() + len(name.text) :]
        elif everyone is not None:
            text = text[everyone.end() :]
        else:
            return text  # an @ of no member: the patterns take "@someone stop" as it is
    return text


def _command(raw: str, roster: _Roster) -> str:
    """`raw` folded, past the @mentions it opens with: where a command would be ("" for a
    text too long to be one)."""
    if len(raw) > MAX_COMMAND_CHARS and (
        len(raw) > MAX_COMMAND_CHARS + MAX_LEADING_MENTION_CHARS
        or not _LEADING_AT.match(fold(raw[:MAX_COMMAND_CHARS]))
    ):
        return ""  # past the limit, only @mentions before a command may make it longer
    command = _after_leading_mentions(fold(raw), roster)
    return command if len(command) <= MAX_COMMAND_CHARS else ""


def words_hash(text: str) -> str:
    """A short hash of a user's words: what a run keeps of them (`RunRecord.turn_hash`)."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def continued_text(snapshot: Snapshot, answered: str) -> str:
    """What the speakers a continue turn takes over answer: the user's words the stopped
    run was answering, the latest message of the history with their hash `answered`
    (outside testing: they answered "继续" itself; review: not a later question, answered
    by a run in between). For a run that kept no hash (an earlier version's), the user's
    latest message that is no stop or continue. The turn's own text when none is found."""
    roster = _Roster(snapshot.members)
    for message in reversed(snapshot.history):
        if message.role is not MessageRole.USER:
            continue
        if answered:
            if words_hash(message.content) == answered:
                return message.content
            continue
        command = _command(message.content.strip(), roster)
        if not (command and (_STOP.match(command) or _CONTINUE.match(command))):
            return message.content
    return snapshot.user_turn.text


def classify(snapshot: Snapshot) -> Directive:
    """Classifies the user's turn. Pure: the same snapshot always gives the same directive."""
    raw = snapshot.user_turn.text.strip()
    text = fold(raw)
    roster = _Roster(snapshot.members)
    command = _command(raw, roster)
    if command:
        if _STOP.match(command):
            return Directive(DirectiveKind.STOP)
        if _CONTINUE.match(command):
            return Directive(DirectiveKind.CONTINUE)
    if snapshot.session.kind is SessionKind.SINGLE:
        return Directive(DirectiveKind.SINGLE, (snapshot.session.primary_member_id,))
    everyone = tuple(m.member_id for m in snapshot.members)
    if command and _COUNT_OFF.match(command):
        return Directive(DirectiveKind.COUNT_OFF, everyone)
    if snapshot.user_turn.mention_all or _addresses_everyone(text, roster):
        return Directive(DirectiveKind.ALL, everyone)
    mentioned = _mentioned(snapshot, text, roster)
    if mentioned:
        return Directive(DirectiveKind.MENTION, mentioned)
    return Directive(DirectiveKind.OPEN)
