"""`slurmddp logs -f`: what it prints and when it stops following, with Slurm's answers faked."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from slurmddp.cluster import slurm
from slurmddp.manage import logs, runs
from slurmddp.rundir.records import CANCELLED, End, append_attempt


def cancelled_run(tmp_path: Path) -> runs.Target:
    """A Slurm run whose batch script already wrote its final `cancelled` end, rank 0 log begun."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    manifest = {"job_id": "7", "logs": str(run / "logs"), "executor": "slurm", "world_size": 1}
    (run / "manifest.json").write_text(json.dumps(manifest))
    end = End(CANCELLED, 3, 1.0, requeue=False, final=True, message="cancelled by the user", attempt=0)
    append_attempt(run, end)
    (run / "logs" / "7_0_log.err").write_text("rank 0 started\n")
    return runs.load(run)


def test_follow_waits_for_slurm_to_finish_writing_after_the_final_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmstepd writes its cancel notice after the batch script's final record, while the job
    is still COMPLETING: following stops only once Slurm has the job done, with the notice shown."""
    target = cancelled_run(tmp_path)
    log = tmp_path / "run" / "logs" / "7_0_log.err"
    answers = iter(["COMPLETING", "COMPLETING", "CANCELLED"])

    def states(job_ids: list[str]) -> dict[str, slurm.JobState]:
        state = next(answers)
        if state == "CANCELLED":
            with log.open("a") as handle:  # slurmstepd's last words, just before it is done
                handle.write("slurmstepd: *** STEP 7.0 CANCELLED AT 2026-11-25T08:00:00 ***\n")
        return {"7": state}  # type: ignore[dict-item]

    monkeypatch.setattr(slurm, "job_states", states)
    monkeypatch.setattr(logs, "FOLLOW_POLL_S", 0.0)
    out = io.StringIO()
    logs.show(target, target.element(None), 0, "err", follow=True, out=out)
    assert out.getvalue().endswith("CANCELLED AT 2026-11-25T08:00:00 ***\n"), out.getvalue()
    assert next(answers, None) is None, "stopped following while Slurm still had the job COMPLETING"


def test_follow_stops_at_the_final_record_once_slurm_has_the_job_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = cancelled_run(tmp_path)
    calls: list[list[str]] = []

    def states(job_ids: list[str]) -> dict[str, slurm.JobState]:
        calls.append(list(job_ids))
        return {"7": "CANCELLED"}

    monkeypatch.setattr(slurm, "job_states", states)
    out = io.StringIO()
    logs.show(target, target.element(None), 0, "err", follow=True, out=out)
    assert out.getvalue() == "rank 0 started\n"
    assert calls == [["7"]]
