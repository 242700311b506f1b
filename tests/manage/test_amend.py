"""What the login-node commands set on a loaded experiment themselves (the hosts a resubmission
keeps out, the job a study element waits for) reads in the run directory exactly as the override
it replaces: the typed experiment, config.yaml's mapping and the manifest's overrides."""

from __future__ import annotations

import pytest
from conftest import ROOT

from slurmddp.errors import ConfigError
from slurmddp.experiment.load import Loaded, load_experiment
from slurmddp.manage.amend import with_dependency, with_exclude

EXPERIMENT = ROOT / "templates" / "experiment.yaml"


def same(amended: Loaded, overridden: Loaded) -> None:
    assert amended.experiment == overridden.experiment
    assert amended.resolved == overridden.resolved
    assert amended.overrides == overridden.overrides


def test_hosts_left_out_read_as_the_exclude_override() -> None:
    base = load_experiment(EXPERIMENT, ["resources.exclude=node1"])
    amended = with_exclude(base, ["node1", "node2"])
    same(amended, load_experiment(EXPERIMENT, ["resources.exclude=node1", "resources.exclude=node1,node2"]))
    assert base.experiment.resources.exclude == "node1"  # the loaded experiment itself is left as it was


def test_no_hosts_left_out_read_as_an_exclude_unset() -> None:
    base = load_experiment(EXPERIMENT, ["resources.exclude=node2"])
    amended = with_exclude(base, [])
    same(amended, load_experiment(EXPERIMENT, ["resources.exclude=node2", "resources.exclude=null"]))
    assert amended.experiment.resources.exclude is None


def test_a_dependency_joins_the_other_sbatch_options() -> None:
    base = load_experiment(EXPERIMENT, ["resources.sbatch.mail-type=END"])
    amended = with_dependency(base, "afterany:4242")
    overridden = load_experiment(
        EXPERIMENT, ["resources.sbatch.mail-type=END", "resources.sbatch.dependency=afterany:4242"]
    )
    same(amended, overridden)
    assert amended.experiment.resources.sbatch == {"mail-type": "END", "dependency": "afterany:4242"}


def test_an_amended_value_is_checked_as_an_override_is() -> None:
    with pytest.raises(ConfigError, match=r"resources\.exclude"):
        with_exclude(load_experiment(EXPERIMENT), ["node1\nnode2"])
