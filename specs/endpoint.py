"""An endpoint address as the user writes it (`grpc://HOST:PORT`, `http://HOST:PORT[/PATH]` for the Open
Inference Protocol; `openai+http://HOST:PORT/v1` for an OpenAI-compatible LLM server), checked before any
connection is tried, so a typo is one line naming the flag, not a connection timeout."""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from mlharness.errors import UserError

# scheme -> (protocol, TLS, default port)
SCHEMES = {"grpc": ("grpc", False, 8001), "grpcs": ("grpc", True, 443),
           "http": ("http", False, 80), "https": ("http", True, 443),
           "openai+http": ("openai", False, 80), "openai+https": ("openai", True, 443)}
OPENAI_PATH = "/v1"  # an OpenAI-compatible server's API root when the address names none
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


@dataclass(frozen=True)
class Endpoint:
    protocol: str  # "grpc" or "http" (the Open Inference Protocol over either), or "openai" (over HTTP)
    host: str
    port: int
    tls: bool = False
    path: str = ""  # a prefix before /v2 on HTTP (a gateway's route), "" for none; the API root for openai

    @property
    def url(self) -> str:
        scheme = f"{self.protocol}s" if self.tls else self.protocol  # grpcs, https: as SCHEMES reads them
        if self.protocol == "openai":
            scheme = "openai+https" if self.tls else "openai+http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}{self.path}"

    @property
    def base_url(self) -> str:
        """The HTTP address requests go to (the API root on HTTP and OpenAI endpoints)."""
        return f"{'https' if self.tls else 'http'}://{self.authority}{self.path}"

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
    expected = ("grpc://HOST:PORT, grpcs://HOST:PORT, http://HOST:PORT[/PATH], https://HOST:PORT[/PATH] "
                "or openai+http(s)://HOST:PORT/v1")
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
    if protocol == "openai" and not path:
        path = OPENAI_PATH
    if path and protocol == "grpc":
        raise UserError(f"{where}: a gRPC endpoint has no path, got {text!r}")
    return Endpoint(protocol=protocol, host=host, port=port, tls=tls, path=path)
