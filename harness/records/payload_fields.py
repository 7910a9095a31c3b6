"""What the run record's typed payload views share (mlharness.records.payloads, .bricks_payload): a
read-only copy of the stored dict, tolerant readers of its values (a missing key or a value of the wrong
type reads as None or empty: older records), and the base view that keeps the keys it does not type."""
from __future__ import annotations

import math
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

_EMPTY: Mapping[str, Any] = types.MappingProxyType({})


def empty_mapping() -> Mapping[str, Any]:
    return _EMPTY


def read_only(value: Any) -> Mapping[str, Any]:
    """A read-only copy of a mapping; anything else reads as an empty one."""
    return types.MappingProxyType(dict(value)) if isinstance(value, Mapping) else _EMPTY


def number_or_none(value: Any) -> float | int | None:
    """A number as stored (int or float), None for anything else (bool, text, null)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def texts_or_empty(value: Any) -> tuple[str, ...]:
    return tuple(str(item) for item in value) if isinstance(value, (list, tuple)) else ()


def finite_figures(stored: Mapping[str, Any], leave_out: tuple[str, ...] = ()) -> dict[str, float]:
    """Every finite number among a payload's keys, as a float, in the stored order."""
    found = {}
    for key, value in stored.items():
        number = number_or_none(value)
        if key not in leave_out and number is not None and math.isfinite(number):
            found[key] = float(number)
    return found


@dataclass(frozen=True)
class PayloadView:
    """What every payload view has: the dict it was read from, and the keys it does not type."""
    stored: Mapping[str, Any] = field(default_factory=empty_mapping, repr=False, compare=False)
    KEYS: ClassVar[frozenset[str]] = frozenset()  # the stored keys the typed fields read

    @property
    def extra(self) -> dict[str, Any]:
        """The stored keys this view does not type, with their values."""
        return {k: v for k, v in self.stored.items() if not self._knows(k)}

    @classmethod
    def _knows(cls, key: str) -> bool:
        return key in cls.KEYS
