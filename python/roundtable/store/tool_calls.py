"""The tool-call table's statements and methods, written once for every SQL store.

A tool call is a durable step inside a reply (docs/architecture.md, "Tools"): its row is
written before the call is sent and its result before the model sees it, so a speaker
that runs again replays the row instead of calling the tool again. A decision on a call
that needs approval is a compare-and-set on the row: the first decision recorded wins,
on any replica.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from roundtable.domain.tools import CallStatus, ToolCallRecord, Verdict
from roundtable.store.schema import TOOL_CALLS, Dialect

COLUMNS = TOOL_CALLS.column_names
_LIST = ", ".join(COLUMNS)
_KEY = "tenant=:tenant AND run_id=:run_id AND call_key=:call_key"


@dataclass(frozen=True, slots=True)
class ToolStatements:
    """The tool-call table's statements, in one parameter style."""

    insert: str
    calls_of_run: str
    get: str
    decide: str
    start: str
    finish: str

    @classmethod
    def for_dialect(cls, dialect: Dialect) -> ToolStatements:
        """Every statement with the dialect's parameters."""
        return cls(**{f.name: dialect.bind(getattr(_TEMPLATES, f.name)) for f in fields(cls)})


_TEMPLATES = ToolStatements(
    insert=(
        f"INSERT INTO rt_tool_calls ({_LIST}) VALUES ({', '.join(f':{c}' for c in COLUMNS)}) "
        # A speaker that runs again asks for the same calls: the first record stands.
        "ON CONFLICT (tenant, run_id, call_key) DO NOTHING"
    ),
    calls_of_run=(
        f"SELECT {_LIST} FROM rt_tool_calls WHERE tenant=:tenant AND run_id=:run_id "
        "ORDER BY reply_id, n"
    ),
    get=f"SELECT {_LIST} FROM rt_tool_calls WHERE {_KEY}",
    decide=(
        "UPDATE rt_tool_calls SET verdict=:verdict, reason=:reason, "
        "edited_arguments_json=:edited_arguments_json, decided_at=:now, updated_at=:now "
        f"WHERE {_KEY} AND needs_approval=1 AND verdict=''"
    ),
    start=(
        "UPDATE rt_tool_calls SET status='started', sent_key=:sent_key, attempts=attempts+1, "
        "updated_at=:now "
        f"WHERE {_KEY} AND status<>'finished'"
    ),
    finish=(
        "UPDATE rt_tool_calls SET status='finished', result_text=:result_text, "
        f"outcome=:outcome, updated_at=:now WHERE {_KEY} AND status<>'finished'"
    ),
)


def _params(record: ToolCallRecord) -> dict[str, Any]:
    params = {name: getattr(record, name) for name in COLUMNS}
    params["needs_approval"] = int(record.needs_approval)
    params["turn_counted"] = int(record.turn_counted)
    params["status"] = record.status.value
    params["verdict"] = record.verdict.value
    return params


def _record(row: Sequence[Any]) -> ToolCallRecord:
    values = dict(zip(COLUMNS, row, strict=True))
    values["needs_approval"] = bool(values["needs_approval"])
    values["turn_counted"] = bool(values["turn_counted"])
    values["status"] = CallStatus(values["status"])
    values["verdict"] = Verdict(values["verdict"])
    return ToolCallRecord(**values)


class SqlToolCalls:
    """The `ToolCallStore` methods, one statement each (a store mixes this in)."""

    tool_sql: ClassVar[ToolStatements]

    @abstractmethod
    async def _write(self, sql: str, params: Mapping[str, Any]) -> int: ...

    @abstractmethod
    async def _read(self, sql: str, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]: ...

    async def record_tool_calls(self, records: Sequence[ToolCallRecord]) -> None:
        now = time.time()
        for record in records:
            record.created_at = record.updated_at = now
            await self._write(self.tool_sql.insert, _params(record))

    async def tool_calls(self, tenant: str, run_id: str) -> list[ToolCallRecord]:
        rows = await self._read(self.tool_sql.calls_of_run, {"tenant": tenant, "run_id": run_id})
        return [_record(row) for row in rows]

    async def tool_call(self, tenant: str, run_id: str, call_key: str) -> ToolCallRecord | None:
        params = {"tenant": tenant, "run_id": run_id, "call_key": call_key}
        rows = await self._read(self.tool_sql.get, params)
        return _record(rows[0]) if rows else None

    async def decide_tool_call(
        self,
        tenant: str,
        run_id: str,
        call_key: str,
        verdict: Verdict,
        *,
        reason: str = "",
        edited_arguments_json: str = "",
    ) -> bool:
        params = {
            "tenant": tenant,
            "run_id": run_id,
            "call_key": call_key,
            "verdict": verdict.value,
            "reason": reason,
            "edited_arguments_json": edited_arguments_json,
            "now": time.time(),
        }
        return await self._write(self.tool_sql.decide, params) == 1

    async def start_tool_call(
        self, tenant: str, run_id: str, call_key: str, *, sent_key: str
    ) -> None:
        params = {
            "tenant": tenant,
            "run_id": run_id,
            "call_key": call_key,
            "sent_key": sent_key,
            "now": time.time(),
        }
        await self._write(self.tool_sql.start, params)

    async def finish_tool_call(
        self, tenant: str, run_id: str, call_key: str, *, result_text: str, outcome: str
    ) -> None:
        params = {
            "tenant": tenant,
            "run_id": run_id,
            "call_key": call_key,
            "result_text": result_text,
            "outcome": outcome,
            "now": time.time(),
        }
        await self._write(self.tool_sql.finish, params)
