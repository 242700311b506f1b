"""`slurmddp doctor --probe`: submit a small 2-node job through slurmddp's own submit path, send
it the stop signal the way `slurmddp interrupt` does, and check that every rank saw it (the ranks
run slurmddp.job.launch.probe)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from slurmddp.cluster import slurm
from slurmddp.experiment.load import Loaded, load_experiment
from slurmddp.job.launch import probe as rank_probe
from slurmddp.manage import actions, index
from slurmddp.rundir.probe import ProbeReady, ProbeSeen
from slurmddp.submit import submitter
from slurmddp.submit.prepare import plan_for

PROBE_NODES = 2
PROBE_READY_TIMEOUT_S = 120
"""Submit -> every rank waiting: scheduling, `import torch`, the rendezvous."""
PROBE_SIGNAL_TIMEOUT_S = 30
"""Signal sent -> every rank has recorded it."""
PROBE_END_TIMEOUT_S = 15

PROBE_EXPERIMENT = """\
# Written by `slurmddp doctor --probe`.
name: doctor-probe
entrypoint: {entrypoint}
resources:
  nodes: {nodes}
  tasks_per_node: 1
  cpus_per_task: 1
  time: "00:05:00"
# The probe must never come back: no requeue for any reason.
requeue:
  max_timeouts: 0
  max_preemptions: 0
  max_failures: 0
train:
  wait_s: {wait_s}
"""


def probe_experiment(overrides: Sequence[str]) -> Loaded:
    """The probe job's experiment with the user's overrides: a bad one is refused before any check."""
    entrypoint = f"{Path(rank_probe.__file__).resolve()}:wait_for_stop"
    with tempfile.TemporaryDirectory(prefix="slurmddp-probe-") as tmp:
        source = Path(tmp) / "doctor-probe.yaml"
        source.write_text(
            PROBE_EXPERIMENT.format(
                entrypoint=json.dumps(entrypoint),
                nodes=PROBE_NODES,
                wait_s=PROBE_READY_TIMEOUT_S + PROBE_SIGNAL_TIMEOUT_S,
            )
        )
        return load_experiment(source, list(overrides))


def run_probe(out: TextIO, loaded: Loaded, argv: list[str]) -> bool:
    """Submit the probe job, send it the stop signal, check every rank saw it, cancel what is left."""
    exp = loaded.experiment
    plan = plan_for(loaded, executor="slurm")
    started = time.monotonic()
    sub = submitter.submit(plan, loaded, argv)
    index.remember(plan.run_dir, "run", plan.job_name, sub.job_id)
    world = plan.world_size
    out.write(
        f"slurmddp doctor: probe job {sub.job_id}, {world} ranks on {exp.resources.nodes} nodes; "
        f"run dir {plan.run_dir}\n"
    )
    out.flush()
    try:
        ready = _wait(
            lambda: ProbeReady.count(plan.run_dir) >= world or _gone(sub.job_id),
            PROBE_READY_TIMEOUT_S,
        )
        if not ready or _gone(sub.job_id):
            out.write(
                f"  FAIL  probe: the ranks were not all running after {time.monotonic() - started:.0f} s "
                f"(job state {slurm.queue_state(sub.job_id) or 'ended'}); see the logs in {plan.folder}\n"
            )
            return False
        out.write(
            f"  ...   all {world} ranks waiting after {time.monotonic() - started:.1f} s; "
            "sending the stop signal\n"
        )
        out.write(f"  ...   {actions.interrupt(str(plan.run_dir), 'preemption')}\n")
        out.flush()
        sent = time.time()
        _wait(
            lambda: _gone(sub.job_id) or ProbeSeen.count(plan.run_dir) >= world,
            PROBE_SIGNAL_TIMEOUT_S,
        )
        seen = [ProbeSeen.read(plan.run_dir, rank) for rank in range(world)]
        # A rank returns once it has seen the signal, so the job ends by itself (and records its end
        # as final); a job still there after this is cancelled below.
        _wait(lambda: _gone(sub.job_id), PROBE_END_TIMEOUT_S)
    finally:
        if not _gone(sub.job_id):
            slurm.cancel_quietly(sub.job_id)
    missing = _say_what_each_saw(out, seen, sent)
    total = time.monotonic() - started
    if missing:
        out.write(
            f"  FAIL  probe: {missing} of {world} ranks did not see the stop signal ({total:.0f} s); "
            f"logs kept in {plan.run_dir}\n"
        )
        return False
    out.write(f"  OK    probe: the stop signal reached every rank ({total:.1f} s); run dir removed\n")
    # A run directory gone means a revived job (`scontrol requeue` of the cancelled probe) cannot start.
    shutil.rmtree(plan.run_dir, ignore_errors=True)
    return True


def _say_what_each_saw(out: TextIO, seen: list[ProbeSeen | None], sent: float) -> int:
    """A line a rank: when it got the stop signal sent at `sent`, or that it never did; how many
    never did."""
    missing = 0
    for rank, record in enumerate(seen):
        if record and record.signal:
            delay = float(record.received_at or sent) - sent
            out.write(
                f"  OK    rank {rank} on {record.host}: got {record.signal} {delay:.2f} s after it was sent\n"
            )
        else:
            missing += 1
            host = record.host if record else "?"
            out.write(f"  FAIL  rank {rank} on {host}: never saw the stop signal\n")
    return missing


def _gone(job_id: str) -> bool:
    return slurm.queue_state(job_id) is None


def _wait(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
