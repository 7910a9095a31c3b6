"""Compile a manifest's code (inline Python source or `module:function`) once, and the context
object every user function receives."""
from __future__ import annotations

import importlib
import inspect
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mlharness.errors import UserError


@dataclass
class ProcessingContext:
    """What user code may look at: the model's attributes, resolved source files, manifests."""

    attributes: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, Path] = field(default_factory=dict)
    model: Any = None
    dataset: Any = None
    cache: dict[str, Any] = field(default_factory=dict)  # user code may keep state here (a tokenizer, say)


def compile_function(code: str, role: str, where: str) -> Callable[..., Any]:
    """`code` is either `package.module:function` or source that defines a function named `role`."""
    text = code.strip()
    if "\n" not in text and ":" in text:
        module_name, _, attr = text.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UserError(f"{where}: {role}: cannot import {module_name!r}: {exc}") from None
        func = getattr(module, attr, None)
        if not callable(func):
            raise UserError(f"{where}: {role}: {module_name} has no function {attr!r}")
        return func
    module = types.ModuleType(f"mlharness_user_{role}")
    module.__file__ = where
    try:
        exec(compile(code, f"{where}:{role}", "exec"), module.__dict__)
    except SyntaxError as exc:
        raise UserError(f"{where}: {role}: line {exc.lineno}: expected valid Python, {exc.msg}") from None
    except Exception as exc:
        raise UserError(f"{where}: {role}: defining the code raised {type(exc).__name__}: {exc}") from None
    func = module.__dict__.get(role)
    if not callable(func):
        raise UserError(f"{where}: {role}: expected the source to define a function named {role!r}")
    return func


def takes_inputs(postprocess: Callable[..., Any] | None) -> bool:
    """True when a postprocess declares a third parameter: it then also receives the batch's model
    inputs (mean pooling over an attention mask needs the mask), as `postprocess(outputs, ctx, inputs)`."""
    if postprocess is None:
        return False
    try:
        params = list(inspect.signature(postprocess).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params)


def batch_result_function(postprocess: Callable[..., Any] | None) -> Callable[[dict, Any, dict], Any]:
    """One way to turn a batch's outputs into its result rows, called as f(outputs, ctx, inputs):
    the postprocess itself when it takes the inputs, a two-argument call when it does not, and the
    first output when there is no postprocess."""
    if postprocess is None:
        return lambda outputs, ctx, inputs: next(iter(outputs.values()))
    if takes_inputs(postprocess):
        return postprocess
    return lambda outputs, ctx, inputs: postprocess(outputs, ctx)
