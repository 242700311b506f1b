"""A watchdog beside the training thread: when a rank stops making progress, every rank says where
it is, the rank that did not arrive is named, and the attempt ends as a failure to be requeued.

Progress is what the training thread reports for free: a step of ctx.loop, a batch of an
evaluation loader, a ctx.log/reduce/gather call. A collective waiting on a dead or stuck peer only
fails after dist.timeout_s, and a rank stuck outside any collective (a deadlocked data pipeline, a
rank that stopped calling collectives) never fails at all: srun waits until the time limit.

When the watchdog fires, each rank writes into RUN_DIR/hangs/JOB.RESTART/:
- rank_R.stacks.txt: every thread's Python stack (faulthandler, which needs no GIL handoff from a
  thread blocked in C);
- rank_R.nccl_trace: the NCCL flight recorder, when the backend is NCCL;
- rank_R.json: its step, host, whether its main thread waits inside a collective, and its innermost
  frame.
Rank 0 then names the ranks that did not arrive (those not waiting in a collective, or that never
reported), writes summary.json and the attempt's failure record, and every rank exits with
HANG_EXIT_STATUS; srun's --kill-on-bad-exit ends the rest and the batch script restarts or
requeues. Their hosts are suspects, not bad hosts: a rank that did not arrive is as likely the
code's (a deadlocked data pipeline) as its node's, so a restart runs on a spare in their place for
the rest of the allocation where one is left, else on the same nodes (job/allocation/requeue.py).

Before the first steps the same thread keeps the start-up deadline (dist.start_timeout_s, counted
from the rank's start): a hang at the rendezvous, in the process group or in the user's setup is
reported the same way, each rank's report saying its phase, the verdict naming the ranks that hold
the start up (job/process/startwatch.py); where rank 0 reports nothing (its node may be the broken one), the
lowest rank that did gives the verdict in its stead. Until it fires the thread makes no torch call
(one still inside torch's C++ when the process exits would abort it): rank 0's main thread tells
it who has reached the rendezvous store (job/process/rendezvous.py's `arrive`).
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from slurmddp.job.process import startwatch
from slurmddp.job.process.distenv import DistEnv, rank_hosts
from slurmddp.rundir import hangs
from slurmddp.rundir.layout import HANGS
from slurmddp.rundir.records import AttemptId, Failure

AUTO_FLOOR_S = 300.0
"""The automatic timeout is never shorter: a slow first evaluation is not a hang."""
AUTO_FACTOR = 20.0
"""The automatic timeout: this many times the slowest gap between two beats seen so far."""
GATHER_S = 20.0
"""How long rank 0 waits for every rank's report, and the others for rank 0's summary."""
POLL_S = 1.0
HANG_EXIT_STATUS = 86

# A main thread with one of these in its stack waits for its peers (a collective, DDP's gradient
# all-reduce finishing in the backward pass, the store), not for work of its own.
_WAITING_IN = (
    f"torch{os.sep}distributed{os.sep}",
    f"torch{os.sep}nn{os.sep}parallel{os.sep}distributed.py",
    f"torch{os.sep}autograd{os.sep}",
)


_NOT_USER = (f"{os.sep}slurmddp{os.sep}", f"{os.sep}torch{os.sep}", "<frozen ")
_STDLIB = tuple({sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")})


class Watchdog:
    """Started at a rank's start by the runtime for a function entrypoint, and in a script's own
    process. Until the first steps it keeps the start-up deadline (dist.start_timeout_s): the rank
    says which phase it is in (`phase`), rank 0 who has checked in at the rendezvous (`arrived`).
    The training side calls `beat` and `at(step)` and, after its loop, `rest()`."""

    def __init__(
        self,
        run_dir: Path,
        dist: DistEnv,
        timeout_s: int | None,
        start_timeout_s: int = 0,
        *,
        phase: str = startwatch.LOADING,
        began: float | None = None,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        in_job = f".{dist.in_job_restart}" if dist.in_job_restart else ""
        self._dir = run_dir / HANGS / f"{dist.job_id or 'local'}.{dist.restart_count}{in_job}"
        self._run_dir = run_dir
        self._dist = dist
        self._fixed = float(timeout_s) if timeout_s else None
        self._watches_steps = timeout_s != 0
        self._start_s = float(start_timeout_s)
        self._began = time.monotonic() if began is None else began
        self._phase: str | None = phase if start_timeout_s else None
        """The phase of the rank's start (job/process/startwatch.py); None once it is over."""
        self._arrived: tuple[int, ...] | None = None
        self._steps = 0
        self._exit = exit
        self._step: int | None = None
        self._last = time.monotonic()
        self._slowest = 0.0
        self._armed = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slurmddp-watchdog", daemon=True)
        self._thread.start()

    def phase(self, name: str) -> None:
        """The rank's start goes on to phase `name` (job/process/startwatch.py)."""
        if self._phase is not None:
            self._phase = name

    def arrived(self, ranks: Sequence[int]) -> None:
        """Rank 0: the ranks that have checked in at the rendezvous store so far."""
        self._arrived = tuple(ranks)

    def beat(self) -> None:
        if self._steps == 0:
            # Outside ctx.loop (an evaluation, ctx.log/reduce/gather, a script's batch): the only
            # progress an entrypoint without the loop shows.
            self._phase = None
        self._tick()

    def at(self, step: int) -> None:
        """A training step starts: the watchdog is armed from the first; the start is over once
        every rank has made its first (startwatch.FIRST_STEPS)."""
        self._step = step
        self._steps += 1
        if self._phase is not None:
            self._phase = startwatch.FIRST_STEP if self._steps < startwatch.FIRST_STEPS else None
        self._tick()
        self._armed = self._watches_steps

    def rest(self) -> None:
        """The loop is over (final evaluation and saving are not steps)."""
        self._armed = False
        self._phase = None

    def stop(self) -> None:
        self._done.set()

    def limit_s(self) -> float:
        return self._fixed if self._fixed is not None else max(AUTO_FLOOR_S, AUTO_FACTOR * self._slowest)

    def _tick(self) -> None:
        now = time.monotonic()
        if self._armed:
            self._slowest = max(self._slowest, now - self._last)
        self._last = now

    def _watch(self) -> None:
        while not self._done.wait(POLL_S):
            now = time.monotonic()
            phase = self._phase
            if phase is not None and now - self._began > self._start_s:
                self._fire_start(phase, now - self._began)
                return
            idle = now - self._last
            if self._armed and idle > self.limit_s():
                self._fire(idle)
                return
            if phase is None and not self._watches_steps:
                return  # started, and no hang timeout: nothing left to watch

    def _fire(self, idle: float) -> None:
        main = _main_frame()
        self._report(
            main, {"step": self._step, "idle_s": round(idle, 1), "limit_s": round(self.limit_s(), 1)}
        )
        print(
            f"slurmddp: rank {self._dist.rank}: no progress for {idle:.0f} s at step {self._step} "
            f"(dist.hang_timeout_s {self.limit_s():.0f}); stacks in {self._dir}",
            file=sys.stderr,
            flush=True,
        )
        self._conclude(self._hang, stand_in=False)

    def _fire_start(self, phase: str, elapsed: float) -> None:
        main = _main_frame()
        phase = startwatch.phase_of(main, phase)
        fields = {
            "step": self._step,
            "phase": phase,
            "elapsed_s": round(elapsed, 1),
            "limit_s": self._start_s,
        }
        self._report(main, {**fields, "arrived": self._arrived})
        print(
            f"slurmddp: rank {self._dist.rank}: no first step {elapsed:.0f} s after its start, "
            f"{startwatch.WORDS.get(phase, phase)} (dist.start_timeout_s {self._start_s:.0f}); "
            f"stacks in {self._dir}",
            file=sys.stderr,
            flush=True,
        )
        self._conclude(self._start_hang, stand_in=True)

    def _report(self, main: FrameType | None, fields: Mapping[str, Any]) -> None:
        """This rank's stacks, NCCL trace and report: `fields`, and where its main thread is."""
        self._dir.mkdir(parents=True, exist_ok=True)
        rank = self._dist.rank
        with (self._dir / f"rank_{rank}.stacks.txt").open("w") as handle:
            faulthandler.dump_traceback(handle, all_threads=True)
        _dump_nccl_trace(self._dir / f"rank_{rank}.nccl_trace")
        report = {
            "rank": rank,
            "host": socket.gethostname(),
            **fields,
            "waiting": waiting_in_collective(main),
            "where": innermost(main),
        }
        hangs.write_report(self._dir, report)

    def _conclude(
        self, judge: Callable[[list[dict[str, Any]]], tuple[dict[str, Any], Failure]], *, stand_in: bool
    ) -> None:
        """Rank 0 gathers every rank's report, writes the summary and the attempt's failure record
        as `judge` finds them; the others wait for it (leaving first would let srun end rank 0 before
        it recorded why). Then this rank exits. `stand_in`: the lowest rank that reported does it
        when rank 0 did not. Not for a hang in the training: there a dead rank 0 is the peer watch's
        to record, and a living one may only have a longer automatic timeout than this rank."""
        summary = hangs.summary_path(self._dir)
        if self._dist.rank == 0 or (stand_in and self._stands_in(summary)):
            wait = GATHER_S if self._dist.rank == 0 else 0.0
            reports = _collect(self._dir, self._dist.world_size, time.monotonic() + wait)
            verdict, failure = judge(reports)
            hangs.write_summary(self._dir, verdict, reports)
            failure.write(self._run_dir, replace=True)
            print(f"slurmddp: {failure.cause}; ending the attempt", file=sys.stderr, flush=True)
        else:
            _until(summary.exists, 2 * GATHER_S)
        self._exit(HANG_EXIT_STATUS)

    def _stands_in(self, summary: Path) -> bool:
        """Whether this rank records the verdict in rank 0's stead: rank 0 reported nothing within
        GATHER_S (gone, stuck holding the GIL, or, at the start, already past it) and this is the
        lowest rank that did."""
        rank_0 = hangs.report_path(self._dir, 0)
        _until(lambda: rank_0.exists() or summary.exists(), GATHER_S)
        if rank_0.exists() or summary.exists():
            return False
        reported = hangs.reported_ranks(self._dir)
        return reported[:1] == [self._dist.rank]

    def _hang(self, reports: list[dict[str, Any]]) -> tuple[dict[str, Any], Failure]:
        cause, culprits = diagnose(reports, self._dist.world_size, rank_hosts(self._dist, os.environ))
        return {"cause": cause}, self._failure(f"hang: {cause}", cause, culprits, self._step)

    def _start_hang(self, reports: list[dict[str, Any]]) -> tuple[dict[str, Any], Failure]:
        hosts = rank_hosts(self._dist, os.environ)
        cause, phase, culprits = startwatch.diagnose(reports, self._dist.world_size, hosts, self._start_s)
        # No step: the attempt crashed before its training did, not at a step it may crash at again.
        return {"cause": cause, "phase": phase}, self._failure(cause, cause, culprits, None)

    def _failure(self, error: str, cause: str, culprits: Sequence[str], step: int | None) -> Failure:
        return Failure(
            step=step,
            rank=self._dist.rank,
            error=error,
            attempt=AttemptId.of(self._dist),
            time=time.time(),
            suspect_hosts={host: cause for host in culprits if host != "?"} or None,
            cause=cause,
            hang_dir=str(self._dir),
        )


def rendezvous_s(timeout_s: int, start_timeout_s: int) -> float:
    """How long a rank waits at the rendezvous store: past the start-up deadline, where there is
    one, so that the watchdog (which gathers for up to 2 GATHER_S once it fires) ends a start that
    hangs there with its diagnosis, rather than the store's timeout with a bare error."""
    return max(timeout_s, start_timeout_s + 2 * GATHER_S + 10) if start_timeout_s else timeout_s


def waiting_in_collective(frame: FrameType | None) -> bool:
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _WAITING_IN):
            return True
        frame = frame.f_back
    return False


def innermost(frame: FrameType | None) -> str:
    """The innermost frame outside slurmddp, torch and the standard library: the user's line
    (`Event.wait` in threading.py says less than the line that called it)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_STDLIB) and not any(part in name for part in _NOT_USER):
            return f"{name}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def diagnose(
    reports: Sequence[Mapping[str, Any]], world_size: int, where: Sequence[str]
) -> tuple[str, list[str]]:
    """Which ranks did not arrive, in words, and their hosts: those that never reported (stuck
    holding the GIL, or dead), else those not waiting on their peers, else those behind the others."""
    by_rank = {int(r["rank"]): r for r in reports}
    steps = [r["step"] for r in reports if r["step"] is not None]
    step = min(steps) if steps else None
    missing = [rank for rank in range(world_size) if rank not in by_rank]
    at = f"hung at step {step}" if step is not None else "hung"
    if missing:
        names = ", ".join(f"rank {rank} on {_host(where, rank)}" for rank in missing)
        hosts = [_host(where, rank) for rank in missing]
        return f"{at}: {names} did not report (its process is stuck or gone)", hosts
    culprits = [r for r in reports if not r["waiting"]]
    if not culprits and len(set(steps)) > 1:
        culprits = [r for r in reports if r["step"] == step]
    if not culprits:
        return f"{at}: every rank waits in a collective (ranks calling different collectives?)", []
    names = ", ".join(f"rank {r['rank']} on {r['host']} (in {r['where']})" for r in culprits)
    return f"{at}: {names} did not arrive", [str(r["host"]) for r in culprits]


def _host(where: Sequence[str], rank: int) -> str:
    return where[rank] if rank < len(where) else "?"


def _collect(folder: Path, world_size: int, deadline: float) -> list[dict[str, Any]]:
    while True:
        reports = hangs.read_reports(folder)
        if len(reports) >= world_size or time.monotonic() > deadline:
            return reports
        time.sleep(0.2)


def _main_frame() -> FrameType | None:
    return sys._current_frames().get(threading.main_thread().ident or -1)


def _until(done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.2)


def _dump_nccl_trace(path: Path) -> None:
    """The NCCL flight recorder's entries, where this torch has them and the backend is NCCL."""
    if "torch.distributed" not in sys.modules:
        return  # no process group without it (and importing torch now would take seconds)
    try:
        import torch.distributed as tdist

        if not tdist.is_initialized() or tdist.get_backend() != "nccl":
            return
        import torch._C._distributed_c10d as c10d

        # Private, and only in CUDA builds; its pickle is what torch's fr_trace tool reads.
        dump = getattr(c10d, "_dump_nccl_trace", None)
        if dump is not None:
            path.write_bytes(dump())
    except Exception as exc:  # a diagnostic must not stop the others being written
        print(f"slurmddp: no NCCL flight recorder dump: {exc!r}", file=sys.stderr, flush=True)
