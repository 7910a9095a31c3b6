"""Backends registered by name; each is imported only when it is created, so the harness runs
without the frameworks it does not use."""
from __future__ import annotations

import importlib
from typing import Any

from harness.errors import UserError
from sut.backends.base import Backend

# name -> "module:Class"; the order is the preference when a model has manifests for several.
_REGISTRY: dict[str, str] = {
    "onnxruntime": "sut.backends.onnxruntime_backend:OnnxRuntimeBackend",
    "torch": "sut.backends.torch_backend:TorchBackend",
    "null": "sut.backends.null_backend:NullBackend",
}


def register(name: str, target: str) -> None:
    """Add a backend: `target` is "module:Class" of a Backend subclass."""
    _REGISTRY[name] = target


def names() -> list[str]:
    return list(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    target = _REGISTRY.get(name)
    if target is None:
        raise UserError(f"--backend: expected one of {', '.join(_REGISTRY)}, got {name!r}")
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"backend {name!r} needs a package that is not installed: {exc}") from None
    return getattr(module, cls_name)


def create(name: str, **kwargs: Any) -> Backend:
    return backend_class(name)(**kwargs)
