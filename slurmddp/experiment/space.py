"""One sweep parameter's values: the `random:` and `search:` kinds' grammar -> a `Param`.

    {choice: [64, 128]}  {uniform: [0, 0.5]}  {log_uniform: [1.0e-4, 0.1]}  {int: [2, 8]}

and, so that a space written for Hydra's Optuna sweeper carries over, its override strings:

    choice(64, 128)  interval(0, 0.5)  tag(log, interval(1e-4, 0.1))  int(interval(2, 8))
    tag(log, int(interval(8, 512)))  range(1, 9, step=2)

`range` is Python's and Hydra's: its stop is left out (range(1, 9, step=2) is 1, 3, 5, 7). Pure;
Optuna is not imported here (a login node may lack it): search/ turns a Param into Optuna's
distribution.
"""

from __future__ import annotations

import ast
import math
import random
from dataclasses import dataclass
from typing import Any, Literal

from slurmddp.errors import ConfigError

Kind = Literal["float", "int", "categorical"]
NAMES = ("choice", "uniform", "log_uniform", "int")
GRID_LIMIT = 100_000
"""The most values one parameter may enumerate for the grid sampler."""
_FORMS = (
    "{choice: [a, b, ...]}, {uniform: [low, high]}, {log_uniform: [low, high]}, {int: [low, high]}, "
    "or Hydra's choice(a, b), interval(low, high), tag(log, interval(low, high)), "
    "int(interval(low, high)), range(start, stop, step=s)"
)


@dataclass(frozen=True)
class Param:
    """The values one parameter may take: numbers in [low, high] (on a log scale, or every
    `step`), or one of `choices`."""

    key: str
    """The full config key, as `train.lr`."""
    kind: Kind
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def sample(self, rng: random.Random) -> Any:
        """One value drawn uniformly (the `random:` kind's draw)."""
        if self.kind == "categorical":
            return self.choices[rng.randrange(len(self.choices))]
        assert self.low is not None and self.high is not None
        if self.step is not None:
            return self._at(rng.randint(0, self._steps()))
        if self.kind == "int":
            if self.log:
                return round(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
            return rng.randint(int(self.low), int(self.high))
        if self.log:
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)

    def values(self) -> list[Any] | None:
        """Every value, where there is a finite number of them (what the grid sampler walks)."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.log or (self.kind == "float" and self.step is None):
            return None
        count = self._steps() + 1
        return None if count > GRID_LIMIT else [self._at(i) for i in range(count)]

    def _at(self, i: int) -> float | int:
        """The i-th value from low; a float step's to 12 digits (0.1 + 2 * 0.1 is 0.3, not
        0.30000000000000004)."""
        assert self.low is not None
        value = self.low + (self.step if self.step is not None else 1) * i
        return float(f"{value:.12g}") if isinstance(value, float) else value

    def _steps(self) -> int:
        assert self.low is not None and self.high is not None
        step = self.step if self.step is not None else 1
        # A float step (range(0.1, 1.0, step=0.1)) lands a hair off its stop: round, then keep inside.
        steps = round((self.high - self.low) / step)
        return int(steps if self.low + step * steps <= self.high + 1e-12 * abs(step) else steps - 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "low": self.low,
            "high": self.high,
            "log": self.log,
            "step": self.step,
            "choices": list(self.choices),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Param:
        return cls(
            str(data["key"]),
            data["kind"],
            data.get("low"),
            data.get("high"),
            bool(data.get("log")),
            data.get("step"),
            tuple(data.get("choices") or ()),
        )


def parse(key: str, spec: Any, where: str) -> Param:
    """`spec` (the YAML grammar or a Hydra string) of the parameter `key` -> its Param."""
    if isinstance(spec, str):
        return _hydra(key, spec, where)
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in NAMES:
        raise ConfigError(f"{where}: must be one of {_FORMS}; got {spec!r}")
    name, args = next(iter(spec.items()))
    if name == "choice":
        if not isinstance(args, list) or not args:
            raise ConfigError(f"{where}.choice: needs a non-empty list of values")
        return Param(key, "categorical", choices=tuple(args))
    if not (isinstance(args, list) and len(args) == 2 and all(map(_number, args)) and args[0] < args[1]):
        raise ConfigError(f"{where}.{name}: needs [low, high] with low < high, got {args!r}")
    low, high = args
    if name == "int":
        if not all(isinstance(v, int) for v in args):
            raise ConfigError(f"{where}.int: bounds must be integers, got {args!r}")
        return Param(key, "int", low, high)
    if name == "log_uniform" and low <= 0:
        raise ConfigError(f"{where}.log_uniform: bounds must be > 0, got {args!r}")
    return Param(key, "float", float(low), float(high), log=name == "log_uniform")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _hydra(key: str, text: str, where: str) -> Param:
    """A Hydra sweep string, read as the Python call it looks like (`log` and unquoted choices are
    names, read as strings)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ConfigError(f"{where}: {text!r} is not a sweep; write one of {_FORMS}") from None
    try:
        return _call(key, node, where, log=False, integer=False)
    except _NotASweep as exc:
        raise ConfigError(f"{where}: {text!r}: {exc}; write one of {_FORMS}") from None


class _NotASweep(Exception):
    pass


def _call(key: str, node: ast.expr, where: str, *, log: bool, integer: bool) -> Param:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise _NotASweep("expected choice(...), interval(...), range(...), int(...) or tag(...)")
    name, args = node.func.id, node.args
    keywords = {k.arg: _value(k.value) for k in node.keywords}
    if name == "tag":
        tags = [_value(a) for a in args[:-1]]
        if not args or tags != ["log"] or keywords:
            raise _NotASweep("tag(...) takes `log` and one interval, as tag(log, interval(1e-4, 1))")
        return _call(key, args[-1], where, log=True, integer=integer)
    if name == "int":
        if len(args) != 1 or keywords:
            raise _NotASweep("int(...) takes one interval, as int(interval(2, 8))")
        return _call(key, args[0], where, log=log, integer=True)
    if name == "choice":
        if not args or keywords or log or integer:
            raise _NotASweep("choice(...) takes one or more values")
        return Param(key, "categorical", choices=tuple(_value(a) for a in args))
    if name == "interval":
        low, high = _bounds(args, keywords, "interval(low, high)")
        if log and low <= 0:
            raise _NotASweep("a log interval's bounds must be > 0")
        if integer:
            return Param(key, "int", math.ceil(low), math.floor(high), log=log)
        return Param(key, "float", float(low), float(high), log=log)
    if name == "range":
        return _range(key, args, keywords, log or integer)
    raise _NotASweep(f"unknown sweep {name}(...)")


def _range(key: str, args: list[ast.expr], keywords: dict[str | None, Any], tagged: bool) -> Param:
    values = [_value(a) for a in args]
    step = keywords.pop("step", values.pop(2) if len(values) == 3 else 1)
    if tagged or keywords or len(values) != 2 or not all(_number(v) for v in (*values, step)) or step <= 0:
        raise _NotASweep("range(start, stop, step=s) takes numbers, step > 0")
    start, stop = values
    # Rounded first: (1.0 - 0.1) / 0.1 is 9.000000000000002, and 1.0 would be in.
    count = math.ceil(round((stop - start) / step, 9))
    last = start + step * (count - 1)
    if count < 1:
        raise _NotASweep("the range is empty (its stop is left out, as in Python)")
    if all(isinstance(v, int) for v in (start, stop, step)):
        return Param(key, "int", start, last, step=None if step == 1 else step)
    return Param(key, "float", float(start), float(last), step=float(step))


def _bounds(args: list[ast.expr], keywords: dict[str | None, Any], form: str) -> tuple[float, float]:
    values = [_value(a) for a in args]
    if keywords or len(values) != 2 or not all(_number(v) for v in values) or values[0] >= values[1]:
        raise _NotASweep(f"{form} takes two numbers, low < high")
    return values[0], values[1]


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return {"true": True, "false": False, "null": None}.get(node.id, node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _value(node.operand)
        if _number(inner):
            return -inner
    raise _NotASweep(f"{ast.unparse(node)!r} is not a plain value")
