"""The `search:` kind of sweep as parsed from the experiment: the parameter grammar shared with
`random:` (and Hydra's Optuna-sweeper strings), the settings, and every mistake named with its key."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from slurmddp.errors import ConfigError
from slurmddp.experiment import space, sweep
from slurmddp.experiment.search import Search

SECTIONS = ("train", "resources", "checkpoint", "sweep")
TRAIN = {"lr": 0.05, "hidden": 256, "dropout": 0.1, "opt": {"beta": 0.9}}


def parse(section: dict[str, Any]) -> sweep.Spec:
    return sweep.parse(section, SECTIONS, TRAIN)


def search(params: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {"search": {"trials": 6, "params": params, **settings}, "metric": "val_loss", "mode": "min"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("choice(32, 64)", space.Param("train.x", "categorical", choices=(32, 64))),
        ("choice(adam, sgd)", space.Param("train.x", "categorical", choices=("adam", "sgd"))),
        ("interval(0, 1)", space.Param("train.x", "float", 0.0, 1.0)),
        ("int(interval(2, 8))", space.Param("train.x", "int", 2, 8)),
        ("tag(log, interval(1e-4, 1))", space.Param("train.x", "float", 1e-4, 1.0, log=True)),
        ("tag(log, int(interval(8, 512)))", space.Param("train.x", "int", 8, 512, log=True)),
        # Python's and Hydra's range: the stop is left out.
        ("range(1, 9, step=2)", space.Param("train.x", "int", 1, 7, step=2)),
        ("range(1, 10, 2)", space.Param("train.x", "int", 1, 9, step=2)),
        ("range(0.1, 1.0, step=0.1)", space.Param("train.x", "float", 0.1, 0.9, step=0.1)),
        ("choice(-1, true, null)", space.Param("train.x", "categorical", choices=(-1, True, None))),
    ],
)
def test_hydra_sweep_strings_carry_over(text: str, expected: space.Param) -> None:
    assert space.parse("train.x", text, "where") == expected


def test_the_yaml_grammar_and_a_grid_of_values() -> None:
    assert space.parse("train.x", {"log_uniform": [1e-3, 1]}, "w") == space.Param(
        "train.x", "float", 1e-3, 1.0, log=True
    )
    assert space.parse("train.x", {"int": [2, 4]}, "w").values() == [2, 3, 4]
    assert space.parse("train.x", "range(0.1, 1.0, step=0.1)", "w").values() == [
        0.1,
        0.2,
        0.3,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
    ]
    assert space.parse("train.x", {"uniform": [0, 1]}, "w").values() is None


def test_random_draws_what_it_drew_before_the_grammar_was_shared() -> None:
    """Sweeps submitted before keep their element directories (named by their values) on resubmit."""
    rng, draws = random.Random(3), []
    for _ in range(5):
        draws.append(
            {
                "train.lr": math.exp(rng.uniform(math.log(1e-4), math.log(0.1))),
                "train.hidden": [64, 128][rng.randrange(2)],
                "train.dropout": rng.uniform(0, 0.5),
                "train.opt.beta": rng.randint(1, 9),
            }
        )
    spec = parse(
        {
            "random": {
                "trials": 5,
                "seed": 3,
                "params": {
                    "lr": {"log_uniform": [1e-4, 0.1]},
                    "hidden": {"choice": [64, 128]},
                    "dropout": {"uniform": [0, 0.5]},
                    "opt.beta": {"int": [1, 9]},
                },
            }
        }
    )
    assert list(spec.elements) == draws


def test_a_search_has_its_trials_as_elements_and_its_settings() -> None:
    spec = parse(
        search(
            {"lr": "tag(log, interval(1e-4, 1))", "opt.beta": {"uniform": [0.8, 0.99]}},
            sampler={"tpe": {"n_startup_trials": 2}},
            pruner="median",
            seed=7,
        )
    )
    assert spec.kind == "search" and spec.elements == ({},) * 6
    assert spec.keys == ("train.lr", "train.opt.beta")
    found = spec.search
    assert found is not None
    assert (found.sampler, found.sampler_options, found.pruner, found.seed) == (
        "tpe",
        {"n_startup_trials": 2},
        "median",
        7,
    )
    assert Search.from_json(found.to_json()) == found


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (search({"lr": {"uniform": [0, 1]}}, sampler="bayes"), "sweep.search.sampler: unknown 'bayes'"),
        (search({"lr": {"uniform": [0, 1]}}, sampler="tpee"), "(did you mean 'tpe'?)"),
        (
            search({"lr": {"uniform": [0, 1]}}, pruner="ashaa"),
            "sweep.search.pruner: unknown 'ashaa' (did you mean 'asha'?)",
        ),
        (search({"lr": {"normal": [0, 1]}}), "sweep.search.params.lr: must be one of {choice"),
        (search({"lr": "interval(1, 0)"}), "interval(low, high) takes two numbers, low < high"),
        (search({"lr": "tag(lin, interval(0, 1))"}), "tag(...) takes `log`"),
        (search({"width": {"int": [1, 4]}}), "sweep.search.params: unknown key 'width'"),
        (search({"train.width": {"int": [1, 4]}}), "'train.width' is not in the experiment's train: section"),
        (search({"checkpoint.every_steps": {"int": [1, 4]}}), "is not a train: key"),
        (search({"lr": {"uniform": [0, 1]}}, sampler="grid"), "the grid sampler walks every value"),
        (
            {**search({"hidden": "choice(64, 128)"}, sampler="grid")},
            "sweep.search.trials: 6, but the grid has 2 points",
        ),
        (
            {"search": {"trials": 6, "params": {"lr": "interval(0, 1)"}}, "mode": "min"},
            "sweep.metric: a search needs it",
        ),
        (
            {"search": {"trials": 6, "params": {"lr": "interval(0, 1)"}}, "metric": "val_loss"},
            "sweep.mode: a search needs it",
        ),
        (
            {**search({"lr": "interval(0, 1)"}), "search": {"params": {"lr": "interval(0, 1)"}}},
            "sweep.search.trials",
        ),
        (search({"lr": "interval(0, 1)"}, n_trials=3), "unknown key 'n_trials'"),
        (search({"lr": "interval(0, 1)"}, storage=""), "sweep.search.storage"),
        ({"method": "bayes", "metric": "loss"}, "'method' is W&B's"),
    ],
)
def test_bad_searches_name_the_key_and_the_fix(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(section)
    assert message in str(error.value)
