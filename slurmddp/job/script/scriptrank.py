"""A rank that runs a torchrun-style script (or `-m module`) as its child: the rank's process hosts
the rendezvous store, passes a stop signal on as SIGTERM, records progress and how the script
ended. The child itself is job/script/scriptrun.py, which counts the script's optimizer steps."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from slurmddp.defaults import LOCAL_REQUEUE_STATUS
from slurmddp.errors import EntrypointFailed
from slurmddp.job.process import crash, peerwatch, rendezvous, signals, stop
from slurmddp.job.process.distenv import DistEnv
from slurmddp.job.process.watchdog import HANG_EXIT_STATUS, rendezvous_s
from slurmddp.job.script import scriptrun
from slurmddp.job.spec import RankSpec
from slurmddp.job.train import trackers
from slurmddp.job.train.loop import PROGRESS_EVERY_S
from slurmddp.rundir.records import AttemptId, Failure, LoopProgress, Progress, Stop

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store


@dataclasses.dataclass(frozen=True)
class _ScriptRun:
    """How the script ended, as this rank saw it, and what the rank's end still needs."""

    code: int
    """The script's exit status."""
    step: int | None
    """The optimizer steps of this attempt, if the script counted any."""
    started: int
    """The step this attempt started from (scriptrun.run_step)."""
    finished: bool
    """The script itself ended with status 0."""
    stopped_on: int | None
    """The stop signal the script stopped for by agreement, if it did."""
    store: Store
    watch: peerwatch.PeerWatch | None


def run_script(spec: RankSpec, dist: DistEnv) -> int:
    """Run a torchrun-style script as this rank. A stop signal reaches it as SIGTERM, the signal
    torchrun's agent sends its workers; the script saves its own snapshot and exits, and the job is
    requeued as for a function entrypoint."""
    assert spec.script is not None or spec.module is not None
    if dist.rank == 0:
        rendezvous.check_port_free(dist.master_port)
    command = spec.command()
    run = _run_child(spec, dist, command)
    if dist.rank == 0 and run.step is not None:
        # The attempt's last count, which the next attempt goes on from; when its first step was
        # seen, as the polling recorded it (a script that ended before the first poll: now).
        me, now = AttemptId.of(dist), time.time()
        seen = Progress.read(Path(spec.run_dir))
        first = seen.first_step_at if seen is not None and seen.attempt == me else None
        first = first or (now if run.step > 0 else None)
        loop = seen.loop if seen is not None and seen.attempt == me else None  # the total, if said
        Progress(run.started + run.step, me, now, loop, started_step=run.started, first_step_at=first).write(
            Path(spec.run_dir)
        )
    # A script that stopped by agreement stopped, even where this process heard no signal itself.
    stop = signals.received() or run.stopped_on
    code = run.code
    if stop is None and code < 0 and run.finished:
        print(
            f"slurmddp: rank {dist.rank}: {shlex.join(command)} ended with status 0, then its process "
            f"died of {signals.name(-code)} while Python shut down; counted as completed",
            file=sys.stderr,
            flush=True,
        )
        code = 0
    if run.watch is not None and (stop is not None or code == 0):
        run.watch.leave()
    if stop is None and code != 0:
        _end_failed(spec, dist, command, run, code)
    if stop is not None:
        _end_stopped(spec, dist, run, stop, code)
    rendezvous.exit_barrier(run.store, dist, spec.dist.timeout_s, signals.stopping)
    return code


def _run_child(spec: RankSpec, dist: DistEnv, command: list[str]) -> _ScriptRun:
    """Run the script as this process's child while this process hosts the store and the peer
    watch; return once the script has ended."""
    began = time.monotonic()
    with tempfile.NamedTemporaryFile(prefix="slurmddp-steps-") as steps:
        # This process hosts the store, as torchrun's agent does: it outlives the script (module
        # doc of job.rendezvous). The script's clients retry until it is up, so torch loads
        # meanwhile. job.scriptrun runs the script as python would, counting its optimizer steps.
        before = _steps_before(Path(spec.run_dir), AttemptId.of(dist))
        child = subprocess.Popen(
            [sys.executable, "-m", "slurmddp.job.script.scriptrun", *command[1:]],
            env={
                **os.environ,
                **_script_env(spec, dist, steps.name, began),
                scriptrun.STEPS_BEFORE_ENV: str(before),
            },
        )
        # From now on a stop signal reaches the script at once, not at the next poll: every rank
        # hears it within the same millisecond (job/process/stop.py agrees on the step).
        signals.install(spec.stop_signals, then=_forward_once(child))
        met = _follow_a_start_hang(child) if spec.dist.start_timeout_s else None
        store = rendezvous.open_store(dist, rendezvous_s(spec.dist.timeout_s, spec.dist.start_timeout_s))
        watch = peerwatch.start(store, dist, spec, child)
        store.set_timeout(timedelta(seconds=spec.dist.timeout_s))
        if met is not None:
            met.set()
        if watch is not None:
            watch.step_of = lambda: scriptrun.read_steps(Path(steps.name))
        code = _wait_for_script(child, dist, Path(spec.run_dir), Path(steps.name), before)
        step = scriptrun.read_steps(Path(steps.name))
        started, _ = scriptrun.run_step(Path(steps.name), before)
        finished = scriptrun.read_finished(Path(steps.name))
        stopped_on = scriptrun.read_stopped(Path(steps.name))
    return _ScriptRun(code, step, started, finished, stopped_on, store, watch)


def _end_failed(spec: RankSpec, dist: DistEnv, command: list[str], run: _ScriptRun, code: int) -> NoReturn:
    """The script failed with no stop asked for: record it, tell the peers, raise EntrypointFailed."""
    # Before srun's SIGTERM reaches the other ranks: their stop is no stop request.
    error = f"{shlex.join(command)} exited with status {code}{_after(run.step)}"
    _record_failure(Path(spec.run_dir), dist, run.step, error, code)
    if run.watch is not None:
        run.watch.crashed()
    raise EntrypointFailed(f"rank {dist.rank}: {shlex.join(command)} exited with status {code}")


def _end_stopped(spec: RankSpec, dist: DistEnv, run: _ScriptRun, signum: int, code: int) -> None:
    """The script stopped for `signum`: rank 0 records the stop; a local run ends for its requeue."""
    if dist.rank == 0:
        Stop(
            step=None if run.step is None else run.started + run.step,
            signal=signals.name(signum),
            signal_at=signals.received_at(),
            attempt=AttemptId.of(dist),
            time=time.time(),
            script_status=code,
        ).write(Path(spec.run_dir))
    if spec.executor == "local":
        raise SystemExit(LOCAL_REQUEUE_STATUS)


def _record_failure(run_dir: Path, dist: DistEnv, step: int | None, error: str, code: int) -> None:
    """crash.record's record (where the device is to blame, it names this node) with the script's
    exit status added: what tells one script failure from another where no Python exception
    reached this process (job/allocation/requeue.py's signature: argparse's 2 before any step, twice)."""
    crash.record(run_dir, dist, step, error)
    mine = Failure.read_for(run_dir, AttemptId.of(dist))
    # Only where this rank's record is the attempt's: the first one stands (Failure.write).
    if mine is not None and (mine.rank, mine.error) == (dist.rank, error):
        dataclasses.replace(mine, exit_status=code).write(run_dir, replace=True)


def _forward_once(child: subprocess.Popen[bytes]) -> Callable[[int], None]:
    """Pass the first stop signal on to the script as SIGTERM, the signal torchrun's agent sends
    its workers."""
    forwarded = False

    def forward(signum: int) -> None:
        nonlocal forwarded
        if not forwarded and child.returncode is None:
            forwarded = True
            child.send_signal(signal.SIGTERM)

    return forward


def _follow_a_start_hang(child: subprocess.Popen[bytes]) -> threading.Event:
    """Until the event is set (this process met rank 0's at the store), a script whose start-up
    watchdog fired, its record written, ends this process with the same status: else it would wait
    in the store's connect for a rank 0 that may never come, and srun for it."""
    met = threading.Event()

    def follow() -> None:
        while not met.wait(0.2):
            if child.poll() == HANG_EXIT_STATUS:
                os._exit(HANG_EXIT_STATUS)

    threading.Thread(target=follow, name="slurmddp-startfollow", daemon=True).start()
    return met


def _script_env(spec: RankSpec, dist: DistEnv, steps: str, began: float) -> dict[str, str]:
    env = {
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        scriptrun.STEP_FILE_ENV: steps,
        stop.STORE_ENV: f"{dist.master_addr}:{dist.master_port}",
        **trackers.script_env(Path(spec.run_dir), os.environ),
    }
    if spec.settings.ddp.resume_buckets:
        env[scriptrun.RESUME_BUCKETS_ENV] = "1"
    if spec.settings.integrations == "auto":
        env[scriptrun.AUTO_ENV] = "1"
    if spec.dist.hang_timeout_s != 0 or spec.dist.start_timeout_s != 0:
        watch = {
            **dataclasses.asdict(dist),
            "hang_timeout_s": spec.dist.hang_timeout_s,
            "start_timeout_s": spec.dist.start_timeout_s,
            "began": began,
        }
        env[scriptrun.WATCH_ENV] = json.dumps(watch)
    return env


def _steps_before(run_dir: Path, attempt: AttemptId) -> int:
    """The optimizer steps the run's earlier attempts made: the newest progress record's, unless
    this attempt wrote it (a rank that starts late)."""
    progress = Progress.read(run_dir)
    return 0 if progress is None or progress.attempt == attempt else progress.step


def _wait_for_script(
    child: subprocess.Popen[bytes], dist: DistEnv, run_dir: Path, steps: Path, before: int
) -> int:
    """The script's exit status; meanwhile rank 0 records as progress the step the script is at:
    the step this attempt started from (where the script said it resumed, else the steps of the
    earlier attempts, `before`) and the optimizer steps it made since."""
    shown_at = 0.0
    first_step_at: float | None = None
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            if dist.rank == 0 and time.monotonic() - shown_at >= PROGRESS_EVERY_S:
                shown_at = time.monotonic()
                started, step = scriptrun.run_step(steps, before)
                if step is not None:
                    # Seen at most PROGRESS_EVERY_S late: the script's steps are counted by polling.
                    first_step_at = first_step_at or (time.time() if step > started else None)
                    Progress(
                        step,
                        AttemptId.of(dist),
                        time.time(),
                        _total(steps),
                        started_step=started,
                        first_step_at=first_step_at,
                    ).write(run_dir)


def _total(steps: Path) -> LoopProgress | None:
    """What a script knows besides its step: the run's total, where it said it (an ETA)."""
    total = scriptrun.read_total(steps)
    return None if total is None else LoopProgress(total, None, None, 0.0, None)


def _after(step: int | None) -> str:
    return "" if step is None else f" after {step} optimizer steps of this attempt"
