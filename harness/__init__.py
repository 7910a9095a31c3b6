"""mlharness: MLPerf-style inference benchmarking with LoadGen and DLSpec manifests.

The public API is small (README: Python API): build a `RunRequest`, `run()` it, read the returned
`RunRecord`, query past runs in a `ResultStore`, `load_manifest` a `Manifest`; user mistakes raise
`UserError`. Importing this package loads no deep-learning framework; `RunRequest`, `ResultStore`
and the runner are imported on first use."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mlharness.errors import UserError
from mlharness.records.run_record import RunRecord

if TYPE_CHECKING:
    from mlharness.running.request import RunRequest
    from mlharness.store.result_store import ResultStore
    from mlharness.specs.manifests import Manifest, load_manifest

# Public names imported on first use (PEP 562), so `import mlharness` stays light.
# The spec layer too: it imports mlharness.errors, so importing it here eagerly would be a cycle for
# code that imports specs first.
_LAZY = {"RunRequest": "mlharness.running.request", "ResultStore": "mlharness.store.result_store",
         "Manifest": "mlharness.specs.manifests", "load_manifest": "mlharness.specs.manifests"}


def run(request: RunRequest) -> RunRecord:
    """Run one request in a fresh process of its own (like `mlharness run`) and return its record;
    a failed run raises mlharness.errors.RunFailed (a UserError) with the failed record as `.record`."""
    from mlharness.running.launcher import run as _run

    return _run(request)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["run", "RunRequest", "RunRecord", "ResultStore", "Manifest", "UserError", "load_manifest"]
