"""`mlharness tune`: the settings a model runs best with on this system, found by short LoadGen runs
and kept in the results database, so that later runs of the model here start from them (the settings
layer "tuned", between the model manifest and presets; `--no-tuned` skips it).

The search is coordinate descent from the manifest's defaults. One dimension at a time, each
candidate value is tried in a short LoadGen run (a run of its own, in the results tree and the
database) with the best values found so far for the other dimensions. The dimensions are the
intra-op threads, the batch size (Offline, Server), workers (Offline, Server, MultiStream) and, on ONNX
Runtime, the graph optimization level and execution mode. A dimension whose values are ordered
(threads, batch sizes) stops early on a plateau: two candidates in a row that are not better than
the best. A candidate must beat the best by more than `MIN_GAIN` to replace it, so noise alone does
not move the configuration. The outcome is then confirmed, since a short trial on a busy machine can
be far off: the start, the best, the best with the next smaller and larger batch size, and up to
`RUNNERS_UP` near-equals of the best (the start itself, when the search ends there) run again in turn
(`CONFIRM_ROUNDS` rounds, at least), each scored by its median gain over the start within a round;
the start stays unless one beats it by more than `MIN_GAIN`, and of near-equal winners the smallest
batch is kept (`parsimonious_choice`). The objective is the scenario's headline figure: Offline
samples/s (higher), SingleStream p90 and MultiStream p99 latency (lower). Server's headline, the
highest VALID rate, would take a rate search per candidate; its objective is instead the p99 latency
at the run's target_qps (lower), the tail the latency bound is judged on, at the rate the user means
to run."""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from mlharness.errors import UserError
from mlharness.records.run_record import new_run_id, utc_now
from mlharness.running.arguments import command_line
from mlharness.running.request import RunRequest
from mlharness.running.tuned import TUNABLE_SCENARIOS, tuning_key

MIN_GAIN = 0.02  # a candidate replaces the best only when better by more than this fraction
PLATEAU = 2  # an ordered dimension stops after this many candidates in a row that are not better
CONFIRM_ROUNDS = 3  # rounds of the start, the best and its runners-up that confirm a best other than the start
RUNNERS_UP = 2  # searched configurations besides the best that the confirmation rounds run too ...
RUNNER_UP_MARGIN = 0.05  # ... when their figure came within this fraction of the best's
OBJECTIVE = {"Offline": ("samples_per_second", True), "SingleStream": ("p90_latency_ns", False),
             "MultiStream": ("p99_latency_ns", False), "Server": ("p99_latency_ns", False)}


# ---- the search ------------------------------------------------------------------------------------

@dataclass
class Trial:
    settings: dict[str, Any]
    value: float | None
    run_id: str | None
    status: str
    error: str | None = None
    seconds: float = 0.0
    phase: str = "search"  # or "confirm": the rounds that confirm the best against the start

    def describe(self) -> dict[str, Any]:
        return {"settings": self.settings, "value": self.value, "run_id": self.run_id, "status": self.status,
                "error": self.error, "seconds": round(self.seconds, 3), "phase": self.phase}


@dataclass
class Search:
    scenario: str
    figure: str
    higher_is_better: bool
    trials: list[Trial] = field(default_factory=list)
    best: Trial | None = None
    start: Trial | None = None  # the starting configuration's figure: its first trial, or its confirmed one
    confirm_scores: list[dict[str, Any]] = field(default_factory=list)  # each contender's median gain over the start
    confirmed_gain: float | None = None  # the chosen configuration's score (1.0: the start); None: not confirmed

    def better(self, value: float | None, than: float | None) -> bool:
        if value is None:
            return False
        if than is None:
            return True
        gain = (value - than) / than if self.higher_is_better else (than - value) / than
        return gain > MIN_GAIN

    def gain(self, value: float, than: float) -> float:
        """How many times better `value` is than `than` by the objective's direction (above 1: better)."""
        return value / than if self.higher_is_better else than / value

    def top(self, trials: list[Trial]) -> Trial | None:
        """The trial with the best figure (by the objective's direction); None when none has one."""
        measured = [t for t in trials if t.value is not None]
        if not measured:
            return None
        return (max if self.higher_is_better else min)(measured, key=lambda t: t.value)


def dimensions(scenario: str, backend: str, cpus: int, start: dict[str, Any]) -> list[tuple[str, list[Any], bool]]:
    """(harness key, candidate values, ordered) in the order they are searched."""
    threads = sorted({1, cpus, *(2 ** k for k in range(1, 7) if 2 ** k < cpus)})
    found: list[tuple[str, list[Any], bool]] = [("intra_op_threads", threads, True)]
    if scenario in ("Offline", "Server"):
        # the model's own batch size is a candidate too (96, 128, 48...), so the walk starts from it
        batches = sorted({1, 2, 4, 8, 16, 32, 64, int(start.get("max_batch_size") or 1)})
        found.append(("max_batch_size", batches, True))
    if scenario in ("Offline", "Server", "MultiStream"):
        found.append(("workers", [1, 2], True))
    if backend == "onnxruntime":
        found.append(("graph_optimization", ["all", "extended", "basic"], False))
        found.append(("execution_mode", ["sequential", "parallel"], False))
    return found


def outward(values: list[Any], current: Any) -> list[list[Any]]:
    """An ordered dimension's candidates as two walks from `current`: the smaller values nearest first,
    and the larger ones. A current value off the scale (threads 0: the framework's choice) walks up
    from the smallest."""
    if current not in values:
        return [[], list(values)]
    at = values.index(current)
    return [values[:at][::-1], values[at + 1:]]


def starting_settings(model: Any, backend: str, scenario: str) -> dict[str, Any]:
    """What a run uses when nothing is set: the search starts here, and a candidate equal to it is not
    tried again under another spelling (threads 0 is the framework's default)."""
    from mlharness.running.settings import HARNESS_DEFAULTS

    start: dict[str, Any] = {"intra_op_threads": 0}
    if scenario in ("Offline", "Server"):
        start["max_batch_size"] = int(model.attributes.get("max_batch_size", 1))
    if scenario in ("Offline", "Server", "MultiStream"):
        start["workers"] = int(HARNESS_DEFAULTS["workers"])
    if backend == "onnxruntime":
        start |= {"graph_optimization": "all", "execution_mode": "sequential"}
    return start


def trial_request(base: RunRequest, overrides: list[str]) -> RunRequest:
    """A trial's run: the base request with the trial's settings, recording the `mlharness run` command
    that repeats it (not the tune command that started it)."""
    request = replace(base, overrides=(*base.overrides, *overrides))
    return replace(request, command=command_line(request))


def settings_key(settings: dict[str, Any]) -> str:
    """One configuration's identity in a search (its settings, in key order), for sets and dicts."""
    return json.dumps(settings, sort_keys=True)


class _Trials:
    """Runs one configuration for a search: `repeats` times (its best run counts), kept in the search's
    trials and said in one line. Called as trial(settings, runs=..., phase=...)."""

    def __init__(self, base: RunRequest, search: Search, figure: str, run_trial: Callable[[RunRequest], Any],
                 say: Callable[[str], None], repeats: int):
        self.base, self.search, self.figure = base, search, figure
        self.run_trial, self.say, self.repeats = run_trial, say, repeats
        # Offline: a trial's one query is sized to the configuration's own best rate when it has run
        # before, else to the best rate yet; the best alone would hold a slow start's confirmation runs
        # for (best / its rate) times the trial's length.
        self.rates: dict[str, float] = {}  # settings_key -> the configuration's best rate

    def __call__(self, settings: dict[str, Any], runs: int | None = None, phase: str = "search") -> Trial:
        overrides = [f"{k}={v}" for k, v in sorted(settings.items()) if v is not None]
        known = settings_key(settings)
        rate = self.rates.get(known, max(self.rates.values(), default=None))
        if self.base.scenario == "Offline" and rate:
            overrides.append(f"target_qps={rate:.6g}")  # sizes the Offline query to the trial's length
        started = time.monotonic()
        attempts: list[Trial] = []
        for _ in range(max(1, self.repeats if runs is None else runs)):
            attempts.append(self._attempt(settings, overrides))
            if attempts[-1].value is None:
                break  # a configuration that fails does not get better by trying again
        done = self.search.top(attempts) or attempts[0]
        done.seconds, done.phase = time.monotonic() - started, phase
        if self.base.scenario == "Offline" and done.value:
            self.rates[known] = max(self.rates.get(known, 0.0), done.value)
        self.search.trials.append(done)
        shown = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()) if v is not None)
        self.say(f"  trial {len(self.search.trials)}{' (confirm)' if phase == 'confirm' else ''}: {shown or 'defaults'} "
                 "-> " + (f"{done.value:,.4g} {self.figure}" if done.value is not None else f"{done.status}: {done.error}"))
        return done

    def _attempt(self, settings: dict[str, Any], overrides: list[str]) -> Trial:
        try:
            record = self.run_trial(trial_request(self.base, overrides))
        except UserError as exc:
            return Trial(dict(settings), None, getattr(getattr(exc, "record", None), "run_id", None), "failed",
                         str(exc).splitlines()[0])  # whole: a cut would lose the end of a long path
        value = record.perf.figure(self.figure) if record.perf else None
        return Trial(dict(settings), value, record.run_id,
                     "ok" if value is not None else "no figure")


def run_search(base: RunRequest, start: dict[str, Any], backend: str, cpus: int,
               run_trial: Callable[[RunRequest], Any], say: Callable[[str], None] = print,
               repeats: int = 1) -> Search:
    """Coordinate descent over `dimensions` from `start` (the settings the untuned run would use);
    `run_trial` runs one request and returns its record (raises on a failed run). Each configuration
    runs `repeats` times and counts its best run: on a shared machine other work only slows a run."""
    if base.scenario not in TUNABLE_SCENARIOS:
        raise UserError(f"--scenario {base.scenario}: tune searches {', '.join(TUNABLE_SCENARIOS)}")
    figure, higher = OBJECTIVE[base.scenario]
    search = Search(base.scenario, f"{base.scenario.lower()}.{figure}", higher)
    trial = _Trials(base, search, figure, run_trial, say, repeats)
    current = dict(start)
    search.best = search.start = trial(current)
    if search.best.value is None:
        raise UserError(f"tune: the starting configuration failed: {search.best.error}")
    tried = {settings_key(current)}
    searched = dimensions(base.scenario, backend, cpus, start)
    for key, values, ordered in searched:
        current = walk_dimension(search, trial, key, values, ordered, current, tried)
    # Confirmed even when the search ends where it began: a near-equal of the start, or its batch-size
    # neighbour, may be ahead by less than one short trial can show (mobilenet-v2's batch 4 against
    # the manifest's 8, docs/tuning.md).
    batches = next((values for key, values, _ in searched if key == "max_batch_size"), [])
    contenders = contenders_of(search, start, batches)
    if len(contenders) > 1:
        confirm(search, contenders, trial, max(CONFIRM_ROUNDS, repeats))
    return search


def walk_dimension(search: Search, trial: Callable[[dict[str, Any]], Trial], key: str, values: list[Any],
                   ordered: bool, current: dict[str, Any], tried: set[str]) -> dict[str, Any]:
    """Try one dimension's values with the best of the others (`current`); returns the best configuration
    after it. An ordered dimension is walked outward from the current value, a step down and a step up in
    turn, each direction ending on a plateau: from batch 8 the neighbours 4 and 16 come first (walking up
    from 1 ended at 2 before 4 was ever tried). An unordered one tries every value. `tried` holds the
    configurations run so far (JSON), which are not run again."""
    assert search.best is not None
    directions = outward(values, current.get(key)) if ordered else [list(values)]
    misses = [0] * len(directions)
    while any(directions):
        for way, queue in enumerate(directions):
            if not queue:
                continue
            candidate = dict(current, **{key: queue.pop(0)})
            fingerprint = settings_key(candidate)
            if fingerprint in tried:
                continue
            tried.add(fingerprint)
            result = trial(candidate)
            if search.better(result.value, search.best.value):
                search.best, current, misses[way] = result, candidate, 0
            else:
                misses[way] += 1
                if ordered and misses[way] >= PLATEAU:
                    queue.clear()
    return current


def batch_neighbours(search: Search, batches: list[int]) -> list[dict[str, Any]]:
    """The best configuration with the next smaller and the next larger batch size (`batches`, the
    searched values), unless that configuration failed in the search. Throughput flattens near its
    best batch size, so the neighbours are near-equals by nature, and a single short trial of one
    of them, taken in a slow spell, would otherwise keep it out of the confirmation."""
    assert search.best is not None
    batch = search.best.settings.get("max_batch_size")
    if batch not in batches:
        return []
    failed = {settings_key(t.settings) for t in search.trials if t.value is None}
    at = batches.index(batch)
    steps = [batches[i] for i in (at - 1, at + 1) if 0 <= i < len(batches)]
    found = [dict(search.best.settings, max_batch_size=step) for step in steps]
    return [settings for settings in found if settings_key(settings) not in failed]


def runners_up(search: Search, start: dict[str, Any]) -> list[dict[str, Any]]:
    """Up to RUNNERS_UP searched configurations, best first, other than the start and the best, whose
    figure came within RUNNER_UP_MARGIN of the best's: near-equals that one short trial cannot order."""
    assert search.best is not None and search.best.value is not None
    best, chosen, seen = search.best.value, [], {settings_key(start),
                                                  settings_key(search.best.settings)}
    close = [t for t in search.trials if t.phase == "search" and t.value is not None
             and abs(t.value - best) <= RUNNER_UP_MARGIN * best]
    for t in sorted(close, key=lambda t: t.value, reverse=search.higher_is_better):
        fingerprint = settings_key(t.settings)
        if fingerprint not in seen and len(chosen) < RUNNERS_UP:
            seen.add(fingerprint)
            chosen.append(t.settings)
    return chosen


def contenders_of(search: Search, start: dict[str, Any], batches: list[int]) -> list[dict[str, Any]]:
    """What the confirmation runs: the start, the best, the best's batch-size neighbours and its
    runners-up, each once."""
    assert search.best is not None
    found: list[dict[str, Any]] = []
    for settings in (start, search.best.settings, *batch_neighbours(search, batches), *runners_up(search, start)):
        if settings not in found:
            found.append(settings)
    return found


def confirm(search: Search, contenders: list[dict[str, Any]], trial: Callable[..., Trial], rounds: int) -> None:
    """Run the contenders (the start first, then the best: contenders_of) in turn, one run each a round,
    each round in another order. Each is scored by the median over the rounds of its figure against the
    start's in the same round: a machine whose speed changes for seconds at a time (docs/tuning.md, "This
    machine's two speeds") moves one round's runs together, so a ratio within a round holds where the
    figures of runs far apart do not. The start is kept unless a contender beats it by more than MIN_GAIN;
    of those that do, parsimonious_choice picks. The chosen configuration's figure becomes its best
    confirmation run."""
    assert search.best is not None
    runs: list[list[Trial]] = [[] for _ in contenders]
    for round_number in range(rounds):
        for offset in range(len(contenders)):
            which = (round_number + offset) % len(contenders)
            runs[which].append(trial(contenders[which], runs=1, phase="confirm"))

    def score(which: int) -> float | None:
        """The median of this contender's gain over the start, round by round (1.0: as fast)."""
        ratios = [search.gain(mine.value, theirs.value) for mine, theirs in zip(runs[which], runs[0])
                  if mine.value and theirs.value]  # a run without a figure (or a zero one) has no ratio
        return statistics.median(ratios) if ratios else None

    scores = [score(which) for which in range(len(contenders))]
    search.start = search.top(runs[0]) or search.start
    search.confirm_scores = [{"settings": contenders[which], "score": scores[which]} for which in range(len(contenders))]
    chosen = parsimonious_choice(contenders, scores)
    search.best = search.top(runs[chosen]) or search.start
    search.confirmed_gain = scores[chosen]


def parsimonious_choice(contenders: list[dict[str, Any]], scores: list[float | None]) -> int:
    """Which contender to keep (0: the start, whose score is 1.0). None beats the start by more than
    MIN_GAIN: the start. Else, of those that do and come within MIN_GAIN of the top score, which
    the rounds cannot order, the one with the smallest batch size (the higher score among equal
    ones): at the same speed a smaller batch holds less memory and answers each sample sooner, and
    past the best batch size a plain loop's throughput falls (mobilenet-v2: docs/tuning.md). As model
    selection's one-standard-error rule: the simplest choice within noise of the best."""
    ahead = [which for which in range(1, len(contenders))
             if scores[which] is not None and scores[which] > 1.0 + MIN_GAIN]
    if not ahead:
        return 0
    top = max(scores[which] for which in ahead)
    tied = [which for which in ahead if top / scores[which] <= 1.0 + MIN_GAIN]
    return min(tied, key=lambda which: (contenders[which].get("max_batch_size") or 0, -scores[which]))


def tune(base: RunRequest, say: Callable[[str], None] = print, repeats: int = 2) -> dict[str, Any]:
    """Search, store the best configuration in the results database and return what was stored."""
    from mlharness.running import system as system_mod
    from mlharness.running.launcher import run_request
    from mlharness.running.progress import Ticker, quiet_from_env
    from mlharness.running.resolve import resolve_manifests, resolved_for_run
    from mlharness.store import result_store

    base = resolved_for_run(base)  # the trials' recorded commands name the environment settings they ran with
    model, backend, _, hardware, _, _ = resolve_manifests(base)
    detected = system_mod.detect_system()
    system_name = system_mod.system_name(detected, hardware.device)
    key = tuning_key(model, system_name, backend, system_mod.software_versions(), base.scenario)
    start = starting_settings(model, backend, base.scenario)
    say(f"tuning {model.name} ({backend}) {base.scenario} on {system_name}: a coordinate search in short runs")
    status = {"trials": 0, "running_since": None}

    def read() -> Any:
        from mlharness.running.progress import Snapshot, clock

        since = status["running_since"]
        return Snapshot(status["trials"], None, None,
                        f"trial {status['trials'] + 1} running for {clock(time.monotonic() - since)}" if since else "")

    def run_trial(request: RunRequest) -> Any:
        status["running_since"] = time.monotonic()
        try:
            return run_request(replace(request, quiet=True))
        finally:
            status["trials"] += 1
            status["running_since"] = None

    with Ticker(f"tune {model.name} {base.scenario}", read, "trials", quiet=base.quiet or quiet_from_env()):
        search = run_search(base, start, backend, len(os.sched_getaffinity(0)), run_trial, say, repeats)
    assert search.best is not None
    tuning_id = new_run_id()
    best = {k: v for k, v in search.best.settings.items() if v is not None}
    with result_store.ResultStore(result_store.default_db_path(base.results_dir)) as store:
        store.put_tuned(key, best, search.figure, search.best.value, [t.describe() for t in search.trials],
                        tuning_id, utc_now())
    return {"key": key, "settings": best, "figure": search.figure, "value": search.best.value,
            "start_value": search.start.value if search.start else None, "trials": [t.describe() for t in search.trials],
            "confirm_scores": search.confirm_scores, "confirmed_gain": search.confirmed_gain,
            "tuning_id": tuning_id}
