"""scripts/suite_time.py: the suite's time table and the lab modules' budgets."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suite_time", ROOT / "scripts" / "suite_time.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["suite_time"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


suite_time = load_script()


def write(folder: Path, worker: str, *records: dict[str, object]) -> None:
    folder.mkdir(exist_ok=True)
    with (folder / f"{worker}.jsonl").open("a") as out:
        out.writelines(json.dumps(r) + "\n" for r in records)


def phase(
    test: str, when: str, start: float, s: float, outcome: str = "passed", lab: bool = True
) -> dict[str, object]:
    return {
        "kind": "phase",
        "test": test,
        "when": when,
        "start": start,
        "s": s,
        "outcome": outcome,
        "lab": lab,
    }


LAB = "tests/job/test_x_cluster.py::test_a[22.05]"
GROUPED = f"{LAB}@tests/job/test_x_cluster.py:22.05"
"""The id xdist reports for it: its group appended."""
UNIT = "tests/job/test_y.py::test_b"


def test_the_table_sums_each_module_and_splits_the_time_by_what_it_waited_on(tmp_path: Path) -> None:
    times = tmp_path / "times"
    write(
        times,
        "gw0",
        phase(LAB, "setup", 100.0, 50.0),
        # The reference run: a module fixture whose own wait for its job is part of it, once.
        {"kind": "fixture", "test": LAB, "name": "reference", "scope": "module", "shared": True, "s": 40.0},
        {"kind": "span", "test": LAB, "what": "slurm job", "fixture": "reference", "s": 35.0},
        {"kind": "span", "test": LAB, "what": "lab up", "fixture": None, "s": 9.0},
        phase(GROUPED, "call", 150.0, 30.0, outcome="rerun"),
        phase(GROUPED, "call", 180.0, 20.0),
        {"kind": "span", "test": LAB, "what": "slurm job", "fixture": None, "s": 15.0},
        phase(LAB, "teardown", 200.0, 1.0),
    )
    write(times, "gw1", phase(UNIT, "call", 100.0, 2.0, lab=False))
    suite = suite_time.from_times(times)
    lab, unit = suite.modules["tests/job/test_x_cluster.py"], suite.modules["tests/job/test_y.py"]
    assert (lab.tests, lab.seconds, lab.lab) == (1, 101.0, True)  # counted once, rerun or not
    assert lab.slowest == (101.0, "test_a[22.05]")  # its setup, both tries and teardown
    assert (unit.tests, unit.seconds, unit.lab) == (1, 2.0, False)
    assert suite.categories["module fixtures (reference runs, bundles)"] == 40.0
    assert suite.categories["waiting for Slurm jobs"] == 15.0  # not the reference run's 35 again
    assert suite.categories["lab start and stop"] == 9.0
    assert suite.categories["the tests' own (local runs, checks)"] == 103.0 - 64.0
    assert suite.reruns == [LAB]
    assert suite.lanes["gw0"] == (101.0, 100.0, 201.0) and suite.lanes["gw1"] == (2.0, 100.0, 102.0)
    report = "\n".join(suite_time.report(suite, {}))
    assert "gw1: busy 2 s, done 2 s in, idle 99 s at the end" in report
    assert "run again after a failure" in report


def test_a_lab_module_past_its_budget_or_without_one_is_named(tmp_path: Path) -> None:
    times = tmp_path / "times"
    write(times, "gw0", phase(LAB, "call", 0.0, 120.0), phase(UNIT, "call", 0.0, 500.0, lab=False))
    suite = suite_time.from_times(times)
    assert suite_time.over_budget(suite, {"tests/job/test_x_cluster.py": 130.0}) == []
    assert suite_time.over_budget(suite, {"tests/job/test_x_cluster.py": 100.0}) == [
        "tests/job/test_x_cluster.py: 120 s, past its budget of 100 s"
    ]
    (missing,) = suite_time.over_budget(suite, {})
    assert missing.startswith("tests/job/test_x_cluster.py: 120 s and no budget")


def test_junit_alone_gives_the_table_by_module(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.job.test_x_cluster" name="test_a[22.05]@g" time="12.5"/>'
        '<testcase classname="tests.job.test_x_cluster" name="test_b[24.11-3]" time="7.5"/>'
        '<testcase classname="tests.job.test_y" name="test_c" time="1.0"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    suite = suite_time.from_junit(xml)
    lab, unit = suite.modules["tests/job/test_x_cluster.py"], suite.modules["tests/job/test_y.py"]
    assert (lab.tests, lab.seconds, lab.lab, lab.slowest) == (2, 20.0, True, (12.5, "test_a[22.05]"))
    assert (unit.tests, unit.seconds, unit.lab) == (0, 1.0, False)


def lab_modules() -> set[str]:
    """The test modules that run on a lab: those whose tests ask for it."""
    return {
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"\bslurm_(env|lab)\b|pytest\.mark\.slurm\b", path.read_text())
    }


def test_every_lab_module_has_a_budget_and_every_budget_a_module() -> None:
    budgets = suite_time.load_budgets(suite_time.BUDGETS)
    assert sorted(lab_modules() - set(budgets)) == [], "give it a budget in tests/suite_budgets.json"
    assert sorted(set(budgets) - lab_modules()) == [], "a budget of a module that runs no lab test"


def test_every_span_the_clock_records_has_a_category() -> None:
    import suite_clock

    assert sorted(suite_time.SPAN_CATEGORY) == sorted(suite_clock.SPANS)
    assert set(suite_time.SPAN_CATEGORY.values()) <= set(suite_time.CATEGORIES)


@pytest.mark.process
def test_a_test_that_changes_directory_does_not_move_the_records(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clock's folder is relative in scripts/test.sh; a test's monkeypatch.chdir once made
    the next write fail and stopped the whole run (an INTERNALERROR on the worker)."""
    pytester.makeconftest(
        "import suite_clock\n\ndef pytest_configure(config):\n    suite_clock.start(config)\n"
    )
    pytester.makepyfile(
        test_moves="def test_moves(monkeypatch, tmp_path):\n    monkeypatch.chdir(tmp_path)\n\n"
        "def test_after():\n    pass\n"
    )
    monkeypatch.setenv("SLURMDDP_SUITE_TIMES", "records")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:randomly", timeout=120)
    result.assert_outcomes(passed=2)
    records = (pytester.path / "records" / "main.jsonl").read_text().splitlines()
    assert {r["test"] for r in map(json.loads, records)} == {
        "test_moves.py::test_moves",
        "test_moves.py::test_after",
    }
