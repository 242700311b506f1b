"""The one completeness rule (slurmddp/job/checkpoint/completeness.py), alone and as each kind of
checkpoint reads it: the store's, Lightning's, transformers' `checkpoint-N` and accelerate's state
directories. Each defect must make the checkpoint count as incomplete, with the kind's own words."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from slurmddp.files import write_json
from slurmddp.integrations import accelerate, lightning, transformers
from slurmddp.job.checkpoint import completeness
from slurmddp.job.checkpoint.completeness import AGREE, UNCHECKED, Kind, Marker, Wording
from slurmddp.job.checkpoint.integrity import checkpoint_problems, rank_markers

PLAIN = Kind(
    Wording(
        missing="no {marker}",
        unreadable="bad {marker}: {error}",
        malformed="odd {marker}",
        unlisted="{marker} lacks {unlisted}",
    )
)


def rank_checkpoint(path: Path, world_size: int, rank0_file: str, attempt: str = "a1") -> Path:
    """A checkpoint written rank by rank, as the store and the Lightning callback write one."""
    path.mkdir(parents=True)
    for rank in range(world_size):
        files = {}
        for name in (f"rank-{rank:05d}.pt", *([rank0_file] if rank == 0 else [])):
            data = name.encode().ljust(30, b".")
            (path / name).write_bytes(data)
            files[name] = {"size": len(data), "crc32": f"{zlib.crc32(data):08x}"}
        write_json(path / f"rank-{rank:05d}.done", {"rank": rank, "attempt": attempt, "files": files})
    return path


def store_checkpoint(path: Path, world_size: int = 2, attempt: str = "a1") -> Path:
    rank_checkpoint(path, world_size, "shared.pt", attempt)
    meta = {"format": 1, "step": 7, "world_size": world_size, "time": 0.0, "attempt": attempt}
    write_json(path / "meta.json", meta)
    return path


def edit_marker(path: Path, **changes: object) -> None:
    write_json(path, {**json.loads(path.read_text()), **changes})


# ---- the rule alone -------------------------------------------------------------------------------


def test_a_checkpoint_with_every_marker_of_one_attempt_and_its_files_as_recorded_is_complete(
    tmp_path: Path,
) -> None:
    path = rank_checkpoint(tmp_path / "step", 3, "shared.pt")
    markers = rank_markers(3, "shared.pt")
    assert completeness.problems(path, PLAIN, markers, attempt="a1", check_crc=True) == []
    assert completeness.problems(path, PLAIN, markers, attempt=AGREE, check_crc=True) == []


def test_each_defect_is_named(tmp_path: Path) -> None:
    markers = rank_markers(2, "shared.pt")

    def found(defect: Callable[[Path], object], attempt: object = "a1") -> list[str]:
        path = rank_checkpoint(tmp_path / str(len(list(tmp_path.iterdir()))), 2, "shared.pt")
        defect(path)
        return completeness.problems(path, PLAIN, markers, attempt=attempt, check_crc=True)

    assert found(lambda p: (p / "rank-00001.done").unlink()) == ["no rank-00001.done"]
    assert found(lambda p: (p / "rank-00001.done").write_text("{")) == [
        "bad rank-00001.done: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    ]
    assert found(lambda p: edit_marker(p / "rank-00000.done", files=[])) == ["odd rank-00000.done"]
    assert found(lambda p: edit_marker(p / "rank-00001.done", attempt="a0")) == [
        "rank-00001.done is from attempt 'a0' but meta.json from 'a1'"
    ]
    assert found(lambda p: edit_marker(p / "rank-00001.done", attempt="a0"), AGREE) == [
        "its markers come from different attempts"
    ]
    assert found(lambda p: edit_marker(p / "rank-00001.done", attempt="a0"), UNCHECKED) == []
    assert found(lambda p: edit_marker(p / "rank-00000.done", files={})) == [
        "rank-00000.done lacks rank-00000.pt",
        "rank-00000.done lacks shared.pt",
    ]
    assert found(lambda p: (p / "shared.pt").write_bytes(b"x")) == [
        "shared.pt has 1 bytes, its marker says 30 (truncated or replaced)"
    ]
    assert found(lambda p: (p / "rank-00001.pt").unlink()) == [
        "rank-00001.pt is missing (truncated or replaced)"
    ]
    crc = found(lambda p: (p / "shared.pt").write_bytes(b"X" * 30))
    assert len(crc) == 1 and crc[0].startswith("shared.pt has CRC32 ") and crc[0].endswith("(corrupt)")


def test_the_checksum_is_read_only_when_asked(tmp_path: Path) -> None:
    path = rank_checkpoint(tmp_path / "step", 1, "shared.pt")
    (path / "shared.pt").write_bytes(b"X" * (path / "shared.pt").stat().st_size)
    markers = rank_markers(1, "shared.pt")
    assert completeness.problems(path, PLAIN, markers, attempt="a1") == []
    assert "(corrupt)" in completeness.problems(path, PLAIN, markers, attempt="a1", check_crc=True)[0]


def test_a_sentinel_makes_a_checkpoint_incomplete_whatever_its_marker_says(tmp_path: Path) -> None:
    path = rank_checkpoint(tmp_path / "step", 1, "shared.pt")
    kind = Kind(PLAIN.wording, sentinels=("saving.txt",))
    assert completeness.problems(path, kind, rank_markers(1, "shared.pt"), attempt="a1") == []
    (path / "saving.txt").write_text("")
    assert completeness.problems(path, kind, rank_markers(1, "shared.pt"), attempt="a1") == [
        "it holds saving.txt (a save that did not finish)"
    ]


def test_a_single_marker_of_bare_sizes_checks_every_file_it_lists(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"aa")
    (tmp_path / "b.bin").write_bytes(b"b")
    write_json(tmp_path / "done.json", {"files": {"b.bin": 1, "a.bin": 2}})
    kind = Kind(PLAIN.wording, bare_sizes=True, every_listed=True)
    one = [Marker("done.json", lists=("a.bin",))]
    assert completeness.problems(tmp_path, kind, one, attempt=UNCHECKED) == []
    (tmp_path / "b.bin").write_bytes(b"bbb")
    (tmp_path / "a.bin").unlink()
    assert completeness.problems(tmp_path, kind, one, attempt=UNCHECKED) == [
        "a.bin is missing (truncated or replaced)",
        "b.bin has 3 bytes, its marker says 1 (truncated or replaced)",
    ]


def test_a_limit_stops_after_the_marker_that_reached_it(tmp_path: Path) -> None:
    path = rank_checkpoint(tmp_path / "step", 4, "shared.pt")
    for rank in range(4):
        (path / f"rank-{rank:05d}.done").unlink()
    kind = Kind(PLAIN.wording, limit=3)
    assert completeness.problems(path, kind, rank_markers(4, "shared.pt"), attempt="a1") == [
        "no rank-00000.done",
        "no rank-00001.done",
        "no rank-00002.done",
        "...",
    ]


def test_the_newest_complete_is_the_first_complete_and_the_ones_before_it_say_why(tmp_path: Path) -> None:
    checked: list[str] = []

    def problems_of(path: Path) -> list[str]:
        checked.append(path.name)
        return [] if path.name == "b" else [f"{path.name} is bad"]

    found, skipped = completeness.newest_complete([tmp_path / n for n in "abc"], problems_of)
    assert found == tmp_path / "b" and skipped == [(tmp_path / "a", ["a is bad"])]
    assert checked == ["a", "b"], "it reads no further than the first complete one"
    assert completeness.newest_complete([tmp_path / "a"], problems_of) == (
        None,
        [(tmp_path / "a", ["a is bad"])],
    )


# ---- each kind of checkpoint ----------------------------------------------------------------------

Build = Callable[[Path], Path]
Check = Callable[[Path], list[str]]


def _store() -> tuple[Build, Check]:
    return (
        lambda root: store_checkpoint(root / "step-00000007"),
        lambda p: checkpoint_problems(p, 7, None, check_crc=True),
    )


def _lightning() -> tuple[Build, Check]:
    return (
        lambda root: rank_checkpoint(root / "step-00000007", 2, lightning.LIGHTNING_FILE),
        lambda p: lightning.checkpoint_problems(p, 2, check_crc=True),
    )


def _transformers() -> tuple[Build, Check]:
    def build(root: Path) -> Path:
        path = root / "checkpoint-7"
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"m" * 30)
        (path / "rng_state_1.pth").write_bytes(b"r" * 3)
        transformers.write_marker(path, 7, world_size=2)
        return path

    return build, lambda p: [found] if (found := transformers.checkpoint_problem(p)) is not None else []


def _accelerate() -> tuple[Build, Check]:
    def build(root: Path) -> Path:
        path = root / "step-00000007"
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"m" * 30)
        for rank in range(2):
            (path / accelerate.RANK_FILE.format(rank=rank)).write_bytes(b"r" * 3)
        listing = {entry.name: entry.stat().st_size for entry in path.iterdir()}
        marker = {"step": 7, "epoch": 0, "batch": 7, "num_processes": 2, "data_seed": 0, "files": listing}
        write_json(path / accelerate.MARKER, marker)
        return path

    def check(path: Path) -> list[str]:
        found = accelerate.check_complete(path)
        return [found] if isinstance(found, str) else []

    return build, check


KINDS = {"store": _store, "lightning": _lightning, "transformers": _transformers, "accelerate": _accelerate}
MISSING_MARKER = {
    "store": ("rank-00001.done", "no completion marker from rank 1 (rank-00001.done)"),
    "lightning": ("rank-00001.done", "no completion marker from rank 1"),
    "transformers": (
        "slurmddp-complete.json",
        "it has no slurmddp-complete.json (its save did not finish, or it was not saved with "
        "SlurmddpCallback)",
    ),
    "accelerate": ("slurmddp-complete.json", "no completion marker (the save did not finish)"),
}
SHRUNK = {
    "store": ("shared.pt", "shared.pt has 1 bytes, its marker says 30 (truncated or replaced)"),
    "lightning": ("lightning.ckpt", "lightning.ckpt has 1 bytes, its marker says 30 (truncated or replaced)"),
    "transformers": ("model.safetensors", "model.safetensors has 1 bytes, its marker says 30"),
    "accelerate": ("model.safetensors", "model.safetensors has 1 bytes, its marker says 30"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_counts_a_checkpoint_as_written_complete(kind: str, tmp_path: Path) -> None:
    build, check = KINDS[kind]()
    assert check(build(tmp_path)) == []


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_names_a_missing_marker(kind: str, tmp_path: Path) -> None:
    build, check = KINDS[kind]()
    path = build(tmp_path)
    name, words = MISSING_MARKER[kind]
    (path / name).unlink()
    assert check(path)[0] == words


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_names_a_file_of_another_size(kind: str, tmp_path: Path) -> None:
    build, check = KINDS[kind]()
    path = build(tmp_path)
    name, words = SHRUNK[kind]
    (path / name).write_bytes(b"x")
    assert check(path) == [words]


@pytest.mark.parametrize("kind", ["store", "lightning"])
def test_the_kinds_that_record_checksums_find_a_changed_byte(kind: str, tmp_path: Path) -> None:
    build, check = KINDS[kind]()
    path = build(tmp_path)
    name = SHRUNK[kind][0]
    (path / name).write_bytes(bytes(reversed((path / name).read_bytes())))
    (found,) = check(path)
    assert found.startswith(f"{name} has CRC32 ") and found.endswith("(corrupt)")


def test_the_store_wants_every_marker_of_the_attempt_its_record_names(tmp_path: Path) -> None:
    build, check = KINDS["store"]()
    path = build(tmp_path)
    edit_marker(path / "rank-00001.done", attempt="a0")
    assert check(path) == ["rank-00001.done is from attempt 'a0' but meta.json from 'a1'"]


def test_lightnings_markers_must_agree_on_one_attempt(tmp_path: Path) -> None:
    build, check = KINDS["lightning"]()
    path = build(tmp_path)
    edit_marker(path / "rank-00001.done", attempt="a0")
    assert check(path) == ["its markers come from different attempts"]


def test_transformers_jit_sentinel_makes_its_checkpoint_incomplete(tmp_path: Path) -> None:
    build, check = KINDS["transformers"]()
    path = build(tmp_path)
    (path / "checkpoint-is-incomplete.txt").write_text("in progress")
    assert check(path) == ["it holds checkpoint-is-incomplete.txt (a save that did not finish)"]


def test_accelerates_marker_must_list_every_rank_it_names(tmp_path: Path) -> None:
    build, check = KINDS["accelerate"]()
    path = build(tmp_path)
    edit_marker(path / "slurmddp-complete.json", num_processes=3)
    assert check(path) == ["slurmddp-rank-00002.pt is not listed"]
