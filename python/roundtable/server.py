"""The composition root: the one place that builds and wires everything.

`serve(settings)` opens the store, builds the providers, the harness, the graph and the
run manager, starts a grpc.aio server with the orchestrator, health and reflection
services, and stops it gracefully on SIGTERM/SIGINT. Nothing is configured at import
time; nothing is found through a global.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_server_interceptor

from roundtable.api.auth import Authenticator
from roundtable.api.edge import CallLimiter, EdgeInterceptor
from roundtable.api.servicer import OrchestratorServicer, add_to_server
from roundtable.api.tls import check_listen_address, server_credentials
from roundtable.domain.errors import InvalidSettings
from roundtable.domain.snapshot import BaseUrlRule
from roundtable.graph.builder import build_conversation_graph
from roundtable.graph.context import ToolCaller, ToolRuntime
from roundtable.harness.chain import Harness
from roundtable.harness.tool_chain import ToolHarness
from roundtable.models.base import ChatProvider
from roundtable.models.offline import OfflineProvider
from roundtable.models.openai_compat import build_openai_provider
from roundtable.runs.coordination import Coordination, LocalCoordination, SharedCoordination
from roundtable.runs.execution import Executor
from roundtable.runs.follow import Follower
from roundtable.runs.identity import default_owner
from roundtable.runs.log import EventLog
from roundtable.runs.manager import RunManager
from roundtable.runs.registry import LiveRegistry
from roundtable.settings import Settings
from roundtable.store.base import RunStore
from roundtable.store.checkpoints import BoundarySaver
from roundtable.store.factory import open_store
from roundtable.telemetry.metrics import Metrics
from roundtable.telemetry.setup import Telemetry, telemetry_from_env
from roundtable.tools.mcp_pool import McpPool
from roundtable.v1 import orchestrator_service_pb2 as pb

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["OrchestratorService"].full_name
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def build_providers(settings: Settings) -> dict[str, ChatProvider]:
    """The model providers every server has."""
    return {
        "offline": OfflineProvider(default_token_delay_s=settings.offline_token_delay_ms / 1000),
        "openai": build_openai_provider(
            default_timeout_s=settings.harness.timeout.default_s,
            max_attempt_timeout_s=settings.request_limits.max_model_timeout_ms / 1000,
        ),
    }


def base_url_rules(providers: Mapping[str, object]) -> dict[str, BaseUrlRule]:
    """Each provider's rule for the base URLs it can use (its `base_url_problem`), for the
    edge to apply; a provider without one (a test's scripted model) takes any."""
    rules: dict[str, BaseUrlRule] = {}
    for name, provider in providers.items():
        rule = getattr(provider, "base_url_problem", None)
        if rule is not None:
            rules[name] = rule
    return rules


def _bind(
    server: grpc.aio.Server, settings: Settings, credentials: grpc.ServerCredentials | None
) -> int:
    """Binds the listen address and returns the port, or refuses (InvalidSettings)."""
    address = settings.bind_address
    host, port = settings.host_port
    if port:
        # Asked first with a plain socket, for the OS's own words (and no gRPC core log
        # line): gRPC's bind below still refuses whoever takes the port in between.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As gRPC's own listener does: connections of a server killed a moment ago,
            # left in TIME-WAIT on the port, do not hold it; a live listener still does.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise InvalidSettings(
                    f"--listen {settings.listen}: cannot listen there: {exc.strerror}"
                ) from None
    try:
        port = (
            server.add_insecure_port(address)
            if credentials is None
            else server.add_secure_port(address, credentials)
        )
    except RuntimeError:
        port = 0  # grpcio raises where older versions returned 0
    if port == 0:
        raise InvalidSettings(
            f"--listen {settings.listen}: cannot listen there (the port is in use, "
            "or the address is not this host's)"
        )
    return port


def coordination_for(store: RunStore, settings: Settings) -> Coordination:
    """The coordination strategy the store calls for: replicas on a shared store, or one
    process on its own file."""
    owner = settings.replica_id or default_owner()
    if store.shared:
        return SharedCoordination(store, owner=owner, lease_s=settings.lease_seconds)
    return LocalCoordination(store, owner)


def build_run_manager(
    settings: Settings,
    store: RunStore,
    *,
    harness: Harness,
    tracer: trace.Tracer | None,
    metrics: Metrics,
    tools: ToolCaller | None = None,
) -> RunManager:
    """The runs layer: the live registry, the execution of runs over the conversation
    graph, following other replicas' runs, and the coordination strategy."""
    limits = settings.run_limits
    log = EventLog(store)
    registry = LiveRegistry(limits)
    coordination = coordination_for(store, settings)
    checkpoints = BoundarySaver(store.checkpointer)
    executor = Executor(
        graph=build_conversation_graph(checkpoints),
        harness=harness,
        log=log,
        coordination=coordination,
        registry=registry,
        checkpoints=checkpoints,
        durability=settings.checkpoint_durability,
        tracer=tracer,
        metrics=metrics,
        tools=ToolRuntime(caller=tools, store=store) if tools is not None else None,
    )
    return RunManager(
        log=log,
        registry=registry,
        coordination=coordination,
        executor=executor,
        follower=Follower(log, poll_s=0.05, buffer=limits.stream_buffer),
        lease_s=settings.lease_seconds,
    )


@dataclass(slots=True)
class RunningServer:
    """A started server: its address and the parts tests may look at."""

    server: grpc.aio.Server
    port: int
    manager: RunManager
    store: RunStore
    health: HealthServicer
    harness: Harness
    telemetry: Telemetry

    @property
    def address(self) -> str:
        """host:port clients dial."""
        return f"127.0.0.1:{self.port}"


def _grpc_server(settings: Settings, auth: Authenticator, telemetry: Telemetry) -> grpc.aio.Server:
    """The grpc.aio server with its interceptors and transport options (nothing bound yet)."""
    return grpc.aio.server(
        # One span per RPC, continuing the caller's W3C traceparent (and baggage), when
        # spans are exported: with nothing configured the interceptor would only add an
        # async generator and a no-op span to every message of every stream.
        # Then the edge: UNAUTHENTICATED for calls without accepted credentials (health
        # excepted) and RESOURCE_EXHAUSTED past a caller's calls in flight, both before the
        # request is read; INVALID_ARGUMENT for bytes that do not parse.
        interceptors=[
            *(
                [aio_server_interceptor(tracer_provider=telemetry.tracer_provider)]
                if telemetry.traces
                else []
            ),
            EdgeInterceptor(auth, CallLimiter(settings.max_calls_per_caller)),
        ],
        options=[
            # A port already in use is refused, not shared: gRPC's default SO_REUSEPORT lets a
            # second server bind it silently and take part of the connections.
            ("grpc.so_reuseport", 0),
            # No BDP probing: with it the transport widened each stream's window far past what
            # the handler had asked to read, so 16 token-less 16 MB requests refused unread
            # still cost 27-43 MiB. Without it a stream's window opens only as the handler
            # reads (a message being read gets its whole length), so a refused call's body
            # stays on the wire. A 16 MB request was no slower: 96 ms against 341 ms.
            ("grpc.http2.bdp_probe", 0),
            # A stream attached to a run that waits for approval is idle for minutes or days:
            # a ping every minute keeps proxies and NATs from dropping it as dead, and finds
            # a client that went away (its stream is then detached) within 20 s more.
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0),
            # Leave room above our own limit so an oversized request gets our precise
            # INVALID_ARGUMENT instead of the transport's RESOURCE_EXHAUSTED.
            (
                "grpc.max_receive_message_length",
                settings.request_limits.max_request_bytes + 1024 * 1024,
            ),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ],
    )


def _add_standard_services(server: grpc.aio.Server) -> HealthServicer:
    """Health (answers before any credential) and server reflection; returns the health
    servicer, set SERVING once the server has started."""
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = (
        SERVICE_NAME,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    # grpc.reflection.v1 as well, for clients that speak only v1 (`buf curl --reflect-protocol
    # grpc-v1`): grpcio-reflection ships only v1alpha, and v1 is the same protocol under a
    # new package (every message field for field), so one servicer answers both.
    v1 = reflection.aio.ReflectionServicer(names)
    answer = grpc.stream_stream_rpc_method_handler(
        v1.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": answer}),)
    )
    return health


def _tool_harness(harness: Harness, telemetry: Telemetry) -> tuple[McpPool, ToolHarness]:
    """The pool of MCP sessions (closed by the caller) and the harness every tool call goes
    through. The SDK itself loads on the first tool call, so a server whose members call
    no tools never pays for it; tool servers' breakers share the model harness's board
    (their keys, `mcp:<url>`, never meet a model's)."""
    pool = McpPool()
    tools = ToolHarness(
        pool, breakers=harness.breakers, tracer=telemetry.active_tracer("roundtable.tools")
    )
    return pool, tools


@contextlib.asynccontextmanager
async def running_server(
    settings: Settings,
    *,
    extra_providers: Mapping[str, ChatProvider] | None = None,
    telemetry: Telemetry | None = None,
) -> AsyncIterator[RunningServer]:
    """Builds everything, starts serving, and on exit drains runs and stops the server.

    `telemetry` defaults to what the standard OTEL_* variables configure (nothing, when
    no endpoint is set).
    """
    # Security settings first: a server that would be unsafe or unusable never opens its store.
    auth = Authenticator.from_settings(settings)
    credentials = server_credentials(settings)
    check_listen_address(settings, authenticated=auth.enabled)
    telemetry = telemetry or telemetry_from_env(os.environ)
    metrics = Metrics(telemetry.meter("roundtable"))
    server = _grpc_server(settings, auth, telemetry)
    # The port before the store: a server that cannot listen never marks a store's runs.
    try:
        bound = _bind(server, settings, credentials)
        store = await open_store(settings.store)
    except BaseException:
        await server.stop(None)  # lets the port go
        telemetry.shutdown()
        raise
    providers = {**build_providers(settings), **(extra_providers or {})}
    harness = Harness(
        providers,
        policy=settings.harness,
        tracer=telemetry.active_tracer("roundtable.harness"),
        metrics=metrics,
    )
    pool, tools = _tool_harness(harness, telemetry)
    manager = build_run_manager(
        settings,
        store,
        harness=harness,
        tracer=telemetry.active_tracer("roundtable.graph"),
        metrics=metrics,
        tools=tools,
    )
    interrupted = await store.mark_interrupted()
    if interrupted:
        log.warning(
            "marked %d run(s) left running by a previous process as interrupted",
            len(interrupted),
        )
        await manager.close_interrupted(interrupted)
    add_to_server(
        OrchestratorServicer(
            manager,
            limits=settings.request_limits,
            providers=providers.keys(),
            base_url_rules=base_url_rules(providers),
            budgets=settings.budgets,
            metrics=metrics,
            auth=auth,
        ),
        server,
    )
    health = _add_standard_services(server)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    running = RunningServer(server, bound, manager, store, health, harness, telemetry)
    sweep = manager.coordination.sweep_interrupted()
    try:
        yield running
    finally:
        if sweep is not None:
            sweep.cancel()
        await health.enter_graceful_shutdown()
        await manager.drain(settings.grace_seconds)
        await server.stop(grace=1.0)
        await pool.aclose()
        await store.close()
        telemetry.shutdown()


async def serve(settings: Settings) -> None:
    """Runs the sidecar until SIGTERM or SIGINT, then stops gracefully (exit code 0)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_server(settings) as running:
        # Everything built at start-up lives as long as the process: move it out of the
        # collector's reach, so gen-2 collections stay short (measured: they were 115-125 ms
        # event-loop pauses, the whole time-to-first-event tail under load; bench B3).
        gc.collect()
        gc.freeze()
        log.info(
            "roundtable serving on %s:%d (store %s)",
            settings.host_port[0],
            running.port,
            settings.store_for_logs,
        )
        await stop.wait()
        log.info("shutting down: draining %d live run(s)", running.manager.live_count)
