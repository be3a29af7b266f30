"""A structured answer as models write it: bare JSON, or inside a ```json fence; whatever
else a model (or a hostile endpoint) sends is INVALID_OUTPUT, found at once."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from roundtable.domain.errors import InvalidModelOutput
from roundtable.models.structured import SchemaRefusals, StructuredForm, parse_answer
from support.bounded import call_bounded


class Answer(BaseModel):
    a: int


FORM = StructuredForm.JSON_SCHEMA


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        ' \n{"a": 1}\n',
        '```json\n{"a": 1}\n```',
        '  ```JSON {"a": 1} ```  ',
        '```{"a": 1}```',
    ],
)
def test_bare_or_fenced_json_is_parsed(text: str) -> None:
    assert parse_answer(text, Answer, FORM) == Answer(a=1)


@pytest.mark.parametrize("text", ["", "```", "``````", "```json\n{}```", '{"a": 1} and more'])
def test_anything_else_is_invalid_output(text: str) -> None:
    with pytest.raises(InvalidModelOutput):
        parse_answer(text, Answer, FORM)


@pytest.mark.parametrize("reply", ["```" + " " * 65_536, "```json\n{}" + " " * 65_536 + "x"])
def test_a_reply_of_blanks_without_its_closing_fence_is_refused_without_backtracking(
    reply: str,
) -> None:
    """Blanks, a lazy body and blanks side by side once made such a reply take time cubic in
    its length (2.4 s at 2,000 blanks, hours at a reply's 64 K cap). In a child process
    with a 10 s bound, so a regression fails instead of hanging the suite."""
    assert call_bounded("support.bounded:structured_answer", reply) == "invalid"


def test_a_refusal_is_believed_for_a_while_then_the_target_is_asked_again() -> None:
    # Outside review: a one-off 503 on a schema request, then JSON mode answering, left the
    # target on JSON mode for the life of the process.
    now = [0.0]
    refusals = SchemaRefusals(ttl_s=600.0, clock=lambda: now[0])
    refusals.remember("http://m:8000/v1", "m", "HTTP 503 Service Unavailable")
    now[0] = 599.0
    assert refusals.reason("http://m:8000/v1", "m") == "HTTP 503 Service Unavailable"
    assert refusals.reason("http://m:8000/v1", "other") == ""
    now[0] = 600.0
    assert refusals.reason("http://m:8000/v1", "m") == ""
