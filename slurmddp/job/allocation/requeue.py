"""The requeue policy: how an attempt ended and whether the run goes around again, as rules read top
to bottom; the first that decides wins. Recovery is a ladder, cheapest first: a new srun step in the
same allocation (or, on the same nodes, new ranks the resident launcher forks in the same step),
then the queue (without the nodes found bad), then a final reason in plain words.

    pruned                the search's pruner stopped the trial (its trial.json says so): final
    completed             every rank returned (result.json), or they ended 0 without a stop: final
    local_failure         a failure of a local run (its controller never starts one again): final
    refused_retry         a failure that refuses a retry (a failed preflight), no node to blame: final
    same_step_twice       a crash at the step of the failure before it, no node to blame: final
    same_failure_twice    the failure before it again (`signature`), no step gained: final
    nodes_needed          bad nodes for the queue to leave out that the job cannot run without: final
    restart_on_spare      a bad or suspected node, a spare for it, restarts left: a new step on the spare
    restart_in_job        nothing to leave out, restarts without progress left: the same nodes again
    budget_spent          the requeue budget of the reason (preemption, timeout, failure) spent: final
    last_start            the scheduler starts the job no more (LOCAL_STARTS of a local run): final
    through_the_queue     otherwise: requeued, leaving out the nodes found bad

What happened (`Outcome`, outcome.py) is read from the run's records (rundir/records.py), its settings (the
typed `requeue` and `resources` sections of its config.yaml, loaded once per decision) and its
scheduler: Slurm (squeue, the accounting, sinfo: asked only where a rule needs them) or submitit's
local controller (no squeue, no spare nodes, a limit of starts). Both go through the same rules.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from slurmddp.cluster import slurm
from slurmddp.defaults import EndReason
from slurmddp.job.allocation import unstarted
from slurmddp.job.allocation.outcome import (
    FailedNodes,
    Local,
    Outcome,
    PartitionNodes,
    PreemptTime,
    Settings,
    Slurm,
    TimeLeft,
    cannot_leave_out,
    known_hosts,
    progress_step,
    repeats,
    stop_signal_death,
)
from slurmddp.rundir import ranklogs, records
from slurmddp.rundir.records import AttemptId, Failure, Stop
from slurmddp.rundir.trial import TrialRecord


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


Rule = Callable[[Outcome], Decision | None]
"""A rule: the decision for what happened, or None where it is another rule's to decide."""


def pruned(outcome: Outcome) -> Decision | None:
    """A search's trial the pruner stopped (rank 0 recorded it before every rank ended): final,
    neither a failure nor anything to resume."""
    record = TrialRecord.read(outcome.run_dir)
    if record is None or record.state != "pruned":
        return None
    return Decision("pruned", record.step, False, f"trial {record.number} pruned at step {record.step}")


def completed(outcome: Outcome) -> Decision | None:
    """Every rank returned, or the ranks ended 0 without a stop: final."""
    if not outcome.completed:
        return None
    return Decision("completed", progress_step(outcome.run_dir), False, "completed")


def local_failure(outcome: Outcome) -> Decision | None:
    """A failure the scheduler never starts again (submitit's local controller): final. Recorded
    as on Slurm, for whoever reads the run: what failed, not only that it did."""
    if not outcome.failed or outcome.scheduler.restarts_failures:
        return None
    failure = outcome.failure
    error = f": {failure.error}" if failure is not None else f" (rank 0 left with status {outcome.status})"
    message = f"failure{_at(outcome.step)}{error}; a local run is not retried"
    return Decision("failure", outcome.step, False, message, signature=outcome.signature)


def refused_retry(outcome: Outcome) -> Decision | None:
    """A failure whose record refuses a retry (a refused pickle, a failed preflight) and names no
    node to blame: the same job would fail the same way; final."""
    if not outcome.failed or outcome.confirmed:
        return None
    if outcome.failure is None or outcome.failure.retry is not False:
        return None
    message = f"{outcome.failure.error}: not retrying"
    return Decision("failure", outcome.step, False, message, signature=outcome.signature)


def same_step_twice(outcome: Outcome) -> Decision | None:
    """A crash at the step the failure before it crashed at, with no node to blame: final."""
    if not outcome.failed or outcome.confirmed or outcome.step is None:
        return None
    earlier = [end for end in outcome.history if end.reason == "failure"]
    if not earlier or earlier[-1].step != outcome.step:
        return None
    message = f"crashed at step {outcome.step} twice in a row: not retrying"
    return Decision("failure", outcome.step, False, message, signature=outcome.signature)


def same_failure_twice(outcome: Outcome) -> Decision | None:
    """The same failure as the attempt before (`repeats`), no step gained: final.

    Also where this attempt's ranks blame a node, or the one before left one out: the same failure
    on other nodes is the code's. Not where Slurm saw a node go down under this attempt (its own
    word, not the ranks'), nor after a preflight that named a node (it refuses every retry but one
    without that node)."""
    if not outcome.failed or outcome.down:
        return None
    refuses = outcome.failure is not None and outcome.failure.retry is False
    if refuses or not repeats(outcome.history, outcome.what_failed, outcome.further):
        return None
    message = f"the same failure twice in a row ({outcome.what_failed}): not retrying"
    return Decision("failure", outcome.step, False, message, signature=outcome.signature)


def nodes_needed(outcome: Outcome) -> Decision | None:
    """Bad nodes the queue is to leave out (no spare, or no restarts left here) that the job
    cannot run without (`cannot_leave_out`): final."""
    if not outcome.failed or not outcome.leaving_out or outcome.on_spare:
        return None
    # Confirmed hosts only (a suspect is set aside only onto a spare): the requeued job runs
    # without them and those left out for good, not this allocation's suspects.
    scheduler, settings = outcome.scheduler, outcome.settings
    known = known_hosts(outcome.run_dir, settings)
    refused = cannot_leave_out(outcome.leaving_out, known, scheduler.env, settings, scheduler.partition_nodes)
    if refused is None:
        return None
    message = f"{outcome.failure and outcome.failure.error}: {refused}"
    return Decision("failure", outcome.step, False, message, signature=outcome.signature)


def restart_on_spare(outcome: Outcome) -> Decision | None:
    """Nodes to leave out (bad, or suspected), spares to take their place and restarts left: a new
    step of this allocation, on the spares. Neither a broken node's failure nor the same step is
    final (the same failure is, above)."""
    if not outcome.failed or not outcome.leaving_out or not outcome.on_spare:
        return None
    spares = outcome.spares_for(outcome.leaving_out)
    on = f"{', '.join(spares)} instead" if spares else "the nodes left"
    message = f"failure{_at(outcome.step)}{outcome.why}; {_restart_text(outcome)} on {on}"
    # Confirmed hosts leave for good; suspects (none where a host is confirmed) for this allocation.
    return Decision(
        "failure",
        outcome.step,
        True,
        message,
        outcome.confirmed,
        in_job=True,
        signature=outcome.signature,
        set_aside=outcome.set_aside,
    )


def restart_in_job(outcome: Outcome) -> Decision | None:
    """Nothing to leave out and restarts without progress left (`restart_number`): a new step of
    this allocation.

    Only restarts that bought nothing count against requeue.in_job_restarts: a long run on flaky
    hardware that gets further between crashes keeps its allocation however many crashes it has,
    and the queue is for what keeps failing in one. The count goes on across requeues, so a failure
    that keeps coming back gets in_job_restarts + 1 attempts plus max_failures requeues in all, not
    in_job_restarts + 1 in each allocation."""
    if not outcome.failed or outcome.leaving_out or not outcome.restarts_left:
        return None
    # The allocation itself is sound (no node to leave out, no preemption or time limit): a new
    # srun step costs seconds, the queue minutes or hours.
    message = f"failure{_at(outcome.step)}{outcome.why}; {_restart_text(outcome)}"
    return Decision("failure", outcome.step, True, message, in_job=True, signature=outcome.signature)


def budget_spent(outcome: Outcome) -> Decision | None:
    """The requeue budget of the reason (requeue.max_preemptions, max_timeouts, max_failures) is
    spent: final."""
    allowed = outcome.settings.budget(outcome.reason)
    used = outcome.requeues
    if allowed < 0 or used <= allowed:
        return None
    spent = f"{outcome.reason} budget spent ({used - 1} requeues of {allowed} allowed){outcome.why}"
    return Decision(outcome.reason, outcome.step, False, spent, signature=outcome.signature)


def last_start(outcome: Outcome) -> Decision | None:
    """The scheduler starts the job no more (submitit's local controller, LOCAL_STARTS): final."""
    starts = outcome.scheduler.starts
    if starts is None or outcome.me.restart_count + 1 < starts:
        return None
    message = (
        f"{outcome.reason}{_at(outcome.step)}{outcome.why}; submitit's local executor starts a job at most "
        f"{starts} times: not restarting"
    )
    return Decision(outcome.reason, outcome.step, False, message, signature=outcome.signature)


def through_the_queue(outcome: Outcome) -> Decision:
    """Requeued within the reason's budget, leaving out the hosts found bad (for the rest of the run:
    requeues and resubmits included)."""
    budget = _budget_text(outcome.settings.budget(outcome.reason))
    message = (
        f"{outcome.reason}{_at(outcome.step)}{outcome.why}; requeue {outcome.requeues} (budget {budget})"
    )
    leave_out = outcome.confirmed if outcome.failed else {}
    return Decision(outcome.reason, outcome.step, True, message, leave_out, signature=outcome.signature)


RULES: tuple[Rule, ...] = (
    pruned,
    completed,
    local_failure,
    refused_retry,
    same_step_twice,
    same_failure_twice,
    nodes_needed,
    restart_on_spare,
    restart_in_job,
    budget_spent,
    last_start,
)
"""The rules, in order; where none decides, the attempt goes `through_the_queue`."""


def first_decision(outcome: Outcome) -> Decision:
    """The decision of the first rule that decides."""
    for rule in RULES:
        decision = rule(outcome)
        if decision is not None:
            return decision
    return through_the_queue(outcome)


def decide(
    run_dir: Path,
    status: int,
    env: Mapping[str, str],
    settings: Settings,
    preempt_time: PreemptTime,
    time_left: TimeLeft = slurm.time_left,
    partition_nodes: PartitionNodes = slurm.partition_nodes,
    failed_nodes: FailedNodes = slurm.failed_nodes,
    logs: Path | None = None,
) -> Decision:
    """How this attempt of a Slurm job ended and whether the job goes around again (`RULES`);
    `logs`: submitit's folder of the ranks' logs, read where no rank recorded why it failed.

    srun's status 128 + the stop signal (140 for USR2) means the signal itself ended a rank, one
    that had no handler yet (a task still starting): Slurm asked the job to stop (seen on 22.05
    with a 1-minute time limit), and srun never sends that signal after a crash. It is a stop,
    whatever a rank recorded after it (rank 0 hears that rank end without a word), and without a
    stop record (no rank got to save) it is one at the newest step the run recorded."""
    me = AttemptId.from_env(env)
    stop = Stop.read_for(run_dir, me)
    failure = Failure.read_for(run_dir, me)
    era = records.current(records.read_attempts(run_dir))
    killed_by = stop_signal_death(status, settings)
    if killed_by is not None and stop is None:
        stop = Stop(progress_step(run_dir), killed_by, None, me, time.time())
    if failure is None and stop is None and status != 0 and logs is not None:
        failure = unstarted.failure(ranklogs.stderr_tails(logs, env), me)
    scheduler = Slurm(env, preempt_time, time_left, partition_nodes, failed_nodes)
    return first_decision(Outcome(run_dir, me, status, stop, failure, era, scheduler, settings))


def decide_local(
    run_dir: Path, attempt: AttemptId, status: int, era: list[records.AttemptEvent], controller: Local
) -> Decision:
    """How `attempt` of a local run ended (`RULES`): `status` is its rank 0's, `era` the run's
    records since its last resubmit."""
    stop = Stop.read_for(run_dir, attempt)
    failure = Failure.read_for(run_dir, attempt)
    return first_decision(Outcome(run_dir, attempt, status, stop, failure, era, controller))


def _at(step: int | None) -> str:
    return f" at step {step}" if step is not None else ""


def _restart_text(outcome: Outcome) -> str:
    return f"restart {outcome.restart} of {outcome.settings.requeue.in_job_restarts} in this allocation"


def _budget_text(allowed: int) -> str:
    return "unlimited" if allowed < 0 else str(allowed)
