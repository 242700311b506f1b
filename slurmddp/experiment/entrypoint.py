"""Check on the login node that an entrypoint exists, without running a line of the user's code.

Importing the user's module there would import torch and whatever else it needs (seconds, and a
login node may lack them), so modules are located with the path finder and read as an AST.
"""

from __future__ import annotations

import ast
import difflib
import importlib.machinery
import pkgutil
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
    tree = _parse(source)
    names = _top_level_names(tree)
    if name not in names:
        near = difflib.get_close_matches(name, sorted(names), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"entrypoint.function: {source} defines no top-level {name!r}{hint}")
    function = _function(tree, name)
    if function is not None and not _takes_one_argument(function):
        raise ConfigError(
            f"entrypoint.function: {name}() at {source}:{function.lineno} cannot be called with one "
            f"argument, the RunContext each rank hands it; define it as `def {name}(ctx):`"
        )
    return normalized


def check_script(script: str, workdir: Path, exp_dir: Path) -> str:
    """Validate a torchrun-style script; return its absolute path."""
    source = _find_file("entrypoint.script", script, workdir, exp_dir)
    _refuse_a_function_never_run("entrypoint.script", _parse(source), source, script)
    return str(source)


def check_module(module: str, workdir: Path, exp_dir: Path) -> str:
    """Validate a module run as `python -m module` (torchrun's -m); return its name.

    The ranks start in the submit directory, which `python -m` puts first on sys.path, so the
    module is looked up there first, then on this Python's path, as for a function entrypoint.
    `exp_dir` is not searched (`python -m` would not see it); it only feeds the hint.
    """
    search_path = [str(workdir), *sys.path[1:]]
    spec = _find_spec("entrypoint.module", module, search_path, exp_dir)
    if spec.submodule_search_locations is not None:
        # A package: `python -m package` (and torchrun -m) runs package.__main__.
        locations = list(spec.submodule_search_locations)
        main = importlib.machinery.PathFinder.find_spec(f"{module}.__main__", locations)
        if main is None:
            inside = sorted({info.name for info in pkgutil.iter_modules(locations)})
            example = f"{module}.{inside[0]}" if inside else f"{module}.train"
            listed = f" (it holds {', '.join(inside)})" if inside else ""
            raise ConfigError(
                f"entrypoint.module: {module!r} is a package with no __main__.py in "
                f"{', '.join(locations)}, and `python -m {module}` runs its __main__; add a __main__.py "
                f"there, or name the module to run, such as {example!r}{listed}"
            )
        spec = main
    if not spec.origin or not spec.origin.endswith(".py"):
        raise ConfigError(f"entrypoint.module: module {module!r} has no Python source file to read")
    try:
        tree = _parse(Path(spec.origin))
    except ConfigError as exc:
        raise ConfigError(f"entrypoint.module: {exc}") from None
    _refuse_a_function_never_run("entrypoint.module", tree, Path(spec.origin), module)
    return module


def _find_file(key: str, name: str, workdir: Path, exp_dir: Path) -> Path:
    """A relative path is taken from the submit directory, else from the experiment file's."""
    bases = list(dict.fromkeys((workdir.resolve(), exp_dir.resolve())))  # submitted from EXP_DIR: one
    for base in bases:
        candidate = (base / name).resolve()
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{key}: no file {name!r} (looked in {' and '.join(map(str, bases))})")


def _locate(module: str, search_path: list[str]) -> Path:
    """The source file of a dotted module, found as the import system would, importing nothing."""
    spec = _find_spec("entrypoint.function", module, search_path)
    if not spec.origin or not spec.origin.endswith(".py"):
        raise ConfigError(f"entrypoint.function: module {module!r} has no Python source file to read")
    return Path(spec.origin)


def _find_spec(
    key: str, module: str, search_path: list[str], exp_dir: Path | None = None
) -> importlib.machinery.ModuleSpec:
    """The spec of a dotted module, each parent found in the one before, importing nothing."""
    path: list[str] | None = search_path
    spec = None
    parts = module.split(".")
    for depth in range(len(parts)):
        name = ".".join(parts[: depth + 1])
        searched = path
        spec = importlib.machinery.PathFinder.find_spec(name, path) if path is not None else None
        if spec is None:
            raise ConfigError(_not_found(key, name, searched, search_path, exp_dir))
        path = list(spec.submodule_search_locations or []) or None
    assert spec is not None
    return spec


def _not_found(
    key: str, name: str, searched: list[str] | None, search_path: list[str], exp_dir: Path | None
) -> str:
    """What was searched for `name` (the first part of the dotted name not found), and the fix."""
    parent, _, last = name.rpartition(".")
    if searched is None:
        # `python -m train.py` fails the same way: 'train' is found, and holds no 'py'.
        hint = f"; a module is named without '.py': {parent!r} (a file goes in entrypoint.script)"
        hint = hint if last == "py" and key == "entrypoint.module" else ""
        return f"{key}: {parent!r} is a module, not a package, so it holds no {last!r}{hint}"
    where = (
        f"in package {parent!r} ({', '.join(searched)})" if parent else f"in {search_path[0]} or on sys.path"
    )
    message = f"{key}: cannot find module {name!r} {where}"
    # A near name in the submit directory before one anywhere on sys.path.
    for where_near in (searched[:1], searched):
        near = difflib.get_close_matches(
            last, sorted({m.name for m in pkgutil.iter_modules(where_near)}), n=1
        )
        if near:
            break
    if near:
        return f"{message}; did you mean {'.'.join(filter(None, (parent, near[0])))!r}?"
    if key != "entrypoint.module":
        return (
            f"{message}; run submit from the directory that holds it, install it, "
            "or give a file path such as 'train.py:main'"
        )
    if not parent and exp_dir is not None and _holds(exp_dir.resolve(), last):
        return (
            f"{message}; it is in {exp_dir.resolve()}, but the ranks run `python -m` from the submit "
            f"directory: run submit from {exp_dir.resolve()}, or install the package"
        )
    return f"{message}; run submit from the directory that holds it, or install it"


def _holds(directory: Path, name: str) -> bool:
    return (directory / f"{name}.py").is_file() or (directory / name).is_dir()


def _parse(source: Path) -> ast.Module:
    try:
        return ast.parse(source.read_text(), filename=str(source))
    except SyntaxError as exc:
        raise ConfigError(f"{source}:{exc.lineno}: syntax error: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read it: {exc}") from None


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


CONTEXT_NAMES = frozenset({"ctx", "context", "run_context"})
"""What a training function names the RunContext it takes; a script defining one expects a call."""


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The top-level function `name` as written; None where something else binds the name, or a
    decorator may change how it is called."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            found = node  # the last definition wins, as at import
    return found if found is not None and not found.decorator_list else None


def _takes_one_argument(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    required = len(positional) - len(arguments.defaults)
    keyword_only_required = any(default is None for default in arguments.kw_defaults)
    can_take_one = bool(positional) or arguments.vararg is not None
    return can_take_one and required <= 1 and not keyword_only_required


def _refuse_a_function_never_run(key: str, tree: ast.Module, source: Path, target: str) -> None:
    """A script that only defines `main(ctx)` (the function entrypoint's `:main` forgotten) would
    run, define it, and end at once: a COMPLETED job that trained nothing."""
    if any(_is_main_guard(node) for node in tree.body):
        return
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    for node in tree.body:
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name not in called
            and _takes_a_context(node)
        ):
            raise ConfigError(
                f"{key}: {source} defines {node.name}({node.args.args[0].arg}) and has no "
                f'`if __name__ == "__main__":` block, so run as a script it would train nothing; '
                f"did you mean entrypoint: {target}:{node.name}?"
            )


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    return any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)


def _takes_a_context(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    arguments = function.args
    only = arguments.args[0] if len(arguments.args) == 1 and not arguments.posonlyargs else None
    if only is None:
        return False
    annotation = ast.unparse(only.annotation) if only.annotation is not None else ""
    return only.arg in CONTEXT_NAMES or annotation.endswith("RunContext")
