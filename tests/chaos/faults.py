"""The faults of the campaign, one small function each. A fault waits for its moment in a running
trial, injects itself and says when (unix time) and what it did. Stop signals go through
`python -m slurmddp interrupt` (which records the reason and runs `scancel --signal`) or a real
preemption by a `high` partition job, as the lab tests of resume do."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from conftest import rank_mains, rank_pids, slurm_command
from lab_control import LabDaemons
from run_view import (
    CheckpointLedger,
    FaultMissed,
    begins,
    ends,
    last_step,
    wait_for,
    wait_for_step,
)

from slurmddp.cluster import hostlist
from slurmddp.rundir.records import AttemptId, Stop

RANKS = 4
NODES = 2
HIGH_JOB = ("-p", "high", "-N", "3", "--exclusive", "-t", "1", "--wrap", "sleep 3")
"""sbatch arguments of a job on the high partition that needs every core of every node."""


@dataclass(frozen=True)
class Trial:
    """One faulted run: what a fault acts on."""

    run: Path
    job_id: str
    checkpoints: Path
    env: Mapping[str, str]
    lab: LabDaemons
    rng: random.Random
    target_step: int
    """Where the fault aims: it strikes once the run trained this far."""
    scratch: Path
    """A folder of the trial's own (gates, the high job's output)."""


@dataclass(frozen=True)
class Injected:
    at: float | None
    """Unix time of the fault; None where it has no one moment (a full disk)."""
    note: str
    damaged: frozenset[int] = field(default_factory=frozenset)
    """Checkpoint steps the fault damaged itself: their loss is the fault's, not the run's."""


def slurmddp(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def interrupt(trial: Trial) -> float:
    """`slurmddp interrupt RUN --preempt`; the time it was sent."""
    proc = slurmddp(trial.env, "interrupt", str(trial.run), "--preempt")
    if proc.returncode != 0:
        raise FaultMissed(f"interrupt failed: {proc.stderr.strip()}")
    return time.time()


class GatedInterrupt:
    """`slurmddp interrupt RUN --preempt` started ahead, its `scancel` held until open(): the
    interpreter's start-up (a second) would otherwise decide when the signal lands. Start it
    while the job runs (interrupt refuses a pending job)."""

    def __init__(self, trial: Trial, name: str) -> None:
        self.gate = trial.scratch / f"{name}.open"
        self.ready = trial.scratch / f"{name}.ready"
        folder = trial.scratch / f"{name}-bin"
        folder.mkdir(parents=True)
        real = shutil.which("scancel", path=trial.env.get("PATH"))
        script = folder / "scancel"
        script.write_text(
            f'#!/bin/sh\ntouch "{self.ready}"\nwhile [ ! -e "{self.gate}" ]; do sleep 0.002; done\n'
            f'exec "{real}" "$@"\n'
        )
        script.chmod(0o755)
        env = {**trial.env, "PATH": f"{folder}:{trial.env.get('PATH', '')}"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slurmddp", "interrupt", str(trial.run), "--preempt"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_ready(self, run: Path) -> None:
        """Until its scancel waits at the gate."""
        wait_for(
            "the interrupt at its gate", lambda: self.ready.exists() or self.proc.poll() is not None, run, 60
        )
        if not self.ready.exists():
            raise FaultMissed(f"interrupt ended before its scancel: {self.result()}")

    def open(self) -> float:
        self.gate.touch()
        return time.time()

    def result(self) -> str:
        out, _ = self.proc.communicate(timeout=60)
        return "sent" if self.proc.returncode == 0 else f"refused ({out.strip().splitlines()[-1]})"


def kill_one_rank(trial: Trial) -> Injected:
    wait_for_step(trial.run, trial.target_step)
    rank = trial.rng.randrange(RANKS)
    pids = rank_pids(trial.run, rank=rank)
    main = rank_mains(trial.run, rank=rank)
    if len(main) != 1:
        raise FaultMissed(f"rank {rank} has processes {pids}, of which {main} are its own")
    step = last_step(trial.run)
    os.kill(main[0], signal.SIGKILL)
    return Injected(time.time(), f"SIGKILL rank {rank} at step {step}")


def kill_a_node(trial: Trial) -> Injected:
    wait_for_step(trial.run, trial.target_step)
    node = trial.rng.randrange(NODES)
    pids = rank_pids(trial.run, node=node)
    if not pids:
        raise FaultMissed(f"no rank process on node index {node}")
    step = last_step(trial.run)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return Injected(
        time.time(),
        f"SIGKILL the {len(pids)} processes (ranks, loader workers) of node index {node} at step {step}",
    )


def restart_slurmd(trial: Trial) -> Injected:
    wait_for_step(trial.run, trial.target_step)
    node = trial.rng.choice(hostlist.expand(begins(trial.run)[-1].nodes))
    down_s = trial.rng.uniform(5, 10)
    step = last_step(trial.run)
    trial.lab.kill_slurmd(node)
    at = time.time()
    time.sleep(down_s)
    trial.lab.start_slurmd(node)
    return Injected(at, f"slurmd of {node} SIGKILLed at step {step}, started again {down_s:.1f} s later")


def restart_slurmctld_running(trial: Trial) -> Injected:
    wait_for_step(trial.run, trial.target_step)
    step = last_step(trial.run)
    at = time.time()
    trial.lab.restart_slurmctld()
    return Injected(at, f"slurmctld restarted at step {step} ({time.time() - at:.1f} s)")


def preempted(trial: Trial) -> int:
    """`slurmddp interrupt --preempt` at the target step; the step the attempt stopped at, once
    it ended and the job went back to the queue."""
    wait_for_step(trial.run, trial.target_step)
    interrupt(trial)
    wait_for("the preempted attempt's end", lambda: len(ends(trial.run)) >= 1, trial.run)
    first = ends(trial.run)[0]
    if not first.requeue:
        raise FaultMissed(f"the stop came too late: the attempt ended {first.reason}")
    return int(first.step or 0)


def restart_slurmctld_pending(trial: Trial) -> Injected:
    step = preempted(trial)
    wait_for("the requeued job pending", lambda: queue_state(trial) == "PENDING", trial.run, timeout=30)
    at = time.time()
    trial.lab.restart_slurmctld()
    return Injected(at, f"preempted at step {step}; slurmctld restarted while pending")


def stop_during_save(trial: Trial) -> Injected:
    wait_for_step(trial.run, trial.target_step)
    gated = GatedInterrupt(trial, "stop")
    gated.wait_ready(trial.run)
    saved = set(step_dirs(trial.checkpoints))
    found: list[int] = []

    def in_progress() -> bool:
        found[:] = [step for step in [saving(trial.checkpoints, saved)] if step is not None]
        return bool(found)

    wait_for("a save in progress", in_progress, trial.run, timeout=60)
    at = gated.open()
    step = found[0]
    sent = gated.result()
    if sent != "sent":
        raise FaultMissed(f"the stop signal was not sent: {sent}")
    wait_for("the stopped attempt's end", lambda: bool(ends(trial.run)), trial.run)
    stop = Stop.read_for(trial.run, AttemptId(trial.job_id, 0))
    folder = trial.checkpoints / f"step-{step:08d}"
    finished = max((f.stat().st_mtime for f in folder.iterdir()), default=0.0) if folder.is_dir() else 0.0
    if stop is None or stop.signal_at is None or not finished:
        landed = "no stop recorded"
    elif stop.signal_at <= finished:
        landed = f"landed in the save, {1000 * (finished - stop.signal_at):.0f} ms before its last file"
    else:
        landed = f"landed {1000 * (stop.signal_at - finished):.0f} ms after the save's last file"
    return Injected(at, f"stop signal while step-{step} was being saved ({sent}; {landed})")


def stop_twice(trial: Trial) -> Injected:
    gap_s = trial.rng.uniform(0.1, 0.9)
    wait_for_step(trial.run, trial.target_step)
    first, second = GatedInterrupt(trial, "first"), GatedInterrupt(trial, "second")
    first.wait_ready(trial.run)
    second.wait_ready(trial.run)
    step = last_step(trial.run)
    at = first.open()
    time.sleep(gap_s)
    second.open()
    return Injected(
        at, f"stop signal at step {step} ({first.result()}), again {gap_s:.2f} s later ({second.result()})"
    )


def preempt_first_second(trial: Trial) -> Injected:
    wait_for("the first attempt's begin", lambda: bool(begins(trial.run)), trial.run, timeout=120)
    began = begins(trial.run)[0].time
    # Run again only where slurmctld cannot have taken the first (slurm.may_retry): two high jobs
    # would preempt the run twice.
    slurm_command(["sbatch", "-o", str(trial.scratch / "high-%j.out"), *HIGH_JOB], trial.env, check=True)
    at = time.time()
    return Injected(at, f"high partition job submitted {at - began:.2f} s after the attempt began")


def flip_a_byte(trial: Trial) -> Injected:
    preempted(trial)
    if len(begins(trial.run)) > 1:
        raise FaultMissed("the next attempt began before the byte could be flipped")
    complete = CheckpointLedger(trial.checkpoints).complete()
    newest = max(step_dirs(trial.checkpoints))
    if newest not in complete:
        raise FaultMissed(f"the newest checkpoint, step {newest}, is not complete")
    folder = trial.checkpoints / f"step-{newest:08d}"
    target = trial.rng.choice(sorted(folder.glob("*.pt")))
    data = bytearray(target.read_bytes())
    offset = trial.rng.randrange(len(data))
    data[offset] ^= 0xFF
    target.write_bytes(bytes(data))
    return Injected(
        time.time(),
        f"byte {offset} of {folder.name}/{target.name} flipped while the job was pending",
        damaged=frozenset({newest}),
    )


def disk_already_small(trial: Trial) -> Injected:
    """The checkpoint directory is a small tmpfs from the start (see full_disk_overrides)."""
    return Injected(None, f"checkpoints on a tmpfs of {disk_size(trial.checkpoints) // 1024} KB")


def queue_state(trial: Trial) -> str:
    return slurm_command(["squeue", "-h", "-j", trial.job_id, "-o", "%T"], trial.env).stdout.strip()


def step_dirs(root: Path) -> list[int]:
    try:
        return [int(p.name[5:]) for p in root.glob("step-*") if p.name[5:].isdigit()]
    except FileNotFoundError:
        return []


def saving(root: Path, before: set[int]) -> int | None:
    """A checkpoint being written now (new since `before`, no meta.json yet)."""
    for step in step_dirs(root):
        if step not in before and not (root / f"step-{step:08d}" / "meta.json").exists():
            return step
    return None


def disk_size(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_blocks * stats.f_frsize


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    inject: Callable[[Trial], Injected]
    survivable: bool = True
    """False: no tool can end such a run bit-identical; it must end with a final reason instead."""
    names: tuple[str, ...] = ()
    """Words of which the final reason must hold one, where it is not survivable."""


FAULTS = {
    fault.name: fault
    for fault in (
        Fault("rank-kill", "SIGKILL of one rank", kill_one_rank),
        Fault("node-kill", "SIGKILL of every rank of a node", kill_a_node),
        Fault("slurmd-restart", "slurmd of a node killed, started again 5-10 s later", restart_slurmd),
        Fault("slurmctld-running", "slurmctld restarted while the job runs", restart_slurmctld_running),
        Fault(
            "slurmctld-pending",
            "slurmctld restarted while the job is pending after a requeue",
            restart_slurmctld_pending,
        ),
        Fault("stop-in-save", "the stop signal during a checkpoint save", stop_during_save),
        Fault("stop-twice", "the stop signal twice within a second", stop_twice),
        Fault("preempt-first-second", "a preemption in the first second of an attempt", preempt_first_second),
        Fault("flip-byte", "a byte flipped in the newest checkpoint between attempts", flip_a_byte),
        Fault(
            "disk-full",
            "the checkpoint directory full (a small tmpfs)",
            disk_already_small,
            survivable=False,
            names=("space",),
        ),
    )
}
