"""slurmddp: one-command multi-node PyTorch DDP on Slurm, resilient to preemption.

What a training function imports comes from here: `RunContext` (what every rank is handed),
`ResumableDistributedSampler`, and `StopForRequeue` (what `ctx.loop` raises once every rank saved
after a stop signal). A training script (a plain loop, or a framework's through
`slurmddp.integrations`) asks `should_stop()` at each step and, once every rank saved, calls
`exit_for_requeue()`; it logs with `report(step, **metrics)`, says its length with
`total_steps(n)` and reads a search trial's values with `params()`. They are loaded on first
use, so that importing the package stays light (no torch): the submit path runs on login nodes
that may lack it.

The package follows the flow of a submission; each sub-package is one side of it:

    experiment/  the schema, loading and layering, the sweep spec, entrypoint checks
    submit/      experiment -> SubmissionPlan (pure) -> submitit; the batch-script templates
    job/         everything inside an allocation, in rooms by where the code runs: allocation/
                 (the batch script's attempts and requeue rules), checkpoint/, process/ (a rank's
                 environment, signals, stop and watches), train/ (context, loop, loaders,
                 sampler, trackers, telemetry), script/ (script mode), launch/ (a rank's start)
    manage/      runs read back from their directories: status, logs, cancel, resubmit, results,
                 sweeps and scaling studies; what differs between executors in one backend each
    cluster/     facts about Slurm and the machine: host lists, time syntax, fabric detection,
                 and the one module that runs Slurm's commands
    cli/         argument parsing and entry points, one module per group of commands
    integrations/ what a training script imports to be preemption-safe under its framework
    search/      a `search:` sweep's Optuna study and each element's trial (asked, reported, told)
    rundir/      the run directory: its file names and one typed record per file
    errors, files, yamlio, defaults: leaf helpers

Import rules (tests/test_architecture.py enforces them, imports inside functions included):
- the leaf helpers import nothing of ours;
- `cluster` and `rundir` import only leaf helpers;
- inside `job`, a room imports only the rooms below it (allocation, checkpoint, process, train,
  script, launch, in that order);
- `job` never imports `submit`, `manage`, `cli` or `integrations`: a rank must not pull in
  login-node code, nor a framework;
- `search` imports only `experiment` and `rundir`; `job`, `submit`, `manage`, `cli` and
  `integrations` may import it;
- `integrations` imports only `experiment`, `job`, `rundir` and `search`;
- `submit` takes only the small picklable spec from `job` (`job.spec` and `job.rank`, its callable);
- nothing imports `cli` (only `__main__` does), and `manage` never imports `cli`;
- no cycles, between modules or between sub-packages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurmddp.defaults import VERSION

__version__ = VERSION
__all__ = [
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

if TYPE_CHECKING:
    from slurmddp.job.process.stop import StopForRequeue, exit_for_requeue, should_stop
    from slurmddp.job.script.report import params, pruned, report, total_steps
    from slurmddp.job.train.context import RunContext
    from slurmddp.job.train.sampler import ResumableDistributedSampler

_EXPORTS = {
    "RunContext": "slurmddp.job.train.context",
    "StopForRequeue": "slurmddp.job.process.stop",
    "ResumableDistributedSampler": "slurmddp.job.train.sampler",
    "should_stop": "slurmddp.job.process.stop",
    "exit_for_requeue": "slurmddp.job.process.stop",
    "report": "slurmddp.job.script.report",
    "params": "slurmddp.job.script.report",
    "pruned": "slurmddp.job.script.report",
    "total_steps": "slurmddp.job.script.report",
}


def __getattr__(name: str) -> Any:
    # PEP 562: the sampler imports torch, which `import slurmddp` on a login node must not.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'slurmddp' has no attribute {name!r}")
