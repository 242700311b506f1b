"""What an attempt leaves for the login node to read: RUN_DIR/result.json (Result: the function's
return value and the loop's telemetry) and RUN_DIR/preflight.json (PreflightReport: what the
network check measured). `results`, `status` and `scale` read them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmddp.files import read_json_object, write_json
from slurmddp.rundir.layout import PREFLIGHT, RESULT
from slurmddp.rundir.records import AttemptId


@dataclass(frozen=True)
class Result:
    """result.json: written by rank 0 once every rank returned from the function."""

    result: Any
    """Rank 0's return value."""
    ranks: list[Any]
    """Every rank's return value, by rank."""
    world_size: int
    num_nodes: int
    started_at: float
    """When rank 0 called the function (its process group ready), Unix time."""
    train_seconds: float
    telemetry: dict[str, Any] | None
    """The loop's summary since warm-up (job/train/telemetry.py); None without ctx.loop."""
    attempt: AttemptId

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Result:
        telemetry = data.get("telemetry")
        return cls(
            data.get("result"),
            list(data.get("ranks") or []),
            int(data.get("world_size") or 0),
            int(data.get("num_nodes") or 0),
            float(data.get("started_at") or 0.0),
            float(data.get("train_seconds") or 0.0),
            telemetry if isinstance(telemetry, dict) else None,
            AttemptId.from_json(data),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "result": self.result,
            "ranks": self.ranks,
            "world_size": self.world_size,
            "num_nodes": self.num_nodes,
            "started_at": self.started_at,
            "train_seconds": self.train_seconds,
            "telemetry": self.telemetry,
            **self.attempt.to_json(),
        }

    @classmethod
    def read(cls, run_dir: Path) -> Result | None:
        """The run's latest result; None where no attempt completed (or the file is torn)."""
        data = read_json_object(run_dir / RESULT)
        return None if data is None else cls.from_json(data)

    def write(self, run_dir: Path) -> None:
        write_json(run_dir / RESULT, self.to_json())


@dataclass(frozen=True)
class PreflightReport:
    """preflight.json: rank 0's account of the preflight all-reduce and ring transfer
    (job/process/preflight.py)."""

    ok: bool
    message: str
    bus_gbps: float | None = None
    nbytes: int | None = None
    """The size of the tensor each rank sent."""
    repeats: int | None = None
    seconds: float | None = None
    suspects: list[str] = field(default_factory=list)
    """Hosts the check blames."""
    links: list[dict[str, Any]] = field(default_factory=list)
    """Host-to-host transfers of the ring: src, dst, gbps."""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """What each rank saw (job/process/preflight.py's RankReport)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreflightReport:
        return cls(
            bool(data.get("ok")),
            str(data.get("message", "")),
            data.get("bus_gbps"),
            data.get("bytes"),
            data.get("repeats"),
            data.get("seconds"),
            list(data.get("suspects") or []),
            list(data.get("links") or []),
            list(data.get("ranks") or []),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "message": self.message,
            "bus_gbps": self.bus_gbps,
            "bytes": self.nbytes,
            "repeats": self.repeats,
            "seconds": self.seconds,
            "suspects": self.suspects,
            "links": self.links,
            "ranks": self.ranks,
        }

    @classmethod
    def read(cls, run_dir: Path) -> PreflightReport | None:
        """The latest attempt's preflight; None where none ran (or the file is torn)."""
        data = read_json_object(run_dir / PREFLIGHT)
        return cls.from_json(data) if data else None

    def write(self, run_dir: Path) -> None:
        write_json(run_dir / PREFLIGHT, self.to_json())
