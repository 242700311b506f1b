"""`init`: a runnable starter (an experiment and its training function) for a new project, with a
cluster profile guessed from what Slurm says where a controller answers.

The starter's files ship inside the package (slurmddp/starter/, the repository's templates/), so a
user who only pip-installed slurmddp has them too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from slurmddp.cluster import fabric, slurm
from slurmddp.errors import ConfigError, SlurmCommandError

EXPERIMENT = "experiment.yaml"
TRAIN = "train.py"
PROFILES = "configs"
"""Where an experiment finds a profile by name (experiment.load.find_profile): EXP_DIR/configs."""
_STARTER = {EXPERIMENT: "experiment.yaml", TRAIN: "train.py.txt"}
"""Each file written -> its name in the package (a .py there would be taken for one of its modules)."""
_CPU_RANKS = re.compile(r"^  tasks_per_node:.*\n", re.MULTILINE)


@dataclass(frozen=True)
class ClusterGuess:
    """What a profile for this cluster says, as read from scontrol and sinfo on the login node."""

    name: str
    """The profile's name: the cluster's (ClusterName), made safe for a file name."""
    partition: str | None
    gpus_per_node: int
    cpus_per_task: int
    fabric_seen: str
    """What this login node's network looks like (the ranks detect their own nodes' at run time)."""


def guess(config: Mapping[str, str], partitions: Sequence[slurm.Partition], fabric_seen: str) -> ClusterGuess:
    """A profile from `scontrol show config` and sinfo's partitions: the default partition (else the
    first), its GPUs per node, and its CPUs shared out over one rank per GPU."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", config.get("ClusterName", "")).strip("-.") or "cluster"
    chosen = next((p for p in partitions if p.default), partitions[0] if partitions else None)
    if chosen is None:
        return ClusterGuess(name, None, 0, 1, fabric_seen)
    gpus = chosen.gpus_per_node
    cpus = max(1, chosen.cpus_per_node // gpus) if gpus else 1
    return ClusterGuess(name, chosen.name, gpus, cpus, fabric_seen)


def discover() -> ClusterGuess | None:
    """The guess for the cluster this machine submits to; None where no Slurm controller answers."""
    if not slurm.available("scontrol") or slurm.controller_silence() is not None:
        return None
    try:
        config = slurm.parse_config(slurm.show_config())
    except SlurmCommandError:
        return None
    seen = fabric.describe(fabric.detect(Path("/sys")))
    return guess(config, slurm.partitions(), seen)


def profile_text(cluster: ClusterGuess) -> str:
    resources_layer: dict[str, object] = {"partition": cluster.partition} if cluster.partition else {}
    if cluster.gpus_per_node:
        resources_layer |= {"gpus_per_node": cluster.gpus_per_node, "cpus_per_task": cluster.cpus_per_task}
    layer = {"resources": resources_layer, "fabric": {"profile": "auto"}}
    header = (
        f"# The cluster profile `{cluster.name}`, guessed by `python -m slurmddp init` from scontrol and\n"
        "# sinfo: check the partition and GPUs, and add the account and the environment setup your site\n"
        "# needs (resources.account, resources.setup). fabric.profile auto detects each node's network\n"
        f"# when the job starts; this login node has: {cluster.fabric_seen}.\n"
    )
    return header + yaml.safe_dump(layer, sort_keys=False)


def starter_files(cluster: ClusterGuess | None) -> dict[str, str]:
    """The files `init` writes, by path relative to its directory."""
    package = resources.files("slurmddp") / "starter"
    files = {name: (package / stored).read_text() for name, stored in _STARTER.items()}
    if cluster is None:
        return files
    experiment = files[EXPERIMENT].replace(
        "\nentrypoint:", f"\nprofile: {cluster.name}  # {PROFILES}/{cluster.name}.yaml\nentrypoint:", 1
    )
    if cluster.gpus_per_node:
        # One rank per GPU: the profile's GPUs set the ranks, the starter's CPU ranks would clash.
        experiment = _CPU_RANKS.sub("", experiment, count=1)
    files[EXPERIMENT] = experiment
    files[f"{PROFILES}/{cluster.name}.yaml"] = profile_text(cluster)
    return files


def write(directory: Path, files: Mapping[str, str]) -> list[Path]:
    """Write `files` under `directory`, none of them over an existing file; the paths written."""
    targets = [directory / name for name in files]
    existing = [str(path) for path in targets if path.exists()]
    if existing:
        raise ConfigError(
            f"init: {', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; "
            "move them away or choose another directory"
        )
    try:
        for name, text in files.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text)
    except OSError as exc:
        raise ConfigError(
            f"init: cannot write {exc.filename or directory} ({exc.strerror or exc}); "
            "choose a directory you can write"
        ) from None
    return targets
