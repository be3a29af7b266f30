"""The OpenAI-compatible provider: OpenAI itself and every server that speaks its API.

vLLM, Ollama, llama.cpp, DeepSeek, Qwen and friends all serve `POST /v1/chat/completions`,
so one `ChatOpenAI` per (target, key) covers them; the target's `base_url` says where.

Two rules shape the client we build:

- The SDK never retries (`max_retries=0`). The harness owns retries, backoff and circuit
  breakers; a second retry loop underneath would multiply attempts and hide failures from
  the breaker.
- Errors are mapped by type and HTTP status only. Provider error messages and bodies may
  echo the request (the prompt, sometimes the API key), so none of their text is copied
  into our errors.

This module builds the provider and maps its errors; its calls with tools, which skip
LangChain for the SDK's own client, are made in models/openai_tools.py.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
from collections.abc import Iterator, Mapping
from http import HTTPStatus
from typing import Any

import openai
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI, StreamChunkTimeoutError
from pydantic import SecretStr

from roundtable.domain.errors import (
    ModelError,
    ModelRateLimited,
    ModelRejected,
    ModelTimeout,
    ModelUnavailable,
)
from roundtable.domain.snapshot import ModelTarget, http_url_problem
from roundtable.models.base import ChatCall, ChatResult, ModelFactory, TextSink
from roundtable.models.langchain_provider import LangChainProvider
from roundtable.models.openai_tools import (
    sdk_client,
    stream_refusal,
    stream_tool_reply,
    tool_request,
    unstreamed_tool_reply,
)
from roundtable.models.structured import SchemaRefusals

log = logging.getLogger(__name__)

PROVIDER_NAME = "openai"
"""`ModelTarget.provider` value served by this provider."""

NO_API_KEY = "no-api-key-configured"
"""Sent when a target has no key: local servers (Ollama, llama.cpp, vLLM) need none, but
the SDK refuses to build a client without one. Plainly not a real key in any log."""


def map_openai_error(exc: BaseException) -> ModelError | None:
    """Maps an openai SDK (or langchain-openai) exception onto our error family.

    langchain-openai re-raises SDK errors as its own subclasses of the SDK classes, so
    `isinstance` checks against the SDK classes cover both.

    Args:
        exc: The exception raised while calling the model.

    Returns:
        The matching `ModelError`, or None when `exc` is not a model-call failure (a bug
        of ours, say), which the caller then re-raises unchanged. The error's detail names
        only the exception class or HTTP status, never the provider's message or body.
    """
    # Order matters: APITimeoutError is an APIConnectionError, and RateLimitError and
    # the 5xx errors are APIStatusErrors.
    if isinstance(exc, openai.APITimeoutError):
        return ModelTimeout(type(exc).__name__)
    if isinstance(exc, StreamChunkTimeoutError):
        # langchain-openai's own guard against a stream that goes silent (off in the
        # models built here; kept for a model built with it on).
        return ModelTimeout("no stream chunk within the chunk timeout")
    if isinstance(exc, openai.APIConnectionError):
        if any(type(link).__name__ == "LocalProtocolError" for link in _chain(exc)):
            # Our own request could not be sent (a header its key cannot be part of): no
            # sign of the server's health, and no breaker may count it.
            return ModelRejected("the request could not be sent")
        return ModelUnavailable(connection_cause(exc))
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        error: ModelError
        if status == 429:
            error = ModelRateLimited(http_status(status))
            error.retry_after_s = retry_after_s(exc.response.headers)
        elif status == 408:
            # Request Timeout: the server gave up waiting (a proxy, or a slow upload), as
            # our own timeout would have; another attempt may get through.
            error = ModelTimeout(http_status(status))
        elif status >= 500 or status in (409, 425):
            # 409 (a conflicting request in flight) and 425 (too early) say "not now".
            error = ModelUnavailable(http_status(status))
        else:
            error = ModelRejected(http_status(status))
        error.http_status = status
        return error
    if isinstance(exc, json.JSONDecodeError):
        # A stream frame that is not JSON (the SDK parses each SSE event itself): the
        # server broke mid-answer; another attempt may get a whole one.
        return ModelUnavailable("malformed stream frame")
    if isinstance(exc, openai.APIError):
        # No HTTP status: an `error` event inside a 200 stream, or a 2xx body that did not
        # parse. Either way the server failed mid-answer, so another attempt may succeed.
        return ModelUnavailable(type(exc).__name__)
    return None


def http_status(status: int) -> str:
    """`HTTP 503 Service Unavailable`: the code and its standard phrase (ours, never the
    server's reason text or body)."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


# What broke a connection, by the class of an exception in the SDK's chain (httpx and
# httpcore, in whichever fork the SDK uses). Their messages are not used: they name
# hosts, ports and sometimes URLs, whose query may hold a key.
_TRANSPORT_CAUSES = {
    "RemoteProtocolError": "the server closed the connection mid-answer",
    "ReadError": "the connection failed while reading the answer",
    "WriteError": "the connection failed while sending the request",
    "ConnectTimeout": "connecting timed out",
    "ReadTimeout": "no answer within the read timeout",
    "ProxyError": "the proxy refused the connection",
    "UnsupportedProtocol": "the base URL's scheme is not http or https",
    "ConnectError": "could not connect",
}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and its causes, outermost first (bounded, in case of a cycle)."""
    current: BaseException | None = exc
    for _ in range(16):
        if current is None:
            return
        yield current
        current = current.__cause__ or current.__context__


def connection_cause(exc: BaseException) -> str:
    """Why a model server could not be reached, in words an operator acts on:
    "connection refused (ECONNREFUSED)", "host name not resolved", "the server closed
    the connection mid-answer". Made of OS error names and our own phrases only: no
    message text from the exception chain (it names hosts and URLs)."""
    chain = list(_chain(exc))
    for link in chain:
        if isinstance(link, socket.gaierror):
            return "host name not resolved"
        code = link.errno if isinstance(link, OSError) else None
        if code is not None and code in errno.errorcode:
            return f"{os.strerror(code).lower()} ({errno.errorcode[code]})"
    for link in reversed(chain):
        cause = _TRANSPORT_CAUSES.get(type(link).__name__)
        if cause is not None:
            return cause
    return type(chain[-1]).__name__


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The wait a 429 asks for: OpenAI's `retry-after-ms`, else `Retry-After` in seconds
    (the HTTP-date form is not used by these servers, and is ignored)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


class OpenAICompatProvider(LangChainProvider):
    """The OpenAI-compatible provider: `LangChainProvider` over `ChatOpenAI`, except for calls
    with tools, which go to the server through the openai SDK client of the same model
    (models/openai_tools.py).

    Why not LangChain for those too: its chunks drop the id llama.cpp's old dialect puts in
    `function.id` (the call would come back without one), and reading the SDK's own chunks
    costs less. Client time per streamed reply of 34 chunks, a tool call in 29 argument
    fragments (bench/tool_stream.py, 2 shared cores, 200-300 replies, p50 / p99 / CPU):

    | path | p50 | p99 | CPU |
    | --- | --- | --- | --- |
    | this provider with tools (SDK chunks) | 4.4-4.5 ms | 5.2-6.1 ms | 4.4-4.5 ms |
    | `LangChainProvider` with tools (`bind_tools`) | 6.0-6.4 ms | 8.0-9.1 ms | 6.2-6.5 ms |
    | LangChain adding the chunks up itself | 7.5-8.0 ms | 11.6-12.8 ms | 7.6-8.1 ms |
    | this provider, text only (LangChain) | 5.0-5.2 ms | 8.2-9.2 ms | 5.1-5.4 ms |
    """

    def __init__(self, factory: ModelFactory) -> None:
        """Builds the provider over a factory of `ChatOpenAI` models."""
        super().__init__(
            PROVIDER_NAME,
            factory,
            map_error=map_openai_error,
            stream_ends_with_finish_reason=True,
            # Structured output as a JSON response format, not a forced tool call: the
            # forms real servers accept differ, and models/structured.py picks one per target.
            structured_method="json",
        )
        self._unstreamed = SchemaRefusals()
        """Targets that refused tools in a streamed request: their tool calls are asked for
        without streaming at once."""

    def base_url_problem(self, base_url: str) -> str:
        """Why this provider can never use `base_url` ("" when it may; a
        `domain.snapshot.BaseUrlRule`, applied at the edge): the SDK's HTTP client reaches
        http and https URLs with a host only, and fails anything else at every call
        (UnsupportedProtocol, InvalidURL), after the run was stored."""
        return http_url_problem(base_url)

    async def _with_tools(
        self,
        model: BaseChatModel,
        target: ModelTarget,
        call: ChatCall,
        kwargs: dict[str, Any],
        on_text: TextSink | None,
        name: str,
    ) -> ChatResult:
        """A call the model may answer with tool calls, streamed (text to `on_text` as it
        comes); asked again without streaming when the server refuses tools in a stream,
        and for that target from then on."""
        client = sdk_client(model)
        request = tool_request(target, call)
        if self._unstreamed.reason(target.base_url, target.model):
            return await unstreamed_tool_reply(client, request, call.max_tokens, on_text, name)
        refusal: ModelError | None = None
        try:
            return await stream_tool_reply(
                client,
                request,
                call.max_tokens,
                on_text,
                name,
                ends_with_finish_reason=self._stream_ends_with_finish_reason,
            )
        except Exception as exc:
            refusal = stream_refusal(self._map_error(exc))
            if refusal is None:
                raise
        # Asked again outside the handler, so the first error is not the second's
        # __context__ (the SDK's errors hold the request). A server that fails this one too
        # raises that error, as any failed call does, and is not remembered.
        result = await unstreamed_tool_reply(client, request, call.max_tokens, on_text, name)
        self._unstreamed.remember(target.base_url, target.model, refusal.detail)
        log.warning(
            "%s refused tools in a streamed request (%s); its tool calls are not streamed",
            name,
            refusal.detail,
        )
        return result


def build_openai_provider(
    *, default_timeout_s: float = 60.0, max_attempt_timeout_s: float = 0.0
) -> OpenAICompatProvider:
    """Builds the OpenAI-compatible provider.

    Args:
        default_timeout_s: The HTTP client's connect, write and pool timeouts in seconds,
            and its read timeout unless `max_attempt_timeout_s` is longer.
        max_attempt_timeout_s: The longest per-attempt deadline a model ref may ask for
            (`timeout_ms`). The read timeout is at least this, so a model given ten
            minutes is not cut off by the client after the default; the harness's
            per-attempt deadline (the ref's, else the default) bounds every call.

    Returns:
        An `OpenAICompatProvider` named `openai` whose models stream and report token usage.
    """

    # The SDK's own Timeout type (its HTTP library, whichever it is).
    timeout = openai.Timeout(default_timeout_s, read=max(default_timeout_s, max_attempt_timeout_s))

    def factory(target: ModelTarget, api_key: str | None) -> BaseChatModel:
        return ChatOpenAI(
            model=target.model,
            # None (not "") makes the SDK use its default, api.openai.com.
            base_url=target.base_url or None,
            api_key=SecretStr(api_key or NO_API_KEY),
            max_retries=0,
            timeout=timeout,
            streaming=True,
            # ChatOpenAI leaves streamed usage off for any custom base_url, but budgets need
            # the counts; vLLM and recent Ollama and llama.cpp honour it.
            stream_usage=True,
            # Off (0): its per-chunk guard wraps every read in `asyncio.wait_for`, which
            # on Python 3.11 swallows a cancellation that meets a chunk already read, so
            # neither a CancelRun nor the end of a spent budget could stop the stream.
            # The harness's per-attempt deadline bounds a stream gone silent instead.
            stream_chunk_timeout=0,
        )

    return OpenAICompatProvider(factory)
