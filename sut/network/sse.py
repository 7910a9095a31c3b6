"""Server-Sent Events as an OpenAI-compatible server streams them (the WHATWG `text/event-stream`
format): lines of `field: value`, an event ends at a blank line, `data` lines of one event are joined
with newlines, lines starting with `:` are comments (keep-alives). The HTTP client (aiohttp) reads
the body; this only cuts its bytes into events, fed as they arrive, so an event split across network
reads is held until its blank line comes.

A line of a field SSE does not have (`data`, `event`, `id`, `retry`) is ignored by the standard; here it
comes out in order as a `StrayLine`, for the client to refuse: from an LLM server it is content or an
error lost otherwise (a chunk sent as a bare JSON line, llama.cpp's server's `error: {...}` line)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Event:
    data: str
    event: str = "message"


@dataclass(frozen=True)
class StrayLine:
    """A whole line that is no field of SSE's (nor a comment), as it came."""
    line: str


FIELDS = ("data", "event", "id", "retry")


class SSEDecoder:
    """Feed it the body's bytes as they arrive; it returns the events completed by each piece."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""

    def feed(self, chunk: bytes) -> list[Event | StrayLine]:
        self._buffer += chunk
        events: list[Event | StrayLine] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return events
            end, after = cut
            line = self._buffer[:end].decode("utf-8", errors="replace")
            self._buffer = self._buffer[after:]
            if not line:  # the blank line ends an event (one with no data is no event)
                if self._data:
                    events.append(Event("\n".join(self._data), self._event or "message"))
                self._data, self._event = [], ""
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name not in FIELDS:
                events.append(StrayLine(line))
            elif name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value

    @property
    def pending(self) -> bool:
        """Bytes or data lines of an event that has not ended: the stream was cut mid-event."""
        return bool(self._buffer.strip() or self._data)


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """(end of the first line, start of the next) for \\n, \\r\\n or \\r endings; None without a whole line.
    A \\r at the buffer's end waits for the next byte (it may be the start of \\r\\n)."""
    newline, carriage = buffer.find(b"\n"), buffer.find(b"\r")
    if carriage < 0 or (0 <= newline < carriage):
        return None if newline < 0 else (newline, newline + 1)
    if carriage + 1 == len(buffer):
        return None
    return carriage, carriage + 2 if buffer[carriage + 1] == 0x0A else carriage + 1
