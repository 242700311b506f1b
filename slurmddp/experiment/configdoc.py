"""docs/config.md from the schema itself: every key of an experiment with its type, its default
and the docstring written under its field in schema.py, so the reference cannot drift from the
code. `python -m slurmddp.experiment.configdoc > docs/config.md` rewrites it; a unit test fails
when the two disagree. Reads the schema's source with `ast`, imports nothing heavy.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import json
import types
import typing
from typing import Any, Literal, Union

from slurmddp.experiment.schema import Experiment

REGENERATE = "python -m slurmddp.experiment.configdoc > docs/config.md"

_HEADER = f"""# Configuration reference

<!-- Generated from the field docstrings of slurmddp/experiment/schema.py (edit them there, not
here), by `{REGENERATE}` -->

An experiment is one YAML file. Layers, later winning: built-in defaults < cluster profile
(`profile:`) < the experiment file < `key=value` overrides on the command line. A bare override
key (`lr=0.1`) means `train.lr` when the experiment's `train:` has it. An override of a `train:`
key the file sets to a number or a flag takes its type (`lr=1` is 1.0; `epochs=3.5` is refused).
Relative entrypoint paths are looked up from the submit directory, then from the experiment file's.
A sweep (`sweep:`) is described in [runs.md](runs.md#sweeps).

Every value that reaches the batch script is quoted (submitit's `shlex.quote`) and one line (a
newline in a Slurm value is refused: sbatch would run the rest of the line as shell code); the
entrypoint, its arguments and `train:` travel in the job's pickle, never through the shell.
"""


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass `cls`, by field name; ValueError naming the
    fields without one (a key the reference could not explain)."""
    (node,) = ast.parse(inspect.getsource(cls)).body
    assert isinstance(node, ast.ClassDef)
    docs: dict[str, str] = {}
    for statement, following in itertools.pairwise(node.body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs and not _is_section(cls, f.name)]
    if missing:
        raise ValueError(
            f"{cls.__name__}: no docstring under {', '.join(missing)}; write one below each field"
        )
    return docs


def _is_section(cls: type, name: str) -> bool:
    return dataclasses.is_dataclass(typing.get_type_hints(cls)[name])


def type_text(hint: Any) -> str:
    """A type as a user writes its values: `"node" | "task"`, `int | null`, `list[str]`."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return " | ".join(json.dumps(arg) for arg in typing.get_args(hint))
    if origin in (Union, types.UnionType):
        return " | ".join(type_text(arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if hint is Any:
        return "any"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_text(arg) for arg in typing.get_args(hint))}]"
    return str(hint.__name__)


def default_text(field: dataclasses.Field[Any]) -> str:
    """The default as YAML would spell it."""
    if field.default_factory is not dataclasses.MISSING:
        return json.dumps(field.default_factory())
    return json.dumps(field.default)


def _section(cls: type, prefix: str) -> list[str]:
    """The lines of `cls`'s own keys, then one section per nested dataclass."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    lines: list[str] = []
    nested: list[str] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            assert isinstance(hint, type)
            nested += ["", *_section(hint, f"{prefix}{f.name}.")]
            continue
        lines.append(
            f"- `{prefix}{f.name}` (`{type_text(hint)}`, default `{default_text(f)}`): {docs[f.name]}"
        )
    title = f"## `{prefix.rstrip('.')}`" if prefix else "## Top level"
    return [title, "", " ".join((cls.__doc__ or "").split()), "", *lines, *nested]


def render() -> str:
    """The whole of docs/config.md."""
    return _HEADER + "\n" + "\n".join(_section(Experiment, "")) + "\n"


if __name__ == "__main__":
    print(render(), end="")
