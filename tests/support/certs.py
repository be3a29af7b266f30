"""Throwaway certificate authorities and certificates for TLS tests, made with the openssl CLI.

Everything is generated at test time into a directory the test owns (P-256 keys, valid for
a day); nothing is checked in.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Issued:
    """A PEM certificate and its private key, as files and bytes."""

    cert_file: Path
    key_file: Path

    @property
    def cert(self) -> bytes:
        """The certificate (PEM)."""
        return self.cert_file.read_bytes()

    @property
    def key(self) -> bytes:
        """The private key (PEM)."""
        return self.key_file.read_bytes()


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _key_args(key_file: Path) -> list[str | Path]:
    return [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        key_file,
    ]


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    root: Issued
    directory: Path

    @classmethod
    def create(cls, directory: Path, name: str = "Roundtable Test CA") -> CertificateAuthority:
        """A new CA whose files live in `directory/<name>`."""
        home = directory / name.replace(" ", "-").lower()
        home.mkdir(parents=True, exist_ok=True)
        root = Issued(home / "ca.pem", home / "ca.key")
        _openssl(
            "req", "-x509", *_key_args(root.key_file), "-out", root.cert_file,
            "-days", "1", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        return cls(root, home)

    def issue(self, common_name: str, *, server: bool = False) -> Issued:
        """A certificate for `common_name`, signed by this CA.

        A server certificate is valid for 127.0.0.1, ::1 and localhost; a client certificate
        is for client authentication only.
        """
        stem = self.directory / common_name
        issued = Issued(stem.with_suffix(".pem"), stem.with_suffix(".key"))
        csr, extensions = stem.with_suffix(".csr"), stem.with_suffix(".ext")
        usage = "serverAuth" if server else "clientAuth"
        lines = ["basicConstraints=CA:FALSE", f"extendedKeyUsage={usage}"]
        if server:
            lines.append("subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost")
        extensions.write_text("\n".join(lines) + "\n")
        _openssl(
            "req", "-new", *_key_args(issued.key_file), "-out", csr, "-subj", f"/CN={common_name}"
        )
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.root.cert_file, "-CAkey", self.root.key_file,
            "-set_serial", f"0x{secrets.token_hex(16)}", "-days", "1",
            "-extfile", extensions, "-out", issued.cert_file,
        )  # fmt: skip
        return issued
