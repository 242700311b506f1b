"""The `search:` kind of sweep: trials whose parameters an Optuna sampler chooses as each starts.

    sweep:
      search:
        trials: 12
        sampler: tpe            # tpe, random, cmaes, qmc, gp, grid; or {tpe: {n_startup_trials: 4}}
        pruner: asha            # asha, hyperband, median, percentile, none; or {median: {n_warmup_steps: 50}}
        seed: 0
        storage: null           # default: SWEEP_DIR/study.journal; or sqlite:///..., postgresql://...
        params: {lr: {log_uniform: [1.0e-4, 1.0]}, hidden: "choice(64, 128, 256)"}
      max_parallel: 2
      metric: val_loss
      mode: min

Pure: names and shapes are checked here; an option's name is checked against Optuna's own class
where the study is made (search/study.py), since Optuna is not imported on this side.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any

from slurmddp.errors import ConfigError
from slurmddp.experiment import space
from slurmddp.experiment.space import Param

SAMPLERS = ("tpe", "random", "cmaes", "qmc", "gp", "grid")
PRUNERS = ("asha", "hyperband", "median", "percentile", "none")
KEYS = ("trials", "sampler", "pruner", "seed", "storage", "params")
DEFAULT_STORAGE = "study.journal"
"""Optuna's JournalStorage file in the sweep directory: no server, made for shared file systems."""


@dataclass(frozen=True)
class Search:
    """A parsed `sweep.search` section."""

    trials: int
    params: tuple[Param, ...]
    sampler: str = "tpe"
    sampler_options: dict[str, Any] = field(default_factory=dict)
    pruner: str = "asha"
    pruner_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    storage: str | None = None
    """An RDB URL or a journal file's path; None: DEFAULT_STORAGE in the sweep directory."""

    def to_json(self) -> dict[str, Any]:
        return {
            "trials": self.trials,
            "params": [p.to_json() for p in self.params],
            "sampler": self.sampler,
            "sampler_options": self.sampler_options,
            "pruner": self.pruner,
            "pruner_options": self.pruner_options,
            "seed": self.seed,
            "storage": self.storage,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Search:
        return cls(
            trials=int(data["trials"]),
            params=tuple(Param.from_json(p) for p in data["params"]),
            sampler=str(data.get("sampler", "tpe")),
            sampler_options=dict(data.get("sampler_options") or {}),
            pruner=str(data.get("pruner", "asha")),
            pruner_options=dict(data.get("pruner_options") or {}),
            seed=int(data.get("seed", 0)),
            storage=data.get("storage"),
        )


def parse(body: Any, train: dict[str, Any], full_key: Any) -> Search:
    """The `sweep.search` mapping; `full_key(key, where)` resolves `lr` to `train.lr` as the
    other kinds do."""
    where = "sweep.search"
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: must be a mapping with trials and params (and sampler, pruner, seed)")
    unknown = [key for key in body if key not in KEYS]
    if unknown:
        near = difflib.get_close_matches(str(unknown[0]), KEYS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}{hint}; known: {', '.join(KEYS)}")
    trials = body.get("trials")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ConfigError(f"{where}.trials: needs a positive integer, the number of trials (got {trials!r})")
    seed = body.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"{where}.seed: must be an integer, got {seed!r}")
    sampler, sampler_options = _choice(body.get("sampler", "tpe"), SAMPLERS, f"{where}.sampler")
    pruner, pruner_options = _choice(body.get("pruner", "asha"), PRUNERS, f"{where}.pruner")
    storage = body.get("storage")
    if storage is not None and (not isinstance(storage, str) or not storage.strip()):
        raise ConfigError(
            f"{where}.storage: an RDB URL (sqlite:///study.db, postgresql://...) or a journal file's "
            f"path; got {storage!r}"
        )
    params = _params(body.get("params"), train, full_key)
    search = Search(trials, params, sampler, sampler_options, pruner, pruner_options, seed, storage)
    if sampler == "grid":
        _check_grid(search)
    return search


def _choice(value: Any, names: tuple[str, ...], where: str) -> tuple[str, dict[str, Any]]:
    """`tpe`, or `{tpe: {option: value}}` -> (name, options)."""
    options: Any = {}
    if isinstance(value, dict) and len(value) == 1:
        value, options = next(iter(value.items()))
        options = {} if options is None else options
    if not isinstance(value, str) or value not in names:
        near = difflib.get_close_matches(str(value), names, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{where}: unknown {value!r}{hint}; Optuna's: {', '.join(names)}")
    if not isinstance(options, dict) or not all(isinstance(key, str) for key in options):
        raise ConfigError(
            f"{where}.{value}: options are a mapping, as {{{value}: {{option: value}}}}; got {options!r}"
        )
    return value, dict(options)


def _params(raw: Any, train: dict[str, Any], full_key: Any) -> tuple[Param, ...]:
    where = "sweep.search.params"
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(
            f"{where}: needs a mapping of train: keys to their values, as "
            "{lr: {log_uniform: [1.0e-4, 1]}}"
        )
    params: list[Param] = []
    for key, spec in raw.items():
        full = full_key(key, where)
        if not full.startswith("train."):
            raise ConfigError(
                f"{where}: {key!r} is not a train: key; a search chooses a trial's values when the "
                "trial starts, inside its job, where train: is what it may change (grid, list and "
                "random vary the other sections)"
            )
        node: Any = train
        for part in full.split(".")[1:]:
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(
                    f"{where}: {key!r} is not in the experiment's train: section; add it there with "
                    "its default (the value a run without the search uses)"
                )
            node = node[part]
        if any(p.key == full for p in params):
            raise ConfigError(f"{where}: {key!r} is given twice; keep one")
        params.append(space.parse(full, spec, f"{where}.{key}"))
    return tuple(params)


def _check_grid(search: Search) -> None:
    sizes = []
    for param in search.params:
        values = param.values()
        if values is None:
            name = param.key.removeprefix("train.")
            raise ConfigError(
                f"sweep.search.params.{name}: the grid sampler walks every value, and this one has "
                f"no finite set (a {'log ' if param.log else ''}continuous range); give it "
                "{choice: [...]}, {int: [low, high]} or range(start, stop, step=s), or use "
                "sampler: tpe"
            )
        sizes.append(len(values))
    points = math.prod(sizes)
    if search.trials > points:
        raise ConfigError(
            f"sweep.search.trials: {search.trials}, but the grid has {points} points; the grid "
            f"sampler would run some twice: write trials: {points}"
        )


def element_dir(index: int, count: int) -> str:
    """`0003-trial`: a trial's parameters are not known when its directory is made."""
    return f"{index:0{max(3, len(str(count - 1)))}d}-trial"
