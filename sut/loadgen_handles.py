"""LoadGen's handles owned by context managers: a constructed SUT and QSL are destroyed however the
block ends (an exception, a failed test), and the SUT's workers are stopped before either goes."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence


@contextmanager
def loadgen_handles(sut: Any, total: int, performance_count: int,
                    load: Callable[[Sequence[int]], None],
                    unload: Callable[[Sequence[int]], None]) -> Iterator[tuple[Any, Any]]:
    """(LoadGen SUT, QSL) for one test over `sut` (a mlharness.sut.system_under_test.SystemUnderTest, started
    here and stopped on the way out)."""
    import mlperf_loadgen as lg

    sut.start()
    try:
        queue = getattr(sut, "issue_queue", None)
        # The native issue path: LoadGen's C SUT fills the queue without the GIL (native/issue_queue.c).
        # A network SUT is LoadGen's query dispatch library (its name is a round trip to the server).
        qdl = hasattr(sut, "name") and queue is None
        if queue is not None:
            lg_sut = queue.construct_sut("mlharness")
        elif qdl:
            lg_sut = lg.ConstructQDL(sut.issue_query, sut.flush_queries, sut.name)
        else:
            lg_sut = lg.ConstructFastSUT(sut.issue_query, sut.flush_queries)
        try:
            qsl = lg.ConstructQSL(total, performance_count, load, unload)
            try:
                yield lg_sut, qsl
            finally:
                sut.stop()  # workers first: nothing may complete against a destroyed handle
                lg.DestroyQSL(qsl)
        finally:
            if queue is not None:
                queue.destroy_sut(lg_sut)
            elif qdl:
                lg.DestroyQDL(lg_sut)
            else:
                lg.DestroyFastSUT(lg_sut)
    finally:
        sut.stop()  # idempotent: covers a failure before the QSL existed
