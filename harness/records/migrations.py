"""The run record's schema version and the steps that bring an older run.json up to it (read by
mlharness.records.run_record when a record is loaded)."""
from __future__ import annotations

from typing import Any, Callable


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 added `kind`; every version-1 record was a LoadGen test."""
    data.setdefault("kind", "loadgen")  # run_record.LOADGEN; a migration keeps the value it had
    return data


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3 added `bricks` (a layer benchmark's figures); no earlier record has them."""
    data.setdefault("bricks", None)
    return data


# MIGRATIONS[n] takes a version n + 1 record (a run.json dict) to version n + 2, as the results
# database migrates (mlharness.store.result_store). Older records are migrated forward when read, newer
# ones are refused rather than guessed at.
MIGRATIONS: list[Callable[[dict[str, Any]], dict[str, Any]]] = [_v1_to_v2, _v2_to_v3]
RUN_SCHEMA_VERSION = 1 + len(MIGRATIONS)
