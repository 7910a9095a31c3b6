"""LoadGen's clock check (PerfClock against the system clock over the performance test, in whole
milliseconds) fails a run only over a test long enough for it to mean something. Seen here: a 26 ms
null-model test on a busy machine logged `pc_sc_ratio: 2` and the run failed. LoadGen cannot be made to
log that error on demand, so the rule is checked on the errors as the detail log gives them."""
from __future__ import annotations

from pathlib import Path

from mlharness.records.loadgen_logs import detail_problems
from mlharness.running.runner import fatal_loadgen_errors

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
