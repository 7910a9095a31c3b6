"""accuracy.txt as the official scripts write it (the metric's headline line, e.g.
`accuracy=76.500%, good=38250, total=50000`), followed by `hash=<sha256 of the full accuracy log>`;
and the accuracy log truncated as the official truncation tool does: a log above 10 KiB keeps
its first and last 4 KiB around a `...` line. The full log is kept elsewhere by the packager."""
from __future__ import annotations

import re
from pathlib import Path

from mlharness.atomic_io import write_bytes, write_text
from mlharness.errors import UserError
from mlharness.submission.rules import HASH_LINE, MAX_ACCURACY_LOG_SIZE, VIEWABLE_SIZE
from mlharness.specs.artifacts import sha256_file


def official_text(run_accuracy_txt: Path, full_log: Path) -> str:
    """The headline line of the run's accuracy.txt (the official format), then the log's hash."""
    try:
        lines = run_accuracy_txt.read_text().splitlines()
    except OSError as exc:
        raise UserError(f"{run_accuracy_txt}: cannot read accuracy.txt: {exc.strerror or exc}") from None
    first = next((number for number, line in enumerate(lines) if line.strip()), len(lines))
    headline = lines[first] if first < len(lines) else ""
    if not headline.startswith("accuracy="):
        raise UserError(f"{run_accuracy_txt}: line {first + 1 if headline else 1}: expected the official headline "
                        f"'accuracy=<pct>%, good=<n>, total=<n>', got {headline!r}")
    # Our own figures (top5, reference checks) stay between; the hash comes last, as the tool appends it.
    extra = [line for line in lines[first + 1:] if line.strip() and not re.match(HASH_LINE, line)]
    return "\n".join([headline, *extra, f"hash={sha256_file(full_log)}"]) + "\n"


def truncated_bytes(full_log: Path) -> bytes:
    """The log as the truncation tool leaves it: unchanged up to 10 KiB, else head + '...' + tail."""
    data = full_log.read_bytes()
    if len(data) <= MAX_ACCURACY_LOG_SIZE:
        return data
    return data[:VIEWABLE_SIZE] + b"\n\n...\n\n" + data[-VIEWABLE_SIZE:]


def write_packaged_accuracy(run_accuracy_dir: Path, dest_dir: Path, full_log_copy: Path) -> str:
    """accuracy.txt (with hash) and the truncated log into dest_dir; the untouched log to full_log_copy.
    Returns the hash."""
    full_log = run_accuracy_dir / "mlperf_log_accuracy.json"
    if not full_log.is_file():
        raise UserError(f"{full_log}: missing: the accuracy run's log is needed to package accuracy/")
    text = official_text(run_accuracy_dir / "accuracy.txt", full_log)
    write_bytes(full_log_copy, full_log.read_bytes())
    write_bytes(dest_dir / "mlperf_log_accuracy.json", truncated_bytes(full_log))
    write_text(dest_dir / "accuracy.txt", text)
    return text.splitlines()[-1].split("=", 1)[1]


def read_hash(accuracy_txt: Path) -> str | None:
    for line in accuracy_txt.read_text(errors="replace").splitlines():
        match = re.match(HASH_LINE, line.strip())
        if match:
            return match.group(1)
    return None
