"""The native handoff (mlharness.sut._native) against the Python one, and both against a real LoadGen run:
gathered rows equal, logged response bytes equal the result rows, `results` is released when
complete() returns, nothing leaks over a million responses, bad rows are refused."""
from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import tempfile
import threading
import time
import tracemalloc
import zlib
from pathlib import Path
from typing import Callable

import mlperf_loadgen as lg
import numpy as np
import pytest

from mlharness.errors import UserError
from mlharness.sut import _native
from mlharness.sut.handoff import PythonHandoff, load_handoff, load_issue_queue

# Every way a response can reach LoadGen: the Python baseline, and the C extension through LoadGen's
# C entry point and through its pybind11 objects (the fallback when that entry point is not found).
HANDOFFS: dict[str, Callable[[], object]] = {
    "python": PythonHandoff,
    "native-loadgen-c": lambda: _native.NativeHandoff(completion="loadgen-c"),
    "native-pybind": lambda: _native.NativeHandoff(completion="pybind"),
}


def run_loadgen(issue: Callable[[list[int], list[int]], None], *, samples: int, mode: lg.TestMode,
                outdir: Path, expected_qps: float = 1000.0, min_duration_ms: int = 0) -> None:
    """One Offline run with ConstructFastSUT/ConstructQSL; the QSL holds nothing (tests stage their own).

    An exception inside the issue callback would end up in a LoadGen thread, so it is kept and
    re-raised here, and the query is completed empty so the run still ends."""
    errors: list[BaseException] = []

    def guarded_issue(query_ids: list[int], sample_indices: list[int]) -> None:
        try:
            issue(query_ids, sample_indices)
        except BaseException as exc:  # noqa: BLE001 - re-raised after the run
            errors.append(exc)
            lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0) for qid in query_ids])

    sut = lg.ConstructFastSUT(guarded_issue, lambda: None)
    qsl = lg.ConstructQSL(samples, samples, lambda indices: None, lambda indices: None)
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Offline
    settings.mode = mode
    settings.offline_expected_qps = expected_qps
    settings.min_duration_ms = min_duration_ms
    settings.min_query_count = 1
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(outdir)
    log_settings.log_output.copy_summary_to_stdout = False
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroyFastSUT(sut)
    if errors:
        raise errors[0]


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, scale: float = 100) -> np.ndarray:
    """Random values that every dtype holds exactly: a float cast to an integer type it does not fit
    is undefined in C, so numpy's result (and whether it warns) depends on the CPU's instructions."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ------------------------------------------------------------------------------------------ gather

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32,
                                   np.int64, np.bool_, np.complex64])
@pytest.mark.parametrize("row_shape", [(), (7,), (3, 5, 2)])
def test_gather_matches_python(dtype: type, row_shape: tuple[int, ...]) -> None:
    # A seed that is the same in every process (hash() of a str is salted per process).
    rng = np.random.default_rng(zlib.crc32(f"{np.dtype(dtype).str}{row_shape}".encode()))
    staged = random_values(rng, (50, *row_shape), dtype)
    rows = rng.integers(0, len(staged), size=33)  # repeats included
    native, python = _native.NativeHandoff(), PythonHandoff()
    expected = np.empty((len(rows), *row_shape), dtype)
    python.gather(staged, rows, expected)
    for row_numbers in (rows, rows.astype(np.int32), rows.astype(np.uint64), rows.tolist(), tuple(rows.tolist())):
        got = np.full_like(expected, 1)
        native.gather(staged, row_numbers, got)
        assert got.tobytes() == expected.tobytes()
    assert expected.tobytes() == staged[rows].tobytes()


def test_gather_large_copy_releases_gil_and_matches() -> None:
    """Above the size at which the copy runs without the GIL (256 KiB), another Python thread keeps
    running while gather copies: a thread stamping the clock in a loop leaves no pause longer than half
    the call (with the GIL held it could not stamp at all until the copy ended). 256 MiB make the call
    tens of milliseconds long; the switch interval is shortened so the GIL changes hands within 0.1 ms
    at the call's edges; on a loaded machine the thread may miss a call, so the best of 5 is judged."""
    staged = np.random.default_rng(1).integers(-2**31, 2**31 - 1, (4, 1 << 20), dtype=np.int32).view(np.float32)
    rows = np.array([3, 0, 1, 1, 2, 0, 3, 2] * 8)
    out = np.empty((len(rows), 1 << 20), np.float32)  # 256 MiB
    handoff = _native.NativeHandoff()
    handoff.gather(staged, rows, out)  # the pages of out touched once before the timed calls
    stamps: list[int] = []
    stop = threading.Event()

    def stamp() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter_ns())

    calls = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    thread = threading.Thread(target=stamp, daemon=True)
    thread.start()
    try:
        while len(stamps) < 1000:  # the thread runs
            time.sleep(0.001)
        for _ in range(5):
            out.fill(0)
            stamps.clear()
            begin = time.perf_counter_ns()
            handoff.gather(staged, rows, out)
            end = time.perf_counter_ns()
            inside = [begin, *(t for t in list(stamps) if begin < t < end), end]
            calls.append((end - begin, max(b - a for a, b in zip(inside, inside[1:]))))
            if calls[-1][1] < calls[-1][0] / 2:
                break
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert any(longest < duration / 2 for duration, longest in calls), \
        "no Python thread ran during gather (call ms, longest pause ms): " + \
        ", ".join(f"({d / 1e6:.1f}, {g / 1e6:.1f})" for d, g in calls)
    for i, row in enumerate(rows):
        assert out[i].tobytes() == staged[row].tobytes(), i


@pytest.mark.parametrize("name", ["python", "native"])
def test_gather_empty_batch(name: str) -> None:
    """No rows is a batch too: nothing copied, nothing raised (an empty allocation or min() of no rows
    must not fail), and the output is still checked against the row count and element type."""
    handoff = PythonHandoff() if name == "python" else _native.NativeHandoff()
    staged = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = np.empty((0, 3), np.float32)
    for rows in (np.array([], np.int64), np.array([], np.int32), np.array([], np.uint64)):
        assert handoff.gather(staged, rows, out) is None
    assert out.shape == (0, 3) and staged.tobytes() == np.arange(12, dtype=np.float32).tobytes()
    with pytest.raises(ValueError):
        handoff.gather(staged, np.array([], np.int64), np.empty((1, 3), np.float32))
    with pytest.raises(TypeError):
        handoff.gather(staged, np.array([], np.int64), np.empty((0, 3), np.float64))
    with pytest.raises(ValueError):  # no rows, but rows of another shape: no bytes to compare
        handoff.gather(staged, np.array([], np.int64), np.empty((0, 4), np.float32))


@pytest.mark.parametrize("name", ["python", "native"])
@pytest.mark.parametrize("bad_row", [10, 11, -1, 2**40])
def test_gather_out_of_bounds_row_raises(name: str, bad_row: int) -> None:
    handoff = PythonHandoff() if name == "python" else _native.NativeHandoff()
    staged = np.arange(40, dtype=np.float32).reshape(10, 4)
    out = np.full((3, 4), -7.0, np.float32)
    with pytest.raises(IndexError, match=str(bad_row)):
        handoff.gather(staged, np.array([0, bad_row, 9]), out)
    if name == "native":
        assert (out == -7.0).all(), "a bad row must be found before anything is copied"


def test_gather_refuses_mismatched_out() -> None:
    native = _native.NativeHandoff()
    staged = np.zeros((10, 4), np.float32)
    with pytest.raises(TypeError, match="elements"):
        native.gather(staged, [1, 2], np.empty((2, 4), np.float64))
    with pytest.raises(ValueError, match="rows"):
        native.gather(staged, [1, 2], np.empty((3, 4), np.float32))
    with pytest.raises(ValueError, match="rows"):
        native.gather(staged, [1, 2], np.empty((2, 5), np.float32))
    with pytest.raises(ValueError, match="shape of staged rows"):  # the same bytes per row, another shape
        native.gather(staged, [1, 2], np.empty((2, 2, 2), np.float32))
    with pytest.raises(ValueError, match="overlaps"):
        native.gather(staged, [1, 2], staged[4:6])
    with pytest.raises(TypeError, match="integer"):
        native.gather(staged, np.array([1.0, 2.0]), np.empty((2, 4), np.float32))
    # numpy refuses these buffer requests itself (ValueError); other exporters raise BufferError.
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        native.gather(staged, [1, 2], np.empty((2, 8), np.float32)[:, ::2])
    with pytest.raises((BufferError, ValueError), match="read-only"):
        readonly = np.empty((2, 4), np.float32)
        readonly.flags.writeable = False
        native.gather(staged, [1, 2], readonly)


# ---------------------------------------------------------------------------- complete, real LoadGen

def logged_responses(outdir: Path) -> dict[int, bytes]:
    entries = json.loads((outdir / "mlperf_log_accuracy.json").read_text())
    return {entry["qsl_idx"]: bytes.fromhex(entry["data"]) for entry in entries}


@pytest.mark.parametrize("kind", list(HANDOFFS))
@pytest.mark.parametrize("row_shape,dtype", [((5,), np.float32), ((3, 2), np.int64), ((1,), np.uint8)])
def test_complete_logs_the_result_rows(kind: str, row_shape: tuple[int, ...], dtype: type, tmp_path: Path) -> None:
    handoff = HANDOFFS[kind]()
    samples = 37
    outputs = random_values(np.random.default_rng(7), (samples, *row_shape), dtype, scale=1000)
    refcounts: list[tuple[int, int]] = []

    def issue(query_ids: list[int], sample_indices: list[int]) -> None:
        # Odd chunks, and ids both as a list and as a uint64 array, as a SUT might pass them.
        for start in range(0, len(query_ids), 5):
            ids = query_ids[start:start + 5]
            result = np.ascontiguousarray(outputs[sample_indices[start:start + 5]])
            before = sys.getrefcount(result)
            handoff.complete(ids if start % 2 == 0 else np.array(ids, np.uint64), result)
            refcounts.append((before, sys.getrefcount(result)))

    run_loadgen(issue, samples=samples, mode=lg.TestMode.AccuracyOnly, outdir=tmp_path)
    logged = logged_responses(tmp_path)
    assert sorted(logged) == list(range(samples))
    for index, data in logged.items():
        assert data == outputs[index].tobytes(), f"sample {index}"
    assert refcounts and all(before == after for before, after in refcounts)


@pytest.mark.parametrize("kind", list(HANDOFFS))
def test_complete_refuses_ragged_results(kind: str, tmp_path: Path) -> None:
    handoff = HANDOFFS[kind]()
    seen: list[BaseException] = []

    def issue(query_ids: list[int], sample_indices: list[int]) -> None:
        try:
            handoff.complete(query_ids, np.zeros(len(query_ids) * 4 + 1, np.uint8))
        except ValueError as exc:
            seen.append(exc)
        handoff.complete(query_ids, np.zeros((len(query_ids), 4), np.uint8))

    run_loadgen(issue, samples=3, mode=lg.TestMode.AccuracyOnly, outdir=tmp_path)
    assert len(seen) == 1 and "rows" in str(seen[0])


@pytest.mark.parametrize("kind", list(HANDOFFS))
def test_complete_refuses_strided_results_before_calling_loadgen(kind: str) -> None:
    # Refused before any response is built, so the (invalid) ids never reach LoadGen.
    with pytest.raises(ValueError, match="contiguous"):
        HANDOFFS[kind]().complete([1, 2], np.zeros((2, 8), np.float32)[:, ::2])


def test_default_handoff_is_native_and_env_selects_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLHARNESS_HANDOFF", raising=False)
    handoff = load_handoff()
    assert handoff.name == "native"
    # The C entry point is found in the pinned mlcommons-loadgen wheel; falling back would be slower.
    assert handoff.completion == "loadgen-c", _native.loadgen_c_unavailable_reason()
    monkeypatch.setenv("MLHARNESS_HANDOFF", "python")
    assert load_handoff().name == "python"
    with pytest.raises(ValueError, match="completion"):
        _native.NativeHandoff(completion="fast")
    monkeypatch.setenv("MLHARNESS_HANDOFF", "fast")
    with pytest.raises(UserError, match=r"^MLHARNESS_HANDOFF='fast': expected 'native' or 'python'$"):
        load_handoff()


def test_the_native_issue_queue_serves_server_unless_python_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_issue_queue: the request's choice, else $MLHARNESS_ISSUE, else native; read without regard
    to case; Server only; the path's name says why (it goes into run.json)."""
    monkeypatch.delenv("MLHARNESS_ISSUE", raising=False)
    queue, why = load_issue_queue("Server")
    assert isinstance(queue, _native.IssueQueue) and why == "native"
    for scenario in ("Offline", "SingleStream", "MultiStream", "server"):
        assert load_issue_queue(scenario) == (None, f"python (the native issue path serves Server; this is {scenario})")
    assert load_issue_queue("Server", "python") == (None, "python (MLHARNESS_ISSUE=python)")
    monkeypatch.setenv("MLHARNESS_ISSUE", "Python")
    assert load_issue_queue("Server") == (None, "python (MLHARNESS_ISSUE=python)")
    assert load_issue_queue("Server", "NATIVE")[1] == "native"  # the request's choice before the environment
    monkeypatch.setenv("MLHARNESS_ISSUE", "")
    assert load_issue_queue("Server")[1] == "native"
    with pytest.raises(UserError, match=r"^MLHARNESS_ISSUE='fast': expected 'native' or 'python'$"):
        load_issue_queue("Offline", "fast")  # refused whatever the scenario
    import mlharness.sut

    monkeypatch.delattr(mlharness.sut, "_native")
    monkeypatch.setitem(sys.modules, "mlharness.sut._native", None)  # as where the extension is not built
    assert load_issue_queue("Server") == (None, "python (the C extension mlharness.sut._native is not built)")


@pytest.mark.parametrize("kind", list(HANDOFFS))
def test_complete_of_a_single_response(kind: str, tmp_path: Path) -> None:
    """A one-sample query is completed like any other. A watchdog completes it empty if the handoff
    did not, so that bug fails the test instead of leaving LoadGen waiting forever."""
    handoff = HANDOFFS[kind]()
    result = np.arange(6, dtype=np.float32)[None, :]

    def issue(query_ids: list[int], sample_indices: list[int]) -> None:
        handoff.complete(list(query_ids), result)
        watchdog.append(threading.Timer(
            20, lambda: lg.QuerySamplesComplete([lg.QuerySampleResponse(q, 0, 0) for q in query_ids])))
        watchdog[0].start()

    watchdog: list[threading.Timer] = []
    try:
        run_loadgen(issue, samples=1, mode=lg.TestMode.AccuracyOnly, outdir=tmp_path)
    finally:
        for timer in watchdog:
            timer.cancel()
    assert logged_responses(tmp_path) == {0: result.tobytes()}


# ------------------------------------------------------------------------------------------ leaks

_MALLINFO_FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO_FIELDS]


class _MallInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in _MALLINFO_FIELDS]


_LIBC = ctypes.CDLL(None)
# mallinfo2 is glibc >= 2.33; older glibc (Ubuntu 20.04, RHEL 8) has only mallinfo, whose int fields
# wrap at 4 GiB: its figures are read modulo 2**32, which keeps differences of less than 2 GiB exact.
# Without either (not glibc), the heap figures are not checked.
HEAP_MODULUS = 2**64 if hasattr(_LIBC, "mallinfo2") else 2**32 if hasattr(_LIBC, "mallinfo") else None


def heap_in_use() -> int:
    """Bytes malloc has handed out and not got back (glibc), whatever the allocator keeps cached;
    modulo HEAP_MODULUS (compare with heap_change)."""
    if HEAP_MODULUS == 2**64:
        _LIBC.mallinfo2.restype = _MallInfo2
        info = _LIBC.mallinfo2()
    else:
        _LIBC.mallinfo.restype = _MallInfo
        info = _LIBC.mallinfo()
    return (info.uordblks + info.hblkhd) % HEAP_MODULUS


def heap_change(before: int, after: int) -> int:
    """after - before for two heap_in_use() figures, signed, whichever mallinfo gave them."""
    assert HEAP_MODULUS is not None
    return (after - before + HEAP_MODULUS // 2) % HEAP_MODULUS - HEAP_MODULUS // 2


def resident_bytes() -> int:
    if hasattr(_LIBC, "malloc_trim"):  # glibc: hand freed heap back first, so RSS shows what is still allocated
        _LIBC.malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def under_address_sanitizer() -> bool:
    """`make asan` preloads libasan: its allocator quarantines freed memory, so RSS and glibc's heap
    figures say nothing there (Python-level accounting still holds)."""
    with open("/proc/self/maps") as maps:
        return "libasan" in maps.read()


@pytest.mark.slow  # four LoadGen runs of half a million responses each
@pytest.mark.parametrize("kind", ["native-loadgen-c", "native-pybind"])
def test_no_leak_over_a_million_responses(kind: str) -> None:
    handoff = HANDOFFS[kind]()
    chunk = 1000
    results = np.arange(chunk * 4, dtype=np.float32).reshape(chunk, 4)
    completed = [0]
    refcount = sys.getrefcount(results)

    def issue(query_ids: list[int], sample_indices: list[int]) -> None:
        for start in range(0, len(query_ids), chunk):
            ids = query_ids[start:start + chunk]
            handoff.complete(ids, results[: len(ids)])
            completed[0] += len(ids)

    def run_half_a_million(outdir: Path) -> None:
        run_loadgen(issue, samples=1024, mode=lg.TestMode.PerformanceOnly, outdir=outdir,
                    expected_qps=500_000 / 1.1, min_duration_ms=1000)
        gc.collect()

    with tempfile.TemporaryDirectory() as outdir:
        run_half_a_million(Path(outdir))  # warm-up: one-time growth of LoadGen and the allocator
        rss_before, blocks_before = resident_bytes(), sys.getallocatedblocks()
        tracemalloc.start()
        completed[0] = 0
        heap = [heap_in_use()] if HEAP_MODULUS else []
        for _ in range(3):
            run_half_a_million(Path(outdir))
            if HEAP_MODULUS:
                heap.append(heap_in_use())
        traced_growth = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        rss_growth, block_growth = resident_bytes() - rss_before, sys.getallocatedblocks() - blocks_before

    assert completed[0] >= 1_000_000
    assert sys.getrefcount(results) == refcount
    # A leaked object or response struct per sample would be >= 1e6 blocks, >= 16 MB per run.
    assert block_growth < 10_000, block_growth
    assert traced_growth < 1_000_000, traced_growth
    # LoadGen grows its log buffers (8-16 MB at a time) in whichever runs its log thread lags, which
    # depends on the machine and its load, and can happen in two runs in a row; a leak grows the heap
    # in every run, so the smallest growth of three runs is the one that tells.
    if not under_address_sanitizer():
        if heap:
            heap_growth = min(heap_change(before, after) for before, after in zip(heap, heap[1:]))
            assert heap_growth < 2 * 2**20, heap
        assert rss_growth < 64 * 2**20, rss_growth
