"""The HTTP session of the network clients (Open Inference Protocol over HTTP, OpenAI-compatible servers),
and the one case where a request is sent again: an idle keep-alive connection that the server closed
just as the client took it from the pool.

A server closes a connection left idle past its own keep-alive timeout (uvicorn, which serves vLLM,
llama-cpp-python's server and `mlharness serve`: 5 s). At a low request rate (Server at 0.4 QPS has
gaps of several seconds), a request can go out on such a connection in the instant the server closes
it; the client then sees the connection end with no answer (ServerDisconnectedError, or a reset). Two
things keep that from failing a run:
- the pool drops idle connections after KEEPALIVE_S, below the usual server's, so it rarely happens;
- a request that met such an end on a *reused* connection, before any byte of its answer, is sent
  again, and counted. The pool may hold other connections the server closed at the same time; each
  failed one leaves the pool, so after at most the pool's size the request goes out on a fresh
  connection. aiohttp re-sends only idempotent methods on its own (RFC 9112 9.3.1); an inference
  request changes nothing on the server, so sending it again is safe.
A connection that fails when fresh, or after the answer began, is never re-sent: that is the server's
fault and the run reports it."""
from __future__ import annotations

from typing import Any

KEEPALIVE_S = 3.0  # below uvicorn's 5 s default (timeout_keep_alive), the servers' usual keep-alive


def client_session(connections: int, timeout: Any) -> Any:
    """An aiohttp ClientSession with a pool of `connections` that notes, per request, whether the
    request's connection came from the pool (see `send`)."""
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_note_reused)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=KEEPALIVE_S),
                                 timeout=timeout, raise_for_status=False, trace_configs=[trace])


async def _note_reused(session: Any, context: Any, params: Any) -> None:
    if isinstance(context.trace_request_ctx, dict):
        context.trace_request_ctx["reused"] = True


async def send(session: Any, method: str, url: str, counters: dict[str, int] | None = None, **kwargs: Any) -> Any:
    """The response (headers read, body not yet) of `method url`; sent again while the connection it
    went out on was a reused one that ended before any answer (each adds one to `counters["retries"]`),
    at most the pool's size times. Use the result as `async with await send(...) as response:` so that
    its connection goes back to the pool."""
    import aiohttp

    pooled = session.connector.limit or 100  # the most idle connections that can all have been closed
    for attempt in range(pooled + 1):
        noted: dict[str, bool] = {}
        try:
            return await session.request(method, url, trace_request_ctx=noted, **kwargs)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if not noted.get("reused") or attempt == pooled:
                raise
            if counters is not None:
                counters["retries"] = counters.get("retries", 0) + 1
    raise AssertionError("unreachable")  # the loop returns or raises
