"""RUN_DIR/trackers.json: the run id of each experiment tracker (MLflow, W&B) that rank 0 opened,
so that a later attempt continues the same tracker run (job/train/trackers.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from slurmddp.files import write_json
from slurmddp.rundir.layout import TRACKERS


@dataclass(frozen=True)
class TrackerIds:
    """Tracker name (its key in the file) -> the id of its run."""

    ids: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, run_dir: Path) -> TrackerIds:
        """Those an earlier attempt recorded; none on a first attempt. A file that cannot be
        parsed raises: a tracker would otherwise start a second run beside the first."""
        path = run_dir / TRACKERS
        return cls(json.loads(path.read_text())) if path.exists() else cls()

    def write(self, run_dir: Path) -> None:
        write_json(run_dir / TRACKERS, self.ids)
