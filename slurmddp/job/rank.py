"""The callable submitit pickles into the job and runs in every task: it hands the RankSpec to the
runtime. Apart from the spec, it is the only piece of `job` the submit side imports."""

from __future__ import annotations

from typing import Any

from slurmddp.job.process import signals
from slurmddp.job.spec import RankSpec


class Rank:
    """The callable submitit runs in every task."""

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec

    def __call__(self) -> Any:
        # Our flag back first: submitit's runner put its own handlers in just before this call, and
        # importing the runtime imports torch (seconds on a busy node). A time-limit signal in that
        # window went to submitit's handler and was lost: the ranks ran on into Slurm's kill (seen on
        # the lab, a 1-minute job whose signal came 8 s into the attempt).
        signals.install(self.spec.stop_signals)
        # Imported here: unpickling this class on a task must not pull in torch, and the submit
        # side that builds it must not import the runtime.
        from slurmddp.job.launch.runtime import run_rank

        return run_rank(self.spec)
