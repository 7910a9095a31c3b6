"""Backends registered by name; each is imported only when it is created, so the harness runs
without the frameworks it does not use. Third-party backends register through the
`mlharness.backends` entry point group: a name and a Backend subclass, loaded when first used."""
from __future__ import annotations

import importlib
from typing import Any, Union

from mlharness.errors import UserError, require
from mlharness.specs import manifests
from mlharness.sut.backends.base import Backend

ENTRY_POINT_GROUP = "mlharness.backends"
Target = Union[str, "type[Backend]"]  # "module:Class" (imported when created) or the class

# name -> target; the order is the preference when a model has manifests for several.
_REGISTRY: dict[str, Target] = {
    "onnxruntime": "mlharness.sut.backends.onnxruntime_backend:OnnxRuntimeBackend",
    "torch": "mlharness.sut.backends.torch_backend:TorchBackend",
    "null": "mlharness.sut.backends.null_backend:NullBackend",
    # A generative model (a causal LM, manifests with `generation:`): runs through mlharness.sut.llm, token by token.
    "transformers": "mlharness.sut.backends.llm_transformers:TransformersLLMBackend",
    "llama_cpp": "mlharness.sut.backends.llm_llamacpp:LlamaCppLLMBackend",  # the same GGUF file run by llama.cpp
}
# name -> the mlharness extra (pyproject.toml) that installs the backend's framework.
_EXTRAS: dict[str, str] = {"onnxruntime": "onnxruntime", "torch": "torch", "transformers": "llm", "llama_cpp": "llm"}
# name -> entry point not loaded yet; read at first use, loaded when its backend is created.


def register(name: str, target: Target, extra: str | None = None) -> None:
    """Add a backend: `target` is "module:Class" of a Backend subclass, or the class; `extra` the
    mlharness extra that installs its framework, named when the framework is missing."""
    _REGISTRY[name] = target
    if extra:
        _EXTRAS[name] = extra


_plugins = manifests.PluginEntryPoints(ENTRY_POINT_GROUP, _REGISTRY)  # read at first use, loaded when used


def names() -> list[str]:
    """Every backend name, registered ones first (the preference order), then entry points'."""
    return list(_REGISTRY) + [name for name in _plugins() if name not in _REGISTRY]


def backend_class(name: str) -> type[Backend]:
    if name not in _REGISTRY and name in _plugins():
        target = manifests.load_entry_point(_plugins()[name])
        if not (isinstance(target, str) or isinstance(target, type) and issubclass(target, Backend)):
            ep = _plugins()[name]
            raise UserError(f"entry point {ep.group}:{name} = {ep.value}: expected a Backend subclass or a "
                            f"'module:Class' string, got {target!r}")
        register(name, target)
    target = _REGISTRY.get(name)
    if target is None:
        raise UserError(f"--backend: expected one of {', '.join(names())}, got {name!r}")
    if not isinstance(target, str):
        return target
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


manifests.register_names("framework", names)  # a model manifest's framework.name is a backend name
