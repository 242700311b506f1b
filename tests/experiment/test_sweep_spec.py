"""Sweep specs -> elements, validated before anything is submitted; the array plan; the records
that cancel and resubmit leave for the batch script."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from slurmddp import attempts, report, runs, submitter
from slurmddp import plan as planning
from slurmddp import sweep as sweeps
from slurmddp.cli import main
from slurmddp.config import expand, load_experiment
from slurmddp.errors import ConfigError, SlurmddpError, SubmitError

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "examples" / "sweep.yaml"
SECTIONS = ("name", "resources", "train", "checkpoint", "dist")
TRAIN = {"lr": 0.1, "width": 8}


def parse(section: object) -> sweeps.Spec:
    return sweeps.parse(section, SECTIONS, TRAIN)


def test_grid_is_the_cartesian_product_in_key_order() -> None:
    spec = parse({"grid": {"lr": [0.1, 0.2], "train.width": [4, 8, 16]}, "max_parallel": 2})
    assert spec.elements[:4] == (
        {"train.lr": 0.1, "train.width": 4},
        {"train.lr": 0.1, "train.width": 8},
        {"train.lr": 0.1, "train.width": 16},
        {"train.lr": 0.2, "train.width": 4},
    )
    assert len(spec.elements) == 6 and spec.max_parallel == 2 and spec.keys == ("train.lr", "train.width")


def test_list_keeps_the_given_sets() -> None:
    spec = parse({"list": [{"lr": 0.1}, {"lr": 0.2, "checkpoint.every_steps": 5}]})
    assert spec.elements == ({"train.lr": 0.1}, {"train.lr": 0.2, "checkpoint.every_steps": 5})


def test_random_is_seeded_and_stays_in_range() -> None:
    body = {
        "trials": 200,
        "seed": 3,
        "params": {
            "lr": {"log_uniform": [1e-4, 1e-1]},
            "width": {"choice": [4, 8]},
            "train.dropout": {"uniform": [0.0, 0.5]},
            "train.layers": {"int": [2, 4]},
        },
    }
    first, again = parse({"random": body}), parse({"random": body})
    assert first.elements == again.elements
    assert parse({"random": {**body, "seed": 4}}).elements != first.elements
    values = first.elements
    assert all(1e-4 <= e["train.lr"] <= 1e-1 for e in values)
    assert {e["train.width"] for e in values} == {4, 8}
    assert all(0.0 <= e["train.dropout"] <= 0.5 for e in values)
    assert {e["train.layers"] for e in values} == {2, 3, 4}
    # log-uniform: about a third of the samples in each decade.
    assert 40 < sum(1 for e in values if e["train.lr"] < 1e-3) < 95


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"grid": {"lr": []}}, "sweep.grid.train.lr: needs a non-empty list"),
        ({"grid": {"lr": 0.1}}, "write train.lr: [0.1] for a single value"),
        ({"grid": {}}, "sweep.grid: must be a non-empty mapping"),
        ({"list": []}, "sweep.list: needs a non-empty list"),
        ({"list": [{"lr": 1}, {"lr": 1}]}, "sweep.list[1]: the same overrides as sweep.list[0]"),
        ({"random": {"params": {"lr": {"uniform": [0, 1]}}}}, "needs trials"),
        ({"random": {"trials": 0, "params": {"lr": {"uniform": [0, 1]}}}}, "must be a positive integer"),
        ({"random": {"trials": 2, "params": {"lr": {"uniform": [1, 0]}}}}, "low < high"),
        ({"random": {"trials": 2, "params": {"lr": {"log_uniform": [0, 1]}}}}, "bounds must be > 0"),
        ({"random": {"trials": 2, "params": {"lr": {"normal": [0, 1]}}}}, "must be one of {choice"),
        ({"random": {"trials": 2, "params": {"lr": {"int": [0.5, 3]}}}}, "bounds must be integers"),
        ({"grid": {"lrr": [1]}}, "unknown key 'lrr' (did you mean 'lr'?)"),
        ({"grid": {"lr": [1], "train.lr": [2]}}, "'train.lr' and 'train.lr' set the same setting"),
        ({"grid": {"train": [{}], "lr": [2]}}, "set the same setting"),
        ({"grid": {"resources.nodes": [1, 2]}}, "cannot vary within a sweep"),
        ({"grid": {"name": ["a", "b"]}}, "cannot vary within a sweep"),
        ({"list": [{"dist.launcher": "mpi"}]}, "cannot vary within a sweep"),
        (
            {"grid": {"lr": [1]}, "list": [{"lr": 1}]},
            "exactly one of grid, list or random (found grid and list)",
        ),
        ({"max_parallel": 2}, "found none"),
        ({"grid": {"lr": [1]}, "max_paralel": 2}, "unknown key 'max_paralel' (did you mean 'max_parallel'?)"),
        ({"grid": {"lr": [1]}, "max_parallel": 0}, "sweep.max_parallel: must be a positive integer"),
        ({"grid": {"lr": [1]}, "mode": "best"}, "sweep.mode: must be min or max"),
        ([1, 2], "sweep: must be a mapping"),
    ],
)
def test_bad_sweep_specs_name_the_problem(section: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(section)
    assert message in str(error.value)


def write_sweep(tmp_path: Path, sweep: str, extra: str = "") -> Path:
    (tmp_path / "train.py").write_text("def main(ctx):\n    return {}\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"entrypoint: train.py:main\n{extra}train: {{lr: 0.1, width: 8, label: x}}\nsweep: {sweep}\n"
    )
    return exp


def test_every_element_is_validated_and_named_by_index_and_hash(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path, "{grid: {lr: [0.1, 0.2], checkpoint.keep_last: [1, 3]}}")
    loaded = load_experiment(exp)
    elements = expand(loaded)
    assert [e.dir_name[:4] for e in elements] == ["000-", "001-", "002-", "003-"]
    assert len({e.dir_name for e in elements}) == 4
    assert elements[3].loaded.experiment.checkpoint.keep_last == 3
    assert elements[3].loaded.resolved["train"] == {"lr": 0.2, "width": 8, "label": "x"}
    # Stable: the same overrides give the same directory name in another submission.
    assert [e.dir_name for e in expand(load_experiment(exp))] == [e.dir_name for e in elements]
    # The base is left as it was.
    assert loaded.experiment.train == {"lr": 0.1, "width": 8, "label": "x"}
    assert expand(loaded)[0].loaded.experiment.checkpoint.keep_last == 1

    bad = write_sweep(tmp_path, "{grid: {checkpoint.keep_last: [2, 0]}}")
    with pytest.raises(
        ConfigError, match=r"sweep element 1 \(checkpoint.keep_last=0\).*keep_last: must be >= 1"
    ):
        expand(load_experiment(bad))
    typo = write_sweep(tmp_path, "{list: [{checkpoint.every_steps: ten}]}")
    with pytest.raises(ConfigError, match="sweep element 0"):
        expand(load_experiment(typo))


def test_interpolations_follow_each_element(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path, "{grid: {lr: [0.1, 0.3]}}", extra="checkpoint: {every_steps: 7}\n")
    text = exp.read_text().replace("label: x", "label: 'lr=${train.lr}'")
    exp.write_text(text)
    assert [e.loaded.resolved["train"]["label"] for e in expand(load_experiment(exp))] == ["lr=0.1", "lr=0.3"]
    # Outside train, an interpolation of a swept key takes the full validating path.
    widths = write_sweep(
        tmp_path, "{grid: {width: [3, 5]}}", extra="checkpoint: {every_steps: '${train.width}'}\n"
    )
    assert [e.loaded.experiment.checkpoint.every_steps for e in expand(load_experiment(widths))] == [3, 5]


def test_overrides_change_the_sweep_and_must_not_clash_with_it(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path, "{grid: {lr: [0.1, 0.2]}, max_parallel: 1}")
    assert load_experiment(exp, ["sweep.max_parallel=5"]).sweep.max_parallel == 5  # type: ignore[union-attr]
    assert load_experiment(exp, ["sweep=null"]).sweep is None
    assert len(load_experiment(exp, ["sweep.grid.width=[1, 2, 3]"]).sweep.elements) == 6  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"override 'lr=0\.5' sets train\.lr, which the sweep varies"):
        load_experiment(exp, ["lr=0.5"])
    plain = tmp_path / "plain.yaml"
    plain.write_text("entrypoint: train.py:main\n")
    with pytest.raises(ConfigError, match="has no sweep: section"):
        load_experiment(plain, ["sweep.max_parallel=2"])


def sweep_plan(tmp_path: Path, exp: Path) -> planning.SubmissionPlan:
    loaded = load_experiment(exp)
    elements = tuple((e.loaded, tmp_path / e.dir_name) for e in expand(loaded))
    return planning.build(
        loaded, executor="slurm", workdir=tmp_path, run_dir=tmp_path, interpreter="python3", elements=elements
    )


def test_a_shared_checkpoint_dir_is_refused(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path, "{grid: {lr: [0.1, 0.2]}}", extra="checkpoint: {dir: /shared/ckpt}\n")
    with pytest.raises(ConfigError, match="sweep elements 0 and 1 would share /shared/ckpt"):
        sweep_plan(tmp_path, exp)


def test_a_fixed_port_shared_by_elements_is_refused(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path, "{grid: {lr: [0.1, 0.2]}}", extra="dist: {port: 29500}\n")
    with pytest.raises(ConfigError, match="sweep elements 0 and 1 both use port 29500"):
        sweep_plan(tmp_path, exp)
    # Varied per element, the ports do not collide.
    varied = write_sweep(tmp_path, "{list: [{dist.port: 29500}, {dist.port: 29501}]}")
    assert [rank.port for rank in sweep_plan(tmp_path, varied).array] == [29500, 29501]


def test_the_array_script_limits_parallelism_and_finds_its_element(tmp_path: Path) -> None:
    loaded = load_experiment(SWEEP)
    elements = expand(loaded)
    plan = planning.build(
        loaded,
        executor="slurm",
        workdir=ROOT,
        run_dir=tmp_path,
        interpreter="python3",
        elements=tuple((e.loaded, tmp_path / e.dir_name) for e in elements),
        submission=0,
        max_parallel=2,
    )
    script = submitter.sbatch_script(plan)
    assert "#SBATCH --array=0-5%2" in script
    assert f"-m slurmddp.attempts begin {tmp_path} --submission 0" in script
    assert f'-m slurmddp.attempts end {tmp_path} "$slurmddp_status" --submission 0' in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert [spec.run_dir for spec in plan.array] == [str(tmp_path / e.dir_name) for e in elements]
    assert [spec.config["train"]["lr"] for spec in plan.array] == [0.01, 0.01, 0.05, 0.05, 0.2, 0.2]

    # The batch side resolves SWEEP_DIR + submission + array task to the element's directory.
    manifest = {"elements": [{"dir": e.dir_name} for e in elements], "submissions": [{"elements": [5, 2]}]}
    (tmp_path / "sweep.json").write_text(json.dumps(manifest))
    found = attempts.element_dir(tmp_path, 0, {"SLURM_ARRAY_TASK_ID": "1"})
    assert found == tmp_path / elements[2].dir_name
    # A one-element resubmission is a plain job: no array task id.
    assert attempts.element_dir(tmp_path, 0, {}) == tmp_path / elements[5].dir_name


def test_an_array_over_max_array_size_is_refused() -> None:
    submitter.check_array_size(1001, 1001)
    with pytest.raises(SubmitError, match="1002 elements but this cluster's MaxArraySize is 1001"):
        submitter.check_array_size(1002, 1001)


ENV = {
    "SLURM_JOB_ID": "91",
    "SLURM_RESTART_COUNT": "0",
    "SLURM_ARRAY_JOB_ID": "90",
    "SLURM_ARRAY_TASK_ID": "1",
}


def element(tmp_path: Path, **requeue: int) -> Path:
    lines = "".join(f"  {key}: {value}\n" for key, value in requeue.items())
    (tmp_path / "config.yaml").write_text(f"requeue:\n{lines or '  {}'}\n")
    return tmp_path


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands attempts.py runs (scontrol requeue), recorded instead of run."""
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(attempts.subprocess, "run", fake_run)
    return calls


def test_a_cancelled_run_is_neither_requeued_nor_started_again(
    tmp_path: Path, commands: list[list[str]]
) -> None:
    run = element(tmp_path)
    assert attempts.begin(run, ENV, now=1.0) == 0
    attempts.mark(
        run, {"event": "end", "reason": "cancelled", "final": True, "message": "cancelled by the user"}
    )
    # Rank 0's stop path (or the batch script) after the user's cancel: no requeue, no record.
    (run / "stop.json").write_text(json.dumps({"step": 5, "job_id": "91", "restart_count": 0}))
    assert attempts.end(run, 0, ENV, now=2.0, squeue=lambda job: "None") == 1
    assert commands == [] and attempts.read_attempts(run)[-1]["reason"] == "cancelled"
    assert attempts.begin(run, {**ENV, "SLURM_RESTART_COUNT": "1"}, now=3.0) == attempts.EXIT_FINISHED


def test_a_resubmitted_run_starts_again_with_fresh_budgets(tmp_path: Path, commands: list[list[str]]) -> None:
    run = element(tmp_path, max_failures=1)
    for restart in range(2):
        env = {**ENV, "SLURM_RESTART_COUNT": str(restart)}
        assert attempts.begin(run, env, now=10.0 * restart) == 0
        (run / "failure.json").write_text(
            json.dumps({"step": restart, "job_id": "91", "restart_count": restart})
        )
        attempts.end(run, 1, env, now=10.0 * restart + 5, squeue=lambda job: "None")
    assert attempts.final_end(attempts.read_attempts(run))["message"].startswith("failure budget spent")  # type: ignore[index]
    attempts.mark(run, {"event": "resubmit", "time": 30.0})
    new = {**ENV, "SLURM_JOB_ID": "95", "SLURM_ARRAY_JOB_ID": "94", "SLURM_ARRAY_TASK_ID": "0"}
    assert attempts.begin(run, new, now=31.0) == 0
    (run / "failure.json").write_text(json.dumps({"step": 7, "job_id": "95", "restart_count": 0}))
    attempts.end(run, 1, new, now=32.0, squeue=lambda job: "None")
    last = attempts.read_attempts(run)[-1]
    assert last["requeue"] is True and "requeue 1 (budget 1)" in last["message"]
    assert commands[-1] == ["scontrol", "requeue", "94_0"]


def test_status_rows_read_the_run_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = tmp_path / "sweep"
    dirs = ["000-aaaaaa", "001-bbbbbb"]
    for name in dirs:
        (sweep / name).mkdir(parents=True)
    (sweep / "sweep.json").write_text(
        json.dumps(
            {
                "kind": "sweep",
                "name": "s",
                "executor": "slurm",
                "logs": str(sweep / "logs"),
                "world_size": 2,
                "metric": "loss",
                "elements": [
                    {"index": 0, "dir": dirs[0], "overrides": {"train.lr": 0.1}},
                    {"index": 1, "dir": dirs[1], "overrides": {"train.lr": 0.2}},
                ],
                "submissions": [{"elements": [0, 1], "job_id": "40", "logs": str(sweep / "logs")}],
            }
        )
    )
    lines = [
        {"event": "begin", "time": 100.0},
        {"event": "end", "time": 130.0, "reason": "preemption", "final": False, "requeue": True},
        {"event": "begin", "time": 150.0},
        {"event": "end", "time": 170.0, "reason": "completed", "final": True, "requeue": False},
    ]
    (sweep / dirs[0] / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (sweep / dirs[0] / "metrics.jsonl").write_text(
        '{"step": 0, "loss": 2.5}\n{"step": 90, "loss": 1.5}\n{"step"'
    )
    target = runs.load(sweep / dirs[1])  # an element's directory finds its sweep
    assert target.kind == "sweep" and target.element(1).job_id == "40_1"
    asked: list[list[str]] = []
    monkeypatch.setattr(runs, "slurm_states", lambda ids: asked.append(ids) or {"40_1": "PENDING"})
    rows = runs.rows(target)
    assert asked == [["40_0", "40_1"]]
    assert [(r.state, r.attempts, r.step, r.metrics, r.elapsed_s) for r in rows] == [
        ("COMPLETED", 2, 90, {"loss": 1.5}, 50.0),  # the cut-off last line of metrics is skipped
        ("PENDING", 0, None, {}, 0.0),
    ]
    text = report.status_table(target, rows, "loss")
    assert "1 completed, 1 pending" in text
    assert text.splitlines()[2].split() == ["0", "lr=0.1", "COMPLETED", "2", "90", "1.5", "0:00:50", "40_0"]
    assert [r.index for r in report.ranked(rows, "loss", "min")] == [0, 1]
    with pytest.raises(SlurmddpError, match="no element logged a metric named 'acc'; logged metrics: loss"):
        report.ranked(rows, "acc", "max")
    with pytest.raises(SlurmddpError, match="no element 7; the sweep's indices are 0-1"):
        target.element(7)


def test_dryrun_of_a_sweep_lists_its_elements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dryrun", str(SWEEP), "executor=local", f"output_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "# ---- sweep: 6 elements (grid) ----" in out
    assert [line.split(": ")[1] for line in out.splitlines() if line.startswith("# 00")] == [
        f"lr={lr} width={width}" for lr in (0.01, 0.05, 0.2) for width in (128, 256)
    ]
    assert not tmp_path.joinpath("sweep").exists()


def test_provenance_records_the_commit_and_the_dirty_diff(tmp_path: Path) -> None:
    from slurmddp import provenance

    repo = tmp_path / "code"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "train.py").write_text("lr = 1\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (repo / "train.py").write_text("lr = 2\n")
    (repo / "new.py").write_text("")
    run = tmp_path / "run"
    path = provenance.record(run, repo, {"SLURM_JOB_NODELIST": "node[1-2]"}, {"train": {}}, "41", 2)
    data = json.loads(path.read_text())
    assert path.name == "41-2.json" and data["restart_count"] == 2
    assert data["git"]["commit"] == commit and data["git"]["dirty"] and data["git"]["untracked"] == ["new.py"]
    assert "+lr = 2" in (run / "provenance" / data["git"]["diff_file"]).read_text()
    assert data["nodes"] == ["node1", "node2"] and data["packages"]["omegaconf"]
    # Outside a repository there is no git record, and no diff file.
    outside = json.loads(provenance.record(run, tmp_path / "run", {}, {}, "42", 0).read_text())
    assert outside["git"] is None


def test_the_index_finds_the_newest_submission_and_job_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with pytest.raises(SlurmddpError, match="nothing submitted yet"):
        runs.resolve(None)
    for job in ("7", "8"):
        run = tmp_path / f"run{job}"
        run.mkdir()
        (run / "manifest.json").write_text(
            json.dumps({"job_id": job, "logs": str(run / "logs"), "executor": "slurm"})
        )
        runs.remember(run, "run", "exp", job)
    assert runs.resolve(None).dir == tmp_path / "run8"
    assert runs.resolve("7").dir == tmp_path / "run7"
    assert [r["job_id"] for r in runs.recent(5)] == ["8", "7"]
    with pytest.raises(SlurmddpError, match="neither a run or sweep directory nor a job id"):
        runs.resolve("no-such-thing")
