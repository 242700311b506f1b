"""The xdist groups of lab tests are the ones xdist's loadgroup schedules: a module's tests on one
generation run on one worker, so its module-scoped reference runs are made once."""

from __future__ import annotations

from conftest import lab_group
from xdist.scheduler.loadgroup import LoadGroupScheduling


def scope(nodeid: str) -> str:
    # _split_scope reads nothing of the scheduler's state.
    return LoadGroupScheduling._split_scope(LoadGroupScheduling.__new__(LoadGroupScheduling), nodeid)


def test_the_tests_of_a_module_on_a_generation_share_one_group() -> None:
    ids = [
        "tests/job/test_container_cluster.py::test_the_quickstart_in_a_bundle[22.05]",
        "tests/job/test_container_cluster.py::test_a_sweep[22.05]",
        "tests/job/test_container_cluster.py::test_an_interpreter[22.05-/usr/bin/python3-No module]",
    ]
    # xdist appends "@group" to the nodeid of a test with an xdist_group mark.
    groups = {scope(f"{nodeid}@{lab_group(nodeid, '22.05')}") for nodeid in ids}
    assert groups == {"tests/job/test_container_cluster.py:22.05"}


def test_each_generation_and_module_is_a_group_of_its_own() -> None:
    nodeid = "tests/job/test_resume_cluster.py::test_time_limit[24.11]"
    other = "tests/job/test_failures_cluster.py::test_rank_0_finishing_first[24.11-1-2]"
    assert scope(f"{nodeid}@{lab_group(nodeid, '24.11')}") != scope(f"{nodeid}@{lab_group(nodeid, '22.05')}")
    assert scope(f"{nodeid}@{lab_group(nodeid, '24.11')}") != scope(f"{other}@{lab_group(other, '24.11')}")
