"""The callable submitit pickles into the job and runs in every task: it hands the RankSpec to the
runtime. Apart from the spec, it is the only piece of `job` the submit side imports."""

from __future__ import annotations

from typing import Any

from slurmddp.job.spec import RankSpec


class Rank:
    """The callable submitit runs in every task."""

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec

    def __call__(self) -> Any:
        # Imported here: unpickling this class on a task must not pull in torch, and the submit
        # side that builds it must not import the runtime.
        from slurmddp.job.runtime import run_rank

        return run_rank(self.spec)
