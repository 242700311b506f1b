"""`python -m slurmddp doctor`: is this cluster set up the way slurmddp relies on?

It checks the Slurm commands on PATH and the slurmctld settings that decide whether a preempted or
timed-out job can save and come back (`scontrol show config`), and with `--probe` it submits a
small 2-node job through slurmddp's own submit path, sends it the stop signal the way
`slurmddp interrupt` does, and checks that every rank saw it. The checks are pure functions of the
command output, so each cluster's quirks can be tested with text.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from slurmddp.cluster import slurm
from slurmddp.cluster.generations import Version, in_effect, shown
from slurmddp.cluster.slurm import TOOLS, parse_config, version
from slurmddp.errors import ConfigError, SlurmCommandError
from slurmddp.experiment.load import Loaded, load_experiment
from slurmddp.job import probe
from slurmddp.layout import PROBE
from slurmddp.manage import actions, index
from slurmddp.submit import submitter
from slurmddp.submit.prepare import plan_for

Status = Literal["OK", "WARN", "FAIL"]
OK: Status = "OK"
WARN: Status = "WARN"
FAIL: Status = "FAIL"
PROBE_NODES = 2
PROBE_READY_TIMEOUT_S = 120
"""Submit -> every rank waiting: scheduling, `import torch`, the rendezvous."""
PROBE_SIGNAL_TIMEOUT_S = 30
"""Signal sent -> every rank has recorded it."""
PROBE_END_TIMEOUT_S = 15


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    """Only FAIL makes `doctor` exit non-zero."""
    value: str
    why: str


def _words(value: str | None) -> set[str]:
    return {word.strip().lower() for word in (value or "").split(",") if word.strip()}


def _preemption_on(config: Mapping[str, str]) -> bool:
    return config.get("PreemptType", "preempt/none") != "preempt/none"


def check_tools(found: Mapping[str, str | None]) -> list[Check]:
    return [
        Check(tool, OK, path, "")
        if path
        else Check(
            tool, FAIL, "not on PATH", "slurmddp needs it on the login node; load Slurm's module or fix PATH"
        )
        for tool, path in ((tool, found.get(tool)) for tool in TOOLS)
    ]


def check_config(config: Mapping[str, str]) -> list[Check]:
    """The settings that decide whether slurmddp's save-and-requeue works on this cluster."""
    return [
        _user_signal(config),
        _preempt_mode(config),
        _job_requeue(config),
        _max_array(config),
        _accounting(config),
    ]


def _user_signal(config: Mapping[str, str]) -> Check:
    # Slurm up to 22.05 spells it SlurmctldParameters=preempt_send_user_signal; 23.02 moved it to
    # PreemptParameters=send_user_signal.
    ctld = config.get("SlurmctldParameters", "(null)")
    preempt = config.get("PreemptParameters", "(null)")
    shown = f"SlurmctldParameters={ctld}" + (
        f" PreemptParameters={preempt}" if "PreemptParameters" in config else ""
    )
    if "preempt_send_user_signal" in _words(ctld) or "send_user_signal" in _words(preempt):
        return Check(
            "preempt_send_user_signal",
            OK,
            shown,
            "a preempted job's ranks get the stop signal (--signal) first and GraceTime to save",
        )
    kill_wait = config.get("KillWait", "30 sec")
    if not _preemption_on(config):
        return Check(
            "preempt_send_user_signal",
            OK,
            shown,
            "not set, but there is no preemption (PreemptType=preempt/none)",
        )
    return Check(
        "preempt_send_user_signal",
        WARN,
        shown,
        "not set: a preempted job's ranks get SIGTERM instead of the stop signal, then SIGKILL "
        f"KillWait ({kill_wait}) later; slurmddp saves on SIGTERM too, but only a save that fits in "
        "KillWait survives. Ask the admins for preempt_send_user_signal",
    )


def _preempt_mode(config: Mapping[str, str]) -> Check:
    kind = config.get("PreemptType", "preempt/none")
    mode = config.get("PreemptMode", "OFF")
    shown = f"PreemptType={kind} PreemptMode={mode}"
    modes = _words(mode)
    name = "PreemptMode/PreemptType"
    if not _preemption_on(config) or modes <= {"off"}:
        return Check(name, OK, shown, "no preemption: only time limits stop a job")
    if "requeue" in modes:
        return Check(name, OK, shown, "a preempted job is requeued by Slurm and resumes from its checkpoint")
    if "cancel" in modes:
        return Check(
            name,
            WARN,
            shown,
            "a preempted job is cancelled after GraceTime: slurmddp requeues it itself, but only if every "
            "rank saved and rank 0 called scontrol requeue within the grace time",
        )
    if modes & {"suspend", "gang"}:
        return Check(
            name,
            WARN,
            shown,
            "preempted jobs are suspended: a suspended DDP job keeps its nodes, and peers on other nodes "
            "may time out in a collective (dist.timeout_s) while it is stopped",
        )
    return Check(name, WARN, shown, "unknown preemption mode; slurmddp was tested with REQUEUE")


def _job_requeue(config: Mapping[str, str]) -> Check:
    value = config.get("JobRequeue", "1")
    why = (
        "jobs are requeueable by default"
        if value == "1"
        else "jobs are not requeueable by default; slurmddp submits with --requeue, so its jobs still are"
    )
    return Check("JobRequeue", OK, value, why)


def _max_array(config: Mapping[str, str]) -> Check:
    raw = config.get("MaxArraySize", "1001")
    try:
        size = int(raw)
    except ValueError:
        return Check("MaxArraySize", WARN, raw, "not a number: cannot tell how large a sweep array may be")
    if size <= 1:
        return Check("MaxArraySize", WARN, raw, "job arrays are disabled: a sweep cannot run as an array")
    return Check(
        "MaxArraySize", OK, raw, f"a sweep runs as one array of up to {size} elements (indexes 0-{size - 1})"
    )


def _accounting(config: Mapping[str, str]) -> Check:
    value = config.get("AccountingStorageType", "accounting_storage/none")
    if value.endswith("/none"):
        return Check(
            "AccountingStorageType",
            WARN,
            value,
            "no accounting: sacct cannot say how a job ended (every state reads UNKNOWN); slurmddp falls "
            "back to the result files the ranks write, which a killed job never writes",
        )
    return Check("AccountingStorageType", OK, value, "accounting on: sacct reports how each job ended")


def format_checks(checks: Sequence[Check]) -> str:
    width = max((len(check.name) for check in checks), default=0)
    lines = []
    for check in checks:
        lines.append(f"  {check.status:<4}  {check.name:<{width}}  {check.value}")
        if check.why:
            lines.append(f"        {'':<{width}}  {check.why}")
    return "\n".join(lines)


def examine(
    out: TextIO,
    which: Callable[[str], str | None] = shutil.which,
    show_config: Callable[[], str] = slurm.show_config,
) -> list[Check]:
    """Run the login-node checks, print them, and return them."""
    checks = check_tools({tool: which(tool) for tool in TOOLS})
    if which("scontrol"):
        try:
            config = parse_config(show_config())
        except SlurmCommandError as exc:
            checks.append(
                Check("scontrol show config", FAIL, str(exc), "cannot reach slurmctld: check SLURM_CONF")
            )
        else:
            out.write(
                f"slurmddp doctor: Slurm {config.get('SLURM_VERSION', '?')}, cluster "
                f"{config.get('ClusterName', '?')}\n"
            )
            checks += check_config(config)
            out.write(describe_generation(version(), config) + "\n")
    out.write(format_checks(checks) + "\n")
    out.flush()
    return checks


def describe_generation(found: Version | None, config: Mapping[str, str]) -> str:
    """What changed between the Slurm releases slurmddp is tested on (22.05, 24.11), which side of
    each change this cluster is on, and what slurmddp does about it."""
    lines = [
        f"slurmddp doctor: batch scripts are written for Slurm {shown(found)} (sbatch --version); "
        "what changed in names and meanings between 22.05 and 24.11:"
    ]
    for change, new in in_effect(found):
        value = f"; here {change.setting}={config.get(change.setting, '(unset)')}" if change.setting else ""
        lines.append(f"  {'from' if new else 'not yet'} {shown(change.since)}: {change.name}{value}")
        lines.append(f"        {change.said}")
        lines.append(f"        slurmddp: {change.handled}")
    return "\n".join(lines)


def failed(checks: Sequence[Check]) -> bool:
    return any(check.status == FAIL for check in checks)


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
    entrypoint = f"{Path(probe.__file__).resolve()}:wait_for_stop"
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
    folder = plan.run_dir / PROBE
    try:
        ready = _wait(
            lambda: len(list(folder.glob("ready-*.json"))) >= world or _gone(sub.job_id),
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
            lambda: _gone(sub.job_id) or len(list(folder.glob("rank-*.json"))) >= world,
            PROBE_SIGNAL_TIMEOUT_S,
        )
        seen = _read_ranks(folder, world)
        # A rank returns once it has seen the signal, so the job ends by itself (and records its end
        # as final); a job still there after this is cancelled below.
        _wait(lambda: _gone(sub.job_id), PROBE_END_TIMEOUT_S)
    finally:
        if not _gone(sub.job_id):
            slurm.cancel_quietly(sub.job_id)
    missing = [rank for rank in range(world) if (seen[rank] or {}).get("signal") is None]
    for rank in range(world):
        record = seen[rank]
        if record and record.get("signal"):
            delay = float(record["received_at"]) - sent
            out.write(
                f"  OK    rank {rank} on {record['host']}: got {record['signal']} "
                f"{delay:.2f} s after it was sent\n"
            )
        else:
            host = record["host"] if record else "?"
            out.write(f"  FAIL  rank {rank} on {host}: never saw the stop signal\n")
    total = time.monotonic() - started
    if missing:
        out.write(
            f"  FAIL  probe: {len(missing)} of {world} ranks did not see the stop signal ({total:.0f} s); "
            f"logs kept in {plan.run_dir}\n"
        )
        return False
    out.write(f"  OK    probe: the stop signal reached every rank ({total:.1f} s); run dir removed\n")
    # A run directory gone means a revived job (`scontrol requeue` of the cancelled probe) cannot start.
    shutil.rmtree(plan.run_dir, ignore_errors=True)
    return True


def _read_ranks(folder: Path, world: int) -> list[dict[str, Any] | None]:
    seen: list[dict[str, Any] | None] = []
    for rank in range(world):
        try:
            seen.append(json.loads((folder / f"rank-{rank}.json").read_text()))
        except (OSError, ValueError):
            seen.append(None)
    return seen


def _gone(job_id: str) -> bool:
    return slurm.queue_state(job_id) is None


def _wait(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def main(out: TextIO, probe_job: bool, overrides: Sequence[str]) -> int:
    """What `slurmddp doctor` does; returns its exit status (1 when a check failed)."""
    if overrides and not probe_job:
        raise ConfigError(
            f"doctor: {overrides[0]!r}: KEY=VALUE overrides configure the probe job; add --probe or drop them"
        )
    loaded = probe_experiment(overrides) if probe_job else None
    checks = examine(out)
    if failed(checks):
        if probe_job:
            out.write("slurmddp doctor: no probe: fix the failed checks first\n")
        return 1
    if loaded is not None and not run_probe(out, loaded, sys.argv):
        return 1
    return 0
