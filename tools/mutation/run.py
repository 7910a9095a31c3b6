"""`make mutation`: mutation-test the core modules with mutmut and report killed/survived per module.

Each module is mutated in its own copy of the tree (build/mutation/work/<module>/, or
build/mutation/<rev>/<module>/ with --rev), so the checkout is never changed and modules can be
re-run alone (--module). Results: a table on stdout, build/mutation/work/scores.json (every module
measured so far), and each module's surviving mutants as diffs in
build/mutation/work/<module>/survivors.diff (read them: kill each with a test or explain it in
docs/testing.md)."""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomllib

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
OUT = REPO / "build" / "mutation"
SCHEMA_VERSION = 1
# The packages a run imports; copied whole into each module's tree next to the mutated file. The tree
# holds the namespace as plain folders (mlharness/, mlharness/sut/, ...): mutmut names a mutant by its
# file's path, and that must be the module's own name (mlharness.sut.x), which the tests import from
# the tree (first on sys.path; the launcher puts it on a run's path) rather than the editable install.
# specs/ and scenarios/ are also copied where the checkout has them: tests read the shipped manifests
# and presets by the repository's paths (REPO / "specs"), and without them the manifests module's
# selection failed before mutating anything.
# README.md too: test_api runs the README's example as written.
PACKAGES = ["mlharness", "native", "setup.py", "bench", "specs", "scenarios", "README.md"]
NAMESPACE = {"harness": "mlharness", "sut": "mlharness/sut", "specs": "mlharness/specs",
             "profiling": "mlharness/profiling", "scenarios": "mlharness/scenarios"}


def in_namespace(path: str) -> str:
    """A checkout path (sut/x.py) as its place in the tree's namespace folders (mlharness/sut/x.py)."""
    head, _, rest = path.partition("/")
    return f"{NAMESPACE[head]}/{rest}" if head in NAMESPACE else path


def file_of_test(test: str) -> str:
    """The file of a module's test entry: a path, or a pytest node id (path::name)."""
    return test.split("::")[0]


def load_modules() -> dict[str, dict[str, list[str]]]:
    modules = tomllib.loads((HERE / "modules.toml").read_text())
    for name, entry in modules.items():
        for path in entry["files"] + [file_of_test(test) for test in entry["tests"]]:
            if not (REPO / path).exists():
                sys.exit(f"tools/mutation/modules.toml: {name}: {path} does not exist")
    return modules


def mutmut_config(files: list[str], tests: list[str], deselect: list[str]) -> dict[str, Any]:
    """[tool.mutmut] of a module's tree: its files (in the namespace), its tests, the bridge plugin."""
    return {
        "source_paths": [in_namespace(path) for path in files],
        "also_copy": PACKAGES,
        "pytest_add_cli_args": ["-p", "mutation_bridge", *(f"--deselect={test}" for test in deselect)],
        "pytest_add_cli_args_test_selection": tests,
        # A mutant that stops responses makes a LoadGen test wait: call it a timeout at 4x the
        # selected tests' clean time (+10 s for a shared machine), not mutmut's default 15x.
        "timeout_multiplier": 4.0,
        "timeout_constant": 10.0,
        # Each mutant's worker forked from a process that only imported the tests, not from the one
        # that ran them all for the stats: GNU OpenMP (torch's libgomp, which llama.cpp's ggml also
        # loads) keeps a thread pool that a forked child does not have, and the child's first parallel
        # region then waits for it for ever (seen: llama_decode in gomp_team_barrier_wait_end), which
        # mutmut filed as a timeout.
        "process_isolation": "forkserver",
    }


def prepare_tree(name: str, entry: dict[str, list[str]], rev: str | None,
                 deselect: list[str]) -> tuple[Path, list[str]]:
    """A copy of the tracked files (as in the working tree, or at commit `rev`) plus the built
    extension, configured for this module; returns it and the selected tests that exist there."""
    tree = OUT / (rev or "work") / name
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    if rev:
        archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    else:
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout
        for rel in filter(None, tracked.decode().split("\0")):
            source = REPO / rel
            if source.is_file():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, tree / rel)
        for rel in {file_of_test(test) for test in entry["tests"]}:  # a new test file not yet added to git
            shutil.copy2(REPO / rel, tree / rel)
    tests = [t for t in entry["tests"] if (tree / file_of_test(t)).is_file()]
    for built in (REPO / "sut").glob("_native*.so"):
        shutil.copy2(built, tree / "sut" / built.name)
    # The namespace as plain folders beside the checkout's (tests read specs/ and the rest as data there).
    shutil.copytree(tree / "harness", tree / "mlharness")
    for folder in ("sut", "specs", "profiling", "scenarios"):
        shutil.copytree(tree / folder, tree / NAMESPACE[folder])
    config = mutmut_config(entry["files"], tests, deselect)
    with open(tree / "pyproject.toml", "a") as pyproject:
        pyproject.write("\n[tool.mutmut]\n")
        pyproject.writelines(f"{key} = {json.dumps(value)}\n" for key, value in config.items())
    return tree, tests


def run_mutmut(tree: Path, children: int, only: list[str]) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    started = time.monotonic()
    with open(tree / "mutmut.log", "w") as log:
        done = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *only],
                              check=False, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = (tree / "mutmut.log").read_text(errors="replace")[-2000:]
        sys.exit(f"mutmut failed in {tree} (exit {done.returncode}); end of mutmut.log:\n{tail}")
    return time.monotonic() - started


REPORT = r"""
import json, sys
from mutmut.__main__ import collect_source_file_mutation_data
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
statuses, diffs = {}, {}
for path, data in collect_source_file_mutation_data(mutant_names=())[1].items():
    for mutant, code in data.exit_code_by_key.items():
        status = status_by_exit_code[code]
        statuses[mutant] = status
        if status not in ("killed", "timeout", "segfault"):
            diffs[mutant] = get_diff_for_mutant(mutant, path=path)
json.dump({"statuses": statuses, "diffs": diffs}, sys.stdout)
"""


def collect(tree: Path) -> dict[str, object]:
    """Statuses of every mutant, read with mutmut's own functions in the module's tree."""
    env = dict(os.environ, PYTHONPATH=str(HERE))
    done = subprocess.run([sys.executable, "-c", REPORT], cwd=tree, env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout)


def select_mutants(found: dict[str, Any], patterns: list[str]) -> dict[str, Any]:
    """The statuses and diffs of the mutants whose names match one of `patterns` (as mutmut matches them)."""
    keep = {name for name in found["statuses"] if any(fnmatch.fnmatch(name, p) for p in patterns)}
    return {"statuses": {n: s for n, s in found["statuses"].items() if n in keep},
            "diffs": {n: d for n, d in found["diffs"].items() if n in keep}}


_STRING = re.compile(r"""[fFrRbB]?("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")
_SQL_WORD = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|FROM|WHERE|AND|OR|VALUES|ORDER|GROUP|"
                       r"PRAGMA|BEGIN|COMMIT|ROLLBACK|INTO|SET|JOIN|INDEX|TABLE|REPLACE|IMMEDIATE)\b", re.IGNORECASE)


def _read_without_case(line: str, literal: re.Match[str]) -> bool:
    """Whether this string literal is text that is read without regard to case: SQL (it holds an SQL
    keyword) or a sqlite3.Row key (the subscript of a name ending in `row`)."""
    return bool(_SQL_WORD.search(literal.group(1))) or bool(re.search(r"\brow\[\s*$", line[:literal.start()]))


def changes_letter_case_only(diff: str) -> bool:
    """Whether a mutant's diff only changes the letter case of string literals that are read without
    regard to case (mutmut's case mutations: "SELECT" -> "select"): SQL text, which SQLite reads so,
    and sqlite3.Row keys, which it looks up so. A case change anywhere else (a Python comparison, a
    dict key) is not covered, however harmless it may be."""
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if not removed or len(removed) != len(added) or removed == added:
        return False
    for before, after in zip(removed, added):
        if before.lower() != after.lower():
            return False
        old, new = list(_STRING.finditer(before)), list(_STRING.finditer(after))
        if len(old) != len(new) or _STRING.sub("", before) != _STRING.sub("", after):
            return False  # a change outside the string literals
        if not all(_read_without_case(before, a) for a, b in zip(old, new) if a.group(0) != b.group(0)):
            return False
    return True


def equivalent_mutants(entry: dict[str, Any], statuses: dict[str, str], diffs: dict[str, str]) -> set[str]:
    """Survivors the module's table declares equivalent by rule (`case_insensitive_text`): reported
    apart in equivalent.diff and left out of the score, never silently dropped."""
    if not entry.get("case_insensitive_text"):
        return set()
    return {name for name, diff in diffs.items() if statuses[name] == "survived" and changes_letter_case_only(diff)}


def score(statuses: dict[str, str], equivalent: set[str] = frozenset()) -> dict[str, object]:
    counts: dict[str, int] = {}
    for name, status in statuses.items():
        status = "equivalent" if name in equivalent else status
        counts[status] = counts.get(status, 0) + 1
    detected = counts.get("killed", 0) + counts.get("timeout", 0) + counts.get("segfault", 0)
    counted = len(statuses) - counts.get("skipped", 0) - counts.get("equivalent", 0)
    return {"total": len(statuses), "killed": counts.get("killed", 0), "timeout": counts.get("timeout", 0),
            "survived": counts.get("survived", 0), "no_tests": counts.get("no tests", 0),
            "equivalent": counts.get("equivalent", 0),
            "other": {k: v for k, v in counts.items()
                      if k not in ("killed", "timeout", "survived", "no tests", "equivalent")},
            "score": round(detected / counted, 4) if counted else None,
            # The same with the rule's equivalents counted as survivors, so nothing hides behind it.
            "score_without_rule": round(detected / (counted + counts.get("equivalent", 0)), 4) if statuses else None}


def main(argv: list[str] | None = None) -> int:
    modules = load_modules()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", choices=sorted(modules),
                        help="mutate only this module (repeatable); default: all")
    parser.add_argument("--rev", help="mutate the tree as committed at this revision (default: the working "
                        "tree); selected tests absent there are left out")
    parser.add_argument("--deselect", action="append", default=[], metavar="NODEID",
                        help="leave out a test (repeatable), e.g. one known to fail at --rev: mutmut needs "
                        "the selection to pass before it mutates")
    parser.add_argument("--mutants", action="append", default=[], metavar="GLOB",
                        help="test only the mutants whose names match (fnmatch, repeatable), e.g. "
                        "'*_serve_native*' for one function; the score then counts those alone")
    parser.add_argument("--children", type=int, default=os.cpu_count() or 2,
                        help="mutants tested at once (default: the CPU count)")
    args = parser.parse_args(argv)
    chosen = args.module or list(modules)
    label = args.rev or "work"
    print(f"{'module':<14}{'mutants':>8}{'killed':>8}{'timeout':>8}{'survived':>9}{'no tests':>9}"
          f"{'equiv.':>8}{'score':>8}{'seconds':>9}", flush=True)
    for name in chosen:
        entry = modules[name]
        tree, tests = prepare_tree(name, entry, args.rev, args.deselect)
        seconds = run_mutmut(tree, args.children, args.mutants)
        found = collect(tree)
        if args.mutants:  # mutants left unchecked by the selection are not part of this figure
            found = select_mutants(found, args.mutants)
        equivalent = equivalent_mutants(entry, found["statuses"], found["diffs"])
        for file_name, names in (("survivors.diff", [n for n in found["diffs"] if n not in equivalent]),
                                 ("equivalent.diff", sorted(equivalent))):
            (tree / file_name).write_text("\n".join(f"# {n}: {found['statuses'][n]}\n{found['diffs'][n]}" for n in names))
        figures = score(found["statuses"], equivalent) | {"files": entry["files"], "tests": tests, "mutants": args.mutants or "all",
                                              "rev": args.rev or "working tree", "deselected": args.deselect, "seconds": round(seconds, 1)}
        (tree / "score.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
        shown = f"{figures['score']:.1%}" if figures["score"] is not None else "-"
        print(f"{name:<14}{figures['total']:>8}{figures['killed']:>8}{figures['timeout']:>8}"
              f"{figures['survived']:>9}{figures['no_tests']:>9}{figures['equivalent']:>8}{shown:>8}{seconds:>9.0f}",
              flush=True)
    # Every module measured so far in this tree (a run of one module keeps the others' figures).
    results = {path.parent.name: json.loads(path.read_text()) for path in sorted((OUT / label).glob("*/score.json"))}
    scores_file = OUT / label / "scores.json"
    tmp = scores_file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "tool": "mutmut " + mutmut_version(),
                               "modules": results}, indent=2, sort_keys=True) + "\n")
    tmp.replace(scores_file)
    print(f"scores: build/mutation/{label}/scores.json; survivors: build/mutation/{label}/<module>/survivors.diff")
    return 0


def mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


if __name__ == "__main__":
    sys.exit(main())
