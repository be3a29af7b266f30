"""Tool arguments are read as JSON as RFC 8259 has it, which is less than Python's json
reads: every value a gateway gets back in an event must print as JSON again."""

from __future__ import annotations

import pytest
from google.protobuf import json_format
from roundtable.codec.tool_events import arguments_struct
from roundtable.domain.tools import json_value


@pytest.mark.parametrize(
    "text",
    ['{"n": NaN}', '{"n": Infinity}', '{"n": -Infinity}', '{"n": 1e999}', '{"n": -1e400}'],
)
def test_what_python_reads_and_json_has_not_is_refused(text: str) -> None:
    # Outside testing (NaN), then the review (1e999, read as infinity by Python).
    with pytest.raises(ValueError):
        json_value(text)
    assert arguments_struct(text) is None


def test_an_integer_no_struct_can_hold_leaves_the_struct_out() -> None:
    # Review: a 401-digit integer raised OverflowError out of the event's encoding.
    assert arguments_struct('{"n": ' + "9" * 401 + "}") is None


def test_ordinary_arguments_print_as_json_again() -> None:
    struct = arguments_struct('{"city": "Paris", "n": 1.5e10, "k": [1, 2]}')
    assert struct is not None
    assert json_format.MessageToDict(struct) == {"city": "Paris", "n": 1.5e10, "k": [1, 2]}
