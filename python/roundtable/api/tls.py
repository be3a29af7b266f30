"""Transport security: TLS credentials, and where a server without caller auth may listen."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import grpc

from roundtable.domain.errors import InvalidSettings
from roundtable.settings import Settings

log = logging.getLogger(__name__)


def _read(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidSettings(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings, or None for plaintext.

    With `tls_client_ca_file` every client must present a certificate signed by one of its
    CAs (mutual TLS); the handshake turns away anyone else before a call starts.

    Raises:
        InvalidSettings: only one of certificate and key is set, a client CA is set without
            them, or a file cannot be read.
    """
    cert, key, client_ca = (
        settings.tls_cert_file,
        settings.tls_key_file,
        settings.tls_client_ca_file,
    )
    if bool(cert) != bool(key):
        raise InvalidSettings("--tls-cert-file and --tls-key-file go together: set both or neither")
    if client_ca and not cert:
        raise InvalidSettings(
            "--tls-client-ca-file (mutual TLS) needs --tls-cert-file and --tls-key-file"
        )
    if not cert:
        return None
    return grpc.ssl_server_credentials(
        [(_read("--tls-key-file", key), _read("--tls-cert-file", cert))],
        root_certificates=_read("--tls-client-ca-file", client_ca) if client_ca else None,
        require_client_auth=bool(client_ca),
    )


def is_loopback(host: str) -> bool:
    """Whether `host` (a listen host) is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen_address(settings: Settings, *, authenticated: bool) -> None:
    """Refuses to serve a non-loopback address with no caller authentication.

    Unless `allow_unauthenticated` is set; either way, serving without caller authentication
    is logged as a warning.

    Args:
        settings: the listen address and `allow_unauthenticated`.
        authenticated: whether callers must authenticate (bearer tokens or mutual TLS).

    Raises:
        InvalidSettings: the listen address is not loopback, no caller authentication is
            configured and `allow_unauthenticated` is off.
    """
    host, port = settings.host_port
    where = f"{host}:{port}"
    if authenticated:
        if not settings.tls_cert_file and not is_loopback(host):
            # Bearer tokens then cross the network in the clear, readable on the path.
            log.warning(
                "serving on %s without TLS: callers' bearer tokens travel in cleartext "
                "(set --tls-cert-file and --tls-key-file)",
                where,
            )
        return
    if is_loopback(host):
        log.warning(
            "serving on %s without caller authentication: any local process may act for any "
            "tenant (set --auth-tokens, --auth-tokens-file or --tls-client-ca-file)",
            where,
        )
        return
    if not settings.allow_unauthenticated:
        raise InvalidSettings(
            f"refusing to listen on {where} without caller authentication: set --auth-tokens, "
            "--auth-tokens-file or mutual TLS (--tls-client-ca-file), listen on a loopback "
            "address, or pass --allow-unauthenticated=true"
        )
    log.warning(
        "serving on %s WITHOUT caller authentication (--allow-unauthenticated): anyone who can "
        "reach it may act for any tenant",
        where,
    )
