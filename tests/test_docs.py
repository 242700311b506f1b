"""The user's documents point at what exists: every relative link of README.md, CONTRIBUTING.md and
docs/**/*.md names a file of the repository, and a `#fragment` one of its headings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(document: Path) -> set[str]:
    """GitHub's ids for the headings of `document`: lower case, punctuation dropped, spaces to -."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in document.read_text().splitlines()
        if line.startswith("#")
    }


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        if not linked.exists() or (fragment and fragment not in anchors(linked)):
            broken.append(target)
    assert not broken, f"{document.name}: links to nothing: {broken}"
