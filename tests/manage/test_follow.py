"""`submit --wait`'s reading of a run: the speed across attempts, the metrics file read
incrementally through rewrites and held back to the step of the progress record, and `follow`
against a fake job in a temp run directory, as plain lines off a terminal and as a rich live
region on one (what each looks like: test_display.py)."""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from slurmddp.manage import ctrl_c, views
from slurmddp.manage.follow import StopFold, TracebackFold, follow
from slurmddp.manage.snapshot import LatestMetrics, RunWatch, StepRate
from slurmddp.rundir import records
from slurmddp.rundir.records import AttemptId, Begin, End, LoopProgress, Progress
from slurmddp.submit.submitter import Submission


def test_speed_is_smoothed_within_an_attempt_and_starts_over_with_the_next() -> None:
    rate = StepRate()
    assert rate.update(Progress(0, AttemptId("5", 0), 100.0)) is None
    assert rate.update(Progress(20, AttemptId("5", 0), 102.0)) == pytest.approx(10.0)
    # The same record read again (rank 0 has not written since) changes nothing.
    assert rate.update(Progress(20, AttemptId("5", 0), 102.0)) == pytest.approx(10.0)
    assert rate.update(Progress(60, AttemptId("5", 0), 104.0)) == pytest.approx(13.0)
    # The requeued attempt resumes at its checkpoint, behind the last record.
    assert rate.update(Progress(40, AttemptId("5", 1), 300.0)) is None
    assert rate.update(Progress(44, AttemptId("5", 1), 302.0)) == pytest.approx(2.0)
    # Old runs' records lack restart_count (read as 0); a step going back is a new attempt all the same.
    assert rate.update(Progress(10, AttemptId("5", 0), 400.0)) is None
    assert rate.update(Progress(20, AttemptId("5", 0), 401.0)) == pytest.approx(10.0)
    # A restart inside the allocation (Slurm's count unchanged) that resumed past the last record.
    assert rate.update(Progress(30, AttemptId("5", 0, 1), 450.0)) is None


def test_the_attempt_shown_counts_restarts_inside_the_allocation(tmp_path: Path) -> None:
    watch = RunWatch(tmp_path)
    for n in range(2):
        records.append_attempt(tmp_path, Begin(n, 100.0 + n, "node1", "node[1-2]", AttemptId("5", 0, n)))
    Progress(30, AttemptId("5", 0, 1), 102.0).write(tmp_path)
    assert watch.snapshot("RUNNING", 3.0).attempt == 2


def test_latest_metrics_reads_on_from_where_it_stopped_and_through_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    latest = LatestMetrics(path)
    assert latest.read() == {}
    lines = [json.dumps({"step": s, "time": 0.0, "loss": 1 / (s + 1)}) for s in range(100)]
    path.write_text("\n".join(lines) + "\n")
    assert latest.read()["step"] == 99
    with path.open("a") as handle:
        handle.write(lines[0][:10])  # a record still being written
    assert latest.read()["step"] == 99
    with path.open("a") as handle:
        handle.write(lines[0][10:] + "\n")
    assert latest.read()["step"] == 0
    # A metric logged in its own record (validation, once an epoch) joins the others.
    with path.open("a") as handle:
        handle.write(json.dumps({"step": 0, "time": 0.0, "val_acc": 0.5}) + "\n")
    assert latest.read() == {"step": 0, "time": 0.0, "loss": 1.0, "val_acc": 0.5}

    # A resumed attempt drops the records past its checkpoint: the file, cut short in place...
    with path.open("r+") as handle:
        handle.truncate(len("\n".join(lines[:40])) + 1)
    assert latest.read() == {"step": 39, "time": 0.0, "loss": 1 / 40}
    # ...or replaced by a rename, even by one that already grew past where the reader was.
    replacement = tmp_path / "new.jsonl"
    replacement.write_text("\n".join(lines[:30] + lines[:90]) + "\n")
    os.replace(replacement, path)
    assert latest.read()["step"] == 89
    path.write_text("")
    assert latest.read() == {}


def write_progress(run_dir: Path, step: int, total: int = 176, epoch: int = 0, epochs: int = 8) -> None:
    position = LoopProgress(total_steps=total, epoch=epoch, epochs=epochs, last_save_s=0.0, global_batch=None)
    Progress(step, AttemptId("5", 0), time.time(), position).write(run_dir)


def log_metrics(run_dir: Path, step: int, **values: float) -> None:
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": step, "time": 1.0, **values}) + "\n")


def test_the_step_shown_is_never_behind_the_metrics_beside_it(tmp_path: Path) -> None:
    """rank 0 writes progress.json every ~2 s and metrics at every ctx.log: what was shown as
    `step 0/176 ... epoch=2.000` now shows the step, and the epoch, of the metrics."""
    watch = RunWatch(tmp_path)
    write_progress(tmp_path, 0)
    log_metrics(tmp_path, 0, loss=2.3)
    assert watch.snapshot("RUNNING", 1.0).step == 0
    log_metrics(tmp_path, 65, loss=0.5, epoch=2.0, val_acc=0.86)
    ahead = watch.snapshot("RUNNING", 3.0)
    # 176 steps in 8 epochs: step 65 is the last of epoch 2 (counted from 0).
    assert (ahead.step, ahead.epoch) == (65, 2)
    assert ahead.metrics == {"loss": 0.5, "epoch": 2.0, "val_acc": 0.86}
    write_progress(tmp_path, 70, epoch=3)
    later = watch.snapshot("RUNNING", 5.0)
    assert (later.step, later.epoch) == (70, 3)
    # Past the last step (a record after the loop's own), the epoch stays the last one.
    log_metrics(tmp_path, 176, test_acc=0.9)
    end = watch.snapshot(None, 7.0)
    assert (end.step, end.epoch, end.metrics["test_acc"]) == (176, 7, 0.9)


def test_between_two_attempts_the_step_shown_is_the_one_the_ranks_stopped_at(tmp_path: Path) -> None:
    """The progress record of step 600, then the stop at 601: while the job waits in the queue the
    step shown is 601; once the next attempt began, its own records again."""
    watch = RunWatch(tmp_path)
    records.append_attempt(tmp_path, Begin(0, 1.0, "node1", "node[1-2]", AttemptId("5", 0)))
    write_progress(tmp_path, 600, total=1320)
    assert watch.snapshot("RUNNING", 1.0).step == 600
    records.append_attempt(tmp_path, End("preemption", 601, 2.0, True, False, "preemption at step 601"))
    assert watch.snapshot("PENDING", 2.0).step == 601
    records.append_attempt(tmp_path, Begin(1, 3.0, "node1", "node[1-2]", AttemptId("5", 1)))
    Progress(590, AttemptId("5", 1), time.time(), None).write(tmp_path)
    assert watch.snapshot("RUNNING", 3.0).step == 590


def test_before_the_loop_reports_the_snapshot_says_how_far_the_start_came(tmp_path: Path) -> None:
    watch = RunWatch(tmp_path)
    assert watch.snapshot("PENDING", 1.0).starting == "starting the ranks"
    watch.note("slurmddp: rank 0 of 4 (node 0, local rank 0) on vm, job 5, attempt 1")
    assert "joining the process group" in str(watch.snapshot("RUNNING", 2.0).starting)
    watch.note("slurmddp: preflight ok in 0.10 s: all-reduce of 4 MB over 4 ranks")
    watch.note("an unrelated line of the user's")
    assert "your code is setting up" in str(watch.snapshot("RUNNING", 3.0).starting)
    # A run without ctx.loop has no progress record: its metrics' step is all there is.
    log_metrics(tmp_path, 12, loss=0.25)
    snap = watch.snapshot("RUNNING", 4.0)
    assert (snap.step, snap.total_steps, snap.starting, snap.metrics) == (12, None, None, {"loss": 0.25})


@dataclass
class FakeJob:
    """What follow asks of a submitit LocalJob."""

    finished: threading.Event = field(default_factory=threading.Event)

    def done(self) -> bool:
        return self.finished.is_set()


@dataclass
class FakePlan:
    run_dir: Path
    folder: Path
    executor: str = "local"
    world_size: int = 1


@dataclass
class FakeSubmission:
    plan: FakePlan
    job: FakeJob
    job_id: str = "77"

    def log_path(self, task: int, stream: str = "out") -> Path:
        return self.plan.folder / f"{self.job_id}_{task}_log.{stream}"


def run_fake_job(sub: FakeSubmission, total: int = 30, every_s: float = 0.03) -> None:
    """Rank 0 of a run requeued at step 20 that resumes from its checkpoint at step 16."""
    run_dir = sub.plan.run_dir
    metrics = run_dir / "metrics.jsonl"
    with sub.log_path(0).open("a") as log:
        log.write("[bold]hello[/bold] from the training code\n")
    steps = [(0, s) for s in range(0, 21)] + [(1, s) for s in range(16, total + 1)]
    for restart_count, step in steps:
        if (restart_count, step) == (1, 16):
            kept = metrics.read_text().splitlines()[:17]
            metrics.write_text("\n".join(kept) + "\n")
        with metrics.open("a") as handle:
            handle.write(json.dumps({"step": step, "time": time.time(), "loss": 1 / (step + 1)}) + "\n")
        position = LoopProgress(total_steps=total, epoch=0, epochs=1, last_save_s=0.0, global_batch=None)
        Progress(step, AttemptId(sub.job_id, restart_count), time.time(), position).write(run_dir)
        time.sleep(every_s)
    with (sub.plan.folder / f"{sub.job_id}_0_result.pkl").open("wb") as handle:
        pickle.dump(("success", None), handle)
    sub.job.finished.set()


def follow_fake_job(
    tmp_path: Path, job_of: Callable[[FakeSubmission], None] = run_fake_job
) -> tuple[str, str]:
    """Follow a fake job (`job_of`, run beside) to its end; return follow's final state and what
    it wrote."""
    (tmp_path / "logs").mkdir()
    sub = FakeSubmission(FakePlan(run_dir=tmp_path, folder=tmp_path / "logs"), FakeJob())
    job = threading.Thread(target=job_of, args=(sub,))
    job.start()
    out = io.StringIO()
    try:
        final = follow(cast(Submission, sub), out, poll_s=0.01)
    finally:
        job.join()
    return final, out.getvalue()


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the output is a wide terminal, as rich decides it."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)


def progress_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("slurmddp: step ")]


def test_off_a_terminal_progress_comes_as_plain_lines_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, not_a_terminal: None
) -> None:
    monkeypatch.setattr(views, "PLAIN_EVERY_S", 0.25)
    final, text = follow_fake_job(tmp_path)
    assert final == "COMPLETED"
    assert "\x1b" not in text
    assert "  [rank 0] [bold]hello[/bold] from the training code" in text
    assert "slurmddp: job 77 RUNNING" in text
    assert text.splitlines()[-1].startswith("slurmddp: job 77 ended COMPLETED after 0:00:")
    shown = progress_lines(text)
    # 51 progress records ~30 ms apart, each a new line: throttled to one every 0.25 s, and the last.
    assert 2 <= len(shown) <= 15, text
    assert any("attempt 1" in line for line in shown), shown
    assert shown[-1].startswith("slurmddp: step 30/30 (100%)")
    assert shown[-1].endswith("ETA 0:00:00  epoch 0 (0-0)  attempt 2  loss=0.03226")


def test_on_a_terminal_progress_is_a_region_redrawn_below_the_output(tmp_path: Path, terminal: None) -> None:
    final, text = follow_fake_job(tmp_path)
    assert final == "COMPLETED"
    # rich moves the cursor up over the line to redraw it; rank 0's text is not read as markup.
    assert "\x1b[1A" in text or "\x1b[2K" in text
    assert "  [rank 0] [bold]hello[/bold] from the training code" in text
    assert "slurmddp: job 77 RUNNING" in text
    assert "30/30 (100%)" in text and "attempt 2" in text and "━" in text
    # The region stays once the job ended; the verdict comes below it (after rich shows the cursor again).
    assert "slurmddp: job 77 ended COMPLETED after " in text.splitlines()[-1]


def test_ctrl_c_on_slurm_stops_following_only_and_says_how_to_cancel(tmp_path: Path) -> None:
    sub = FakeSubmission(FakePlan(run_dir=tmp_path, folder=tmp_path / "logs", executor="slurm"), FakeJob())
    out = io.StringIO()
    assert ctrl_c.stop(cast(Submission, sub), out) is False
    assert out.getvalue() == (
        "slurmddp: stopped following; job 77 keeps running. "
        f"Stop it with: python -m slurmddp cancel {tmp_path}\n"
    )


def test_a_local_job_starts_out_of_the_terminals_ctrl_c_and_slurm_submits_within_it() -> None:
    before = signal.getsignal(signal.SIGINT)
    with ctrl_c.out_of_reach("local"):
        # What the controller and its ranks inherit across fork and exec.
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is before
    with ctrl_c.out_of_reach("slurm"):
        assert signal.getsignal(signal.SIGINT) is before


def test_a_ranks_traceback_is_folded_to_its_exception_line() -> None:
    err = [
        "submitit ERROR (2026-11-25 13:56:39,757) - Submitted job triggered an exception",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "<frozen runpy>", line 198, in _run_module_as_main',
        '[rank0]:   File "/site-packages/submitit/core/submission.py", line 69, in process_job',
        "[rank0]:     raise error",
        '[rank0]:   File "/project/train.py", line 96, in train',
        "[rank0]:     optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lrr)",
        "[rank0]:                                                      ^^^^^^^",
        "[rank0]: omegaconf.errors.ConfigAttributeError: Missing key lrr. Did you mean: 'lr'?",
        "[rank0]:     full_key: train.lrr",
        "slurmddp: stopped at step 3",
    ]
    fold = TracebackFold()
    shown = [line for line in err if not fold.hides(line)]
    assert shown == [
        "[rank0]: omegaconf.errors.ConfigAttributeError: Missing key lrr. Did you mean: 'lr'?",
        "[rank0]:     full_key: train.lrr",
        "slurmddp: stopped at step 3",
    ]


def test_a_healthy_requeue_shows_slurmddps_lines_and_not_slurms_teardown() -> None:
    """Rank 0's log at a preemption on the 24.11 lab (the out and err files interleaved), then a
    crash, whose lines all stay."""
    log = [
        "[W1203 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3",
        "slurmddp: stopped at step 720 on SIGUSR2; the job will be requeued",
        "slurmddp: attempt ended: preemption at step 720; requeue 1 (budget unlimited)",
        "srun: Job step aborted: Waiting up to 12 seconds for job step to finish.",
        "slurmstepd-node1: error: *** JOB 20 ON node1 CANCELLED AT 2026-12-03T12:36:54 DUE TO JOB REQUEUE",
        "slurmstepd-node1: error: *** STEP 20.1 ON node1 CANCELLED AT 2026-12-03T12:36:54 DUE TO JOB REQUEUE",
        "srun: got SIGCONT",
        "srun: forcing job termination",
        "slurmddp: batch script got SIGTERM",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/usr/lib/python3.11/weakref.py", line 666, in _exitfunc',
        "[rank0]: RuntimeError: DataLoader worker (pid 22562) is killed by signal: Terminated. ",
        "slurmddp: rank 0 of 4 (node 0, local rank 0) on node1, job 20, attempt 2",
        "slurmddp: resumed from RUN/checkpoints/step-00000720 at step 720",
        "[rank0]: RuntimeError: DataLoader worker (pid 23001) is killed by signal: Killed. ",
        "slurmddp: attempt ended: failure at step 731; requeue 1 (budget 3)",
        "srun: error: node2: task 3: Exited with exit code 1",
    ]
    stops, tracebacks = StopFold(), TracebackFold()
    shown = [line for line in log if not stops.hides(line) and not tracebacks.hides(line)]
    assert shown == [
        "slurmddp: stopped at step 720 on SIGUSR2; the job will be requeued",
        "slurmddp: attempt ended: preemption at step 720; requeue 1 (budget unlimited)",
        "slurmddp: rank 0 of 4 (node 0, local rank 0) on node1, job 20, attempt 2",
        "slurmddp: resumed from RUN/checkpoints/step-00000720 at step 720",
        "[rank0]: RuntimeError: DataLoader worker (pid 23001) is killed by signal: Killed. ",
        "slurmddp: attempt ended: failure at step 731; requeue 1 (budget 3)",
        "srun: error: node2: task 3: Exited with exit code 1",
    ]


def test_a_run_that_ends_before_its_first_step_leaves_no_spinner_behind(
    tmp_path: Path, terminal: None
) -> None:
    def fail_while_starting(sub: FakeSubmission) -> None:
        sub.log_path(0).write_text("slurmddp: rank 0 of 1 (node 0, local rank 0) on vm, job 77, attempt 1\n")
        time.sleep(0.2)
        with (sub.plan.folder / f"{sub.job_id}_0_result.pkl").open("wb") as handle:
            pickle.dump(("error", "NameError"), handle)
        sub.job.finished.set()

    final, text = follow_fake_job(tmp_path, fail_while_starting)
    assert final == "FAILED"
    # The spinner was drawn while the ranks started (and erased, the region being transient);
    # nothing of it is printed again once the region is gone (rich shows the cursor again then).
    drawn, _, after = text.rpartition("\x1b[?25h")
    assert "starting" in drawn or "rank" in drawn
    assert not any(frame in after for frame in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"), after
    assert (
        after.strip()
        .splitlines()[-1]
        .endswith("slurmddp: job 77 ended FAILED after 0:00:00 since its submission")
    )
