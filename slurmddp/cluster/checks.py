"""Is this cluster set up the way slurmddp relies on? The checks behind `slurmddp doctor`.

They read the Slurm commands on PATH and the slurmctld settings that decide whether a preempted or
timed-out job can save and come back (`scontrol show config`). The checks are pure functions of the
command output, so each cluster's quirks can be tested with text.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from slurmddp.cluster import runtimes, slurm
from slurmddp.cluster.generations import Version, in_effect, shown
from slurmddp.cluster.slurm import TOOLS, parse_config, version
from slurmddp.errors import SlurmCommandError

Status = Literal["OK", "WARN", "FAIL"]
OK: Status = "OK"
WARN: Status = "WARN"
FAIL: Status = "FAIL"


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


def check_runtimes(offered: runtimes.Offered) -> list[Check]:
    """One line per container runtime: what `container.runtime` may name here. An absent one is
    no fault of the cluster's."""
    return [
        Check(f"container: {name}", OK, "offered" if found else "absent", found or offered.why_not[name])
        for name in runtimes.RUNTIMES
        for found in [offered.found.get(name)]
    ]


def format_checks(checks: Sequence[Check]) -> str:
    width = max((len(check.name) for check in checks), default=0)
    lines = []
    for check in checks:
        lines.append(f"  {check.status:<4}  {check.name:<{width}}  {check.value}")
        if check.why:
            lines.append(f"        {'':<{width}}  {check.why}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Examination:
    """What the login-node checks found."""

    checks: list[Check]
    config: Mapping[str, str] | None
    """slurmctld's settings; None where scontrol is missing or slurmctld did not answer."""
    found: Version | None
    """The Slurm release of the sbatch on PATH; read only where the settings were."""


def examine(
    which: Callable[[str], str | None] = shutil.which,
    show_config: Callable[[], str] = slurm.show_config,
    srun_help: Callable[[], str] = runtimes.srun_help,
) -> Examination:
    """Run the login-node checks: the tools on PATH, the container runtimes and, where scontrol is
    one, slurmctld's settings."""
    checks = check_tools({tool: which(tool) for tool in TOOLS})
    if not which("scontrol"):
        return Examination(checks + check_runtimes(runtimes.offered(srun_help, None, which)), None, None)
    try:
        config = parse_config(show_config())
    except SlurmCommandError as exc:
        # scontrol's last line is its verdict (the lines before it, the lookups that led there).
        said = str(exc).strip().splitlines()[-1]
        checks.append(
            Check(
                "scontrol show config",
                FAIL,
                said,
                "cannot reach slurmctld: check SLURM_CONF; to train on this machine meanwhile, "
                "submit with executor=local",
            )
        )
        return Examination(checks, None, None)
    offered = runtimes.offered(srun_help, config, which)
    return Examination(checks + check_config(config) + check_runtimes(offered), config, version())


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
