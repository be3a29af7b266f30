"""A model's base_url that can never work is refused at the edge, not at run time.

Before, StartRun stored the run, and each speaker then failed MODEL_UNAVAILABLE ("the
base URL's scheme is not http or https") or MODEL_ERROR (InvalidURL, ValueError). Each
provider says what it can never use: the OpenAI-compatible one an http(s) URL with a
host, the offline one anything its knobs' query string can be read from.
"""

from __future__ import annotations

import grpc
import pytest
from roundtable.api.limits import RequestLimits
from roundtable.api.validation import validate_start_run
from roundtable.settings import Settings
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, member, model_ref, start_request
from support.rejections import rejection
from support.stores import count_rows

DEFAULT_TARGET = "snapshot.session.default_model.target.base_url"


@pytest.mark.parametrize(
    ("provider", "url"),
    [
        ("openai", "ftp://127.0.0.1/v1"),
        ("openai", "not a url"),
        ("openai", "file:///etc/passwd"),
        ("openai", "127.0.0.1:8089/v1"),
        ("openai", "localhost:8089/v1"),
        ("openai", "http://"),
        ("openai", "http:///v1"),
        ("openai", "http://127.0.0.1:port/v1"),
        ("openai", "http://[::1/v1"),
        ("openai", " http://127.0.0.1:8089/v1"),
        ("offline", "//[::1"),
    ],
)
async def test_a_base_url_the_provider_can_never_use_is_invalid_argument(
    server, stub, provider: str, url: str
) -> None:
    request = start_request("hello", default_model=model_ref(provider, base_url=url))

    rejected = await rejection(stub.StartRun(request))

    assert rejected.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(rejected.violations) == {DEFAULT_TARGET}
    assert DEFAULT_TARGET in rejected.details
    assert await count_rows(server.store) == 0


async def test_every_bad_base_url_is_named_members_and_fallbacks_included(server, stub) -> None:
    good = spb.ModelTarget(provider="openai", model="m", base_url="http://127.0.0.1:1/v1")
    default = model_ref("openai", base_url="https://api.example.com/v1")
    default.fallbacks.extend(
        [good, spb.ModelTarget(provider="openai", model="m", base_url="ftp://127.0.0.1/v1")]
    )
    request = start_request(
        "hello",
        default_model=default,
        members=[
            member("a", "Alice", model=model_ref("offline", base_url="offline:?latency_ms=5")),
            member("b", "Bob", model=model_ref("openai", base_url="127.0.0.1:8089/v1")),
        ],
    )

    rejected = await rejection(stub.StartRun(request))

    assert rejected.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(rejected.violations) == {
        "snapshot.session.default_model.fallbacks[1].base_url",
        "snapshot.members[1].model.target.base_url",
    }
    assert "http:// or https://" in rejected.violations["snapshot.members[1].model.target.base_url"]
    assert await count_rows(server.store) == 0


async def test_the_offline_models_knobs_in_its_base_url_still_run(stub) -> None:
    request = start_request(
        "hello",
        kind=spb.SESSION_KIND_SINGLE,
        default_model=model_ref("offline", base_url="offline:?latency_ms=1&token_delay_ms=0"),
    )
    assert len(finals(await collect(stub.StartRun(request)))) == 1


@pytest.mark.parametrize(
    ("provider", "url"),
    [
        ("openai", ""),  # the provider's default: OpenAI's public endpoint
        ("openai", "http://127.0.0.1:8089/v1"),
        ("openai", "HTTPS://api.example.com/v1"),
        ("openai", "https://user:key@[::1]:8443/v1?api-version=2024-06-01"),
        ("offline", "offline:?latency_ms=600"),
        ("offline", "anything at all"),
        ("scripted", "ftp://whatever a test provider takes"),  # a provider with no rule
    ],
)
def test_a_base_url_the_provider_may_use_is_accepted(provider: str, url: str) -> None:
    from roundtable.server import base_url_rules, build_providers

    providers = {**build_providers(Settings()), "scripted": object()}
    request = start_request("hello", default_model=model_ref(provider, base_url=url))

    violations = validate_start_run(
        request,
        limits=RequestLimits(),
        providers=providers.keys(),
        base_url_rules=base_url_rules(providers),
    )

    assert violations == []
