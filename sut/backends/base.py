"""The contract every backend keeps: load once, predict on a batch of named arrays, close."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from harness.manifests import HardwareManifest, ModelManifest


class Backend(ABC):
    name: str = ""
    devices: tuple[str, ...] = ("cpu",)

    def __init__(self, model: ModelManifest, sources: dict[str, Path], hardware: HardwareManifest,
                 options: dict[str, Any] | None = None):
        self.model = model
        self.sources = sources
        self.hardware = hardware
        self.options = dict(options or {})
        self.intra_op_threads = int(self.options.get("intra_op_threads") or hardware.intra_op_threads or 0)
        self.inter_op_threads = int(self.options.get("inter_op_threads") or hardware.inter_op_threads or 0)

    @abstractmethod
    def load(self) -> None:
        """Build the session or module; everything slow happens here, before LoadGen starts."""

    @abstractmethod
    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One batch in (arrays by input name, leading batch dim), arrays by output name out."""

    def close(self) -> None:
        """Release the session or module."""

    def describe(self) -> dict[str, Any]:
        """What the record should say about how this backend ran (providers, threads)."""
        return {"name": self.name, "intra_op_threads": self.intra_op_threads,
                "inter_op_threads": self.inter_op_threads, "device": self.hardware.device}

    @property
    def supports_batching(self) -> bool:
        """False when the graph has a fixed batch of 1, so the SUT must send one sample at a time."""
        return True
