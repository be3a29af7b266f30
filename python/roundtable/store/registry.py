"""The run registry and event log as every SQL store runs them, written once.

A store names its statements (`Statements.for_dialect`) and how it runs one: `_write`
(the row count) and `_read` (the rows, as tuples in the SELECT's order). What differs from
one database to the other stays in the store: opening it, appending an event (Postgres
fences out a replica that lost the run and reads the run's cancel in the same round
trip), the thread lock, marking a dead owner's runs at start-up, and closing.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from roundtable.store.base import RunRecord, RunStatus, StoredEvent
from roundtable.store.statements import (
    Statements,
    acquire_params,
    finish_params,
    run_from_row,
    run_params,
)


class SqlRegistry(ABC):
    """The `RunStore` methods that are one statement each, the same on every database."""

    sql: ClassVar[Statements]
    """The statements in the store's dialect."""

    @abstractmethod
    async def _write(self, sql: str, params: Mapping[str, Any]) -> int:
        """Runs a statement that writes; returns how many rows it changed."""

    @abstractmethod
    async def _read(self, sql: str, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
        """Runs a query; returns its rows as tuples, in the order of its SELECT list."""

    async def create_run(self, record: RunRecord) -> bool:
        return await self._write(self.sql.create_run, run_params(record)) == 1

    async def get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        rows = await self._read(self.sql.get_run, {"tenant": tenant, "run_id": run_id})
        return run_from_row(rows[0]) if rows else None

    async def update_run(self, record: RunRecord) -> None:
        record.updated_at = time.time()
        await self._write(self.sql.update_run, run_params(record))

    async def read_events(self, tenant: str, run_id: str, after_seq: int) -> list[StoredEvent]:
        params = {"tenant": tenant, "run_id": run_id, "after_seq": after_seq}
        rows = await self._read(self.sql.read_events, params)
        return [StoredEvent(seq, kind, bytes(body)) for seq, kind, body in rows]

    async def resumable_runs(
        self, tenant: str, thread_id: str, *, exclude_run_id: str = "", limit: int = 1
    ) -> list[RunRecord]:
        params = {
            "tenant": tenant,
            "thread_id": thread_id,
            "exclude_run_id": exclude_run_id,
            "limit": limit,
        }
        return [run_from_row(row) for row in await self._read(self.sql.resumable_runs, params)]

    async def live_thread_runs(
        self, tenant: str, thread_id: str, *, exclude_run_id: str, owner: str, now: float
    ) -> list[RunRecord]:
        params = {
            "tenant": tenant,
            "thread_id": thread_id,
            "exclude_run_id": exclude_run_id,
            "owner": owner,
            "now": now,
        }
        return [run_from_row(row) for row in await self._read(self.sql.live_thread_runs, params)]

    async def claim_continuation(self, tenant: str, run_id: str, by_run_id: str) -> bool:
        params = {"tenant": tenant, "run_id": run_id, "by_run_id": by_run_id, "now": time.time()}
        return await self._write(self.sql.claim_continuation, params) == 1

    async def continued_run(self, tenant: str, by_run_id: str) -> RunRecord | None:
        rows = await self._read(self.sql.continued_run, {"tenant": tenant, "by_run_id": by_run_id})
        return run_from_row(rows[0]) if rows else None

    async def acquire_lease(self, tenant: str, run_id: str, owner: str, ttl_s: float) -> bool:
        params = acquire_params(tenant, run_id, owner, ttl_s, time.time())
        return await self._write(self.sql.acquire_lease, params) == 1

    async def resume_parked(self, record: RunRecord, owner: str, ttl_s: float) -> bool:
        params = {
            **acquire_params(record.tenant, record.run_id, owner, ttl_s, time.time()),
            "last_seq": record.last_seq,
        }
        if await self._write(self.sql.resume_parked, params) != 1:
            return False
        record.status, record.owner = RunStatus.RUNNING, owner
        record.lease_until, record.updated_at = params["lease_until"], params["now"]
        return True

    async def renew_lease(self, tenant: str, run_id: str, owner: str, ttl_s: float) -> bool:
        params = {
            "tenant": tenant,
            "run_id": run_id,
            "owner": owner,
            "lease_until": time.time() + ttl_s,
        }
        return await self._write(self.sql.renew_lease, params) == 1

    async def finish_run(self, record: RunRecord, owner: str) -> bool:
        record.updated_at = time.time()
        return await self._write(self.sql.finish_run, finish_params(record, owner)) == 1

    async def request_cancel(self, tenant: str, run_id: str, mode: str, reason: str) -> bool:
        params = {"tenant": tenant, "run_id": run_id, "cancel_mode": mode, "cancel_reason": reason}
        return await self._write(self.sql.request_cancel, params) == 1

    async def park_run(
        self, record: RunRecord, holder: str, owner: str, lease_until: float
    ) -> bool:
        record.updated_at = time.time()
        params = {
            "tenant": record.tenant,
            "run_id": record.run_id,
            "last_seq": record.last_seq,
            "updated_at": record.updated_at,
            "owner": owner,
            "lease_until": lease_until,
            "holder": holder,
        }
        return await self._write(self.sql.park_run, params) == 1

    async def renew_parked(self, owner: str, ttl_s: float) -> set[tuple[str, str]]:
        params = {"owner": owner, "lease_until": time.time() + ttl_s}
        return {
            (tenant, run_id) for tenant, run_id in await self._read(self.sql.renew_parked, params)
        }

    async def decided_parked(self, owner: str) -> list[tuple[str, str, bool]]:
        rows = await self._read(self.sql.decided_parked, {"owner": owner})
        return [(tenant, run_id, bool(cancelled)) for tenant, run_id, cancelled in rows]
