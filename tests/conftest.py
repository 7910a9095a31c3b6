"""Fixtures shared by the tests; plain helpers live in tests/support.py."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Iterator

import pytest

# The suite runs more workers than cores (Makefile: TEST_WORKERS): OpenMP threads that spin while they
# wait (libgomp's default) would burn the core another worker's test needs; set before torch loads, and
# inherited by every run process a test starts. It changes no behaviour a test checks, only the waiting.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tests.support import copy_specs  # noqa: E402

# Set from outside, these would point a test at the developer's database, manifests or presets, or
# append to a CI job's summary.
_OUTSIDE = ("GITHUB_STEP_SUMMARY",)


# The modules that hold a worker longest (their tests' summed durations in a make test on a 2-core machine,
# 2026-11-29) start first: under pytest-xdist's loadfile distribution a long module started last is one
# worker's tail while the others sit idle. make test passes --no-loadscope-reorder, without which xdist
# sorts the modules by their number of tests instead. Order only; every test still runs.
_LONGEST_FIRST = ("test_cluster", "test_tuning", "test_openai_endpoint", "test_gguf_unpacked", "test_openai_faults",
                  "test_bad_input_round3", "test_faults", "test_network_faults", "test_scenarios", "test_openai_serve",
                  "test_launcher_rules", "test_llm_summaries", "test_network_peers", "test_real_models",
                  "test_llm_profiling", "test_llm_llamacpp", "test_zoo", "test_site", "test_profiling", "test_threads",
                  "test_native_handoff", "test_queue_model", "test_bench_bricks", "test_user_errors", "test_sweep")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).stem, len(rank)))  # stable: files stay whole


def _ours() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("MLHARNESS_") or k in _OUTSIDE}


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's one artifact cache ($MLHARNESS_CACHE), shared by every test of the session:
    converted models (torch -> ONNX exports, the symbolic-batch resnet50-light graph) take seconds
    to minutes to rebuild, and every test that needs one would otherwise rebuild it. Sharing it is
    safe: an entry is named by a key over everything that makes it and reused only while its sha256
    matches its provenance, and the cache is never the developer's ~/.cache/mlharness. Under
    pytest-xdist the workers share it too (the folder above each worker's own): an entry is written
    under a per-process name and moved into place, so two workers making one entry only repeat work."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "mlharness-cache"


@pytest.fixture(scope="session", autouse=True)
def _hermetic_session(model_cache: Path) -> Iterator[None]:
    """No MLHARNESS_* variable from outside for the whole session, so module-scoped fixtures (set up
    before any per-test fixture) do not see the developer's database, specs or presets either; the
    session's own: a private cache, no progress display."""
    with pytest.MonkeyPatch.context() as patch:
        for var in _ours():
            patch.delenv(var)
        patch.setenv("MLHARNESS_CACHE", str(model_cache))
        # No progress display (as --quiet): tests read a failed run's stderr as its one-line error, and a
        # slow machine would add progress lines to it. tests/test_progress.py turns it back on.
        patch.setenv("MLHARNESS_PROGRESS", "off")
        yield


@pytest.fixture(autouse=True)
def _private_env(tmp_path: Path) -> Iterator[Path]:
    """Every test runs in its own folder, with its own results database, and leaves the
    MLHARNESS_* environment as it found it.

    The working directory is tmp_path, so a command given no --results-dir or --db writes
    `results/` and its database there, never into the checkout. MLHARNESS_DB stays unset (see
    `_hermetic_session`), so each run's database is `<its results dir>/mlharness.sqlite`, under
    the test's tmp_path: setting MLHARNESS_DB to a per-test file instead would send every run of
    a test into that one file, and tests that read `<results dir>/mlharness.sqlite` after a run
    would find nothing. MLHARNESS_CACHE is the session's shared cache (see `model_cache`) unless
    a module's fixture chose its own. A test that changes MLHARNESS_* (or GITHUB_STEP_SUMMARY)
    other than through `monkeypatch` errors at teardown and the change is undone, so it cannot
    reach the next test; the working directory is restored. (Autouse, this fixture is set up before
    a test's own `monkeypatch` and torn down after it, which has undone its changes by then.)"""
    before, cwd = _ours(), os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(cwd)
        after = _ours()
        for var in set(after) - set(before):
            del os.environ[var]
        os.environ.update(before)
    assert after == before, f"the test left MLHARNESS_* changed: {sorted(set(after.items()) ^ set(before.items()))}"


@pytest.fixture
def specs_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of specs/ that tests may add manifests to; MLHARNESS_SPECS points at it."""
    root = copy_specs(tmp_path / "specs")
    monkeypatch.setenv("MLHARNESS_SPECS", str(root))
    return root


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _signal_handlers_kept() -> Iterator[None]:
    """A test leaves the process's signal handlers as it found them. One left behind changes what a
    later test in the same worker sees: the sweep leaves a SIGINT handler that is not Python's default
    alone, so its Ctrl-C test then never interrupts. A changed handler errors at teardown, naming the
    test, and is put back."""
    if threading.current_thread() is not threading.main_thread():  # handlers are only the main thread's
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    yield
    after = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    changed = sorted(signal.Signals(sig).name for sig in _SIGNALS if after[sig] != before[sig])
    for sig in _SIGNALS:
        if after[sig] != before[sig]:
            signal.signal(sig, before[sig])
    assert not changed, f"the test left these signal handlers changed: {', '.join(changed)}"
