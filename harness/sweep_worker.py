"""One sweep cell in its own process: `python -m harness.sweep_worker CELL.json OUT.json RESULTS_DIR`.

The runner stores the run in the results database itself ($MLHARNESS_DB, set by the parent);
OUT.json tells the parent the run id, status and error so it can record the cell."""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from harness.atomic_io import write_json
from harness.errors import UserError


def run_cell(cell_path: Path, out_path: Path, results_dir: Path) -> int:
    from harness.runner import RunFailed, RunRequest, run
    from harness.sweep_grid import Cell

    cell = Cell.from_params(json.loads(cell_path.read_text()))
    request = RunRequest(model=cell.model, scenario=cell.scenario, mode=cell.mode, backend=cell.backend,
                         quick=cell.quick, presets=list(cell.presets), results_dir=results_dir,
                         overrides=list(cell.overrides), profile=list(cell.profile))
    try:
        record = run(request)
    except RunFailed as exc:
        write_json(out_path, {"status": "failed", "run_id": exc.record.run_id, "error": exc.record.error})
        print(f"mlharness: error: {exc}", file=sys.stderr)
        return 1
    except UserError as exc:  # failed before a run record existed (unknown model, bad setting)
        write_json(out_path, {"status": "failed", "run_id": None, "error": str(exc)})
        print(f"mlharness: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug or a framework crash: keep the traceback for the cell's stderr
        traceback.print_exc()
        write_json(out_path, {"status": "failed", "run_id": None, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    write_json(out_path, {"status": record.status, "run_id": record.run_id, "error": record.error})
    return 0


if __name__ == "__main__":
    sys.exit(run_cell(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
