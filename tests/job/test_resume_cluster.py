"""Preemption, time limits and crashes on the real cluster: every run ends with the parameters of the
uninterrupted run, bit for bit, and loses no step. Driven through `python -m slurmddp` and Slurm."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    SYNTHETIC,
    preempt_with_high_job,
    progress_step,
    rank_pid,
    rank_pids,
    run_dirs,
    run_job_id,
    slurm_command,
    slurmddp,
    submit_run,
    wait_for_job,
    wait_until,
)
from lab_control import LabDaemons

from slurmddp.cluster import hostlist, timespec
from slurmddp.rundir.records import Failure

STEPS = 1000
COMMON = [f"train.steps={STEPS}", "train.log_every=100"]
SNAPSHOT_EVERY = 20


def snapshots_in(tmp_path: Path) -> list[str]:
    """Snapshots every SNAPSHOT_EVERY steps, in a folder of the test's own (not the host's /dev/shm)."""
    (tmp_path / "shm").mkdir()
    return [
        f"checkpoint.snapshot_every_steps={SNAPSHOT_EVERY}",
        f"checkpoint.snapshot_dir={tmp_path / 'shm'}",
    ]


def newest_snapshot(tmp_path: Path) -> int:
    """The step of the newest snapshot file any node holds (NODE_DIR/step-00001234.pt); -1 if none."""
    found = (tmp_path / "shm").glob(f"slurmddp-{os.getuid()}/*/*/step-*.pt")
    return max((int(path.stem.removeprefix("step-")) for path in found), default=-1)


def snapshots_left(tmp_path: Path) -> list[Path]:
    """What the jobs' snapshot folders still hold (the task per node removes them at the job's end)."""
    return list((tmp_path / "shm").glob(f"slurmddp-{os.getuid()}/*"))


pytestmark = [pytest.mark.slurm, pytest.mark.lab_generation("24.11")]


def attempts(run: Path) -> list[dict[str, Any]]:
    """The run's attempt records; none before its batch script began."""
    path = run / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ends(run: Path) -> list[dict[str, Any]]:
    return [r for r in attempts(run) if r["event"] == "end"]


def final_hash(run: Path) -> str:
    result = json.loads((run / "result.json").read_text())
    hashes = {r["param_sha256"] for r in result["ranks"]}
    assert len(hashes) == 1, "ranks disagree"
    return hashes.pop()


@pytest.fixture(scope="module")
def reference(slurm_lab: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted run's final parameter hash."""
    out = tmp_path_factory.mktemp("reference") / "runs"
    run = submit_run(slurm_lab, out, *COMMON)
    assert wait_for_job(run_job_id(run), slurm_lab, timeout=300) == "COMPLETED"
    return final_hash(run)


def test_preempted_twice_resumes_bit_exact(slurm_env: dict[str, str], tmp_path: Path, reference: str) -> None:
    """Followed by `submit --wait`, as a user watches it: both stops show slurmddp's lines, not the
    teardown Slurm and torch print into rank 0's log (manage/follow.py, StopFold)."""
    out = tmp_path / "runs"
    out.mkdir()
    waiting = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", str(SYNTHETIC), *COMMON, f"output_dir={out}", "--wait"],
        env=slurm_env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until("the run directory", lambda: bool(run_dirs(out)), timeout=60)
    (run,) = run_dirs(out)
    for threshold in (200, 600):
        wait_until(f"step {threshold}", lambda t=threshold: progress_step(run) >= t)
        preempt_with_high_job(slurm_env, tmp_path)
        count = len(ends(run))
        wait_until("the preempted attempt to end", lambda c=count: len(ends(run)) > c)
    assert wait_for_job(run_job_id(run), slurm_env, timeout=300) == "COMPLETED"
    shown, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, shown
    assert shown.count("[rank 0] slurmddp: attempt ended: preemption at step") == 2, shown
    noise = ("DUE TO JOB REQUEUE", "Job step aborted", "srun: ", "Job is pending execution", "got SIGTERM")
    assert [line for line in noise if line in shown] == [], shown
    records = ends(run)
    assert [r["reason"] for r in records] == ["preemption", "preemption", "completed"]
    assert final_hash(run) == reference
    assert_no_step_lost(run)
    # The batch script's own stderr shares rank 0's: it must hold no shell job report (the step
    # watch it ends after each srun step once made bash print "Killed" there).
    batch_err = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.err"))
    assert "Killed" not in batch_err, batch_err[-2000:]


def assert_no_step_lost(run: Path, unsaved: list[dict[str, Any]] | None = None) -> None:
    """Each attempt resumed at exactly the step the previous one stopped and saved at. After one of
    the `unsaved` ends (the signal ended the step before the ranks saved) the next resumed from an
    earlier save, or from the start."""
    log = (run / "logs").glob("*_0_log.out")
    text = "".join(p.read_text() for p in log)
    resumed = [int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "resumed from" in line]
    saved = [
        r["step"] for r in ends(run) if r["reason"] in ("preemption", "timeout") and r not in (unsaved or [])
    ]
    assert saved, ends(run)
    if not unsaved:
        assert resumed == saved, (resumed, saved)
    else:
        assert [at for at in resumed if at in saved] == saved, (resumed, saved)


def time_used(env: dict[str, str], job: str) -> int:
    """Seconds the job's allocation has run, as slurmctld counts them against its limit."""
    proc = slurm_command(["squeue", "-h", "-j", job, "-O", "TimeUsed"], env, check=True)
    return timespec.parse_time(proc.stdout.strip())


def set_time_limit(env: dict[str, str], job: str, minutes: int) -> None:
    slurm_command(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], env, check=True)


def test_time_limit_requeues_and_resumes_bit_exact(
    slurm_env: dict[str, str], tmp_path: Path, reference: str
) -> None:
    """The job's time limit runs out mid-run: Slurm's own warning signal (`--signal`, lead 30 s)
    stops every rank at one step, they save, the job requeues itself as a timeout, and the next
    attempt resumes there and ends with the uninterrupted run's parameters.

    Where the limit runs out is chosen, not waited for: a limit fixed at submission gave each
    attempt 0-45 s (Slurm signals up to 60 s early and checks every ~30 s), which under a loaded
    CI went to a start and a step or two, 29 attempts and up to 1500 s a run. Here the job runs
    under a 10-minute limit until step 100, then the limit is cut to end 45-105 s later (Slurm
    counts limits in minutes): the signal comes at slurmctld's next check; once that attempt ends,
    the limit goes back to 10 minutes. The steps sleep 0.1 s each (no CPU), so the first attempt
    is still training when the signal comes, on a quiet machine too."""
    overrides = ("train.step_sleep=0.1", "requeue.signal_lead_s=30", "requeue.max_timeouts=-1")
    run = submit_run(slurm_env, tmp_path / "runs", *COMMON, *overrides)
    job = run_job_id(run)
    wait_until("step 100", lambda: progress_step(run) >= 100, timeout=300)
    set_time_limit(slurm_env, job, timespec.minutes_ceil(time_used(slurm_env, job) + 45))
    wait_until("the attempt under the cut limit to end", lambda: bool(ends(run)), timeout=300)
    set_time_limit(slurm_env, job, 10)
    assert wait_for_job(job, slurm_env, timeout=600) == "COMPLETED"
    # Under load an attempt's own time-limit signal once ended its step before any rank recorded
    # the stop (srun's status 140, 128 + SIGUSR2): a timeout that saved nothing, after which the
    # next attempt resumes from the newest save before it. Shown, not hidden; no other kind allowed.
    signal_ended = [r for r in ends(run) if r.get("status") == 128 + signal.SIGUSR2]
    if signal_ended:
        print(f"attempts ended by the time-limit signal itself: {signal_ended}")
    reasons = [r["reason"] for r in ends(run)]
    assert reasons[-1] == "completed" and set(reasons[:-1]) == {"timeout"}, reasons
    assert final_hash(run) == reference
    assert_no_step_lost(run, signal_ended)


def test_a_killed_rank_restarts_inside_the_allocation_then_through_the_queue(
    slurm_env: dict[str, str], tmp_path: Path, reference: str
) -> None:
    """requeue.in_job_restarts=1: rank 3 killed at a step, then again further on (progress between:
    both restarted in the allocation, "restart 1 of 1" each time), then a third time as the next
    attempt starts, before it gained a step: the restart is used up, and the job goes through the
    queue. The steps are chosen anew each run."""
    run = submit_run(
        slurm_env,
        tmp_path / "runs",
        *COMMON,
        "checkpoint.every_steps=150",
        *snapshots_in(tmp_path),
        "requeue.in_job_restarts=1",
        # Each restart as a new srun step, the way without the resident launcher (the test
        # below forks in the same step).
        "requeue.resident_launcher=false",
    )
    job = run_job_id(run)
    chooser = random.Random()
    first_at, second_at = chooser.randrange(200, 450), chooser.randrange(550, 800)
    print(f"killing rank 3 at steps {first_at} and {second_at}, then as the third attempt starts")
    for n, at in enumerate((first_at, second_at, None)):
        if at is None:
            # The n-th attempt's rank 3, as soon as its process is there.
            wait_until("the next attempt", lambda n=n: len(ends(run)) == n and len(begins(run)) > n)
            wait_until("its rank 3", lambda: bool(rank_pids(run, rank=3)), timeout=60)
        else:
            wait_until(
                f"step {at}", lambda n=n, at=at: len(ends(run)) == n and progress_step(run) >= at, timeout=300
            )
        killed_at = time.time()
        os.kill(rank_pid(run, 3), signal.SIGKILL)
        wait_until("the failed attempt to end", lambda n=n: len(ends(run)) > n, timeout=120)
        ended = ends(run)[n]
        assert ended["reason"] == "failure" and ended["requeue"] is True, ended
        assert ended["time"] - killed_at < 30, "the surviving ranks hung"
    assert wait_for_job(job, slurm_env, timeout=300) == "COMPLETED"
    first, second, third, last = ends(run)
    for restarted in (first, second):
        assert restarted.get("in_job") is True, restarted
        assert "restart 1 of 1 in this allocation" in restarted["message"], restarted
    assert not third.get("in_job") and "requeue 1 (budget 3)" in third["message"], third
    assert last["reason"] == "completed"
    # Rank 0 heard of each death at once and said whose it was (job/process/peerwatch.py).
    failures = Failure.read_all(run)
    assert [(f.rank, "ended without a word" in f.error) for f in failures[:2]] == [(3, True)] * 2, failures
    began = [(r["restart_count"], r.get("in_job_restart", 0)) for r in attempts(run) if r["event"] == "begin"]
    assert began == [(0, 0), (0, 1), (0, 2), (1, 0)]
    # Slurm's view: one allocation with three steps, then one requeue.
    incarnations = sacct(slurm_env, job, "-X", "-D")
    assert [state for _, state in incarnations] == ["REQUEUED", "COMPLETED"], incarnations
    steps = {name for name, _ in sacct(slurm_env, job, "-D")}
    assert {f"{job}.0", f"{job}.1", f"{job}.2"} <= steps, steps
    assert final_hash(run) == reference
    # Each restart in the allocation resumed a few steps before the crash (ends' step: where rank 0
    # was when it heard of it), from the newest in-memory snapshot, or from the checkpoint on disk
    # where that is as new (a crash within an interval of it): one interval back, or two where the
    # last snapshot was still being written. The requeue (a new allocation) resumed from disk.
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    resumed = [
        (int(line.rsplit(" ", 1)[1]), "in-memory snapshot" in line)
        for line in log.splitlines()
        if "resumed from" in line
    ]
    # The third attempt, killed as it started, may have died before it said where it resumed from.
    assert len(resumed) in (2, 3), resumed
    for (step, in_memory), crashed in zip(resumed[:-1], (first["step"], second["step"]), strict=False):
        assert in_memory or step % 150 == 0, resumed
        assert crashed - 2 * SNAPSHOT_EVERY - 1 <= step <= crashed, (resumed, first["step"], second["step"])
    assert not resumed[-1][1] and resumed[-1][0] % 150 == 0, resumed
    # Both allocations' folders went with them (the requeued one's too).
    wait_until("the snapshots removed", lambda: not snapshots_left(tmp_path), timeout=30)


def begins(run: Path) -> list[dict[str, Any]]:
    return [r for r in attempts(run) if r["event"] == "begin"]


def test_a_node_lost_under_the_job_is_swapped_for_its_spare_inside_the_allocation(
    slurm_env: dict[str, str], tmp_path: Path, reference: str
) -> None:
    """resources.spare_nodes=1 on 2 nodes: the second node's ranks are killed and the node drained
    at a moment chosen anew each run; the run goes on, as a new step, on the first node and the
    spare, with the uninterrupted run's parameters."""
    # It needs all three nodes: none left out by a test before it (or by its own first run).
    LabDaemons(slurm_env).resume_nodes()
    run = submit_run(
        slurm_env,
        tmp_path / "runs",
        *COMMON,
        "checkpoint.every_steps=150",
        *snapshots_in(tmp_path),
        "resources.spare_nodes=1",
    )
    job = run_job_id(run)
    wait_until("the first attempt", lambda: bool(attempts(run)))
    first_nodes = hostlist.expand(attempts(run)[0]["nodes"])
    assert len(first_nodes) == 2, first_nodes
    victim = first_nodes[1]
    # A snapshot's step, not just after a checkpoint (every 150 steps), where the newest snapshot
    # is no newer, nor just before one. Its file, not progress.json (written every 2 s, ~80 steps
    # here), says when the ranks are there: twice the kill landed 90 steps late, after a checkpoint.
    at = random.Random().choice([s for s in range(200, 600, SNAPSHOT_EVERY) if 40 <= s % 150 <= 100])
    print(f"killing the ranks on {victim} and draining it once the snapshot of step {at} is there")
    wait_until(f"the snapshot of step {at}", lambda: newest_snapshot(tmp_path) >= at, timeout=300)
    scontrol = ["scontrol", "update", f"nodename={victim}"]
    try:
        for pid in rank_pids(run, node=1):
            os.kill(pid, signal.SIGKILL)
        subprocess.run([*scontrol, "state=drain", "reason=slurmddp spare test"], env=slurm_env, check=True)
        assert wait_for_job(job, slurm_env, timeout=300) == "COMPLETED"
    finally:
        LabDaemons(slurm_env).resume_nodes()
    failed, completed = ends(run)
    assert failed.get("in_job") is True and f"leaving out {victim}" in failed["message"], failed
    assert completed["reason"] == "completed"
    (failure,) = Failure.read_all(run)
    # Both of the victim's ranks, or the one whose death was seen first (the two are killed one
    # after the other).
    named = rf"rank [23] on {victim}"
    assert re.match(rf"{named}(, {named})? ended without a word", failure.error), failure
    # The node is suspected where both its ranks were seen dead together: under load the second
    # one's end can come after the watch's GATHER_S (seen once in CI: rank 3 alone, no suspect).
    both = len(re.findall(named, failure.error)) == 2
    assert set(failure.suspect_hosts or {}) == ({victim} if both else set()), failure
    second_nodes = hostlist.expand([r for r in attempts(run) if r["event"] == "begin"][1]["nodes"])
    assert len(second_nodes) == 2 and victim not in second_nodes and first_nodes[0] in second_nodes
    assert [state for _, state in sacct(slurm_env, job, "-X", "-D")] == ["COMPLETED"]
    assert final_hash(run) == reference
    # The spare held no snapshot: its ranks got the first node's, with their own random streams.
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    (resumed,) = [line for line in log.splitlines() if "resumed from" in line]
    folder = rf"{tmp_path}/shm/slurmddp-{os.getuid()}/{job}\.0-[0-9a-f-]{{36}}/{first_nodes[0]}/"
    assert re.search(f"in-memory snapshot {folder}step-", resumed), (resumed, failed["step"])
    resumed_at = int(resumed.rsplit(" ", 1)[1])
    assert failed["step"] - 2 * SNAPSHOT_EVERY - 1 <= resumed_at <= failed["step"], (resumed, failed["step"])
    wait_until("the snapshots removed", lambda: not snapshots_left(tmp_path), timeout=30)


def test_with_a_resident_launcher_a_killed_rank_is_forked_again_in_the_same_step(
    slurm_env: dict[str, str], tmp_path: Path, reference: str
) -> None:
    """requeue.resident_launcher: rank 3 SIGKILLed once the snapshot of a step chosen anew each run
    is there; every task forks its rank again in the srun step that runs, from the newest
    snapshot, and the run ends with the uninterrupted run's parameters."""
    run = submit_run(
        slurm_env,
        tmp_path / "runs",
        *COMMON,
        "checkpoint.every_steps=150",
        *snapshots_in(tmp_path),
        "requeue.resident_launcher=true",
    )
    job = run_job_id(run)
    at = random.Random().choice([s for s in range(200, 600, SNAPSHOT_EVERY) if 40 <= s % 150 <= 100])
    print(f"killing rank 3 once the snapshot of step {at} is there")
    wait_until(f"the snapshot of step {at}", lambda: newest_snapshot(tmp_path) >= at, timeout=300)
    killed_at = time.time()
    os.kill(rank_pid(run, 3), signal.SIGKILL)
    assert wait_for_job(job, slurm_env, timeout=300) == "COMPLETED"
    failed, completed = ends(run)
    assert failed["reason"] == "failure" and failed["in_job"] is True, failed
    assert completed["reason"] == "completed", completed
    assert [b.get("in_job_restart", 0) for b in begins(run)] == [0, 1], begins(run)
    # One srun step trained, both attempts.
    steps = slurm_command(["sacct", "-n", "-P", "-j", job, "-o", "JobName"], slurm_env).stdout.split()
    assert len([name for name in steps if name.startswith("python")]) == 1, steps
    assert final_hash(run) == reference
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    (resumed,) = [line for line in log.splitlines() if "resumed from" in line]
    assert "in-memory snapshot" in resumed, resumed
    resumed_at = int(resumed.rsplit(" ", 1)[1])
    assert failed["step"] - 2 * SNAPSHOT_EVERY - 1 <= resumed_at <= failed["step"], (resumed, failed["step"])
    began, first_step = begins(run)[1]["time"], completed["phases"]["first_step_at"]
    print(
        f"kill -> the attempt's end {failed['time'] - killed_at:.2f} s, -> the next begin "
        f"{began - killed_at:.2f} s, -> its first step {first_step - killed_at:.2f} s"
    )


def sacct(env: dict[str, str], job: str, *options: str) -> list[tuple[str, str]]:
    """(JobID, State) of each line sacct shows for `job`."""
    out = subprocess.run(
        ["sacct", "-n", "-P", "-j", job, "-o", "JobID,State", *options],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [tuple(line.split("|", 1)) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def test_kill_during_checkpoint_save_falls_back(slurm_env: dict[str, str], tmp_path: Path) -> None:
    # A wide model (~270 MB of state) so that a save takes long enough to be caught in the act.
    run = submit_run(
        slurm_env,
        tmp_path / "runs",
        "train.steps=40",
        "train.width=4096",
        "checkpoint.every_steps=10",
        "resources.nodes=1",
        "resources.tasks_per_node=2",
    )
    ckpt = run / "checkpoints"

    def saving_second() -> bool:
        return any(ckpt.glob("step-00000020/*.tmp*")) or any(ckpt.glob("step-00000020/.*"))

    wait_until("the second save to start", saving_second, timeout=300)
    os.kill(rank_pid(run, 0), signal.SIGKILL)
    assert wait_for_job(run_job_id(run), slurm_env, timeout=400) == "COMPLETED"
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    assert "resumed from" in log and "step-00000010 at step 10" in log, log[-2000:]


def test_crash_at_the_same_step_stops(slurm_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text(
        "import torch\n"
        "def main(ctx):\n"
        "    model = ctx.ddp(torch.nn.Linear(4, 4))\n"
        "    for step in ctx.loop(100, model=model):\n"
        "        if step == 30:\n"
        "            raise RuntimeError('bad batch at step 30')\n"
        "    return {}\n"
    )
    exp = tmp_path / "crash.yaml"
    exp.write_text(
        "entrypoint: crash.py:main\nresources:\n  tasks_per_node: 2\ncheckpoint:\n  every_steps: 10\n"
    )
    run = submit_run(slurm_env, tmp_path / "runs", "requeue.max_failures=5", experiment=exp)
    assert wait_for_job(run_job_id(run), slurm_env, timeout=300) == "FAILED"
    records = ends(run)
    assert [(r["reason"], r["step"]) for r in records] == [("failure", 30), ("failure", 30)]
    assert "crashed at step 30 twice" in records[-1]["message"]


# The first attempt crawls once it is past step 50, so that the interrupt sent then always lands
# before it ends (run at full speed, 400 steps took 4 s, and on a loaded machine the interrupt
# came after the end).
CRAWLS_AFTER_STEP_50 = """import time


def main(ctx):
    for step in ctx.loop(ctx.train.steps):
        if ctx.restart_count == 0 and step > 50:
            time.sleep(0.1)
        ctx.log(step, value=step)
    return {}
"""


def test_interrupt_command_sends_what_slurm_would(slurm_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "crawl.py").write_text(CRAWLS_AFTER_STEP_50)
    exp = tmp_path / "crawl.yaml"
    exp.write_text(
        "entrypoint: crawl.py:main\nresources: {nodes: 1, tasks_per_node: 2}\ntrain: {steps: 400}\n"
    )
    run = submit_run(slurm_env, tmp_path / "runs", experiment=exp)
    wait_until("step 50", lambda: progress_step(run) >= 50)
    proc = slurmddp(slurm_env, tmp_path, "interrupt", run_job_id(run), "--preempt", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "sent SIGUSR2" in proc.stdout and "as a preemption" in proc.stdout
    assert wait_for_job(run_job_id(run), slurm_env, timeout=300) == "COMPLETED"
    assert [r["reason"] for r in ends(run)] == ["preemption", "completed"]
    assert_no_step_lost(run)
    proc = slurmddp(slurm_env, tmp_path, "interrupt", str(run), "--timeout", timeout=60)
    assert proc.returncode == 2 and "no longer in the queue" in proc.stderr, proc.stderr


def test_torchrun_script_is_stopped_requeued_and_resumes_from_its_snapshot(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    run = submit_run(
        slurm_env,
        tmp_path / "runs",
        "resources.nodes=1",
        "entrypoint.args=[--steps, '40000', --snapshot-every, '500']",
        experiment=ROOT / "examples" / "torchrun_script.yaml",
    )
    wait_until("a snapshot", lambda: (run / "snapshot.pt").exists())
    proc = slurmddp(slurm_env, tmp_path, "interrupt", str(run), "--preempt", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert wait_for_job(run_job_id(run), slurm_env, timeout=300) == "COMPLETED"
    assert [r["reason"] for r in ends(run)] == ["preemption", "completed"]
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    resumed = int(log.split("resumed from snapshot at step ")[1].split()[0])
    assert 0 < resumed < 40000
    assert len(json.loads((run / "ranks.json").read_text())["ranks"]) == 2
