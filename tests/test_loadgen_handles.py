"""LoadGen's SUT and QSL handles are owned by a context manager: the SUT's workers stop and both
handles are released however the block ends, so a second test in the process can construct its own."""
from __future__ import annotations

import pytest

from mlharness.sut.loadgen_handles import loadgen_handles


class Recorder:
    """Stands in for the SystemUnderTest's lifecycle only; LoadGen's handles are real."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def start(self) -> None:
        self.events.append("start")

    def stop(self) -> None:
        self.events.append("stop")

    def issue_query(self, ids: list[int], indices: list[int]) -> None:
        raise AssertionError("no test is started here")

    def flush_queries(self) -> None:
        pass


def test_an_exception_inside_still_stops_and_releases() -> None:
    sut = Recorder()
    with pytest.raises(ValueError, match="boom"):
        with loadgen_handles(sut, 4, 4, lambda indices: None, lambda indices: None) as (lg_sut, qsl):
            assert lg_sut is not None and qsl is not None
            raise ValueError("boom")
    assert sut.events[0] == "start" and sut.events[1:] and set(sut.events[1:]) == {"stop"}
    # The handles were destroyed: new ones construct and release cleanly, many times over.
    for _ in range(50):
        with loadgen_handles(Recorder(), 4, 4, lambda indices: None, lambda indices: None):
            pass
