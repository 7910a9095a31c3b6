"""LoadGen's errors fail a run. Its clock check (PerfClock against the system clock over the performance test, in whole
milliseconds) fails a run only over a test long enough for it to mean something. Seen here: a 26 ms
null-model test on a busy machine logged `pc_sc_ratio: 2` and the run failed. LoadGen cannot be made to
log that error on demand, so the rule is checked on the errors as the detail log gives them."""
from __future__ import annotations

import json
from pathlib import Path

from mlharness.records.loadgen_logs import detail_problems
from mlharness.running.runner import fatal_loadgen_errors
from tests.support import null_model_with, run_cli, run_ids, sleeping_postprocess

CLOCK = ':::MLLOG {"key": "error_runtime", "value": "PerfClock and system_clock differ by more than 1%!  pc_sc_ratio: 2", ' \
        '"time_ms": 30.1, "namespace": "mlperf::logging", "event_type": "POINT_IN_TIME", ' \
        '"metadata": {"is_error": true, "is_warning": false, "file": "loadgen.cc", "line_no": 1, "pid": 1, "tid": 1}}\n'
OTHER = CLOCK.replace("PerfClock and system_clock differ by more than 1%!  pc_sc_ratio: 2", "a sample went missing")


def _errors(tmp_path: Path, *lines: str) -> list[str]:
    detail = tmp_path / "mlperf_log_detail.txt"
    detail.write_text("".join(lines))
    return detail_problems(detail)["errors"]


def test_the_clock_check_of_a_short_test_does_not_fail_the_run(tmp_path: Path) -> None:
    assert fatal_loadgen_errors(_errors(tmp_path, CLOCK), 0.03) == []
    assert fatal_loadgen_errors(_errors(tmp_path, CLOCK), 9.99) == []


def test_the_clock_check_of_a_test_of_ten_seconds_or_more_fails_it(tmp_path: Path) -> None:
    errors = _errors(tmp_path, CLOCK)
    assert fatal_loadgen_errors(errors, 10.0) == errors == [
        "error_runtime: PerfClock and system_clock differ by more than 1%!  pc_sc_ratio: 2"]


def test_any_other_error_fails_a_run_however_short(tmp_path: Path) -> None:
    assert fatal_loadgen_errors(_errors(tmp_path, CLOCK, OTHER), 0.03) == ["error_runtime: a sample went missing"]


def test_a_real_run_that_loadgen_ends_with_an_error_fails_and_says_so(tmp_path: Path, capfd) -> None:
    """A real LoadGen error, on demand: a Server test allowed one outstanding query (max_async_queries=1)
    against a model that holds each query 200 ms, at 1000 QPS. LoadGen issues the second query long before
    the first completes, logs "Too many outstanding queries" as an error and ends the test early. The run
    fails with that error in one line, and nothing is published."""
    manifest = null_model_with(tmp_path / "models", postprocess=sleeping_postprocess(0.2), name="held")
    results = tmp_path / "results"
    code = run_cli("run", str(manifest), "--scenario", "Server", "--quick", "--set", "target_qps=1000",
                   "--set", "max_async_queries=1", "--results-dir", str(results))
    err = capfd.readouterr().err
    assert code == 1, err
    # one error line; a note may come first (the clock check of a short test, on a busy machine)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "LoadGen logged 1 error(s) in the performance test" in lines[0], lines[0]
    assert "Too many outstanding queries" in lines[0], lines[0]
    assert not list(results.glob("*/held/Server/run.json")) and not list(results.glob("*/held/Server/runs/*"))
    (failed,) = results.glob("*/held/Server/failed-*/run.json")
    record = json.loads(failed.read_text())
    assert record["status"] == "failed" and "Too many outstanding queries" in record["error"], record["error"]
    assert run_ids(results) == {record["run_id"]}  # recorded in the database too
