"""The `process` marker's rule and guard (tests/process_rule.py) catch what they are for. The
samples are looked up by name, so that the rule does not mark these tests `process` themselves."""

from __future__ import annotations

import subprocess

import pytest
from process_rule import ProcessInUnitTest, processes_refused, starts_process


def _runs_true() -> None:
    subprocess.run(["true"], check=True)


def _through_a_helper() -> None:
    _runs_true()


def _builds_a_result() -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["true"], 0, "", "")


def test_the_rule_follows_helpers_and_tells_a_starter_from_other_names() -> None:
    samples = globals()
    assert starts_process(samples["_through_a_helper"])
    assert not starts_process(samples["_builds_a_result"])


def test_this_module_runs_in_the_unit_run(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("process") is None


def test_the_guard_refuses_a_process_and_names_the_fix(request: pytest.FixtureRequest) -> None:
    fix = r"not marked `process`: decorate it with @pytest.mark.process"
    with processes_refused(request.node) as refused, pytest.raises(ProcessInUnitTest, match=fix):
        getattr(subprocess, "run")(["true"])  # noqa: B009
    assert refused == ["subprocess.Popen"]
