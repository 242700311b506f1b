"""The experiment schema and `load_experiment`: YAML + cluster profile + overrides -> Experiment.

Layers, later ones winning: schema defaults < cluster profile (configs/NAME.yaml) < exp.yaml <
`key=value` overrides. Each layer is merged on its own so an error names the file or the override
that caused it. `${oc.env:VAR}` interpolations are resolved here, on the submitting side, so the run
directory records the values the job really used.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slurmddp import nccl, yamlio
from slurmddp import sweep as sweeps
from slurmddp.errors import ConfigError
from slurmddp.slurmtime import parse_time

EXECUTORS = ("auto", "slurm", "local")
BACKENDS = ("auto", "nccl", "gloo")
LAUNCHERS = ("auto", "slurm", "mpi")
GPU_BINDINGS = ("node", "task")
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")
PROFILE_PATH_ENV = "SLURMDDP_PROFILE_PATH"

# A value that reaches an `#SBATCH` line must stay on that line: submitit quotes values with
# shlex.quote, which keeps a newline inside quotes, and sbatch reads the script line by line, so
# the text after the newline would run as a shell command.
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_SBATCH_KEY = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _one_line(key: str, value: str | None) -> None:
    if value is not None and _CONTROL_CHARS.search(value):
        raise ConfigError(f"{key}: {value!r} holds a newline or control character; Slurm values are one line")


def _at_least(key: str, value: float | None, low: float) -> None:
    if value is not None and value < low:
        raise ConfigError(f"{key}: must be >= {low}, got {value}")


def _one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        near = difflib.get_close_matches(value, choices, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}{hint}")


@dataclass(kw_only=True)
class Entrypoint:
    """What each rank runs: exactly one of `function` or `script`."""

    function: str | None = None
    """`package.module:function` or `path/to/file.py:function`, called with a RunContext on every rank."""
    script: str | None = None
    """A torchrun-style script, run unmodified on every rank with torchrun's environment variables."""
    args: list[str] = field(default_factory=list)
    """Command-line arguments for `script`."""

    def __post_init__(self) -> None:
        if self.function is not None and not re.fullmatch(r"[^:\s]+:[A-Za-z_]\w*", self.function):
            raise ConfigError(
                f"entrypoint.function: {self.function!r} is not of the form "
                "'package.module:function' or 'path/to/file.py:function'"
            )
        if self.args and self.script is None:
            raise ConfigError("entrypoint.args: only a script takes args; a function reads ctx.config")


@dataclass(kw_only=True)
class Resources:
    """What to ask Slurm for. One rank per GPU, one Slurm task per rank."""

    nodes: int = 1
    """Number of nodes."""
    gpus_per_node: int = 0
    """GPUs per node; the job then runs this many ranks per node. 0 means a CPU job."""
    tasks_per_node: int | None = None
    """Ranks per node. Defaults to gpus_per_node (or 1 for CPU jobs); must equal it for GPU jobs."""
    gpu_binding: str = "node"
    """`node`: --gpus-per-node, every task sees all the node's GPUs. `task`: --gpus-per-task=1."""
    cpus_per_task: int = 1
    """CPU cores per rank (also the rank's thread count)."""
    mem_gb: float | None = None
    """Memory per node in GB; None leaves Slurm's default."""
    time: str = "01:00:00"
    """Time limit in any Slurm format: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    """Nodes to avoid (a Slurm hostlist)."""
    comment: str | None = None
    sbatch: dict[str, Any] = field(default_factory=dict)
    """Any other sbatch option, as {long-option-name: value}; `true` for a flag."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run by the batch script before the ranks start (module load, source venv, ...)."""

    def __post_init__(self) -> None:
        _at_least("resources.nodes", self.nodes, 1)
        _at_least("resources.gpus_per_node", self.gpus_per_node, 0)
        _at_least("resources.tasks_per_node", self.tasks_per_node, 1)
        _at_least("resources.cpus_per_task", self.cpus_per_task, 1)
        if self.mem_gb is not None and self.mem_gb <= 0:
            raise ConfigError(f"resources.mem_gb: must be > 0, got {self.mem_gb}")
        _one_of("resources.gpu_binding", self.gpu_binding, GPU_BINDINGS)
        if self.gpus_per_node and self.tasks_per_node not in (None, self.gpus_per_node):
            raise ConfigError(
                f"resources.tasks_per_node: {self.tasks_per_node} ranks on {self.gpus_per_node} GPUs per "
                "node; slurmddp runs one rank per GPU: leave tasks_per_node unset or equal to gpus_per_node"
            )
        try:
            parse_time(self.time)
        except ValueError as exc:
            raise ConfigError(f"resources.time: {exc}") from None
        for key in ("partition", "account", "qos", "constraint", "exclude", "comment"):
            _one_line(f"resources.{key}", getattr(self, key))
        for key, value in self.sbatch.items():
            if not _SBATCH_KEY.match(key):
                raise ConfigError(
                    f"resources.sbatch: {key!r} is not an sbatch long option name (like 'mail-type')"
                )
            _one_line(f"resources.sbatch.{key}", str(value))

    @property
    def ranks_per_node(self) -> int:
        return self.tasks_per_node or self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(kw_only=True)
class Dist:
    """How the ranks find each other."""

    backend: str = "auto"
    """`auto` (nccl with GPUs, gloo without), `nccl` or `gloo`."""
    port: int | None = None
    """MASTER_PORT; by default derived from the job id so requeues agree and jobs sharing a node differ."""
    timeout_s: int = 600
    """Rendezvous and collective timeout: how long a rank waits for a dead peer before failing."""
    launcher: str = "auto"
    """Where rank, size and local rank come from: `slurm` (Slurm's task variables), `mpi` (mpi4py:
    under mpiexec/mpirun, or srun with an MPI plugin), or `auto` (MPI only when a rank runs under an
    MPI launcher whose world Slurm does not describe, e.g. mpiexec outside Slurm)."""
    srun_mpi: str = "pmi2"
    """`srun --mpi=` value for `launcher: mpi` on Slurm (pmi2 suits MPICH; see `srun --mpi=list`)."""

    def __post_init__(self) -> None:
        _one_of("dist.backend", self.backend, BACKENDS)
        _one_of("dist.launcher", self.launcher, LAUNCHERS)
        _one_line("dist.srun_mpi", self.srun_mpi)
        if self.launcher == "mpi" and importlib.util.find_spec("mpi4py") is None:
            raise ConfigError(
                "dist.launcher: mpi needs mpi4py, which this Python cannot import; "
                "install it (pip install 'slurmddp[mpi]') or use launcher: slurm"
            )
        if self.port is not None and not 1024 <= self.port <= 65535:
            raise ConfigError(f"dist.port: {self.port} is not a usable port (1024-65535)")
        _at_least("dist.timeout_s", self.timeout_s, 1)


@dataclass(kw_only=True)
class Checkpoint:
    """Checkpoints written by the training loop (ctx.loop) and where they go."""

    dir: str | None = None
    """Defaults to RUN_DIR/checkpoints."""
    every_steps: int = 0
    """Save every N steps (0: not by step count)."""
    every_minutes: float = 0
    """Save when this many minutes passed since the last save (0: not by time)."""
    keep_last: int = 2
    """Complete checkpoints kept; older ones are deleted once a newer one is complete."""
    async_save: bool = False
    """Write in a background thread; the loop only waits for the copy to CPU memory."""

    def __post_init__(self) -> None:
        _at_least("checkpoint.every_steps", self.every_steps, 0)
        _at_least("checkpoint.every_minutes", self.every_minutes, 0)
        _at_least("checkpoint.keep_last", self.keep_last, 1)


@dataclass(kw_only=True)
class Requeue:
    """What happens when the job is preempted, hits its time limit, or fails."""

    signal: str = "USR2"
    """The signal Slurm sends before the end (sbatch --signal); SIGTERM is handled too."""
    signal_lead_s: int = 120
    """Seconds before the time limit that the signal is sent; Slurm may send it up to 60 s earlier."""
    max_timeouts: int = 20
    """Requeues after hitting the time limit; -1 for no limit."""
    max_preemptions: int = -1
    """Requeues after a preemption; -1 (default) for no limit."""
    max_failures: int = 3
    """Requeues after a crash (a rank died or raised); a crash at the same step twice stops at once."""

    def __post_init__(self) -> None:
        _one_of("requeue.signal", self.signal, SIGNALS)
        _at_least("requeue.signal_lead_s", self.signal_lead_s, 10)
        for key in ("max_timeouts", "max_preemptions", "max_failures"):
            _at_least(f"requeue.{key}", getattr(self, key), -1)


@dataclass(kw_only=True)
class Fabric:
    """Network settings exported to every rank."""

    profile: str = "auto"
    """NCCL tuning profile: auto, infiniband, roce, efa, tcp, none."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables for every rank (NCCL_*, GLOO_*, ...); they win over anything derived."""

    def __post_init__(self) -> None:
        _one_of("fabric.profile", self.profile, nccl.PROFILES)
        for key in self.env:
            if not _ENV_NAME.match(key):
                raise ConfigError(f"fabric.env: {key!r} is not a valid environment variable name")


@dataclass(kw_only=True)
class Preflight:
    """Checks every rank runs right after the process group starts, so a broken or slow node fails
    the job in seconds, with its name, instead of hanging it until the dist timeout."""

    enabled: bool = True
    """Run the all-reduce check (the device check before it always runs)."""
    size_mb: float = 4
    """Size of the all-reduced tensor; a few MB keeps the check well under a second."""
    min_bus_gbps: float = 0
    """Fail below this all-reduce bus bandwidth, in Gb/s (nccl-tests' busbw, in bits); 0: no floor."""
    fail_on_host: str | None = None
    """Treat this host as broken, to see the failure path without a broken node (for tests)."""

    def __post_init__(self) -> None:
        if self.size_mb <= 0:
            raise ConfigError(f"preflight.size_mb: must be > 0, got {self.size_mb}")
        _at_least("preflight.min_bus_gbps", self.min_bus_gbps, 0)
        _one_line("preflight.fail_on_host", self.fail_on_host)


@dataclass(kw_only=True)
class Experiment:
    """One experiment: what to run, on what, and the user's own `train:` settings."""

    name: str = "experiment"
    """Job name and run directory prefix. Defaults to the experiment file's stem."""
    profile: str | None = None
    """Cluster profile to start from: a name looked up in configs/ dirs, or a path to a YAML file."""
    executor: str = "auto"
    """`slurm`, `local` (ranks on this machine with gloo), or `auto` (slurm when sbatch is on PATH)."""
    output_dir: str = "runs"
    """Run directories go to OUTPUT_DIR/NAME/...; must be on a filesystem the nodes share."""
    entrypoint: Entrypoint = field(default_factory=Entrypoint)
    resources: Resources = field(default_factory=Resources)
    dist: Dist = field(default_factory=Dist)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    requeue: Requeue = field(default_factory=Requeue)
    fabric: Fabric = field(default_factory=Fabric)
    preflight: Preflight = field(default_factory=Preflight)
    train: dict[str, Any] = field(default_factory=dict)
    """Free-form settings for the training code (ctx.config.train)."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(
                f"name: {self.name!r} must start with a letter or digit and hold only letters, digits, "
                "'.', '_' and '-' (it names the job and the run directory)"
            )
        _one_of("executor", self.executor, EXECUTORS)
        if (self.entrypoint.function is None) == (self.entrypoint.script is None):
            raise ConfigError(
                "entrypoint: set exactly one of entrypoint.function (module:function) "
                "or entrypoint.script (a torchrun-style script)"
            )
        if self.resources.gpus_per_node == 0 and self.dist.backend == "nccl":
            raise ConfigError("dist.backend: nccl needs GPUs; set resources.gpus_per_node or use gloo")


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
class Element:
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
    if not source.is_file():
        raise ConfigError(f"{source}: no such experiment file")
    exp_layer = _read_yaml(source)
    sweep_section = exp_layer.pop("sweep", None)
    plain = [text for text in overrides if text.partition("=")[0].split(".")[0] != "sweep"]
    for text in overrides:
        if text not in plain:
            sweep_section = _override_sweep(sweep_section, text, source)
    merged = OmegaConf.structured(Experiment)
    profile = exp_layer.get("profile")
    override_layers = [(_parse_override(text, exp_layer), text) for text in plain]
    for layer, _ in override_layers:
        profile = layer.get("profile", profile)
    if profile is not None:
        profile_path = find_profile(str(profile), source.parent)
        merged = _merge(merged, _read_yaml(profile_path), str(profile_path))
    if "name" not in exp_layer:
        exp_layer["name"] = source.stem
    merged = _merge(merged, exp_layer, str(source))
    for layer, text in override_layers:
        merged = _merge(merged, layer, f"override {text!r}")
    experiment, resolved = _finish(merged, source)
    spec = None
    if sweep_section is not None:
        train = resolved.get("train") or {}
        try:
            spec = sweeps.parse(sweep_section, _SECTIONS, train)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        for layer, text in override_layers:
            clash = set(_leaf_keys(layer)) & set(spec.keys)
            if clash:
                raise ConfigError(
                    f"override {text!r} sets {sorted(clash)[0]}, which the sweep varies; "
                    "drop the override or the sweep key"
                )
    return Loaded(experiment, resolved, source, tuple(overrides), spec, merged)


def expand(loaded: Loaded) -> list[Element]:
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
                experiment, resolved = _finish(base, Path(where))
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{where}: {_describe(exc)}") from None
        finally:
            for key, previous in reversed(undo):
                _restore(base, key, previous)
        name = sweeps.element_dir(index, overrides, len(elements))
        text = tuple(f"{key}={json.dumps(value)}" for key, value in overrides.items())
        element_loaded = Loaded(experiment, resolved, loaded.source, (*loaded.overrides, *text))
        out.append(Element(index, dict(overrides), name, element_loaded))
    return out


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


def _finish(merged: DictConfig, source: Path) -> tuple[Experiment, dict[str, Any]]:
    try:
        experiment = OmegaConf.to_object(merged)
        resolved = OmegaConf.to_container(merged, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
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
        raise ConfigError(f"{source}: sweep: must be a mapping with one of grid, list or random")
    node = section = dict(section)
    *parents, last = key.split(".")[1:]
    for part in parents:
        child = node.get(part)
        node[part] = dict(child) if isinstance(child, dict) else {}
        node = node[part]
    node[last] = value
    return section


def _leaf_keys(layer: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in layer.items():
        full = f"{prefix}{key}"
        keys.extend(_leaf_keys(value, f"{full}.") if isinstance(value, dict) and value else [full])
    return keys


def find_profile(name: str, exp_dir: Path) -> Path:
    """A profile is a YAML path, or a name looked up in $SLURMDDP_PROFILE_PATH, EXP_DIR/configs,
    EXP_DIR/../configs and ./configs, in that order."""
    if name.endswith((".yaml", ".yml")):
        for candidate in (Path(name).expanduser(), exp_dir / name):
            if candidate.is_file():
                return candidate
        raise ConfigError(f"profile: no such file {name!r} (looked in . and {exp_dir})")
    dirs = [Path(p) for p in os.environ.get(PROFILE_PATH_ENV, "").split(os.pathsep) if p]
    dirs += [exp_dir / "configs", exp_dir.parent / "configs", Path("configs")]
    for folder in dirs:
        for suffix in (".yaml", ".yml"):
            candidate = folder / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
    known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.y*ml")})
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else (f"; known: {', '.join(known)}" if known else "")
    searched = ", ".join(str(d) for d in dirs)
    raise ConfigError(f"profile: no profile named {name!r} in {searched}{hint}")


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yamlio.load(path.read_text())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: malformed YAML: {exc.problem}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: malformed YAML: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return _normalize(loaded)


def _normalize(layer: dict[str, Any]) -> dict[str, Any]:
    """Accept `entrypoint: "pkg.mod:fn"` and `entrypoint: "train.py --lr 3"` as shorthands."""
    entry = layer.get("entrypoint")
    if isinstance(entry, str):
        if re.fullmatch(r"[^:\s]+:[A-Za-z_]\w*", entry):
            layer["entrypoint"] = {"function": entry, "script": None}
        else:
            words = shlex.split(entry)
            if not words:
                raise ConfigError("entrypoint: empty")
            layer["entrypoint"] = {"function": None, "script": words[0], "args": words[1:]}
    elif isinstance(entry, dict):
        # Setting one kind of entrypoint in a later layer replaces the other kind from an earlier one.
        if entry.get("function") is not None:
            entry.setdefault("script", None)
        if entry.get("script") is not None:
            entry.setdefault("function", None)
    return layer


def _parse_override(text: str, exp_layer: dict[str, Any]) -> dict[str, Any]:
    key, sep, _ = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r}: expected key=value (for example resources.nodes=2)")
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
    layer: dict[str, Any] = {}
    node = layer
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return _normalize(layer)


def _merge(base: DictConfig, layer: dict[str, Any], where: str) -> DictConfig:
    try:
        merged = OmegaConf.merge(base, layer)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{where}: {_describe(exc)}") from None
    assert isinstance(merged, DictConfig)
    return merged


def _describe(exc: OmegaConfBaseException) -> str:
    """OmegaConf's first message line, prefixed by the key it is about."""
    message = str(exc).split("\n")[0].strip()
    key = getattr(exc, "full_key", None)
    return f"{key}: {message}" if key else message
