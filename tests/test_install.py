"""mlharness installed from a wheel, not run from this checkout: the wheel carries the shipped specs,
the presets and the C extension; `specs list`, a null run (whose launcher child must import the
same installed copy), and packaging the runs (which copies the installed code) all work from a
clean `pip install --target` with the checkout off the path. The wheel is built and installed once
for the module (a few seconds: the C extension is compiled)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

from tests.support import REPO

# What the wheel is built from (pyproject.toml's packages, setup.py's extension, their metadata),
# copied so that the build never writes build/ or *.egg-info into the checkout other runs share.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in",
           "harness", "sut", "profiling", "native", "specs", "scenarios")
PACKAGES = ("harness", "sut", "profiling", "specs", "scenarios")


@dataclass(frozen=True)
class Install:
    wheel: Path
    site: Path  # the --target folder
    env: dict[str, str]


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def _pip(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Install:
    root = tmp_path_factory.mktemp("install").resolve()
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    _pip("wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(root / "dist"))
    wheels = sorted((root / "dist").glob("mlharness-*.whl"))
    assert len(wheels) == 1, wheels
    site = root / "site"
    _pip("install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheels[0]))
    # Only the install on the path: the checkout's entries of an inherited PYTHONPATH dropped, and
    # none of the variables that point the harness at other specs, presets or databases.
    env = {k: v for k, v in os.environ.items() if k not in ("MLHARNESS_SPECS", "MLHARNESS_SCENARIOS", "MLHARNESS_DB")}
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not _inside(Path(p), REPO)]
    env["PYTHONPATH"] = os.pathsep.join([str(site), *inherited])
    env["MLHARNESS_CACHE"] = str(root / "cache")
    return Install(wheels[0], site, env)


CLI = (sys.executable, "-m", "mlharness.cli")


def _run(install: Install, cwd: Path, *command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A command run from `cwd`, outside the checkout, with only the install on the path."""
    assert not _inside(cwd, REPO)
    return subprocess.run(command, cwd=cwd, env=env or install.env, capture_output=True, text=True, timeout=180)


def test_the_wheel_carries_the_specs_presets_and_c_extension(installed: Install) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    # One top-level import package: the checkout's folders are mapped into mlharness.
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"mlharness"}
    shipped = {f"mlharness/{p.relative_to(REPO)}" for p in [*REPO.glob("specs/*/*.yaml"), *REPO.glob("scenarios/*.yaml")]}
    assert "mlharness/specs/models/null.yaml" in shipped and "mlharness/scenarios/quick.yaml" in shipped
    assert shipped <= names, sorted(shipped - names)
    assert {"mlharness/specs/__init__.py", "mlharness/scenarios/__init__.py", "mlharness/sut/network/oip.proto"} <= names
    assert [n for n in names if n.startswith("mlharness/sut/_native") and n.endswith(".so")], "no mlharness.sut._native"
    assert not [n for n in names if "scenarios/baselines/" in n]  # CI's records stay in the checkout


def test_installed_copy_is_the_one_imported_and_finds_its_data(installed: Install, tmp_path: Path) -> None:
    code = ("import json, mlharness, mlharness.specs, mlharness.scenarios, mlharness.sut._native\n"
            "from mlharness.specs.index import specs_root\nfrom mlharness.running.presets import scenarios_root\n"
            "print(json.dumps([mlharness.__file__, mlharness.specs.__file__, mlharness.scenarios.__file__,"
            " mlharness.sut._native.__file__, str(specs_root()), str(scenarios_root())]))")
    result = _run(installed, tmp_path, sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    for path in json.loads(result.stdout):
        assert _inside(Path(path), installed.site), path


def test_specs_list_from_the_install(installed: Install, tmp_path: Path) -> None:
    result = _run(installed, tmp_path, *CLI, "specs", "list")
    assert result.returncode == 0, result.stderr
    paths = [Path(line.split()[-1]) for line in result.stdout.splitlines()]
    assert len(paths) == len(list(REPO.glob("specs/*/*.yaml")))
    assert all(_inside(p, installed.site / "mlharness" / "specs") for p in paths), result.stdout
    # pip --target installs the console script too; it runs the same installed code.
    script = installed.site / "bin" / "mlharness"
    assert script.is_file()
    assert _run(installed, tmp_path, str(script), "specs", "list").stdout == result.stdout


def test_run_and_package_from_the_install(installed: Install, tmp_path: Path) -> None:
    # PYTHONVERBOSE: both processes name every file they import, so the launcher's child can be
    # seen importing the installed copy (mlharness.sut._native is imported by the child only).
    verbose = dict(installed.env, PYTHONVERBOSE="1")
    result = _run(installed, tmp_path, *CLI, "run", "null", "--scenario", "Offline", "--quick", "--results-dir", "R",
                  env=verbose)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "null (null) Offline performance: ok" in result.stdout
    assert f"extension module 'mlharness.sut._native' loaded from '{installed.site / 'mlharness' / 'sut'}" in result.stderr
    for package in PACKAGES:
        assert f"{REPO / package}{os.sep}" not in result.stderr, f"imported the checkout's {package}"
    record = json.loads(next((tmp_path / "R").glob("*/null/Offline/run.json")).read_text())
    assert record["status"] == "ok"
    assert _inside(Path(record["model"]["path"]), installed.site / "mlharness" / "specs")
    assert record["settings"]["origin"]["min_duration"] == "preset:quick"
    assert (tmp_path / "R" / "mlharness.sqlite").is_file()

    # An accuracy run too, so the runs can be packaged: the tree's src/ holds the installed code.
    result = _run(installed, tmp_path, *CLI, "run", "null", "--scenario", "Offline", "--quick", "--mode", "accuracy",
                  "--results-dir", "R")
    assert result.returncode == 0, result.stdout + result.stderr
    result = _run(installed, tmp_path, *CLI, "submission", "package", "--division", "open", "--submitter", "acme",
                  "--allow-invalid", "--results-dir", "R", "--out", "OUT")
    # Exit 1: the pre-flight check refuses the null model's folder name (not an MLPerf benchmark), and
    # that is its only problem.
    assert "packaged OUT/open/acme" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    problem, verdict = result.stderr.splitlines()
    assert re.fullmatch(r"open/acme/results/[^/]+/null: unknown benchmark folder 'null': expected one of .*", problem)
    assert verdict == "submission check: 1 problem(s) in open/acme"
    code = tmp_path / "OUT" / "open" / "acme" / "src" / "mlharness"
    assert (code / "running" / "runner.py").is_file() and (code / "sut" / "handoff.py").is_file()  # the package's layout
    assert (code / "sut" / "network" / "oip.proto").is_file() and (code / "specs" / "manifests.py").is_file()
    assert (code / "scenarios" / "quick.yaml").is_file()
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (code / "INSTALLED.txt").read_text().startswith(f"mlharness {version}, installed in {installed.site / 'mlharness'}:")
    assert not (code / "pyproject.toml").exists() and not (code / "native").exists()


@pytest.mark.parametrize("flags, without_v3", [
    ("flags : fpu sse2 ssse3 sse4_2 avx avx2 fma f16c bmi2 avx512f", False),  # x86-64-v3 and more: the baseline
    ("flags : fpu sse2 ssse3 sse4_2 avx", True),  # no AVX2: llama.cpp built without the v3 features
    ("flags : fpu sse2 avx2 fma f16c", True),  # one missing (bmi2) is enough
])
def test_llama_cpp_is_built_for_what_this_cpu_has(flags: str, without_v3: bool) -> None:
    """The Makefile's CMAKE_ARGS for llama-cpp-python follow the CPU's flags (a CPU without AVX2
    would die of an illegal instruction in a build for x86-64-v3), never -march=native."""
    expanded = subprocess.run(["make", "-f", "-", f"CPU_FLAGS={flags}", "show"], cwd=REPO, text=True,
                              capture_output=True, timeout=60,
                              input=f"include {REPO / 'Makefile'}\nshow:\n\t@echo $(LLAMA_CPP_CMAKE_ARGS)\n")
    assert expanded.returncode == 0, expanded.stderr
    args = expanded.stdout.split()
    assert "-DGGML_NATIVE=OFF" in args and not any("march=native" in a for a in args)
    assert ("-DGGML_AVX2=OFF" in args) is without_v3 and ("-DGGML_BMI2=OFF" in args) is without_v3
