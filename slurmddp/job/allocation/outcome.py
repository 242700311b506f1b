"""What happened in an attempt, as the requeue rules (requeue.py) read it: the run's settings,
its records and what its scheduler says (Slurm, or submitit's local controller)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slurmddp.cluster import hostlist, slurm
from slurmddp.defaults import LOCAL_REQUEUE_STATUS, RequeueReason
from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import Requeue, Resources
from slurmddp.rundir import records
from slurmddp.rundir.config import read_config
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
        config = read_config(run_dir)
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
class Outcome:
    """What happened: how one attempt ended, as the rules read it. Each fact is worked out when a
    rule first asks for it, so the scheduler is asked only what the rules before the deciding one
    needed, in their order (a completed attempt asks squeue nothing)."""

    run_dir: Path
    me: AttemptId
    status: int
    """srun's exit status (a local run: its rank 0's)."""
    stop: Stop | None
    """The attempt's stop record (on Slurm, one made where the stop signal itself ended a rank)."""
    failure: Failure | None
    era: list[records.AttemptEvent]
    """The run's attempt records since its last resubmit."""
    scheduler: Slurm | Local
    given_settings: Settings | None = None

    @cached_property
    def settings(self) -> Settings:
        # A local run reads them only for a stop's budget: its completion or failure is recorded
        # whatever its config.yaml holds.
        return self.given_settings if self.given_settings is not None else Settings.of_run(self.run_dir)

    @property
    def history(self) -> list[End]:
        return records.ends(self.era)

    @cached_property
    def completed(self) -> bool:
        # result.json of this attempt: every rank returned from the function (rank 0 wrote it after
        # gathering their results). That is completion, whatever status srun then reported.
        return (self.stop is None and self.status == 0) or records.completed_by(self.run_dir, self.me)

    @cached_property
    def stopped_for(self) -> tuple[RequeueReason, str] | None:
        """Why the ranks were told to stop, with words for the record where it is not what the
        signal alone suggests; None where no stop ended the attempt (a crash came before it).
        `slurmddp interrupt` names the reason itself."""
        if self.stop is None or not self.scheduler.stop_ended_it(self, self.stop):
            return None
        forced = Interrupt.read_for(self.run_dir, self.me)
        if forced is not None:
            return forced.reason, ""
        return self.scheduler.stop_reason(self, self.stop)

    @property
    def reason(self) -> RequeueReason:
        return "failure" if self.stopped_for is None else self.stopped_for[0]

    @property
    def failed(self) -> bool:
        return self.reason == "failure"

    @cached_property
    def step(self) -> int | None:
        """A stop's step; a failure's (`Slurm.failure_step`, `Local.failure_step`)."""
        if self.stop is not None and not self.failed:
            return self.stop.step
        return self.scheduler.failure_step(self)

    @cached_property
    def what_failed(self) -> str:
        return signature(self.failure, self.status, self.step)

    @property
    def signature(self) -> str | None:
        """What failed, for the record (`signature`); None for a stop."""
        return self.what_failed if self.failed else None

    @cached_property
    def further(self) -> bool:
        return got_further(self.history, self.step)

    @cached_property
    def restart(self) -> int:
        return restart_number(self.history, self.further)

    @property
    def restarts_left(self) -> bool:
        return self.restart <= self.settings.requeue.in_job_restarts

    @cached_property
    def known(self) -> set[str]:
        return known_hosts(self.run_dir, self.settings, self.me)

    @cached_property
    def previous(self) -> Begin | None:
        """The begin of this attempt."""
        began = records.begins(self.era)
        return began[-1] if began else None

    @cached_property
    def down(self) -> dict[str, str]:
        """The attempt's nodes that Slurm saw go down under it, with why."""
        return went_down(self.previous, self.known, self.scheduler.failed_nodes) if self.previous else {}

    @cached_property
    def confirmed(self) -> dict[str, str]:
        """Hosts confirmed bad in this attempt, with why: those its ranks found broken and those
        that went down under it."""
        found = (self.failure and self.failure.bad_hosts) or {}
        return {**{h: r for h, r in found.items() if h not in self.known}, **self.down}

    @cached_property
    def set_aside(self) -> dict[str, str]:
        """Suspects, with why, set aside for this allocation.

        Suspects are left out only onto a spare, and only for this allocation: the evidence is the
        ranks' (deaths together, a hang's culprit, as likely the code's), not Slurm's or a check's.
        Without a spare, the same nodes again beat going through the queue for a node that may well
        be sound, and the next allocation may hold them again."""
        suspected = (self.failure and self.failure.suspect_hosts) or {}
        suspected = {h: r for h, r in suspected.items() if h not in self.known}
        if self.confirmed or not suspected or not self.restarts_left or not self.spares_for(suspected):
            return {}
        return suspected

    @property
    def leaving_out(self) -> dict[str, str]:
        return self.confirmed or self.set_aside

    def spares_for(self, hosts: Mapping[str, str]) -> list[str] | None:
        """The spares the next step trains on in place of `hosts` (`spare_hosts`)."""
        previous = self.previous.nodes if self.previous else ""
        return spare_hosts(self.scheduler.env, self.settings, self.known | set(hosts), previous)

    @property
    def on_spare(self) -> bool:
        """The nodes left out can be, for a restart in this allocation."""
        return self.spares_for(self.leaving_out) is not None and self.restarts_left

    @cached_property
    def why(self) -> str:
        """Words for the record: what the stop was, or what failed and what is left out."""
        why = self.stopped_for[1] if self.stopped_for else ""
        if not self.failed:
            return why
        if self.failure and self.failure.cause:
            why = f" ({self.failure.cause})"
        if self.down:
            # A node failure, not srun ending the ranks after a crash, whatever the ranks saw.
            why = f" ({'; '.join(f'{host} {text}' for host, text in sorted(self.down.items()))})"
        elif self.set_aside and not (self.failure and self.failure.cause):
            # A hang's cause names its culprits already.
            why = f" ({'; '.join(f'{host}: {text}' for host, text in sorted(self.set_aside.items()))})"
        return why + self.leaving_out_text

    @property
    def leaving_out_text(self) -> str:
        if not self.leaving_out:
            return ""
        lasting = "" if self.confirmed else " for this allocation"
        return f"; leaving out {', '.join(sorted(self.leaving_out))}{lasting}"

    @property
    def requeues(self) -> int:
        """Which requeue for this reason the next would be."""
        return sum(1 for r in self.history if r.reason == self.reason and not r.in_job) + 1


@dataclass(frozen=True)
class Slurm:
    """What Slurm says of the job and does with it: squeue, the accounting and sinfo, asked only
    where a rule needs them (parameters for tests)."""

    env: Mapping[str, str]
    preempt_time: PreemptTime
    time_left: TimeLeft = slurm.time_left
    partition_nodes: PartitionNodes = slurm.partition_nodes
    failed_nodes: FailedNodes = slurm.failed_nodes
    restarts_failures = True
    """A failed attempt goes around again, in the allocation or through the queue."""
    starts = None
    """No limit of starts."""

    def stop_ended_it(self, outcome: Outcome, stop: Stop) -> bool:
        """The stop came before any crash, or the stop signal itself ended a rank
        (`stop_signal_death`), whatever a rank recorded after it (rank 0 hears that rank end
        without a word)."""
        killed = stop_signal_death(outcome.status, outcome.settings) is not None
        return killed or not _crashed_first(outcome.failure, stop)

    def stop_reason(self, outcome: Outcome, stop: Stop) -> tuple[RequeueReason, str]:
        """Why the ranks were told to stop, from what Slurm says, not from elapsed time.

        slurmctld sets a job's PreemptTime when it picks the job for preemption (seen on 22.05.8); a
        job signalled for its time limit has none, and has at most the signal's lead (Slurm may send
        it up to 60 s early) left when the signal came. A stop with neither is srun ending the other
        ranks after one died without a word (killed, out of memory, a segfault): a failure. But not
        where the stop signal itself killed a rank (`stop_signal_death`): srun sends no such signal,
        so it came from outside slurmddp, which counts as a preemption (as in a local run)."""
        job = requeue_target(self.env) or self.env.get("SLURM_JOB_ID", "")
        if self.preempt_time(job) is not None:
            return "preemption", ""
        left = self.time_left(job)
        if left is None:
            return "timeout", ""
        signalled = stop.signal_at or stop.time or time.time()
        left_at_signal = left + max(0.0, time.time() - signalled)
        lead = outcome.settings.requeue.signal_lead_s
        if left_at_signal <= lead + SLURM_SIGNAL_EARLY_S + SIGNAL_SLACK_S:
            return "timeout", ""
        if stop_signal_death(outcome.status, outcome.settings) is not None:
            return "preemption", (
                f" ({stop.signal} ended a rank with {left_at_signal:.0f} s of the time limit left and no "
                "preemption: a stop from outside slurmddp)"
            )
        return "failure", (
            f" ({stop.signal} with {left_at_signal:.0f} s of the time limit left and no "
            "preemption: srun ending the other ranks after one died)"
        )

    def failure_step(self, outcome: Outcome) -> int | None:
        """The crash's step; without a crash record, or with one that has no step (a rank killed
        without a word), the step this attempt reached: one that died before its first step (a node
        gone under its start) did not crash where the attempt before it did."""
        failure = outcome.failure
        if failure is not None and failure.step is not None:
            return failure.step
        return progress_step(outcome.run_dir, outcome.me)


@dataclass(frozen=True)
class Local:
    """submitit's local controller: it starts the ranks again only after a stop (a rank leaving with
    LOCAL_REQUEUE_STATUS), never after a failure, and at most `starts` times; it sends
    `time_signal` before the time limit. No squeue, no node accounting, no spare nodes."""

    starts: int
    time_signal: str
    restarts_failures = False
    env: Mapping[str, str] = field(default_factory=dict)
    """No Slurm variables: no allocation to take a spare from."""

    def stop_ended_it(self, outcome: Outcome, stop: Stop) -> bool:
        """Rank 0 left with LOCAL_REQUEUE_STATUS after the stop, not with a crash's."""
        return outcome.status == LOCAL_REQUEUE_STATUS

    def stop_reason(self, outcome: Outcome, stop: Stop) -> tuple[RequeueReason, str]:
        """The stop signal of the local controller is its time limit, and any other (a TERM from
        outside slurmddp) stands for a preemption."""
        if stop.signal == self.time_signal:
            return "timeout", ""
        return "preemption", f" ({stop.signal} from outside slurmddp)"

    def failure_step(self, outcome: Outcome) -> int | None:
        """The crash's step (None where it had none), or without a crash record the run's newest."""
        return outcome.failure.step if outcome.failure is not None else progress_step(outcome.run_dir)

    @staticmethod
    def failed_nodes(nodes: list[str], since: float) -> dict[str, str]:
        """No node accounting."""
        return {}

    @staticmethod
    def partition_nodes(partition: str) -> int | None:
        """No partition."""
        return None


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


def known_hosts(run_dir: Path, settings: Settings, attempt: AttemptId | None = None) -> set[str]:
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
    return {host: f"went down under attempt {attempt.attempt + 1} ({why})" for host, why in found.items()}


def requeue_target(env: Mapping[str, str]) -> str:
    """The id to requeue: one array task, not the whole array (`scontrol requeue ARRAYID` takes all)."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID", "")


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
