"""The --cluster address: its form checked, and the port probed before Ray is touched. Ray retries a
connection to an address where nothing listens for about 14 minutes (20 tries of its GCS client's
35 s), and does the same at a port that answers but is not Ray's; it reads `ray://` (no host) as a
gRPC target it waits 30 s on. Here each is one line within the probe's timeout: a plain socket first,
then one gRPC call that only Ray's service answers (an empty request to the GCS, or to the Ray Client
server for `ray://`). No Ray import: tested without a cluster."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from mlharness.errors import UserError

CLIENT_SCHEME = "ray://"
FORMS = "ray, ray://HOST:PORT or HOST:PORT"
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# One method of the service at each kind of address: Ray's GCS (HOST:PORT) and the Ray Client server (ray://).
RAY_METHODS = {"Ray's GCS": "/ray.rpc.NodeInfoGcsService/GetClusterId",
               "the Ray Client server": "/ray.rpc.RayletDriver/ClusterInfo"}


@dataclass(frozen=True)
class ClusterAddress:
    """`ray` (the local cluster: host and port None), `ray://HOST:PORT` (Ray Client) or `HOST:PORT`
    (a cluster's GCS)."""

    text: str
    host: str | None = None
    port: int | None = None

    @property
    def local(self) -> bool:
        return self.host is None


def parse_cluster_address(text: str, flag: str = "--cluster") -> ClusterAddress:
    """The address's form, or a UserError naming `flag` and the forms it takes."""
    address = text.strip()
    if address == "ray":
        return ClusterAddress(address)
    rest = address[len(CLIENT_SCHEME):] if address.startswith(CLIENT_SCHEME) else address
    if rest.startswith("[") and rest.endswith("]"):  # [::1] alone: an IPv6 address, no port
        host, colon, port_text = rest, "", ""
    else:
        host, colon, port_text = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):  # [::1]:6379
        host = host[1:-1]
    problem = None
    if not address:
        problem = "got nothing"
    elif not colon or not host:
        problem = f"{address!r} names no host" if colon or not rest else f"{address!r} names no port"
    elif not port_text.isdigit() or not 0 < int(port_text) < 65536:
        problem = f"{address!r}: the port must be a number from 1 to 65535, got {port_text!r}"
    elif any(ch in host for ch in "/ @?#[]"):  # a bracket left is one not paired around an IPv6 address
        problem = f"{address!r}: {host!r} is not a host name or address"
    if problem:
        raise UserError(f"{flag}: expected {FORMS}; {problem}")
    return ClusterAddress(address, host, int(port_text))


def probe(address: ClusterAddress, timeout_s: float, flag: str = "--cluster") -> None:
    """Open and close a TCP connection to the address's port within `timeout_s`, or a UserError
    naming `flag` and the address: nothing listening is refused at once, an unreachable host takes
    the timeout, never Ray's retries."""
    if address.local:
        return
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout_s):
            pass
    except socket.timeout:
        raise UserError(f"{flag} {address.text}: no answer from {address.host} port {address.port} within "
                        f"{timeout_s:g} s (--connect-timeout); is the Ray head started there "
                        f"(mlharness node --head) and the port open?") from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise UserError(f"{flag} {address.text}: cannot connect to {address.host} port {address.port}: "
                        f"{reason}; is the Ray head started there (mlharness node --head)?") from None
    _probe_ray(address, timeout_s, flag)


def _probe_ray(address: ClusterAddress, timeout_s: float, flag: str) -> None:
    """One call of Ray's own service at the port (an empty request: any answer but "unimplemented" is
    Ray's), or a UserError: a port that does not speak gRPC, or a gRPC server that is not Ray."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # gRPC's core would log the failed handshake itself
    import grpc  # Ray's own dependency: present wherever --cluster can run

    what = "the Ray Client server" if address.text.startswith(CLIENT_SCHEME) else "Ray's GCS"
    where = f"{flag} {address.text}: {address.host} port {address.port}"
    hint = "is it the Ray head's port (mlharness node --head)?"
    target = f"[{address.host}]:{address.port}" if ":" in str(address.host) else f"{address.host}:{address.port}"
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(RAY_METHODS[what])  # bytes in, bytes out: no Ray message types needed
        try:
            call(b"", timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise UserError(f"{where} answers gRPC but is not {what}; {hint}") from None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise UserError(f"{where} accepts connections but does not speak gRPC, as {what} does; {hint}") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise UserError(f"{where} accepts connections but sent no gRPC answer within {timeout_s:g} s "
                                f"(--connect-timeout); {hint}") from None
