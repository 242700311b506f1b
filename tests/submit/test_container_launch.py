"""The srun options and interpreter commands for ranks in a container (submit/container.py), checked
against each runtime's documented options: pyxis's srun --help (NVIDIA/pyxis wiki, "Usage"),
`apptainer exec --help` (Apptainer 1.x), and Slurm's srun --container."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from slurmddp.defaults import VERSION
from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import Container
from slurmddp.submit import container
from slurmddp.submit.container import Mount

PYXIS_OPTIONS = {
    "--container-image",
    "--container-mounts",
    "--container-workdir",
    "--container-name",
    "--container-save",
    "--container-mount-home",
    "--no-container-mount-home",
    "--container-remap-root",
    "--no-container-remap-root",
    "--container-entrypoint",
    "--no-container-entrypoint",
    "--container-writable",
    "--container-readonly",
    "--container-env",
}
"""pyxis's srun options, as its srun --help lists them."""
SRUN_OPTIONS = {"--container", "--export"}
APPTAINER_EXEC_OPTIONS = {"--nv", "--rocm", "--bind", "--pwd", "--cleanenv", "--env", "--home", "--contain"}
"""The `apptainer exec` options slurmddp may use, as its --help names them."""


def option_names(args: tuple[str, ...] | list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}


def paths(tmp_path: Path) -> tuple[Path, Path]:
    """A run directory and the directory submitted from; tmp_path/data, a data set to mount."""
    runs, workdir = tmp_path / "runs" / "exp" / "20261127-1", tmp_path / "project"
    runs.mkdir(parents=True)
    workdir.mkdir()
    (tmp_path / "data").mkdir()
    return runs, workdir


def image_file(tmp_path: Path, name: str) -> str:
    (tmp_path / name).write_bytes(b"hsqs")
    return str(tmp_path / name)


def test_a_registry_image_runs_under_pyxis_with_every_path_the_ranks_use(tmp_path: Path) -> None:
    run_dir, workdir = paths(tmp_path)
    spec = Container(image="nvcr.io#nvidia/pytorch:24.10-py3", mounts=[f"{tmp_path}/data:/data:ro+rprivate"])
    started = container.launch(spec, [run_dir, workdir], workdir)
    assert started.runtime == "pyxis"
    assert option_names(started.srun_args) <= PYXIS_OPTIONS | SRUN_OPTIONS
    assert started.srun_args == (
        "--container-image=nvcr.io#nvidia/pytorch:24.10-py3",
        "--container-name=slurmddp",
        f"--container-mounts={tmp_path}/data:/data:ro+rprivate,{run_dir}:{run_dir},{workdir}:{workdir}",
        f"--container-workdir={workdir}",
        f"--export=ALL,SLURMDDP_SUBMITTED_WITH={VERSION}",
    )
    assert started.interpreter == "python3"


def test_a_squashfs_file_is_pyxis_and_env_goes_through_srun_export(tmp_path: Path) -> None:
    run_dir, workdir = paths(tmp_path)
    spec = Container(image=image_file(tmp_path, "torch.sqsh"), env={"HF_HOME": "/cache/hf"}, python="python")
    started = container.launch(spec, [run_dir], workdir)
    assert started.runtime == "pyxis" and started.interpreter == "python"
    assert started.srun_args[-1] == f"--export=ALL,HF_HOME=/cache/hf,SLURMDDP_SUBMITTED_WITH={VERSION}"


@pytest.mark.parametrize("image", ["torch.sif", "docker://pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"])
def test_a_sif_or_docker_reference_runs_under_apptainer_exec(tmp_path: Path, image: str) -> None:
    run_dir, workdir = paths(tmp_path)
    image = image_file(tmp_path, image) if image.endswith(".sif") else image
    spec = Container(image=image, mounts=[f"{tmp_path}/data:/data:ro"], workdir="/work")
    started = container.launch(spec, [run_dir, workdir], workdir)
    assert started.runtime == "apptainer"
    assert started.srun_args == (f"--export=ALL,SLURMDDP_SUBMITTED_WITH={VERSION}",)
    words = shlex.split(started.interpreter)
    assert words[:2] == ["apptainer", "exec"] and words[-2:] == [image, "python3"]
    assert option_names(words[2:-2]) <= APPTAINER_EXEC_OPTIONS
    assert "--nv" in words
    binds = [words[i + 1] for i, word in enumerate(words) if word == "--bind"]
    assert binds == [f"{tmp_path}/data:/data:ro", f"{run_dir}:{run_dir}", f"{workdir}:{workdir}"]
    assert words[words.index("--pwd") + 1] == "/work"
    without_gpus = container.launch(Container(image=image, gpus=False), [run_dir], workdir)
    assert "--nv" not in shlex.split(without_gpus.interpreter)


def bundle(tmp_path: Path, destinations: list[str]) -> Path:
    root = tmp_path / "bundle"
    (root / "rootfs").mkdir(parents=True)
    mounts = [{"destination": d, "source": d, "type": "bind", "options": ["rbind"]} for d in destinations]
    (root / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "mounts": mounts}))
    return root


def test_an_oci_bundle_runs_with_srun_container_when_it_mounts_the_paths(tmp_path: Path) -> None:
    run_dir, workdir = paths(tmp_path)
    image = bundle(tmp_path, ["/proc", str(run_dir), str(workdir)])
    started = container.launch(Container(image=str(image)), [run_dir, workdir], workdir)
    assert started.runtime == "oci"
    assert started.srun_args == (f"--container={image}", f"--export=ALL,SLURMDDP_SUBMITTED_WITH={VERSION}")
    assert option_names(started.srun_args) <= SRUN_OPTIONS


def test_an_oci_bundle_that_does_not_mount_the_run_directory_is_refused_with_the_entry_to_add(
    tmp_path: Path,
) -> None:
    run_dir, workdir = paths(tmp_path)
    image = bundle(tmp_path, ["/proc", str(workdir)])
    with pytest.raises(ConfigError) as refused:
        container.launch(Container(image=str(image)), [run_dir, workdir], workdir)
    said = str(refused.value)
    assert f"does not mount {run_dir}" in said and f'"destination": "{run_dir}"' in said, said


def test_a_directory_that_is_no_bundle_or_sandbox_is_refused(tmp_path: Path) -> None:
    (tmp_path / "image").mkdir()
    with pytest.raises(ConfigError, match="neither an OCI bundle"):
        container.runtime_of(Container(image=str(tmp_path / "image")))


def test_a_path_under_a_mounted_one_is_not_mounted_again(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    run_dir = workdir / "runs" / "exp"
    binds = container.mounts(Container(image="x.sif"), [workdir, run_dir])
    assert binds == (Mount.same_path(workdir),)


@pytest.mark.parametrize("mount", ["/data", "/a:/b,/c:/d", "/a:/b:ro:x"])
def test_a_mount_that_is_not_src_dst_flags_is_refused(mount: str) -> None:
    with pytest.raises(ConfigError, match=r"container.mounts: .* is not SRC:DST"):
        Container(image="x.sif", mounts=[mount])


def test_an_image_file_or_mount_source_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    run_dir, workdir = paths(tmp_path)
    with pytest.raises(ConfigError, match=rf"container.image: {tmp_path}/none.sif does not exist"):
        container.launch(Container(image=f"{tmp_path}/none.sif"), [run_dir], workdir)
    with pytest.raises(
        ConfigError, match=rf"container.mounts: {tmp_path}/gone \(mounted at /data\) does not"
    ):
        container.launch(
            Container(image="nvcr.io#nvidia/pytorch:24.10-py3", mounts=[f"{tmp_path}/gone:/data"]),
            [run_dir],
            workdir,
        )
