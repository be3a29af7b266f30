"""Count-off: the task each member gets, and the check its reply must pass.

The number is written into the task by code. Persona and memories may colour the tone,
never the number: a reply must hold its own number and no other, and be short.
"""

from __future__ import annotations

import re

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


def _cjk(number: int) -> str:
    if number <= 10:
        return _CJK_DIGITS[number]
    tens, ones = divmod(number, 10)
    return (_CJK_DIGITS[tens] if tens > 1 else "") + "十" + (_CJK_DIGITS[ones] if ones else "")


def check_count_off(reply: str, number: int) -> str:
    """Returns why a count-off reply is wrong, or "" when it is right."""
    text = reply.strip()
    if len(text) > MAX_REPLY_CHARS:
        return "too long"
    found = [
        int(n.translate(str.maketrans("０１２３４５６７８９", "0123456789")))
        for n in _NUMBER.findall(text)
    ]
    if any(n != number for n in found):
        return "holds another number"
    if number not in found and _cjk(number) not in text:
        return "misses its number"
    return ""
