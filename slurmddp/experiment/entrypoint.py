"""Check on the login node that an entrypoint exists, without running a line of the user's code.

Importing the user's module there would import torch and whatever else it needs (seconds, and a
login node may lack them), so modules are located with the path finder and read as an AST.
"""

from __future__ import annotations

import ast
import difflib
import importlib.machinery
import sys
from pathlib import Path

from slurmddp.errors import ConfigError


def is_file_target(module: str) -> bool:
    return module.endswith(".py") or "/" in module


def check_function(target: str, workdir: Path, exp_dir: Path) -> str:
    """Validate `module:function` or `file.py:function`; return it with a file made absolute."""
    module, _, name = target.rpartition(":")
    if is_file_target(module):
        source = _find_file("entrypoint.function", module, workdir, exp_dir)
        normalized = f"{source}:{name}"
    else:
        source = _locate(module, [str(workdir), *sys.path[1:]])
        normalized = target
    names = _top_level_names(source)
    if name not in names:
        near = difflib.get_close_matches(name, sorted(names), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"entrypoint.function: {source} defines no top-level {name!r}{hint}")
    return normalized


def check_script(script: str, workdir: Path, exp_dir: Path) -> str:
    """Validate a torchrun-style script; return its absolute path."""
    source = _find_file("entrypoint.script", script, workdir, exp_dir)
    _parse(source)
    return str(source)


def _find_file(key: str, name: str, workdir: Path, exp_dir: Path) -> Path:
    """A relative path is taken from the submit directory, else from the experiment file's."""
    for base in (workdir, exp_dir):
        candidate = (base / name).resolve()
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{key}: no file {name!r} (looked in {workdir} and {exp_dir.resolve()})")


def _locate(module: str, search_path: list[str]) -> Path:
    """The source file of a dotted module, found as the import system would, importing nothing."""
    path: list[str] | None = search_path
    spec = None
    parts = module.split(".")
    for depth in range(len(parts)):
        name = ".".join(parts[: depth + 1])
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            raise ConfigError(
                f"entrypoint.function: cannot find module {name!r}; run submit from the directory that "
                "holds it, install it, or give a file path such as 'train.py:main'"
            )
        path = list(spec.submodule_search_locations or []) or None
    assert spec is not None
    if not spec.origin or not spec.origin.endswith(".py"):
        raise ConfigError(f"entrypoint.function: module {module!r} has no Python source file to read")
    return Path(spec.origin)


def _parse(source: Path) -> ast.Module:
    try:
        return ast.parse(source.read_text(), filename=str(source))
    except SyntaxError as exc:
        raise ConfigError(f"{source}:{exc.lineno}: syntax error: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read it: {exc}") from None


def _top_level_names(source: Path) -> set[str]:
    names: set[str] = set()
    for node in _parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names
