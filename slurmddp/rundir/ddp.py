"""RUN_DIR/ddp/N.json: the gradient-bucket layout that the N-th DistributedDataParallel of a
script rebuilt to after its first backward, so that its later attempts start with it
(job/script/ddp_buckets.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurmddp.files import read_json_object, write_json
from slurmddp.rundir.layout import DDP_BUCKETS


@dataclass(frozen=True)
class BucketLayout:
    """The buckets of one DDP module, for the parameters whose shapes it records."""

    shapes: list[list[int]]
    """Every parameter's shape, in DDP's order: a layout is replayed only onto the same model."""
    buckets: list[list[int]]
    """The parameter indices of each bucket, in the order DDP rebuilt them."""
    limits: list[int]
    """Each bucket's size limit in bytes."""

    @classmethod
    def read(cls, run_dir: Path, number: int) -> BucketLayout | None:
        """The layout an earlier attempt recorded for DDP module `number`; None where none (or
        the file is torn)."""
        data = read_json_object(run_dir / DDP_BUCKETS / f"{number}.json")
        if data is None or not {"shapes", "buckets", "limits"} <= data.keys():
            return None
        return cls(data["shapes"], data["buckets"], data["limits"])

    def write(self, run_dir: Path, number: int) -> None:
        write_json(run_dir / DDP_BUCKETS / f"{number}.json", vars(self))
