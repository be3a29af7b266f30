"""The HTTP client of the OpenAI-compatible provider's models (the openai SDK's, httpx2).

Two choices differ from the SDK's defaults, both for kept-alive connections, which a model
server may close at any moment it is idle:

- Idle connections are dropped after `KEEPALIVE_EXPIRY_S`, sooner than the servers do.
- A request whose connection the server closed before any answer is sent again, once, on a
  new connection (`ResendUnanswered`).

Outside testing against llama.cpp's server saw a call fail at once (3 ms) with "the server
closed the connection mid-answer", which spent a retry and was counted by the breaker. Its
cause was not pinned down (40 calls sent 4.85-5.04 s after the last did not fail here); the
resend covers whatever closed the connection; the shorter expiry, the likeliest cause (a
connection reused just as long as the server keeps one idle).
"""

from __future__ import annotations

import httpx2
import openai

KEEPALIVE_EXPIRY_S = 4.0
"""How long an idle kept-alive connection is kept: less than the 5 s after which llama.cpp's
server (cpp-httplib) and uvicorn (vLLM's) close theirs. The SDK keeps one for 5 s, the same
as they do, so a request could go out on a connection the server was closing."""

MAX_CONNECTIONS = 1000
MAX_KEEPALIVE_CONNECTIONS = 100
"""The SDK's own limits (`openai.DEFAULT_CONNECTION_LIMITS`), kept."""


class ClosedBeforeAnswer(httpx2.RemoteProtocolError):
    """The server closed the connection before answering the request, and did so again when
    it was sent once more (`ResendUnanswered`)."""


class ResendUnanswered(httpx2.AsyncBaseTransport):
    """Sends a request once more when the server closed the connection before the response
    began (`RemoteProtocolError` before its status line): a kept-alive connection the server
    closed as the request went out, as browsers resend on a reused connection. The request
    gets a new connection (the pool drops the closed one). Once only: a server that hangs up
    on it again fails the attempt as before, for the harness to retry, count and fail over.
    An error once the response began (mid-answer) is never resent here."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            return await self._inner.handle_async_request(request)
        except httpx2.RemoteProtocolError:
            pass
        try:
            return await self._inner.handle_async_request(request)
        except httpx2.RemoteProtocolError:
            pass
        # Raised outside the handlers: the error's chain names this cause alone, which
        # `openai_compat.connection_cause` words (the class's name, never its message).
        raise ClosedBeforeAnswer("closed before answering, twice", request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def model_http_client(timeout: openai.Timeout) -> openai.DefaultAsyncHttpxClient:
    """An HTTP client for the provider's models: the SDK's own client class over
    `ResendUnanswered`, with the SDK's limits but `KEEPALIVE_EXPIRY_S`."""
    limits = httpx2.Limits(
        max_connections=MAX_CONNECTIONS,
        max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
    transport = ResendUnanswered(httpx2.AsyncHTTPTransport(limits=limits))
    return openai.DefaultAsyncHttpxClient(transport=transport, timeout=timeout)
