"""Where the suite's time goes: with SLURMDDP_SUITE_TIMES=DIR, each pytest process (each xdist
worker) writes DIR/WORKER.jsonl, one record a line:

- `{"kind": "phase", "test", "when", "start", "s", "outcome", "group", "lab"}`: a test's setup, call
  or teardown (what pytest reports; a rerun's first try too, with outcome "rerun");
- `{"kind": "fixture", "test", "name", "scope", "shared", "s"}`: a fixture's own setup (not its
  dependencies', which pytest sets up first); `shared` for a module- or session-scoped one other
  than the labs (a module's reference runs, a bundle);
- `{"kind": "span", "test", "what", "fixture", "s"}`: time a test helper spent in one of SPANS
  (a lab's start, waiting for a Slurm job or a run's progress, a `python -m slurmddp` command),
  and the shared fixture it was part of, if any.

scripts/suite_time.py reads them into the time table (CONTRIBUTING.md) and the budget check.
Nothing here changes what a test does: without the variable every call is a no-op.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

TIMES_VAR = "SLURMDDP_SUITE_TIMES"
LAB_FIXTURES = frozenset({"labs", "slurm_lab"})
"""Fixtures whose setup is a lab's start: their time is the "lab up" span's."""
SPANS = ("lab up", "lab down", "slurm job", "run progress", "slurmddp command")
"""What a helper can spend time on; the rest of a phase is the test's own (local runs, asserts)."""


class Clock:
    """The records of this process, appended to its file as each phase ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.test = ""
        self.group: str | None = None
        self.shared: list[str] = []
        """The module- or session-scoped fixtures being set up now (innermost last), other than
        the labs: a span inside one is part of its time (a reference run's wait for its job)."""
        self.pending: list[dict[str, Any]] = []

    def add(self, record: dict[str, Any]) -> None:
        self.pending.append({**record, "test": record.get("test", self.test)})

    def flush(self) -> None:
        if self.pending:
            with self.path.open("a") as out:
                out.writelines(json.dumps(r) + "\n" for r in self.pending)
            self.pending.clear()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.test = item.nodeid
        mark = item.get_closest_marker("xdist_group")
        self.group = str(mark.args[0]) if mark is not None and mark.args else None
        try:
            return (yield)
        finally:
            self.flush()

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, Any]:
        name = fixturedef.argname
        shared = fixturedef.scope != "function" and name not in LAB_FIXTURES
        if shared:
            self.shared.append(name)
        t0 = time.monotonic()
        try:
            return (yield)
        finally:
            took = time.monotonic() - t0
            if shared:
                self.shared.pop()
            if took >= 0.05:  # the many instant ones (tmp_path, monkeypatch) would only add bulk
                self.add(
                    {"kind": "fixture", "name": name, "scope": fixturedef.scope, "shared": shared, "s": took}
                )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.add(
            {
                "kind": "phase",
                "test": report.nodeid,
                "when": report.when,
                "start": report.start,
                "s": report.duration,
                "outcome": report.outcome,
                "group": self.group,
                "lab": "slurm" in report.keywords,
            }
        )
        self.flush()


_clock: Clock | None = None


def start(config: pytest.Config) -> None:
    """Register the clock when SLURMDDP_SUITE_TIMES names a folder (made if missing), in each
    process that runs tests."""
    global _clock
    folder = os.environ.get(TIMES_VAR)
    # xdist's controller hears every worker's reports again: only the process that runs a test
    # records it.
    controller = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")
    if not folder or controller:
        return
    # Absolute now: a test that changes the working directory (monkeypatch.chdir) must not move
    # where the records go.
    records = Path(folder).resolve()
    records.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _clock = Clock(records / f"{worker}.jsonl")
    config.pluginmanager.register(_clock, "suite_clock")


@contextmanager
def spent(what: str) -> Iterator[None]:
    """Count the time inside as `what` (one of SPANS) for the test running now."""
    assert what in SPANS, what
    t0 = time.monotonic()
    try:
        yield
    finally:
        if _clock is not None:
            inside = _clock.shared[-1] if _clock.shared else None
            _clock.add({"kind": "span", "what": what, "fixture": inside, "s": time.monotonic() - t0})
