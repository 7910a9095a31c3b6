"""Run a function in a fresh Python process and bring its result (or its error) back.

LoadGen reads its configuration once per process: a second `TestSettings.FromConfig` in the same
process logs "Multiple conf files are used" and skips the built-in mlperf.conf (seeds become 0).
So a process runs at most one benchmark run; `harness.runner.run` hands any later one to a
fresh process through `call_in_fresh_process`."""
from __future__ import annotations

import multiprocessing
import traceback
from typing import Any, Callable

from harness.errors import UserError


def _child(func: Callable[..., Any], args: tuple, conn: Any) -> None:
    try:
        conn.send(("ok", func(*args)))
    except UserError as exc:
        conn.send(("user_error", (type(exc).__module__, type(exc).__qualname__, str(exc), getattr(exc, "record", None))))
    except BaseException as exc:  # anything else travels back as text with its traceback
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def call_in_fresh_process(func: Callable[..., Any], *args: Any) -> Any:
    """func(*args) in a spawned process (picklable func, args and result); UserErrors come back as
    UserErrors with the same one-line message, with `.record` kept when the error carried one."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(func, args, sender), daemon=False)
    process.start()
    sender.close()
    try:
        message = receiver.recv()
    except EOFError:
        message = None
    except BaseException:
        process.terminate()
        process.join()
        raise
    process.join()
    if message is None:
        raise UserError(f"the run's worker process ended without a result (exit code {process.exitcode})")
    kind, payload = message
    if kind == "ok":
        return payload
    if kind == "user_error":
        return _raise_user_error(*payload)
    raise RuntimeError(f"in the run's worker process: {payload}")


def _raise_user_error(module: str, qualname: str, message: str, record: Any) -> Any:
    error = UserError(message)
    if record is not None:
        from harness.runner import RunFailed

        error = RunFailed(message, record)
    raise error
