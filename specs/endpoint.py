"""An endpoint address as the user writes it (`grpc://HOST:PORT`, `http://HOST:PORT[/PATH]`), checked
before any connection is tried, so a typo is one line naming the flag, not a connection timeout."""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from mlharness.errors import UserError

# scheme -> (protocol, TLS, default port)
SCHEMES = {"grpc": ("grpc", False, 8001), "grpcs": ("grpc", True, 443),
           "http": ("http", False, 80), "https": ("http", True, 443)}
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


@dataclass(frozen=True)
class Endpoint:
    protocol: str  # "grpc" or "http" (the Open Inference Protocol over either)
    host: str
    port: int
    tls: bool = False
    path: str = ""  # a prefix before /v2 on HTTP (a gateway's route), "" for none

    @property
    def url(self) -> str:
        scheme = f"{self.protocol}s" if self.tls else self.protocol  # grpcs, https: as SCHEMES reads them
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}{self.path}"

    @property
    def authority(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(host))


def parse_endpoint(text: str, where: str = "--endpoint") -> Endpoint:
    """The endpoint `text` names, or a UserError naming `where` and what was expected."""
    expected = "grpc://HOST:PORT, grpcs://HOST:PORT, http://HOST:PORT[/PATH] or https://HOST:PORT[/PATH]"
    if not isinstance(text, str) or "://" not in text:
        raise UserError(f"{where}: expected {expected}, got {text!r}")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise UserError(f"{where}: unknown scheme {parts.scheme!r} in {text!r}; expected {expected}")
    protocol, tls, default_port = SCHEMES[scheme]
    host = parts.hostname or ""
    if not host or not _valid_host(host):
        raise UserError(f"{where}: no valid host in {text!r}; expected {expected}")
    try:
        port = parts.port if parts.port is not None else default_port
    except ValueError:
        raise UserError(f"{where}: the port in {text!r} is not a number from 1 to 65535") from None
    if not 1 <= port <= 65535:
        raise UserError(f"{where}: the port in {text!r} is not a number from 1 to 65535")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UserError(f"{where}: {text!r} has a query, fragment or user; expected {expected}")
    path = parts.path.rstrip("/")
    if path and protocol == "grpc":
        raise UserError(f"{where}: a gRPC endpoint has no path, got {text!r}")
    return Endpoint(protocol=protocol, host=host, port=port, tls=tls, path=path)
