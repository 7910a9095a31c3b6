"""The typed view of a layer benchmark's record part (kind BRICKS: mlharness.bricks): its summary,
time per op type, and the brick measurements the run made."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from mlharness.records.payload_fields import (PayloadView, finite_figures, int_or_none, number_or_none, read_only,
                                              text_or_none)

@dataclass(frozen=True)
class BricksSummary(PayloadView):
    """A layer benchmark's composed figures (mlharness.bricks.measure and .estimate): the estimate from
    the model's bricks, the lower bound, the whole model as LoadGen measured it, and the time spent."""
    batch: int | None = None
    nodes: int | None = None
    unique_bricks: int | None = None
    reused_bricks: int | None = None
    estimate_ms: float | None = None
    lower_bound_ms: float | None = None
    measured_ms: float | None = None  # the whole model's LoadGen p50, when a measuring run was named
    error_pct: float | None = None  # the estimate against measured_ms
    brick_seconds: float | None = None
    whole_model_seconds: float | None = None
    speedup: float | None = None  # time to the same confidence: the whole model over the bricks
    fingerprint: str | None = None  # the system and stack the bricks were measured on (reuse key)
    KEYS: ClassVar[frozenset[str]] = frozenset({
        "batch", "nodes", "unique_bricks", "reused_bricks", "estimate_ms", "lower_bound_ms", "measured_ms",
        "error_pct", "brick_seconds", "whole_model_seconds", "speedup", "fingerprint"})
    _INTS: ClassVar[tuple[str, ...]] = ("batch", "nodes", "unique_bricks", "reused_bricks")

    @classmethod
    def from_dict(cls, data: Any) -> "BricksSummary":
        s = read_only(data)
        typed = {key: (int_or_none if key in cls._INTS else number_or_none)(s.get(key))
                 for key in cls.KEYS - {"fingerprint"}}
        return cls(stored=s, fingerprint=text_or_none(s.get("fingerprint")), **typed)

    def figures(self) -> dict[str, float]:
        """Every numeric figure by its key (the record's `bricks.<key>`)."""
        return finite_figures(self.stored)


@dataclass(frozen=True)
class OpTypeRow:
    """One op type's time in the model: through its bricks as executed, and at the lower bound."""
    op_type: str | None = None
    nodes: int | None = None
    measured_ms: float | None = None
    lower_bound_ms: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OpTypeRow":
        return cls(None if data.get("op_type") is None else str(data.get("op_type")), int_or_none(data.get("nodes")),
                   number_or_none(data.get("measured_ms")), number_or_none(data.get("lower_bound_ms")))


@dataclass(frozen=True)
class BricksResult(PayloadView):
    """A layer benchmark's record part (kind BRICKS): its summary, time per op type, and the brick
    measurements this run made (the rows the results database keeps for reuse)."""
    summary: BricksSummary | None = None
    by_op_type: tuple[OpTypeRow, ...] = ()
    # The measurements as result_store's brick_measurements table takes them (mlharness.bricks.rows.Row):
    # the table's columns, read by the store that inserts them.
    measured: tuple[Mapping[str, Any], ...] = ()
    bricks_json: str | None = None  # the run's bricks.json, relative to its folder
    KEYS: ClassVar[frozenset[str]] = frozenset({"summary", "by_op_type", "measured", "bricks_json"})

    @classmethod
    def from_dict(cls, data: Any) -> "BricksResult":
        s = read_only(data)
        rows = [r for r in s.get("by_op_type") or [] if isinstance(r, Mapping)] \
            if isinstance(s.get("by_op_type"), list) else []
        measured = s.get("measured") if isinstance(s.get("measured"), list) else []
        return cls(stored=s, summary=BricksSummary.from_dict(s["summary"]) if isinstance(s.get("summary"), Mapping)
                   and s["summary"] else None, by_op_type=tuple(OpTypeRow.from_dict(r) for r in rows),
                   measured=tuple(read_only(r) for r in measured if isinstance(r, Mapping)),
                   bricks_json=text_or_none(s.get("bricks_json")))
