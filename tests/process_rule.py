"""The `process` marker: which tests start processes, and the guard that keeps the rule honest.

A test is marked `process` when its own code, a fixture it uses, or a function of tests/ that
either calls (followed through tests/ helpers, not into slurmddp) names something that starts a
process: subprocess's runners, os.fork/posix_spawn/system, multiprocessing's processes and pools,
torch.multiprocessing.spawn. `pytest -m "not slurm and not process"` is then a unit run of seconds.

What the rule cannot see (a process started inside slurmddp, a DataLoader's workers) the guard
catches: in a test marked neither `process` nor `slurm`, starting a process during its setup or
its call fails the test with the fix to make, an explicit `@pytest.mark.process`. So a test is
never silently slow in the unit run.
"""

from __future__ import annotations

import _posixsubprocess
import ast
import concurrent.futures  # noqa: F401  (in sys.modules for _starters)
import inspect
import multiprocessing  # noqa: F401  (in sys.modules for _starters)
import os
import platform
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent

_STARTERS_BY_MODULE: dict[str, tuple[str, ...]] = {
    "subprocess": ("run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"),
    "os": ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnv", "spawnvp"),
    "multiprocessing": ("Process", "Pool", "get_context"),
    "concurrent.futures": ("ProcessPoolExecutor",),
    "torch.multiprocessing": ("spawn", "start_processes", "Process", "get_context"),
}


def _starters() -> set[int]:
    """ids of the callables that start a process; torch's only once a test module imported it
    (the rule must not import torch for the tests that do not)."""
    return {
        id(getattr(sys.modules[module], attr))
        for module, attrs in _STARTERS_BY_MODULE.items()
        if module in sys.modules
        for attr in attrs
        if hasattr(sys.modules[module], attr)
    }


def _resolve(node: ast.expr, namespace: dict[str, Any]) -> Any:
    """The object a dotted name (`subprocess.run`, `mp.spawn`, `helper`) stands for, or None."""
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, namespace)
        return getattr(owner, node.attr, None) if owner is not None else None
    return None


def _in_tests(obj: Any) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and Path(code.co_filename).resolve().is_relative_to(TESTS_DIR)


@cache
def starts_process(func: Callable[..., Any]) -> bool:
    """Whether `func`'s source names a process starter, directly or through a tests/ function."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return False
    namespace = {**vars(sys.modules["builtins"]), **func.__globals__}
    starters = _starters()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        obj = _resolve(node, namespace)
        if obj is None or obj is func:
            continue
        if id(obj) in starters or (_in_tests(obj) and starts_process(obj)):
            return True
    return False


def mark_process_tests(items: list[pytest.Item]) -> None:
    """Add the `process` marker to every test whose code or fixtures start a process (`slurm`
    tests keep their own marker alone)."""
    for item in items:
        if may_start_processes(item) or not isinstance(item, pytest.Function):
            continue
        fixtures = item._fixtureinfo.name2fixturedefs.values()
        funcs = [item.obj, *(defs[-1].func for defs in fixtures)]
        if any(_in_tests(func) and starts_process(func) for func in funcs):
            item.add_marker(pytest.mark.process)


def may_start_processes(item: pytest.Item) -> bool:
    """Whether the guard lets `item` start processes: a `process` test, or a `slurm` one (a lab
    test starts them by nature, and so does the lab it sets up)."""
    return any(item.get_closest_marker(name) is not None for name in ("process", "slurm"))


class ProcessInUnitTest(RuntimeError):
    """A test not marked `process` started one."""


@contextmanager
def processes_refused(item: pytest.Item) -> Iterator[list[str]]:
    """While the block runs, starting a process raises ProcessInUnitTest naming the fix; yields
    the list of what was refused (a caller that swallowed the error still leaves it there)."""
    refused: list[str] = []
    patch = pytest.MonkeyPatch()

    def refuse(what: str) -> Callable[..., Any]:
        def refused_start(*args: Any, **kwargs: Any) -> Any:
            refused.append(what)
            raise ProcessInUnitTest(
                f"{item.nodeid} started a process ({what}) but is not marked `process`: decorate it "
                "with @pytest.mark.process (or mark the parameter: pytest.param(..., "
                "marks=pytest.mark.process)), so that `-m 'not process'` stays a unit run of seconds"
            )

        return refused_start

    # The lowest doors: subprocess and multiprocessing's spawn and forkserver go through
    # _posixsubprocess.fork_exec or os.posix_spawn, the fork context through os.fork.
    patch.setattr(subprocess.Popen, "_execute_child", refuse("subprocess.Popen"))
    patch.setattr(_posixsubprocess, "fork_exec", refuse("fork_exec"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        patch.setattr(os, name, refuse(f"os.{name}"))
    try:
        yield refused
    finally:
        patch.undo()


def prime_process_caches() -> None:
    """Make the lookups that start a process once and keep the answer for the life of the process
    (platform's `uname -p`, which MLflow asks for; the sbatch on PATH's version, which every plan
    asks for) before the first test, so that the guard does not blame whichever test came first."""
    from slurmddp.cluster import slurm

    platform.processor()
    slurm.version_text()
