"""Words of language rules kept in twin rows, so that each language accepts what the other
does (directives, fillers, the offline model's memory cues)."""

from __future__ import annotations

import re
from collections.abc import Callable

Twins = tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]
"""(English, Chinese) rows, one per meaning: what one language accepts, the other does too."""

EVERYONE: Twins = ((("all",), ("全体成员",)), (("everyone", "everybody"), ("所有人", "大家")))
"""What follows an @ to address every member (`@all`, `@全体成员`)."""


_TRADITIONAL = str.maketrans(
    "個麼們體別勞後員對報數來歡沒煩現著繼續記說請問題馬駕嗎",
    "个么们体别劳后员对报数来欢没烦现着继续记说请问题马驾吗",
)
"""Every traditional character of the rules' Chinese words (the directives', their fillers',
@全體成員, the offline model's 記住, 我喜歡 and 嗎), as its simplified twin: the rules are written
once, in simplified characters, and read text in either script (outside testing: 大家報數
was an open discussion). `test_every_rule_word_reads_in_traditional_characters` keeps it
complete."""


def simplified(text: str) -> str:
    """`text` with the traditional characters of the rules' words in simplified form."""
    return text.translate(_TRADITIONAL)


def alternation(rows: Twins, english: Callable[[str], str]) -> str:
    """Every word of `rows` as one regex alternation, the longest first ("stop it" is tried
    before "stop", "停止" before "停"): English words as `english` renders them (as words,
    as patterns), Chinese ones escaped, as written (they need no spaces around them)."""
    words = {(word, side) for row in rows for side, twin in enumerate(row) for word in twin}
    ordered = sorted(words, key=lambda pair: (-len(pair[0]), pair))
    return "|".join(english(w) if side == 0 else re.escape(w) for w, side in ordered)
