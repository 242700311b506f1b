"""The in-job side: turn a task into a DDP rank and run the user's entrypoint on it."""

from __future__ import annotations

import dataclasses
import errno
import importlib
import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from slurmddp.cluster import fabric, slurm
from slurmddp.defaults import LOCAL_REQUEUE_STATUS
from slurmddp.errors import DistEnvError, EntrypointFailed, SlurmddpError
from slurmddp.experiment.entrypoint import is_file_target
from slurmddp.files import write_json
from slurmddp.job import attempts, distenv, mpi, preflight, provenance, rendezvous, scriptrun, signals
from slurmddp.job.context import RunContext
from slurmddp.job.distenv import DistEnv
from slurmddp.job.loop import PROGRESS_EVERY_S, StopForRequeue
from slurmddp.job.spec import RankSpec
from slurmddp.job.watchdog import Watchdog
from slurmddp.layout import NCCL_TRACE, PROGRESS, RESULT, STOP

DEVICE_FAULTS = (
    "uncorrectable ECC error",
    "CUDA-capable device(s) is/are busy or unavailable",
    "GPU has fallen off the bus",
    "cudaErrorDevicesUnavailable",
    "NVML",
)
"""Words of an error that blame the node's GPU, not the code: the node is left out next time."""
SYSFS_ENV = "SLURMDDP_SYSFS"
"""Where fabric detection reads sysfs; tests point it at fake trees."""


def run_rank(spec: RankSpec) -> Any:
    """Run one rank of the job described by `spec` in the current task."""
    # Back to our flag first: submitit's runner put its own handlers in just before calling us.
    signals.install(spec.stop_signals)
    if spec.executor == "local":
        # Slurm's batch script asks attempts.begin before starting the ranks; submitit's local
        # controller starts them again after every stop, a cancel's included.
        final = attempts.final_end(attempts.read_attempts(Path(spec.run_dir)))
        if final is not None:
            print(f"slurmddp: this run already ended ({final['message']}); not starting again", flush=True)
            return {"not_started": final["message"]}
    if mpi.choose(spec.dist.launcher, os.environ) == "mpi":
        dist = mpi.from_mpi({**os.environ, **spec.env}, port=spec.dist.port)
    else:
        dist = distenv.from_environment(os.environ, port=spec.dist.port)
    # Each rank's own stderr starts by naming the rank, so a traceback read alone says whose it is.
    print(
        f"slurmddp: rank {dist.rank} of {dist.world_size} (node {dist.node_rank}, "
        f"local rank {dist.local_rank}) on {socket.gethostname()}, job {dist.job_id}, "
        f"attempt {dist.restart_count}",
        file=sys.stderr,
        flush=True,
    )
    # Before torch is imported: OMP_NUM_THREADS and NCCL_* are read at import / init time.
    os.environ.update(distenv.rank_env(dist))
    os.environ.update(fabric_env(spec, dist))
    os.environ.update(spec.env)
    os.environ["SLURMDDP_RUN_DIR"] = spec.run_dir
    os.chdir(spec.workdir)
    if spec.workdir not in sys.path:
        sys.path.insert(0, spec.workdir)
    if dist.rank == 0:
        _record_provenance(spec, dist)
    if spec.script is not None or spec.module is not None:
        return _run_script(spec, dist)
    assert spec.function is not None
    return _run_function(spec, dist, load_function(spec.function))


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


def _run_function(spec: RankSpec, dist: DistEnv, function: Callable[[RunContext], Any]) -> Any:
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
    if dist.rank == 0:
        check_port_free(dist.master_port)
    store = rendezvous.open_store(dist, spec.dist.timeout_s)
    tdist.init_process_group(
        backend=backend,
        store=store,
        rank=dist.rank,
        world_size=dist.world_size,
        timeout=timedelta(seconds=spec.dist.timeout_s),
    )
    try:
        outcome = _call(spec, dist, device, host, function)
    finally:
        tdist.destroy_process_group()
    # Not after a crash: srun ends the step, and the ranks still running would only wait.
    rendezvous.exit_barrier(store, dist, spec.dist.timeout_s, _stopping)
    return outcome


def _call(
    spec: RankSpec, dist: DistEnv, device: Any, host: str, function: Callable[[RunContext], Any]
) -> Any:
    import torch.distributed as tdist
    from omegaconf import OmegaConf

    if spec.preflight.enabled:
        preflight.run(spec.preflight, dist, device, host, Path(spec.run_dir))
    config = OmegaConf.create(spec.config)
    OmegaConf.set_readonly(config, True)
    hang_timeout = spec.dist.hang_timeout_s
    ctx = RunContext(
        dist=dist,
        device=device,
        config=config,
        settings=spec.settings,
        run_dir=Path(spec.run_dir),
        checkpoint_dir=Path(spec.checkpoint_dir),
        watchdog=Watchdog(Path(spec.run_dir), dist, hang_timeout) if hang_timeout != 0 else None,
    )
    started = time.time()
    try:
        result = function(ctx)
    except StopForRequeue as stop:
        return _stopped(spec, dist, stop)
    except Exception as exc:
        _record_failure(spec, dist, ctx.active_loop.step if ctx.active_loop is not None else None, repr(exc))
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


def _stopping() -> bool:
    return signals.received() is not None


def _stopped(spec: RankSpec, dist: DistEnv, stop: StopForRequeue) -> dict[str, Any]:
    print(f"slurmddp: {stop}", flush=True)
    if spec.executor == "local":
        # submitit's local controller starts every task again when one exits with this status.
        raise SystemExit(LOCAL_REQUEUE_STATUS)
    if dist.rank == 0 and slurm.available("scontrol") and slurm.available("squeue"):
        # The fast path: decide and requeue from here, ~1 s sooner than the batch script can once
        # every rank has exited and srun has returned (the requeue ends the job, so the batch
        # script's own record is never written twice). Without the tools (a container image),
        # the batch script does it.
        attempts.end(Path(spec.run_dir), 0, os.environ, time.time(), slurm.preempt_time)
    return {"stopped_at": stop.step}


def _record_failure(spec: RankSpec, dist: DistEnv, step: int | None, error: str) -> None:
    """Where the attempt crashed, for the failure budget (a crash at the same step twice stops),
    and that it crashed: the other ranks then get srun's SIGTERM, which is no stop request. A
    device fault names this host, which the requeued job then leaves out. The attempt's first
    record stands (attempts.record_failure)."""
    fault = next((words for words in DEVICE_FAULTS if words.lower() in error.lower()), None)
    host = socket.gethostname()
    attempts.record_failure(
        Path(spec.run_dir),
        {
            "step": step,
            "rank": dist.rank,
            "error": error,
            "bad_hosts": {host: f"rank {dist.rank}: {fault}: {error[:300]}"} if fault else {},
            "job_id": dist.job_id,
            "restart_count": dist.restart_count,
            "time": time.time(),
        },
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
    the function (its process group ready), and the loop's telemetry summary (job/telemetry.py)."""
    write_json(
        run_dir / RESULT,
        {
            "result": per_rank[0],
            "ranks": per_rank,
            "world_size": dist.world_size,
            "num_nodes": dist.num_nodes,
            "job_id": dist.job_id,
            "restart_count": dist.restart_count,
            "started_at": started_at,
            "train_seconds": round(time.time() - started_at, 3),
            "telemetry": telemetry,
        },
    )


def check_port_free(port: int) -> None:
    """Fail with the reason when rank 0's rendezvous port is taken, instead of a bare EADDRINUSE."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # SO_REUSEADDR as TCPStore sets it: a TIME_WAIT socket left by this job's previous attempt
    # does not block the port, only a live listener does.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("", port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise DistEnvError(
                f"MASTER_PORT {port} is already in use on {socket.gethostname()} (another job on this "
                "node, or a job whose id differs from this one by a multiple of 10000); set dist.port"
            ) from None
        raise
    finally:
        probe.close()


def _script_env(spec: RankSpec, dist: DistEnv, steps: str) -> dict[str, str]:
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", scriptrun.STEP_FILE_ENV: steps}
    if spec.dist.hang_timeout_s != 0:
        watch = {**dataclasses.asdict(dist), "hang_timeout_s": spec.dist.hang_timeout_s}
        env[scriptrun.WATCH_ENV] = json.dumps(watch)
    return env


def _wait_for_script(child: subprocess.Popen[bytes], dist: DistEnv, run_dir: Path, steps: Path) -> int:
    """The script's exit status. A stop signal is passed on as SIGTERM; rank 0 records the steps
    made as progress, as ctx.loop does for a function."""
    forwarded = False
    shown_at = 0.0
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            if signals.received() is not None and not forwarded:
                child.send_signal(signal.SIGTERM)
                forwarded = True
            if dist.rank == 0 and time.monotonic() - shown_at >= PROGRESS_EVERY_S:
                shown_at = time.monotonic()
                step = scriptrun.read_steps(steps)
                if step is not None:
                    progress = {"step": step, "job_id": dist.job_id, "restart_count": dist.restart_count}
                    write_json(run_dir / PROGRESS, {**progress, "time": time.time()})


def _after(step: int | None) -> str:
    return "" if step is None else f" after {step} optimizer steps of this attempt"


def _run_script(spec: RankSpec, dist: DistEnv) -> int:
    """Run a torchrun-style script as this rank. A stop signal reaches it as SIGTERM, the signal
    torchrun's agent sends its workers; the script saves its own snapshot and exits, and the job is
    requeued as for a function entrypoint."""
    assert spec.script is not None or spec.module is not None
    if dist.rank == 0:
        check_port_free(dist.master_port)
    command = spec.command()
    with tempfile.NamedTemporaryFile(prefix="slurmddp-steps-") as steps:
        # This process hosts the store, as torchrun's agent does: it outlives the script (module
        # doc of job.rendezvous). The script's clients retry until it is up, so torch loads
        # meanwhile. job.scriptrun runs the script as python would, counting its optimizer steps.
        child = subprocess.Popen(
            [sys.executable, "-m", "slurmddp.job.scriptrun", *command[1:]],
            env={**os.environ, **_script_env(spec, dist, steps.name)},
        )
        store = rendezvous.open_store(dist, spec.dist.timeout_s)
        code = _wait_for_script(child, dist, Path(spec.run_dir), Path(steps.name))
        step = scriptrun.read_steps(Path(steps.name))
        finished = scriptrun.read_finished(Path(steps.name))
    stop = signals.received()
    if stop is None and code < 0 and finished:
        print(
            f"slurmddp: rank {dist.rank}: {shlex.join(command)} ended with status 0, then its process "
            f"died of {signals.name(-code)} while Python shut down; counted as completed",
            file=sys.stderr,
            flush=True,
        )
        code = 0
    if stop is None and code != 0:
        # Before srun's SIGTERM reaches the other ranks: their stop is no stop request.
        _record_failure(spec, dist, step, f"{shlex.join(command)} exited with status {code}{_after(step)}")
        raise EntrypointFailed(f"rank {dist.rank}: {shlex.join(command)} exited with status {code}")
    if stop is not None:
        if dist.rank == 0:
            write_json(
                Path(spec.run_dir) / STOP,
                {
                    "step": None,
                    "signal": signals.name(stop),
                    "signal_at": signals.received_at(),
                    "script_status": code,
                    "job_id": dist.job_id,
                    "restart_count": dist.restart_count,
                    "time": time.time(),
                },
            )
        if spec.executor == "local":
            raise SystemExit(LOCAL_REQUEUE_STATUS)
    rendezvous.exit_barrier(store, dist, spec.dist.timeout_s, _stopping)
    return code
