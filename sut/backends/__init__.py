"""Backends registered by name; each is imported only when it is created, so the harness runs
without the frameworks it does not use."""
from __future__ import annotations

import importlib
from typing import Any

from harness.errors import UserError, require
from sut.backends.base import Backend

# name -> "module:Class"; the order is the preference when a model has manifests for several.
_REGISTRY: dict[str, str] = {
    "onnxruntime": "sut.backends.onnxruntime_backend:OnnxRuntimeBackend",
    "torch": "sut.backends.torch_backend:TorchBackend",
    "null": "sut.backends.null_backend:NullBackend",
}
# name -> the mlharness extra (pyproject.toml) that installs the backend's framework.
_EXTRAS: dict[str, str] = {"onnxruntime": "onnxruntime", "torch": "torch"}


def register(name: str, target: str, extra: str | None = None) -> None:
    """Add a backend: `target` is "module:Class" of a Backend subclass; `extra` the mlharness extra
    that installs its framework, named when the framework is missing."""
    _REGISTRY[name] = target
    if extra:
        _EXTRAS[name] = extra


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
        extra = _EXTRAS.get(name)
        install = f"; pip install 'mlharness[{extra}]'" if extra else ""
        raise UserError(f"backend {name!r} needs a package that is not installed: {exc}{install}") from None
    return getattr(module, cls_name)


def create(name: str, **kwargs: Any) -> Backend:
    """A backend for the hardware manifest (`hardware=`): its framework must be installed and see
    the manifest's device, else a one-line error naming the manifest, its device and why."""
    cls = backend_class(name)
    if cls.framework:
        require(cls.framework, _EXTRAS.get(name), f"the {name} backend")
    hardware = kwargs.get("hardware")
    problem = cls.device_problem(hardware) if hardware is not None else None
    if problem:
        raise UserError(f"{hardware.path}: {problem}")
    return cls(**kwargs)
