"""slurmddp.integrations.transformers: HF Trainer preemption-safe by one line.

Unit tests read checkpoints the module writes and run a tiny Trainer in this process with a fake
stop; the local run (3 gloo ranks) of the script without the line, under `integrations: auto`,
stops it at a step drawn at random with damaged checkpoints planted, and compares its final
parameters, bit for bit, with an uninterrupted run's, and each rank's optimizer steps. Preempted
twice on real Slurm: test_frameworks_cluster.py's transformers case."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import ROOT
from transformers_runs import STEPS, Run, preempt_at, submit

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import Trainer, TrainingArguments  # noqa: E402

from slurmddp import StopForRequeue  # noqa: E402
from slurmddp.integrations import transformers as hf  # noqa: E402
from slurmddp.job.process import stop  # noqa: E402
from slurmddp.job.train import trackers  # noqa: E402

# The harder case: without find_unused_parameters DDP rebuilds its buckets after the first backward,
# and a resume is exact only because slurmddp builds the resumed DDP in the layout the first attempt
# recorded (ddp.resume_buckets); with Trainer's default, True for a PreTrainedModel, DDP never rebuilds.
FLAGS = ("--find-unused=false", "--step-sleep=0.03")


# ---- Completeness and the resume point ----------------------------------------------------------


def fake_checkpoint(output_dir: Path, step: int, *, complete: bool = True) -> Path:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"m" * 100)
    (folder / "rng_state_1.pth").write_bytes(b"r" * 10)
    (folder / "sub").mkdir()
    (folder / "sub" / "shard.bin").write_bytes(b"s" * 5)
    if complete:
        hf.write_marker(folder, step, world_size=2)
    return folder


def test_a_marked_checkpoint_with_its_files_at_their_sizes_is_complete(tmp_path: Path) -> None:
    folder = fake_checkpoint(tmp_path, 5)
    assert hf.checkpoint_problem(folder) is None
    marker = json.loads((folder / hf.COMPLETE).read_text())
    assert marker["files"] == {"model.safetensors": 100, "rng_state_1.pth": 10, "sub/shard.bin": 5}
    assert marker["step"] == 5 and marker["world_size"] == 2
    assert not list(folder.glob(".*")), "the marker's temp file stayed"


def test_what_makes_a_checkpoint_incomplete(tmp_path: Path) -> None:
    unmarked = fake_checkpoint(tmp_path, 1, complete=False)
    assert "has no slurmddp-complete.json" in str(hf.checkpoint_problem(unmarked))
    jit = fake_checkpoint(tmp_path, 2)
    (jit / hf.JIT_SENTINEL).write_text("Checkpoint started at step 2 and in progress...")
    assert "checkpoint-is-incomplete.txt" in str(hf.checkpoint_problem(jit))
    truncated = fake_checkpoint(tmp_path, 3)
    (truncated / "model.safetensors").write_bytes(b"m" * 40)
    assert hf.checkpoint_problem(truncated) == "model.safetensors has 40 bytes, its marker says 100"
    missing = fake_checkpoint(tmp_path, 4)
    (missing / "sub" / "shard.bin").unlink()
    assert hf.checkpoint_problem(missing) == "sub/shard.bin is missing"
    torn = fake_checkpoint(tmp_path, 6)
    (torn / hf.COMPLETE).write_text('{"files": {')
    assert "cannot be read" in str(hf.checkpoint_problem(torn))


def test_the_newest_complete_checkpoint_is_chosen_by_step_not_by_name(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path, 9)
    fake_checkpoint(tmp_path, 10)
    fake_checkpoint(tmp_path, 12, complete=False)
    fake_checkpoint(tmp_path, 100, complete=False)
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "checkpoint-200").write_text("a file, not a checkpoint")
    newest, skipped = hf.newest_complete(tmp_path)
    assert newest == tmp_path / "checkpoint-10"
    assert [path.name for path, _ in skipped] == ["checkpoint-100", "checkpoint-12"]
    assert hf.newest_complete(tmp_path / "absent") == (None, [])


@pytest.mark.parametrize(
    "requested", [None, False, True, "own-incomplete", "own-complete-older", "elsewhere"]
)
def test_in_a_job_every_request_resumes_from_the_newest_complete_checkpoint(
    tmp_path: Path, requested: Any
) -> None:
    out = tmp_path / "out"
    fake_checkpoint(out, 10)
    fake_checkpoint(out, 20)
    fake_checkpoint(out, 30, complete=False)
    given = {
        "own-incomplete": str(out / "checkpoint-30"),  # what get_last_checkpoint returns
        "own-complete-older": str(out / "checkpoint-10"),
        "elsewhere": str(tmp_path / "pretrained" / "checkpoint-7"),
    }.get(requested, requested)
    point, skipped = hf.resume_point(given, out, job=True)
    assert point == str(out / "checkpoint-20")
    assert [path.name for path, _ in skipped] == ["checkpoint-30"]


def test_in_a_job_without_a_complete_checkpoint_it_starts_afresh_or_from_a_checkpoint_elsewhere(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    fake_checkpoint(out, 30, complete=False)
    assert hf.resume_point(None, out, job=True)[0] is None
    assert hf.resume_point(True, out, job=True)[0] is None
    assert hf.resume_point(str(out / "checkpoint-30"), out, job=True)[0] is None
    elsewhere = str(tmp_path / "pretrained" / "checkpoint-7")
    assert hf.resume_point(elsewhere, out, job=True)[0] == elsewhere


def test_outside_a_job_only_a_request_for_the_last_checkpoint_is_resolved(tmp_path: Path) -> None:
    out = tmp_path / "out"
    fake_checkpoint(out, 20)
    fake_checkpoint(out, 30, complete=False)
    assert hf.resume_point(None, out, job=False) == (None, [])
    assert hf.resume_point(False, out, job=False) == (None, [])
    assert hf.resume_point(True, out, job=False)[0] == str(out / "checkpoint-20")
    assert hf.resume_point(str(out / "checkpoint-30"), out, job=False)[0] == str(out / "checkpoint-20")
    elsewhere = str(tmp_path / "elsewhere")
    assert hf.resume_point(elsewhere, out, job=False) == (elsewhere, [])
    with pytest.raises(ValueError, match="no complete checkpoint"):
        hf.resume_point(True, tmp_path / "empty", job=False)


def test_incomplete_checkpoints_are_set_aside_with_their_reason(tmp_path: Path) -> None:
    for _ in range(2):
        folder = fake_checkpoint(tmp_path, 30, complete=False)
        hf.set_aside(tmp_path, [(folder, "it has no marker")])
    aside = tmp_path / hf.SET_ASIDE
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint-30", "checkpoint-30.2"]
    assert (aside / "checkpoint-30.2" / "reason.txt").read_text() == "it has no marker\n"
    assert hf.checkpoints(tmp_path) == []


# ---- A tiny Trainer in this process, with a fake stop -------------------------------------------


@pytest.fixture(scope="module")
def example() -> ModuleType:
    """examples/frameworks/transformers_train.py as a module (its data set and digest)."""
    spec = importlib.util.spec_from_file_location("transformers_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = ROOT / "examples" / "frameworks" / "transformers_train.py"


@pytest.fixture
def patched_trainer() -> Iterator[None]:
    """Trainer as it was after the test: the module patches the class for the whole process."""
    saved = {name: Trainer.__dict__[name] for name in ("__init__", "train")}
    yield
    for name, value in saved.items():
        setattr(Trainer, name, value)
    for name in ("_slurmddp_original_init", "_slurmddp_original_train"):
        if name in Trainer.__dict__:
            delattr(Trainer, name)


def tiny_trainer(
    example: ModuleType,
    out: Path,
    callbacks: list[Any],
    steps: int = 12,
    evaluate: bool = False,
    report_to: str = "none",
) -> Trainer:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=61, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=3e-3,
        save_strategy="no",
        report_to=report_to,
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        eval_strategy="epoch" if evaluate else "no",
    )
    # 40 samples, 4 a batch, 2 batches a step: 5 steps an epoch.
    dataset = example.SyntheticText(size=40, length=16, vocab=61, seed=1)
    model = transformers.GPT2LMHeadModel(config)
    return Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset if evaluate else None,
        callbacks=callbacks,
    )


class FakeStop:
    """`stop.should_stop` answering True at one boundary: the step the ranks agreed on."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls == self.at


@pytest.fixture(scope="module")
def uninterrupted(example: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[float]]:
    """The in-process reference: the final digest, and the epochs evaluated at."""
    # An evaluation at each epoch's end draws from the RNG: a stop there must save after it.
    reference = tiny_trainer(example, tmp_path_factory.mktemp("ref"), [], evaluate=True)
    reference.train()
    return example.digest(reference.model), [
        e["epoch"] for e in reference.state.log_history if "eval_loss" in e
    ]


@pytest.mark.parametrize("at", [3, 5, 12], ids=["mid-epoch", "at-an-epochs-end", "at-the-last-step"])
def test_a_stop_saves_a_complete_checkpoint_at_that_step_and_the_resume_ends_where_an_uninterrupted_run_does(
    tmp_path: Path,
    example: ModuleType,
    uninterrupted: tuple[str, list[float]],
    monkeypatch: pytest.MonkeyPatch,
    patched_trainer: None,
    at: int,
) -> None:
    expected, evaluated = uninterrupted

    monkeypatch.setenv(stop.STORE_ENV, "127.0.0.1:1")  # in a job, as far as the resume goes
    fake = FakeStop(at=at)
    monkeypatch.setattr(stop, "should_stop", fake)
    out = tmp_path / "out"
    trainer = tiny_trainer(example, out, [hf.SlurmddpCallback()], evaluate=True)
    with pytest.raises(StopForRequeue):
        trainer.train()
    assert fake.calls == at, "should_stop() is asked once per optimizer step, accumulation included"
    assert [p.name for _, p in hf.checkpoints(out)] == [f"checkpoint-{at}"]
    assert hf.checkpoint_problem(out / f"checkpoint-{at}") is None
    assert trainer.state.global_step == at

    monkeypatch.setattr(stop, "should_stop", FakeStop(at=None))
    resumed = tiny_trainer(example, out, [hf.SlurmddpCallback()], evaluate=True)
    resumed.train()  # resume_from_checkpoint=None, as on a requeued attempt: found for the script
    assert resumed.state.global_step == 12
    assert example.digest(resumed.model) == expected
    evaluations = [e["epoch"] for e in resumed.state.log_history if "eval_loss" in e]
    assert evaluations == evaluated


def test_a_stopped_and_resumed_trainer_logs_into_one_tensorboard_directory(
    tmp_path: Path, example: ModuleType, monkeypatch: pytest.MonkeyPatch, patched_trainer: None
) -> None:
    """transformers' TensorBoard callback opens output_dir/runs/<time>_<host> on every attempt
    unless TENSORBOARD_LOGGING_DIR names one, which a script's rank sets (job/train/trackers.py)."""
    run_dir = tmp_path / "run"
    for name, value in trackers.script_env(run_dir, {}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(stop.STORE_ENV, "127.0.0.1:1")
    monkeypatch.setattr(stop, "should_stop", FakeStop(at=6))
    out = tmp_path / "out"
    with pytest.raises(StopForRequeue):
        tiny_trainer(example, out, [hf.SlurmddpCallback()], report_to="tensorboard").train()
    monkeypatch.setattr(stop, "should_stop", FakeStop(at=None))
    tiny_trainer(example, out, [hf.SlurmddpCallback()], report_to="tensorboard").train()
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert not (out / "runs").exists()


class EndsAt(transformers.TrainerCallback):
    """A callback that ends training at one step, as early stopping does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            control.should_training_stop = True


def test_a_stop_at_the_step_a_callback_ended_training_at_resumes_to_finish_only(
    tmp_path: Path, example: ModuleType, monkeypatch: pytest.MonkeyPatch, patched_trainer: None
) -> None:
    reference = tiny_trainer(example, tmp_path / "ref", [EndsAt(4)])
    reference.train()
    monkeypatch.setenv(stop.STORE_ENV, "127.0.0.1:1")
    monkeypatch.setattr(stop, "should_stop", FakeStop(at=4))
    with pytest.raises(StopForRequeue):
        tiny_trainer(example, tmp_path / "out", [EndsAt(4), hf.SlurmddpCallback()]).train()
    monkeypatch.setattr(stop, "should_stop", FakeStop(at=None))
    resumed = tiny_trainer(example, tmp_path / "out", [EndsAt(4), hf.SlurmddpCallback()])
    resumed.train()
    assert resumed.state.global_step == reference.state.global_step == 4
    assert example.digest(resumed.model) == example.digest(reference.model)


def test_a_stop_whose_save_trainer_drops_is_saved_by_the_callback_before_the_next_step(
    tmp_path: Path, example: ModuleType, monkeypatch: pytest.MonkeyPatch, patched_trainer: None
) -> None:
    # save_strategy="best": after the evaluation at the stop's step Trainer sets should_save to
    # whether the metric improved, over the callback's True (a falling loss never does here).
    monkeypatch.setattr(stop, "should_stop", FakeStop(at=3))
    trainer = tiny_trainer(example, tmp_path, [hf.SlurmddpCallback()], steps=6)
    trainer.eval_dataset = trainer.train_dataset
    trainer.args.eval_strategy = transformers.trainer_utils.IntervalStrategy.STEPS
    trainer.args.eval_steps = 1
    trainer.args.save_strategy = transformers.trainer_utils.SaveStrategy.BEST
    trainer.args.metric_for_best_model = "loss"
    trainer.args.greater_is_better = True
    with pytest.raises(StopForRequeue):
        trainer.train()
    assert trainer.state.global_step == 3
    assert hf.checkpoint_problem(tmp_path / "checkpoint-3") is None


def test_a_save_trainer_makes_on_its_own_is_marked_complete_too(
    tmp_path: Path, example: ModuleType, patched_trainer: None
) -> None:
    trainer = tiny_trainer(example, tmp_path, [hf.SlurmddpCallback()], steps=4)
    trainer.args.save_strategy = transformers.trainer_utils.SaveStrategy.STEPS
    trainer.args.save_steps = 2
    trainer.train()  # outside a job: should_stop() is False
    assert [p.name for _, p in hf.checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-2"]
    assert all(hf.checkpoint_problem(p) is None for _, p in hf.checkpoints(tmp_path))


def test_auto_gives_every_trainer_built_afterwards_the_callback_once(
    tmp_path: Path, example: ModuleType, patched_trainer: None
) -> None:
    before = tiny_trainer(example, tmp_path, [])
    hf.auto()
    hf.auto()
    after = tiny_trainer(example, tmp_path, [])
    given = tiny_trainer(example, tmp_path, [hf.SlurmddpCallback()])
    ours = [
        [cb for cb in t.callback_handler.callbacks if isinstance(cb, hf.SlurmddpCallback)]
        for t in (before, after, given)
    ]
    assert [len(cbs) for cbs in ours] == [0, 1, 1]


def test_a_trainer_without_the_callback_is_left_as_transformers_has_it(
    tmp_path: Path, example: ModuleType, patched_trainer: None
) -> None:
    hf.SlurmddpCallback()  # patches Trainer.train for the whole process
    trainer = tiny_trainer(example, tmp_path, [], steps=2)
    trainer.args.save_strategy = transformers.trainer_utils.SaveStrategy.STEPS
    trainer.args.save_steps = 2
    trainer.train()
    assert (tmp_path / "checkpoint-2").is_dir()
    assert not (tmp_path / "checkpoint-2" / hf.COMPLETE).exists()


# ---- Local runs: 3 ranks, stopped at random steps -----------------------------------------------


class Reference:
    """The uninterrupted run, started once per module and waited for when first needed, so that
    it runs beside the first test's own run."""

    def __init__(self, root: Path) -> None:
        self.run = submit(root, *FLAGS)
        self._result: dict[str, Any] | None = None

    def result(self) -> dict[str, Any]:
        if self._result is None:
            self.run.wait()
            self._result = self.run.result()
        return self._result


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    ref = Reference(tmp_path_factory.mktemp("reference"))
    yield ref
    if ref.run.proc.poll() is None:
        ref.run.proc.kill()
        ref.run.proc.wait()


def assert_each_step_once(run: Run) -> None:
    for rank in range(3):
        steps = run.steps(rank)
        assert steps == list(range(1, STEPS + 1)), f"rank {rank}: repeated or missing steps {steps}"
    assert run.after_train() == [STEPS], "the code after trainer.train() ran on a stop"


def test_an_incomplete_and_a_damaged_checkpoint_are_skipped_on_resume_of_a_script_without_the_line(
    tmp_path: Path, reference: Reference
) -> None:
    """`integrations: auto` in the experiment: the script builds its Trainer without the callback
    and gets it from slurmddp's import hook (job/script/autoload.py) when transformers.trainer loads."""
    planted: list[str] = []

    def plant(step: int) -> None:
        # Newer than the stop's: get_last_checkpoint in the script picks the damaged one.
        source = tmp_path / "trainer" / f"checkpoint-{step}"
        jit = shutil.copytree(source, source.with_name(f"checkpoint-{step + 1}"))
        (jit / hf.COMPLETE).unlink()
        (jit / hf.JIT_SENTINEL).write_text(f"Checkpoint started at step {step + 1} and in progress...")
        damaged = shutil.copytree(source, source.with_name(f"checkpoint-{step + 2}"))
        with (damaged / "model.safetensors").open("r+b") as handle:
            handle.truncate(100)
        planted.extend([jit.name, damaged.name])

    # Periodic saves too: they are marked complete and leave the run's parameters as they were.
    run = submit(tmp_path, *FLAGS, "--save-steps=25", "--integration=none", settings="integrations: auto\n")
    preempt_at(run, [random.randrange(8, 20)], after_stop=plant)
    run.wait()
    aside = tmp_path / "trainer" / hf.SET_ASIDE
    assert sorted(p.name for p in aside.iterdir()) == sorted(planted)
    assert "checkpoint-is-incomplete.txt" in (aside / planted[0] / "reason.txt").read_text()
    assert "model.safetensors has 100 bytes" in (aside / planted[1] / "reason.txt").read_text()
    names = [p.name for _, p in hf.checkpoints(tmp_path / "trainer")]
    # Every 25 steps and the last (save_total_limit=2 keeps the newest two).
    assert names == [f"checkpoint-{STEPS}", "checkpoint-50"], names
    assert all(hf.checkpoint_problem(tmp_path / "trainer" / name) is None for name in names)
    assert run.result()["sha256"] == reference.result()["sha256"], run.stops
    assert_each_step_once(run)


def test_in_a_search_trainers_eval_loss_goes_to_the_study_and_its_prune_stops_the_run(
    tmp_path: Path, example: ModuleType, monkeypatch: pytest.MonkeyPatch, patched_trainer: None
) -> None:
    """What Trainer logs (on_log) is the trial's report; the pruner's verdict asks the stop every
    rank agrees on, and the run ends as a stop does, its trial record saying pruned."""
    optuna = pytest.importorskip("optuna")
    from slurmddp.experiment import sweep as sweeps
    from slurmddp.job.script import report
    from slurmddp.rundir.config import write_config
    from slurmddp.rundir.manifest import ElementEntry, SweepManifest
    from slurmddp.rundir.trial import TrialRecord
    from slurmddp.search import study as studies
    from slurmddp.search import trial

    spec = sweeps.parse(
        {
            "search": {
                "trials": 2,
                "params": {"lr": "choice(0.1, 0.2)"},
                "pruner": {"median": {"n_startup_trials": 1}},
            },
            "metric": "eval_loss",
            "mode": "min",
        },
        ("train", "sweep"),
        {"lr": 0.1},
    )
    assert spec.search is not None
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    ref = studies.StudyRef.of(spec.search, sweep_dir, "hf", "eval_loss", "min")
    studies.create(ref)
    elements = [ElementEntry(i, f"00{i}-trial", {}) for i in range(2)]
    SweepManifest(
        name="hf", metric="eval_loss", mode="min", elements=elements, search=ref.to_manifest()
    ).write(sweep_dir)
    # Trial 0 ended with a loss no Trainer here comes near: trial 1 is worse than the median at once.
    first = studies.load(ref).ask(fixed_distributions=studies.distributions(spec.search))
    first.report(0.0, 5)
    studies.load(ref).tell(first, 0.0)
    run_dir = sweep_dir / "001-trial"
    run_dir.mkdir()
    write_config(run_dir, {"train": {"lr": 0.1}})
    trial.claim(sweep_dir, run_dir, 1)
    monkeypatch.setenv(report.RUN_DIR_ENV, str(run_dir))
    monkeypatch.setattr(report, "_reporter", None)
    monkeypatch.setattr(stop, "_asked", None)
    monkeypatch.setattr(stop, "should_stop", lambda: stop._asked is not None)
    with pytest.raises(StopForRequeue):
        tiny_trainer(example, tmp_path / "out", [hf.SlurmddpCallback()], evaluate=True).train()
    reported = studies.load(ref).trials[1].intermediate_values
    assert list(reported) == [5] and reported[5] > 0.0  # the first epoch's eval_loss, once
    record = TrialRecord.read(run_dir)
    assert record is not None and record.state == "pruned" and record.step == 5
    assert (tmp_path / "out" / "checkpoint-6").is_dir()  # saved at the next step, as a stop saves
    assert studies.load(ref).trials[1].state == optuna.trial.TrialState.RUNNING  # told at the run's end
