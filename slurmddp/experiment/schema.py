"""The experiment schema: typed, kw-only dataclasses with a docstring per field and checks in
__post_init__. OmegaConf validates types (and the Literal choices) while merging the layers;
the checks here cover what a type cannot say. Every error names its key and the fix.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from slurmddp.cluster.fabric import FabricProfile
from slurmddp.cluster.timespec import parse_time
from slurmddp.defaults import (
    BUDGETS,
    IN_JOB_RESTARTS,
    SIGNAL_LEAD_S,
    STOP_SIGNAL,
    Autocast,
    Backend,
    ContainerRuntime,
    Executor,
    GpuBinding,
    IntegrationsMode,
    Launcher,
    OutputMode,
    StopSignal,
)
from slurmddp.errors import ConfigError

# A value that reaches an `#SBATCH` line must stay on that line: submitit quotes values with
# shlex.quote, which keeps a newline inside quotes, and sbatch reads the script line by line, so
# the text after the newline would run as a shell command.
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_SBATCH_KEY = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

WandbMode = Literal["offline", "online"]

SBATCH_KEYS: dict[str, str] = {
    "nodes": "resources.nodes",
    "ntasks-per-node": "resources.tasks_per_node",
    "gpus-per-node": "resources.gpus_per_node",
    "cpus-per-task": "resources.cpus_per_task",
    "time": "resources.time",
    "partition": "resources.partition",
    "account": "resources.account",
    "qos": "resources.qos",
    "constraint": "resources.constraint",
    "exclude": "resources.exclude",
}
"""sbatch's long options that one experiment key sets, with the same value."""

_LOGS = "nothing: the ranks' logs are in RUN_DIR/logs (python -m slurmddp logs RUN)"
_REQUEUES = "requeue.max_preemptions, max_timeouts and max_failures (0 never requeues)"
OWNED_SBATCH: dict[str, str] = {
    **SBATCH_KEYS,
    "array": "a `sweep:` section (sweep.max_parallel for sbatch's %N): each element gets a run directory",
    "ntasks": "resources.nodes and resources.tasks_per_node (one task a rank)",
    "gpus-per-task": "resources.gpus_per_node with resources.gpu_binding=task",
    "mem": "resources.mem_gb",
    "comment": "resources.comment",
    "job-name": "name",
    "signal": "requeue.signal and requeue.signal_lead_s",
    "requeue": _REQUEUES,
    "no-requeue": _REQUEUES,
    "output": _LOGS,
    "error": _LOGS,
}
"""sbatch options slurmddp sets itself, and what to write instead: given in resources.sbatch they
would replace slurmddp's own (--signal: no stop before the time limit; --array: clashing copies of
one run in one run directory)."""


def _one_line(key: str, value: str | None) -> None:
    if value is not None and _CONTROL_CHARS.search(value):
        raise ConfigError(f"{key}: {value!r} holds a newline or control character; Slurm values are one line")


def _at_least(key: str, value: float | None, low: float) -> None:
    if value is not None and value < low:
        raise ConfigError(f"{key}: must be >= {low}, got {value}")


def not_one_of(key: str, value: Any, choices: tuple[str, ...]) -> str:
    """The message for a value outside a closed set (OmegaConf checks Literal fields; this says it
    our way, with the nearest choice)."""
    near = difflib.get_close_matches(str(value), choices, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"{key}: {value!r} is not one of {', '.join(choices)}{hint}"


GLOBAL_BATCH = "global_batch"
"""The `train:` key that names the samples of one step over all ranks (what `ctx.loader` splits)."""


def _global_batch_splits(batch: Any, resources: Resources) -> None:
    """ctx.loader gives each rank global_batch // world size samples and refuses a remainder: say
    so before the job waits in the queue, not after."""
    world = resources.world_size
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1 or batch % world == 0:
        return
    lower, higher = batch // world * world, (batch // world + 1) * world
    near = f"{lower} or {higher}" if lower else str(higher)
    raise ConfigError(
        f"train.{GLOBAL_BATCH}: {batch} samples cannot be split evenly over {world} ranks "
        f"(resources.nodes={resources.nodes} x {resources.ranks_per_node} per node); use a multiple "
        f"of {world}, such as {near}, or change the number of ranks"
    )


@dataclass(kw_only=True)
class Entrypoint:
    """What each rank runs: exactly one of `function`, `script` or `module`."""

    function: str | None = None
    """`package.module:function` or `path/to/file.py:function`, called with a RunContext on every rank."""
    script: str | None = None
    """A torchrun-style script, run unmodified on every rank with torchrun's environment variables."""
    module: str | None = None
    """A dotted module name (`pkg.train`), run unmodified on every rank as `python -m pkg.train ARGS`
    would run it (torchrun's `-m`), with torchrun's environment variables."""
    args: list[str] = field(default_factory=list)
    """Command-line arguments for `script` or `module`."""

    def __post_init__(self) -> None:
        if self.function is not None and not re.fullmatch(r"[^:\s]+:[A-Za-z_]\w*", self.function):
            raise ConfigError(
                f"entrypoint.function: {self.function!r} is not of the form "
                "'package.module:function' or 'path/to/file.py:function'"
            )
        if self.module is not None and not all(part.isidentifier() for part in self.module.split(".")):
            raise ConfigError(
                f"entrypoint.module: {self.module!r} is not a dotted module name such as 'pkg.train' "
                "(what follows `python -m`); a file path goes in entrypoint.script"
            )
        if self.args and self.script is None and self.module is None:
            raise ConfigError(
                "entrypoint.args: only a script or a module takes args; a function reads ctx.config"
            )


@dataclass(kw_only=True)
class Resources:
    """What to ask Slurm for. One rank per GPU, one Slurm task per rank."""

    nodes: int = 1
    """Number of nodes."""
    spare_nodes: int = 0
    """Nodes allocated beyond `nodes` that train only when a node fails: a restart whose cause is a
    node (Slurm marks it down or drained, the preflight, a GPU fault or a hang names it) runs on a
    spare inside the allocation instead of going back to the queue. They count in GPU-hours."""
    replace_slow_nodes: bool = False
    """With a spare left: a node named slow (its ranks' compute per step 1.3x the median node's over
    most of 30 s, from the telemetry) is swapped for a spare at the next checkpoint, inside the
    allocation; the ranks start again on the spare from that checkpoint. A function entrypoint's
    `ctx.loop` only (it takes the measures); needs spare_nodes and telemetry."""
    gpus_per_node: int = 0
    """GPUs per node; the job then runs this many ranks per node. 0 means a CPU job. The local
    executor uses the GPUs the machine has instead (CUDA_VISIBLE_DEVICES narrows them)."""
    tasks_per_node: int | None = None
    """Ranks per node. Defaults to gpus_per_node (or 1 for CPU jobs); must equal it for GPU jobs."""
    gpu_binding: GpuBinding = "node"
    """`node`: --gpus-per-node, every task sees all the node's GPUs. `task`: --gpus-per-task=1."""
    cpus_per_task: int = 1
    """CPU cores per rank (also the rank's thread count)."""
    mem_gb: float | None = None
    """Memory per node in GB; None leaves Slurm's default."""
    time: str = "01:00:00"
    """Time limit in any Slurm format: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    partition: str | None = None
    """Slurm partition (sbatch --partition); None leaves the cluster's default."""
    account: str | None = None
    """Account charged for the job (sbatch --account)."""
    qos: str | None = None
    """Quality of service (sbatch --qos)."""
    constraint: str | None = None
    """Node features the job needs (sbatch --constraint)."""
    exclude: str | None = None
    """Nodes to avoid (a Slurm hostlist)."""
    comment: str | None = None
    """Free text kept with the job (sbatch --comment)."""
    sbatch: dict[str, Any] = field(default_factory=dict)
    """Any other sbatch option, as {long-option-name: value}; `true` for a flag. The options
    slurmddp sets itself (array, nodes, ntasks, time, mem, signal, requeue, output, job-name, ...)
    are refused, naming the key to write instead."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run by the batch script before the ranks start (module load, source venv, ...)."""

    def __post_init__(self) -> None:
        _at_least("resources.nodes", self.nodes, 1)
        _at_least("resources.spare_nodes", self.spare_nodes, 0)
        _at_least("resources.gpus_per_node", self.gpus_per_node, 0)
        _at_least("resources.tasks_per_node", self.tasks_per_node, 1)
        _at_least("resources.cpus_per_task", self.cpus_per_task, 1)
        if self.mem_gb is not None and self.mem_gb <= 0:
            raise ConfigError(f"resources.mem_gb: must be > 0, got {self.mem_gb}")
        if self.gpus_per_node and self.tasks_per_node not in (None, self.gpus_per_node):
            raise ConfigError(
                f"resources.tasks_per_node: {self.tasks_per_node} ranks on {self.gpus_per_node} GPUs per "
                "node; slurmddp runs one rank per GPU: leave tasks_per_node unset or equal to gpus_per_node"
            )
        try:
            parse_time(self.time)
        except ValueError as exc:
            raise ConfigError(f"resources.time: {exc}") from None
        for key in ("partition", "account", "qos", "constraint", "exclude", "comment"):
            _one_line(f"resources.{key}", getattr(self, key))
        for key, value in self.sbatch.items():
            if not _SBATCH_KEY.match(key):
                raise ConfigError(
                    f"resources.sbatch: {key!r} is not an sbatch long option name (like 'mail-type')"
                )
            if key in OWNED_SBATCH:
                raise ConfigError(
                    f"resources.sbatch.{key}: slurmddp sets --{key} itself; write {OWNED_SBATCH[key]}"
                )
            _one_line(f"resources.sbatch.{key}", str(value))

    @property
    def ranks_per_node(self) -> int:
        return self.tasks_per_node or self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def allocated_nodes(self) -> int:
        """The nodes the job asks Slurm for: the training nodes and the spares."""
        return self.nodes + self.spare_nodes


@dataclass(kw_only=True)
class Dist:
    """How the ranks find each other."""

    backend: Backend = "auto"
    """`auto` (nccl with GPUs, gloo without), `nccl` or `gloo`."""
    port: int | None = None
    """MASTER_PORT; by default derived from the job id so requeues agree and jobs sharing a node differ."""
    timeout_s: int = 600
    """Rendezvous and collective timeout: how long a rank waits for a dead peer before failing."""
    hang_timeout_s: int | None = None
    """Seconds without progress (a training step, an evaluation batch, a ctx.log/reduce/gather)
    after which every rank writes its threads' stacks to RUN_DIR/hangs/ and the attempt ends as a
    failure, requeued within requeue.max_failures. Unset: 20 times the slowest step seen, at least
    300 s. 0: no watchdog. Function entrypoints only (a script's steps are not seen)."""
    start_timeout_s: int = 900
    """Seconds from a rank's start to its first progress (ctx.loop's first step, made on every
    rank; without ctx.loop, a ctx.log/reduce/gather or an evaluation batch; in a script, its first
    optimizer step or DataLoader batch), after which every rank still starting writes its stacks to
    RUN_DIR/hangs/, the failure record names the start-up hang, the ranks that hold it up and their
    phase (loading, rendezvous, process group, preflight, setup, first step), and the attempt ends
    as a failure, requeued within requeue.max_failures. The rendezvous waits past it, not timeout_s
    (a script's own init_process_group keeps its own timeout). 900 s, because a sound
    start can take minutes (imports and a checkpoint read on a cold parallel file system,
    torch.compile's first steps) and ending one burns the failure budget, while a hang caught 15
    minutes in still frees the allocation hours before its time limit. 0: off."""
    launcher: Launcher = "auto"
    """Where rank, size and local rank come from: `slurm` (Slurm's task variables), `mpi` (mpi4py:
    under mpiexec/mpirun, or srun with an MPI plugin), or `auto` (MPI only when a rank runs under an
    MPI launcher whose world Slurm does not describe, e.g. mpiexec outside Slurm)."""
    srun_mpi: str = "pmi2"
    """`srun --mpi=` value for `launcher: mpi` on Slurm (pmi2 suits MPICH; see `srun --mpi=list`)."""

    def __post_init__(self) -> None:
        _one_line("dist.srun_mpi", self.srun_mpi)
        if self.launcher == "mpi" and importlib.util.find_spec("mpi4py") is None:
            raise ConfigError(
                "dist.launcher: mpi needs mpi4py, which this Python cannot import; "
                "install it (pip install 'slurmddp[mpi]') or use launcher: slurm"
            )
        if self.port is not None and not 1024 <= self.port <= 65535:
            raise ConfigError(f"dist.port: {self.port} is not a usable port (1024-65535)")
        _at_least("dist.timeout_s", self.timeout_s, 1)
        if self.hang_timeout_s is not None and self.hang_timeout_s != 0 and self.hang_timeout_s < 10:
            raise ConfigError(
                f"dist.hang_timeout_s: {self.hang_timeout_s} s is too short to tell a hang from a slow "
                "step; give at least 10, 0 to turn the watchdog off, or leave it unset (automatic)"
            )
        if self.start_timeout_s != 0 and self.start_timeout_s < 10:
            raise ConfigError(
                f"dist.start_timeout_s: {self.start_timeout_s} s is shorter than a rank takes to import "
                "torch and meet the others; give at least 10, or 0 to turn the start-up watchdog off"
            )


@dataclass(kw_only=True)
class Checkpoint:
    """Checkpoints written by the training loop (ctx.loop) and where they go."""

    dir: str | None = None
    """Defaults to RUN_DIR/checkpoints."""
    every_steps: int = 0
    """Save every N steps (0: not by step count)."""
    every_minutes: float = 0
    """Save when this many minutes passed since the last save (0: not by time)."""
    keep_last: int = 2
    """Complete checkpoints kept; older ones are deleted once a newer one is complete."""
    async_save: bool = False
    """Write in a background thread; the loop only waits for the copy to CPU memory."""
    snapshot_every_steps: int | None = None
    """In-memory snapshots (ctx.loop under Slurm): every N steps the training state is copied into
    each node's memory (snapshot_dir), with every rank's random streams, so that a crash restarts
    from at most N steps back, and the loss of a node from another node's copy. null (default): N
    is chosen from the measured cost, to keep it under 1% of the step time; 0: none."""
    snapshot_dir: str = "/dev/shm"
    """Node-local memory-backed directory for the snapshots; what is there goes with the job."""

    def __post_init__(self) -> None:
        _at_least("checkpoint.every_steps", self.every_steps, 0)
        _at_least("checkpoint.every_minutes", self.every_minutes, 0)
        _at_least("checkpoint.keep_last", self.keep_last, 1)
        _at_least("checkpoint.snapshot_every_steps", self.snapshot_every_steps, 0)
        _one_line("checkpoint.snapshot_dir", self.snapshot_dir)
        if not self.snapshot_dir.startswith("/"):
            raise ConfigError(
                f"checkpoint.snapshot_dir: {self.snapshot_dir!r} is not an absolute path; give a "
                "memory-backed directory every node has, such as /dev/shm"
            )


@dataclass(kw_only=True)
class Requeue:
    """What happens when the job is preempted, hits its time limit, or fails."""

    signal: StopSignal = STOP_SIGNAL
    """The signal Slurm sends before the end (sbatch --signal); SIGTERM is handled too."""
    signal_lead_s: int = SIGNAL_LEAD_S
    """Seconds before the time limit that the signal is sent; Slurm may send it up to 60 s earlier."""
    max_timeouts: int = BUDGETS["timeout"]
    """Requeues after hitting the time limit; -1 for no limit."""
    max_preemptions: int = BUDGETS["preemption"]
    """Requeues after a preemption; -1 (default) for no limit."""
    max_failures: int = BUDGETS["failure"]
    """Requeues after a crash (a rank died or raised), once the in-job restarts are used up; a
    crash at the same step as the one before, or the same failure again with no step gained
    (the same exception from the same line of your code, the same death before any step), stops
    at once."""
    in_job_restarts: int = IN_JOB_RESTARTS
    """Restarts after a crash inside the allocation, from the newest in-memory snapshot or
    checkpoint (the same srun step's ranks forked again by the resident launcher, else a new
    step), before the job goes back to the queue. Only restarts in a row that gained no step
    count (a run that keeps getting further keeps its allocation), and the count goes on across
    requeues. 0: every crash requeues."""
    resident_launcher: bool | None = None
    """Each task of the training step stays for the allocation, holding torch imported, and forks
    its rank: a restart in the allocation on the same nodes forks the next attempt's ranks in the
    same srun step instead of starting a new one (no spares; the tasks' nodes need scontrol,
    squeue and sinfo). A lost node, a restart on a spare and every requeue go through the batch
    script as without it. null (default): on, except with dist.launcher: mpi; false: every
    restart is a new srun step."""

    def __post_init__(self) -> None:
        _at_least("requeue.signal_lead_s", self.signal_lead_s, 10)
        for key in ("max_timeouts", "max_preemptions", "max_failures"):
            _at_least(f"requeue.{key}", getattr(self, key), -1)
        _at_least("requeue.in_job_restarts", self.in_job_restarts, 0)


@dataclass(kw_only=True)
class Fabric:
    """Network settings exported to every rank."""

    profile: FabricProfile = "auto"
    """NCCL tuning profile: auto, infiniband, roce, efa, tcp, none."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables for every rank (NCCL_*, GLOO_*, ...); they win over anything derived."""

    def __post_init__(self) -> None:
        for key in self.env:
            if not _ENV_NAME.match(key):
                raise ConfigError(f"fabric.env: {key!r} is not a valid environment variable name")


@dataclass(kw_only=True)
class Preflight:
    """Checks every rank runs right after the process group starts, so a broken or slow node fails
    the job in seconds, with its name, instead of hanging it until the dist timeout."""

    enabled: bool = True
    """Run the all-reduce check (the device check before it always runs)."""
    size_mb: float = 4
    """Size of the all-reduced tensor; a few MB keeps the check well under a second."""
    min_bus_gbps: float = 0
    """Fail below this all-reduce bus bandwidth, in Gb/s (nccl-tests' busbw, in bits); 0: no floor."""
    fail_on_host: str | None = None
    """Treat this host as broken, to see the failure path without a broken node (for tests)."""

    def __post_init__(self) -> None:
        if self.size_mb <= 0:
            raise ConfigError(f"preflight.size_mb: must be > 0, got {self.size_mb}")
        _at_least("preflight.min_bus_gbps", self.min_bus_gbps, 0)
        _one_line("preflight.fail_on_host", self.fail_on_host)


@dataclass(kw_only=True)
class Ddp:
    """How `ctx.ddp` wraps the model and how a step accumulates gradients."""

    bucket_cap_mb: float | None = None
    """Gradient bucket size in MiB (DistributedDataParallel's bucket_cap_mb). None: DDP's own
    default, 25 MiB after a first bucket of 1 MiB that starts the first all-reduce early; any value
    makes every bucket that size (`scale --bucket-cap-mb` compares sizes)."""
    gradient_as_bucket_view: bool = False
    """Gradients are views into the all-reduce buckets: saves one copy of the gradients."""
    static_graph: bool = False
    """The same parameters get gradients in the same order every step (DDP's static_graph)."""
    find_unused_parameters: bool = False
    """Only for models whose steps leave some parameters without a gradient: it costs a walk of the
    autograd graph per backward."""
    accumulate: int = 1
    """Micro-batches per optimizer step (`loop.micro_batches`); all but the last skip the all-reduce."""
    resume_buckets: bool = True
    """For a script entrypoint (`train.py ...`, `-m module`): a resumed attempt builds each of the
    script's DistributedDataParallel models with the gradient buckets the first attempt's had after
    DDP rebuilt them (recorded in RUN_DIR/ddp/), so its first step sums gradients in the order the
    uninterrupted run did: bit-exact resume with 3 or more ranks (docs/resume.md). false: PyTorch's
    own first layout, whose first step after each resume sums in another order. `ctx.ddp` gets
    exactness from its priming step instead and ignores this."""

    def __post_init__(self) -> None:
        if self.bucket_cap_mb is not None and self.bucket_cap_mb <= 0:
            raise ConfigError(f"ddp.bucket_cap_mb: must be > 0, got {self.bucket_cap_mb}")
        _at_least("ddp.accumulate", self.accumulate, 1)
        if self.static_graph and self.accumulate > 1:
            # torch 2.13: the first backward under no_sync with static_graph fails an internal
            # assert in the reducer (pytorch/pytorch#143580; the open fix, #187732, found that
            # gradients then stop being all-reduced after the first step).
            raise ConfigError(
                "ddp.static_graph: DistributedDataParallel cannot accumulate gradients (ddp.accumulate="
                f"{self.accumulate}, no_sync) with a static graph; "
                "set ddp.static_graph=false or ddp.accumulate=1"
            )


@dataclass(kw_only=True)
class Telemetry:
    """What the loop measures of every step (no change to the training code; see job/train/telemetry.py):
    step time, throughput, the wait for data, the gradient all-reduces (a timed DDP communication
    hook) and the part of them compute did not hide, a barrier's latency, peak GPU memory."""

    enabled: bool = True
    """Measure; false leaves DDP's own all-reduce path untouched and records nothing."""
    every_s: float = 10
    """How often rank 0 appends a `perf/...` record (every rank's figures) to metrics.jsonl."""
    warmup_steps: int = 3
    """Steps at the start of each attempt left out (first iterators, DDP's bucket rebuild)."""
    max_steps: int | None = None
    """End the loop after this many steps whatever the code asks for (`scale --steps` sets it)."""

    def __post_init__(self) -> None:
        if self.every_s <= 0:
            raise ConfigError(f"telemetry.every_s: must be > 0, got {self.every_s}")
        _at_least("telemetry.warmup_steps", self.warmup_steps, 0)
        _at_least("telemetry.max_steps", self.max_steps, 1)


@dataclass(kw_only=True)
class Precision:
    """Mixed precision: what `ctx.autocast()` and `ctx.scaler` do."""

    autocast: Autocast = "none"
    """`bfloat16` or `float16` autocast of the forward pass (bfloat16 also on CPUs), or `none`."""
    grad_scaler: bool | None = None
    """Scale the loss against float16 underflow; default: on with float16 autocast, off otherwise."""


@dataclass(kw_only=True)
class Trackers:
    """Where `ctx.log` sends metrics besides RUN_DIR/metrics.jsonl (rank 0 only). A requeued or
    resubmitted run continues the same tracker run."""

    tensorboard: bool = True
    """Event files in RUN_DIR/tensorboard (needs the tensorboard package, a dependency)."""
    mlflow: bool = False
    """Log to MLflow (pip install 'slurmddp[mlflow]')."""
    mlflow_uri: str | None = None
    """MLflow tracking URI; default: a local file store in RUN_DIR/mlruns."""
    wandb: bool = False
    """Log to Weights & Biases (pip install 'slurmddp[wandb]')."""
    wandb_mode: WandbMode = "offline"
    """W&B's mode: `offline` writes RUN_DIR/wandb for a later `wandb sync`; `online` needs a login."""
    project: str | None = None
    """MLflow experiment / W&B project name; default: the experiment's name."""

    def __post_init__(self) -> None:
        _one_line("trackers.mlflow_uri", self.mlflow_uri)
        for key in ("mlflow", "wandb"):
            if getattr(self, key) and importlib.util.find_spec(key) is None:
                raise ConfigError(
                    f"trackers.{key}: true needs the {key} package, which this Python cannot import; "
                    f"install it (pip install 'slurmddp[{key}]') or set trackers.{key}: false"
                )


_MOUNT = re.compile(r"^[^:,]+:[^:,]+(:[a-z+]+)?$")


@dataclass(kw_only=True)
class Container:
    """Where the ranks run: inside a container image on each node. The batch script (attempts,
    requeues, in-job restarts, spares) stays outside, on the node itself."""

    image: str | None = None
    """The image: a pyxis/enroot image (`nvcr.io#nvidia/pytorch:24.10-py3`, or a `.sqsh` file), an
    Apptainer image (a `.sif` file, or `docker://...`), or an OCI bundle directory (`config.json`
    beside `rootfs/`). None: the ranks run on the node itself."""
    runtime: ContainerRuntime = "auto"
    """`pyxis` (srun --container-image), `apptainer` (apptainer exec, or singularity), `oci`
    (Slurm's own srun --container=BUNDLE, from oci.conf), or `auto`: the one the image's form
    names (a directory: oci; .sif or docker://: apptainer; .sqsh or a registry reference: pyxis)."""
    mounts: list[str] = field(default_factory=list)
    """More bind mounts, `SRC:DST` or `SRC:DST:FLAGS` (`ro`): data sets, caches. The run
    directory (its checkpoints included), a checkpoint.dir outside it and the directory you submit
    from are mounted at their own paths without being named here."""
    workdir: str | None = None
    """The ranks' working directory inside; None: the directory you submit from, as outside."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables set inside the container, beside the ones every rank gets."""
    gpus: bool = True
    """Give the ranks the node's GPUs: Apptainer's --nv (pyxis and OCI do it by their hooks)."""
    python: str = "python3"
    """The interpreter inside the image that runs each rank; slurmddp, at this version, must be
    importable by it (the preflight inside the container says what is missing)."""

    def __post_init__(self) -> None:
        for key in ("image", "workdir", "python"):
            _one_line(f"container.{key}", getattr(self, key))
        for mount in self.mounts:
            if not _MOUNT.match(mount):
                raise ConfigError(
                    f"container.mounts: {mount!r} is not SRC:DST or SRC:DST:FLAGS (absolute paths, "
                    "no commas; FLAGS such as ro)"
                )
        for name, value in self.env.items():
            if not _ENV_NAME.match(name):
                raise ConfigError(f"container.env: {name!r} is not an environment variable name")
            _one_line(f"container.env.{name}", str(value))


@dataclass(kw_only=True)
class Experiment:
    """One experiment: what to run, on what, and the user's own `train:` settings."""

    name: str = "experiment"
    """Job name and run directory prefix. Defaults to the experiment file's stem."""
    profile: str | None = None
    """Cluster profile to start from: a name looked up in configs/ dirs, or a path to a YAML file."""
    executor: Executor = "auto"
    """`slurm`, `local` (ranks on this machine: one per GPU with nccl where it has a GPU for each
    rank, else on the CPU with gloo), or `auto`: Slurm wherever any of Slurm's commands (sbatch,
    squeue, sacct, scontrol, scancel) is on PATH, and local only where none is. Where Slurm's
    commands are but no controller answers (an outage, a wrong SLURM_CONF), `submit` exits non-zero
    saying what `scontrol ping` said, and writes nothing (`dryrun` prints the Slurm plan with a
    warning); it never trains on this machine instead: set `executor: local` for that."""
    output_dir: str = "runs"
    """Run directories go to OUTPUT_DIR/NAME/...; must be on a filesystem the nodes share."""
    output_mode: OutputMode = "private"
    """Who may read the directories slurmddp creates under output_dir: `private` (0700, only you) or
    `group` (0750, your group may read). Nobody else may write them either way: every rank loads its
    job from a pickle in RUN_DIR/logs, and refuses one that another user could have replaced."""
    entrypoint: Entrypoint = field(default_factory=Entrypoint)
    resources: Resources = field(default_factory=Resources)
    dist: Dist = field(default_factory=Dist)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    requeue: Requeue = field(default_factory=Requeue)
    fabric: Fabric = field(default_factory=Fabric)
    preflight: Preflight = field(default_factory=Preflight)
    ddp: Ddp = field(default_factory=Ddp)
    precision: Precision = field(default_factory=Precision)
    telemetry: Telemetry = field(default_factory=Telemetry)
    trackers: Trackers = field(default_factory=Trackers)
    container: Container = field(default_factory=Container)
    integrations: IntegrationsMode = "manual"
    """For a script entrypoint: `auto` gives every HF transformers `Trainer` and PyTorch Lightning
    `Trainer` the script builds slurmddp's preemption callback, as the one line of
    docs/frameworks/ would (it saves at the step every rank agreed to stop at and resumes from the
    newest complete checkpoint); `manual`: only what the script adds itself."""
    train: dict[str, Any] = field(default_factory=dict)
    """Free-form settings for the training code (ctx.config.train). `train.global_batch`, the
    number that goes to `ctx.loader(global_batch=...)`, must split evenly over the ranks."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(
                f"name: {self.name!r} must start with a letter or digit and hold only letters, digits, "
                "'.', '_' and '-' (it names the job and the run directory)"
            )
        kinds = [
            f"entrypoint.{kind}"
            for kind in ("function", "script", "module")
            if getattr(self.entrypoint, kind) is not None
        ]
        if len(kinds) != 1:
            found = f" (found {' and '.join(kinds)})" if kinds else ""
            raise ConfigError(
                "entrypoint: set exactly one of entrypoint.function (module:function), "
                "entrypoint.script (a torchrun-style script) or entrypoint.module "
                f"(a module run as `python -m`){found}"
            )
        if self.resources.gpus_per_node == 0 and self.dist.backend == "nccl":
            raise ConfigError("dist.backend: nccl needs GPUs; set resources.gpus_per_node or use gloo")
        if self.integrations == "auto" and self.entrypoint.function is not None:
            raise ConfigError(
                "integrations: auto adds slurmddp's callback to the Trainer of a script or module "
                "entrypoint; a function entrypoint's ctx.loop stops and resumes by itself: remove it"
            )
        _global_batch_splits(self.train.get(GLOBAL_BATCH), self.resources)
        self._check_replace_slow_nodes()
        if self.requeue.resident_launcher and self.dist.launcher == "mpi":
            raise ConfigError(
                "requeue.resident_launcher: forks each attempt's ranks in the same srun step, where MPI "
                "(dist.launcher: mpi) cannot start its ranks again; use launcher: slurm or set it to false"
            )

    def _check_replace_slow_nodes(self) -> None:
        if not self.resources.replace_slow_nodes:
            return
        lacking = [
            need
            for need, met in (
                ("a spare (resources.spare_nodes=1 or more)", self.resources.spare_nodes > 0),
                ("the telemetry that names the node (telemetry.enabled=true)", self.telemetry.enabled),
                ("a function entrypoint, whose ctx.loop takes the measures", self.entrypoint.function),
            )
            if not met
        ]
        if lacking:
            raise ConfigError(
                f"resources.replace_slow_nodes: needs {' and '.join(lacking)}; add them or set it to false"
            )
