"""Goodput under crashes: the quickstart as shipped (2 nodes x 2 ranks, 2 loader workers a rank) with
a crash every --every seconds, alternately one rank (rank 3) and the second node's ranks (with their
loader workers) SIGKILLed, next to the same run uninterrupted, on the lab cluster (SLURM_CONF set).
With --node-kill tasks, every process of the second node's tasks goes, a resident launcher's
tasks (requeue.resident_launcher) too: srun then ends the step, and the run restarts in a new one.

    goodput ratio = the uninterrupted run's wall / the faulted run's wall

each from its first attempt's begin record to its last attempt's end record. The faulted run must
complete with the uninterrupted run's parameters; whether it went through the queue (sacct shows a
REQUEUED incarnation) is printed. A crash is only sent once the attempt before it trains.

    python benchmarks/crash_goodput.py [--epochs 300] [--every 40] [--snapshot-every N|null|0]
        [--node-kill ranks|tasks] [--set requeue.resident_launcher=true]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from labjobs import (
    ROOT,
    digest,
    ends,
    gone,
    job_id,
    rank_pid,
    rank_processes,
    read_json,
    records,
    requeued,
    run_processes,
    submit,
    wait_for,
)

QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def training(run: Path, crashes: int) -> bool:
    """Whether the attempt after `crashes` crashes has done a step."""
    progress = read_json(run / "progress.json")
    return progress is not None and len(ends(run)) == crashes and progress["step"] > progress["started_step"]


def crash_every(
    seconds: float, run: Path, stop: threading.Event, sent: list[dict[str, Any]], node_kill: str
) -> None:
    began = wait_for("the first attempt", lambda: [r for r in records(run) if r["event"] == "begin"])
    next_at = began[0]["time"] + seconds
    while not stop.wait(max(0.0, next_at - time.time())):
        if not (run / "result.json").exists() and training(run, len(sent)):
            whole_node = len(sent) % 2 == 1
            node = run_processes if node_kill == "tasks" else rank_processes
            victims = list(node(run, "SLURM_NODEID=1")) if whole_node else [rank_pid(run, 3)]
            at = time.time()
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            sent.append({"time": at, "what": f"node 2's {node_kill}" if whole_node else "rank 3"})
            next_at = at + seconds
        else:
            next_at = time.time() + 0.1


def one(
    out: Path, extra: tuple[str, ...], every: float | None, node_kill: str = "ranks"
) -> tuple[Path, float, list[dict[str, Any]]]:
    run = submit(out, *extra, experiment=QUICKSTART)
    stop, sent = threading.Event(), []
    if every:
        threading.Thread(target=crash_every, args=(every, run, stop, sent, node_kill), daemon=True).start()
    wait_for("the run to end", lambda: (run / "attempts.jsonl").exists() and gone(job_id(run)), timeout=3600)
    stop.set()
    events = records(run)
    final = ends(run)[-1]
    if final["reason"] != "completed":
        raise SystemExit(f"{run}: ended {final['reason']}: {final['message']}")
    first_begin = next(r for r in events if r["event"] == "begin")
    return run, final["time"] - first_begin["time"], sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--every", type=float, default=40.0)
    parser.add_argument("--snapshot-every", default=None, help="N, null (chosen, the default) or 0 (off)")
    parser.add_argument(
        "--node-kill",
        choices=("ranks", "tasks"),
        default="ranks",
        help="what goes at a node's crash: its ranks, or every process of its tasks",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides for both runs"
    )
    args = parser.parse_args()
    extra = (f"train.epochs={args.epochs}", *args.set) + (
        () if args.snapshot_every is None else (f"checkpoint.snapshot_every_steps={args.snapshot_every}",)
    )
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        plain, plain_wall, _ = one(Path(tmp), extra, None)
        print(f"uninterrupted: {plain_wall:.1f} s from first begin to last end", flush=True)
        faulted, wall, sent = one(Path(tmp), extra, args.every, args.node_kill)
        crashes = [end for end in ends(faulted) if end["reason"] == "failure"]
        begins = [r for r in records(faulted) if r["event"] == "begin"][1:]
        for crash, end, began in zip(sent, crashes, begins, strict=False):
            print(
                f"  {crash['what']} killed at step {end['step']}: the attempt's end "
                f"{end['time'] - crash['time']:.1f} s later, in_job={end.get('in_job', False)}, "
                f"the next begin {began['time'] - end['time']:.1f} s after it",
                flush=True,
            )
        same = digest(faulted) == digest(plain)
        print(
            f"faulted: {wall:.1f} s, {len(sent)} crashes ({len(crashes)} failure ends, "
            f"{len(begins) + 1} attempts), "
            f"{'through the queue (REQUEUED)' if requeued(job_id(faulted)) else 'no requeue'}, "
            f"{'bit-identical' if same else 'OTHER PARAMETERS than the uninterrupted run'}"
        )
        if crashes:
            gaps = [b["time"] - e["time"] for e, b in zip(crashes, begins, strict=False)]
            lost = (wall - plain_wall) / len(crashes)
            print(f"lost per crash: {lost:.1f} s (median end -> next begin {statistics.median(gaps):.1f} s)")
        print(f"goodput ratio (uninterrupted wall / faulted wall): {plain_wall / wall:.3f}")


if __name__ == "__main__":
    main()
