"""A sweep cell's stored params (sweep_cells.params_json, hashed into the cell's key) come from the one
table of run-request fields with flags (mlharness.running.arguments.REQUEST_FLAGS): a cell that sets
every such field round-trips through its stored params, and the params stored by earlier versions
read back into the same cell with the same key."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from mlharness.running.arguments import REQUEST_FLAGS
from mlharness.running.request import RunRequest
from mlharness.sweeps.sweep_grid import Cell


def _everything() -> Cell:
    """A cell whose every request field that decides a run and has a flag is not at its default
    (timeout and results_dir are the sweep's: request_for sets them)."""
    return Cell(RunRequest(
        model="null", scenario="Server", mode="accuracy", dataset="synthetic", backend="onnxruntime",
        software="onnxruntime-cpu", hardware="cpu-pinned", reference="ref-x", endpoint="grpc://127.0.0.1:8001",
        quick=True, presets=("fast", "slow"), user_conf=Path("/confs/user.conf"),
        overrides=("target_qps=7.5", "workers=2"), use_tuned=False, profile=("harness", "python"),
        compliance=("TEST01", "TEST04")))


def test_a_cell_setting_every_flagged_field_round_trips_through_its_params() -> None:
    cell = _everything()
    defaults = RunRequest(model="null", scenario="Offline")
    deciding = {spec.field for spec in REQUEST_FLAGS if spec.decides_run} - {"timeout"}
    assert all(getattr(cell.request, name) != getattr(defaults, name) for name in deciding)
    stored = json.loads(json.dumps(cell.params(), sort_keys=True))  # as sweep_cells.params_json holds it
    assert set(stored) == deciding | {"model"}
    back = Cell.from_params(stored)
    assert back == cell and back.key == cell.key
    # Each such field is part of what the cell is: changing one makes another cell.
    assert Cell(RunRequest(**{**vars(cell.request), "use_tuned": True})).key != cell.key
    assert Cell(RunRequest(**{**vars(cell.request), "compliance": ()})).key != cell.key


# Rows stored by earlier versions (their params as written then) and the key each cell had.
OLD_ROWS = [
    # before the manifest axes: the eight fields, always
    ({"backend": None, "mode": "performance", "model": "null", "overrides": ["max_batch_size=8"], "presets": [],
      "profile": [], "quick": True, "scenario": "Offline"}),
    # a hardware axis and a model entry's endpoint, written only when not at their default
    ({"backend": "onnxruntime", "hardware": "cpu-1t", "mode": "performance", "model": "resnet50-light",
      "overrides": [], "presets": ["fast"], "profile": ["harness"], "quick": False, "scenario": "SingleStream"}),
    ({"backend": None, "endpoint": "openai+http://127.0.0.1:8080/v1", "mode": "performance",
      "model": "smollm2-135m", "overrides": [], "presets": [], "profile": [], "quick": True, "scenario": "Offline",
      "user_conf": "/confs/user.conf"}),
]


@pytest.mark.parametrize("stored", OLD_ROWS)
def test_params_stored_by_earlier_versions_read_back_with_their_keys(stored: dict) -> None:
    cell = Cell.from_params(stored)
    assert cell.params() == stored  # written again as it was: so the key is the one stored with the row
    assert cell.key == hashlib.sha256(json.dumps(stored, sort_keys=True).encode()).hexdigest()[:16]
