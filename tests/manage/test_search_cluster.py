"""A search that learns, on the real cluster: the quickstart as 12 Optuna trials (TPE + ASHA), two at
a time in one array, preempted once by a `high` job, driven through `python -m slurmddp` only and
checked against the study itself (`optuna.load_study`)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, wait_until
from conftest import slurmddp as cli

optuna = pytest.importorskip("optuna")

pytestmark = [pytest.mark.slurm, pytest.mark.lab_generation("22.05")]

SEARCH = ROOT / "examples" / "search.yaml"
# 16 a step: 89 steps an epoch, so that a trial trains long enough (~5 s) to be preempted mid-run.
BATCH = 16
EPOCH_STEPS = (1797 - 360) // BATCH


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def step_of(run: Path) -> int:
    try:
        return int(json.loads((run / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def reasons(run: Path) -> list[str]:
    lines = (run / "attempts.jsonl").read_text().splitlines()
    return [json.loads(line)["reason"] for line in lines if json.loads(line)["event"] == "end"]


def gone_from_the_queue(env: dict[str, str], job: str, timeout: float) -> None:
    """Wait until no task of array `job` is pending or running."""
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, f"array {job} did not end in {timeout:.0f} s"
        time.sleep(1)


def load_study(sweep: Path) -> Any:
    search = json.loads((sweep / "sweep.json").read_text())["search"]
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(search["storage"]))
    return optuna.load_study(study_name=search["study"], storage=storage)


def test_a_preempted_search_keeps_its_trials_and_the_study_agrees_with_status(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    work = tmp_path / "work"
    work.mkdir()
    (work / "quickstart_train.py").write_text((ROOT / "examples" / "quickstart_train.py").read_text())
    (work / "data").symlink_to(ROOT / "examples" / "data")
    out = tmp_path / "runs"
    # Once the search ended: the best trial trained again for one epoch, through sweep.then.
    then = work / "best.yaml"
    then.write_text(
        (ROOT / "examples" / "search.yaml").read_text().split("sweep:")[0].replace("epochs: 6", "epochs: 1")
    )
    ok(
        cli(
            env,
            work,
            "submit",
            str(SEARCH),
            f"train.global_batch={BATCH}",
            f"output_dir={out}",
            f"sweep.then={then}",
            "--no-wait",
        )
    )
    (manifest,) = out.glob("*/*/sweep.json")
    sweep = manifest.parent
    wait_until(
        "the array job id recorded", lambda: json.loads(manifest.read_text())["submissions"][0]["job_id"]
    )
    data = json.loads(manifest.read_text())
    array_id = data["submissions"][0]["job_id"]
    dirs = [sweep / e["dir"] for e in data["elements"]]

    # The first two trials: no trial has completed, so ASHA prunes neither; both are preempted
    # after their first report (the end of epoch 0), by high jobs that need their nodes' every core.
    first = dirs[:2]
    wait_until(
        "the first two trials past their first report",
        lambda: all(step_of(d) > EPOCH_STEPS + 5 for d in first),
    )
    asked = {d.name: json.loads((d / "trial.json").read_text()) for d in first}
    nodes = set()
    for position in (0, 1):
        node = subprocess.run(
            ["squeue", "-h", "-j", f"{array_id}_{position}", "-o", "%N"],
            env=env,
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert node, f"element {position} is not running"
        nodes.add(node)
    for node in nodes:
        subprocess.run(
            [
                "sbatch",
                "-p",
                "high",
                "-w",
                node,
                "-c",
                "4",
                "-t",
                "1",
                "-o",
                str(tmp_path / f"{node}.out"),
                "--wrap",
                "sleep 2",
            ],
            env=env,
            check=True,
            capture_output=True,
        )
    gone_from_the_queue(env, array_id, 400)

    study = load_study(sweep)
    states = optuna.trial.TrialState
    trials = study.get_trials()
    assert len(trials) == 12
    assert {t.state for t in trials} <= {states.COMPLETE, states.PRUNED}, [t.state for t in trials]
    pruned = [t for t in trials if t.state == states.PRUNED]
    assert pruned, "ASHA pruned no trial"
    # One trial an element, asked as each started (the journal's lock across the nodes held).
    assert sorted(t.user_attrs["element"] for t in trials) == list(range(12))
    by_element = {t.user_attrs["element"]: t for t in trials}
    for index, run in enumerate(dirs):
        record = json.loads((run / "trial.json").read_text())
        trial = by_element[index]
        assert record["number"] == trial.number
        assert record["params"] == {f"train.{k}": v for k, v in trial.params.items()}
        # Reported at each epoch's end, each once, none missing, up to where the trial ended.
        steps = sorted(trial.intermediate_values)
        assert steps == [EPOCH_STEPS * (n + 1) - 1 for n in range(len(steps))], (index, steps)
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        logged = {m["step"]: m["val_loss"] for m in metrics if "val_loss" in m}
        assert logged == trial.intermediate_values, index
    for run in first:
        assert reasons(run)[0] == "preemption", reasons(run)
        assert json.loads((run / "trial.json").read_text())["number"] == asked[run.name]["number"]
        assert json.loads((run / "trial.json").read_text())["params"] == asked[run.name]["params"]
        # The trial went on from where it stopped: reported before the stop and after it.
        stopped = json.loads((run / "attempts.jsonl").read_text().splitlines()[1])["step"]
        steps = sorted(by_element[dirs.index(run)].intermediate_values)
        assert steps[0] < stopped < steps[-1], (stopped, steps)

    shown = json.loads(ok(cli(env, tmp_path, "status", str(sweep), "--json")))
    counts = shown["study"]["trials"]
    assert counts == {
        "complete": 12 - len(pruned),
        "pruned": len(pruned),
        "failed": 0,
        "running": 0,
        "waiting": 0,
    }
    best = study.best_trial
    assert shown["study"]["best"] == {"number": best.number, "value": best.value, "params": best.params}
    assert [e["state"] for e in shown["elements"]] == ["COMPLETED"] * 12
    assert sum(e["trial"]["state"] == "pruned" for e in shown["elements"]) == len(pruned)
    table = ok(cli(env, tmp_path, "status", str(sweep)))
    assert f"{len(pruned)} pruned" in table and f"best: trial {best.number}" in table
    ranked = ok(cli(env, tmp_path, "results", str(sweep))).splitlines()
    assert ranked[1].split()[0] == str(best.user_attrs["element"]), ranked

    then_job = json.loads(manifest.read_text())["then_job"]
    wait_until("the then-run submitted", lambda: any(out.glob("best/*/manifest.json")), timeout=120)
    (best_run,) = (p.parent for p in out.glob("best/*/manifest.json"))
    config = (best_run / "config.yaml").read_text()
    assert f"hidden: {best.params['hidden']}" in config and f"lr: {best.params['lr']}" in config
    assert f"best_run_dir: {dirs[best.user_attrs['element']]}" in config
    shown = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", then_job, "-o", "State"], env=env, capture_output=True, text=True
    )
    assert shown.stdout.strip() in ("COMPLETED", "RUNNING", "COMPLETING"), shown.stdout

    # Two more trials in the same study, asked after the twelve.
    added = ok(cli(env, tmp_path, "resubmit", str(sweep), "--trials", "2"))
    assert "added 2 trials as elements 12-13" in added, added
    more = json.loads(manifest.read_text())["submissions"][-1]["job_id"]
    gone_from_the_queue(env, more, 120)
    trials = load_study(sweep).get_trials()
    assert len(trials) == 14 and {t.state for t in trials} <= {states.COMPLETE, states.PRUNED}
    assert sorted(t.number for t in trials if t.user_attrs["element"] >= 12) == [12, 13]
    counts = json.loads(ok(cli(env, tmp_path, "status", str(sweep), "--json")))["study"]["trials"]
    assert sum(counts.values()) == 14 and counts["waiting"] == counts["running"] == 0
