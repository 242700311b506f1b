"""Defaults that more than one side of the flow relies on, and the closed sets of values that
cross module boundaries, typed so that a misspelt value is a type error, not a silent branch."""

from __future__ import annotations

from typing import Literal

Executor = Literal["auto", "slurm", "local"]
"""As the experiment asks; `auto` is resolved at submit time."""
RunExecutor = Literal["slurm", "local"]
"""What a plan runs on, once `auto` is resolved."""
Launcher = Literal["auto", "slurm", "mpi"]
Backend = Literal["auto", "nccl", "gloo"]
GpuBinding = Literal["node", "task"]
StopSignal = Literal["USR1", "USR2", "TERM", "INT", "HUP"]
EndReason = Literal["completed", "pruned", "preemption", "timeout", "failure", "killed", "cancelled"]
"""Why an attempt ended, as attempts.jsonl records it."""
RequeueReason = Literal["preemption", "timeout", "failure"]
"""The reasons with a requeue budget."""
RunKind = Literal["run", "sweep"]
Autocast = Literal["none", "bfloat16", "float16"]
OutputMode = Literal["private", "group"]
IntegrationsMode = Literal["manual", "auto"]
ContainerRuntime = Literal["auto", "pyxis", "apptainer", "oci"]
"""Whether a script's framework Trainer gets slurmddp's preemption callback unasked (`integrations`)."""
"""Who may read the run directories slurmddp creates (`output_mode`)."""
OUTPUT_DIR_MODES: dict[OutputMode, int] = {"private": 0o700, "group": 0o750}
"""The permissions of every directory slurmddp creates for a run: the run or sweep directory, its
submitit folder, and OUTPUT_DIR/NAME where missing. Nobody else may write any of them: every rank
unpickles its job from the submitit folder, so a writable one would let another user run code as
the job's owner (and the ranks refuse such a pickle; see job/launch/trust.py)."""

STOP_SIGNAL: StopSignal = "USR2"
"""What Slurm sends before the time limit (sbatch --signal) unless requeue.signal says otherwise."""
ALWAYS_STOP_ON: StopSignal = "TERM"
"""Handled besides the configured signal: clusters without preempt_send_user_signal preempt with it."""
STOP_SIGNALS_ENV = "SLURMDDP_STOP_SIGNALS"
"""Set by the batch script: the signals a task treats as "stop at the next step" from its start."""
SIGNAL_LEAD_S = 120
BUDGETS: dict[RequeueReason, int] = {"timeout": 20, "preemption": -1, "failure": 3}
"""Requeues allowed per reason (-1: unlimited): requeue.max_timeouts, max_preemptions, max_failures."""
IN_JOB_RESTARTS = 3
"""requeue.in_job_restarts: restarts after a crash inside one allocation before it goes back to the queue."""
EXIT_FINISHED = 3
"""`attempts begin`'s status when the run already ended for good: the batch script exits without srun."""
EXIT_RESTART_IN_JOB = 4
"""`attempts end`'s status when the attempt failed and the batch script starts the ranks again as a
new srun step of the same allocation (requeue.in_job_restarts)."""
IN_JOB_RESTART_ENV = "SLURMDDP_IN_JOB_RESTART"
"""The batch script's count of restarts in this allocation, exported for `attempts` and the ranks."""
SLURMD_PORT_ENV = "SLURMDDP_SLURMD_PORT"
"""Set by the batch script: the port slurmd listens on, which the peer watch knocks at to tell a
node that stopped answering from a rank that died (job/process/liveness.py)."""
SNAPSHOTS_ENV = "SLURMDDP_SNAPSHOTS"
"""Set by the batch script: the folder of this job's in-memory snapshots (checkpoint.snapshot_dir),
which one task per node removes when the job ends; the ranks take snapshots only where it is set."""
LOCAL_REQUEUE_STATUS = 144
"""submitit's local controller reruns every task when one exits with this status (submitit 1.5)."""
RESIDENT_ENV = "SLURMDDP_RESIDENT"
"""1 in the batch script's environment with requeue.resident_launcher: each task of a step stays
for the allocation and forks its rank (job/launch/resident.py)."""
RESIDENT_IMPORT_ENV = "SLURMDDP_RESIDENT_IMPORT"
"""The module a resident task imports before it forks its rank: what the rank would import first."""

VERSION = "0.1.0"
"""slurmddp's release, written once: pyproject.toml reads it from here, the package exports it as
`slurmddp.__version__`, and `--version` shows it where no installed distribution says otherwise."""


SUBMITTED_WITH_ENV = "SLURMDDP_SUBMITTED_WITH"
"""The slurmddp version that submitted a job whose ranks run in a container: the rank's boot
refuses to go on where the image's slurmddp differs (the job's pickle and records are that
version's)."""


TASK_IDS_FROM_HOST_ENV = "SLURMDDP_TASK_IDS_FROM_HOST"
"""Set ("1") for ranks in an OCI bundle on Slurm 22.05, which hands the container the environment
srun was started with (the batch script's SLURM_PROCID=0 included) instead of the task's: the rank
works out its ids from its host's place in the step (job/launch/boot.py)."""
