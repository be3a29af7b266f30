"""Decisions on permission requests: recorded first, acted on after.

A decision is a compare-and-set on the call's row (`ToolCallStore.decide_tool_call`): the
first one recorded wins, on any replica, and the same decision again answers the same. It
is durable before ResolvePermission answers. Then, where this process holds the run
parked (with its snapshot and credentials in memory), the run goes on here at once (or as
soon as this process has room for another executing run); where
another replica keeps it parked, that replica's watch finds the decision and it goes on
there; a run no process holds goes on at its next StartRun, which finds the decision in
the store.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from roundtable.domain.errors import PermissionDecided, PermissionNotFound, RunNotFound
from roundtable.domain.events import Envelope, PermissionRequired
from roundtable.domain.tools import ToolCallRecord, Verdict
from roundtable.runs.live import LiveRun
from roundtable.runs.log import EventLog
from roundtable.runs.progress import Progress
from roundtable.runs.registry import LiveRegistry
from roundtable.store.base import ACTIVE, RunRecord, RunStatus, RunStore

log = logging.getLogger(__name__)

Unpark = Callable[[LiveRun], Awaitable[None]]
"""Resumes a run this process holds parked (now, or once it has room for it)."""


@dataclass(frozen=True, slots=True)
class Resolution:
    """What ResolvePermission answers: the call's recorded decision and the run now."""

    call: ToolCallRecord
    record: RunRecord
    progress: Progress
    resumed: bool
    """Whether the run goes on without another StartRun: here (at once, or as soon as this
    process has room for it), or on the replica that keeps it parked (else: at its next
    StartRun, where no replica holds it)."""


class Approvals:
    """Records decisions on permission requests and lists the waiting ones."""

    def __init__(
        self, *, log: EventLog, registry: LiveRegistry, unpark: Unpark, owner: str
    ) -> None:
        self.log = log
        self.registry = registry
        self.unpark = unpark
        self.owner = owner
        """This process's id: a run another replica keeps parked goes on there."""

    async def resolve(
        self,
        tenant: str,
        run_id: str,
        call_key: str,
        verdict: Verdict,
        *,
        reason: str = "",
        edited_arguments_json: str = "",
    ) -> Resolution:
        """Records a person's decision (or finds the same one recorded: the same verdict,
        edited arguments and reason) and resumes the run when this process holds it parked.

        Raises:
            RunNotFound: no such run for this tenant.
            PermissionNotFound: the run has no such permission request.
            PermissionDecided: another decision is recorded (its name in the message).
        """
        store = self.log.store
        live = self.registry.get(tenant, run_id)
        record = live.record if live is not None else await store.get_run(tenant, run_id)
        if record is None:
            raise RunNotFound(run_id)
        call = await store.tool_call(tenant, run_id, call_key)
        if call is None or not call.needs_approval:
            raise PermissionNotFound(call_key[:256])
        if call.verdict is Verdict.PENDING:
            if record.status in _DENIES_ITS_CALLS:
                # The cancel's denial of its waiting calls did not reach the store (an
                # error): a person's decision now must not run the tool on resume.
                await cancel_calls(store, tenant, run_id, (call_key,))
            else:
                late = time.time() >= call.expires_at
                await store.decide_tool_call(
                    tenant,
                    run_id,
                    call_key,
                    Verdict.EXPIRED if late else verdict,
                    reason="expired" if late else reason,
                    edited_arguments_json="" if late else edited_arguments_json,
                )
            call = await store.tool_call(tenant, run_id, call_key) or call
        if (call.verdict, call.reason) != (verdict, reason) or not _same_json(
            call.edited_arguments_json, edited_arguments_json
        ):
            # Expired or cancelled meanwhile, or another person decided first (perhaps the
            # same way with other arguments or another reason: the recorded one stands).
            await self._go_on(live, record)
            other = "" if call.verdict is not verdict else " with other arguments or reason"
            raise PermissionDecided(f"{call_key[:256]} is recorded as {call.verdict.value}{other}")
        resumed = await self._go_on(live, record)
        if live is not None:
            record, progress = live.record, live.progress
        else:
            record = await store.get_run(tenant, run_id) or record
            progress = await self.log.progress(record)
        return Resolution(call=call, record=record, progress=progress, resumed=resumed)

    async def _go_on(self, live: LiveRun | None, record: RunRecord) -> bool:
        """Resumes the run when this process holds it parked; True too when another replica
        keeps it (its watch of parked runs finds the decision) or it runs already."""
        if live is not None:
            if self.registry.parked(*live.key) is not None:
                try:
                    await self.unpark(live)
                except Exception as exc:
                    # The decision is recorded; a store error as the run went back to
                    # running left it parked to try again by itself in a second (or let it
                    # go, if the process is stopping: the same StartRun resumes it).
                    log.warning("run %s could not resume yet: %s", live.record.run_id, exc)
                    return self.registry.get(*live.key) is live
            # else executing here: it parks, finds the decision and goes on
            return True
        if record.status is RunStatus.AWAITING_APPROVAL:
            return record.leased_by_other(self.owner, time.time())
        return record.status in ACTIVE

    async def pending(self, record: RunRecord, progress: Progress) -> list[PermissionRequired]:
        """The run's permission requests still waiting for a decision, as announced: not
        one whose time ran out (a decision on it now records it expired), though the run
        may not have gone on yet, nor any of a cancelled run (its cancel denies them) or
        of one a continue turn took over (it asks again, under its own run)."""
        if not progress.permissions or record.status in _DENIES_ITS_CALLS:
            return []
        now = time.time()
        calls = await self.log.store.tool_calls(record.tenant, record.run_id)
        waiting = {c.call_key for c in calls if c.waiting and now < c.expires_at}
        return [p for key, p in progress.permissions.items() if key in waiting]


_DENIES_ITS_CALLS = frozenset({RunStatus.CANCELLED, RunStatus.CONTINUED})
"""Runs whose calls still waiting are denied whenever they are looked at: a cancelled run's
(its cancel denies them; review: a store error left them waiting) and a continued one's."""


async def decided_meanwhile(store: RunStore, live: LiveRun, call_keys: tuple[str, ...]) -> bool:
    """Whether any of the calls the run parked on has a decision recorded already; a stop
    asked for meanwhile is recorded as one (`cancelled`) for each (a shutdown's is not:
    the calls wait for the person still). True when the store cannot say: a run woken for
    nothing parks again at once, emitting nothing, but one left parked would miss its
    decision until its expiry (review)."""
    try:
        return await _decided_meanwhile(store, live, call_keys)
    except Exception as exc:
        log.warning("run %s: decisions unread (%s); waking it", live.key[1], type(exc).__name__)
        return True


async def _decided_meanwhile(store: RunStore, live: LiveRun, call_keys: tuple[str, ...]) -> bool:
    tenant, run_id = live.key
    if live.stop.denies:
        await cancel_calls(store, tenant, run_id, call_keys)
        return True
    for key in call_keys:
        call = await store.tool_call(tenant, run_id, key)
        if call is not None and call.verdict is not Verdict.PENDING:
            return True
    return False


async def deny_waiting(store: RunStore, live: LiveRun) -> None:
    """Records the calls of a run that ends cancelled, still waiting for a person, as
    denied (`cancelled`), as every cancel does. An immediate cancel ends speakers before
    their tool loop can (outside testing: a parallel speaker's request stayed open, a
    resume waited on it, and a later approval ran the tool). A store error is logged: the
    run still ends, and its calls are denied when a decision comes (`Approvals.resolve`)
    or the run resumes (`RunManager._reopen`), whichever is first."""
    if not live.progress.permissions:
        return
    try:
        await cancel_waiting(store, *live.key)
    except Exception as exc:
        log.warning("run %s: waiting calls not denied (%s)", live.key[1], type(exc).__name__)


async def deny_left_waiting(store: RunStore, record: RunRecord, prior: list[Envelope]) -> None:
    """Before a cancelled run resumes: its cancel denied the calls still waiting, unless the
    store failed then (`deny_waiting`); the resumed speakers hear they were denied either
    way, never a person's later approval."""
    if record.status is RunStatus.CANCELLED and any(
        isinstance(e.event, PermissionRequired) for e in prior
    ):
        await cancel_waiting(store, record.tenant, record.run_id)


async def cancel_waiting(store: RunStore, tenant: str, run_id: str) -> None:
    """Records every waiting call of a run being stopped as denied (`cancelled`)."""
    calls = await store.tool_calls(tenant, run_id)
    await cancel_calls(store, tenant, run_id, (c.call_key for c in calls if c.waiting))


async def cancel_calls(store: RunStore, tenant: str, run_id: str, call_keys: Iterable[str]) -> None:
    """Records waiting calls of a run being stopped as denied, `cancelled` (a call decided
    already keeps its decision: the compare-and-set)."""
    for key in call_keys:
        await store.decide_tool_call(tenant, run_id, key, Verdict.CANCELLED, reason="cancelled")


def _same_json(recorded: str, sent: str) -> bool:
    """Whether two edited arguments say the same (the API let only valid JSON through): a
    gateway that sends its decision again may well serialize it again, spaces and key
    order changed."""
    if recorded == sent:
        return True
    try:  # "" (no edit) is no JSON: it equals only itself
        return _canonical(recorded) == _canonical(sent)
    except ValueError:
        return False


def _canonical(text: str) -> str:
    """A JSON text re-encoded one way: keys sorted, no spaces. Not `==` of the parsed values,
    for which true is 1 and 1 is 1.0: other arguments for a tool."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
