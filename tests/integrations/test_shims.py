"""Every framework internal a shim (slurmddp/integrations/shims/) reaches exists on the installed
framework: probed on real objects, so a framework version that moved one fails here, loudly and by
name, instead of in a preempted job. And the probe can fail: a stand-in missing one is caught."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from transformers import Trainer, TrainingArguments

from slurmddp.integrations.shims import accelerate as accelerate_shim
from slurmddp.integrations.shims import lightning as lightning_shim
from slurmddp.integrations.shims import missing_internals
from slurmddp.integrations.shims import transformers as transformers_shim


def assert_all_there(framework: str, shim: ModuleType, objects: dict[str, Any]) -> None:
    missing = missing_internals(objects, shim.INTERNALS)
    assert missing == [], (
        f"{framework} {version(framework)} moved internals slurmddp relies on (its shim, {shim.__name__}, "
        f"was checked on {', '.join(shim.TESTED_VERSIONS)}): {missing}; adapt the shim's accessors"
    )


def private_names(shim: ModuleType) -> set[str]:
    """The underscored names the shim reaches: `x._name`, and "_name" given to getattr/hasattr/
    setattr, directly or through a module constant (ours, `_slurmddp*`, left out)."""
    tree = ast.parse(Path(inspect.getfile(shim)).read_text())
    found = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    found |= {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    return {name for name in found if name.startswith("_") and not name.startswith(("__", "_slurmddp"))}


@pytest.mark.parametrize("shim", [lightning_shim, transformers_shim, accelerate_shim])
def test_every_private_name_a_shim_reaches_is_listed_for_the_probe(shim: ModuleType) -> None:
    listed = {part for path in shim.INTERNALS for part in path.split(".")}
    assert private_names(shim) - listed == set(), f"add them to {shim.__name__}.INTERNALS"


def test_the_probe_catches_a_missing_internal_by_name() -> None:
    loop = SimpleNamespace(_data_fetcher=None, _combined_loader=None)
    trainer = SimpleNamespace(_signal_connector=SimpleNamespace(register_signal_handlers=None), fit_loop=loop)
    assert missing_internals({"trainer": trainer}, lightning_shim.INTERNALS[:4]) == [
        "trainer._checkpoint_connector.resume_start"
    ]
    with pytest.raises(AssertionError, match=r"lightning .* moved internals .*_checkpoint_connector"):
        assert_all_there("lightning", lightning_shim, {"trainer": trainer, "logger": object()})
    with pytest.raises(RuntimeError, match=re.escape("no Trainer._checkpoint_connector.resume_start")):
        lightning_shim.choose_restored_checkpoint(trainer, lambda path: path)


# ---- Lightning ------------------------------------------------------------------------------------


@pytest.mark.parametrize("logger_type", [CSVLogger, TensorBoardLogger])
def test_lightnings_internals_are_where_the_shim_reaches(logger_type: type, tmp_path: Path) -> None:
    logger = logger_type(str(tmp_path))
    trainer = pl.Trainer(
        accelerator="cpu", logger=logger, max_steps=1, enable_progress_bar=False, enable_checkpointing=False
    )
    assert_all_there("lightning", lightning_shim, {"trainer": trainer, "logger": logger})
    assert lightning_shim.has_version(logger)
    lightning_shim.repoint(logger, 7)
    assert logger.version == 7
    assert lightning_shim.data_fetcher(trainer) is None and lightning_shim.combined_loaders(trainer) == []
    lightning_shim.count_the_next_epoch(trainer.fit_loop)  # not restarted: nothing to clear
    chosen: list[Any] = []
    lightning_shim.choose_restored_checkpoint(trainer, lambda path: chosen.append(path))
    lightning_shim.after_signal_registration(trainer, lambda: None)
    assert getattr(trainer._signal_connector.register_signal_handlers, "_slurmddp", False)


# ---- transformers ---------------------------------------------------------------------------------


def test_transformers_internals_are_where_the_shim_reaches(tmp_path: Path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = Trainer(model=torch.nn.Linear(2, 2), args=args)
    assert_all_there("transformers", transformers_shim, {"Trainer": Trainer, "trainer": trainer})
    assert {"model", "trial"} <= set(inspect.signature(Trainer._save_checkpoint).parameters)
    assert transformers_shim.callbacks(trainer) is trainer.callback_handler.callbacks

    def finished(**_: Any) -> None:
        pass

    transformers_shim.replace_epoch(trainer, finished)
    assert trainer._run_epoch is finished
    transformers_shim.restore_epoch(trainer)
    assert trainer._run_epoch.__func__ is Trainer._run_epoch


# ---- accelerate -----------------------------------------------------------------------------------


@pytest.fixture
def accelerator() -> Iterator[Any]:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DataLoaderConfiguration

    yield Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    # The state is a process-wide singleton: the next Accelerator built in this process starts afresh.
    AcceleratorState._reset_state(True)


def test_accelerates_internals_are_where_the_shim_reaches(accelerator: Any) -> None:
    from torch.utils.data import DataLoader

    loader = accelerator.prepare(DataLoader(list(range(8)), batch_size=2, shuffle=True))
    sampler = accelerate_shim.loader_sampler(loader)
    assert_all_there(
        "accelerate", accelerate_shim, {"accelerator": accelerator, "loader": loader, "sampler": sampler}
    )
    assert isinstance(accelerate_shim.sampler_seed(sampler), int)
    accelerate_shim.set_accumulation_step(accelerator, 3)
    assert accelerate_shim.accumulation_step(accelerator) == 3
