"""A resumed rank's start with the checkpoint read ahead (job/checkpoint/prefetch.py) vs without,
from a cold page cache: process start -> checkpoint loaded, and the load itself.

Each run is a fresh Python process that does what a rank does before `ctx.loop` loads: import
torch, build a model and its optimizer (which imports torch._dynamo), then load the newest
checkpoint (shared.pt of --gib GiB) with CheckpointStore. Before every run the checkpoint's pages
are dropped from the page cache (posix_fadvise DONTNEED, this file's pages only); `on` starts the
read-ahead first thing, as the runtime does. The two alternate, --rounds runs each; prints each
run, the medians and their ratio (on / off).

    python benchmarks/checkpoint_prefetch.py [--rounds 5] [--gib 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from slurmddp.job.checkpoint import CheckpointStore

RANK = """
import json, sys, time
started = time.time()
from pathlib import Path
root, on = Path(sys.argv[1]), sys.argv[2] == "on"
if on:
    from slurmddp.job.checkpoint.prefetch import prefetch
    prefetch(root, 0, shared=True)
import torch
from slurmddp.job.checkpoint import CheckpointStore
model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(8)))
optimizer = torch.optim.AdamW(model.parameters())
optimizer.zero_grad()
store = CheckpointStore(root, 0, 1, attempt="bench")
info = store.latest()
before = time.time()
shared, _ = store.load(info, verify_checksums=False)
done = time.time()
print(json.dumps({"start_to_loaded": done - started, "load": done - before}))
"""


def drop_from_page_cache(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def one(root: Path, variant: str) -> dict[str, float]:
    drop_from_page_cache(root)
    out = subprocess.run(
        [sys.executable, "-c", RANK, str(root), variant], check=True, capture_output=True, text=True
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gib", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        root = Path(tmp)
        chunks = max(1, round(args.gib * 8))
        state = {f"w{i}": torch.randn(32 << 20) for i in range(chunks)}  # 128 MiB each
        CheckpointStore(root, 0, 1, attempt="bench").save(1, state, {})
        del state
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        print(f"checkpoint: {size / 2**30:.2f} GiB in {root.name}")
        results: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        for round_ in range(args.rounds):
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for variant in order:
                row = one(root, variant)
                results[variant].append(row)
                print(
                    f"round {round_ + 1} {variant:3}: start -> loaded {row['start_to_loaded']:.2f} s, "
                    f"load {row['load']:.2f} s",
                    flush=True,
                )
    medians = {
        variant: {key: statistics.median(r[key] for r in rows) for key in ("start_to_loaded", "load")}
        for variant, rows in results.items()
    }
    for variant, values in medians.items():
        print(
            f"{variant:3} median of {args.rounds}: start -> loaded {values['start_to_loaded']:.2f} s, "
            f"load {values['load']:.2f} s"
        )
    ratio = medians["on"]["start_to_loaded"] / medians["off"]["start_to_loaded"]
    load_ratio = medians["on"]["load"] / medians["off"]["load"]
    print(f"ratio on/off: start -> loaded {ratio:.2f}, load {load_ratio:.2f}")


if __name__ == "__main__":
    main()
