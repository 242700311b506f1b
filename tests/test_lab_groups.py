"""The xdist groups of lab tests are the ones xdist's loadgroup schedules: a module's tests on one
generation run on one worker, so its module-scoped reference runs are made once."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from conftest import lab_group, longest_first
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


@dataclass
class Item:
    nodeid: str
    marks: dict[str, pytest.Mark] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.marks.get(name)


def lab(nodeid: str, group: str, alone: bool = False) -> Item:
    marks = {"slurm": pytest.mark.slurm.mark, "xdist_group": pytest.mark.xdist_group(group).mark}
    if alone:
        marks["alone"] = pytest.mark.alone.mark
    return Item(nodeid, marks)


def test_the_long_groups_go_out_first_and_the_unit_tests_last() -> None:
    """xdist, told not to reorder, hands groups out in the order of their first test: an `alone`
    lab test first (xdist's own order, by number of tests, sent it out last), then lab groups,
    larger first, then other groups, then tests of no group."""
    unit = Item("tests/test_a.py::test_unit")
    small = lab("tests/job/test_b.py::test_one[22.05]", "tests/job/test_b.py:22.05")
    big = [lab(f"tests/job/test_c.py::test_{n}[22.05]", "tests/job/test_c.py:22.05") for n in range(3)]
    grouped = Item(
        "tests/job/test_d.py::test_ref", {"xdist_group": pytest.mark.xdist_group("tests/job/test_d.py").mark}
    )
    alone = lab("tests/job/test_c.py::test_long[24.11]", "tests/job/test_c.py:24.11:test_long", alone=True)
    items = [unit, small, big[0], grouped, big[1], alone, big[2]]
    ordered = longest_first(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in ordered] == [
        alone.nodeid,
        *(item.nodeid for item in big),
        small.nodeid,
        grouped.nodeid,
        unit.nodeid,
    ]
