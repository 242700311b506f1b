"""Experiment -> SubmissionPlan: every decision about a submission, as plain printable values.

Pure apart from reading the entrypoint's source (never running it). `dryrun` prints a plan and
`submit` hands one to submitit, so what a user previews is what runs.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmddp.cluster import runtimes
from slurmddp.cluster.generations import Version, exports_srun_cpus, shown
from slurmddp.cluster.runtimes import Runtime
from slurmddp.cluster.timespec import minutes_ceil, parse_time
from slurmddp.defaults import ALWAYS_STOP_ON, RunExecutor
from slurmddp.errors import ConfigError
from slurmddp.experiment.entrypoint import check_function, check_module, check_script
from slurmddp.experiment.load import Loaded
from slurmddp.experiment.schema import Experiment
from slurmddp.job.spec import RankSpec, RunSettings
from slurmddp.rundir.layout import CHECKPOINTS, LOGS
from slurmddp.rundir.manifest import Dependency
from slurmddp.submit import container
from slurmddp.submit.script import BOOT_MODULE, render_template, sbatch_script

SRUN_ARGS = ("--kill-on-bad-exit=1", "--overlap")
"""--kill-on-bad-exit: a rank that dies takes the whole step down at once instead of leaving its
peers blocked in a collective until the distributed timeout. --overlap: a step whose node went
silent holds its resources on the good nodes too until Slurm calls the node down; the restart's
step shares them instead of waiting for them (seen on 22.05.8)."""


@dataclass(frozen=True)
class LocalMachine:
    """What a local run's plan takes from the machine it runs on (submit.prepare finds it)."""

    gpus: tuple[int, ...] = ()
    """The GPUs its ranks may use, by index (CUDA_VISIBLE_DEVICES' numbering); none: CPU ranks."""
    cores: int | None = None
    """The cores its processes may run on; None: unknown."""


@dataclass(frozen=True)
class SubmissionPlan:
    """What submitit is asked to do, and what each rank will be handed."""

    executor: RunExecutor
    job_name: str
    run_dir: Path
    folder: Path
    """submitit's folder: the batch script, pickles and per-task logs."""
    python: str
    """The command each task starts: the interpreter running slurmddp's boot module."""
    parameters: dict[str, Any]
    """Keyword arguments for the submitit executor's update_parameters."""
    rank: RankSpec
    world_size: int
    notes: tuple[str, ...] = field(default=())
    """Things the user should know about this plan (printed by submit and dryrun)."""
    array: tuple[RankSpec, ...] = field(default=())
    """For a sweep: one spec per array task, in task order (`rank` is the first)."""
    slurm_version: Version | None = None
    """The Slurm release the batch script was written for (`sbatch --version`; None: unknown)."""
    warnings: tuple[str, ...] = field(default=())
    """What will make the run slow or fail here, said on stderr before it starts."""
    containers: tuple[Runtime, ...] = ()
    """The runtimes the ranks start in (the experiment's `container:`, each sweep element's own);
    none: on the nodes themselves."""
    after: Dependency | None = None
    """The run or sweep the job waits for in the queue (`submit --after`)."""

    def batch_script(self) -> str:
        """The batch script submitit writes for this plan, byte for byte (Slurm plans)."""
        return sbatch_script(command(self), self.folder, self.parameters, len(self.array))


def waiting_for(plan: SubmissionPlan, after: Dependency) -> SubmissionPlan:
    """`plan`, queued behind `after`'s jobs. Slurm cancels it where they end so that it never can
    start (--kill-on-invalid-dep), rather than leave it pending with DependencyNeverSatisfied."""
    extra = {
        **plan.parameters["additional_parameters"],
        "dependency": after.sbatch,
        "kill-on-invalid-dep": "yes",
    }
    parameters = {**plan.parameters, "additional_parameters": extra}
    return dataclasses.replace(plan, parameters=parameters, after=after)


def build(
    loaded: Loaded,
    *,
    executor: RunExecutor,
    workdir: Path,
    run_dir: Path,
    interpreter: str,
    elements: tuple[tuple[Loaded, Path], ...] = (),
    submission: int | None = None,
    max_parallel: int | None = None,
    slurm_version: Version | None = None,
    machine: LocalMachine = LocalMachine(),
) -> SubmissionPlan:
    """The plan for `loaded` run from `workdir`, writing to `run_dir`, on `executor`, with the
    Python `interpreter` (a shell-quoted command), for the Slurm release `slurm_version`; a local
    plan for `machine` (by default one without GPUs whose cores are unknown).

    For a sweep, `run_dir` is the sweep's directory, `elements` the (config, run directory) of each
    array task in order, `submission` the number of this submission in the sweep manifest, and
    `max_parallel` how many of its tasks may run at once (None: all).
    """
    exp = loaded.experiment
    checked: dict[tuple[str, str], str | None] = {}
    ranks = tuple(
        rank_spec(element, executor, workdir, element_dir, checked)
        for element, element_dir in (elements or ((loaded, run_dir),))
    )
    if elements:
        _check_shared(ranks)
    folder = run_dir / LOGS
    launches = [
        container_launch(element.experiment, executor, ranks, run_dir, workdir, slurm_version)
        for element, _ in (elements or ((loaded, run_dir),))
    ]
    table = container_table(launches, interpreter) if len(set(launches)) > 1 else ()
    started = None if table else launches[0]
    if executor == "slurm":
        every = tuple(element.experiment for element, _ in elements)
        parameters = slurm_parameters(exp, run_dir, interpreter, submission, slurm_version, table, every)
        if started is not None:
            parameters["srun_args"] = [*parameters["srun_args"], *started.srun_args]
        if elements:
            parameters["array_parallelism"] = max_parallel or len(ranks)
        notes = slurm_notes(exp)
    else:
        gpus = local_gpus(exp.resources.world_size, machine.gpus)
        parameters = local_parameters(exp, gpus)
        notes = local_notes(exp, gpus, machine)
    return SubmissionPlan(
        executor=executor,
        job_name=exp.name,
        run_dir=run_dir,
        folder=folder,
        python=f"{_runner(started, table, interpreter)} -u -m {BOOT_MODULE}",
        parameters=parameters,
        rank=ranks[0],
        world_size=exp.resources.world_size,
        notes=notes,
        array=ranks if elements else (),
        slurm_version=slurm_version if executor == "slurm" else None,
        warnings=local_warnings(exp, machine.cores) if executor == "local" else (),
        containers=tuple(sorted({launch.runtime for launch in launches if launch is not None})),
    )


def rank_spec(
    loaded: Loaded,
    executor: RunExecutor,
    workdir: Path,
    run_dir: Path,
    checked: dict[tuple[str, str], str | None],
) -> RankSpec:
    """What one rank of this experiment is handed; `checked` caches entrypoint checks (a sweep
    repeats the same entrypoint in every element)."""
    exp = loaded.experiment

    def check(kind: str, value: str | None) -> str | None:
        if (kind, str(value)) not in checked:
            check_fn = {"function": check_function, "script": check_script, "module": check_module}[kind]
            checked[kind, str(value)] = _maybe(check_fn, value, workdir, loaded.source.parent)
        return checked[kind, str(value)]

    return RankSpec(
        function=check("function", exp.entrypoint.function),
        script=check("script", exp.entrypoint.script),
        module=check("module", exp.entrypoint.module),
        args=tuple(exp.entrypoint.args),
        workdir=str(workdir),
        run_dir=str(run_dir),
        checkpoint_dir=str(run_dir / CHECKPOINTS) if exp.checkpoint.dir is None else exp.checkpoint.dir,
        config=loaded.resolved,
        dist=exp.dist,
        preflight=exp.preflight,
        settings=RunSettings.of(exp),
        env=rank_env(exp),
        fabric_profile=exp.fabric.profile,
        stop_signals=stop_signals(exp),
        executor=executor,
    )


OCI_TASKS_PER_NODE_UNTIL: Version = (23, 0, 0)
"""Slurm 22.05's OCI support runs one task per node: slurmstepd refuses more ("_modify_config:
unexpected number of tasks 2 > 1", seen on 22.05.8); 24.11.5 runs several."""


def container_launch(
    exp: Experiment,
    executor: RunExecutor,
    ranks: tuple[RankSpec, ...],
    run_dir: Path,
    workdir: Path,
    slurm_version: Version | None = None,
) -> container.Launch | None:
    """How the ranks start inside the experiment's container (None: without one), with the run
    directory, every checkpoint directory and the directory submitted from mounted, for the
    Slurm release `slurm_version` (None: unknown)."""
    if exp.container.image is None:
        return None
    if executor == "local":
        raise ConfigError(
            f"container.image: {exp.container.image} is for Slurm's nodes; the local executor runs the "
            "ranks on this machine as they are: leave container.image unset (container.image=null) "
            "or submit to Slurm"
        )
    always = [run_dir, workdir, *(Path(rank.checkpoint_dir) for rank in ranks)]
    old_oci = container.runtime_of(exp.container) == "oci" and (
        slurm_version is not None and slurm_version < OCI_TASKS_PER_NODE_UNTIL
    )
    per_node = exp.resources.ranks_per_node
    if old_oci and per_node > 1:
        raise ConfigError(
            f"container.image: Slurm {shown(slurm_version)} runs one task per node in an OCI bundle, "
            f"and this run has {per_node} ranks per node; set resources.tasks_per_node=1 (and more "
            "resources.nodes), or use pyxis or Apptainer, which run a task per rank"
        )
    return container.launch(
        exp.container, always, workdir, runtimes.apptainer_command(), task_ids_from_host=old_oci
    )


CONTAINER_ARRAY = "slurmddp_container"
"""The batch script's array holding, for a sweep whose elements start in different containers,
the array task's srun options and interpreter (`container_table`)."""


def container_table(launches: Sequence[container.Launch | None], interpreter: str) -> tuple[str, ...]:
    """For a sweep whose elements start in different containers (or some in none): one array job
    runs them all with one srun line, so each array task picks its own srun options and
    interpreter from this table. srun takes options up to the first word that is not one, so both
    go where the interpreter stands: `srun ... "${slurmddp_container[@]}" -u -m BOOT ...`."""
    rows = [
        shlex.join((*launch.srun_args, *shlex.split(launch.interpreter)))
        if launch is not None
        else interpreter
        for launch in launches
    ]
    return (
        'case "$SLURM_ARRAY_TASK_ID" in',
        *(f"  {index}) {CONTAINER_ARRAY}=({row}) ;;" for index, row in enumerate(rows)),
        "esac",
    )


def _runner(started: container.Launch | None, table: Sequence[str], interpreter: str) -> str:
    """What stands in the interpreter's place on the srun line: the `container_table` array where
    the elements' containers differ, else the one container's interpreter, else `interpreter`."""
    if table:
        return f'"${{{CONTAINER_ARRAY}[@]}}"'
    return started.interpreter if started is not None else interpreter


def _check_shared(ranks: tuple[RankSpec, ...]) -> None:
    """Sweep elements must not share a checkpoint directory or a fixed port."""
    checkpoints: dict[str, int] = {}
    ports: dict[int, int] = {}
    for position, rank in enumerate(ranks):
        if rank.checkpoint_dir in checkpoints:
            raise ConfigError(
                f"checkpoint.dir: sweep elements {checkpoints[rank.checkpoint_dir]} and {position} would "
                f"share {rank.checkpoint_dir} and resume from each other's checkpoints; leave "
                "checkpoint.dir unset (each element gets RUN_DIR/checkpoints) or vary it in the sweep"
            )
        checkpoints[rank.checkpoint_dir] = position
        port = rank.dist.port
        if port is not None and port in ports:
            raise ConfigError(
                f"dist.port: sweep elements {ports[port]} and {position} both use port {port} "
                "and collide when Slurm puts them on one node; leave dist.port unset (each element's "
                "port then follows its own job id)"
            )
        if port is not None:
            ports[port] = position


def _maybe(
    check: Callable[[str, Path, Path], str], value: str | None, workdir: Path, exp_dir: Path
) -> str | None:
    return None if value is None else check(value, workdir, exp_dir)


def rank_env(exp: Experiment) -> dict[str, str]:
    """Variables every rank gets besides the rank variables; the user's fabric.env wins."""
    # Without a thread cap each rank's intra-op pool takes every core of the node, and N ranks on
    # a node then oversubscribe it N times over.
    env = {"OMP_NUM_THREADS": str(exp.resources.cpus_per_task)}
    env.update(exp.fabric.env)
    return env


def import_env_lines(envs: Sequence[dict[str, str]]) -> tuple[str, ...]:
    """The batch script's exports of the ranks' variables (`rank_env`) for a resident task to
    import torch with: one set, or where a sweep's elements differ (fabric.env), each array task's."""

    def exports(env: dict[str, str]) -> list[str]:
        return [f"export {name}={shlex.quote(value)}" for name, value in env.items()]

    if all(env == envs[0] for env in envs):
        return tuple(exports(envs[0]))
    return (
        'case "$SLURM_ARRAY_TASK_ID" in',
        *(f"  {index}) {'; '.join(exports(env)) or ':'} ;;" for index, env in enumerate(envs)),
        "esac",
    )


def snapshot_dir(exp: Experiment) -> str | None:
    """Where the batch script keeps the in-memory snapshots: only a `module:function` entrypoint's
    ctx.loop takes them (a script's framework saves its own way), and none with 0."""
    wanted = exp.entrypoint.function is not None and exp.checkpoint.snapshot_every_steps != 0
    return exp.checkpoint.snapshot_dir if wanted else None


def resident(exp: Experiment) -> bool:
    """requeue.resident_launcher, where it is unset: on, unless MPI starts the ranks (it cannot
    start them again in the same job)."""
    if exp.requeue.resident_launcher is None:
        return exp.dist.launcher != "mpi"
    return exp.requeue.resident_launcher


def resident_import(exp: Experiment) -> str:
    """What a resident task imports before it forks its rank: a function's rank needs torch and
    torch._dynamo (every optimizer's first step imports it); a script's rank only hosts the store
    (torch's c10d), and the script imports the rest in a process of its own: torch._dynamo there
    was 1.9 s of CPU a task at each start, for nothing (torch alone takes as long)."""
    return "torch._dynamo" if exp.entrypoint.function is not None else "torch"


def stop_signals(exp: Experiment) -> tuple[str, ...]:
    """The configured stop signal, and SIGTERM for clusters that preempt with it."""
    return tuple(dict.fromkeys((exp.requeue.signal, ALWAYS_STOP_ON)))


def slurm_parameters(
    exp: Experiment,
    run_dir: Path,
    interpreter: str,
    submission: int | None = None,
    slurm_version: Version | None = None,
    containers: Sequence[str] = (),
    elements: Sequence[Experiment] = (),
) -> dict[str, Any]:
    """submitit's executor parameters; `containers`: the lines that pick each sweep element's
    container (`container_table`); `elements`: a sweep's experiments, one an array task."""
    res = exp.resources
    every = elements or (exp,)
    submission_args = "" if submission is None else f" --submission {submission}"
    params: dict[str, Any] = {
        "job_name": exp.name,
        "nodes": res.allocated_nodes,
        "ntasks_per_node": res.ranks_per_node,
        "cpus_per_task": res.cpus_per_task,
        "time": minutes_ceil(parse_time(res.time)),
        # launcher mpi: srun's MPI plugin is what lets MPI_Init in each task find its peers.
        "srun_args": [*SRUN_ARGS, *([f"--mpi={exp.dist.srun_mpi}"] if exp.dist.launcher == "mpi" else [])],
        "signal_delay_s": exp.requeue.signal_lead_s,
        "setup": render_template(
            "setup.sh.j2",
            stop_signals=",".join(stop_signals(exp)),
            export_srun_cpus=exports_srun_cpus(slurm_version),
            nodes=res.nodes,
            spare_nodes=res.spare_nodes,
            python=interpreter,
            run_dir=run_dir,
            user_setup=res.setup,
            submission_args=submission_args,
            containers=containers,
            # The folder for every element that takes snapshots (its place is the same for all).
            snapshot_dir=next((found for e in every if (found := snapshot_dir(e)) is not None), None),
            resident=resident(exp),
            resident_import=resident_import(exp),
            import_env=import_env_lines([rank_env(e) for e in every]),
        ).splitlines(),
        "teardown": render_template(
            "teardown.sh.j2", python=interpreter, run_dir=run_dir, submission_args=submission_args
        ).splitlines(),
        # --signal=SIG@LEAD reaches the step's tasks only (B: would send it to the batch shell).
        # --requeue: allowed to requeue even where the cluster's JobRequeue default is 0.
        "additional_parameters": {
            "signal": f"{exp.requeue.signal}@{exp.requeue.signal_lead_s}",
            "requeue": True,
        },
    }
    if res.gpus_per_node:
        key = "gpus_per_task" if res.gpu_binding == "task" else "gpus_per_node"
        params[key] = 1 if res.gpu_binding == "task" else res.gpus_per_node
    if res.mem_gb is not None:
        params["mem"] = (
            f"{int(res.mem_gb)}GB" if res.mem_gb == int(res.mem_gb) else f"{int(res.mem_gb * 1024)}MB"
        )
    for key in ("partition", "account", "qos", "constraint", "exclude", "comment"):
        value = getattr(res, key)
        if value is not None:
            params[key] = value
    if res.spare_nodes:
        # A node that fails would otherwise end the whole job (and its spares with it).
        params["additional_parameters"]["no-kill"] = True
    params["additional_parameters"].update(res.sbatch)
    return params


def local_gpus(world_size: int, gpus: tuple[int, ...]) -> tuple[int, ...]:
    """The GPUs a local run's ranks take, one each, of the machine's `gpus`: none (CPU ranks with
    gloo, as on a machine without GPUs) where there are fewer GPUs than ranks."""
    return gpus[:world_size] if len(gpus) >= world_size else ()


def local_parameters(exp: Experiment, gpus: tuple[int, ...]) -> dict[str, Any]:
    """submitit's LocalExecutor parameters; with `gpus`, every rank sees them all (as under
    --gpus-per-node) and drives the one at its local rank (distenv.select_device)."""
    return {
        "tasks_per_node": exp.resources.world_size,
        "timeout_min": minutes_ceil(parse_time(exp.resources.time)),
        "gpus_per_node": len(gpus),
        **({"visible_gpus": gpus} if gpus else {}),
        "signal_delay_s": exp.requeue.signal_lead_s,
    }


def slurm_notes(exp: Experiment) -> tuple[str, ...]:
    if (
        exp.entrypoint.function is None
        and exp.resources.gpu_binding == "task"
        and exp.resources.gpus_per_node
    ):
        return (
            "gpu_binding=task: each task sees only its own GPU, so the script or module must use cuda:0 "
            "(or $SLURMDDP_DEVICE), not cuda:$LOCAL_RANK",
        )
    return ()


def local_notes(exp: Experiment, gpus: tuple[int, ...], machine: LocalMachine) -> tuple[str, ...]:
    """What a local run on `machine`, its ranks on `gpus` (none: the CPU), should tell the user."""
    res = exp.resources
    if gpus:
        backend = "nccl" if exp.dist.backend == "auto" else exp.dist.backend
        listed = ",".join(map(str, gpus))
        where = f"one per GPU (GPUs {listed}) with {backend}"
        notes = [f"running {res.world_size} ranks on this machine, {where} (no Slurm)"]
    else:
        notes = [f"running {res.world_size} ranks on this machine with gloo (no Slurm)"]
    cores = machine.cores
    if cores is not None and cores < res.world_size <= CROWDED * cores:
        notes.append(
            f"the {res.world_size} ranks share this machine's {cores} core{'s' * (cores > 1)}: each step "
            "takes longer than with a core a rank, and the results are the same"
        )
    if machine.gpus and not gpus:
        count = len(machine.gpus)
        notes.append(
            f"this machine has {count} GPU{'s' if count > 1 else ''} for {res.world_size} ranks: they run "
            f"on the CPU; {ranks_override(exp, count)} runs one rank per GPU"
        )
    elif res.gpus_per_node and not gpus:
        notes.append("resources.gpus_per_node is ignored by the local executor: ranks run on the CPU")
    if res.setup:
        notes.append("resources.setup lines are for Slurm batch scripts; the local executor skips them")
    return tuple(notes)


CROWDED = 2
"""Ranks a core past which a local run is warned about. Up to it only a note: the quickstart's 2
nodes x 2 ranks, the README's first command, on a 2-core laptop is what it was sized for."""


def local_warnings(exp: Experiment, cores: int | None) -> tuple[str, ...]:
    """A local run whose ranks outnumber the machine's `cores` more than CROWDED times. Each rank's
    DataLoader workers want cores too, but the user's code sets their number: only the ranks are
    counted."""
    ranks = exp.resources.world_size
    if cores is None or ranks <= CROWDED * cores:
        return ()
    return (
        f"{ranks} local ranks on {cores} core{'s' * (cores > 1)}: each rank, and each of its DataLoader "
        f"workers, wants a core of its own, so they slow each other down; run at most {cores} "
        f"rank{'s' * (cores > 1)} "
        f"({ranks_override(exp, cores)}) or give each rank fewer loader workers",
    )


def ranks_override(exp: Experiment, ranks: int) -> str:
    """The overrides that make a local run of `ranks` ranks (one per GPU for a GPU job)."""
    key = "gpus_per_node" if exp.resources.gpus_per_node else "tasks_per_node"
    return f"resources.nodes=1 resources.{key}={ranks}"


def task_env(plan: SubmissionPlan, rank: int, job_id: int) -> dict[str, str]:
    """What Slurm (or submitit's local executor) sets for task `rank` of this plan as job `job_id`
    on nodes node[1-N]: what dryrun derives a rank's environment from."""
    per_node = plan.world_size // max(1, plan.parameters.get("nodes", 1))
    nodes = plan.world_size // per_node
    if plan.executor == "local":
        fake = {
            "SUBMITIT_EXECUTOR": "local",
            "SUBMITIT_LOCAL_NTASKS": str(plan.world_size),
            "SUBMITIT_LOCAL_GLOBALID": str(rank),
            "SUBMITIT_LOCAL_LOCALID": str(rank),
            "SUBMITIT_LOCAL_JOB_ID": str(job_id),
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, plan.parameters.get("visible_gpus", ()))),
        }
    else:
        fake = {
            "SLURM_JOB_ID": str(job_id),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank % per_node),
            "SLURM_NODEID": str(rank // per_node),
            "SLURM_NTASKS": str(plan.world_size),
            "SLURM_JOB_NODELIST": f"node[1-{nodes}]" if nodes > 1 else "node1",
            "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        }
        gpus = plan.parameters.get("gpus_per_node", 0)
        if plan.parameters.get("gpus_per_task"):
            fake["SLURM_GPUS_PER_TASK"] = "1"
            fake["CUDA_VISIBLE_DEVICES"] = "0"
        elif gpus:
            fake["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    return fake


def command(plan: SubmissionPlan) -> str:
    """The command each task runs, as submitit builds it."""
    return " ".join([plan.python, "-u -m submitit.core._submit", shlex.quote(str(plan.folder))])
