"""The typed views of a run record's payloads (mlharness.records.payloads, issue 34 step 2): what readers
read, typed; an older record's missing keys and a value of the wrong type read as None; unknown keys kept
reachable; the views frozen; and run.json's bytes (and the database's record) unchanged by reading them."""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from mlharness.atomic_io import write_json
from mlharness.records import bricks_payload, payloads, record_metrics, token_metrics
from mlharness.records.run_record import BRICKS, RunRecord
from mlharness.store.result_store import ResultStore

PERFORMANCE = {
    "raw": {"Result is": "VALID", "Scenario": "Offline", "Samples per second": 812.5,
            "90.0th percentile latency (ns)": 2_000_000},
    "valid": True, "result": "VALID", "scenario": "Offline", "mode": "PerformanceOnly",
    "samples_per_second": 812.5, "min_latency_ns": 900_000, "p50_latency_ns": 1_500_000, "p90_latency_ns": 2_000_000,
    "p99_latency_ns": 4_000_000, "p99_9_latency_ns": 5_000_000, "samples_per_query": 1000,
    "early_stopping_90th_percentile_estimate": 2_100_000,
    "ttft_p50_ns": 20_000_000, "ttft_p90_ns": 30_000_000, "ttft_p99_ns": 40_000_000, "tpot_p50_ns": 5_000_000,
    "itl_p50_ns": 4_000_000, "itl_max_ns": 9_000_000, "tokens_per_second": 140.25,
    "queue_p50_ns": 1_000_000, "queue_p90_ns": 2_000_000, "queue_share": 0.1,
    "prefill_p50_ns": 3_000_000, "prefill_p90_ns": 4_000_000, "prefill_share": 0.3,
    "decode_p50_ns": 6_000_000, "decode_p90_ns": 7_000_000, "decode_share": 0.6,
    "goodput_fraction": 0.75, "goodput_samples": 3, "goodput_samples_per_second": 1.5,
    "goodput_limits": "TTFT <= 50 ms and TPOT <= 10 ms",
    "metric": {"name": "samples_per_second", "label": "Samples per second", "value": 812.5},
    "wall_seconds": 12.5, "added_later": 7,
}
ACCURACY = {"metric": "topk", "values": {"top1": 0.75, "top5": 1.0}, "headline": "top1 0.7500",
            "verdict": "FAIL", "reference": "null-ref (refs/null.yaml)",
            "checks": [{"name": "top1", "expected": 0.8, "tolerance": 0.01, "measured": 0.75, "pass": False,
                        "line": "top1: expected 0.800000 ± 0.01, measured 0.750000: FAIL"},
                       {"name": "output[3]", "expected": [1.0, 2.0], "pass": True, "line": "output of sample 3: ok"}],
            "notes": ["the reference was measured with another dataset"]}
COLD_START = {"resolve_seconds": 0.25, "load_seconds": 1.5, "first_inference_seconds": 0.002, "connect_seconds": 0.1,
              "warmup": {"queries": 4, "samples": 32, "seconds": 0.5, "batch_size": 8, "fastest_query_seconds": 0.1,
                         "requested": {"queries": 4, "seconds": 1.0}},
              "peak_rss_bytes": 300 * 2**20,
              "device_memory": {"device": "cuda:0", "source": "torch.cuda", "peak_allocated_bytes": 64 * 2**20,
                                "peak_reserved_bytes": 96 * 2**20}}
BRICKS_PART = {"summary": {"batch": 1, "nodes": 40, "unique_bricks": 12, "reused_bricks": 2, "estimate_ms": 1.25,
                           "lower_bound_ms": 0.9, "measured_ms": 1.3, "error_pct": -3.8, "brick_seconds": 2.0,
                           "whole_model_seconds": 6.0, "speedup": 3.0, "fingerprint": "fp-1", "estimate_only": False,
                           "optimization_level": "all"},
               "by_op_type": [{"op_type": "Conv", "nodes": 20, "measured_ms": 1.0, "lower_bound_ms": 0.7,
                               "measured_share": 0.8, "lower_bound_share": 0.78, "gap_ms": 0.3}],
               "bricks_json": "bricks.json",
               "measured": [{"brick_key": "k1", "variant": "main", "median_ms": 0.1, "stable": True}]}
LOADGEN_PART = {"accuracy": {"logs": ["mlperf_log_summary.txt"], "errors": [], "warnings": ["w1"],
                             "sut": {"network": {"issue_lag_ms": {"p50": 0.1, "p99": 0.2}}},
                             "summary": {"result": None, "output_tokens_client": 90, "output_tokens_server": 92,
                                         "token_count_mismatch_share": 0.25, "token_count_source": "server"}},
                "performance": {"logs": ["mlperf_log_summary.txt", "mlperf_log_detail.txt"],
                                "errors": ["e1", "e2"], "warnings": [], "sut": {}}}


def _record(**fields: Any) -> RunRecord:
    base = dict(run_id="20990101T000000000000Z-abcdef", command="mlharness run null", backend="null",
                model={"name": "null", "version": "1.0.0", "sha256": "a" * 64, "path": "/specs/models/null.yaml"},
                dataset={"name": "synthetic", "version": "1.0.0", "sha256": "b" * 64},
                scenario="Offline", mode="submission", status="ok",
                hardware={"name": "cpu", "version": "1.0.0", "sha256": "c" * 64, "device": "cpu", "cpu_affinity": []},
                software={"manifest": {"name": "null", "version": "1.0.0", "sha256": "d" * 64},
                          "checked": {"numpy": "2.0.0"}, "versions": {"mlcommons-loadgen": "5.0"}},
                settings={"scenario": "Offline", "mode": "performance", "conf_model": "resnet50",
                          "loadgen": {"target_qps": "20000"}, "harness": {"max_batch_size": 8},
                          "origin": {"target_qps": "cli"}, "layers": ["model", "preset:quick", "cli"]},
                performance=copy.deepcopy(PERFORMANCE), accuracy=copy.deepcopy(ACCURACY),
                cold_start=copy.deepcopy(COLD_START), loadgen=copy.deepcopy(LOADGEN_PART))
    return RunRecord(**(base | fields))


def test_performance_reads_loadgen_s_summary_typed() -> None:
    perf = _record().perf
    assert perf is not None and (perf.result, perf.valid, perf.scenario) == ("VALID", True, "Offline")
    assert perf.metric == payloads.HeadlineMetric("samples_per_second", "Samples per second", 812.5)
    assert (perf.samples_per_second, perf.p90_latency_ns, perf.p95_latency_ns) == (812.5, 2_000_000, None)
    assert perf.early_stopping_90th_percentile_estimate == 2_100_000 and perf.samples_per_query == 1000
    assert perf.latency_percentiles() == [(50, 1_500_000), (90, 2_000_000), (99, 4_000_000), (99.9, 5_000_000)]
    assert perf.throughput == 812.5 and perf.wall_seconds == 12.5
    assert perf.raw["Samples per second"] == 812.5
    assert perf.figure("p99_latency_ns") == 4e6 and perf.figure("added_later") == 7.0
    assert perf.figure("no_such_figure") is None and perf.figure("result") is None  # text is no figure
    assert perf.extra == {"added_later": 7}  # every key a newer mlharness wrote stays reachable


def test_token_metrics_are_typed_and_print_as_the_dict_did() -> None:
    tokens = _record().perf.tokens
    assert (tokens.ttft.p50, tokens.ttft.p90, tokens.tpot.p50, tokens.itl.max) == (2e7, 3e7, 5e6, 9e6)
    assert tokens.ttft.p95 is None and tokens.output_tokens_per_second == 140.25
    assert list(tokens.stages) == ["queue", "prefill", "decode"]
    assert tokens.stages["prefill"] == token_metrics.StageShare(3_000_000, 4_000_000, 0.3)
    assert (tokens.goodput_fraction, tokens.goodput_samples) == (0.75, 3) and not tokens.counted_tokens
    # The lines and the report row from the typed view are those from the dict (as the SUT measured it).
    assert token_metrics.summary_lines(tokens) == token_metrics.summary_lines(PERFORMANCE)
    assert token_metrics.summary_lines(tokens) == [
        "  time to first token (TTFT) : p50 20.00 ms, p90 30.00 ms, p99 40.00 ms",
        "  time per output token (TPOT) : p50 5.00 ms",
        "  inter-token latency (SUT) : p50 4.00 ms",
        "  output tokens per second : 140.25",
        "  time per sample (SUT) : queue 10% (p50 1.0 ms), prefill 30% (p50 3.0 ms), decode 60% (p50 6.0 ms)",
        "  goodput (TTFT <= 50 ms and TPOT <= 10 ms) : 75.0% of samples, 1.50 samples/s"]
    assert token_metrics.report_row(tokens) == ("20.0 / 30.0 / 40.0", "5.0", "4.0", "140.25",
                                                "75.0% (TTFT <= 50 ms and TPOT <= 10 ms)", "10% / 30% / 60%")
    assert token_metrics.report_row(token_metrics.TokenMetrics()) is None


def test_accuracy_cold_start_bricks_and_logs_are_typed() -> None:
    record = _record(kind=BRICKS, bricks=copy.deepcopy(BRICKS_PART))
    acc = record.accuracy_result
    assert (acc.metric, acc.verdict, dict(acc.values)) == ("topk", "FAIL", {"top1": 0.75, "top5": 1.0})
    value, output = acc.checks
    assert (value.name, value.expected, value.tolerance, value.measured, value.passed, value.verdict) == \
        ("top1", 0.8, 0.01, 0.75, False, "FAIL")
    assert (output.expected, output.measured, output.verdict) == ([1.0, 2.0], None, "PASS")
    assert acc.notes == ("the reference was measured with another dataset",)
    assert (record.accuracy_values, record.accuracy_verdict) == ({"top1": 0.75, "top5": 1.0}, "FAIL")

    cold = record.cold
    assert (cold.load_seconds, cold.first_inference_seconds, cold.peak_rss_bytes) == (1.5, 0.002, 300 * 2**20)
    assert cold.warmup == payloads.Warmup(queries=4, samples=32, batch_size=8, seconds=0.5, fastest_query_seconds=0.1)
    assert cold.warmup.extra == {"requested": {"queries": 4, "seconds": 1.0}}
    assert cold.device_memory.peak_allocated_bytes == 64 * 2**20 and cold.device_memory.device == "cuda:0"
    assert cold.extra == {"connect_seconds": 0.1}  # a server's runs time their connection: reachable, and a figure
    assert cold.figures()["connect_seconds"] == 0.1 and "warmup" not in cold.figures()

    summary = record.bricks_summary
    assert (summary.estimate_ms, summary.unique_bricks, summary.fingerprint) == (1.25, 12, "fp-1")
    assert summary.extra == {"estimate_only": False, "optimization_level": "all"}
    assert record.bricks_result.by_op_type == (bricks_payload.OpTypeRow("Conv", 20, 1.0, 0.7),)
    assert [dict(row) for row in record.bricks_result.measured] == BRICKS_PART["measured"]

    logs = record.loadgen_logs
    assert list(logs) == ["accuracy", "performance"] and logs["performance"].errors == ("e1", "e2")
    assert logs["accuracy"].network == {"issue_lag_ms": {"p50": 0.1, "p99": 0.2}} and logs["performance"].network is None
    counted = logs["accuracy"].summary.tokens
    assert (counted.output_tokens_client, counted.output_tokens_server, counted.token_count_source) == (90, 92, "server")
    assert token_metrics.token_count_lines(counted, "accuracy") == [
        "  output tokens (accuracy) : client 90, server 92, the two differ for 25.0% of samples; n_tokens from the server"]


def test_manifests_and_settings_are_typed() -> None:
    record = _record()
    assert (record.model_ref.name, record.model_ref.path, record.model_name) == ("null", "/specs/models/null.yaml", "null")
    assert record.hardware_ref.label == "cpu@1.0.0" and record.hardware_ref.extra == {"device": "cpu", "cpu_affinity": []}
    assert record.software_ref.sha256 == "d" * 64 and record.software_checked == {"numpy": "2.0.0"}
    assert record.device == "cpu" and record.conf_model == "resnet50"
    assert record.setting_layers == ["model", "preset:quick", "cli"]
    assert [(kind, ref.name) for kind, ref in record.manifest_refs()] == [
        ("models", "null"), ("datasets", "synthetic"), ("hardware", "cpu"), ("software", "null")]


def test_an_older_record_reads_as_none_and_a_wrong_type_as_none() -> None:
    """A record from before a payload existed has none of its keys: the views are None (or empty), not
    an error; a value of another type (a hand-edited record) reads as None, and stays in `stored`."""
    old = _record(performance=None, accuracy=None, cold_start={}, loadgen={}, bricks=None, settings={}, software={})
    assert (old.perf, old.accuracy_result, old.cold, old.bricks_result, old.bricks_summary) == (None,) * 5
    assert (old.loadgen_result, old.valid, old.accuracy_values, old.accuracy_verdict) == (None, None, {}, None)
    assert old.loadgen_logs == {} and old.software_ref == payloads.ManifestRef() and old.conf_model is None
    assert old.setting_layers == [] and old.harness_settings == {} and old.software_checked == {}
    sparse = _record(performance={"result": "INVALID"}, cold_start={"load_seconds": 2})
    assert (sparse.perf.valid, sparse.perf.metric, sparse.perf.p50_latency_ns) == (False, None, None)
    assert sparse.perf.latency_percentiles() == [] and sparse.perf.throughput is None
    assert sparse.perf.tokens == token_metrics.TokenMetrics() and sparse.cold.warmup is None
    assert sparse.cold.device_memory is None
    wrong = _record(performance={"p50_latency_ns": "fast", "valid": "yes", "metric": "offline", "raw": [1]},
                    accuracy={"values": {"top1": "high", "top5": 1.0}, "checks": "none", "notes": None},
                    bricks={"summary": "none", "by_op_type": {"Conv": 1}})
    assert (wrong.perf.p50_latency_ns, wrong.perf.valid, wrong.perf.metric, dict(wrong.perf.raw)) == (None, False, None, {})
    assert wrong.perf.stored["p50_latency_ns"] == "fast" and wrong.perf.figures() == {}
    assert dict(wrong.accuracy_result.values) == {"top5": 1.0} and wrong.accuracy_result.checks == ()
    assert wrong.bricks_summary is None and wrong.bricks_result.by_op_type == ()
    for view in (payloads.Performance, payloads.AccuracyResult, payloads.ColdStart, bricks_payload.BricksResult,
                 payloads.LoadGenLog, payloads.ManifestRef):
        assert view.from_dict(None) == view() and view.from_dict("text").extra == {}
    assert token_metrics.TokenMetrics.from_dict(None) == token_metrics.TokenMetrics()


def test_the_views_are_frozen_and_leave_the_record_as_it_was() -> None:
    record = _record(bricks=copy.deepcopy(BRICKS_PART))
    before = copy.deepcopy(record.to_dict())
    perf, cold = record.perf, record.cold
    with pytest.raises(dataclasses.FrozenInstanceError):
        perf.result = "INVALID"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cold.warmup.queries = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        perf.stored["result"] = "INVALID"  # type: ignore[index]
    with pytest.raises(TypeError):
        perf.raw["Result is"] = "INVALID"  # type: ignore[index]
    with pytest.raises(TypeError):
        record.accuracy_result.values["top1"] = 1.0  # type: ignore[index]
    with pytest.raises(TypeError):
        record.bricks_result.measured[0]["median_ms"] = 0.0  # type: ignore[index]
    assert record.to_dict() == before


def test_figures_read_through_the_views_are_those_of_the_stored_dicts() -> None:
    """record_metrics.flatten reads the views: every finite number of each payload, named as before."""
    record = _record(bricks=copy.deepcopy(BRICKS_PART))
    figures = record.figures()
    expected = {f"offline.{k}": float(v) for k, v in PERFORMANCE.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
    expected |= {"accuracy.top1": 0.75, "accuracy.top5": 1.0}
    expected |= {f"coldstart.{k}": float(v) for k, v in COLD_START.items() if isinstance(v, (int, float))}
    expected |= {f"coldstart.device_{k}": float(v) for k, v in COLD_START["device_memory"].items() if isinstance(v, int)}
    expected |= {f"bricks.{k}": float(v) for k, v in BRICKS_PART["summary"].items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert figures == expected
    assert record_metrics.flatten(record.to_dict()) == figures  # a record's dict reads the same
    assert record.headline() == ("offline.samples_per_second", 812.5)


def test_run_json_and_the_stored_record_are_unchanged_by_reading(tmp_path: Path) -> None:
    """A record read, read through every view and written back is the same run.json, byte for byte,
    and the database stores the same JSON for it: the views change what readers get, not the file."""
    record = _record(bricks=copy.deepcopy(BRICKS_PART), extra={"added_later": {"kept": [1, 2]}})
    path = write_json(tmp_path / "run.json", record.to_dict())
    written = path.read_bytes()
    loaded = RunRecord.load(path)
    for name in ("perf", "accuracy_result", "cold", "bricks_result", "bricks_summary", "loadgen_logs", "model_ref",
                 "software_ref", "figures", "headline", "manifest_refs", "valid", "accuracy_values"):
        value = getattr(loaded, name)
        value() if callable(value) else value
    assert loaded == RunRecord.from_dict(json.loads(written))
    assert write_json(tmp_path / "again.json", loaded.to_dict()).read_bytes() == written
    with ResultStore(tmp_path / "db.sqlite") as store:
        store.add_run(loaded)
        (row,) = store.list_runs()
        # The database keeps the record as sorted JSON (result_store.add_run): the same text as the file's.
        assert row["record_json"] == json.dumps(json.loads(written), default=str, sort_keys=True)
        assert store.get_record(loaded.run_id).to_dict() == json.loads(written)
        assert [r["brick_key"] for r in store.conn.execute("SELECT brick_key FROM brick_measurements")] == ["k1"]


def test_the_run_summary_prints_from_the_views() -> None:
    """mlharness run's summary (commands/run.format_summary) reads the views; the lines are the dict's."""
    from mlharness.commands.run import format_summary

    record = _record(results_path="/results/x")
    lines = format_summary(record).splitlines()
    assert lines[:6] == ["null (null) Offline submission: ok", "  LoadGen result : VALID",
                         "  Samples per second : 812.5", "  p50 latency : 1.500 ms", "  p90 latency : 2.000 ms",
                         "  p99 latency : 4.000 ms"]
    assert "  cold start : resolve 250 ms, load 1.50 s, first inference 2 ms, warm-up 4 queries of 8 samples in 500 ms" \
        in lines
    assert "  memory : peak RSS 300 MiB, peak cuda:0 64 MiB allocated" in lines
    assert "  output tokens (accuracy) : client 90, server 92, the two differ for 25.0% of samples; n_tokens from " \
           "the server" in lines
    assert "  issue lag (accuracy) : p50 0.100 ms, p99 0.200 ms (client's own p99 0.000 ms)" in lines
    assert ["  LoadGen error (performance) : e1", "  LoadGen error (performance) : e2"] == \
        [line for line in lines if "LoadGen error" in line]
    assert lines[-5:] == ["  accuracy (topk) : top1=0.7500, top5=1.0000",
                          "    top1: expected 0.800000 ± 0.01, measured 0.750000: FAIL", "    output of sample 3: ok",
                          "  reference : FAIL", "  results : /results/x"]
