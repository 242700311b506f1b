"""The import rules of the package (written in slurmddp/__init__.py's docstring), checked on the
source: every import statement counts, those inside functions and under TYPE_CHECKING included,
because an import hidden in a function is still a dependency (it once hid a cycle here)."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "slurmddp"
SIDES = ("experiment", "submit", "job", "manage", "cluster", "cli", "integrations", "rundir", "search")
LEAVES = ("errors", "files", "yamlio", "defaults")
# The sides each side may import (besides itself and the leaf helpers).
ALLOWED = {
    # The run directory's files: what the batch script, the ranks and the login-node commands
    # each read of what another wrote.
    "rundir": set(),
    "cluster": set(),
    "experiment": {"cluster"},
    # A search's Optuna study: made at submit, asked and told by the batch script, reported to by
    # rank 0 and read by status, so below all of them.
    "search": {"experiment", "rundir"},
    "job": {"cluster", "experiment", "rundir", "search"},
    "submit": {"cluster", "experiment", "job", "rundir", "search"},
    "manage": {"cluster", "experiment", "job", "submit", "rundir", "search"},
    "cli": {"cluster", "experiment", "job", "submit", "manage", "rundir", "search"},
    # What a training script imports to be preemption-safe under its framework: it runs in the
    # script's process, beside the job side's stop (job/process/stop.py), and never on a login node.
    "integrations": {"experiment", "job", "rundir", "search"},
}
ROOMS = ("allocation", "checkpoint", "process", "train", "script", "launch")
"""job/'s rooms, bottom first (slurmddp/job/__init__.py): each imports only those before it."""
JOB_BOTTOM = "slurmddp.job.spec"
"""The picklable settings every rank is handed: below every room."""
JOB_TOP = "slurmddp.job.rank"
"""The callable submit pickles: above every room, imported by no room."""
# What `submit` may take from `job`: the picklable spec handed to every rank and the callable that
# carries it, nothing that runs there.
SUBMIT_FROM_JOB = {"slurmddp.job.spec", "slurmddp.job.rank"}
# Each group of commands (cli/*_cmd.py) registers its own parsers; only the top-level parser joins
# them, so a group never leans on another's handlers.
CLI_MAIN = "slurmddp.cli.main"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str
    """file:line of the import statement."""


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package under `root`, by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = ["slurmddp", *path.relative_to(root).with_suffix("").parts]
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def edges(known: dict[str, Path]) -> Iterator[Edge]:
    """Every import of one of our modules, resolved to the module it loads."""
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import mod` loads pkg.mod; `from mod import name` loads mod.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for target in targets:
                if target.split(".")[0] == "slurmddp" and target != name:
                    yield Edge(name, target, f"{path}:{node.lineno}")


def side(module: str) -> str:
    """experiment/submit/job/manage/cluster/cli, `leaf`, or `root` (the package and __main__)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "root"
    return parts[1] if parts[1] in SIDES else "leaf"


def room(module: str) -> int | None:
    """The position of a job module's room in ROOMS (JOB_BOTTOM: -1, JOB_TOP: len(ROOMS)); None
    outside job/ or for a module of job/ that is in no room."""
    parts = module.split(".")
    if parts[:2] != ["slurmddp", "job"] or len(parts) < 3:
        return None
    if module in (JOB_BOTTOM, JOB_TOP):
        return -1 if module == JOB_BOTTOM else len(ROOMS)
    return ROOMS.index(parts[2]) if parts[2] in ROOMS and len(parts) > 3 else None


def room_rule(edge: Edge) -> str | None:
    """Why a job module may not import another job module, or None."""
    source, target = room(edge.source), room(edge.target)
    if source is None or target is None or source >= target:
        return None
    if edge.target == JOB_TOP:
        return "no room imports job.rank (the callable submit pickles)"
    allowed = ", ".join(ROOMS[: max(source, 0)]) or "job.spec"
    return f"a room of job/ imports only those below it ({allowed})"


def violations(found: list[Edge]) -> list[str]:
    problems = []
    for edge in found:
        source, target = side(edge.source), side(edge.target)
        rule = None
        if source == target == "job":
            rule = room_rule(edge)
        elif source == "leaf":
            rule = "the leaf helpers import nothing of ours"
        elif target == "cli" and source not in ("cli", "root"):
            rule = "nothing imports cli"
        elif target == "cli" and edge.target.endswith("_cmd") and edge.source != CLI_MAIN:
            rule = "only cli.main imports a group of commands (cli/*_cmd)"
        elif source == "root" or target in ("leaf", source):
            continue
        elif target == "root":
            rule = "the package's public names are for users; inside, import the defining module"
        elif target not in ALLOWED[source]:
            rule = f"{source} may import only {', '.join(sorted(ALLOWED[source])) or 'leaf helpers'}"
        elif source == "submit" and target == "job" and edge.target not in SUBMIT_FROM_JOB:
            rule = "submit takes only the picklable spec from job (slurmddp.job.spec, slurmddp.job.rank)"
        if rule:
            problems.append(f"{edge.where}: {edge.source} -> {edge.target}: {rule}")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def graphs(found: list[Edge]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    by_module: dict[str, set[str]] = {}
    by_side: dict[str, set[str]] = {}
    for edge in found:
        by_module.setdefault(edge.source, set()).add(edge.target)
        source, target = side(edge.source), side(edge.target)
        if source != target and "root" not in (source, target):
            by_side.setdefault(source, set()).add(target)
    return by_module, by_side


@pytest.fixture(scope="module")
def found() -> list[Edge]:
    return list(edges(modules()))


def test_every_module_lives_in_a_side_or_is_a_leaf_helper() -> None:
    loose = [name for name in modules() if side(name) == "leaf" and name.split(".")[1] not in LEAVES]
    assert loose == [], f"put these into the sub-package whose side of the flow they serve: {loose}"


def test_every_module_of_job_lives_in_a_room() -> None:
    loose = [
        name
        for name in modules()
        if name.startswith("slurmddp.job.") and room(name) is None and name.split(".")[2] not in ROOMS
    ]
    assert loose == [], f"put these into the room of job/ where they run: {loose}"


def test_imports_follow_the_rules(found: list[Edge]) -> None:
    problems = violations(found)
    assert problems == [], "import rules broken:\n" + "\n".join(problems)


def test_no_import_cycles(found: list[Edge]) -> None:
    by_module, by_side = graphs(found)
    assert cycles(by_module) == [], "modules import each other in a cycle"
    assert cycles(by_side) == [], "sub-packages import each other in a cycle"


def untyped_setting_reads(root: Path = PACKAGE / "job") -> list[str]:
    """Where rank code reads one of slurmddp's own sections from the experiment mapping
    (`config.ddp`, `config["checkpoint"]`, `config.get("telemetry")`) instead of taking it typed
    from the RankSpec's RunSettings; `config.train` and `config.name` are the user's."""
    from slurmddp.experiment.schema import Experiment

    ours = {f.name for f in dataclasses.fields(Experiment)} - {"train", "name"}
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            read = _section_read(node)
            if read is not None and read[1] in ours and _names_config(read[0]):
                found.append(f"{path}:{node.lineno}: config...{read[1]}")
    return sorted(found)


def _section_read(node: ast.AST) -> tuple[ast.expr, object] | None:
    """(what is read from, which key) for `x.key`, `x["key"]` and `x.get("key")`."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.value, node.slice.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        return node.func.value, node.args[0].value
    return None


def _names_config(holder: ast.expr) -> bool:
    """`config` or `<anything>.config`."""
    return (isinstance(holder, ast.Name) and holder.id == "config") or (
        isinstance(holder, ast.Attribute) and holder.attr == "config"
    )


def test_rank_code_takes_settings_typed() -> None:
    found = untyped_setting_reads()
    assert found == [], "read these from RunSettings (slurmddp.job.spec), typed:\n" + "\n".join(found)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """A job -> submit import, a leaf importing ours, one group of commands importing another, and
    a two-module cycle hidden in a function are each reported: the rules above can fail."""
    for folder in ("job", "job/launch", "job/train", "submit", "cli", "rundir"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "errors.py").write_text("from slurmddp.rundir.layout import CONFIG\n")
    (tmp_path / "rundir" / "layout.py").write_text("CONFIG = 'config.yaml'\n")
    (tmp_path / "job" / "launch" / "runtime.py").write_text(
        "def f():\n    from slurmddp.submit import plan\n"
    )
    (tmp_path / "job" / "train" / "loop.py").write_text("from slurmddp.job.launch import runtime\n")
    (tmp_path / "submit" / "plan.py").write_text("from slurmddp.job.launch.runtime import f\n")
    (tmp_path / "cli" / "run_cmd.py").write_text("")
    (tmp_path / "cli" / "stop_cmd.py").write_text("from slurmddp.cli import run_cmd\n")
    found = list(edges(modules(tmp_path)))
    problems = violations(found)
    assert any(
        "slurmddp.job.launch.runtime -> slurmddp.submit.plan: job may import only" in p for p in problems
    )
    assert any("slurmddp.errors -> slurmddp.rundir.layout: the leaf helpers" in p for p in problems)
    assert any("submit takes only the picklable spec" in p for p in problems)
    assert any("slurmddp.cli.stop_cmd -> slurmddp.cli.run_cmd: only cli.main" in p for p in problems)
    assert any(
        "slurmddp.job.train.loop -> slurmddp.job.launch.runtime: a room of job/ imports only" in p
        for p in problems
    )
    assert cycles(graphs(found)[0]) == [["slurmddp.job.launch.runtime", "slurmddp.submit.plan"]]
    (tmp_path / "job" / "train" / "context.py").write_text(
        "a = self.config.ddp.accumulate\nb = config['checkpoint']\nc = self.config.get('telemetry')\n"
        "d = self.config.train.lr\n"
    )
    reads = untyped_setting_reads(tmp_path / "job")
    assert sorted(line.rsplit(": ", 1)[1] for line in reads) == [
        "config...checkpoint",
        "config...ddp",
        "config...telemetry",
    ]


RECORDS = "slurmddp.rundir.records"
"""The one module that spells the run directory's JSON keys (DESIGN.md, "Records and settings")."""


def spelt_keys(known: dict[str, Path], key: str) -> list[str]:
    """Where a module other than the records module has `key` as a string literal (file:line)."""
    found = []
    for name, path in known.items():
        if name == RECORDS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and node.value == key:
                found.append(f"{path}:{node.lineno}")
    return found


def test_the_attempt_identity_is_spelt_only_in_the_records_module(tmp_path: Path) -> None:
    """Every record of an attempt names it by job id and restart count: a module that writes or
    reads "restart_count" itself parses a record by hand (use slurmddp.rundir.records.AttemptId)."""
    assert spelt_keys(modules(), "restart_count") == []
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "loop.py").write_text('ID = {"restart_count": 0}\n')
    assert spelt_keys(modules(tmp_path), "restart_count") == [f"{tmp_path / 'job' / 'loop.py'}:1"]


RUNDIR = "slurmddp.rundir"
"""The run directory's home: its file names and one typed record per file, each with its read."""
RAW_READS = frozenset(
    {"json.loads", "json.load", "read_json_object", "files.read_json_object", "yamlio.load"}
)
"""What parses a file by hand: the JSON and YAML readers, and the leaf helper the records read with."""
MANIFEST_NAMES = frozenset({"manifest"})
"""What a run's or a sweep's manifest is called where it is held: a subscript or a .get() on it is
a read of its JSON keys by hand."""
# The modules outside rundir/ that may parse by hand, each because what it parses is no file of a
# run directory.
PARSES_OTHER_FILES = (
    # The leaf helper itself: defines read_json_object, which the records read with.
    "slurmddp.files",
    # The user's experiment, profiles and overrides: YAML the user wrote, before any run exists.
    "slurmddp.experiment.load",
    # The user's index of submissions, in $XDG_STATE_HOME: shared by all of the user's runs.
    "slurmddp.manage.index",
    # The watchdog's settings, handed from the script rank to the script's process in an
    # environment variable, not in a file.
    "slurmddp.job.script.scriptrun",
    # A checkpoint's own markers: the checkpoint store's format, which its own room reads and writes.
    "slurmddp.job.checkpoint",
    # The frameworks' checkpoint markers, written and read beside their checkpoints.
    "slurmddp.integrations",
    # An OCI bundle's config.json: the user's container image, checked for the mounts it holds.
    "slurmddp.submit.container",
)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _reads_by_hand(node: ast.AST) -> bool:
    """A call of a raw reader, or a manifest's keys read as a mapping's."""
    if isinstance(node, ast.Call) and ast.unparse(node.func) in RAW_READS:
        return True
    if isinstance(node, ast.Subscript):
        return _names_manifest(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return _names_manifest(node.func.value)
    return False


def _names_manifest(holder: ast.expr) -> bool:
    name = (
        holder.id
        if isinstance(holder, ast.Name)
        else holder.attr
        if isinstance(holder, ast.Attribute)
        else ""
    )
    return name in MANIFEST_NAMES


def hand_parsed(known: dict[str, Path]) -> list[str]:
    """Where a module outside rundir/ (and outside PARSES_OTHER_FILES) parses a file by hand
    ("file:line")."""
    found = []
    for name, path in known.items():
        if _within(name, RUNDIR) or any(_within(name, other) for other in PARSES_OTHER_FILES):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if _reads_by_hand(node):
                found.append(f"{path}:{getattr(node, 'lineno', 0)}")
    return found


def test_only_the_run_directory_records_parse_its_files() -> None:
    """DESIGN.md, "Records and settings": what the run directory holds is read through its typed
    record (slurmddp/rundir/), never parsed by hand where it is used."""
    found = hand_parsed(modules())
    assert found == [], "read it through its record in slurmddp/rundir/ instead:\n" + "\n".join(found)


def test_the_hand_parsing_check_can_fail(tmp_path: Path) -> None:
    for folder in ("manage", "rundir", "experiment"):
        (tmp_path / folder).mkdir()
    (tmp_path / "manage" / "runs.py").write_text(
        "import json\n"
        "data = json.loads(path.read_text())\n"
        "jobs = target.manifest['job_id']\n"
        "name = manifest.get('name')\n"
        "config = yamlio.load(text)\n"
        "seen = files.read_json_object(path)\n"
        "fine = target.manifest.name\n"
    )
    (tmp_path / "rundir" / "manifest.py").write_text("import json\ndata = json.loads(text)\n")
    (tmp_path / "experiment" / "load.py").write_text("loaded = yamlio.load(text)\n")
    where = tmp_path / "manage" / "runs.py"
    assert sorted(hand_parsed(modules(tmp_path))) == [f"{where}:{line}" for line in (2, 3, 4, 5, 6)]


EXECUTORS = ("local", "slurm")
EXECUTOR_HOME = PACKAGE / "manage" / "backend.py"
"""The one module of `manage` that knows what differs between the executors."""


def executor_tests(path: Path) -> list[str]:
    """Where `path` compares a value with an executor's name ("file:line")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            names = [part.value for part in (node.left, *node.comparators) if isinstance(part, ast.Constant)]
            if any(name in EXECUTORS for name in names):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_manage_asks_its_backend_instead_of_testing_the_executor() -> None:
    found = [
        where
        for path in sorted((PACKAGE / "manage").rglob("*.py"))
        if path != EXECUTOR_HOME
        for where in executor_tests(path)
    ]
    assert found == [], f"ask the run's backend (manage/backend.py) instead: {found}"


def test_the_executor_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "status.py").write_text('def f(executor):\n    return executor != "local"\n')
    assert executor_tests(tmp_path / "status.py") == ["status.py:2"]
