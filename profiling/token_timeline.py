"""The timeline of a generative model's LoadGen test (issue 19): each sequence's prefill and decode on a
track per batch slot, the engine's forward steps with the batch size at each, the scheduler's waits and
admissions, and each sample's time split into prefill, decode and harness.

All of it is derived after the test from what the token SUT keeps anyway (mlharness.sut.llm.token_sut: every
sample's issue, hand-off, token and completion stamps, the scheduler's waits and admissions) and from the
batch engine's own record of its steps (`session.steps`, one list append a step), so nothing runs on the
token path while the test is measured.

Where the engine records its steps, a sequence's phases are on the engine's clock: its prefill runs from
the start of the step that made its first token to that step's end, its decode from there to the end of the
step that made its last token (a token belongs to the last step that ended before the SUT was handed it).
The engine may hold a handed-off sequence in its own queue (transformers' manager admits at every step by
itself), and its dispatcher hands tokens over after the step: both are harness time. Where the engine keeps
no steps (one sequence at a time, in its own loop), the phases are the SUT's stamps: prefill from the
hand-off (`admitted`) to the first token, decode from there to the last."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Sequence

from mlharness.records.token_metrics import Step, measured_steps, sample_clock
from mlharness.profiling.stats import stage_stats
from mlharness.profiling.tracer import AsyncSpan, CounterSample, LevelResult, Span

TRACK = "sequences"
SCHEDULER_TID, STEPS_TID, FIRST_SLOT_TID = 1, 2, 100
IDLE_NS = 10_000_000  # the batch-size counter drops to 0 when the engine did not step for this long
SPLIT = ("prefill", "decode", "harness")
HARNESS_PARTS = ("sut_queue", "engine_queue", "response")
SPLIT_BASIS = ("each sample's time on the SUT's clock, from issue_query to QuerySamplesComplete's return; "
               "prefill: the engine's steps from its first for the sample to the one that made its first token; "
               "decode: from there to the step that made its last token; harness: the rest (sut_queue: waiting "
               "for the SUT's scheduler; engine_queue: handed to the engine, waiting for room in its batch; "
               "response: from the engine's last token to QuerySamplesComplete's return)")


@dataclass(frozen=True)
class Phases:
    """One completed sample's times (perf_counter_ns); `n` is its completion order. `first` and `last` are
    when the engine made the first and last token; `first_seen` when the SUT was handed the first."""

    n: int
    sample: int
    issued: int
    admitted: int  # handed to the engine by the SUT
    started: int  # the engine began its prefill
    first: int
    last: int
    completed: int
    tokens: int
    first_seen: int

    def parts(self) -> dict[str, int]:
        return {"sample": self.completed - self.issued, "prefill": self.first - self.started,
                "decode": self.last - self.first, "sut_queue": self.admitted - self.issued,
                "engine_queue": self.started - self.admitted, "response": self.completed - self.last,
                "harness": (self.started - self.issued) + (self.completed - self.last)}


def phases(times: Sequence[Any], steps: Sequence[Step]) -> list[Phases]:
    """Each sample that made tokens, its phases on the engine's steps where it keeps them (module doc)."""
    ends = [end for _, end, _, _ in steps]
    out = []
    for n, clock in enumerate(times):
        if not clock.tokens:
            continue
        admitted, started, first, last = sample_clock(clock.issued, clock.admitted, clock.tokens, steps, ends)
        out.append(Phases(n, clock.index, clock.issued, admitted, started, first, last,
                          clock.completed or clock.tokens[-1], len(clock.tokens), clock.tokens[0]))
    return out


def assign_slots(sequences: Sequence[Phases]) -> dict[int, int]:
    """A track per batch slot: each sequence (prefill start to last token) takes the lowest slot free then."""
    slots: dict[int, int] = {}
    busy: list[tuple[int, int]] = []  # (last token, slot)
    free: list[int] = []
    opened = 0
    for seq in sorted(sequences, key=lambda s: (s.started, s.last)):
        while busy and busy[0][0] <= seq.started:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            slot = heapq.heappop(free)
        else:
            slot, opened = opened, opened + 1
        slots[seq.n] = slot
        heapq.heappush(busy, (seq.last, slot))
    return slots


def time_split(sequences: Sequence[Phases]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the split of all samples' time into prefill, decode and harness, per-stage percentiles)."""
    per_part = {name: [seq.parts()[name] for seq in sequences] for name in ("sample", *SPLIT, *HARNESS_PARTS)}
    stages = {name: stage_stats(values) for name, values in per_part.items()}
    total = sum(per_part["sample"])
    split: dict[str, Any] = {"basis": SPLIT_BASIS, "samples": len(sequences), "sample_total_ms": round(total / 1e6, 3)}
    for name in (*SPLIT, *HARNESS_PARTS):
        stats = stages[name]
        split[name] = {"total_ms": round(sum(per_part[name]) / 1e6, 3),
                       "share": round(sum(per_part[name]) / total, 4) if total else None,
                       **{k: stats[k] for k in ("p50_ms", "p90_ms", "p99_ms") if k in stats}}
    return split, stages


def _step_name(sequences: int, prefilling: int) -> str:
    if not prefilling:
        return "decode step"
    return "prefill step" if prefilling >= sequences else "prefill+decode step"


def batch_counter(sequences: Sequence[Phases], steps: Sequence[Step]) -> list[CounterSample]:
    """The batch size over the test: each engine step's sequences from its start (0 once the engine idles),
    or, for an engine that records no steps, the sequences between prefill start and last token."""
    samples = []
    if steps:
        for i, (start, end, size, _) in enumerate(steps):
            samples.append(CounterSample("batch_size", start, {"sequences": size}, TRACK))
            if i + 1 == len(steps) or steps[i + 1][0] - end > IDLE_NS:
                samples.append(CounterSample("batch_size", end, {"sequences": 0}, TRACK))
        return samples
    changes = sorted([(seq.started, 1) for seq in sequences] + [(seq.last, -1) for seq in sequences])
    running = 0
    for when, change in changes:  # ends before starts at the same time: -1 sorts first
        running += change
        if samples and samples[-1].ts_ns == when:
            samples[-1] = CounterSample("batch_size", when, {"sequences": running}, TRACK)
        else:
            samples.append(CounterSample("batch_size", when, {"sequences": running}, TRACK))
    return samples


def collect(sut: Any, level: str = "harness") -> LevelResult:
    """The token SUT's records after its test, as spans, async spans, a counter and a summary."""
    times = list(sut.times)
    first_issue = min((clock.issued for clock in times), default=0)
    steps = measured_steps(getattr(sut, "engine_steps", None), first_issue)
    sequences = phases(times, steps)
    slots = assign_slots(sequences)
    spans: list[Span] = []
    queued: list[AsyncSpan] = []
    for seq in sequences:
        tid = FIRST_SLOT_TID + slots[seq.n]
        args = {"sample": seq.sample, "tokens": seq.tokens, "n": seq.n}
        spans.append(Span("sequence", seq.started, seq.last, tid, args, TRACK))
        spans.append(Span("prefill", seq.started, seq.first, tid,
                          {"sample": seq.sample, "first_token_handed_over_us": round((seq.first_seen - seq.first) / 1e3, 3)},
                          TRACK))
        if seq.last > seq.first:
            spans.append(Span("decode", seq.first, seq.last, tid, {"sample": seq.sample, "tokens": seq.tokens - 1}, TRACK))
        queued.append(AsyncSpan("sample", seq.issued, seq.completed, seq.n, {**args, "slot": slots[seq.n]}, TRACK))
        if seq.started > seq.issued:
            queued.append(AsyncSpan("queued", seq.issued, seq.started, seq.n, {"sample": seq.sample}, TRACK))
    for start, end in sut.waits_ns:
        spans.append(Span("scheduler_wait", start, end, SCHEDULER_TID, {}, TRACK))
    for when, running, admitted in sut.admissions:
        spans.append(Span("admit", when, when, SCHEDULER_TID, {"running": running, "admitted": admitted}, TRACK))
    prefilling: dict[int, int] = {}
    for seq in sequences:
        prefilling[seq.started] = prefilling.get(seq.started, 0) + 1
    step_sizes, decode_sizes = [], []
    for start, end, size, query_tokens in steps:
        count = prefilling.get(start, 0)
        spans.append(Span(_step_name(size, count), start, end, STEPS_TID,
                          {"sequences": size, "prefilling": count, "query_tokens": query_tokens}, TRACK))
        step_sizes.append(size)
        if count < size:
            decode_sizes.append(size)
    if not steps:  # one sequence at a time, or an engine that keeps no steps: each token is its sequence's step
        decode_sizes = [1] * sum(seq.tokens - 1 for seq in sequences) if sut.batching == "sequential" else []
    split, stages = time_split(sequences)
    used_slots = sorted(set(slots.values()))
    summary: dict[str, Any] = {
        "generative": True, "batching": sut.batching, "max_batch_size": sut.max_batch_size,
        "sequences": len(sequences), "tokens": sum(seq.tokens for seq in sequences), "slots": len(used_slots),
        "engine_steps": _steps_summary(sut, steps, step_sizes, decode_sizes),
        "scheduler": {"waits": len(sut.waits_ns), "wait_total_ms": round(sum(e - s for s, e in sut.waits_ns) / 1e6, 3),
                      "admissions": len(sut.admissions)},
        "time_split": split, "stages": stages,
    }
    names = {(TRACK, FIRST_SLOT_TID + slot): f"batch slot {slot}" for slot in used_slots}
    if sut.waits_ns or sut.admissions:
        names[(TRACK, SCHEDULER_TID)] = "scheduler (waits, admissions)"
    if steps:
        names[(TRACK, STEPS_TID)] = "engine steps"
    return LevelResult(level, "ok", spans=spans, async_spans=queued, counters=batch_counter(sequences, steps),
                       summary=summary, thread_names=names)


def _steps_summary(sut: Any, steps: Sequence[Any], sizes: list[int], decode_sizes: list[int]) -> dict[str, Any]:
    if steps:
        source = "the engine's record of its forward steps"
    elif sut.batching == "sequential":
        source = "one sequence at a time: each token is a step of batch size 1"
    else:
        source = "not recorded by this engine: the counter is the sequences between prefill start and last token"
    figures: dict[str, Any] = {"source": source, "steps": len(steps),
                               "busy_ms": round(sum(end - start for start, end, _, _ in steps) / 1e6, 3)}
    if decode_sizes:
        figures.update(decode_steps=len(decode_sizes), decode_batch_size_mean=round(sum(decode_sizes) / len(decode_sizes), 3),
                       decode_batch_size_max=max(decode_sizes))
    if sizes:
        figures["batch_size_max"] = max(sizes)
    return figures
