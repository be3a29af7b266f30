"""Span attribute names: one documented namespace for the correlation fields.

Every span Roundtable makes carries `roundtable.thread_id`, `roundtable.run_id`,
`roundtable.request_id`, `roundtable.tenant` and `roundtable.caller_node` (the graph node
on whose behalf it runs), plus `gen_ai.conversation.id` = thread id. Never prompt or
reply text.
"""

from __future__ import annotations

from roundtable.domain.snapshot import RunContext

THREAD_ID = "roundtable.thread_id"
RUN_ID = "roundtable.run_id"
REQUEST_ID = "roundtable.request_id"
TENANT = "roundtable.tenant"
CALLER_NODE = "roundtable.caller_node"
CONVERSATION_ID = "gen_ai.conversation.id"


def correlation(
    *, thread_id: str, run_id: str, request_id: str, tenant: str, caller_node: str
) -> dict[str, str]:
    """The correlation attributes of a span."""
    return {
        THREAD_ID: thread_id,
        RUN_ID: run_id,
        REQUEST_ID: request_id,
        TENANT: tenant,
        CALLER_NODE: caller_node,
        CONVERSATION_ID: thread_id,
    }


def run_correlation(run: RunContext, caller_node: str) -> dict[str, str]:
    """The correlation attributes of a span made for a run."""
    return correlation(
        thread_id=run.thread_id,
        run_id=run.run_id,
        request_id=run.request_id,
        tenant=run.tenant,
        caller_node=caller_node,
    )


def rpc_correlation(
    *, tenant: str, run_id: str, caller_node: str, thread_id: str = ""
) -> dict[str, str]:
    """What an RPC that names a run by id knows of its correlation (no request id; the
    thread once the run is read)."""
    attributes = {RUN_ID: run_id, TENANT: tenant, CALLER_NODE: caller_node}
    if thread_id:
        attributes |= {THREAD_ID: thread_id, CONVERSATION_ID: thread_id}
    return attributes
