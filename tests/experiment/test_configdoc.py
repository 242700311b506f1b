"""docs/config.md is the schema's own documentation: regenerated here and compared."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import ROOT

from slurmddp.experiment.configdoc import REGENERATE, field_docs, render


def test_docs_config_md_is_what_the_schema_says() -> None:
    written = (ROOT / "docs" / "config.md").read_text()
    assert written == render(), f"docs/config.md differs from the schema's docstrings; run: {REGENERATE}"


def test_every_key_of_the_schema_is_in_the_reference() -> None:
    text = render()
    for key in ("name", "resources.partition", "dist.hang_timeout_s", "trackers.wandb_mode", "train"):
        assert f"- `{key}` (" in text
    assert '- `resources.gpu_binding` (`"node" | "task"`, default `"node"`): ' in text


@dataclass(kw_only=True)
class Undocumented:
    """A section whose second field lacks its docstring."""

    documented: int = 1
    """Has one."""
    bare: str | None = None


def test_a_field_without_a_docstring_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="Undocumented: no docstring under bare"):
        field_docs(Undocumented)
