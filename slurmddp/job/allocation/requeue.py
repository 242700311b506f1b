"""The requeue policy: why an attempt ended, whether its budget allows another, and which nodes the
next attempt leaves out. It reads the run's records (rundir/records.py) and its settings, the typed
`requeue` and `resources` sections of the run's config.yaml, loaded once per decision."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slurmddp import yamlio
from slurmddp.cluster import hostlist, slurm
from slurmddp.defaults import EndReason, RequeueReason
from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import Requeue, Resources
from slurmddp.rundir import records
from slurmddp.rundir.layout import CONFIG
from slurmddp.rundir.records import AttemptId, Begin, End, Exclusions, Failure, Interrupt, Stop

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
SectionT = TypeVar("SectionT", Requeue, Resources)


@dataclass(frozen=True)
class Settings:
    """The run's settings the policy acts on, as the schema checked them."""

    requeue: Requeue
    resources: Resources

    @classmethod
    def of_run(cls, run_dir: Path) -> Settings:
        """The two sections of the run's config.yaml (the resolved experiment), typed and checked
        by the schema. Not the whole experiment: its checks include what this Python can import
        (trackers.mlflow needs mlflow), and the batch script may run outside the ranks' container."""
        path = run_dir / CONFIG
        config = yamlio.load(path.read_text())
        if not isinstance(config, dict):
            config = {}
        return cls(_section(Requeue, config, "requeue", path), _section(Resources, config, "resources", path))

    def budget(self, reason: RequeueReason) -> int:
        """Requeues allowed for `reason`; -1: unlimited."""
        return {
            "timeout": self.requeue.max_timeouts,
            "preemption": self.requeue.max_preemptions,
            "failure": self.requeue.max_failures,
        }[reason]

    def user_excluded(self) -> set[str]:
        text = self.resources.exclude
        return set(hostlist.expand(text)) if text else set()

    def user_nodelist(self) -> set[str]:
        sbatch = self.resources.sbatch
        text = sbatch.get("nodelist") or sbatch.get("w")
        return set(hostlist.expand(str(text))) if text else set()


def _section(kind: type[SectionT], config: Mapping[str, Any], key: str, path: Path) -> SectionT:
    try:
        section = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind), config.get(key) or {}))
    except (OmegaConfBaseException, ConfigError) as exc:
        raise ConfigError(f"{path}: {key}: {exc}") from None
    assert isinstance(section, kind)
    return section


@dataclass(frozen=True)
class Decision:
    reason: EndReason
    step: int | None
    requeue: bool
    message: str
    leave_out: dict[str, str] = field(default_factory=dict)
    """Hosts confirmed bad in this attempt, with why: the rest of the run (requeues and resubmits
    included) runs without them."""
    in_job: bool = False
    """Goes around again as a new srun step of this allocation, not through the queue."""
    signature: str | None = None
    """A failure: what failed (`signature`), for the next attempt's decision."""
    set_aside: dict[str, str] = field(default_factory=dict)
    """Hosts only suspected in this attempt, with why: this allocation's restarts run on a spare
    in their place, and a requeue may give them ranks again."""


def decide(
    run_dir: Path,
    status: int,
    env: Mapping[str, str],
    settings: Settings,
    preempt_time: PreemptTime,
    time_left: TimeLeft = slurm.time_left,
    partition_nodes: PartitionNodes = slurm.partition_nodes,
    failed_nodes: FailedNodes = slurm.failed_nodes,
) -> Decision:
    """How this attempt ended and whether the job goes around again.

    srun's status 128 + the stop signal (140 for USR2) means the signal itself ended a rank, one
    that had no handler yet (a task still starting): Slurm asked the job to stop (seen on 22.05
    with a 1-minute time limit), and srun never sends that signal after a crash. It is a stop,
    whatever a rank recorded after it (rank 0 hears that rank end without a word), and without a
    stop record (no rank got to save) it is one at the newest step the run recorded."""
    me = AttemptId.from_env(env)
    stop = Stop.read_for(run_dir, me)
    failure = Failure.read_for(run_dir, me)
    era = records.current(records.read_attempts(run_dir))
    history = records.ends(era)
    # result.json of this attempt: every rank returned from the function (rank 0 wrote it after
    # gathering their results). That is completion, whatever status srun then reported.
    if (stop is None and status == 0) or records.completed_by(run_dir, me):
        return Decision("completed", progress_step(run_dir), False, "completed")
    killed_by = stop_signal_death(status, settings)
    if killed_by is not None and stop is None:
        stop = Stop(progress_step(run_dir), killed_by, None, me, time.time())
    why = ""
    if stop is not None and (killed_by is not None or not _crashed_first(failure, stop)):
        reason, why = _classify(
            run_dir, me, env, stop, settings, preempt_time, time_left, killed=killed_by is not None
        )
        if reason != "failure":
            return _requeue(reason, stop.step, why, history, settings)
    return _failed(run_dir, me, status, env, failure, era, settings, why, partition_nodes, failed_nodes)


def _failed(
    run_dir: Path,
    me: AttemptId,
    status: int,
    env: Mapping[str, str],
    failure: Failure | None,
    era: list[records.AttemptEvent],
    settings: Settings,
    why: str,
    partition_nodes: PartitionNodes,
    failed_nodes: FailedNodes,
) -> Decision:
    """A failed attempt: final when it repeats what failed before (the same step, or the same
    failure with no step gained: see `signature`), else a restart in the allocation while its
    restarts without progress last, else a requeue, leaving out the nodes found bad.

    Only restarts that bought nothing count against requeue.in_job_restarts (`restart_number`): a
    long run on flaky hardware that gets further between crashes keeps its allocation however many
    crashes it has, and the queue is for what keeps failing in one. The count goes on across
    requeues, so a failure that keeps coming back gets in_job_restarts + 1 attempts plus
    max_failures requeues in all, not in_job_restarts + 1 in each allocation."""
    # Without a crash record, or with one that has no step (a rank killed without a word), the
    # step this attempt reached: one that died before its first step (a node gone under its
    # start) did not crash where the attempt before it did.
    step = failure.step if failure and failure.step is not None else progress_step(run_dir, me)
    history = records.ends(era)
    what = signature(failure, status, step)
    further = got_further(history, step)
    restart = restart_number(history, further)
    restarts = settings.requeue.in_job_restarts
    if failure and failure.cause:
        why = f" ({failure.cause})"
    known = _known(run_dir, settings, me)
    found = {h: r for h, r in ((failure and failure.bad_hosts) or {}).items() if h not in known}
    began = records.begins(era)
    previous = began[-1].nodes if began else ""
    down = went_down(began[-1], known, failed_nodes) if began else {}
    if down:
        # A node failure, not srun ending the ranks after a crash, whatever the ranks saw.
        why = f" ({'; '.join(f'{host} {text}' for host, text in sorted(down.items()))})"
        found = {**found, **down}
    if not found and failure is not None and failure.retry is False:
        return Decision("failure", step, False, f"{failure.error}: not retrying", signature=what)
    earlier = [r for r in history if r.reason == "failure"]
    if not found and earlier and step is not None and earlier[-1].step == step:
        message = f"crashed at step {step} twice in a row: not retrying"
        return Decision("failure", step, False, message, signature=what)
    # Also where this attempt's ranks blame a node, or the one before left one out: the same
    # failure on other nodes is the code's. Not where Slurm saw a node go down under this attempt
    # (its own word, not the ranks'), nor after a preflight that named a node (it refuses every
    # retry but one without that node).
    refuses = failure is not None and failure.retry is False
    if not down and not refuses and repeats(history, what, further):
        return Decision(
            "failure", step, False, f"the same failure twice in a row ({what}): not retrying", signature=what
        )
    suspected = {h: r for h, r in ((failure and failure.suspect_hosts) or {}).items() if h not in known}
    confirmed = bool(found)
    # Suspects are left out only onto a spare, and only for this allocation: the evidence is the
    # ranks' (deaths together, a hang's culprit, as likely the code's), not Slurm's or a check's.
    # Without a spare, the same nodes again beat going through the queue for a node that may well
    # be sound, and the next allocation may hold them again.
    if (
        not found
        and suspected
        and restart <= restarts
        and spare_hosts(env, settings, known | set(suspected), previous)
    ):
        if not (failure and failure.cause):
            # A hang's cause names its culprits already.
            why = f" ({'; '.join(f'{host}: {text}' for host, text in sorted(suspected.items()))})"
        found = suspected
    where = f" at step {step}" if step is not None else ""
    if found:
        # Another node next time: neither a broken node's failure nor the same step is final
        # (the same failure is, above).
        why += f"; leaving out {', '.join(sorted(found))}{'' if confirmed else ' for this allocation'}"
        spares = spare_hosts(env, settings, known | set(found), previous)
        if spares is None or restart > restarts:
            # Confirmed hosts only (a suspect is set aside only onto a spare): the requeued job
            # runs without them and those left out for good, not this allocation's suspects.
            refused = cannot_leave_out(found, _known(run_dir, settings), env, settings, partition_nodes)
            if refused:
                return Decision(
                    "failure", step, False, f"{failure and failure.error}: {refused}", signature=what
                )
            return _requeue("failure", step, why, history, settings, found, what)
        on = f"{', '.join(spares)} instead" if spares else "the nodes left"
        message = f"failure{where}{why}; restart {restart} of {restarts} in this allocation on {on}"
        if confirmed:
            return Decision("failure", step, True, message, found, in_job=True, signature=what)
        return Decision("failure", step, True, message, in_job=True, signature=what, set_aside=found)
    if restart <= restarts:
        # The allocation itself is sound (no node to leave out, no preemption or time limit): a
        # new srun step costs seconds, the queue minutes or hours.
        message = f"failure{where}{why}; restart {restart} of {restarts} in this allocation"
        return Decision("failure", step, True, message, in_job=True, signature=what)
    return _requeue("failure", step, why, history, settings, signature=what)


def _requeue(
    reason: RequeueReason,
    step: int | None,
    why: str,
    history: list[End],
    settings: Settings,
    leave_out: dict[str, str] | None = None,
    signature: str | None = None,
) -> Decision:
    """Through the queue, within the reason's budget."""
    allowed = settings.budget(reason)
    used = sum(1 for r in history if r.reason == reason and not r.in_job) + 1
    if allowed >= 0 and used > allowed:
        spent = f"{reason} budget spent ({used - 1} requeues of {allowed} allowed){why}"
        return Decision(reason, step, False, spent, signature=signature)
    where = f" at step {step}" if step is not None else ""
    message = f"{reason}{where}{why}; requeue {used} (budget {_budget_text(allowed)})"
    return Decision(reason, step, True, message, leave_out or {}, signature=signature)


def signature(failure: Failure | None, status: int, step: int | None) -> str:
    """What failed, to tell a failure that comes back from another one (`repeats`).

    A Python exception is its type and the line of the user's own code it came from
    (crash.users_frame), at whatever step: the same error from the same line again is the code's,
    a NameError in setup as much as a shape mismatch at step 50. The message is left out: it may
    name a tensor, an address or a time, which differ from one try to the next.

    Anything else says less of the code: a rank that ended without a word (killed, out of memory,
    a segfault, a lost node), a script's exit status, a hang, srun's status where no rank recorded
    anything. So the step it came at is part of it, or "before any step": the same death before
    any step twice (a script's argparse exiting 2 at once) is a setup that cannot work, while
    deaths after steps at different steps are flaky hardware as often as not (and at the same
    step the same-step rule stops anyway)."""
    if failure is not None and failure.exception:
        site = failure.where
        return f"{failure.exception} {f'at {site.file}:{site.line}' if site else 'outside your code'}"
    if failure is None:
        what = f"no rank's record (srun's status {status})"
    elif failure.exit_status is not None:
        code = failure.exit_status
        what = (
            f"the script exited with status {code}" if code >= 0 else f"the script died of {_signal(-code)}"
        )
    elif failure.hang_dir is not None:
        what = "a hang"
    elif failure.cause:
        what = failure.cause
    else:
        what = "a rank ended without a word"
    return f"{what} {'before any step' if step is None else f'at step {step}'}"


def got_further(history: Sequence[End], step: int | None) -> bool:
    """Whether an attempt that reached `step` got further than every attempt before it (`history`,
    the run's ends since its last resubmit): progress. Not merely past the checkpoint it resumed
    from, which the records do not hold, and which a crash that always comes before the next
    checkpoint would pass on every try: restarting forever in one allocation."""
    reached = [end.step for end in history if end.step is not None]
    return step is not None and (not reached or step > max(reached))


def restart_number(history: Sequence[End], further: bool) -> int:
    """Which restart without progress the one after this failure is: 1, plus one for each restart
    in a row before it that was followed by a failure with no step gained (`got_further`,
    `further` for this attempt's). A stop, or an attempt that got further, starts the count again;
    a requeue does not (the queue does not make a failure that keeps coming back new)."""
    ends = list(history)
    wasted = 0
    while ends and ends[-1].reason == "failure" and not further:
        wasted += 1
        last = ends.pop()
        further = got_further(ends, last.step)
    return wasted + 1


def repeats(history: Sequence[End], what: str, further: bool) -> bool:
    """Whether the attempt before this one failed the same way (`signature`), and this one got no
    further: the next would fail so again."""
    return bool(history) and history[-1].reason == "failure" and history[-1].signature == what and not further


def stop_signal_death(status: int, settings: Settings) -> str | None:
    """The stop signal's name where srun's status is 128 + its number (a task it ended); None
    otherwise, and for SIGTERM, which srun's --kill-on-bad-exit also sends after a crash."""
    name = f"SIG{settings.requeue.signal}"
    if name == "SIGTERM" or status != 128 + signal.Signals[name].value:
        return None
    return name


def _known(run_dir: Path, settings: Settings, attempt: AttemptId | None = None) -> set[str]:
    """The hosts the run leaves out already: the user's and its own for good, and with `attempt`,
    those set aside in its allocation."""
    excluded = Exclusions.read(run_dir)
    own = excluded.hosts if attempt is None else excluded.applying_to(attempt)
    return set(own) | settings.user_excluded()


def _signal(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def cannot_leave_out(
    found: Mapping[str, str],
    known: set[str],
    env: Mapping[str, str],
    settings: Settings,
    partition_nodes: PartitionNodes,
) -> str | None:
    """Why leaving `found` out cannot work (the job names it in its nodelist, or too few nodes
    would be left to start it), or None."""
    pinned = sorted(set(found) & settings.user_nodelist())
    if pinned:
        return (
            f"the job's resources.sbatch.nodelist names {', '.join(pinned)}, so it cannot run without "
            "it: not retrying"
        )
    partition = env.get("SLURM_JOB_PARTITION", "")
    total = partition_nodes(partition) if partition else None
    # The config, not SLURM_JOB_NUM_NODES: the batch script gives srun the training nodes' count.
    needed = settings.resources.allocated_nodes
    left = None if total is None else total - len(known) - len(found)
    if left is None or left >= needed:
        return None
    return (
        f"leaving out {', '.join(sorted(found))} as well as {len(known)} node(s) already would leave "
        f"{left} of partition {partition}'s {total} nodes for a job of {needed}: not retrying"
    )


def step_hosts(env: Mapping[str, str], settings: Settings, bad: set[str]) -> list[str] | None:
    """The allocation's nodes an attempt trains on: the first resources.nodes of those not in
    `bad`; None where too few are left."""
    allocation = hostlist.expand(env["SLURM_JOB_NODELIST"]) if env.get("SLURM_JOB_NODELIST") else []
    usable = [host for host in allocation if host not in bad]
    needed = settings.resources.nodes
    return usable[:needed] if len(usable) >= needed else None


def spare_hosts(env: Mapping[str, str], settings: Settings, bad: set[str], previous: str) -> list[str] | None:
    """The spares the next step trains on in place of the `bad` nodes of the `previous` step (a
    host list), or None where the run has no spare nodes or the allocation too few good ones."""
    if not settings.resources.spare_nodes:
        return None
    after = step_hosts(env, settings, bad)
    if after is None:
        return None
    before = set(hostlist.expand(previous)) if previous else set()
    return [host for host in after if host not in before]


def leave_out_failed_nodes(
    run_dir: Path,
    env: Mapping[str, str],
    now: float,
    failed_nodes: FailedNodes,
    partition_nodes: PartitionNodes,
) -> None:
    """A node failure ends the job NODE_FAIL and Slurm requeues it itself: the end of the attempt
    may not be recorded, or recorded before the accounting had the node's event. Its nodes that
    went down are left out from here on."""
    era = records.current(records.read_attempts(run_dir))
    began = records.begins(era)
    ended = records.ends(era)
    if not began or not ended or ended[-1].reason not in ("killed", "failure"):
        return
    settings = Settings.of_run(run_dir)
    excluded = Exclusions.read(run_dir)
    # Not the ones set aside: a suspect that Slurm then saw go down is left out for good.
    known = set(excluded.hosts) | settings.user_excluded()
    found = went_down(began[-1], known, failed_nodes)
    if not found:
        return
    names = ", ".join(sorted(found))
    refused = cannot_leave_out(found, known, env, settings, partition_nodes)
    if refused:
        print(f"slurmddp: {names} went down under the last attempt; {refused}", file=sys.stderr)
        return
    excluded.adding(found, began[-1].attempt, now).write(run_dir)
    print(f"slurmddp: leaving out {names}: went down under the last attempt", file=sys.stderr)


def went_down(attempt: Begin, known: set[str], failed_nodes: FailedNodes) -> dict[str, str]:
    """The nodes of an attempt, besides `known`, that went down while it ran (sacct does not say
    which node of a NODE_FAIL job failed), each with why."""
    nodes = [n for n in hostlist.expand(attempt.nodes) if n not in known]
    found = failed_nodes(nodes, attempt.time) if nodes else {}
    return {host: f"went down under attempt {attempt.attempt} ({why})" for host, why in found.items()}


def requeue_target(env: Mapping[str, str]) -> str:
    """The id to requeue: one array task, not the whole array (`scontrol requeue ARRAYID` takes all)."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID", "")


def _classify(
    run_dir: Path,
    me: AttemptId,
    env: Mapping[str, str],
    stop: Stop,
    settings: Settings,
    preempt_time: PreemptTime,
    time_left: TimeLeft,
    *,
    killed: bool = False,
) -> tuple[RequeueReason, str]:
    """Why the ranks were told to stop, from what Slurm says, not from elapsed time; with words
    for the record when it is not what the signal alone suggests.

    slurmctld sets a job's PreemptTime when it picks the job for preemption (seen on 22.05.8); a
    job signalled for its time limit has none, and has at most the signal's lead (Slurm may send
    it up to 60 s early) left when the signal came. A stop with neither is srun ending the other
    ranks after one died without a word (killed, out of memory, a segfault): a failure. But not
    where the stop signal itself `killed` a rank: srun sends no such signal, so it came from
    outside slurmddp, which counts as a preemption (as in a local run). `slurmddp interrupt` names
    the reason itself.
    """
    forced = Interrupt.read_for(run_dir, me)
    if forced is not None:
        return forced.reason, ""
    job = requeue_target(env) or env.get("SLURM_JOB_ID", "")
    if preempt_time(job) is not None:
        return "preemption", ""
    left = time_left(job)
    if left is None:
        return "timeout", ""
    signalled = stop.signal_at or stop.time or time.time()
    left_at_signal = left + max(0.0, time.time() - signalled)
    lead = settings.requeue.signal_lead_s
    if left_at_signal <= lead + SLURM_SIGNAL_EARLY_S + SIGNAL_SLACK_S:
        return "timeout", ""
    if killed:
        return "preemption", (
            f" ({stop.signal} ended a rank with {left_at_signal:.0f} s of the time limit left and no "
            "preemption: a stop from outside slurmddp)"
        )
    return "failure", (
        f" ({stop.signal} with {left_at_signal:.0f} s of the time limit left and no "
        "preemption: srun ending the other ranks after one died)"
    )


def _crashed_first(failure: Failure | None, stop: Stop) -> bool:
    """A rank recorded a crash before the stop signal came: the signal was srun ending the others
    (--kill-on-bad-exit), not a request to stop."""
    if failure is None:
        return False
    signalled = stop.signal_at or stop.time
    return not signalled or failure.time <= signalled


def progress_step(run_dir: Path, attempt: AttemptId | None = None) -> int | None:
    """The step of the newest progress record; with `attempt`, only if that attempt wrote it."""
    progress = records.Progress.read(run_dir)
    if progress is None or (attempt is not None and progress.attempt != attempt):
        return None
    return progress.step


def _budget_text(allowed: int) -> str:
    return "unlimited" if allowed < 0 else str(allowed)
