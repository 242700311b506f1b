"""Which container runtimes the cluster offers (cluster/runtimes.py), from fake srun --help text,
PATH and slurmctld settings; and the refusal of a runtime it lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmddp.cluster import runtimes
from slurmddp.cluster.checks import check_runtimes
from slurmddp.errors import SubmitError

PYXIS_HELP = """Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]
      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH
                              [pyxis] the image to use for the container
"""


def test_nothing_offered_names_why_for_each(tmp_path: Path) -> None:
    config = {"SLURM_CONF": str(tmp_path / "slurm.conf")}
    found = runtimes.offered(
        lambda: "Usage: srun", config, which=lambda tool: "/usr/bin/srun" if tool == "srun" else None
    )
    assert dict(found.found) == {"pyxis": None, "apptainer": None, "oci": None}
    lines = {check.name: (check.status, check.value, check.why) for check in check_runtimes(found)}
    assert (
        lines["container: pyxis"][:2] == ("OK", "absent")
        and "--container-image" in lines["container: pyxis"][2]
    )
    assert "apptainer nor singularity" in lines["container: apptainer"][2]
    assert f"no {tmp_path}/oci.conf beside slurm.conf" in lines["container: oci"][2]
    with pytest.raises(SubmitError, match=r"container.runtime: oci is not offered here .*it offers none"):
        found.require("oci")


def test_pyxis_singularity_and_oci_found_where_they_are(tmp_path: Path) -> None:
    (tmp_path / "oci.conf").write_text('RunTimeRun="crun run --bundle %b %n.%u.%j.%s.%t"\n')
    config = {"SLURM_CONF": str(tmp_path / "slurm.conf")}
    tools = {"srun": "/usr/bin/srun", "singularity": "/opt/bin/singularity"}
    found = runtimes.offered(lambda: PYXIS_HELP, config, which=tools.get)
    assert found.found["pyxis"] is not None and found.found["apptainer"] == "/opt/bin/singularity"
    assert found.found["oci"] == str(tmp_path / "oci.conf")
    for name in runtimes.RUNTIMES:
        found.require(name)


def test_a_missing_runtime_is_refused_naming_the_ones_offered(tmp_path: Path) -> None:
    found = runtimes.offered(lambda: PYXIS_HELP, {}, which={"srun": "/usr/bin/srun"}.get)
    with pytest.raises(SubmitError) as refused:
        found.require("apptainer")
    said = str(refused.value)
    assert "apptainer is not offered here" in said and "this cluster offers pyxis" in said
    assert "nothing was submitted" in said and "doctor" in said
