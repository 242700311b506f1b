"""A rank SIGKILLed mid-run: kill -> teardown -> relaunch -> first step, inside the allocation
(requeue.in_job_restarts, default 3), through the queue (requeue.in_job_restarts=0), and a node
lost with a spare to take its place (resources.spare_nodes=1).

On the lab cluster (the lab's export line in the environment: `eval "$(tests/slurm_lab/up)"`),
2 nodes x 2 ranks, a checkpoint every 100 steps, at a random step between 150 and 450, the
synthetic example (no loader workers) or, with `--example quickstart`, the quickstart as shipped
(2 loader workers a rank): `in-job` and `queue` SIGKILL rank 3 (second node); `spare` SIGKILLs
both ranks of the second node and drains it (resumed after the run); `silent` makes the second
node go silent (its link down, every process on it stopped: nothing sends a FIN) with a spare to
take its place, and `silent-queue` the same without a spare (the job is requeued excluding it).
A silent node comes back, as a rebooted one, once the run has its result.
The scenarios alternate, --rounds runs each. Per run and as medians it prints:

    teardown    the fault -> the attempt's end record (srun returned or was ended; the batch
                script decided)
    relaunch    the end record -> the next attempt's begin record
    first step  that begin -> the restarted attempt's first progress record (its first step done)
    redone      the step the crash stopped the attempt at (its end record) less the step the
                restarted attempt started from (an in-memory snapshot's, or a checkpoint's),
                against the snapshot interval rank 0 said last before the crash (it says it
                again where the chosen one moves by half or twice)

and whether the job went through the queue (sacct shows a REQUEUED incarnation). Every run must
end COMPLETED with the parameters of an uninterrupted run of the same settings, run first.

    python benchmarks/restart_latency.py [--rounds 5] [--example quickstart] [--scenarios in-job,silent]
        [--snapshot-every N|null|0]   # checkpoint.snapshot_every_steps (default: null, chosen)
        [--set requeue.resident_launcher=true]   # more overrides, for every run
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labjobs import (
    INTERVAL_SAID,
    ROOT,
    SYNTHETIC,
    digest,
    ends,
    gone,
    job_id,
    rank_0_said,
    rank_pid,
    read_json,
    records,
    requeued,
    step,
    submit,
    wait_for,
)

from slurmddp.cluster import hostlist


@dataclass(frozen=True)
class Row:
    teardown: float
    relaunch: float
    first: float
    queued: bool
    redone: int
    interval: int | None
    """The snapshot interval rank 0 said last before the crash; None: none said."""
    intervals: str
    """Every interval rank 0 said, in order."""
    resumed: str

    @property
    def total(self) -> float:
        return self.teardown + self.relaunch + self.first


EXAMPLES = {
    "synthetic": (SYNTHETIC, ("train.steps=1500", "train.log_every=500", "checkpoint.every_steps=100")),
    "quickstart": (ROOT / "examples" / "quickstart.yaml", ("train.epochs=40", "checkpoint.every_steps=100")),
}
SPARE = {"spare", "silent"}


def uninterrupted(out: Path, example: str, extra: tuple[str, ...]) -> str:
    experiment, settings = EXAMPLES[example]
    run = submit(out, *settings, *extra, experiment=experiment)
    wait_for("the uninterrupted run", lambda: gone(job_id(run)), timeout=900)
    return digest(run)


def one(out: Path, example: str, scenario: str, kill_at: int, reference: str, extra: tuple[str, ...]) -> Row:
    experiment, settings = EXAMPLES[example]
    run = submit(
        out,
        *settings,
        *extra,
        f"requeue.in_job_restarts={0 if scenario == 'queue' else 3}",
        f"resources.spare_nodes={1 if scenario in SPARE else 0}",
        experiment=experiment,
    )
    wait_for(f"step {kill_at}", lambda: step(run) >= kill_at)
    killed = read_json(run / "progress.json")
    node = hostlist.expand(next(r for r in records(run) if r["event"] == "begin")["nodes"])[-1]
    revive = None
    if scenario.startswith("silent"):
        revive = silence(node)
        killed_at = time.time()
    else:
        victims = [rank_pid(run, 3)] + ([rank_pid(run, 2)] if scenario == "spare" else [])
        killed_at = time.time()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
    if scenario == "spare":
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=drain", "reason=benchmark"], check=True
        )
    end = wait_for("the attempt to end", lambda: ends(run), timeout=300)[0]
    begins = wait_for("the next attempt", lambda: [r for r in records(run) if r["event"] == "begin"][1:])
    began = begins[0]

    def restarted() -> dict[str, Any] | None:
        progress = read_json(run / "progress.json")
        same = progress is None or all(
            progress.get(k) == killed.get(k) for k in ("restart_count", "in_job_restart")
        )
        return None if same else progress

    first = wait_for("the restarted attempt's first step", restarted, timeout=300)
    wait_for("the run's result", lambda: (run / "result.json").exists(), timeout=900)
    if revive is not None:
        revive()
    if scenario == "spare":
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True)
    wait_for("the job to end", lambda: gone(job_id(run)), timeout=900)
    final = ends(run)[-1]
    if final["reason"] != "completed":
        raise SystemExit(f"{run}: ended {final['reason']}: {final['message']}")
    if digest(run) != reference:
        raise SystemExit(f"{run}: completed on other parameters than the uninterrupted run")
    return Row(
        end["time"] - killed_at,
        began["time"] - end["time"],
        first["time"] - began["time"],
        requeued(job_id(run)),
        end["step"] - first["started_step"],
        interval_before_the_crash(run),
        snapshot_interval(run),
        resumed_from(run),
    )


def resumed_from(run: Path) -> str:
    """What the restarted attempt's rank 0 said it resumed from (the last such line of its logs)."""
    said = rank_0_said(run, RESUMED)
    return said[-1] if said else "?"


RESUMED = "slurmddp: resumed from "


def snapshot_interval(run: Path) -> str:
    """The in-memory snapshots' intervals rank 0 announced, in order (it says the interval again
    where it moved); "?": none."""
    return ", ".join(line.split()[0] for line in rank_0_said(run, INTERVAL_SAID)) or "?"


def interval_before_the_crash(run: Path) -> int | None:
    """The interval rank 0 said last before the restarted attempt said what it resumed from."""
    said = None
    for line in rank_0_said(run, ""):
        if line.startswith(RESUMED):
            break
        if line.startswith(INTERVAL_SAID):
            said = int(line.removeprefix(INTERVAL_SAID).split()[0])
    return said


def silence(node: str) -> Callable[[], None]:
    """`node` as a node that died looks from outside: its link down, every process on it stopped.
    Returns what brings it back (and waits until Slurm has it idle again)."""
    netns = os.environ["SLURMDDP_LAB_NETNS_PREFIX"] + node
    veth = os.environ["SLURMDDP_LAB_VETH_PREFIX"] + node.removeprefix("node")
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    listed = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True)
    frozen = [int(pid) for pid in listed.stdout.split()]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)

    def revive() -> None:
        # Back as a rebooted node: none of its processes left, a fresh slurmd (the lab's own way).
        from lab_control import LabDaemons  # tests/, on the path once labjobs is imported

        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
        lab = LabDaemons(os.environ)
        lab.start_slurmd(node)

        def idle() -> bool:
            said = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True)
            return said.stdout.split()[:1] == ["idle"]

        # Slurm 22.05 kept a node that came back "mixed" with no job on it for minutes; a restarted
        # slurmctld counts allocations afresh.
        with contextlib.suppress(SystemExit):
            wait_for(f"{node} idle again", idle, timeout=20)
            return
        lab.restart_slurmctld()
        wait_for(f"{node} idle again", idle, timeout=120)

    return revive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scenarios", default="in-job,queue,spare")
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="synthetic")
    parser.add_argument("--snapshot-every", default=None, help="N, null (chosen, the default) or 0 (off)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides for both runs"
    )
    args = parser.parse_args()
    extra = (*args.set,) + (
        () if args.snapshot_every is None else (f"checkpoint.snapshot_every_steps={args.snapshot_every}",)
    )
    rows: dict[str, list[Row]] = {name: [] for name in args.scenarios.split(",")}
    chooser = random.Random(26)
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        reference = uninterrupted(Path(tmp), args.example, extra)
        for round_ in range(args.rounds):
            for name in rows:
                kill_at = chooser.randrange(150, 450)
                row = one(Path(tmp), args.example, name, kill_at, reference, extra)
                rows[name].append(row)
                print(
                    f"round {round_ + 1} {name:6} killed at step {kill_at}: teardown {row.teardown:.1f} s, "
                    f"relaunch {row.relaunch:.1f} s, first step {row.first:.1f} s, total {row.total:.1f} s, "
                    f"{row.redone} steps redone (snapshots every {row.interval} steps said last before "
                    f"the crash; all said: {row.intervals}; resumed from {row.resumed}), "
                    f"{'through the queue (REQUEUED)' if row.queued else 'no requeue'}, bit-identical",
                    flush=True,
                )
    for name, values in rows.items():
        redone = [v.redone for v in values]
        within = sum(v.interval is not None and v.redone <= v.interval for v in values)
        teardown = statistics.median(v.teardown for v in values)
        print(
            f"{name:6} median of {len(values)}: teardown {teardown:.1f} s, "
            f"relaunch {statistics.median(v.relaunch for v in values):.1f} s, "
            f"first step {statistics.median(v.first for v in values):.1f} s, "
            f"kill -> first step {statistics.median(v.total for v in values):.1f} s, "
            f"steps redone {statistics.median(redone):g} (range {min(redone)}-{max(redone)}; "
            f"at most the interval said before the crash in {within} of {len(values)})"
        )


if __name__ == "__main__":
    main()
