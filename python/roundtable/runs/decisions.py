"""A StartRun's decision: what to do with the run it names, before anything is done."""

from __future__ import annotations

import enum

from roundtable.runs.live import LiveRun
from roundtable.store.base import LEASED, RESUMABLE, RunRecord


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
    if record.status in LEASED:
        # Leased elsewhere: follow (a run waiting for approval resumes where it is kept).
        # Otherwise the process that held it is gone: it goes on here (a waiting run parks
        # again at once if its call is still undecided).
        return StartAction.FOLLOW if record.leased_by_other(owner, now) else StartAction.LAUNCH
    if record.status in RESUMABLE:
        return StartAction.LAUNCH
    if failed_retryably:
        return StartAction.LAUNCH
    return StartAction.REPLAY
