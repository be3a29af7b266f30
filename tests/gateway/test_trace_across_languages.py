"""One trace across two languages: the Go gateway's span and Roundtable's spans, received by
one OTLP collector (the in-process receiver) from both processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.gateway import (
    RPC,
    Turn,
    assert_one_trace,
    assert_summary_names_trace,
    otel_env,
    turn_through_a_sidecar,
)
from support.otlp import OtlpReceiver

pytestmark = [pytest.mark.go, pytest.mark.e2e]


async def test_gateway_span_and_roundtable_spans_share_one_trace(
    gateway_binary: Path, tmp_path: Path
) -> None:
    turn = Turn()
    with OtlpReceiver() as receiver:
        summary = await turn_through_a_sidecar(
            gateway_binary, tmp_path, otel_env(receiver.endpoint), turn
        )
        for _ in range(50):
            if any(s.name == RPC and s.service == "roundtable" for s in receiver.spans):
                break
            await asyncio.sleep(0.1)

    assert_one_trace(receiver.spans, summary, turn)


def test_a_summary_without_its_trace_id_fails() -> None:
    # The check this file once made, summary.get("trace_id", turn.trace_id) == turn.trace_id,
    # passed when the gateway printed no trace id at all.
    with pytest.raises(AssertionError, match="SUMMARY trace_id None"):
        assert_summary_names_trace({"run_id": "r"}, "4bf92f3577b34da6a3ce929d0e0e4736")
    assert_summary_names_trace(
        {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}, "4bf92f3577b34da6a3ce929d0e0e4736"
    )
