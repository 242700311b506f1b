"""The run directory's records: each reads what its writers wrote, and writes the JSON keys that
runs of earlier versions have (status, resubmit and the lab tests read them)."""

from __future__ import annotations

import json
from pathlib import Path

from slurmddp.rundir import records
from slurmddp.rundir.records import (
    AttemptId,
    Begin,
    CodeSite,
    End,
    Exclusion,
    Exclusions,
    Failure,
    Interrupt,
    LoopProgress,
    Progress,
    Resubmit,
    Stop,
    Unwatched,
)

ENV = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0"}
ME = AttemptId("77", 0)


def on_disk(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text())
    return data


def test_progress_of_the_loop_and_of_a_script_rank(tmp_path: Path) -> None:
    loop = LoopProgress(total_steps=10, epoch=0, epochs=None, last_save_s=0.25, global_batch=None)
    Progress(3, ME, 5.0, loop).write(tmp_path)
    assert on_disk(tmp_path / "progress.json") == {
        "step": 3,
        "total_steps": 10,
        "epoch": 0,
        "epochs": None,
        "time": 5.0,
        "last_save_s": 0.25,
        "global_batch": None,
        "job_id": "77",
        "restart_count": 0,
    }
    assert Progress.read(tmp_path) == Progress(3, ME, 5.0, loop)
    Progress(4, ME, 6.0).write(tmp_path)
    assert on_disk(tmp_path / "progress.json") == {"step": 4, "time": 6.0, "job_id": "77", "restart_count": 0}
    assert Progress.read(tmp_path) == Progress(4, ME, 6.0)
    (tmp_path / "progress.json").write_text('{"step": 4')  # torn: not there
    assert Progress.read(tmp_path) is None


def test_stop_of_the_loop_and_of_a_script_rank(tmp_path: Path) -> None:
    Stop(8, "USR2", 1.5, ME, 2.0, save_s=0.5).write(tmp_path)
    assert on_disk(tmp_path / "stop.json") == {
        "step": 8,
        "signal": "USR2",
        "signal_at": 1.5,
        "save_s": 0.5,
        "time": 2.0,
        "job_id": "77",
        "restart_count": 0,
    }
    assert Stop.read_for(tmp_path, ME) == Stop(8, "USR2", 1.5, ME, 2.0, save_s=0.5)
    assert Stop.read_for(tmp_path, AttemptId("77", 1)) is None  # an earlier attempt's stop
    Stop(None, "TERM", None, ME, 3.0, script_status=-15).write(tmp_path)
    assert set(on_disk(tmp_path / "stop.json")) == {
        "step",
        "signal",
        "signal_at",
        "script_status",
        "time",
        "job_id",
        "restart_count",
    }


def test_the_first_failure_record_of_an_attempt_stands_unless_replaced(tmp_path: Path) -> None:
    def failure(error: str, restart: int = 0) -> Failure:
        return Failure(3, 1, error, AttemptId("7", restart), 1.0, bad_hosts={})

    assert failure("rank 1 crashed").write(tmp_path)
    assert not failure("rank 0: Connection closed by peer").write(tmp_path)
    assert on_disk(tmp_path / "failure.json")["error"] == "rank 1 crashed"
    assert failure("hang: rank 2 on node3").write(tmp_path, replace=True)
    assert on_disk(tmp_path / "failure.json")["error"] == "hang: rank 2 on node3"
    # The next attempt's first record replaces the last attempt's.
    assert failure("again", restart=1).write(tmp_path)
    assert on_disk(tmp_path / "failure.json") == {
        "step": 3,
        "rank": 1,
        "error": "again",
        "bad_hosts": {},
        "time": 1.0,
        "job_id": "7",
        "restart_count": 1,
        "earlier": [
            {
                "step": 3,
                "rank": 1,
                "error": "hang: rank 2 on node3",
                "bad_hosts": {},
                "time": 1.0,
                "job_id": "7",
                "restart_count": 0,
            }
        ],
    }
    refused = Failure(None, 0, "refused", ME, 2.0, retry=False)
    refused.write(tmp_path)
    assert Failure.read_for(tmp_path, ME) == refused
    assert "bad_hosts" not in on_disk(tmp_path / "failure.json")


def test_every_attempts_failure_is_kept_with_what_the_exception_was(tmp_path: Path) -> None:
    assert Failure.read_all(tmp_path) == []
    site = CodeSite("/src/train.py", 12, "main")
    first = Failure(
        None, 1, "KeyError('lrr')", AttemptId("7", 0), 1.0, exception="KeyError", message="'lrr'", where=site
    )
    second = Failure(4, 0, "script exited 1", AttemptId("7", 1), 2.0)
    third = Failure(9, 2, "hung", AttemptId("8", 0), 3.0, cause="rank 2 waits in all_reduce")
    for failure in (first, second, third):
        failure.write(tmp_path)
    assert Failure.read_all(tmp_path) == [first, second, third]
    assert Failure.read_for(tmp_path, AttemptId("8", 0)) == third
    assert on_disk(tmp_path / "failure.json")["earlier"][0]["where"] == {  # type: ignore[index]
        "file": "/src/train.py",
        "line": 12,
        "function": "main",
    }


def test_a_failure_written_before_the_exception_fields_still_reads(tmp_path: Path) -> None:
    old = {
        "step": None,
        "rank": 3,
        "error": "RuntimeError('x')",
        "time": 1.0,
        "job_id": "5",
        "restart_count": 0,
    }
    (tmp_path / "failure.json").write_text(json.dumps(old))
    assert Failure.read_all(tmp_path) == [Failure(None, 3, "RuntimeError('x')", AttemptId("5", 0), 1.0)]


def test_a_scripts_exit_status_is_kept_and_left_out_where_there_is_none(tmp_path: Path) -> None:
    script = Failure(None, 1, "python train.py exited with status 2", ME, 1.0, exit_status=2)
    script.write(tmp_path)
    assert on_disk(tmp_path / "failure.json")["exit_status"] == 2
    assert Failure.read_for(tmp_path, ME) == script
    Failure(None, 0, "rank 1 ended without a word", AttemptId("77", 1), 2.0).write(tmp_path)
    assert "exit_status" not in on_disk(tmp_path / "failure.json")


def test_interrupt_and_exclusions(tmp_path: Path) -> None:
    Interrupt("timeout", ME).write(tmp_path)
    assert on_disk(tmp_path / "interrupt.json") == {"reason": "timeout", "job_id": "77", "restart_count": 0}
    assert Interrupt.read_for(tmp_path, ME) == Interrupt("timeout", ME)
    assert Exclusions.read(tmp_path) == Exclusions()
    Exclusions().adding({"node2": "hung"}, 0, 5.0).adding({"node3": "ECC"}, 1, 6.0).write(tmp_path)
    assert on_disk(tmp_path / "excluded.json") == {
        "hosts": {
            "node2": {"reason": "hung", "attempt": 0, "time": 5.0},
            "node3": {"reason": "ECC", "attempt": 1, "time": 6.0},
        }
    }
    assert list(Exclusions.read(tmp_path).hosts) == ["node2", "node3"]


def test_a_host_set_aside_applies_to_its_allocation_alone_and_a_confirmation_outlasts_it(
    tmp_path: Path,
) -> None:
    first, restarted, requeued = AttemptId("77", 0), AttemptId("77", 0, 2), AttemptId("77", 1)
    assert first.allocation == restarted.allocation == "77.0" and requeued.allocation == "77.1"
    Exclusions().adding({"node1": "DOWN"}, 0, 1.0).setting_aside(
        {"node2": "died together"}, 0, 2.0, "77.0"
    ).write(tmp_path)
    # The old key keeps only the hosts left out for good: a reader from before the split never
    # leaves a suspect out for the rest of the run.
    assert on_disk(tmp_path / "excluded.json") == {
        "hosts": {"node1": {"reason": "DOWN", "attempt": 0, "time": 1.0}},
        "set_aside": {"node2": {"reason": "died together", "attempt": 0, "time": 2.0, "allocation": "77.0"}},
    }
    excluded = Exclusions.read(tmp_path)
    assert list(excluded.hosts) == ["node1"]
    assert list(excluded.applying_to(restarted)) == ["node1", "node2"]
    assert list(excluded.applying_to(requeued)) == ["node1"]
    # Slurm then saw node2 go down: left out for good, set aside no longer.
    confirmed = excluded.adding({"node2": "went down"}, 1, 3.0)
    assert confirmed.set_aside == {} and confirmed.applying_to(requeued)["node2"] == Exclusion(
        "went down", 1, 3.0
    )


def test_exclusions_written_before_the_split_read_as_left_out_for_good(tmp_path: Path) -> None:
    (tmp_path / "excluded.json").write_text(
        json.dumps({"hosts": {"node2": {"reason": "hung", "attempt": 0, "time": 5.0}}})
    )
    excluded = Exclusions.read(tmp_path)
    assert excluded.hosts == {"node2": Exclusion("hung", 0, 5.0)} and excluded.set_aside == {}
    assert list(excluded.applying_to(AttemptId("77", 3))) == ["node2"]


def test_a_ranks_unwatched_record_is_its_attempts_alone_and_each_rank_keeps_its_own(tmp_path: Path) -> None:
    before, now = AttemptId("77", 0), AttemptId("77", 0, 1)
    Unwatched(3, "stopped (OSError(9))", before, 1.0).write(tmp_path)
    Unwatched(1, "stopped (ValueError())", now, 2.0).write(tmp_path)
    Unwatched(3, "could not start: the store has no watch address (TimeoutError())", now, 3.0).write(tmp_path)
    assert on_disk(tmp_path / "unwatched" / "rank_1.json") == {
        "rank": 1,
        "what": "stopped (ValueError())",
        "time": 2.0,
        "job_id": "77",
        "restart_count": 0,
        "in_job_restart": 1,
    }
    assert Unwatched.read_for(tmp_path, now) == [
        Unwatched(1, "stopped (ValueError())", now, 2.0),
        Unwatched(3, "could not start: the store has no watch address (TimeoutError())", now, 3.0),
    ]
    assert Unwatched.read_for(tmp_path, before) == []  # rank 3's record of it was replaced
    assert Unwatched.read_for(tmp_path / "nothing", now) == []


def test_attempt_lines_keep_their_keys(tmp_path: Path) -> None:
    lines = [
        Begin(0, 1.0, "node1", "node[1-2]", ME),
        End("killed", None, 2.0, requeue=True, final=False, message="killed", attempt=0),
        End("preemption", 5, 3.0, requeue=True, final=False, message="m", attempt=0, status=0, attempt_id=ME),
        # A failure says what failed, which the next failure is compared with.
        End("failure", None, 3.5, True, False, "m", 1, 1, ME, in_job=True, signature="NameError at t.py:3"),
        Resubmit(4.0, ["resubmit", "x"]),
        Resubmit(5.0, ["resubmit", "y"], ["resources.time"], [2, 4]),
        End("cancelled", None, 6.0, requeue=False, final=True, message="cancelled by the user"),
    ]
    for line in lines:
        records.append_attempt(tmp_path, line)
    assert records.read_attempts(tmp_path) == lines
    written = [json.loads(text) for text in (tmp_path / "attempts.jsonl").read_text().splitlines()]
    assert [sorted(line) for line in written] == [
        ["attempt", "event", "host", "job_id", "nodes", "restart_count", "time"],
        ["attempt", "event", "final", "message", "reason", "requeue", "step", "time"],
        [
            "attempt",
            "event",
            "final",
            "job_id",
            "message",
            "reason",
            "requeue",
            "restart_count",
            "status",
            "step",
            "time",
        ],
        [
            "attempt",
            "event",
            "final",
            "in_job",
            "job_id",
            "message",
            "reason",
            "requeue",
            "restart_count",
            "signature",
            "status",
            "step",
            "time",
        ],
        ["argv", "event", "time"],
        ["argv", "changed", "event", "ranks", "time"],
        ["event", "final", "message", "reason", "requeue", "step", "time"],
    ]
    assert records.final_end(records.read_attempts(tmp_path)) == lines[-1]
    assert records.current(records.read_attempts(tmp_path)) == lines[-1:]


def test_the_run_dir_of_a_refused_pickle_is_the_run_or_the_array_tasks_element(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    assert records.run_dir_of(run / "logs", ENV) is None  # not a run directory (yet)
    (run / "config.yaml").write_text("{}\n")
    assert records.run_dir_of(run / "logs", ENV) == run

    sweep = tmp_path / "sweep"
    (sweep / "logs").mkdir(parents=True)
    (sweep / "config.yaml").write_text("{}\n")
    manifest = {
        "elements": [{"index": i, "dir": f"{i}-x"} for i in range(3)],
        # The first array of all three, then element 2 again as a one-element (plain) job.
        "submissions": [{"elements": [0, 1, 2], "job_id": "50"}, {"elements": [2], "job_id": "60"}],
    }
    (sweep / "sweep.json").write_text(json.dumps(manifest))
    task = {"SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "51"}
    assert records.run_dir_of(sweep / "logs", task) == sweep / "1-x"
    assert records.run_dir_of(sweep / "logs", {"SLURM_JOB_ID": "60"}) == sweep / "2-x"
    assert records.run_dir_of(sweep / "logs", {"SLURM_JOB_ID": "70"}) is None
