"""`load_experiment`: YAML + cluster profile + overrides -> a validated Experiment; `expand`: a
sweep's elements, each validated as a whole experiment.

Layers, later ones winning: schema defaults < cluster profile (configs/NAME.yaml) < exp.yaml <
`key=value` overrides. Each layer is merged on its own so an error names the file or the override
that caused it. `${oc.env:VAR}` interpolations are resolved here, on the submitting side, so the run
directory records the values the job really used.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import shlex
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from slurmddp import yamlio
from slurmddp.errors import ConfigError
from slurmddp.experiment import sweep as sweeps
from slurmddp.experiment.schema import Experiment, not_one_of
from slurmddp.experiment.search import element_dir as search_element_dir

PROFILE_PATH_ENV = "SLURMDDP_PROFILE_PATH"


@dataclass(frozen=True)
class Loaded:
    """A validated experiment plus the plain resolved mapping saved in the run directory."""

    experiment: Experiment
    resolved: dict[str, Any]
    source: Path
    overrides: tuple[str, ...]
    sweep: sweeps.Spec | None = None
    """The experiment's `sweep:` section; `experiment` is then the config the elements start from."""
    merged: DictConfig | None = field(default=None, repr=False, compare=False)
    """The merged config before resolution, which sweep elements are applied to."""


@dataclass(frozen=True)
class SweepElement:
    """One element of a sweep: its stable index, its overrides, its run directory name, its config."""

    index: int
    overrides: dict[str, Any]
    dir_name: str
    loaded: Loaded


_SECTIONS = tuple(f.name for f in dataclasses.fields(Experiment))


def load_experiment(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Loaded:
    """Load, merge and validate an experiment; every error is a ConfigError naming file and key.

    A `sweep:` section is parsed into `Loaded.sweep` (its elements come from `expand`); overrides
    `sweep.KEY=VALUE` change it and `sweep=null` drops it.
    """
    source = Path(path)
    if source.is_dir():
        inside = sorted(p.name for p in source.glob("*.y*ml"))
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        raise ConfigError(f"{source}: is a directory; name the experiment's YAML file in it{hint}")
    if not source.is_file():
        raise ConfigError(f"{source}: no such experiment file")
    exp_layer = _read_experiment(source, overrides)
    sweep_section = exp_layer.pop("sweep", None)
    plain = [text for text in overrides if text.partition("=")[0].split(".")[0] != "sweep"]
    # The sweep section after the file and after each sweep override: a mistake is blamed on the
    # first of them after which the section is refused.
    sweep_layers = [(sweep_section, str(source))]
    for text in overrides:
        if text not in plain:
            sweep_section = _override_sweep(sweep_section, text, source)
            sweep_layers.append((sweep_section, f"override {text!r}"))
    merged = OmegaConf.structured(Experiment)
    # Each layer's merged config, with where it came from: a value that fails the schema's checks
    # is blamed on the first layer after which the same check fails.
    layers: list[tuple[DictConfig, str, str | None]] = []
    profile, profile_from = exp_layer.get("profile"), str(source)
    override_layers = [(_parse_override(text, exp_layer), text) for text in plain]
    for layer, text in override_layers:
        if "profile" in layer:
            profile, profile_from = layer["profile"], f"override {text!r}"
    if profile is not None:
        if isinstance(profile, (dict, list, bool)):
            raise ConfigError(
                f"{profile_from}: profile: {profile!r} is neither a profile name nor a path to a YAML file"
            )
        profile_path = find_profile(str(profile), source.parent)
        merged = _merge(merged, _read_yaml(profile_path), str(profile_path))
        layers.append((merged, str(profile_path), None))
    if "name" not in exp_layer:
        exp_layer["name"] = source.stem
    # Every mistake of the file and the overrides at once: a layer that fails is left out and
    # the ones after it are merged still.
    mistakes: list[str] = []
    for layer, where, key in [
        (exp_layer, str(source), None),
        *((layer, f"override {text!r}", text.partition("=")[0]) for layer, text in override_layers),
    ]:
        try:
            merged = _merge(merged, layer, where)
        except Mistakes as exc:
            mistakes += exc.mistakes
            continue
        layers.append((merged, where, key))
    if mistakes:
        raise ConfigError(_listed(mistakes))
    experiment, resolved = _finish_layers(layers)
    spec = None
    if sweep_section is not None:
        spec = _parsed_sweep(sweep_layers, resolved.get("train") or {})
        if spec.then is not None:
            spec = dataclasses.replace(spec, then=str(_then_experiment(source, spec.then)))
        for layer, text in override_layers:
            clash = set(_leaf_keys(layer)) & set(spec.keys)
            if clash:
                raise ConfigError(
                    f"override {text!r} sets {sorted(clash)[0]}, which the sweep varies; "
                    "drop the override or the sweep key"
                )
    return Loaded(experiment, resolved, source, tuple(overrides), spec, merged)


def _parsed_sweep(layers: list[tuple[Any, str]], train: dict[str, Any]) -> sweeps.Spec:
    """The last of the sweep section's `layers` parsed; a refusal names the file or the override
    after which the section is first refused for that reason."""
    try:
        return sweeps.parse(layers[-1][0], _SECTIONS, train)
    except ConfigError as exc:
        problem = str(exc)
    for section, where in layers:
        try:
            sweeps.parse(section, _SECTIONS, train)
        except ConfigError as exc:
            if str(exc) == problem:
                raise ConfigError(f"{where}: {problem}") from None
    raise ConfigError(f"{layers[-1][1]}: {problem}")


def _then_experiment(source: Path, then: str) -> Path:
    """`sweep.then`'s file, beside the experiment; loaded here, so that a mistake in it is found
    before the sweep is submitted, not after it ran."""
    path = (source.parent / then).resolve()
    if not path.is_file():
        raise ConfigError(f"{source}: sweep.then: no such experiment file {path}")
    try:
        load_experiment(path)
    except ConfigError as exc:
        raise ConfigError(f"{source}: sweep.then: {exc}") from None
    return path


def _read_experiment(source: Path, overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The experiment file's own layer; a Python script or an empty file is refused with the way
    to write an experiment."""
    if source.suffix == ".py":
        raise ConfigError(
            f"{source}: slurmddp takes an experiment YAML file, not a Python script; write one beside "
            f"it with the line `entrypoint: {source.name}` (a script run as torchrun would) and pass "
            "that file, or run `python -m slurmddp init` for a starter experiment"
        )
    exp_layer = _read_yaml(source)
    if not exp_layer and not overrides:
        raise ConfigError(
            f"{source}: the file is empty; an experiment needs at least its entrypoint, as in "
            "`entrypoint: train.py` (`python -m slurmddp init` writes a starter)"
        )
    return exp_layer


def expand(loaded: Loaded) -> list[SweepElement]:
    """The sweep's elements, each validated as a whole experiment; the first bad one is refused."""
    assert loaded.sweep is not None and loaded.merged is not None
    elements = loaded.sweep.elements
    base = loaded.merged
    # Elements that only change train.* need no schema validation (train is free-form) when
    # nothing outside train refers to it: then only train is resolved again. The full path costs
    # ~3 ms an element, most of a 1000-element submit.
    train_only_ok = not _interpolates_outside_train(base)
    out = []
    for index, overrides in enumerate(elements):
        where = f"{loaded.source}: sweep element {index} ({sweeps.describe(overrides)})"
        # Applied to the base in place and undone, not merged into a copy (another ~3 ms each).
        undo = []
        try:
            for key, value in overrides.items():
                undo.append((key, OmegaConf.select(base, key, default=_ABSENT)))
                OmegaConf.update(base, key, value, merge=False, force_add=True)
            if train_only_ok and all(key.startswith("train.") for key in overrides):
                raw_train = OmegaConf.to_container(base.train, resolve=True, throw_on_missing=True)
                assert isinstance(raw_train, dict)
                train = {str(key): value for key, value in raw_train.items()}
                experiment = dataclasses.replace(loaded.experiment, train=train)
                resolved = {**loaded.resolved, "train": train}
            else:
                experiment, resolved = _validated(base)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{where}: {_describe(exc)}") from None
        except ConfigError as exc:  # the schema's checks, train.global_batch's among them
            raise ConfigError(f"{where}: {exc}") from None
        finally:
            for key, previous in reversed(undo):
                _restore(base, key, previous)
        if loaded.sweep.search is not None:
            name = search_element_dir(index, len(elements))
        else:
            name = sweeps.element_dir(index, overrides, len(elements))
        text = override_texts(overrides)
        element_loaded = Loaded(experiment, resolved, loaded.source, (*loaded.overrides, *text))
        out.append(SweepElement(index, dict(overrides), name, element_loaded))
    return out


def override_texts(overrides: Mapping[str, Any]) -> tuple[str, ...]:
    """{full.key: value} -> the KEY=VALUE texts of a command line that set the same values."""
    return tuple(f"{key}={json.dumps(value)}" for key, value in overrides.items())


_ABSENT = object()


def _interpolates_outside_train(base: DictConfig) -> bool:
    raw = OmegaConf.to_container(base, resolve=False)
    assert isinstance(raw, dict)
    return "${" in json.dumps({key: value for key, value in raw.items() if key != "train"}, default=str)


def _restore(base: DictConfig, key: str, previous: Any) -> None:
    if previous is _ABSENT:
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(base, parent_key) if parent_key else base
        if isinstance(parent, DictConfig) and leaf in parent:
            del parent[leaf]
    else:
        OmegaConf.update(base, key, previous, merge=False)


def _finish_layers(layers: list[tuple[DictConfig, str, str | None]]) -> tuple[Experiment, dict[str, Any]]:
    """The last layer's experiment; an error is said as coming from the first layer (the profile,
    the experiment file, an override) after which the same check fails: an override's bad value
    is the override's, not the file's. Each layer comes with the key an override sets."""
    final, _, _ = layers[-1]
    try:
        return _validated(final)
    except ConfigError as exc:
        problem = str(exc)
    where, key = next((where, key) for state, where, key in layers if _problem(state) == problem)
    # `override 'resources.nodes=-1': resources.nodes: ...` would name the key twice.
    said = problem.removeprefix(f"{key}: ") if key else problem
    raise ConfigError(f"{where}: {said}")


def _problem(merged: DictConfig) -> str | None:
    try:
        _validated(merged)
    except ConfigError as exc:
        return str(exc)
    return None


def _validated(merged: DictConfig) -> tuple[Experiment, dict[str, Any]]:
    try:
        experiment = OmegaConf.to_object(merged)
        resolved = OmegaConf.to_container(merged, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(_describe(exc)) from None
    assert isinstance(experiment, Experiment) and isinstance(resolved, dict)
    return experiment, {str(k): v for k, v in resolved.items()}


def _override_sweep(section: Any, text: str, source: Path) -> Any:
    key, sep, raw = text.partition("=")
    if not sep:
        raise ConfigError(f"override {text!r}: expected key=value (for example sweep.max_parallel=4)")
    if section is None and key != "sweep":
        raise ConfigError(f"override {text!r}: {source} has no sweep: section to change")
    try:
        value = yamlio.load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: the value is not valid YAML: {exc}") from None
    if key == "sweep":
        return value
    if not isinstance(section, dict):
        raise ConfigError(f"{source}: sweep: must be a mapping with one of grid, list, random or search")
    node = section = dict(section)
    parts = key.split(".")[1:]
    while len(parts) > 1 and tuple(key.split(".")[1 : -len(parts)]) not in _SETTING_MAPS:
        part = parts.pop(0)
        child = node.get(part)
        node[part] = dict(child) if isinstance(child, dict) else {}
        node = node[part]
    name = ".".join(parts)
    if len(key.split(".")) > len(parts) + 1 and tuple(key.split(".")[1 : -len(parts)]) in _SETTING_MAPS:
        # Under grid:, random: and search.params: the rest is one setting's dotted name, which
        # replaces the file's entry for that setting however it was written (`lr` or `train.lr`).
        for written in [k for k in node if _setting(str(k)) == _setting(name)]:
            del node[written]
    node[name] = value
    return section


def _setting(key: str) -> str:
    """A sweep key's full name: a bare key is train's."""
    return key if key.split(".")[0] in _SECTIONS else f"train.{key}"


_SETTING_MAPS = {("grid",), ("random",), ("search", "params")}
"""The sweep section's mappings whose keys are settings (`train.lr`), not further sections."""


def _leaf_keys(layer: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in layer.items():
        full = f"{prefix}{key}"
        keys.extend(_leaf_keys(value, f"{full}.") if isinstance(value, dict) and value else [full])
    return keys


def find_profile(name: str, exp_dir: Path) -> Path:
    """A profile is a YAML path, or a name looked up in $SLURMDDP_PROFILE_PATH, EXP_DIR/configs,
    EXP_DIR/../configs and ./configs, in that order."""
    exp_dir = exp_dir.resolve()
    if name.endswith((".yaml", ".yml")):
        candidates = list(dict.fromkeys((Path(name).expanduser().resolve(), exp_dir / name)))
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        raise ConfigError(f"profile: no such file {name!r} (looked for {' and '.join(map(str, candidates))})")
    dirs = [Path(p).resolve() for p in os.environ.get(PROFILE_PATH_ENV, "").split(os.pathsep) if p]
    dirs += [exp_dir / "configs", exp_dir.parent / "configs", Path("configs").resolve()]
    dirs = list(dict.fromkeys(dirs))  # run from EXP_DIR, the last is the first again
    for folder in dirs:
        for suffix in (".yaml", ".yml"):
            candidate = folder / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
    known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.y*ml")})
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else (f"; known: {', '.join(known)}" if known else "")
    searched = ", ".join(str(d) for d in dirs)
    raise ConfigError(
        f"profile: no profile named {name!r} (looked for {name}.yaml in {searched}){hint}; put it in "
        f"one of them, name a YAML file (profile: path/to/{name}.yaml), or add its folder to "
        f"${PROFILE_PATH_ENV}"
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yamlio.load(path.read_text())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: malformed YAML: {exc.problem}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: malformed YAML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc}); check its permissions") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return _normalize(loaded)


_ENTRYPOINT_KINDS = ("function", "script", "module")


def _normalize(layer: dict[str, Any]) -> dict[str, Any]:
    """Accept `entrypoint: "pkg.mod:fn"`, `entrypoint: "train.py --lr 3"` and
    `entrypoint: "-m pkg.train --lr 3"` as shorthands."""
    entry = layer.get("entrypoint")
    if isinstance(entry, str):
        if re.fullmatch(r"[^:\s]+:[A-Za-z_]\w*", entry):
            layer["entrypoint"] = {**dict.fromkeys(_ENTRYPOINT_KINDS), "function": entry}
        else:
            words = shlex.split(entry)
            if not words:
                raise ConfigError("entrypoint: empty")
            if words[0] == "-m":
                if len(words) < 2:
                    raise ConfigError("entrypoint: '-m' needs a module name, as in '-m pkg.train --lr 3'")
                kind, target, args = "module", words[1], words[2:]
            else:
                kind, target, args = "script", words[0], words[1:]
            layer["entrypoint"] = {**dict.fromkeys(_ENTRYPOINT_KINDS), kind: target, "args": args}
    elif isinstance(entry, dict):
        # Setting one kind of entrypoint in a later layer replaces the other kinds from an earlier one.
        for kind in _ENTRYPOINT_KINDS:
            if entry.get(kind) is not None:
                for other in _ENTRYPOINT_KINDS:
                    entry.setdefault(other, None)
    return layer


def _parse_override(text: str, exp_layer: dict[str, Any]) -> dict[str, Any]:
    key, sep, _ = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r}: expected key=value (for example resources.nodes=2)")
    if key.startswith("+"):
        # Hydra's `+key=value` (add) and `++key=value` (add or set): here a plain override does both.
        plain = text.lstrip("+")
        raise ConfigError(
            f"override {text!r}: no '+' is needed: write {plain}: a key new under train: is added, "
            "one that exists is set (the other sections take only the keys of the schema)"
        )
    head = key.split(".")[0]
    if head not in _SECTIONS:
        train = exp_layer.get("train")
        if isinstance(train, dict) and head in train:
            # A bare `lr=0.1` means train.lr when the experiment has it: the common case in sweeps.
            text = f"train.{text}"
        else:
            near = difflib.get_close_matches(head, [*_SECTIONS, *(train or {})], n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(
                f"override {text!r}: unknown key {key!r}{hint}; top-level keys are {', '.join(_SECTIONS)}, "
                "and bare keys must already exist under train:"
            )
    key, _, raw = text.partition("=")
    try:
        value = yamlio.load(raw) if raw.strip() else raw
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: the value is not valid YAML: {exc}") from None
    if key.startswith("train."):
        value = _typed_as_the_file(text, key, value, exp_layer.get("train"))
    layer: dict[str, Any] = {}
    node = layer
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return _normalize(layer)


def _typed_as_the_file(text: str, key: str, value: Any, train: Any) -> Any:
    """An override of a train: key the experiment file gives a number or a flag takes that type
    (an int where it has a float: `lr=1` is 1.0); a value of another type is refused here, not
    at the first `<` in the job. A comma list is Hydra's multirun form, answered with the sweep."""
    existing = train
    for part in key.split(".")[1:]:
        if not isinstance(existing, dict) or part not in existing:
            return value
        existing = existing[part]
    if value is None:
        return value
    if isinstance(existing, bool):
        fits = isinstance(value, bool)
    elif isinstance(existing, int):
        fits = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(existing, float):
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if fits else value
    else:
        return value
    if fits:
        return value
    name = key.removeprefix("train.")
    if isinstance(value, str) and "," in value:
        items = ", ".join(item.strip() for item in value.split(","))
        raise ConfigError(
            f"override {text!r}: a comma list is Hydra's multirun; slurmddp sweeps with a sweep: "
            f"section in the experiment file, one Slurm array: `sweep: {{grid: {{{name}: [{items}]}}}}`"
        )
    kind = {bool: "true or false", int: "an integer", float: "a number"}[type(existing)]
    raise ConfigError(
        f"override {text!r}: train.{name} is {json.dumps(existing)} in the experiment; give {kind}"
    )


def _merge(base: DictConfig, layer: dict[str, Any], where: str) -> DictConfig:
    """`layer` merged onto `base`; the error names every key of `layer` that the merge refuses
    (OmegaConf stops at the first), each tried on its own."""
    try:
        merged = OmegaConf.merge(base, layer)
    except (OmegaConfBaseException, TypeError) as exc:
        each = [_merge_problem(base, alone) for alone in _one_leaf_each(layer)]
        found = [problem for problem in dict.fromkeys(each) if problem is not None]
        if not found:  # only the leaves together fail
            found = [_merge_problem(base, layer, exc) or str(exc)]
        raise Mistakes([f"{where}: {problem}" for problem in found]) from None
    assert isinstance(merged, DictConfig)
    return merged


def _merge_problem(base: DictConfig, layer: dict[str, Any], exc: BaseException | None = None) -> str | None:
    """Why `layer` does not merge onto `base` (None where it does), said by key. A value of the
    wrong shape for a section, a list or a mapping: OmegaConf 2.3 says so in its own terms
    ("Merge error: list is not a subclass of Resources"), or with a bare TypeError that names no
    key; say which key wanted what instead."""
    if exc is None:
        try:
            OmegaConf.merge(base, layer)
        except (OmegaConfBaseException, TypeError) as raised:
            exc = raised
        else:
            return None
    clash = _shape_clash(base, layer)
    if clash is None and isinstance(exc, OmegaConfBaseException):
        clash = _describe(exc)
    return clash or str(exc)


def _one_leaf_each(layer: dict[str, Any]) -> list[dict[str, Any]]:
    """`layer` split into layers of one leaf each (a value that is not a non-empty mapping)."""
    out: list[dict[str, Any]] = []
    for key, value in layer.items():
        if isinstance(value, dict) and value:
            out += [{key: leaf} for leaf in _one_leaf_each(value)]
        else:
            out.append({key: value})
    return out


class Mistakes(ConfigError):
    """What a layer's merge refused, a line each."""

    def __init__(self, mistakes: list[str]) -> None:
        super().__init__(_listed(mistakes))
        self.mistakes = mistakes


def _listed(mistakes: list[str]) -> str:
    """One mistake as it is; more as a count and a line each."""
    if len(mistakes) == 1:
        return mistakes[0]
    return f"{len(mistakes)} mistakes:\n" + "\n".join(f"  {mistake}" for mistake in mistakes)


def _shape_clash(base: DictConfig, layer: dict[str, Any], prefix: str = "") -> str | None:
    """The first key where `layer` gives a non-mapping to a mapping (a section included) or a
    non-list to a list of `base`, said as the key and what it expects."""
    for key, value in layer.items():
        node = base.get(key) if key in base else None
        full = f"{prefix}{key}"
        if value is None:
            continue
        if isinstance(node, ListConfig) and not isinstance(value, list):
            return f"{full}: expected a list, got {value!r}"
        if isinstance(node, DictConfig):
            if not isinstance(value, dict):
                return f"{full}: expected a mapping of keys to values, got {value!r}"
            found = _shape_clash(node, value, f"{full}.")
            if found:
                return found
    return None


def _describe(exc: OmegaConfBaseException) -> str:
    """OmegaConf's first message line, prefixed by the key it is about; a value outside a closed
    set is said as the schema's own checks say it, with the nearest choice."""
    key = getattr(exc, "full_key", None)
    choices = _choices(str(key)) if isinstance(exc, ValidationError) and key else None
    if choices is not None:
        return not_one_of(str(key), getattr(exc, "value", None), choices)
    message = str(exc).split("\n")[0].strip()
    return f"{key}: {message}" if key else message


def _choices(key: str) -> tuple[str, ...] | None:
    """The values a Literal-typed schema field admits, from its dotted key."""
    kind: Any = Experiment
    for part in key.split("."):
        if not dataclasses.is_dataclass(kind):
            return None
        hints = typing.get_type_hints(kind)
        if part not in hints:
            return None
        kind = hints[part]
    if typing.get_origin(kind) is typing.Literal:
        return tuple(str(value) for value in typing.get_args(kind))
    return None
