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
"""

from __future__ import annotations

import json
from collections.abc import Mapping

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
from roundtable.domain.snapshot import ModelTarget
from roundtable.models.langchain_provider import LangChainProvider

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
        # langchain-openai's own guard against a stream that stays open but goes silent.
        return ModelTimeout("no stream chunk within the chunk timeout")
    if isinstance(exc, openai.APIConnectionError):
        return ModelUnavailable(type(exc).__name__)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status == 429:
            limited = ModelRateLimited(f"HTTP {status}")
            limited.retry_after_s = retry_after_s(exc.response.headers)
            return limited
        if status >= 500:
            return ModelUnavailable(f"HTTP {status}")
        return ModelRejected(f"HTTP {status}")
    if isinstance(exc, json.JSONDecodeError):
        # A stream frame that is not JSON (the SDK parses each SSE event itself): the
        # server broke mid-answer; another attempt may get a whole one.
        return ModelUnavailable("malformed stream frame")
    if isinstance(exc, openai.APIError):
        # No HTTP status: an `error` event inside a 200 stream, or a 2xx body that did not
        # parse. Either way the server failed mid-answer, so another attempt may succeed.
        return ModelUnavailable(type(exc).__name__)
    return None


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


def build_openai_provider(
    *, default_timeout_s: float = 60.0, max_attempt_timeout_s: float = 0.0
) -> LangChainProvider:
    """Builds the OpenAI-compatible provider.

    Args:
        default_timeout_s: The HTTP client's connect, write and pool timeouts in seconds,
            and its read timeout unless `max_attempt_timeout_s` is longer.
        max_attempt_timeout_s: The longest per-attempt deadline a model ref may ask for
            (`timeout_ms`). The read timeout is at least this, so a model given ten
            minutes is not cut off by the client after the default; the harness's
            per-attempt deadline (the ref's, else the default) bounds every call.

    Returns:
        A `LangChainProvider` named `openai` whose models stream and report token usage.
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
        )

    # Structured output as a JSON response format, not a forced tool call: the forms real
    # servers accept differ, and models/structured.py picks one per target.
    return LangChainProvider(
        PROVIDER_NAME, factory, map_error=map_openai_error, structured_method="json"
    )
