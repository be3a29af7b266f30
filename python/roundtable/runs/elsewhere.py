"""A thread's runs that this process does not execute, as the busy-thread policy
(`runs.threads`) sees them: a run on another replica (`RemoteRun`), and a run waiting for
approval that no process holds (`DormantRun`). `runs.threads.LocalRun` is a run here."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from roundtable.runs.approvals import cancel_waiting
from roundtable.runs.follow import PARKED_POLL_MAX_S
from roundtable.store.base import LEASED, RunRecord, RunStatus

if TYPE_CHECKING:
    from roundtable.runs.coordination import SharedCoordination
    from roundtable.runs.parking import Parking


class RemoteRun:
    """A thread's run on another replica, as the busy-thread policy sees it."""

    def __init__(self, coordination: SharedCoordination, record: RunRecord) -> None:
        self._coordination = coordination
        self.record = record
        self.run_id = record.run_id
        self.queued = record.status is RunStatus.QUEUED
        self.blocks = True

    async def stopping(self) -> bool:
        """Whether a cancel was recorded for it when its row was read."""
        return bool(self.record.cancel_mode)

    async def stop(self, reason: str) -> None:
        """Records a graceful cancel, honoured by its replica at its next speaker boundary;
        a run parked for approval there has its waiting calls denied first (`cancelled`),
        and that replica's watch of its parked runs wakes it to end."""
        record = self.record
        if record.status is RunStatus.AWAITING_APPROVAL:
            await cancel_waiting(self._coordination.store, record.tenant, record.run_id)
        await self._coordination.store.request_cancel(
            record.tenant, record.run_id, "graceful", reason
        )

    async def wait(self) -> None:
        """Polls its record until it has ended or its replica died."""
        await self._coordination.wait_ended(self.record)


class DormantRun:
    """A thread's run waiting for approval that no process holds: its server stopped, and
    the snapshot its resume needs is the gateway's, sent again with its StartRun. The
    busy-thread policy treats it as the run of the thread it still is (review: after a
    restart, 停止 on its thread did not stop it, a person then approved its write, and a
    new turn started beside it): a stop turn or an interrupt cancels it, a new turn is
    refused or waits for its end. A new turn minds it only until its first call expires
    (waiting, or decided but not yet run): a run held in a process would go on then by
    itself (review: a run whose StartRun never came again held its thread for good); a stop
    turn cancels it even then, so a StartRun sent later cannot make it answer."""

    queued = False

    def __init__(self, record: RunRecord, parking: Parking, expires_at: float) -> None:
        self.record = record
        self.run_id = record.run_id
        self._parking = parking
        self.expires_at = expires_at
        """When its first call waiting for a person or for its run expires (seconds since
        the epoch)."""

    @property
    def blocks(self) -> bool:
        """Until its first call expires."""
        return time.time() < self.expires_at

    async def stopping(self) -> bool:
        """Never: a stop ends it at once (`stop`)."""
        return False

    async def stop(self, reason: str) -> None:
        """Cancels it here, as CancelRun does: its waiting calls denied (`cancelled`), its
        log closed with run_cancelled."""
        progress = await self._parking.log.progress(self.record)
        await self._parking.cancel_elsewhere(self.record, progress, reason)

    async def wait(self) -> None:
        """Polls its record until it has ended (resumed and ended, or cancelled), or still
        waits, held by nobody, past its first call's expiry. Once resumed (running, or
        parked again here or on a replica) it is waited for to its end (review: the
        queued turn was let go at the expiry while the resumed run still spoke)."""
        store, record = self._parking.log.store, self.record
        pause = DORMANT_POLL_S
        while True:
            current = await store.get_run(record.tenant, record.run_id)
            if current is None or current.status not in LEASED:
                return
            if self._lapsed(current):
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, PARKED_POLL_MAX_S)

    def _lapsed(self, current: RunRecord) -> bool:
        """Whether it still waits past its expiry with nobody holding it."""
        if current.status is not RunStatus.AWAITING_APPROVAL or time.time() < self.expires_at:
            return False
        parking = self._parking
        held_here = parking.registry.get(current.tenant, current.run_id) is not None
        owner = parking.coordination.owner
        return not held_here and not current.leased_by_other(owner, time.time())


DORMANT_POLL_S = 0.05
"""How soon a turn queued behind a dormant run first looks again (then less often)."""
