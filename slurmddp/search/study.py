"""A `search:` sweep's Optuna study: where it is stored, its sampler and pruner. Made at submit
(where a bad storage, sampler option or missing Optuna is refused before anything is queued) and
opened by each element: by its batch script to ask for its trial and say how it ended, by its
rank 0 to report values and ask the pruner.

Every sampler is seeded: an element's sampler by the search's seed and the element's index, so
that elements asking at once do not draw the same startup values, and a search run again with
the same seed and the same order of finished trials asks the same things. QMC's sequence and the
grid's order are shared by every element (trial N takes point N), so their seed is the search's.
TPE runs with `constant_liar` (trials that run in parallel are told apart) and, by default, a third
of the trials (at most Optuna's 10) drawn at random before it models: with Optuna's 10 out of 12,
a small search would hardly learn.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmddp.errors import ConfigError
from slurmddp.experiment.search import DEFAULT_STORAGE, Search
from slurmddp.experiment.space import Param
from slurmddp.rundir.manifest import SweepManifest

if TYPE_CHECKING:
    import optuna

SEED_STRIDE = 1_000_003
"""An element's sampler seed is seed * SEED_STRIDE + index: distinct over any array size."""


@dataclass(frozen=True)
class StudyRef:
    """What an element needs to open its sweep's study: the search, the study's name and storage,
    and the metric it optimizes."""

    search: Search
    name: str
    storage: str
    """An RDB URL, or the JournalStorage file's absolute path."""
    metric: str
    mode: str

    @classmethod
    def of(cls, search: Search, sweep_dir: Path, job_name: str, metric: str, mode: str) -> StudyRef:
        if search.storage is None:
            storage = str(sweep_dir.resolve() / DEFAULT_STORAGE)
        elif "://" in search.storage:
            storage = search.storage
        else:
            storage = str(Path(search.storage).expanduser().resolve())
        return cls(search, f"{job_name}-{sweep_dir.name}", storage, metric, mode)

    @classmethod
    def of_manifest(cls, manifest: SweepManifest) -> StudyRef | None:
        data = manifest.search
        if data is None:
            return None
        search = Search.from_json(data["spec"])
        return cls(search, str(data["study"]), str(data["storage"]), str(manifest.metric), str(manifest.mode))

    @classmethod
    def of_sweep(cls, sweep_dir: Path) -> StudyRef | None:
        return cls.of_manifest(SweepManifest.read(sweep_dir))

    def to_manifest(self) -> dict[str, Any]:
        return {"study": self.name, "storage": self.storage, "spec": self.search.to_json()}

    @property
    def journal(self) -> bool:
        return "://" not in self.storage

    @property
    def load_hint(self) -> str:
        """The line that opens the study in Python (optuna-dashboard takes the same storage)."""
        if self.journal:
            backend = f"optuna.storages.journal.JournalFileBackend({self.storage!r})"
            storage = f"optuna.storages.JournalStorage({backend})"
            return f"optuna.load_study(study_name={self.name!r}, storage={storage})"
        return f"optuna.load_study(study_name={self.name!r}, storage={self.storage!r})"


def optuna_module() -> Any:
    """Optuna, quiet (its INFO lines would fill every rank's log), or how to install it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "sweep.search needs Optuna, which is not installed: pip install 'slurmddp[search]' (in "
            "the environment the job runs in too)"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def create(ref: StudyRef) -> None:
    """Make the study (its storage, its direction); every setting Optuna would refuse later is
    refused here, as a ConfigError naming the key."""
    optuna = optuna_module()
    sampler(ref, 0)
    pruner(ref.search)
    try:
        study = optuna.create_study(
            storage=_storage(ref),
            study_name=ref.name,
            direction="minimize" if ref.mode == "min" else "maximize",
        )
    except Exception as exc:  # a bad URL, a missing database driver, a taken name, a locked file
        raise ConfigError(
            f"sweep.search.storage: cannot make the study {ref.name!r} in {ref.storage}: {exc}"
        ) from None
    study.set_user_attr("metric", ref.metric)


def load(ref: StudyRef, element: int | None = None) -> optuna.Study:
    """The study, with the sampler an element asks with (`element`: its index) and the pruner."""
    study: optuna.Study = optuna_module().load_study(
        study_name=ref.name,
        storage=_storage(ref),
        sampler=sampler(ref, element or 0),
        pruner=pruner(ref.search),
    )
    return study


def _storage(ref: StudyRef) -> Any:
    if not ref.journal:
        return ref.storage
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    # The backend's default lock is a symlink, which NFS (v2 on) makes atomic across hosts.
    return JournalStorage(JournalFileBackend(ref.storage))


def sampler(ref: StudyRef, element: int) -> optuna.samplers.BaseSampler:
    optuna = optuna_module()
    search = ref.search
    samplers = optuna.samplers
    classes = {
        "tpe": samplers.TPESampler,
        "random": samplers.RandomSampler,
        "cmaes": samplers.CmaEsSampler,
        "qmc": samplers.QMCSampler,
        "gp": samplers.GPSampler,
        "grid": samplers.GridSampler,
    }
    shared = search.sampler in ("qmc", "grid")
    seed = search.seed if shared else search.seed * SEED_STRIDE + element
    defaults: dict[str, Any] = {"seed": seed}
    if search.sampler == "tpe":
        defaults.update(constant_liar=True, n_startup_trials=min(10, max(1, search.trials // 3)))
    if search.sampler == "grid":
        defaults["search_space"] = {_name(p): p.values() for p in search.params}
    return _make(classes[search.sampler], defaults, search.sampler_options, f"sampler.{search.sampler}")  # type: ignore[no-any-return]


def pruner(search: Search) -> optuna.pruners.BasePruner:
    optuna = optuna_module()
    pruners = optuna.pruners
    classes = {
        "asha": pruners.SuccessiveHalvingPruner,
        "hyperband": pruners.HyperbandPruner,
        "median": pruners.MedianPruner,
        "percentile": pruners.PercentilePruner,
        "none": pruners.NopPruner,
    }
    defaults: dict[str, Any] = {"percentile": 25.0} if search.pruner == "percentile" else {}
    return _make(classes[search.pruner], defaults, search.pruner_options, f"pruner.{search.pruner}")  # type: ignore[no-any-return]


def _make(cls: type, defaults: dict[str, Any], options: dict[str, Any], where: str) -> Any:
    """`cls(**defaults, **options)`, an option it does not take or a value it refuses named."""
    where = f"sweep.search.{where}"
    taken = [name for name in inspect.signature(cls).parameters if name not in ("search_space",)]
    for option in options:
        if option == "seed":
            raise ConfigError(f"{where}: seed: write sweep.search.seed, which seeds every sampler")
        if option not in taken:
            near = difflib.get_close_matches(option, taken, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(
                f"{where}: {cls.__name__} takes no option {option!r}{hint}; it takes {', '.join(taken)}"
            )
    try:
        return cls(**{**defaults, **options})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {cls.__name__} refuses {options}: {exc}") from None


def _name(param: Param) -> str:
    """The parameter's name in the study: the key under train: (`lr`), as the user wrote it."""
    return param.key.removeprefix("train.")


def distributions(search: Search) -> dict[str, Any]:
    """Every parameter's Optuna distribution, by its name in the study."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for param in search.params:
        if param.kind == "categorical":
            out[_name(param)] = CategoricalDistribution(list(param.choices))
        elif param.kind == "int":
            assert param.low is not None and param.high is not None
            step = int(param.step or 1)
            out[_name(param)] = IntDistribution(int(param.low), int(param.high), log=param.log, step=step)
        else:
            assert param.low is not None and param.high is not None
            out[_name(param)] = FloatDistribution(param.low, param.high, log=param.log, step=param.step)
    return out
