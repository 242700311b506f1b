"""A small torchrun-style package run with `-m` (torchrun -m): the local and the Slurm-lab tests of
`entrypoint.module` write it into their submit directory.

`python -m ddpmod --tag T` runs ddpmod/__main__.py, which starts the process group from torchrun's
variables, all-reduces its rank, checks the sum, and writes RUN_DIR/rank_N.json with what it saw.
Its relative import works only when it runs as a module of its package, as `-m` runs it.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = "ddpmod"

_MAIN = """\
import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

from .ring import expected_sum

parser = argparse.ArgumentParser()
parser.add_argument("--tag", required=True)
parser.add_argument("--n", type=int, default=0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
assert total.item() == expected_sum(world), (total.item(), world)
seen = {
    "rank": rank,
    "world_size": world,
    "sum": total.item(),
    "tag": args.tag,
    "n": args.n,
    "name": __name__,
    "package": __package__,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "hostname": socket.gethostname(),
    "env": {key: os.environ.get(key) for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")},
}
run_dir = os.environ["SLURMDDP_RUN_DIR"]
with open(os.path.join(run_dir, f"rank_{rank}.json"), "w") as out:
    json.dump(seen, out)
dist.destroy_process_group()
"""

_RING = """\
def expected_sum(world: int) -> float:
    return world * (world - 1) / 2
"""


def write_package(root: Path) -> None:
    """ROOT/ddpmod/{__init__,__main__,ring}.py."""
    package = root / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(_MAIN)
    (package / "ring.py").write_text(_RING)
