"""RUN_DIR/probe/: what each rank of `doctor --probe`'s job saw (job/launch/probe.py writes them,
manage/probe_run.py reads them): ready-N.json once rank N waits for the signal (ProbeReady),
rank-N.json once it saw it or gave up waiting (ProbeSeen)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmddp.files import read_json_object, write_json
from slurmddp.rundir.layout import PROBE


@dataclass(frozen=True)
class ProbeReady:
    """probe/ready-N.json: rank N waits for the stop signal."""

    rank: int
    host: str
    time: float

    def write(self, run_dir: Path) -> None:
        write_json(run_dir / PROBE / f"ready-{self.rank}.json", vars(self))

    @staticmethod
    def count(run_dir: Path) -> int:
        """How many ranks are waiting."""
        return len(list((run_dir / PROBE).glob("ready-*.json")))


@dataclass(frozen=True)
class ProbeSeen:
    """probe/rank-N.json: the signal rank N received, and when; None where none came."""

    rank: int
    host: str
    signal: str | None
    received_at: float | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeSeen:
        return cls(
            int(data.get("rank") or 0),
            str(data.get("host", "?")),
            data.get("signal"),
            data.get("received_at"),
        )

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def read(cls, run_dir: Path, rank: int) -> ProbeSeen | None:
        """What rank `rank` saw; None where it wrote nothing (yet)."""
        data = read_json_object(run_dir / PROBE / f"rank-{rank}.json")
        return None if data is None else cls.from_json(data)

    def write(self, run_dir: Path) -> None:
        write_json(run_dir / PROBE / f"rank-{self.rank}.json", self.to_json())

    @staticmethod
    def count(run_dir: Path) -> int:
        """How many ranks recorded what they saw."""
        return len(list((run_dir / PROBE).glob("rank-*.json")))
