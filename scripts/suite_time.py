#!/usr/bin/env python3
"""The suite's time table: where a run of the test suite spent its time, by module and by what it
waited on, and which lab modules outgrew their budget.

    python scripts/suite_time.py --times DIR [--junit FILE] [--budgets FILE] [--markdown]

DIR holds the records tests/suite_clock.py writes under SLURMDDP_SUITE_TIMES (scripts/test.sh sets
it); FILE a JUnit XML report (`pytest --junitxml`), which is enough alone for the table by module
(the categories and the workers' lanes need DIR). Budgets (tests/suite_budgets.json by default)
are seconds of test time per lab module, both generations together: a module past its budget is
listed at the end, as a warning (the machines are noisy: it never fails the run). CONTRIBUTING.md
holds the table of the last measured CI run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = ROOT / "tests" / "suite_budgets.json"
SPAN_CATEGORY = {
    "lab up": "lab start and stop",
    "lab down": "lab start and stop",
    "slurm job": "waiting for Slurm jobs",
    "run progress": "waiting on a run's progress",
    "slurmddp command": "slurmddp commands",
}
"""The category of each of tests/suite_clock.py's SPANS."""
CATEGORIES = (
    "lab start and stop",
    "module fixtures (reference runs, bundles)",
    "waiting for Slurm jobs",
    "waiting on a run's progress",
    "slurmddp commands",
    "the tests' own (local runs, checks)",
)


@dataclass
class Module:
    """One test module's time, all its tests and phases (reruns included)."""

    path: str
    tests: int = 0
    lab: bool = False
    by_test: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Each test's time, its phases and tries together."""

    def add(self, name: str, seconds: float, counted: bool) -> None:
        self.tests += counted
        self.by_test[name] += seconds

    @property
    def seconds(self) -> float:
        return sum(self.by_test.values())

    @property
    def slowest(self) -> tuple[float, str]:
        return max(((s, name) for name, s in self.by_test.items()), default=(0.0, ""))


@dataclass
class Suite:
    modules: dict[str, Module] = field(default_factory=dict)
    categories: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    lanes: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """Per worker: busy seconds, its first start, its last end (epoch seconds)."""
    reruns: list[str] = field(default_factory=list)

    def module(self, nodeid: str) -> Module:
        path = nodeid.split("::", 1)[0]
        return self.modules.setdefault(path, Module(path))


def plain(name: str) -> str:
    """A test's id or name without the "@GROUP" xdist appends to a grouped test's."""
    return name.split("@", 1)[0]


def module_of_classname(classname: str) -> str:
    """JUnit's `tests.job.test_x` (or `tests.job.test_x.TestClass`) as a path."""
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return "/".join(parts) + ".py"


def from_junit(path: Path) -> Suite:
    suite = Suite()
    for case in ET.parse(path).getroot().iter("testcase"):
        module = suite.module(module_of_classname(case.get("classname", "")))
        name = plain(case.get("name", ""))
        module.add(name, float(case.get("time", "0")), case.find("skipped") is None)
        # JUnit names no markers: a lab test runs on a generation, or lives in a *_cluster module.
        on_a_lab = re.search(r"\[(22\.05|24\.11)[]-]", name) or module.path.endswith("_cluster.py")
        module.lab = module.lab or bool(on_a_lab)
    return suite


def records(folder: Path) -> Iterable[tuple[str, dict[str, object]]]:
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                yield path.stem, json.loads(line)


def from_times(folder: Path, suite: Suite | None = None) -> Suite:
    """The table from the clock's records; with `suite` (from JUnit), only the categories and
    lanes are added to it."""
    from_records = suite is None
    suite = suite or Suite()
    busy: dict[str, float] = defaultdict(float)
    first: dict[str, float] = {}
    last: dict[str, float] = defaultdict(float)
    total = 0.0
    counted_calls: set[str] = set()
    for worker, r in records(folder):
        kind, s = r["kind"], float(r["s"])  # type: ignore[arg-type]
        if kind == "phase":
            total += s
            busy[worker] += s
            start = float(r["start"])  # type: ignore[arg-type]
            first[worker] = min(first.get(worker, start), start)
            last[worker] = max(last[worker], start + s)
            test = plain(str(r["test"]))
            if r["outcome"] == "rerun":
                suite.reruns.append(test)
            if from_records:
                module = suite.module(test)
                module.lab = module.lab or bool(r["lab"])
                # A test counts once, at its call (a skipped one has none), however often rerun.
                counted = r["when"] == "call" and test not in counted_calls
                if counted:
                    counted_calls.add(test)
                module.add(test.split("::", 1)[-1], s, counted)
        elif kind == "fixture" and r["shared"]:
            suite.categories["module fixtures (reference runs, bundles)"] += s
        elif kind == "span":
            if r.get("fixture"):
                continue  # inside a module fixture's setup: counted there
            suite.categories[SPAN_CATEGORY[str(r["what"])]] += s
    named = sum(v for k, v in suite.categories.items() if k != CATEGORIES[-1])
    suite.categories[CATEGORIES[-1]] = max(0.0, total - named)
    suite.lanes = {w: (busy[w], first[w], last[w]) for w in busy}
    return suite


def load_budgets(path: Path) -> dict[str, float]:
    data = json.loads(path.read_text())
    return {str(k): float(v) for k, v in data["budgets"].items()}


def over_budget(suite: Suite, budgets: dict[str, float]) -> list[str]:
    """A line for each lab module past its budget, and for each without one."""
    lines = []
    for path, module in sorted(suite.modules.items()):
        if not module.lab:
            continue
        budget = budgets.get(path)
        if budget is None:
            lines.append(f"{path}: {module.seconds:.0f} s and no budget in {BUDGETS.relative_to(ROOT)}")
        elif module.seconds > budget:
            lines.append(f"{path}: {module.seconds:.0f} s, past its budget of {budget:.0f} s")
    return lines


def table(suite: Suite, budgets: dict[str, float]) -> list[str]:
    """The markdown table: lab modules by time, then the rest of the suite in one line a folder."""
    rows = ["| module | tests | test time (s) | budget (s) | slowest test (s) |", "|---|---:|---:|---:|---|"]
    lab = sorted((m for m in suite.modules.values() if m.lab), key=lambda m: -m.seconds)
    for m in lab:
        budget = budgets.get(m.path)
        rows.append(
            f"| {m.path} | {m.tests} | {m.seconds:.0f} | {'' if budget is None else f'{budget:.0f}'} "
            f"| {m.slowest[1]} ({m.slowest[0]:.0f}) |"
        )
    folders: dict[str, list[Module]] = defaultdict(list)
    for m in suite.modules.values():
        if not m.lab:
            folders[str(Path(m.path).parent)].append(m)
    for folder, ms in sorted(folders.items(), key=lambda kv: -sum(m.seconds for m in kv[1])):
        slow = max(ms, key=lambda m: m.seconds)
        rows.append(
            f"| {folder}/ (no lab, {len(ms)} modules) | {sum(m.tests for m in ms)} "
            f"| {sum(m.seconds for m in ms):.0f} | | {slow.path} ({slow.seconds:.0f}) |"
        )
    lab_s = sum(m.seconds for m in lab)
    all_s = sum(m.seconds for m in suite.modules.values())
    tests = sum(m.tests for m in suite.modules.values())
    rows.append(f"| **all** ({len(lab)} lab modules: {lab_s:.0f} s) | {tests} | {all_s:.0f} | | |")
    return rows


def report(suite: Suite, budgets: dict[str, float]) -> list[str]:
    lines = table(suite, budgets)
    if any(suite.categories.values()):
        total = sum(suite.categories.values()) or 1.0
        lines += ["", "| spent on | s | share |", "|---|---:|---:|"]
        lines += [f"| {k} | {v:.0f} | {v / total:.0%} |" for k, v in suite.categories.items()]
    if suite.lanes:
        start = min(f for _, f, _ in suite.lanes.values())
        end = max(e for _, _, e in suite.lanes.values())
        lines += ["", f"workers: wall {end - start:.0f} s from the first test to the last"]
        for worker, (busy, _, last) in sorted(suite.lanes.items()):
            lines.append(
                f"- {worker}: busy {busy:.0f} s, done {last - start:.0f} s in, "
                f"idle {end - last:.0f} s at the end"
            )
    if suite.reruns:
        lines += ["", "run again after a failure (a wait to fix, not a rerun to keep):"]
        lines += [f"- {t}" for t in suite.reruns]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--times", type=Path, help="the folder SLURMDDP_SUITE_TIMES named")
    parser.add_argument("--junit", type=Path, help="a pytest --junitxml report")
    parser.add_argument("--budgets", type=Path, default=BUDGETS)
    parser.add_argument("--over-budget", action="store_true", help="print only the modules past their budget")
    args = parser.parse_args(argv)
    if args.times is None and args.junit is None:
        parser.error("give --times DIR, --junit FILE or both")
    suite = from_junit(args.junit) if args.junit else None
    if args.times is not None:
        suite = from_times(args.times, suite)
    assert suite is not None
    budgets = load_budgets(args.budgets) if args.budgets.exists() else {}
    over = over_budget(suite, budgets)
    if not args.over_budget:
        print("\n".join(report(suite, budgets)))
    if over:
        print(
            "\nlab modules past their budget (tests/suite_budgets.json; see CONTRIBUTING.md):",
            file=sys.stderr,
        )
        print("\n".join(f"- {line}" for line in over), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
