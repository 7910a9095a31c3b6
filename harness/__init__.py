"""mlharness: MLPerf-style inference benchmarking with LoadGen and DLSpec manifests.

The public API is small: `run()` a RunRequest, load a `Manifest`, read a `RunRecord`.
Importing it loads no deep-learning framework."""
from harness.errors import UserError
from harness.manifests import Manifest, load_manifest
from harness.run_record import RunRecord


def run(request):  # noqa: ANN001 - re-export with a lazy import of the runner
    from harness.runner import run as _run

    return _run(request)


__all__ = ["run", "Manifest", "RunRecord", "UserError", "load_manifest"]
