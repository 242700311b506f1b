"""The batch script's side of requeueing: record every attempt, decide whether to requeue, requeue.

    python -m slurmddp.job.attempts begin RUN_DIR           (before srun)
    python -m slurmddp.job.attempts end RUN_DIR STATUS      (after srun, with srun's exit status)

It runs in the batch script, on the job's first node and outside any container the ranks may run
in, so `squeue`/`scontrol` are at hand even when the ranks' image lacks them. The history lives in
RUN_DIR/attempts.jsonl, one JSON record per line, not in a pickle: sacct shows only a job's last
allocation, and this log is what `status` and the budgets read.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from slurmddp import yamlio
from slurmddp.cluster import hostlist, slurm
from slurmddp.defaults import BUDGETS, EXIT_FINISHED, SIGNAL_LEAD_S, EndReason, RequeueReason
from slurmddp.files import write_json
from slurmddp.layout import ATTEMPTS, CONFIG, EXCLUDED, FAILURE, INTERRUPT, PROGRESS, RESULT, STOP, SWEEP

CANCELLED: EndReason = "cancelled"
"""The reason `slurmddp cancel` records: final, and never requeued."""

PreemptTime = Callable[[str], str | None]
"""squeue's PreemptTime of a job id (None: not picked for preemption); a parameter for tests."""
TimeLeft = Callable[[str], float | None]
"""squeue's TimeLeft of a job id in seconds (None: unlimited or unknown); a parameter for tests."""
PartitionNodes = Callable[[str], int | None]
"""How many nodes a partition has (None: unknown); a parameter for tests."""
FailedNodes = Callable[[list[str], float], dict[str, str]]
"""The nodes of a list that went down since a time, with why; a parameter for tests."""
SLURM_SIGNAL_EARLY_S = 60
"""sbatch --signal: "Slurm may send the signal up to 60 seconds earlier than specified"."""
SIGNAL_SLACK_S = 30
"""For the time between the signal and the squeue that reads the time left."""


@dataclass(frozen=True)
class Decision:
    reason: EndReason
    step: int | None
    requeue: bool
    message: str
    leave_out: dict[str, str] = field(default_factory=dict)
    """Hosts found bad in this attempt, with why: the requeued job runs without them."""


def read_attempts(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / ATTEMPTS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def current(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records since the last `resubmit`: a resubmitted run starts with fresh budgets."""
    marks = [i for i, record in enumerate(records) if record["event"] == "resubmit"]
    return records[marks[-1] + 1 :] if marks else records


def final_end(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The record that ended the run for good (completed, cancelled, out of budget), if any."""
    ends = [r for r in current(records) if r["event"] == "end"]
    return ends[-1] if ends and ends[-1].get("final") else None


def mark(run_dir: Path, record: dict[str, Any]) -> None:
    """Append a record from outside the job: a cancel (final) or a resubmit (fresh budgets)."""
    _append(run_dir, record)


def _append(run_dir: Path, record: dict[str, Any]) -> None:
    with (run_dir / ATTEMPTS).open("a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _attempt_id(env: Mapping[str, str]) -> dict[str, Any]:
    return {"job_id": env.get("SLURM_JOB_ID", ""), "restart_count": int(env.get("SLURM_RESTART_COUNT") or 0)}


def begin(
    run_dir: Path,
    env: Mapping[str, str],
    now: float,
    failed_nodes: FailedNodes = slurm.failed_nodes,
    partition_nodes: PartitionNodes = slurm.partition_nodes,
) -> int:
    """Record the start of an attempt (and the silent end of a previous one that was killed), and
    leave out the nodes that went down under the previous attempt (Slurm's NODE_FAIL)."""
    records = read_attempts(run_dir)
    final = final_end(records)
    if final is not None:
        print(f"slurmddp: this run already ended ({final['message']}); not starting again", file=sys.stderr)
        return EXIT_FINISHED
    begins = [r for r in records if r["event"] == "begin"]
    era = current(records)
    if len([r for r in era if r["event"] == "begin"]) > len([r for r in era if r["event"] == "end"]):
        # The previous attempt's batch script was killed before it could say how it ended
        # (e.g. preempted past GraceTime): Slurm requeued it by itself.
        _append(
            run_dir,
            {
                "event": "end",
                "attempt": len(begins) - 1,
                "reason": "killed",
                "time": now,
                "step": _progress_step(run_dir),
                "requeue": True,
                "final": False,
                "message": "the batch script was killed before the attempt ended",
            },
        )
    _leave_out_failed_nodes(run_dir, env, now, failed_nodes, partition_nodes)
    _append(
        run_dir,
        {
            "event": "begin",
            "attempt": len(begins),
            "time": now,
            "host": socket.gethostname(),
            "nodes": env.get("SLURM_JOB_NODELIST", ""),
            **_attempt_id(env),
        },
    )
    return 0


def decide(
    run_dir: Path,
    status: int,
    env: Mapping[str, str],
    preempt_time: PreemptTime,
    time_left: TimeLeft = slurm.time_left,
    partition_nodes: PartitionNodes = slurm.partition_nodes,
    failed_nodes: FailedNodes = slurm.failed_nodes,
) -> Decision:
    """How this attempt ended and whether the job goes around again."""
    me = _attempt_id(env)
    stop = _this_attempt(run_dir / STOP, me)
    failure = _this_attempt(run_dir / FAILURE, me)
    budgets = _budgets(run_dir)
    history = [r for r in current(read_attempts(run_dir)) if r["event"] == "end"]
    # result.json of this attempt: every rank returned from the function (rank 0 wrote it after
    # gathering their results). That is completion, whatever status srun then reported.
    if (stop is None and status == 0) or _this_attempt(run_dir / RESULT, me) is not None:
        return Decision("completed", _progress_step(run_dir), False, "completed")
    reason: RequeueReason = "failure"
    why = ""
    if stop is not None and not _crashed_first(failure, stop):
        reason, why = _classify(run_dir, me, env, stop, preempt_time, time_left)
    leave_out: dict[str, str] = {}
    if reason == "failure":
        step = failure["step"] if failure else _progress_step(run_dir)
        if failure and failure.get("cause"):
            why = f" ({failure['cause']})"
        known = set(excluded(run_dir)) | _user_excluded(run_dir)
        found = {h: r for h, r in (failure or {}).get("bad_hosts", {}).items() if h not in known}
        began = [r for r in current(read_attempts(run_dir)) if r["event"] == "begin"]
        down = _went_down(began[-1], known, failed_nodes) if began else {}
        if down:
            # A node failure, not srun ending the ranks after a crash, whatever the ranks saw.
            why = f" ({'; '.join(f'{host} {text}' for host, text in sorted(down.items()))})"
            found = {**found, **down}
        if found:
            # Another node next time: neither a broken node's failure nor the same step is final.
            refused = _cannot_leave_out(run_dir, found, known, env, partition_nodes)
            if refused:
                return Decision(reason, step, False, f"{failure and failure['error']}: {refused}")
            leave_out = found
            why += f"; leaving out {', '.join(sorted(found))}"
        elif failure and failure.get("retry") is False:
            return Decision(reason, step, False, f"{failure['error']}: not retrying")
        else:
            earlier = [r for r in history if r["reason"] == "failure"]
            if earlier and step is not None and earlier[-1].get("step") == step:
                return Decision(reason, step, False, f"crashed at step {step} twice in a row: not retrying")
    else:
        step = stop["step"] if stop else None
    allowed = budgets[reason]
    used = sum(1 for r in history if r["reason"] == reason) + 1
    if allowed >= 0 and used > allowed:
        return Decision(
            reason, step, False, f"{reason} budget spent ({used - 1} requeues of {allowed} allowed){why}"
        )
    where = f" at step {step}" if step is not None else ""
    return Decision(
        reason,
        step,
        True,
        f"{reason}{where}{why}; requeue {used} (budget {_budget_text(allowed)})",
        leave_out,
    )


def excluded(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The hosts this run leaves out ({host: {"reason", "attempt", "time"}}), oldest first."""
    try:
        hosts: dict[str, dict[str, Any]] = json.loads((run_dir / EXCLUDED).read_text())["hosts"]
    except (OSError, ValueError, KeyError):
        return {}
    return hosts


def _user_excluded(run_dir: Path) -> set[str]:
    text = _config(run_dir).get("resources", {}).get("exclude")
    return set(hostlist.expand(text)) if text else set()


def _user_nodelist(run_dir: Path) -> set[str]:
    sbatch = _config(run_dir).get("resources", {}).get("sbatch") or {}
    text = sbatch.get("nodelist") or sbatch.get("w")
    return set(hostlist.expand(str(text))) if text else set()


def _cannot_leave_out(
    run_dir: Path,
    found: Mapping[str, str],
    known: set[str],
    env: Mapping[str, str],
    partition_nodes: PartitionNodes,
) -> str | None:
    """Why leaving `found` out cannot work (the job names it in its nodelist, or too few nodes
    would be left to start it), or None."""
    pinned = sorted(set(found) & _user_nodelist(run_dir))
    if pinned:
        return (
            f"the job's resources.sbatch.nodelist names {', '.join(pinned)}, so it cannot run without "
            "it: not retrying"
        )
    partition = env.get("SLURM_JOB_PARTITION", "")
    total = partition_nodes(partition) if partition else None
    needed = int(env.get("SLURM_JOB_NUM_NODES") or 1)
    left = None if total is None else total - len(known) - len(found)
    if left is None or left >= needed:
        return None
    return (
        f"leaving out {', '.join(sorted(found))} as well as {len(known)} node(s) already would leave "
        f"{left} of partition {partition}'s {total} nodes for a job of {needed}: not retrying"
    )


def _leave_out_failed_nodes(
    run_dir: Path,
    env: Mapping[str, str],
    now: float,
    failed_nodes: FailedNodes,
    partition_nodes: PartitionNodes,
) -> None:
    """A node failure ends the job NODE_FAIL and Slurm requeues it itself: the end of the attempt
    may not be recorded, or recorded before the accounting had the node's event. Its nodes that
    went down are left out from here on."""
    era = current(read_attempts(run_dir))
    begins = [r for r in era if r["event"] == "begin"]
    ends = [r for r in era if r["event"] == "end"]
    if not begins or not ends or ends[-1]["reason"] not in ("killed", "failure"):
        return
    known = set(excluded(run_dir)) | _user_excluded(run_dir)
    found = _went_down(begins[-1], known, failed_nodes)
    if not found:
        return
    names = ", ".join(sorted(found))
    refused = _cannot_leave_out(run_dir, found, known, env, partition_nodes)
    if refused:
        print(f"slurmddp: {names} went down under the last attempt; {refused}", file=sys.stderr)
        return
    _leave_out(run_dir, found, int(begins[-1]["attempt"]), now)
    print(f"slurmddp: leaving out {names}: went down under the last attempt", file=sys.stderr)


def _went_down(attempt: Mapping[str, Any], known: set[str], failed_nodes: FailedNodes) -> dict[str, str]:
    """The nodes of an attempt (its begin record), besides `known`, that went down while it ran
    (sacct does not say which node of a NODE_FAIL job failed), each with why."""
    nodes = [n for n in hostlist.expand(attempt.get("nodes") or "") if n not in known]
    found = failed_nodes(nodes, float(attempt["time"])) if nodes else {}
    return {host: f"went down under attempt {attempt['attempt']} ({why})" for host, why in found.items()}


def end(
    run_dir: Path,
    status: int,
    env: Mapping[str, str],
    now: float,
    preempt_time: PreemptTime,
    time_left: TimeLeft = slurm.time_left,
    partition_nodes: PartitionNodes = slurm.partition_nodes,
    failed_nodes: FailedNodes = slurm.failed_nodes,
) -> int:
    """Record how this attempt ended and requeue it if it goes around again. Rank 0 calls this
    right after a stop; the batch script calls it after srun, and then only repeats the requeue
    if rank 0 already recorded one (the job being still alive means that requeue failed)."""
    records = read_attempts(run_dir)
    final = final_end(records)
    if final is not None and final["reason"] == CANCELLED:
        # `slurmddp cancel` marked the run before scancel; requeueing now would revive it
        # (scontrol requeue takes a job cancelled a moment ago, seen on 22.05.8).
        print("slurmddp: the run was cancelled; not requeueing", file=sys.stderr)
        return 1
    me = _attempt_id(env)
    last = records[-1] if records else {}
    if last.get("event") == "end" and all(last.get(key) == value for key, value in me.items()):
        decision = Decision(last["reason"], last["step"], last["requeue"], last["message"])
    else:
        decision = decide(run_dir, status, env, preempt_time, time_left, partition_nodes, failed_nodes)
        begins = [r for r in records if r["event"] == "begin"]
        record = {
            "event": "end",
            "attempt": max(0, len(begins) - 1),
            "reason": decision.reason,
            "step": decision.step,
            "status": status,
            "time": now,
            "requeue": decision.requeue,
            "final": not decision.requeue,
            "message": decision.message,
        }
        if decision.leave_out:
            _leave_out(run_dir, decision.leave_out, max(0, len(begins) - 1), now)
        _append(run_dir, {**record, **me})
        print(f"slurmddp: attempt ended: {decision.message}", file=sys.stderr)
    if not decision.requeue:
        return 0 if decision.reason == "completed" else 1
    target = requeue_target(env)
    found = set(excluded(run_dir))
    # The user's resources.exclude too: the update replaces the job's list.
    hosts = sorted(found | _user_excluded(run_dir)) if found else []
    refused = slurm.requeue_excluding(target, hosts) if hosts else slurm.requeue(target)
    if refused is not None:
        # The job may already be on its way back (a preemption in REQUEUE mode requeues by itself).
        print(f"slurmddp: scontrol requeue {target}: {refused}", file=sys.stderr)
    return 0


def _leave_out(run_dir: Path, found: Mapping[str, str], attempt: int, now: float) -> None:
    hosts = excluded(run_dir)
    hosts.update(
        {host: {"reason": reason, "attempt": attempt, "time": now} for host, reason in found.items()}
    )
    write_json(run_dir / EXCLUDED, {"hosts": hosts})


def requeue_target(env: Mapping[str, str]) -> str:
    """The id to requeue: one array task, not the whole array (`scontrol requeue ARRAYID` takes all)."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID", "")


def _classify(
    run_dir: Path,
    me: Mapping[str, Any],
    env: Mapping[str, str],
    stop: Mapping[str, Any],
    preempt_time: PreemptTime,
    time_left: TimeLeft,
) -> tuple[RequeueReason, str]:
    """Why the ranks were told to stop, from what Slurm says, not from elapsed time; with words
    for the record when it is not what the signal alone suggests.

    slurmctld sets a job's PreemptTime when it picks the job for preemption (seen on 22.05.8); a
    job signalled for its time limit has none, and has at most the signal's lead (Slurm may send
    it up to 60 s early) left when the signal came. A stop with neither is srun ending the other
    ranks after one died without a word (killed, out of memory, a segfault): a failure.
    `slurmddp interrupt` names the reason itself.
    """
    forced = _this_attempt(run_dir / INTERRUPT, me)
    if forced is not None:
        return cast(RequeueReason, forced["reason"]), ""
    job = requeue_target(env) or env.get("SLURM_JOB_ID", "")
    if preempt_time(job) is not None:
        return "preemption", ""
    left = time_left(job)
    if left is None:
        return "timeout", ""
    signalled = float(stop.get("signal_at") or stop.get("time") or time.time())
    left_at_signal = left + max(0.0, time.time() - signalled)
    lead = _signal_lead_s(run_dir)
    if left_at_signal <= lead + SLURM_SIGNAL_EARLY_S + SIGNAL_SLACK_S:
        return "timeout", ""
    return "failure", (
        f" ({stop.get('signal', 'a stop signal')} with {left_at_signal:.0f} s of the time limit left and no "
        "preemption: srun ending the other ranks after one died)"
    )


def _crashed_first(failure: Mapping[str, Any] | None, stop: Mapping[str, Any]) -> bool:
    """A rank recorded a crash before the stop signal came: the signal was srun ending the others
    (--kill-on-bad-exit), not a request to stop."""
    if failure is None:
        return False
    signalled = stop.get("signal_at") or stop.get("time")
    return signalled is None or float(failure["time"]) <= float(signalled)


def record_failure(run_dir: Path, record: dict[str, Any], *, replace: bool = False) -> bool:
    """Write RUN_DIR/failure.json, the attempt's failure record (`record` names its job_id and
    restart_count); whether it was written. The first record of an attempt stands: what crashed
    first is the cause, and the errors of the ranks it left behind ("Connection closed by peer")
    are consequences. `replace`: a verdict that outranks any of those (the watchdog's diagnosis of
    a hang, a failed preflight, which runs before any step)."""
    path = run_dir / FAILURE
    if not replace and this_attempt(path, str(record["job_id"]), int(record["restart_count"])) is not None:
        return False
    write_json(path, record)
    return True


def this_attempt(path: Path, job_id: str, restart_count: int) -> dict[str, Any] | None:
    """The record at `path` if the attempt (job_id, restart_count) wrote it, else None."""
    return _this_attempt(path, {"job_id": job_id, "restart_count": restart_count})


def _this_attempt(path: Path, me: Mapping[str, Any]) -> dict[str, Any] | None:
    """A record written during this attempt (same job, same restart count), else None."""
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    mine = (
        str(record.get("job_id")) == str(me["job_id"]) and record.get("restart_count") == me["restart_count"]
    )
    return record if mine else None


def _progress_step(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / PROGRESS).read_text())["step"])
    except (OSError, ValueError, KeyError):
        return None


def _config(run_dir: Path) -> dict[str, Any]:
    config = yamlio.load((run_dir / CONFIG).read_text())
    return config if isinstance(config, dict) else {}


def _budgets(run_dir: Path) -> dict[RequeueReason, int]:
    section = _config(run_dir).get("requeue", {})
    return {
        "timeout": int(section.get("max_timeouts", BUDGETS["timeout"])),
        "preemption": int(section.get("max_preemptions", BUDGETS["preemption"])),
        "failure": int(section.get("max_failures", BUDGETS["failure"])),
    }


def _signal_lead_s(run_dir: Path) -> float:
    section = _config(run_dir).get("requeue", {})
    return float(section.get("signal_lead_s", SIGNAL_LEAD_S))


def _budget_text(allowed: int) -> str:
    return "unlimited" if allowed < 0 else str(allowed)


def main(argv: list[str]) -> int:
    # A sweep's batch script names the sweep directory and its submission; the array task picks
    # the element it runs from the sweep manifest.
    if len(argv) in (4, 5) and argv[-2] == "--submission":
        run_dir = element_dir(Path(argv[1]), int(argv[-1]), os.environ)
        argv = [argv[0], str(run_dir), *argv[2:-2]]
    if len(argv) == 2 and argv[0] == "begin":
        return begin(Path(argv[1]), os.environ, time.time())
    if len(argv) == 3 and argv[0] == "end":
        return end(Path(argv[1]), int(argv[2]), os.environ, time.time(), slurm.preempt_time)
    print(
        "usage: python -m slurmddp.job.attempts begin RUN_DIR | end RUN_DIR STATUS "
        "(each optionally followed by --submission N for a sweep)",
        file=sys.stderr,
    )
    return 2


def run_dir_of(folder: Path, env: Mapping[str, str]) -> Path | None:
    """The run directory of the job whose submitit folder is `folder` (RUN_DIR/logs, or a sweep's
    SWEEP_DIR/logs, where the array task's own element is looked up by its job id); None when it
    cannot be told (a submission whose job id is not recorded yet)."""
    parent = folder.parent
    if (parent / SWEEP).is_file():
        manifest = json.loads((parent / SWEEP).read_text())
        job = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID")
        numbers = [n for n, s in enumerate(manifest["submissions"]) if str(s.get("job_id")) == job]
        return element_dir(parent, numbers[0], env) if numbers else None
    return parent if (parent / CONFIG).is_file() else None


def element_dir(sweep_dir: Path, submission: int, env: Mapping[str, str]) -> Path:
    """The run directory of the element this array task runs (a one-element submission is a
    plain job, without SLURM_ARRAY_TASK_ID)."""
    manifest = json.loads((sweep_dir / SWEEP).read_text())
    position = int(env.get("SLURM_ARRAY_TASK_ID") or 0)
    index = manifest["submissions"][submission]["elements"][position]
    return sweep_dir / str(manifest["elements"][index]["dir"])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
