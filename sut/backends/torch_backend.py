"""PyTorch: an nn.Module from a factory named in the manifest plus a state dict, or TorchScript.
Arrays cross to and from torch without copies (torch.from_numpy / Tensor.numpy on CPU)."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from harness.errors import UserError
from sut.backends.base import Backend
from sut.processing import ProcessingContext, compile_function

_THREADS_LOCK = threading.Lock()


class TorchBackend(Backend):
    name = "torch"
    devices = ("cpu", "cuda")

    def load(self) -> None:
        import torch

        self._torch = torch
        with _THREADS_LOCK:
            if self.intra_op_threads:
                torch.set_num_threads(self.intra_op_threads)
            if self.inter_op_threads:
                try:
                    torch.set_num_interop_threads(self.inter_op_threads)
                except RuntimeError:
                    pass  # fixed once per process by torch; the first setting stands
        self.device = torch.device(self.hardware.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"{self.hardware.path}: device: {self.hardware.device} but torch sees no CUDA device")
        if "torchscript" in self.sources:
            self.module = torch.jit.load(str(self.sources["torchscript"]), map_location=self.device)
        else:
            factory = compile_function(self.model.factory or "", "factory", f"{self.model.path}: sources.module")
            ctx = ProcessingContext(attributes=dict(self.model.attributes), sources=dict(self.sources), model=self.model)
            self.module = factory(ctx)
            if "weights" in self.sources:
                state = torch.load(str(self.sources["weights"]), map_location="cpu", weights_only=True)
                try:
                    self.module.load_state_dict(state)
                except RuntimeError as exc:
                    first = str(exc).strip().splitlines()[0]
                    raise UserError(f"{self.model.path}: sources.weights: state dict does not fit the module: {first}") from None
        self.module.eval().to(self.device)
        self.input_names = [spec.name for spec in self.model.inputs]
        self.output_names = [spec.name for spec in self.model.outputs]
        self.keyword_inputs = bool(self.model.attributes.get("keyword_inputs", False))

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        tensors = {name: torch.from_numpy(inputs[name]).to(self.device, non_blocking=True) for name in self.input_names}
        with torch.inference_mode():
            raw = self.module(**tensors) if self.keyword_inputs else self.module(*tensors.values())
        return dict(zip(self.output_names, self._as_arrays(raw)))

    def _as_arrays(self, raw: Any) -> list[np.ndarray]:
        if isinstance(raw, self._torch.Tensor):
            items = [raw]
        elif isinstance(raw, dict) or hasattr(raw, "keys"):
            items = [raw[name] for name in self.output_names]
        else:
            items = list(raw)[: len(self.output_names)]
        return [t.detach().cpu().numpy() for t in items]

    def close(self) -> None:
        self.module = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "torch": self._torch.__version__,
                "torch_threads": self._torch.get_num_threads(),
                "torchscript": "torchscript" in self.sources}
