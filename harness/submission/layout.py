"""Paths inside an MLCommons Inference v6.x submission tree:
{open|closed}/<Submitter>/{systems/<system>.json, src/, model_mapping.json,
results/<system>/<benchmark>/<Scenario>/{performance/run_1/, accuracy/, TEST01/, TEST04/, ...}}.
Full (untruncated) accuracy logs are kept beside the tree, never inside it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlharness.errors import UserError
from mlharness.submission.rules import DIVISIONS

NOT_FOR_SUBMISSION = "NOT_FOR_SUBMISSION.txt"
PROVENANCE = "mlharness_runs.json"       # inside src/: which runs were packaged, and how they ran
FULL_LOGS = "full_accuracy_logs"         # beside the division folders


@dataclass(frozen=True)
class SubmitterTree:
    root: Path        # the folder holding open/ and closed/
    division: str
    submitter: str

    @property
    def base(self) -> Path:
        return self.root / self.division / self.submitter

    @property
    def systems(self) -> Path:
        return self.base / "systems"

    @property
    def src(self) -> Path:
        return self.base / "src"

    @property
    def results(self) -> Path:
        return self.base / "results"

    @property
    def model_mapping(self) -> Path:
        return self.base / "model_mapping.json"

    @property
    def marker(self) -> Path:
        return self.base / NOT_FOR_SUBMISSION

    @property
    def provenance(self) -> Path:
        return self.src / PROVENANCE

    def system_json(self, system: str) -> Path:
        return self.systems / f"{system}.json"

    def scenario(self, system: str, benchmark: str, scenario: str) -> Path:
        return self.results / system / benchmark / scenario

    def full_accuracy_log(self, system: str, benchmark: str, scenario: str) -> Path:
        return (self.root / FULL_LOGS / self.division / self.submitter / system / benchmark / scenario
                / "mlperf_log_accuracy.json")


def find_trees(root: Path) -> list[SubmitterTree]:
    """Every {division}/{submitter} below root (root may also be a division or submitter folder)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: no such submission folder")
    if root.name in DIVISIONS:
        return [SubmitterTree(root.parent, root.name, p.name) for p in sorted(root.iterdir()) if p.is_dir()]
    if root.parent.name in DIVISIONS:
        return [SubmitterTree(root.parent.parent, root.parent.name, root.name)]
    trees = [SubmitterTree(root, division.name, submitter.name)
             for division in sorted(root.iterdir()) if division.is_dir() and division.name in DIVISIONS
             for submitter in sorted(division.iterdir()) if submitter.is_dir()]
    if not trees:
        raise UserError(f"{root}: expected open/<submitter>/ or closed/<submitter>/ folders")
    return trees
