"""Read on the login node, before anything is created: a function entrypoint that cannot take the
RunContext, and a script (or module) that only defines the training function and never runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmddp.errors import ConfigError
from slurmddp.experiment.entrypoint import check_function, check_module, check_script


def source(tmp_path: Path, text: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "definition",
    [
        "def main():",
        "def main(ctx, lr):",
        "def main(*, ctx):",
        "def main(ctx, *, lr):",
        "async def main():",
    ],
)
def test_a_function_that_cannot_take_the_context_is_refused(tmp_path: Path, definition: str) -> None:
    path = source(tmp_path, f"import torch\n\n\n{definition}\n    pass\n")
    with pytest.raises(ConfigError) as refused:
        check_function("train.py:main", tmp_path, tmp_path)
    assert str(refused.value) == (
        f"entrypoint.function: main() at {path}:4 cannot be called with one argument, the RunContext "
        "each rank hands it; define it as `def main(ctx):`"
    )


@pytest.mark.parametrize(
    "definition",
    [
        "def main(ctx):",
        "def main(ctx, lr=0.1, *, seed=0):",
        "def main(*args):",
        "def main(ctx, /):",
        "@wrapped\ndef main():",  # a decorator may change how it is called: not ours to judge
    ],
)
def test_a_function_that_can_take_the_context_passes(tmp_path: Path, definition: str) -> None:
    source(tmp_path, f"{definition}\n    pass\n")
    assert check_function("train.py:main", tmp_path, tmp_path) == f"{tmp_path / 'train.py'}:main"


def test_a_name_bound_otherwise_is_not_judged(tmp_path: Path) -> None:
    source(tmp_path, "from pkg import main\n")
    assert check_function("train.py:main", tmp_path, tmp_path).endswith("train.py:main")


def test_a_script_that_only_defines_the_training_function_is_refused(tmp_path: Path) -> None:
    path = source(tmp_path, "import torch\n\n\ndef main(ctx):\n    ctx.log(step=1)\n")
    with pytest.raises(ConfigError) as refused:
        check_script("train.py", tmp_path, tmp_path)
    assert str(refused.value) == (
        f'entrypoint.script: {path} defines main(ctx) and has no `if __name__ == "__main__":` block, '
        "so run as a script it would train nothing; did you mean entrypoint: train.py:main?"
    )


def test_a_module_that_only_defines_the_training_function_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    source(tmp_path / "pkg", "def fit(context: 'RunContext'):\n    pass\n", "train.py")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    with pytest.raises(ConfigError, match=r"did you mean entrypoint: pkg\.train:fit\?"):
        check_module("pkg.train", tmp_path, tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        "def main(ctx):\n    pass\n\n\nif __name__ == '__main__':\n    main(None)\n",
        "def main(ctx):\n    pass\n\n\nmain(None)\n",
        "def main(args):\n    pass\n",  # not named as a context: a helper, not a forgotten entrypoint
        "import torch\ntorch.ones(1)\n",
    ],
)
def test_a_script_that_runs_something_passes(tmp_path: Path, text: str) -> None:
    source(tmp_path, text)
    assert check_script("train.py", tmp_path, tmp_path) == str(tmp_path / "train.py")
