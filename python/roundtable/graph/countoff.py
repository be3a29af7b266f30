"""Count-off: the task each member gets, and the check its reply must pass.

The number is written into the task by code. Persona and memories may colour the tone,
never the number: a reply must hold its own number and no other, and be short.
"""

from __future__ import annotations

import re

from roundtable.graph.directives import is_cjk

MAX_REPLY_CHARS = 60
_CJK_DIGITS = "零一二三四五六七八九十"
_NUMBER = re.compile(r"[0-9０-９]+")


def count_off_task(number: int, total: int) -> str:
    """The immutable task of the member who says `number`."""
    return (
        f"Count-off (报数): you are number {number} of {total}. Reply with your number, "
        f"{number}, and nothing else. Your persona may colour the tone, but you must not "
        "change the number, skip it, add other numbers, or speak for anyone else."
    )


_CJK_NUMBER = re.compile(f"[{_CJK_DIGITS}]+")
_EN_UNITS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_EN_UNIT_ORDINALS = [
    "zeroth",
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
    "thirteenth",
    "fourteenth",
    "fifteenth",
    "sixteenth",
    "seventeenth",
    "eighteenth",
    "nineteenth",
]
_EN_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_EN_TEN_ORDINALS = [
    "twentieth",
    "thirtieth",
    "fortieth",
    "fiftieth",
    "sixtieth",
    "seventieth",
    "eightieth",
    "ninetieth",
]
_EN_VALUES = {
    **{word: n for n, word in enumerate(_EN_UNITS)},
    **{word: n for n, word in enumerate(_EN_UNIT_ORDINALS)},
    **{word: 20 + 10 * n for n, word in enumerate(_EN_TENS)},
    **{word: 20 + 10 * n for n, word in enumerate(_EN_TEN_ORDINALS)},
}
_EN_WORD = re.compile(r"[a-z]+")
_EN_IDIOMS = re.compile(
    r"\b(?:"
    + "|".join(
        phrase.replace(" ", r"\s+")
        for phrase in (
            "no one",
            "one another",
            "one and all",
            "one of",
            "one by one",
            "every one",
            "each one",
            "at first",
            "first of all",
            "first time",
            "a second",
            "one second",
            "second to none",
            "on second thoughts?",
        )
    )
    + r")\b"
)
"""Phrases where English uses a number word for something else ("no one else", "one and
all", "for the first time", "wait a second"): not numbers, as 一 inside a word (一起) is
none. Elsewhere "one", "first" and "second" count ("One here!", "I'm second!")."""
_ORDINAL_BEFORE = "第"
_COUNTER_AFTER = "号位名"


_PROBLEMS_ZH = {
    "too long": "太长了",
    "holds another number": "含有别的数字",
    "misses its number": "没有说出你的数字",
}
"""The Chinese twin of each problem `check_count_off` names."""


def count_off_again(problem: str, number: int) -> str:
    """What a member is told after a wrong count-off reply, in both languages."""
    return (
        f"That reply {problem}. Reply with exactly your number, {number}, and nothing else. "
        f"/ 这条回复{_PROBLEMS_ZH[problem]}。请只回复你的数字 {number}，不要说别的。"
    )


def _cjk_value(numeral: str) -> int | None:
    """The value of a Chinese numeral up to 99 ("三", "十二", "二十三"); None otherwise."""
    if "十" not in numeral:
        return _CJK_DIGITS.index(numeral) if len(numeral) == 1 else None
    tens, _, ones = numeral.partition("十")
    if len(tens) > 1 or len(ones) > 1 or "十" in ones:
        return None
    return (_CJK_DIGITS.index(tens) if tens else 1) * 10 + (_CJK_DIGITS.index(ones) if ones else 0)


def _cjk_numbers(text: str) -> list[int]:
    """The Chinese numerals of `text` that stand for a number: alone ("二！", "十二"), after
    第 or before 号/位/名 ("第三", "三号"); not those inside words ("一下", "一起")."""
    found = []
    for match in _CJK_NUMBER.finditer(text):
        before = text[match.start() - 1] if match.start() else ""
        after = text[match.end()] if match.end() < len(text) else ""
        standalone = not (before and is_cjk(before)) and not (after and is_cjk(after))
        if standalone or before == _ORDINAL_BEFORE or (after and after in _COUNTER_AFTER):
            value = _cjk_value(match.group())
            # A run of digits that is no numeral ("一二三") counts as its digits.
            found.extend(
                [value] if value is not None else [_CJK_DIGITS.index(c) for c in match.group()]
            )
    return found


def _english_numbers(text: str) -> list[int]:
    """The English number words of `text` up to 99, cardinal or ordinal ("Three!",
    "number twenty-one", "the fourth"), as the twin of `_cjk_numbers`; whole words only
    ("someone" holds no "one"), none inside the phrases of `_EN_IDIOMS`."""
    words = _EN_WORD.findall(_EN_IDIOMS.sub(" ", text.casefold()))
    found: list[int] = []
    index = 0
    while index < len(words):
        value = _EN_VALUES.get(words[index])
        index += 1
        if value is None:
            continue
        if value >= 20 and value % 10 == 0 and index < len(words):
            ones = _EN_VALUES.get(words[index])  # "twenty-one", "thirty second"
            if ones is not None and 0 < ones < 10:
                value += ones
                index += 1
        found.append(value)
    return found


def check_count_off(reply: str, number: int, *, cut: bool = False) -> str:
    """Returns why a count-off reply is wrong, or "" when it is right. `cut`: the reply
    ran into its token budget, so it is no short reply whatever its length; nor is one
    that echoes a prompt's "## " section (outside testing, a real model: "3。\n\n## Your
    task\n..." was accepted)."""
    text = reply.strip()
    if cut or len(text) > MAX_REPLY_CHARS or "## " in text:
        return "too long"
    found = [
        int(n.translate(str.maketrans("０１２３４５６７８９", "0123456789")))
        for n in _NUMBER.findall(text)
    ]
    found += _cjk_numbers(text)
    found += _english_numbers(text)
    if any(n != number for n in found):
        return "holds another number"
    if number not in found:
        return "misses its number"
    return ""
