"""The in-job side: turn a task into a DDP rank and run the user's entrypoint on it."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmddp.cluster import fabric, slurm
from slurmddp.defaults import LOCAL_REQUEUE_STATUS
from slurmddp.errors import SlurmddpError
from slurmddp.experiment.entrypoint import is_file_target
from slurmddp.job.allocation import attempts
from slurmddp.job.checkpoint.prefetch import prefetch
from slurmddp.job.launch import provenance
from slurmddp.job.process import (
    crash,
    distenv,
    forks,
    mpi,
    peerwatch,
    preflight,
    rendezvous,
    signals,
    startwatch,
)
from slurmddp.job.process.distenv import DistEnv
from slurmddp.job.process.stop import StopForRequeue
from slurmddp.job.process.watchdog import Watchdog, rendezvous_s
from slurmddp.job.script.scriptrank import run_script
from slurmddp.job.spec import RankSpec
from slurmddp.job.train.context import RunContext
from slurmddp.job.train.loop import SlowNodeReplaced, TrialPruned
from slurmddp.rundir import records
from slurmddp.rundir.layout import NCCL_TRACE, RESULT
from slurmddp.rundir.outputs import Result
from slurmddp.rundir.records import AttemptId
from slurmddp.search import trial

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

SYSFS_ENV = "SLURMDDP_SYSFS"
"""Where fabric detection reads sysfs; tests point it at fake trees."""


def run_rank(spec: RankSpec) -> Any:
    """Run one rank of the job described by `spec` in the current task."""
    # Back to our flag first: submitit's runner put its own handlers in just before calling us.
    signals.install(spec.stop_signals)
    # A search's element was pickled before its trial's values were chosen (its first start).
    spec = dataclasses.replace(spec, config=trial.applied(spec.config, Path(spec.run_dir)))
    if spec.executor == "local":
        # Slurm's batch script asks attempts.begin before starting the ranks; submitit's local
        # controller starts them again after every stop, a cancel's included.
        final = records.final_end(records.read_attempts(Path(spec.run_dir)))
        if final is not None:
            print(f"slurmddp: this run already ended ({final.message}); not starting again", flush=True)
            return {"not_started": final.message}
    if mpi.choose(spec.dist.launcher, os.environ) == "mpi":
        dist = mpi.from_mpi({**os.environ, **spec.env}, port=spec.dist.port)
    else:
        dist = distenv.from_environment(os.environ, port=spec.dist.port)
    if spec.executor == "local":
        # submitit's local controller counts no restarts: the run's attempt records do.
        attempt = records.local_attempt(records.read_attempts(Path(spec.run_dir)), dist.job_id)
        dist = dataclasses.replace(dist, restart_count=attempt.restart_count)
    # Each rank's own stderr starts by naming the rank, so a traceback read alone says whose it is.
    print(banner(dist, Path(spec.run_dir)), file=sys.stderr, flush=True)
    if spec.executor == "local" and dist.rank == 0:
        return _local_attempt(spec, dist)
    return _run_entrypoint(spec, dist)


def banner(dist: DistEnv, run_dir: Path) -> str:
    """The line a rank's stderr starts with: the rank, where it runs, and which attempt of the run
    it is (numbered as `status` and the progress line number them, over resubmits too)."""
    number = records.attempt_number(records.read_attempts(run_dir), AttemptId.of(dist))
    return (
        f"slurmddp: rank {dist.rank} of {dist.world_size} (node {dist.node_rank}, "
        f"local rank {dist.local_rank}) on {socket.gethostname()}, job {dist.job_id}, attempt {number}"
        + (f", restart {dist.in_job_restart} in this allocation" if dist.in_job_restart else "")
    )


def _local_attempt(spec: RankSpec, dist: DistEnv) -> Any:
    """Rank 0 of a local run records its attempt's begin and end, as Slurm's batch script does
    around srun; the end before this rank exits, so that the controller's next start (which
    waits for every rank to exit) counts it."""
    run_dir = Path(spec.run_dir)
    me = AttemptId.of(dist)
    attempts.begin_local(run_dir, me, socket.gethostname(), time.time())
    try:
        outcome = _run_entrypoint(spec, dist)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        _end_local(run_dir, me, status)
        raise
    except BaseException:
        _end_local(run_dir, me, 1)
        raise
    _end_local(run_dir, me, 0)
    return outcome


def _end_local(run_dir: Path, me: AttemptId, status: int) -> None:
    try:
        ended = attempts.end_local(run_dir, me, status, time.time())
    except Exception as exc:
        # The attempt's own outcome stands; only its record is missing.
        print(f"slurmddp: warning: could not record the attempt's end: {exc!r}", file=sys.stderr, flush=True)
        return
    if ended is not None and ended.reason != "completed":
        print(f"slurmddp: attempt ended: {ended.message}", file=sys.stderr, flush=True)


def threads_as_told() -> None:
    """torch's intra-op threads as OMP_NUM_THREADS says, where torch was imported before it was set:
    a resident launcher's task imports torch before its rank's variables, and torch reads the
    variable as it is imported (2 threads, not 1, were seen without this)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if "torch" in sys.modules and threads.isdigit():
        sys.modules["torch"].set_num_threads(int(threads))


def _run_entrypoint(spec: RankSpec, dist: DistEnv) -> Any:
    # Before torch is imported: OMP_NUM_THREADS and NCCL_* are read at import / init time.
    os.environ.update(distenv.rank_env(dist))
    os.environ.update(fabric_env(spec, dist))
    os.environ.update(spec.env)
    threads_as_told()
    os.environ["SLURMDDP_RUN_DIR"] = spec.run_dir
    os.chdir(spec.workdir)
    # Before any user code: no child it forks may keep this rank's sockets alive (job/process/forks.py).
    forks.install()
    if spec.workdir not in sys.path:
        sys.path.insert(0, spec.workdir)
    if dist.rank == 0:
        _record_provenance(spec, dist)
    if spec.script is not None or spec.module is not None:
        return run_script(spec, dist)
    assert spec.function is not None
    watchdog = _watchdog(spec, dist)
    try:
        # The disk works while the user's module, torch and the process group load (seconds).
        prefetch(Path(spec.checkpoint_dir), dist.rank, shared=dist.local_rank == 0)
        try:
            function = load_function(spec.function)
        except Exception as exc:
            # The user's module raised while it was imported (a NameError, an import it lacks).
            crash.record(Path(spec.run_dir), dist, None, repr(exc), exc)
            raise
        return _run_function(spec, dist, function, watchdog)
    finally:
        if watchdog is not None:
            watchdog.stop()


def _watchdog(spec: RankSpec, dist: DistEnv) -> Watchdog | None:
    """The rank's watchdog, from its start: the start-up deadline, then the hang timeout."""
    if spec.dist.hang_timeout_s == 0 and spec.dist.start_timeout_s == 0:
        return None
    return Watchdog(Path(spec.run_dir), dist, spec.dist.hang_timeout_s, spec.dist.start_timeout_s)


def _record_provenance(spec: RankSpec, dist: DistEnv) -> None:
    """In a thread: git and `scontrol --version` take tens of ms that the rendezvous need not wait
    for. A failure to record is reported, never fatal."""

    def run() -> None:
        try:
            provenance.record(
                Path(spec.run_dir),
                Path(spec.workdir),
                dict(os.environ),
                spec.config,
                dist.job_id,
                dist.restart_count,
            )
        except Exception as exc:
            print(f"slurmddp: warning: could not record provenance: {exc!r}", file=sys.stderr, flush=True)

    threading.Thread(target=run, name="slurmddp-provenance", daemon=True).start()


def fabric_env(spec: RankSpec, dist: DistEnv) -> dict[str, str]:
    """NCCL settings for this node's fabric, detected here: the login node's hardware is not the
    compute nodes'. CPU ranks (gloo) skip it unless a profile is named explicitly."""
    if spec.fabric_profile == "none" or (spec.fabric_profile == "auto" and dist.device_index is None):
        return {}
    live = {name for _, name in socket.if_nameindex()}
    found = fabric.in_namespace(fabric.detect(Path(os.environ.get(SYSFS_ENV, "/sys"))), live)
    try:
        env = fabric.nccl_env(found, spec.fabric_profile, spec.env)
    except SlurmddpError as exc:
        raise type(exc)(f"{socket.gethostname()}: {exc}") from None
    # The flight recorder's dump on a collective timeout goes next to the run, not to /tmp.
    env.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(Path(spec.run_dir) / NCCL_TRACE / "rank_"))
    (Path(spec.run_dir) / NCCL_TRACE).mkdir(exist_ok=True)
    if dist.local_rank == 0:
        shown = " ".join(f"{key}={value}" for key, value in sorted(env.items()))
        print(f"slurmddp: {socket.gethostname()}: {fabric.describe(found)}; {shown}", flush=True)
    return env


def load_function(target: str) -> Callable[[RunContext], Any]:
    """Import `module:function` or `/path/file.py:function`."""
    module_name, _, name = target.rpartition(":")
    if is_file_target(module_name):
        path = Path(module_name)
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise SlurmddpError(f"cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        # Registered before it runs, as an import would, so pickle and dataclasses can find it.
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    function = getattr(module, name)
    if not callable(function):
        raise SlurmddpError(f"{target} is not callable")
    return function  # type: ignore[no-any-return]


def _run_function(
    spec: RankSpec, dist: DistEnv, function: Callable[[RunContext], Any], watchdog: Watchdog | None
) -> Any:
    import torch
    import torch.distributed as tdist

    backend = dist.backend if spec.dist.backend == "auto" else spec.dist.backend
    host = socket.gethostname()
    preflight.check_device(dist, host, Path(spec.run_dir))
    if dist.device_index is not None:
        device = torch.device("cuda", dist.device_index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    store, watch = _open_rendezvous(spec, dist, watchdog)
    _enter(watchdog, startwatch.PROCESS_GROUP)
    tdist.init_process_group(
        backend=backend,
        store=store,
        rank=dist.rank,
        world_size=dist.world_size,
        timeout=timedelta(seconds=spec.dist.timeout_s),
    )
    try:
        outcome = _call(spec, dist, device, host, function, watch, watchdog)
    except SystemExit as exc:
        # A local run's stop, or the user's own exit: no death, unless it says it failed.
        if watch is not None and exc.code in (None, 0, LOCAL_REQUEUE_STATUS):
            watch.leave()
        raise
    except Exception:
        if watch is not None:
            watch.crashed()
        raise
    else:
        if watch is not None:
            watch.leave()
    finally:
        tdist.destroy_process_group()
    # Not after a crash: srun ends the step, and the ranks still running would only wait.
    rendezvous.exit_barrier(store, dist, spec.dist.timeout_s, signals.stopping)
    return outcome


def _open_rendezvous(
    spec: RankSpec, dist: DistEnv, watchdog: Watchdog | None
) -> tuple[Store, peerwatch.PeerWatch | None]:
    """The rendezvous: the job's store (rank 0 hosts it) and this rank's peer watch; with a start-up
    deadline, every rank's arrival seen before the process group forms."""
    if dist.rank == 0:
        rendezvous.check_port_free(dist.master_port)
    _enter(watchdog, startwatch.RENDEZVOUS)
    waits = rendezvous_s(spec.dist.timeout_s, spec.dist.start_timeout_s)
    store = rendezvous.open_store(dist, waits)
    watch = peerwatch.start(store, dist, spec)
    if watchdog is not None and spec.dist.start_timeout_s and dist.world_size > 1:
        rendezvous.arrive(store, dist, waits, watchdog.arrived)
    # What waits on the store later (NCCL's first communicator, the exit barrier) waits as before.
    store.set_timeout(timedelta(seconds=spec.dist.timeout_s))
    return store, watch


def _call(
    spec: RankSpec,
    dist: DistEnv,
    device: Any,
    host: str,
    function: Callable[[RunContext], Any],
    watch: peerwatch.PeerWatch | None,
    watchdog: Watchdog | None,
) -> Any:
    import torch.distributed as tdist
    from omegaconf import OmegaConf

    if spec.preflight.enabled:
        _enter(watchdog, startwatch.PREFLIGHT)
        preflight.run(spec.preflight, dist, device, host, Path(spec.run_dir))
    _enter(watchdog, startwatch.SETUP)
    config = OmegaConf.create(spec.config)
    OmegaConf.set_readonly(config, True)
    ctx = RunContext(
        dist=dist,
        device=device,
        config=config,
        settings=spec.settings,
        run_dir=Path(spec.run_dir),
        checkpoint_dir=Path(spec.checkpoint_dir),
        watchdog=watchdog,
    )
    if watch is not None:
        watch.step_of = lambda: ctx.active_loop.step if ctx.active_loop is not None else None
    started = time.time()
    try:
        result = function(ctx)
    except StopForRequeue as stop:
        return _stopped(spec, dist, stop)
    except TrialPruned as pruned:
        print(f"slurmddp: {pruned}", flush=True)
        return {"pruned_at": pruned.step}
    except SlowNodeReplaced as replaced:
        # Not a crash: one line in every rank's log, not a traceback; rank 0's failure record
        # names the node. SystemExit goes past submitit's runner, which would record an error.
        print(f"slurmddp: {replaced}", flush=True)
        raise SystemExit(1) from None
    except Exception as exc:
        step = ctx.active_loop.step if ctx.active_loop is not None else None
        crash.record(Path(spec.run_dir), dist, step, repr(exc), exc)
        raise
    finally:
        if ctx.watchdog is not None:
            ctx.watchdog.stop()
        ctx.close()
    _check_json(result, spec.function)
    gathered: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(gathered, result)
    if dist.rank == 0:
        loop = ctx.active_loop
        telemetry = loop.telemetry.summary if loop is not None and loop.telemetry is not None else None
        write_result(Path(spec.run_dir), dist, gathered, started, telemetry)
    return result


def _enter(watchdog: Watchdog | None, phase: str) -> None:
    if watchdog is not None:
        watchdog.phase(phase)


def _stopped(spec: RankSpec, dist: DistEnv, stop: StopForRequeue) -> dict[str, Any]:
    print(f"slurmddp: {stop_message(Path(spec.run_dir), stop)}", flush=True)
    if spec.executor == "local":
        if _cancelled(Path(spec.run_dir)):
            # Ended as they are: submitit's controller would start them again only to say so.
            return {"stopped_at": stop.step}
        # submitit's local controller starts every task again when one exits with this status.
        raise SystemExit(LOCAL_REQUEUE_STATUS)
    if dist.rank == 0 and slurm.available("scontrol") and slurm.available("squeue"):
        # The fast path: decide and requeue from here, ~1 s sooner than the batch script can once
        # every rank has exited and srun has returned (the requeue ends the job, so the batch
        # script's own record is never written twice). Without the tools (a container image),
        # the batch script does it.
        attempts.end(Path(spec.run_dir), 0, os.environ, time.time(), slurm.preempt_time)
    return {"stopped_at": stop.step}


def _cancelled(run_dir: Path) -> bool:
    """Whether the stop is a cancel: `cancel` marks the run cancelled before it signals."""
    final = records.final_end(records.read_attempts(run_dir))
    return final is not None and final.reason == records.CANCELLED


def stop_message(run_dir: Path, stop: StopForRequeue) -> str:
    """What a rank says once it stopped and saved: that the job will be requeued, unless the stop
    is a cancel, which ends the run."""
    if not _cancelled(run_dir):
        return str(stop)
    return (
        f"stopped at step {stop.step} for the cancel and saved a checkpoint there; the run ends "
        "(`resubmit` resumes from that checkpoint)"
    )


def _check_json(result: Any, target: str | None) -> None:
    try:
        json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise SlurmddpError(
            f"{target} returned {type(result).__name__}, which cannot be written to {RESULT} "
            f"({exc}); return a dict of numbers and strings"
        ) from None


def write_result(
    run_dir: Path,
    dist: DistEnv,
    per_rank: list[Any],
    started_at: float,
    telemetry: dict[str, Any] | None = None,
) -> None:
    """result.json: rank 0's return value, every rank's, where the job ran, when rank 0 called
    the function (its process group ready), and the loop's telemetry summary (job/train/telemetry.py)."""
    Result(
        result=per_rank[0],
        ranks=per_rank,
        world_size=dist.world_size,
        num_nodes=dist.num_nodes,
        started_at=started_at,
        train_seconds=round(time.time() - started_at, 3),
        telemetry=telemetry,
        attempt=AttemptId.of(dist),
    ).write(run_dir)
