"""How the ranks start inside a container (the experiment's `container:`): srun's options for pyxis
and for Slurm's own OCI support, or the command in front of the rank's interpreter for Apptainer.

Only the ranks run inside; the batch script's own Python (attempts, the step watch) runs on the
node. Every path a rank reads or writes by name is mounted at the same path inside, so that the
pickled job, its run directory and the user's files are where the batch script put them: the run
directory (its checkpoints included), a checkpoint.dir outside it, the directory submitted from,
and the user's own mounts.

pyxis's options are those of its srun --help (NVIDIA/pyxis wiki, "Usage"): --container-image,
--container-name, --container-mounts=SRC:DST[:FLAGS][,...] (flags joined by "+"),
--container-workdir. Apptainer's are those of `apptainer exec`: --nv, --bind SRC[:DST[:OPTS]],
--pwd. Slurm's OCI support takes only --container=BUNDLE: the bundle's config.json holds its
mounts, checked here instead.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from slurmddp.cluster.runtimes import Runtime
from slurmddp.defaults import SUBMITTED_WITH_ENV, TASK_IDS_FROM_HOST_ENV, VERSION
from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import Container

APPTAINER_SCHEMES = ("docker://", "docker-daemon:", "oras://", "library://", "shub://")
"""Image references only Apptainer takes (pyxis names a registry image without a scheme)."""
SQUASHFS = (".sqsh", ".squashfs")
OCI_CONFIG = "config.json"
PYXIS_NAME = "slurmddp"
"""pyxis keeps a named container until the job ends (its default container scope is the job)."""
APPTAINER_SANDBOX = ".singularity.d"


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    flags: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Mount:
        source, target, *flags = text.split(":")
        return cls(source, target, tuple(flag for part in flags for flag in part.split("+") if flag))

    @classmethod
    def same_path(cls, path: Path) -> Mount:
        return cls(str(path), str(path))


@dataclass(frozen=True)
class Launch:
    """How the ranks of a plan start: srun's own options, and the command that takes the place of
    the interpreter in `INTERPRETER -u -m slurmddp.job.launch.boot`."""

    runtime: Runtime
    srun_args: tuple[str, ...]
    interpreter: str


def runtime_of(container: Container) -> Runtime:
    """The runtime `container.runtime` names, or for `auto` the one the image's form names."""
    if container.runtime != "auto":
        return container.runtime
    image = container.image or ""
    path = Path(image)
    if path.is_dir():
        if (path / OCI_CONFIG).is_file():
            return "oci"
        if (path / APPTAINER_SANDBOX).is_dir():
            return "apptainer"
        raise ConfigError(
            f"container.image: {image} is a directory but neither an OCI bundle (no {OCI_CONFIG}) nor "
            f"an Apptainer sandbox (no {APPTAINER_SANDBOX}/); name the bundle directory, or set "
            "container.runtime"
        )
    if image.endswith(".sif") or image.startswith(APPTAINER_SCHEMES):
        return "apptainer"
    return "pyxis"


def mounts(container: Container, always: Sequence[Path]) -> tuple[Mount, ...]:
    """The user's mounts, then each of `always` at its own path unless a mount already covers it."""
    own = tuple(Mount.parse(text) for text in container.mounts)
    added: list[Mount] = []
    for path in always:
        covered = [*own, *added]
        if not any(
            _within(path, PurePosixPath(mount.source)) for mount in covered if mount.source == mount.target
        ):
            added.append(Mount.same_path(path))
    return (*own, *added)


def launch(
    container: Container,
    always: Sequence[Path],
    workdir: Path,
    apptainer: str = "apptainer",
    task_ids_from_host: bool = False,
) -> Launch:
    """How the ranks start inside `container`, with `always` (the paths they use by name) mounted
    and `workdir` (the directory submitted from) their working directory unless it names one;
    `apptainer`: the command Apptainer goes by (`singularity` on older installations);
    `task_ids_from_host`: the ranks work out their ids themselves (an OCI bundle on Slurm 22.05)."""
    runtime = runtime_of(container)
    image = container.image or ""
    binds = mounts(container, always)
    # The paths in `always` are slurmddp's own: the run directory is made after the plan.
    _check_sources(image, [Mount.parse(text) for text in container.mounts])
    cwd = container.workdir or str(workdir)
    python = container.python
    ours = {SUBMITTED_WITH_ENV: VERSION, **({TASK_IDS_FROM_HOST_ENV: "1"} if task_ids_from_host else {})}
    env = tuple(f"{name}={value}" for name, value in {**container.env, **ours}.items())
    # srun hands its environment to every runtime's ranks; --export adds the container's own.
    export = (f"--export={','.join(('ALL', *env))}",)
    if runtime == "pyxis":
        spec = ",".join(_pyxis_mount(mount) for mount in binds)
        # Named, the container pyxis makes for the first srun step is kept for the job's later steps
        # (in-job restarts): they skip the image's import and unpacking.
        args = (
            f"--container-image={image}",
            f"--container-name={PYXIS_NAME}",
            f"--container-mounts={spec}",
            f"--container-workdir={cwd}",
        )
        return Launch(runtime, (*args, *export), python)
    if runtime == "apptainer":
        words = [
            apptainer,
            "exec",
            *(["--nv"] if container.gpus else []),
            # One --bind each: a bind's own options are comma-separated too.
            *(word for mount in binds for word in ("--bind", _apptainer_bind(mount))),
            "--pwd",
            cwd,
            image,
            python,
        ]
        return Launch(runtime, export, shlex.join(words))
    check_bundle(Path(image), binds)
    return Launch(runtime, (f"--container={image}", *export), python)


def check_bundle(bundle: Path, binds: Sequence[Mount]) -> None:
    """An OCI bundle must mount what the ranks use by name itself (srun --container takes no
    mounts): refuse one whose config.json does not, naming the entries to add."""
    config = bundle / OCI_CONFIG
    try:
        spec = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"container.image: cannot read the OCI bundle's {config}: {exc}") from None
    # A bind of a folder at its own path covers everything under it (/shared covers /shared/runs/x).
    present = [
        PurePosixPath(str(entry.get("destination")))
        for entry in spec.get("mounts", [])
        if isinstance(entry, dict) and entry.get("source") == entry.get("destination")
    ]
    missing = [m for m in binds if not any(_within(Path(m.target), root) for root in present)]
    if missing:
        entries = ", ".join(
            json.dumps({"destination": m.target, "source": m.source, "type": "bind", "options": ["rbind"]})
            for m in missing
        )
        raise ConfigError(
            f"container.image: the OCI bundle {bundle} does not mount "
            f"{', '.join(m.target for m in missing)}, which the ranks use by name (srun --container "
            f'takes no mounts: the bundle\'s {OCI_CONFIG} holds them); add to its "mounts": {entries}'
        )


def _check_sources(image: str, binds: Sequence[Mount]) -> None:
    """An image file or bundle named by path, and the source of each of the user's mounts, must
    exist: the nodes share the login node's filesystems, and a missing path would fail every
    rank's start after the queue."""
    if _is_path(image) and not Path(image).exists():
        raise ConfigError(
            f"container.image: {image} does not exist; name an existing image file or bundle (a path "
            "on a filesystem the nodes share), or a registry image such as nvcr.io#nvidia/pytorch:24.10-py3"
        )
    for mount in binds:
        if not Path(mount.source).exists():
            raise ConfigError(
                f"container.mounts: {mount.source} (mounted at {mount.target}) does not exist; create it "
                "or fix the path (SRC:DST: SRC on the nodes' filesystem, DST inside the container)"
            )


def _is_path(image: str) -> bool:
    return image.startswith(("/", "./", "../", "~")) or image.endswith((".sif", *SQUASHFS))


def _within(path: Path, root: PurePosixPath) -> bool:
    return PurePosixPath(path) == root or root in PurePosixPath(path).parents


def _pyxis_mount(mount: Mount) -> str:
    return ":".join((mount.source, mount.target, *(["+".join(mount.flags)] if mount.flags else [])))


def _apptainer_bind(mount: Mount) -> str:
    return ":".join((mount.source, mount.target, *([",".join(mount.flags)] if mount.flags else [])))
