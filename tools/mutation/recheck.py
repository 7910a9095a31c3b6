"""Re-test a finished run's survivors against the code and tests of another revision (usually the current one).

A survivor's verdict "killed by a test written after the run" rests on this: its change is applied alone to a copy
of the module's tree at `--rev` (the run's own `prepare_tree`), the tests run there (stopping at the first
failure), and the file is put back. A survivor whose lines are no longer in the code at `--rev` is "not applied"
(judge it by hand). The tests must pass without any change first. The result goes to recheck.json in that copy,
a line each is printed.

    .venv/bin/python tools/mutation/recheck.py --run build/mutation/6f9d8a4/submission --module submission \\
        --rev HEAD [--mutants GLOB ...] [--tests NODEID ...] [--jobs N]
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (the driver beside this file)

KILLED, SURVIVED, NOT_APPLIED = "killed", "survived", "not applied"


def apply_change(source: str, diff: str) -> str | None:
    """`source` with the diff's one hunk applied (its context and removed lines replaced by its context and added
    lines), or None when those lines are not found exactly once."""
    body = [line for line in diff.splitlines() if not line.startswith(("---", "+++", "@@"))]
    # mutmut shows a method's lines dedented by its class's indentation: tried as shown, then one level in.
    for indent in ("", "    "):
        before = "\n".join(_indented(indent, line[1:]) for line in body if line[:1] in (" ", "-"))
        after = "\n".join(_indented(indent, line[1:]) for line in body if line[:1] in (" ", "+"))
        if before and source.count(before) == 1:
            return source.replace(before, after)
    return None


def _indented(indent: str, line: str) -> str:
    return indent + line if line.strip() else line


def recheck(tree: Path, diffs: dict[str, str], tests: list[str], jobs: int = 1) -> dict[str, str]:
    """Each mutant's verdict in `tree` (a module's tree from prepare_tree), applied alone; with `jobs` > 1,
    that many copies of the tree each take their share of the mutants, side by side."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    baseline = subprocess.run(command, cwd=tree, env=_env(tree), capture_output=True, text=True)
    if baseline.returncode != 0:  # a verdict needs tests that pass without the change
        sys.exit(f"{tree}: the tests fail without any change (exit {baseline.returncode}); output ends:\n"
                 f"{baseline.stdout[-2000:]}")
    trees = [tree] + [tree.with_name(f"{tree.name}-{i}") for i in range(1, jobs)]
    for copy in trees[1:]:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(tree, copy, symlinks=True)
    names = list(diffs)
    with ThreadPoolExecutor(len(trees)) as pool:
        shares = pool.map(lambda i: _recheck_in(trees[i], {n: diffs[n] for n in names[i::len(trees)]}, command),
                          range(len(trees)))
        verdicts = {name: verdict for share in shares for name, verdict in share.items()}
    for copy in trees[1:]:
        shutil.rmtree(copy, ignore_errors=True)
    return {name: verdicts[name] for name in names}


def _env(tree: Path) -> dict[str, str]:
    """The tests' environment: this tree's package first, and no bytecode written. A .pyc is trusted while its
    source's size and mtime (whole seconds) match, and a mutant of the same size written within the second of
    the last compile would run the old code."""
    return dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")


def _forget_bytecode(source: Path) -> None:
    """Remove the source's cached .pyc, written before these runs (they write none: `_env`)."""
    for cached in (source.parent / "__pycache__").glob(f"{source.stem}.*.pyc"):
        cached.unlink()


def _recheck_in(tree: Path, diffs: dict[str, str], command: list[str]) -> dict[str, str]:
    """The verdicts of these mutants, one after the other in this tree."""
    verdicts: dict[str, str] = {}
    env = _env(tree)
    for name, diff in diffs.items():
        target = tree / diff.splitlines()[0].removeprefix("--- ").strip()
        original = target.read_text()
        changed = apply_change(original, diff)
        if changed is None:
            verdicts[name] = NOT_APPLIED
        else:
            _forget_bytecode(target)  # one written before (the run's, or an import outside these tests)
            try:
                target.write_text(changed)
                done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
            finally:
                target.write_text(original)
            # A test process the change crashed (a signal: a segfault in the C extension) detected it, as
            # mutmut counts it; any other exit but 0 and 1 is not a verdict: the tests could not run.
            if done.returncode > 1:
                raise SystemExit(f"{name}: pytest exited {done.returncode}; its output ends:\n{done.stdout[-2000:]}")
            verdicts[name] = SURVIVED if done.returncode == 0 else KILLED
        print(f"{verdicts[name]:<12}{name}", flush=True)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    modules = run.load_modules()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="the run's tree (build/mutation/<rev>/<module>)")
    parser.add_argument("--module", required=True, choices=sorted(modules))
    parser.add_argument("--rev", default="HEAD", help="the revision whose code and tests judge (default: HEAD)")
    parser.add_argument("--mutants", action="append", default=[], metavar="GLOB", help="only these survivors")
    parser.add_argument("--tests", action="append", default=[], metavar="NODEID",
                        help="the tests to run (default: the module's selection at --rev)")
    parser.add_argument("--deselect", action="append", default=[], metavar="NODEID",
                        help="leave out a test of the default selection (as for run.py)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested side by side, each in its own copy of the tree")
    args = parser.parse_args(argv)
    found = run.collect(args.run)
    diffs = {name: diff for name, diff in found["diffs"].items() if found["statuses"][name] == "survived"
             and (not args.mutants or any(fnmatch.fnmatch(name, p) for p in args.mutants))}
    rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=run.REPO, check=True, capture_output=True,
                         text=True).stdout.strip()
    if (run.OUT / rev / args.module).resolve() == args.run.resolve():
        sys.exit(f"--rev {args.rev}: the run's own revision; its tree is the run's, which this would replace")
    tree, selected = run.prepare_tree(args.module, modules[args.module], rev, [])
    tests = args.tests or selected + [f"--deselect={node}" for node in args.deselect]
    verdicts = recheck(tree, diffs, tests, max(1, args.jobs))
    (tree / "recheck.json").write_text(json.dumps({"run": str(args.run), "rev": rev, "tests": tests,
                                                   "verdicts": verdicts}, indent=2, sort_keys=True) + "\n")
    counts = {v: list(verdicts.values()).count(v) for v in (KILLED, SURVIVED, NOT_APPLIED)}
    print(f"{len(verdicts)} survivors at {rev}: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
