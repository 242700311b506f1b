"""Each framework's private internals that an integration relies on, behind one small module per
framework: the only place they are touched. Every accessor says which framework versions it was
checked on and why no public API serves; each module lists in `TESTED_VERSIONS` the versions it was
checked on and in `INTERNALS` every private name it reaches, and tests/integrations/test_shims.py
fails on an installed framework that moved one of them.

    shims.lightning      Lightning's Trainer connectors, fit loop and loggers
    shims.transformers   transformers' Trainer internals
    shims.accelerate     accelerate's undocumented (not underscored) attributes
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_ABSENT = object()


def missing_internals(objects: Mapping[str, Any], internals: Iterable[str]) -> list[str]:
    """The dotted paths of `internals` ("trainer._signal_connector.register_signal_handlers") that
    cannot be reached from `objects` (by the first name of each path); empty: all exist."""
    missing = []
    for dotted in internals:
        root, *attributes = dotted.split(".")
        found = objects.get(root, _ABSENT)
        for attribute in attributes:
            if found is _ABSENT:
                break
            found = getattr(found, attribute, _ABSENT)
        if found is _ABSENT:
            missing.append(dotted)
    return missing
