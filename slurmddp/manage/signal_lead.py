"""Is the requeue signal's lead long enough for a save? Judged at submit from how long the last run
of the same experiment took to save a checkpoint."""

from __future__ import annotations

from pathlib import Path

from slurmddp.experiment.schema import Experiment
from slurmddp.manage.actions import last_save_seconds
from slurmddp.manage.backend import for_executor
from slurmddp.submit.plan import SubmissionPlan


def short_lead_warning(plan: SubmissionPlan, exp: Experiment) -> str | None:
    """The warning to print when `requeue.signal_lead_s` may not cover a save; None when it does."""
    save_s = last_save_seconds(Path(exp.output_dir), exp.name)
    # The ranks stop one step after the signal, save, and the batch script requeues: the lead
    # must cover the save with room for a slow step and the requeue.
    if (
        not for_executor(plan.executor).signals_ahead
        or save_s is None
        or exp.requeue.signal_lead_s >= 2 * save_s + 10
    ):
        return None
    return (
        f"requeue.signal_lead_s={exp.requeue.signal_lead_s} s may be too short: the last run of "
        f"{exp.name} took {save_s:.1f} s to save a checkpoint; give at least {2 * save_s + 10:.0f} s"
    )
