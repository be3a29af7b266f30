"""Calls that must finish quickly whatever their input, run where a regression fails the
test instead of hanging the suite: a regular expression's match holds the GIL, so a
thread with a timeout cannot bound it; a child process killed after its time can."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

_CALL = (
    "import importlib, json, sys; module, name = sys.argv[1].split(':'); "
    "print(json.dumps(getattr(importlib.import_module(module), name)(*json.loads(sys.argv[2]))))"
)


def call_bounded(target: str, *args: Any, timeout_s: float = 10.0) -> Any:
    """`module:function(*args)` (JSON in and out) in a fresh interpreter with this one's
    path; the test fails if it takes longer than `timeout_s`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CALL, target, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{target} took longer than {timeout_s} s")
    return json.loads(done.stdout)


def directive_kind(text: str) -> str:
    """The directive a group turn of `text` is (a roster of two)."""
    from roundtable.domain.snapshot import Member, Session, SessionKind, Snapshot, UserTurn
    from roundtable.graph.directives import classify

    snapshot = Snapshot(
        session=Session(kind=SessionKind.GROUP, primary_member_id="a"),
        members=(
            Member(member_id="a", display_name="Alice"),
            Member(member_id="b", display_name="Bob"),
        ),
        history=(),
        user_turn=UserTurn(text=text),
    )
    return classify(snapshot).kind.name


def structured_answer(reply: str) -> str:
    """ "parsed" or "invalid": a model's structured reply, read for an object `{"a": int}`."""
    from pydantic import BaseModel
    from roundtable.domain.errors import InvalidModelOutput
    from roundtable.models.structured import StructuredForm, parse_answer

    class Answer(BaseModel):
        a: int

    try:
        parse_answer(reply, Answer, StructuredForm.JSON_SCHEMA)
    except InvalidModelOutput:
        return "invalid"
    return "parsed"
