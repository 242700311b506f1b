"""Sweep specs -> elements, validated before anything is submitted: grid, list and random specs, the
errors that name the problem, and each element checked as a whole experiment."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_sweep

from slurmddp.errors import ConfigError
from slurmddp.experiment import sweep as sweeps
from slurmddp.experiment.load import expand, load_experiment

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
        ({"grid": {"lr": [1], "train.lr": [2]}}, "'train.lr' and 'lr' set the same setting (train.lr)"),
        ({"grid": {"train": [{}], "lr": [2]}}, "set the same setting"),
        ({"grid": {"resources.nodes": [1, 2]}}, "cannot vary within a sweep"),
        ({"grid": {"name": ["a", "b"]}}, "cannot vary within a sweep"),
        ({"list": [{"dist.launcher": "mpi"}]}, "cannot vary within a sweep"),
        (
            {"grid": {"lr": [1]}, "list": [{"lr": 1}]},
            "exactly one of grid, list, random or search (found grid and list)",
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
    # A setting's dotted name under grid: is one key (it once became {train: {lr: ...}}, which
    # clashed with the file's own train.lr).
    dotted = load_experiment(exp, ["sweep.grid.train.lr=[0.3, 0.4, 0.5]"]).sweep
    assert dotted is not None and len(dotted.elements) == 3
    # A mistake in a sweep override is the override's, not the file's.
    with pytest.raises(ConfigError, match=r"^override 'sweep.max_parallel=x': sweep.max_parallel: must be"):
        load_experiment(exp, ["sweep.grid.width=[1, 2]", "sweep.max_parallel=x"])
    broken = write_sweep(tmp_path, "{grid: {lr: [0.1]}, max_parallel: 0}")
    with pytest.raises(ConfigError, match=r"exp.yaml: sweep.max_parallel: must be"):
        load_experiment(broken, ["sweep.grid.width=[1, 2]"])


def test_docs_list_every_key_a_sweep_cannot_vary() -> None:
    runs = (Path(__file__).resolve().parents[2] / "docs" / "runs.md").read_text()
    listed = runs[runs.index("## Sweeps") :].split("\n## ")[0]
    missing = [key for key in sweeps.FIXED_PER_ARRAY if f"`{key}" not in listed]
    assert missing == [], f"docs/runs.md does not list {missing} among the keys a sweep cannot vary"
