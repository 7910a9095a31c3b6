"""`mlharness tune MODEL --scenario S`: search the settings a model runs best with on this system and
store them for later runs (mlharness.running.tuning)."""
from __future__ import annotations

import argparse
import shlex

from mlharness.errors import UserError
from mlharness.running.arguments import add_request_arguments, request_fields
from mlharness.running.request import RunRequest
from mlharness.tables import format_table

# The trial runs' length: short, but long enough for a stable figure (--set overrides either).
TRIAL_SETTINGS = {"Offline": ("min_query_count=1",), "SingleStream": ("min_query_count=64",),
                  "MultiStream": ("min_query_count=16",), "Server": ("min_query_count=64",)}
MIN_TRIAL_SECONDS, MAX_TRIAL_SECONDS = 0.001, 86400.0


def cmd_tune(args: argparse.Namespace) -> int:
    from mlharness.running.tuned import settings_text, trial_status
    from mlharness.running.tuning import MIN_GAIN, tune

    # A trial's min_duration is whole ms: under 1 ms (or nan) is no trial at all, over a day no search.
    if not MIN_TRIAL_SECONDS <= args.trial_seconds <= MAX_TRIAL_SECONDS:
        raise UserError(f"--trial-seconds: expected a number of seconds from {MIN_TRIAL_SECONDS:g} to "
                        f"{MAX_TRIAL_SECONDS:g}, got {args.trial_seconds:g}")
    if args.repeats < 1:
        raise UserError(f"--repeats: expected a number of runs >= 1, got {args.repeats}")
    fields = request_fields(args)
    trial = (f"min_duration={int(args.trial_seconds * 1000)}", *TRIAL_SETTINGS.get(args.scenario, ()))
    argv = getattr(args, "argv", None) or []
    base = RunRequest(**(fields | {"model": args.model, "scenario": args.scenario, "mode": "performance",
                                   "use_tuned": False, "overrides": [*trial, *fields.get("overrides", [])],
                                   "command": shlex.join(["mlharness", *argv]) if argv[:1] == ["tune"] else ""}))
    found = tune(base, repeats=args.repeats)
    rows = [(i, settings_text(t["settings"]) or "defaults", t["value"], trial_status(t), t["run_id"])
            for i, t in enumerate(found["trials"], 1)]
    print(format_table(("trial", "settings", found["figure"], "status", "run id"), rows))
    if found.get("confirm_scores"):
        scores = "; ".join(settings_text(c["settings"]) + ": " + (f"{c['score']:.3f}" if c["score"] is not None else "failed")
                           for c in found["confirm_scores"])
        print(f"confirmation, median gain over the start within a round: {scores} (kept: the start unless one "
              f"is {MIN_GAIN:.0%} ahead; of those within {MIN_GAIN:.0%} of the top score, the smallest batch)")
    best = settings_text(found["settings"]) or "the defaults"
    start, value, gain = found["start_value"], found["value"], found.get("confirmed_gain")
    # Confirmed: the median gain within a round, which the choice was made on (best runs of different
    # rounds can even disagree in sign with it); else the search's figures.
    change = (f" ({100 * (gain - 1):+.1f}% against the starting configuration, the median within a round)"
              if gain is not None else f" ({100 * (value - start) / start:+.1f}% against the starting configuration)"
              if start else "")
    print(f"best: {best}: {value:,.6g} {found['figure']}{change}")
    print(f"stored as tuning {found['tuning_id']}: later runs of {found['key']['model']} {args.scenario} on "
          f"{found['key']['system_name']} start from it (--no-tuned to ignore it)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tune", help="search batch size, threads and session options; later runs use the best")
    parser.add_argument("model", help="model manifest name or path")
    parser.add_argument("--scenario", required=True, choices=("Offline", "SingleStream", "MultiStream", "Server"),
                        help="Server: the p99 latency at the run's target_qps is minimised; set the rate you "
                             "mean to run at (--set target_qps=QPS)")
    parser.add_argument("--trial-seconds", type=float, default=3.0, metavar="SECONDS",
                        help="min_duration of each trial run (default 3; from 0.001 to 86400)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs per configuration, the best counts (default 2; other work only slows a run)")
    add_request_arguments(parser, ["--dataset", "--backend", "--software", "--hardware", "--results-dir", "--set",
                                   "--quiet", "--timeout"])
    parser.set_defaults(func=cmd_tune)
