"""Loaded at start-up by every Python process of a mutation run (tools/mutation is on PYTHONPATH).

mutmut learns which tests reach which function by recording calls in the pytest process. A run's
LoadGen test executes in a child process (the launcher starts one per run), so its calls would be
lost and the SUT's mutants would look untested. In such a child, during mutmut's stats phase, each
function reached for the first time is appended to a file the pytest plugin `mutation_bridge`
reads when the test that started the child ends."""
from __future__ import annotations

import os

HITS_ENV = "MUTATION_BRIDGE_HITS"  # not MLHARNESS_*: the suite clears those for each test

if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get(HITS_ENV):
    import mutmut.stats as _stats

    _seen: set[str] = set()
    _path = os.path.join(os.environ[HITS_ENV], f"{os.getpid()}.hits")

    def _record_in_file(name: str, caller: str | None = None) -> None:
        if name not in _seen:
            _seen.add(name)
            # Written at once: the child may end with os._exit, which runs no exit handlers.
            with open(_path, "a", encoding="utf-8") as out:
                out.write(name + "\n")

    # Before mutmut's trampoline module imports the function by name.
    _stats.record_trampoline_hit = _record_in_file
