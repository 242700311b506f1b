"""A `search:` sweep without Slurm, through `python -m slurmddp` only: trials asked one after another,
the pruner's stop taken by every rank at the same step, the study told how each ended; and the
mistakes a user can make refused at submit with nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

# loss = (log10(lr) + 2)^2 + 1 / (step + 1): lr = 0.01 is best at every step.
TRAIN = """\
import math
def main(ctx):
    last = -1
    try:
        for step in ctx.loop(ctx.train.steps):
            last = step
            ctx.log(step, value=(math.log10(ctx.train.lr) + 2) ** 2 + 1 / (step + 1))
    finally:
        (ctx.run_dir / f"last-{ctx.rank}").write_text(str(last))
    return {}
"""
EXPERIMENT = """\
entrypoint: objective.py:main
resources: {tasks_per_node: 3}
train: {steps: 30, lr: 0.1}
sweep:
  search:
    trials: 4
    sampler: grid
    pruner: {median: {n_startup_trials: 1, n_warmup_steps: 2}}
    params: {lr: "choice(1.0, 0.01, 0.0001, 0.3)"}
  metric: value
  mode: min
"""


def run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", *args],
        cwd=cwd,
        env=env or {**os.environ, "XDG_STATE_HOME": str(cwd / "state")},
        capture_output=True,
        text=True,
        timeout=300,
    )


def write(tmp_path: Path, experiment: str = EXPERIMENT) -> Path:
    (tmp_path / "objective.py").write_text(TRAIN)
    (tmp_path / "search.yaml").write_text(experiment)
    return tmp_path / "search.yaml"


def test_a_local_search_prunes_on_every_rank_at_once_and_tells_the_study(tmp_path: Path) -> None:
    exp = write(tmp_path)
    proc = run(tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (manifest,) = (tmp_path / "runs").glob("search/*/sweep.json")
    sweep = manifest.parent
    shown = json.loads(run(tmp_path, "status", str(sweep), "--json").stdout)
    search = json.loads(manifest.read_text())["search"]
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(search["storage"]))
    study = optuna.load_study(study_name=search["study"], storage=storage)
    states = optuna.trial.TrialState
    assert [t.state in (states.COMPLETE, states.PRUNED) for t in study.trials] == [True] * 4
    pruned = [t for t in study.trials if t.state == states.PRUNED]
    assert pruned, [t.params for t in study.trials]
    assert study.best_trial.params == {"lr": 0.01}
    assert shown["study"]["trials"]["pruned"] == len(pruned)
    assert shown["study"]["best"]["params"] == {"lr": 0.01}
    for element in shown["elements"]:
        run_dir = Path(element["dir"])
        record = element["trial"]
        assert element["overrides"] == {"train.lr": record["params"]["train.lr"]}
        assert f"lr: {record['params']['train.lr']}" in (run_dir / "config.yaml").read_text()
        lasts = {int((run_dir / f"last-{rank}").read_text()) for rank in range(3)}
        assert len(lasts) == 1, f"the ranks stopped at different steps: {lasts}"
        if record["state"] == "pruned":
            # Stopped a step or two after the value that pruned it, at the step the record names.
            assert lasts == {record["step"] - 1} and record["step"] < 30
            assert element["state"] == "COMPLETED" and element["attempts"] == 1
            ends = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
            assert [e["reason"] for e in ends if e["event"] == "end"] == ["pruned"]
        else:
            assert lasts == {29} and record["state"] == "complete"
    table = run(tmp_path, "status", str(sweep)).stdout
    assert f"{len(pruned)} pruned" in table and "PRUNED" in table
    ranked = run(tmp_path, "results", str(sweep), "--plot", str(tmp_path / "history.png")).stdout.splitlines()
    assert ranked[1].split()[1:3] == ["0.01", "COMPLETED"], ranked  # the optimum first
    assert [line.split()[2] for line in ranked[1:5]].count("PRUNED") == len(pruned)
    assert (tmp_path / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_metric_the_run_never_logs_fails_the_trial_at_once(tmp_path: Path) -> None:
    exp = write(
        tmp_path, EXPERIMENT.replace("metric: value", "metric: valeu").replace("trials: 4", "trials: 1")
    )
    proc = run(tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (record,) = (tmp_path / "runs").glob("search/*/000-trial/trial.json")
    said = json.loads(record.read_text())
    assert said["state"] == "fail"
    assert "never logged sweep.metric 'valeu' (did you mean 'value'?)" in said["message"]
    # Said at the first values logged: no step past the first was run.
    assert int((record.parent / "last-0").read_text()) <= 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("sampler: grid", "sampler: {tpe: {n_startup: 2}}"), "TPESampler takes no option 'n_startup'"),
        (("sampler: grid", "sampler: grid\n    storage: 'nosuch://db'"), "sweep.search.storage: cannot make"),
        (("  metric: value\n", ""), "sweep.metric: a search needs it"),
        (("params: {lr:", "params: {momentum:"), "unknown key 'momentum'"),
        (("sampler: grid", "sampler: gridd"), "unknown 'gridd' (did you mean 'grid'?)"),
        (('"choice(1.0, 0.01, 0.0001, 0.3)"', "{normal: [0, 1]}"), "sweep.search.params.lr: must be one of"),
    ],
)
def test_bad_searches_are_refused_and_nothing_is_left(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    exp = write(tmp_path, EXPERIMENT.replace(*change))
    proc = run(tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert not list((tmp_path / "runs").glob("*/*"))


def test_without_optuna_the_install_line_is_named(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "optuna.py").write_text("raise ImportError('no optuna here')\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONPATH": str(blocked)}
    exp = write(tmp_path)
    proc = run(tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pip install 'slurmddp[search]'" in proc.stderr
    assert not list((tmp_path / "runs").glob("*/*"))


SCRIPT = """\
import math, os
import torch, torch.distributed as dist
import slurmddp

dist.init_process_group("gloo")
lr = slurmddp.params()["lr"]
last = -1
for step in range(30):
    ones = torch.ones(1)
    dist.all_reduce(ones)  # the ranks move in lockstep, as DDP's gradient all-reduce makes them
    last = step
    slurmddp.report(step, value=(math.log10(lr) + 2) ** 2 + 1 / (step + 1))
    if slurmddp.should_stop():
        break
with open(os.path.join(os.environ["SLURMDDP_RUN_DIR"], f"last-{dist.get_rank()}"), "w") as f:
    f.write(f"{last} {slurmddp.pruned()}")
dist.destroy_process_group()
"""


def test_a_script_reads_its_trial_reports_and_stops_when_pruned(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    exp = write(tmp_path, EXPERIMENT.replace("objective.py:main", "script.py"))
    proc = run(tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (manifest,) = (tmp_path / "runs").glob("search/*/sweep.json")
    shown = json.loads(run(tmp_path, "status", str(manifest.parent), "--json").stdout)
    assert shown["study"]["best"]["params"] == {"lr": 0.01} and shown["study"]["trials"]["pruned"] >= 1
    for element in shown["elements"]:
        said = {(Path(element["dir"]) / f"last-{rank}").read_text() for rank in range(3)}
        assert len(said) == 1, f"the ranks stopped at different steps: {said}"
        last, pruned = said.pop().split()
        assert pruned == str(element["trial"]["state"] == "pruned")
        assert (int(last) == 29) == (element["trial"]["state"] == "complete")


def test_then_submits_an_experiment_with_the_best_values_once_the_sweep_ended(tmp_path: Path) -> None:
    (tmp_path / "evaluate.yaml").write_text(
        "entrypoint: objective.py:main\nresources: {tasks_per_node: 1}\ntrain: {steps: 3, lr: 0.5}\n"
    )
    exp = write(
        tmp_path,
        EXPERIMENT.replace("trials: 4", "trials: 2").replace("mode: min", "mode: min\n  then: evaluate.yaml"),
    )
    proc = run(tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (manifest,) = (tmp_path / "runs").glob("search/*/sweep.json")
    shown = json.loads(run(tmp_path, "status", str(manifest.parent), "--json").stdout)
    best = shown["study"]["best"]
    (config,) = (tmp_path / "runs").glob("evaluate/*/config.yaml")
    text = config.read_text()
    assert f"lr: {best['params']['lr']}" in text
    (best_dir,) = (e["dir"] for e in shown["elements"] if e["trial"]["number"] == best["number"])
    assert f"best_run_dir: {best_dir}" in text
    assert "sweep.then: slurmddp submit" in proc.stdout


def test_a_then_that_cannot_be_loaded_is_refused_before_the_sweep(tmp_path: Path) -> None:
    (tmp_path / "evaluate.yaml").write_text("entrypoint: objective.py:main\nresources: {nodes: 0}\n")
    exp = write(tmp_path, EXPERIMENT.replace("mode: min", "mode: min\n  then: evaluate.yaml"))
    proc = run(tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "sweep.then:" in proc.stderr and "resources.nodes" in proc.stderr
    assert not list((tmp_path / "runs").glob("*/*"))
