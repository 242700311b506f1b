"""What a training function imports from `slurmddp` itself: the names are the job side's own
classes, loaded on first use so that importing the package (on a login node) does not import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_user_names_are_the_job_sides_classes() -> None:
    import slurmddp
    from slurmddp.job.process.stop import StopForRequeue, exit_for_requeue, should_stop
    from slurmddp.job.script.report import params, pruned, report, total_steps
    from slurmddp.job.train.context import RunContext
    from slurmddp.job.train.sampler import ResumableDistributedSampler

    assert slurmddp.RunContext is RunContext
    assert slurmddp.StopForRequeue is StopForRequeue
    assert slurmddp.ResumableDistributedSampler is ResumableDistributedSampler
    assert slurmddp.should_stop is should_stop
    assert slurmddp.exit_for_requeue is exit_for_requeue
    assert (slurmddp.report, slurmddp.params, slurmddp.pruned) == (report, params, pruned)
    assert slurmddp.total_steps is total_steps
    assert sorted(slurmddp.__all__) == [
        "ResumableDistributedSampler",
        "RunContext",
        "StopForRequeue",
        "exit_for_requeue",
        "params",
        "pruned",
        "report",
        "should_stop",
        "total_steps",
    ]
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        slurmddp.Nope  # noqa: B018


def test_importing_the_package_does_not_import_torch() -> None:
    code = (
        "import sys, slurmddp\n"
        "assert 'torch' not in sys.modules, 'import slurmddp imported torch'\n"
        "assert slurmddp.should_stop() is False\n"
        "assert 'torch' not in sys.modules, 'should_stop outside a job imported torch'\n"
        "from slurmddp import ResumableDistributedSampler\n"
        "assert 'torch' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
