"""Who is calling, and which tenants it may act for.

A gateway proves who it is with a bearer token (`authorization: Bearer <token>`) or, under
mutual TLS, with its client certificate, whose common name the settings map to tenants.
Either identity is a `Caller` holding the tenants it may act for ("*": any). The edge
(`api.edge.EdgeInterceptor`) turns away calls without accepted credentials on every service
but health, before their request is read; the servicer asks the `Authenticator` whether the caller may act for the tenant a
request names.

Tokens are kept only as SHA-256 digests and compared with `hmac.compare_digest` against
every configured token, so neither the answer's timing nor any log line, error message or
span says anything about them.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import hmac
import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from roundtable.domain.errors import InvalidSettings, RunNotFound, TenantForbidden, Unauthenticated
from roundtable.settings import Settings

log = logging.getLogger(__name__)

ANY_TENANT = "*"
"""In a tenant list: the caller may act for every tenant."""
HEALTH_METHODS = "/grpc.health.v1.Health/"
"""Method prefix the interceptor lets through without credentials (load balancers probe it)."""
COMMON_NAME = "x509_common_name"
"""gRPC auth-context key of a verified client certificate's subject common name."""

_TENANT = re.compile(r"[A-Za-z0-9._:\-]+")  # what the validator accepts as a tenant id


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller.

    Attributes:
        name: how logs may refer to it ("bearer token #2", "client certificate gateway-1");
            never the token itself.
        tenants: the tenants it may act for; "*" is any.
    """

    name: str
    tenants: frozenset[str]

    def may_act_for(self, tenant: str) -> bool:
        """Whether this caller may start, follow, cancel or read runs of `tenant`."""
        return ANY_TENANT in self.tenants or tenant in self.tenants


UNRESTRICTED = Caller("anyone (no caller authentication configured)", frozenset({ANY_TENANT}))
"""The caller of a server without caller authentication."""


_ADMITTED: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "roundtable_admitted_caller", default=None
)
"""The caller the edge identified for the call running in this task (request-scoped, like
OpenTelemetry's current span): the servicer authorizes it without a second token hash."""


@contextlib.contextmanager
def acting_as(caller: Caller) -> Iterator[None]:
    """Makes `caller` the identified caller of the call running in this task."""
    token = _ADMITTED.set(caller)
    try:
        yield
    finally:
        # A generator finalized by the loop (a client gone mid-stream) closes in a context
        # of its own, where the token does not apply; that context dies with it anyway.
        with contextlib.suppress(ValueError):
            _ADMITTED.reset(token)


@dataclass(frozen=True, slots=True)
class _Token:
    digest: bytes
    caller: Caller


def _digest(token: str) -> bytes:
    # Equal-length digests: compare_digest then takes the same time whatever the token's length.
    return hashlib.sha256(token.encode("utf-8")).digest()


def _tenant_set(values: Iterable[object], where: str) -> frozenset[str]:
    tenants: set[str] = set()
    for number, value in enumerate(values, start=1):
        if not isinstance(value, str) or not (value == ANY_TENANT or _TENANT.fullmatch(value)):
            raise InvalidSettings(
                f"{where}: tenant #{number} is not a tenant id (letters, digits, . _ : -) or *"
            )
        tenants.add(value)
    if not tenants:
        raise InvalidSettings(f"{where}: names no tenant (use * for any tenant)")
    return frozenset(tenants)


def parse_tenant_map(text: str, *, flag: str) -> dict[str, frozenset[str]]:
    """Parses `name=tenant-a|tenant-b;other=*` into {name: tenants}.

    A name may contain "=" (base64 padding of a token): the tenants follow the last one.
    Error messages number entries instead of quoting them, since names may be tokens.

    Raises:
        InvalidSettings: an entry has no name or no valid tenant.
    """
    result: dict[str, frozenset[str]] = {}
    for number, entry in enumerate(text.split(";"), start=1):
        if not entry.strip():
            continue
        name, equals, tenants = entry.strip().rpartition("=")
        where = f"{flag} entry #{number}"
        if not equals or not name.strip():
            raise InvalidSettings(f"{where}: expected name=tenant-a|tenant-b")
        parsed = _tenant_set((t.strip() for t in tenants.split("|") if t.strip()), where)
        result[name.strip()] = result.get(name.strip(), frozenset()) | parsed
    return result


def read_token_file(path: str) -> dict[str, frozenset[str]]:
    """Reads a JSON token file: {"<token>": ["tenant-a", "tenant-b"], "<token2>": ["*"]}.

    Raises:
        InvalidSettings: the file cannot be read, is not such an object, or an entry is bad.
    """
    flag = "--auth-tokens-file"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidSettings(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise InvalidSettings(f"{flag} {path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except ValueError:
        raise InvalidSettings(f"{flag} {path}: not UTF-8 text") from None
    if not isinstance(data, dict):
        raise InvalidSettings(f"{flag} {path}: expected an object {{token: [tenant, ...]}}")
    tokens: dict[str, frozenset[str]] = {}
    for number, (token, tenants) in enumerate(data.items(), start=1):
        where = f"{flag} {path} entry #{number}"
        if not token.strip() or not isinstance(tenants, list):
            raise InvalidSettings(f"{where}: expected a non-empty token -> a list of tenants")
        # Stripped as presented tokens are (a trailing newline in the file must not make
        # a token that can never match).
        tokens[token.strip()] = _tenant_set(tenants, where)
    return tokens


def _bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The token of an `authorization: Bearer <token>` header; "" for another scheme."""
    for key, value in metadata:
        if key.lower() != "authorization":
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""
    return None


class Authenticator:
    """Identifies callers from their bearer token or client certificate."""

    def __init__(
        self,
        *,
        tokens: Mapping[str, frozenset[str]] | None = None,
        certificate_tenants: Mapping[str, frozenset[str]] | None = None,
        mutual_tls: bool = False,
    ) -> None:
        """Keeps digests of `tokens` (token -> tenants), never the tokens.

        Args:
            tokens: bearer token -> tenants it may act for.
            certificate_tenants: client certificate common name -> tenants it may act for.
            mutual_tls: whether the transport verifies client certificates, so that their
                common names can be trusted.
        """
        self._tokens = tuple(
            _Token(_digest(token), Caller(f"bearer token #{number}", tenants))
            for number, (token, tenants) in enumerate((tokens or {}).items(), start=1)
        )
        self._certificates = dict(certificate_tenants or {})
        self._mutual_tls = mutual_tls

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        """The authenticator the settings describe (tokens from the flag and the file merged).

        Raises:
            InvalidSettings: a malformed token or certificate map, an unreadable token file,
                certificate names without mutual TLS, or mutual TLS that admits no one.
        """
        tokens = parse_tenant_map(settings.auth_tokens, flag="--auth-tokens")
        if settings.auth_tokens_file:
            for token, tenants in read_token_file(settings.auth_tokens_file).items():
                tokens[token] = tokens.get(token, frozenset()) | tenants
        certificates = parse_tenant_map(
            settings.auth_certificate_tenants, flag="--auth-certificate-tenants"
        )
        mutual_tls = bool(settings.tls_client_ca_file)
        if certificates and not mutual_tls:
            raise InvalidSettings(
                "--auth-certificate-tenants needs mutual TLS (--tls-client-ca-file): "
                "without it no client certificate is verified"
            )
        if mutual_tls and not certificates and not tokens:
            raise InvalidSettings(
                "mutual TLS is on but no caller may act for any tenant: map certificate "
                "common names with --auth-certificate-tenants (or set bearer tokens)"
            )
        return cls(tokens=tokens, certificate_tenants=certificates, mutual_tls=mutual_tls)

    @property
    def enabled(self) -> bool:
        """Whether callers must authenticate (bearer tokens or mutual TLS are configured)."""
        return bool(self._tokens) or self._mutual_tls

    def match_token(self, presented: str) -> Caller | None:
        """The caller a bearer token belongs to, or None.

        Compares against every configured token, also after a match, so the time taken says
        nothing about which token (or how much of one) was right.
        """
        digest = _digest(presented)
        found: Caller | None = None
        for token in self._tokens:
            if hmac.compare_digest(token.digest, digest) and found is None:
                found = token.caller
        return found

    def identify(
        self,
        metadata: Iterable[tuple[str, str | bytes]],
        auth_context: Mapping[str, Iterable[bytes]],
    ) -> Caller:
        """The caller behind a call's metadata and transport auth context.

        A bearer token, when sent, must be valid; otherwise, under mutual TLS, the verified
        client certificate's common name must be mapped to tenants.

        Raises:
            Unauthenticated: no accepted credentials.
        """
        token = _bearer_token(metadata)
        if token is not None:
            caller = self.match_token(token) if token else None
            if caller is None:
                raise Unauthenticated("the bearer token is not accepted")
            return caller
        if self._mutual_tls:
            for raw in auth_context.get(COMMON_NAME, ()):
                name = raw.decode("utf-8", "replace")
                tenants = self._certificates.get(name)
                if tenants is not None:
                    return Caller(f"client certificate {name}", tenants)
            raise Unauthenticated("the client certificate's common name is not mapped to tenants")
        raise Unauthenticated("send the header `authorization: Bearer <token>`")

    def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        """The caller of an RPC (anyone, when caller authentication is off): the one the
        edge identified, else identified now.

        Raises:
            Unauthenticated: no accepted credentials.
        """
        if not self.enabled:
            return UNRESTRICTED
        known = _ADMITTED.get()
        if known is not None:
            return known
        return self.identify(context.invocation_metadata() or (), context.auth_context() or {})

    def authorize_start(self, context: grpc.aio.ServicerContext, tenant: str) -> None:
        """Checks that the caller may start runs of `tenant`.

        Raises:
            Unauthenticated: no accepted credentials.
            TenantForbidden: the caller may not act for `tenant`.
        """
        caller = self.caller(context)
        if not caller.may_act_for(tenant):
            log.info("%s may not act for tenant %s", caller.name, tenant)
            raise TenantForbidden(tenant)

    def authorize_access(self, context: grpc.aio.ServicerContext, tenant: str, run_id: str) -> None:
        """Checks that the caller may see run `run_id` of `tenant`.

        Raises:
            Unauthenticated: no accepted credentials.
            RunNotFound: the caller may not act for `tenant`; the very answer a missing run
                gets, so another tenant's runs cannot even be found to exist.
        """
        if not self.caller(context).may_act_for(tenant):
            raise RunNotFound(run_id)
