"""`integrations: auto`: when a script's process loads a framework's Trainer module, the
framework's integration (slurmddp/integrations/) patches it so that every Trainer built afterwards
gets slurmddp's preemption callback, as the one line of docs/frameworks/ would add it.

The hook waits for a module that is whole once it has loaded: transformers' Trainer module
(`transformers` loads it lazily, so a script that imports transformers for its models alone, with
a loop of its own, never pays for the Trainer's import), and Lightning's `pytorch` package, whose
`__init__` loads its Trainer module while the package itself is still half-made (an integration
called from there could not import `lightning.pytorch.Callback`). Stdlib only until a hooked module
loads.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

HOOKS = {
    "transformers.trainer": "slurmddp.integrations.transformers",
    "lightning.pytorch": "slurmddp.integrations.lightning",
    "pytorch_lightning": "slurmddp.integrations.lightning",
}
"""Module whose loading patches -> the integration whose `auto()` patches it."""


class _Finder(importlib.abc.MetaPathFinder):
    """Runs `hooks[name](module)` once the module `name` has loaded, whoever imports it."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.hooks:
            return None
        hook = self.hooks[fullname]
        # The spec the other finders would give; this finder only wraps its loader.
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                hook(module)

        spec.loader = _Loader()
        return spec


def on_load(hooks: dict[str, Callable[[ModuleType], None]]) -> None:
    """Call each hook with its module once the module has loaded (or now, if it already has)."""
    sys.meta_path.insert(0, _Finder(hooks))
    for name, hook in hooks.items():
        if name in sys.modules:
            hook(sys.modules[name])


def _patch(integration: str) -> None:
    loading = sys.modules.get(integration)
    if loading is not None and getattr(loading.__spec__, "_initializing", False):
        # The integration is being imported (it imports its framework: pytorch_lightning's
        # brings lightning.pytorch): its own caller patches once it is whole.
        return
    importlib.import_module(integration).auto()


def install() -> None:
    """Patch each framework's Trainer as soon as its module is loaded (or now, if it already is)."""
    on_load({name: functools.partial(_patch_on_load, integration) for name, integration in HOOKS.items()})


def _patch_on_load(integration: str, _: ModuleType) -> None:
    _patch(integration)
