"""The `sweep:` section of an experiment -> the list of override sets, one per array element.

    sweep:
      grid: {lr: [0.1, 0.01], train.width: [256, 512]}     # cartesian product, in key order
      list: [{lr: 0.1, seed: 1}, {lr: 0.01, seed: 2}]     # explicit sets
      random:                                               # seeded sampling
        trials: 20
        seed: 0
        params: {lr: {log_uniform: [1.0e-4, 0.1]}, width: {choice: [256, 512]},
                 dropout: {uniform: [0, 0.5]}, layers: {int: [2, 8]}}
      search:                                               # Optuna: trials that learn (search.py)
        trials: 12
        params: {lr: {log_uniform: [1.0e-4, 0.1]}, width: "choice(256, 512)"}
      max_parallel: 4          # elements running at once (Slurm's %N); default: no limit
      metric: loss             # what status and results show and sort by (a search optimizes it)
      mode: min
      then: evaluate.yaml      # submitted once the sweep ended, with the best element's values

Exactly one of grid, list, random and search; a parameter's values are written as space.py says.
Pure: keys are normalized and checked here against the experiment's `train:` keys; the
elements' full configs are validated by config.load_sweep.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import random
from dataclasses import dataclass, field
from typing import Any

from slurmddp.errors import ConfigError
from slurmddp.experiment import search as searches
from slurmddp.experiment import space

KINDS = ("grid", "list", "random", "search")
SETTINGS = ("max_parallel", "metric", "mode", "then")
# What one array shares: a single batch script (resources, time, signal, srun's MPI plugin, the
# folder of the in-memory snapshots it removes at the end) and a single job name and output
# directory. Everything else travels per element in its pickle and config.yaml.
FIXED_PER_ARRAY = (
    "name",
    "profile",
    "executor",
    "output_dir",
    "output_mode",
    "resources",
    "requeue.signal",
    "requeue.signal_lead_s",
    "requeue.resident_launcher",
    "dist.launcher",
    "dist.srun_mpi",
    "checkpoint.snapshot_dir",
)


@dataclass(frozen=True)
class Spec:
    """A parsed sweep section."""

    kind: str
    elements: tuple[dict[str, Any], ...]
    """One {full.key: value} mapping per element, in index order."""
    max_parallel: int | None = None
    metric: str | None = None
    mode: str = "min"
    keys: tuple[str, ...] = field(default=())
    """The keys that vary, in the order the user wrote them."""
    search: searches.Search | None = None
    """A `search:` sweep's settings; its elements are then empty: each trial's parameters are
    chosen when it starts."""
    then: str | None = None
    """An experiment file to submit once the sweep ended, with the best element's values and its
    run directory as overrides (load.py resolves it beside the experiment)."""


def parse(section: Any, sections: tuple[str, ...], train: dict[str, Any]) -> Spec:
    """Parse the `sweep:` mapping; `sections` are the experiment's top-level keys and `train` its
    train section, used to resolve bare keys (`lr` -> `train.lr`) as overrides do."""
    if not isinstance(section, dict):
        raise ConfigError("sweep: must be a mapping with one of grid, list, random or search")
    unknown = [key for key in section if key not in (*KINDS, *SETTINGS)]
    if unknown:
        raise ConfigError(_unknown(unknown[0]))
    kinds = [kind for kind in KINDS if kind in section]
    if len(kinds) != 1:
        found = " and ".join(kinds) if kinds else "none"
        raise ConfigError(f"sweep: give exactly one of grid, list, random or search (found {found})")
    kind = kinds[0]
    body = section[kind]
    search = None
    if kind == "grid":
        elements = _grid(body, sections, train)
    elif kind == "list":
        elements = _list(body, sections, train)
    elif kind == "random":
        elements = _random(body, sections, train)
    else:
        search = searches.parse(body, train, lambda key, where: full_key(key, sections, train, where))
        _needs_objective(section)
        elements = [{} for _ in range(search.trials)]
    return Spec(
        kind=kind,
        elements=tuple(elements),
        max_parallel=_max_parallel(section.get("max_parallel")),
        metric=_metric(section.get("metric")),
        mode=_mode(section.get("mode", "min")),
        keys=tuple(dict.fromkeys(key for element in elements for key in element))
        if search is None
        else tuple(p.key for p in search.params),
        search=search,
        then=_then(section.get("then"), section.get("metric")),
    )


def _then(value: Any, metric: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.endswith((".yaml", ".yml")):
        raise ConfigError(
            f"sweep.then: the experiment file to submit once the sweep ended, as `then: evaluate.yaml`; "
            f"got {value!r}"
        )
    if metric is None:
        raise ConfigError(
            "sweep.then: needs sweep.metric and sweep.mode, by which the best element is chosen"
        )
    return value


def _unknown(key: Any) -> str:
    if key == "method":
        # W&B's sweep configuration (method: grid | random | bayes).
        return (
            "sweep: 'method' is W&B's; here the kind is the key: grid, list, random, or, for "
            "Bayesian optimization (TPE) with pruning, `search: {trials: 12, sampler: tpe, params: "
            "{lr: {log_uniform: [1.0e-4, 0.1]}}}` beside `metric:` and `mode:`"
        )
    near = difflib.get_close_matches(str(key), [*KINDS, *SETTINGS], n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"sweep: unknown key {key!r}{hint}; known: {', '.join((*KINDS, *SETTINGS))}"


def _needs_objective(section: dict[str, Any]) -> None:
    """A search optimizes one logged value in one direction: neither has a default."""
    for key, example in (("metric", "metric: val_loss"), ("mode", "mode: min")):
        if section.get(key) is None:
            raise ConfigError(
                f"sweep.{key}: a search needs it: the value the run logs (ctx.log) that the sampler "
                f"optimizes and the pruner is fed, and whether less or more is better; write "
                f"`{example}` beside search:"
            )


def full_key(key: Any, sections: tuple[str, ...], train: dict[str, Any], where: str) -> str:
    """`lr` -> `train.lr` when train has it (the override rule); refuses what an array cannot vary."""
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{where}: {key!r} is not a config key like 'lr' or 'train.lr'")
    head = key.split(".")[0]
    if head not in sections:
        if head not in train:
            near = difflib.get_close_matches(head, [*sections, *train], n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(
                f"{where}: unknown key {key!r}{hint}; bare keys must already exist under train:, "
                f"others start with one of {', '.join(sections)}"
            )
        key = f"train.{key}"
    for fixed in FIXED_PER_ARRAY:
        if key == fixed or key.startswith(f"{fixed}."):
            raise ConfigError(
                f"{where}: {key!r} cannot vary within a sweep: all elements of one Slurm array share "
                f"its batch script ({', '.join(FIXED_PER_ARRAY)}); submit one experiment per value"
            )
    return str(key)


def _normalize(raw: Any, sections: tuple[str, ...], train: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: must be a non-empty mapping of keys to values")
    out: dict[str, Any] = {}
    written: dict[str, Any] = {}  # each full key as the file wrote it
    for key, value in raw.items():
        full = full_key(key, sections, train, where)
        for other in out:
            if other == full or other.startswith(f"{full}.") or full.startswith(f"{other}."):
                raise ConfigError(
                    f"{where}: {key!r} and {written[other]!r} set the same setting ({full}); keep one of them"
                )
        out[full], written[full] = value, key
    return out


def _grid(body: Any, sections: tuple[str, ...], train: dict[str, Any]) -> list[dict[str, Any]]:
    axes = _normalize(body, sections, train, "sweep.grid")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(
                f"sweep.grid.{key}: needs a non-empty list of values, got {values!r} "
                f"(write {key}: [{values!r}] for a single value)"
            )
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(axes[key] for key in keys))]


def _list(body: Any, sections: tuple[str, ...], train: dict[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(body, list) or not body:
        raise ConfigError("sweep.list: needs a non-empty list of mappings, e.g. [{lr: 0.1}, {lr: 0.01}]")
    elements = [_normalize(item, sections, train, f"sweep.list[{i}]") for i, item in enumerate(body)]
    seen: dict[str, int] = {}
    for i, element in enumerate(elements):
        key = canonical(element)
        if key in seen:
            raise ConfigError(f"sweep.list[{i}]: the same overrides as sweep.list[{seen[key]}]; drop one")
        seen[key] = i
    return elements


def _random(body: Any, sections: tuple[str, ...], train: dict[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(body, dict):
        raise ConfigError("sweep.random: must be a mapping with trials, params and optionally seed")
    unknown = [key for key in body if key not in ("trials", "seed", "params")]
    if unknown:
        raise ConfigError(f"sweep.random: unknown key {unknown[0]!r}; known: trials, seed, params")
    trials = body.get("trials")
    if trials is None:
        raise ConfigError("sweep.random: needs trials, the number of elements to sample (e.g. trials: 20)")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ConfigError(f"sweep.random.trials: must be a positive integer, got {trials!r}")
    seed = body.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"sweep.random.seed: must be an integer, got {seed!r}")
    params = _normalize(body.get("params"), sections, train, "sweep.random.params")
    drawn = [space.parse(key, spec, f"sweep.random.params.{key}") for key, spec in params.items()]
    rng = random.Random(seed)
    return [{param.key: param.sample(rng) for param in drawn} for _ in range(trials)]


def _max_parallel(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"sweep.max_parallel: must be a positive integer, got {value!r}")
    return value


def _metric(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"sweep.metric: must be the name of a logged metric, got {value!r}")
    return value


def _mode(value: Any) -> str:
    if value not in ("min", "max"):
        raise ConfigError(f"sweep.mode: must be min or max, got {value!r}")
    return str(value)


def canonical(overrides: dict[str, Any]) -> str:
    return json.dumps(overrides, sort_keys=True, separators=(",", ":"), default=str)


def element_dir(index: int, overrides: dict[str, Any], count: int) -> str:
    """`0007-3fa2b1`: the index (zero-padded so names sort) and a short hash of the overrides."""
    width = max(3, len(str(count - 1)))
    digest = hashlib.sha256(canonical(overrides).encode()).hexdigest()[:6]
    return f"{index:0{width}d}-{digest}"


def describe(overrides: dict[str, Any]) -> str:
    """`lr=0.1 width=256`: train.* keys shown bare, as the user writes them."""
    return " ".join(f"{key.removeprefix('train.')}={_short(value)}" for key, value in overrides.items())


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if not isinstance(value, str) else value
