"""`entrypoint.module`: the schema's form checks, the shorthand, and the login-node check that the
module exists and parses, importing nothing."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from slurmddp.errors import ConfigError
from slurmddp.experiment.entrypoint import check_module
from slurmddp.experiment.load import load_experiment
from slurmddp.experiment.schema import Entrypoint, Experiment
from slurmddp.submit.plan import build

# Running any of these files would raise SystemExit: a check that imported them fails the test.
EXECUTED = "raise SystemExit('executed')\n"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    importlib.invalidate_caches()
    return root


def refused(module: str, workdir: Path, exp_dir: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        check_module(module, workdir, exp_dir or workdir)
    message = str(info.value)
    assert message.startswith("entrypoint.module"), message
    return message


def test_a_module_in_a_package_is_found_and_not_imported(tmp_path: Path) -> None:
    tree(tmp_path, {"mypkg/__init__.py": EXECUTED, "mypkg/train.py": "import torch\n" + EXECUTED})
    assert check_module("mypkg.train", tmp_path, tmp_path) == "mypkg.train"
    assert "mypkg" not in sys.modules and "mypkg.train" not in sys.modules


def test_a_top_level_module_is_found(tmp_path: Path) -> None:
    tree(tmp_path, {"trainmod.py": EXECUTED})
    assert check_module("trainmod", tmp_path, tmp_path) == "trainmod"


def test_a_package_runs_its_main(tmp_path: Path) -> None:
    tree(tmp_path, {"mainpkg/__init__.py": EXECUTED, "mainpkg/__main__.py": EXECUTED})
    assert check_module("mainpkg", tmp_path, tmp_path) == "mainpkg"


def test_a_package_without_main_names_the_fix(tmp_path: Path) -> None:
    tree(tmp_path, {"nomain/__init__.py": "", "nomain/train.py": "", "nomain/data.py": ""})
    message = refused("nomain", tmp_path)
    assert "no __main__.py" in message and str(tmp_path / "nomain") in message
    assert "'nomain.data'" in message and "train" in message


def test_a_missing_module_suggests_a_sibling(tmp_path: Path) -> None:
    tree(tmp_path, {"nearpkg/__init__.py": "", "nearpkg/train.py": ""})
    message = refused("nearpkg.trian", tmp_path)
    assert "cannot find module 'nearpkg.trian'" in message and str(tmp_path / "nearpkg") in message
    assert "did you mean 'nearpkg.train'?" in message
    assert "did you mean 'nearpkg'?" in refused("naerpkg.train", tmp_path)


def test_a_missing_module_says_where_it_looked(tmp_path: Path) -> None:
    message = refused("zz_nowhere_q", tmp_path)
    assert f"in {tmp_path} or on sys.path" in message and "run submit from the directory" in message


def test_a_module_beside_the_experiment_only_says_where_to_submit_from(tmp_path: Path) -> None:
    exp_dir = tree(tmp_path / "project", {"besidepkg/__init__.py": "", "besidepkg/__main__.py": ""})
    (tmp_path / "elsewhere").mkdir()
    message = refused("besidepkg", tmp_path / "elsewhere", exp_dir)
    assert f"run submit from {exp_dir}" in message


def test_a_file_name_is_not_a_module_name(tmp_path: Path) -> None:
    tree(tmp_path, {"script_like.py": ""})
    assert "without '.py': 'script_like'" in refused("script_like.py", tmp_path)


def test_a_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    tree(tmp_path, {"brokenpkg/__init__.py": "", "brokenpkg/__main__.py": "x = 1\ndef f(:\n"})
    message = refused("brokenpkg", tmp_path)
    assert f"{tmp_path / 'brokenpkg' / '__main__.py'}:2: syntax error" in message


@pytest.mark.parametrize("module", ["pkg/train", ".train", "pkg..train", "pkg.train:main", "1pkg", ""])
def test_a_module_name_must_be_dotted_identifiers(module: str) -> None:
    with pytest.raises(ConfigError, match=r"entrypoint\.module: .* is not a dotted module name"):
        Entrypoint(module=module)


def test_args_go_with_a_script_or_a_module_only() -> None:
    assert Entrypoint(module="pkg.train", args=["--lr", "3"]).args == ["--lr", "3"]
    with pytest.raises(ConfigError, match="only a script or a module takes args"):
        Entrypoint(function="pkg.train:main", args=["--lr", "3"])


@pytest.mark.parametrize(
    "kinds",
    [
        {"function": "pkg.train:main", "module": "pkg.train"},
        {"script": "train.py", "module": "pkg.train"},
        {"function": "pkg.train:main", "script": "train.py", "module": "pkg.train"},
    ],
)
def test_two_kinds_are_refused(kinds: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        Experiment(entrypoint=Entrypoint(**kinds))
    message = str(info.value)
    assert "exactly one of entrypoint.function" in message and "entrypoint.module" in message
    assert "found " + " and ".join(f"entrypoint.{kind}" for kind in kinds) in message


def test_shorthand_and_a_later_layer_replace_the_other_kinds(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("entrypoint: train.py --lr 3\n")
    entry = load_experiment(exp, ["entrypoint=-m pkg.train --lr 3 'a b'"]).experiment.entrypoint
    assert (entry.function, entry.script, entry.module) == (None, None, "pkg.train")
    assert entry.args == ["--lr", "3", "a b"]
    entry = load_experiment(exp, ["entrypoint.module=pkg.train"]).experiment.entrypoint
    assert (entry.script, entry.module, entry.args) == (None, "pkg.train", ["--lr", "3"])
    exp.write_text("entrypoint: {module: pkg.train}\n")
    entry = load_experiment(exp, ["entrypoint.script=train.py"]).experiment.entrypoint
    assert (entry.script, entry.module) == ("train.py", None)
    with pytest.raises(ConfigError, match="'-m' needs a module name"):
        load_experiment(exp, ["entrypoint=-m"])


def test_the_rank_is_handed_the_module_and_its_command(tmp_path: Path) -> None:
    tree(tmp_path, {"planpkg/__init__.py": EXECUTED, "planpkg/train.py": EXECUTED})
    exp = tmp_path / "exp.yaml"
    exp.write_text("entrypoint: -m planpkg.train --lr 3\nresources: {tasks_per_node: 2}\n")
    plan = build(
        load_experiment(exp),
        executor="local",
        workdir=tmp_path,
        run_dir=tmp_path / "run",
        interpreter="python3",
    )
    assert (plan.rank.function, plan.rank.script, plan.rank.module) == (None, None, "planpkg.train")
    assert plan.rank.command() == [sys.executable, "-m", "planpkg.train", "--lr", "3"]
    assert "planpkg" not in sys.modules
