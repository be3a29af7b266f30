"""A StartRun's decision: what to do with the run it names, before anything is done."""

from __future__ import annotations

import enum

from roundtable.runs.live import LiveRun
from roundtable.store.base import ACTIVE, RESUMABLE, RunRecord, RunStatus


class StartAction(enum.Enum):
    """What a StartRun does with its run."""

    ATTACH = "attach"
    """This process executes it: stream it from seq 1."""
    REPLAY = "replay"
    """It ended for good: replay its log."""
    FOLLOW = "follow"
    """Another replica executes it: follow its log (and take it over should it die)."""
    LAUNCH = "launch"
    """Start it, or resume it (interrupted, cancelled, failed retryably, or its lease ran out)."""


def decide_start(
    live: LiveRun | None,
    record: RunRecord | None,
    *,
    owner: str,
    now: float,
    failed_retryably: bool,
) -> StartAction:
    """The action for a StartRun, from what this process and the registry know of the run."""
    if live is not None:
        return StartAction.ATTACH
    if record is None:
        return StartAction.LAUNCH
    if record.status in ACTIVE:
        # Leased elsewhere: follow. Otherwise the process that ran it is gone: resume.
        return StartAction.FOLLOW if record.leased_by_other(owner, now) else StartAction.LAUNCH
    if record.status is RunStatus.AWAITING_APPROVAL:
        # Waiting for approval: another replica keeps it parked (follow; it resumes there),
        # or nobody does (its server stopped): it goes on here, and parks again at once if
        # its call is still undecided.
        return StartAction.FOLLOW if record.leased_by_other(owner, now) else StartAction.LAUNCH
    if record.status in RESUMABLE:
        return StartAction.LAUNCH
    if failed_retryably:
        return StartAction.LAUNCH
    return StartAction.REPLAY
