"""A layer-level benchmark run (kind "bricks"), in the run's own process (mlharness.running.launcher):
the model's executed graph decomposed into bricks (mlharness.sut.bricks), each unique brick benchmarked once
(or taken from the results database, measured earlier on this system and software), the model
composed from them and compared with the LoadGen run that measured it whole (request.measured_run).

The run goes through the lifecycle every kind of run does (mlharness.running.lifecycle); its body is
here. The jobs within it have their own modules: the model made ready (mlharness.bricks.prepared), the
measurement loop (mlharness.bricks.measure), the estimate from stored bricks (mlharness.bricks.estimate),
the refinement of an estimate (mlharness.bricks.refine), rows and outputs (mlharness.bricks.rows).

Nothing here writes the database: the bricks measured by this run travel back in the record
(`bricks.measured`), and the launching process stores them (mlharness.store.result_store)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from mlharness.bricks.estimate import estimate_from_store
from mlharness.bricks.measure import measure_bricks
from mlharness.bricks.prepared import prepare
from mlharness.errors import UserError
from mlharness.records import results
from mlharness.records.run_record import BRICKS, RunRecord
from mlharness.running import lifecycle, resolve
from mlharness.running.request import RunRequest
from mlharness.sut.runtime import Runtime, build_runtime

BRICKS_FOLDER = "bricks"  # <results>/<system>/<model>/bricks/runs/<run id>/


def run_here(request: RunRequest, guard: lifecycle.Guard) -> RunRecord:
    """The bricks run itself, in this process (the launcher's child); `guard` as for a LoadGen run."""
    model, backend_name, dataset, hardware, software, _ = resolve.resolve_manifests(
        replace(request, backend=request.backend or "onnxruntime"))
    if backend_name != "onnxruntime":
        raise UserError(f"--backend {backend_name}: bricks are measured on onnxruntime only")
    if model.framework != "onnxruntime":
        raise UserError(f"{model.path}: framework: bricks need an ONNX graph; model {model.name!r} runs on "
                        f"{model.framework} (write an onnxruntime manifest whose sources.graph converts it)")
    settings = resolve.prepare_settings(_settings_request(request), model)
    resolve.check_device(backend_name, hardware)
    host = lifecycle.prepare_host(software, hardware)
    where = lifecycle.new_place(request.results_dir, host, model.name, BRICKS_FOLDER)
    record = lifecycle.new_record(where, host, model, dataset, backend_name, software, hardware, settings,
                                  command=request.command, scenario=BRICKS_FOLDER, mode=BRICKS_FOLDER, kind=BRICKS)

    def body(run: lifecycle.StagedRun) -> None:
        options = resolve.harness_options(settings, model) | {"max_batch_size": request.batch}
        runtime = run.adopt(build_runtime(model, dataset, hardware, backend_name, options))
        loaded = guard.watch(float(options["load_timeout"]), "preparing the model's bricks (samples, graph, capture)")
        try:
            run.update(bricks=measure_model(runtime, request, run.record, where))
        finally:
            loaded()

    return lifecycle.run_staged(record, where, guard, hardware, body)


def _settings_request(request: RunRequest) -> RunRequest:
    """The settings layers of the measuring run (SingleStream; MultiStream at a batch above 1)."""
    return replace(request, scenario="SingleStream" if request.batch == 1 else "MultiStream", mode="performance")


def measure_model(runtime: Runtime, request: RunRequest, record: RunRecord,
                  where: results.ScenarioDir) -> dict[str, Any]:
    """Decompose, benchmark (or reuse) every brick and its variants, compose; writes bricks.json.
    With request.brick_estimate, compose from the stored bricks instead. Returns the record's `bricks`."""
    prepared = prepare(runtime, request, record, where)
    if request.brick_estimate is not None:
        return estimate_from_store(prepared, request.brick_estimate)
    return measure_bricks(prepared)
