"""Run one audit (compliance) test in a fresh process: LoadGen reads its conf files once per
process, so a second test in the same process would log "Multiple conf files are used".
Usage (internal): python -m harness.submission.audit_worker '<RunRequest as JSON>'
Prints the run record as JSON on stdout; exits 1 with the error on stderr when the run fails."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.errors import UserError

PATH_FIELDS = ("user_conf", "results_dir", "audit_config")


def main(argv: list[str]) -> int:
    from harness.runner import RunRequest, run

    fields = json.loads(argv[0])
    for key in PATH_FIELDS:
        if fields.get(key) is not None:
            fields[key] = Path(fields[key])
    try:
        record = run(RunRequest(**fields))
    except UserError as exc:
        print(f"mlharness audit: {exc}", file=sys.stderr)
        return 1
    json.dump(record.to_dict(), sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
