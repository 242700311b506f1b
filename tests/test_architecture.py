"""The import rules of the package (written in slurmddp/__init__.py's docstring), checked on the
source: every import statement counts, those inside functions and under TYPE_CHECKING included,
because an import hidden in a function is still a dependency (it once hid a cycle here)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "slurmddp"
SIDES = ("experiment", "submit", "job", "manage", "cluster", "cli")
LEAVES = ("errors", "files", "yamlio", "layout", "defaults")
# The sides each side may import (besides itself and the leaf helpers).
ALLOWED = {
    "cluster": set(),
    "experiment": {"cluster"},
    "job": {"cluster", "experiment"},
    "submit": {"cluster", "experiment", "job"},
    "manage": {"cluster", "experiment", "job", "submit"},
    "cli": {"cluster", "experiment", "job", "submit", "manage"},
}
# What `submit` may take from `job`: the picklable spec handed to every rank and the callable that
# carries it, nothing that runs there.
SUBMIT_FROM_JOB = {"slurmddp.job.spec", "slurmddp.job.rank"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str
    """file:line of the import statement."""


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package under `root`, by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = ["slurmddp", *path.relative_to(root).with_suffix("").parts]
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def edges(known: dict[str, Path]) -> Iterator[Edge]:
    """Every import of one of our modules, resolved to the module it loads."""
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import mod` loads pkg.mod; `from mod import name` loads mod.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for target in targets:
                if target.split(".")[0] == "slurmddp" and target != name:
                    yield Edge(name, target, f"{path}:{node.lineno}")


def side(module: str) -> str:
    """experiment/submit/job/manage/cluster/cli, `leaf`, or `root` (the package and __main__)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "root"
    return parts[1] if parts[1] in SIDES else "leaf"


def violations(found: list[Edge]) -> list[str]:
    problems = []
    for edge in found:
        source, target = side(edge.source), side(edge.target)
        rule = None
        if source == "leaf":
            rule = "the leaf helpers import nothing of ours"
        elif target == "cli" and source not in ("cli", "root"):
            rule = "nothing imports cli"
        elif source == "root" or target in ("leaf", source):
            continue
        elif target == "root":
            rule = "the package's public names are for users; inside, import the defining module"
        elif target not in ALLOWED[source]:
            rule = f"{source} may import only {', '.join(sorted(ALLOWED[source])) or 'leaf helpers'}"
        elif source == "submit" and target == "job" and edge.target not in SUBMIT_FROM_JOB:
            rule = "submit takes only the picklable spec from job (slurmddp.job.spec, slurmddp.job.rank)"
        if rule:
            problems.append(f"{edge.where}: {edge.source} -> {edge.target}: {rule}")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def graphs(found: list[Edge]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    by_module: dict[str, set[str]] = {}
    by_side: dict[str, set[str]] = {}
    for edge in found:
        by_module.setdefault(edge.source, set()).add(edge.target)
        source, target = side(edge.source), side(edge.target)
        if source != target and "root" not in (source, target):
            by_side.setdefault(source, set()).add(target)
    return by_module, by_side


@pytest.fixture(scope="module")
def found() -> list[Edge]:
    return list(edges(modules()))


def test_every_module_lives_in_a_side_or_is_a_leaf_helper() -> None:
    loose = [name for name in modules() if side(name) == "leaf" and name.split(".")[1] not in LEAVES]
    assert loose == [], f"put these into the sub-package whose side of the flow they serve: {loose}"


def test_imports_follow_the_rules(found: list[Edge]) -> None:
    problems = violations(found)
    assert problems == [], "import rules broken:\n" + "\n".join(problems)


def test_no_import_cycles(found: list[Edge]) -> None:
    by_module, by_side = graphs(found)
    assert cycles(by_module) == [], "modules import each other in a cycle"
    assert cycles(by_side) == [], "sub-packages import each other in a cycle"


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """A job -> submit import, a leaf importing ours, and a two-module cycle hidden in a function
    are each reported: the rules above can fail."""
    for folder in ("job", "submit"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "errors.py").write_text("from slurmddp.layout import CONFIG\n")
    (tmp_path / "layout.py").write_text("CONFIG = 'config.yaml'\n")
    (tmp_path / "job" / "runtime.py").write_text("def f():\n    from slurmddp.submit import plan\n")
    (tmp_path / "submit" / "plan.py").write_text("from slurmddp.job.runtime import f\n")
    found = list(edges(modules(tmp_path)))
    problems = violations(found)
    assert any("slurmddp.job.runtime -> slurmddp.submit.plan: job may import only" in p for p in problems)
    assert any("slurmddp.errors -> slurmddp.layout: the leaf helpers" in p for p in problems)
    assert any("submit takes only the picklable spec" in p for p in problems)
    assert cycles(graphs(found)[0]) == [["slurmddp.job.runtime", "slurmddp.submit.plan"]]


EXECUTORS = ("local", "slurm")
EXECUTOR_HOME = PACKAGE / "manage" / "backend.py"
"""The one module of `manage` that knows what differs between the executors."""


def executor_tests(path: Path) -> list[str]:
    """Where `path` compares a value with an executor's name ("file:line")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            names = [part.value for part in (node.left, *node.comparators) if isinstance(part, ast.Constant)]
            if any(name in EXECUTORS for name in names):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_manage_asks_its_backend_instead_of_testing_the_executor() -> None:
    found = [
        where
        for path in sorted((PACKAGE / "manage").rglob("*.py"))
        if path != EXECUTOR_HOME
        for where in executor_tests(path)
    ]
    assert found == [], f"ask the run's backend (manage/backend.py) instead: {found}"


def test_the_executor_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "status.py").write_text('def f(executor):\n    return executor != "local"\n')
    assert executor_tests(tmp_path / "status.py") == ["status.py:2"]
