"""`integrations: auto`'s import hook (job/script/autoload.py): a framework's integration patches its
Trainer once the Trainer's module has loaded, and only then."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurmddp.job.script import autoload


@pytest.fixture
def fake_framework(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A package `fakefw` whose `fakefw.trainer` defines Trainer, and an integration `fakeint`
    whose auto() records what it found."""
    (tmp_path / "fakefw").mkdir()
    (tmp_path / "fakefw" / "__init__.py").write_text("")
    (tmp_path / "fakefw" / "models.py").write_text("MODEL = 1\n")
    (tmp_path / "fakefw" / "trainer.py").write_text("class Trainer:\n    patched = False\n")
    (tmp_path / "fakeint.py").write_text(
        "import sys\nCALLS = []\n"
        "def auto():\n"
        "    trainer = sys.modules['fakefw.trainer']\n"
        "    trainer.Trainer.patched = True\n"
        "    CALLS.append(trainer.__name__)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(autoload, "HOOKS", {"fakefw.trainer": "fakeint"})
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in ("fakefw", "fakefw.models", "fakefw.trainer", "fakeint"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import fakeint  # type: ignore[import-not-found]

    calls: list[str] = fakeint.CALLS
    return calls


def test_the_trainer_is_patched_when_its_module_loads(fake_framework: list[str]) -> None:
    autoload.install()
    import fakefw.models  # type: ignore[import-not-found]  # noqa: F401

    assert fake_framework == [], "patched on the framework's import, not its Trainer's"
    from fakefw.trainer import Trainer  # type: ignore[import-not-found]

    assert Trainer.patched and fake_framework == ["fakefw.trainer"]


def test_a_trainer_loaded_before_the_hook_is_patched_at_once(fake_framework: list[str]) -> None:
    from fakefw.trainer import Trainer

    assert not Trainer.patched
    autoload.install()
    assert Trainer.patched and fake_framework == ["fakefw.trainer"]
