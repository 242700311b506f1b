"""slurmddp.cluster.hostlist against hand-picked answers, and against the real `scontrol show hostnames`.

The expected answers below were taken from scontrol of Slurm 22.05.8 (Debian 12). The comparison
test replays them, plus a seeded random corpus, through the installed scontrol; it needs no
running Slurm, only a two-line slurm.conf.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurmddp.cluster.hostlist import MAX_HOSTS, expand
from slurmddp.errors import HostlistError, SlurmddpError

VALID: list[tuple[str, list[str]]] = [
    ("n1", ["n1"]),
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
    ("n[001-010]", [f"n{i:03d}" for i in range(1, 11)]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    # Padding is the written length of the low bound only.
    ("n[1-010]", [f"n{i}" for i in range(1, 11)]),
    ("n[01-2],n[1-02]", ["n01", "n02", "n1", "n2"]),
    ("n[+1-2]", ["n01", "n02"]),
    ("n[ 1-2]", ["n01", "n02"]),
    ("n[1 -2]", ["n01", "n02"]),
    ("n[1, 2]", ["n1", "n02"]),
    ("n[1a-3]", ["n01", "n02", "n03"]),
    ("n[1\u00e9-3]", ["n001", "n002", "n003"]),  # width counts UTF-8 bytes, as strlen does
    # Several bracket groups: the earlier ones vary slowest.
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("a[1-2]b[1-2]c[1-2]", ["a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"]),
    ("n[1-2][3]", ["n13", "n23"]),
    ("n[1-2]-[3-4]", ["n1-3", "n1-4", "n2-3", "n2-4"]),
    # Order and duplicates are kept.
    ("a,a,b,a", ["a", "a", "b", "a"]),
    ("n[1-2],n[2-3]", ["n1", "n2", "n2", "n3"]),
    ("n[2,1,2]", ["n2", "n1", "n2"]),
    # Separators are ',', ' ' and TAB; empty names vanish; a newline is part of a name.
    (",a,,b,", ["a", "b"]),
    (" a , b ", ["a", "b"]),
    ("a\tb", ["a", "b"]),
    ("a\nb", ["a\nb"]),  # scontrol prints it as two lines
    ("", []),
    (",", []),
    ("[1-3]", ["1", "2", "3"]),
    ("n[1-]", ["n1"]),
    ("n007,n8", ["n007", "n8"]),
    # Unbalanced brackets are names, mangled.
    ("n[1-2", ["n]"]),
    ("[ab", ["ab"]),
    ("[", [""]),
    ("a]b", ["a]b"]),
    ("a[b[1]", ["a[b1"]),
    ("n[[1-2]", ["n[1", "n[2"]),
    ("a[[1],2]", ["a[1", "2]"]),
    ("a,[1-2]b[3]", ["a", "1b3", "2b3"]),
    # Numbers saturate at 2**64-1 and keep their written width.
    ("n99999999999999999999999", ["n00018446744073709551615"]),
    ("n[18446744073709551615]", ["n18446744073709551615"]),
    ("n[0- -0]", ["n0"]),
    # `-1` is 2**64-1: the range 0..2**64-1 counts 0 hosts and stops the output.
    ("n[0- -1]", []),
    ("n[0- -1],b", []),
    ("n[0- -1],n0", ["n0"]),
    ("99999999999999999999,0,1", ["1844674407370955", "0", "1"]),
    # Ranges merge on prefixes equal in natural order, which skips blanks.
    ("a[ b[1],a[b[2]", ["a[ b1", "a[ b2"]),
    # A bad range two groups before the end is dropped, not rejected.
    ("a[x]b[1]c[1]", []),
    ("ok,a[x]b[1]c[1],ok2", ["ok", "ok2"]),
    # 2**32 names: Slurm's int host counter wraps to 0.
    ("a[0-65535]b[0-65535]", []),
]

# (expression, column the message points at, words the message contains)
INVALID: list[tuple[str, int, str]] = [
    ("n[3-1]", 3, "runs backwards"),
    ("n[010-9]", 3, "runs backwards"),
    ("n[]", 3, "empty range"),
    ("n[1-2,]", 7, "empty range"),
    ("n[,1]", 3, "empty range"),
    ("n[1,,2]", 5, "empty range"),
    ("[]", 2, "empty range"),
    ("n[1--2]", 3, "negative"),
    ("n[5- -1]", 3, "negative upper bound"),
    ("n[-1]", 3, "does not start with a number"),
    ("n[a-b]", 3, "does not start with a number"),
    ("n[1-a]", 3, "no number after '-'"),
    ("n[1-2-3]", 3, "text after its upper bound"),
    ("n[1-2 ]", 3, "text after its upper bound"),
    ("n[1 ]", 3, "text after its number"),
    ("n[1x]", 3, "contains 'x'"),
    ("n[0x1]", 3, "contains 'x'"),
    ("n[1-2]x", 7, "nothing but ','"),
    ("n[1-2]]", 7, "nothing but ','"),
    ("n[1-[2]]", 8, "nothing but ','"),
    ("a[1-2]b,[3]", 7, "nothing but ','"),
    ("ok,n[0-65536]", 6, "holds 65537 hosts, more than the 65536"),
    ("a[1]b[x]c[1]", 7, "contains 'x'"),
    ("a[0-65535,0]b[1]", 2, "more than 65536 name variants"),
    ("a[0-32767,0-32768]b[1]", 2, "more than 65536 name variants"),
    ("n[18446744073709551614-18446744073709551615]", 3, "crashes scontrol"),
    ("n18446744073709551614,n18446744073709551615", 1, "crashes scontrol"),
    ("n[18446744073709551614-18446744073709551615],n0", 3, "crashes scontrol"),
    ("n\u00e9,m[2-1]", 6, "runs backwards"),  # columns count characters, not bytes
]

# scontrol never returns on these (an endless loop, or one that eats all memory before it aborts),
# so they stay out of the comparison with it.
HANGS: list[tuple[str, int]] = [
    ("a[18446744073709551615]b[1]", 3),
    ("a[0- -1]b[1]", 3),
    ("x[z]a[0- -1]b[1]", 7),
]


@pytest.mark.parametrize(("expr", "hosts"), VALID)
def test_expand_matches_scontrol_answers(expr: str, hosts: list[str]) -> None:
    assert expand(expr) == hosts


@pytest.mark.parametrize(("expr", "column", "words"), INVALID)
def test_rejects_what_scontrol_rejects_and_says_where(expr: str, column: int, words: str) -> None:
    with pytest.raises(HostlistError) as caught:
        expand(expr)
    assert f"at character {column}:" in str(caught.value)
    assert words in str(caught.value)
    assert isinstance(caught.value, SlurmddpError)


@pytest.mark.parametrize(("expr", "column"), HANGS)
def test_rejects_what_makes_scontrol_hang(expr: str, column: int) -> None:
    with pytest.raises(HostlistError, match=f"at character {column}: .*loop forever"):
        expand(expr)


def test_largest_range_slurm_allows() -> None:
    hosts = expand("n[1-65536]")
    assert (len(hosts), hosts[0], hosts[-1]) == (65536, "n1", "n65536")


def test_more_than_262144_ranges_in_a_bracket_is_fatal_in_slurm() -> None:
    assert len(expand("n[" + ",".join(["1"] * 262144) + "]")) == 262144
    with pytest.raises(HostlistError, match="more than 262144 ranges"):
        expand("n[" + ",".join(["1"] * 262145) + "]")


def test_dropped_names_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="slurmddp.cluster.hostlist"):
        assert expand("ok,a[x]b[1-2]c[1]") == ["ok"]
    assert "drops 2 group(s) of names" in caplog.text
    assert "range 'x' contains 'x'" in caplog.text


def test_nul_and_non_text_characters_are_refused() -> None:
    with pytest.raises(HostlistError, match="at character 3: a NUL character"):
        expand("ab\0c")
    with pytest.raises(HostlistError, match="not text"):
        expand("n\ud800")


def test_undecodable_bytes_from_the_environment_survive() -> None:
    # os.environ carries bytes that are not UTF-8 as surrogate escapes.
    assert expand("n\udcff[1-2]") == ["n\udcff1", "n\udcff2"]


def test_expansion_is_capped() -> None:
    assert len(expand("n[1-4]", max_hosts=4)) == 4
    with pytest.raises(HostlistError, match="more than 4 hosts"):
        expand("n[1-5]", max_hosts=4)
    # Internal steps count too: this makes 3 pushes and no host.
    with pytest.raises(HostlistError, match="more than 2 steps"):
        expand("n[0- -1],n[0- -1],n[0- -1]", max_hosts=2)
    with pytest.raises(HostlistError, match=f"more than {MAX_HOSTS} hosts"):
        expand("a[0-16]b[0-65535]")


# ---- the same behaviour, asked of the real scontrol ----------------------------------------------

# A number this large, or a negative upper bound, can reach 2**64-1: in a bracket group before the
# last one that makes scontrol loop forever (HANGS), so the generator keeps them out of such names.
_REACHES_ULONG_MAX = re.compile(r"\d{20}|18446744073709551615|-[ \t\n\v\f\r]*-")


def _number(rng: random.Random, last: bool, alone: bool) -> str:
    """`last`: in the last bracket group, where 2**64-1 is safe; `alone`: of a one-group name, where
    65536 hosts are cheap."""
    if last and rng.random() < 0.06:
        return rng.choice(["18446744073709551615", "99999999999999999999"] + ["65535", "65536"] * alone)
    number = str(rng.randrange(0, 25))
    if rng.random() < 0.25:
        number = "0" * rng.randrange(1, 3) + number
    if rng.random() < 0.05:
        number = rng.choice([" ", "+", "\t"]) + number
    return number


def _range(rng: random.Random, last: bool, alone: bool) -> str:
    roll = rng.random()
    if roll < 0.35:
        return _number(rng, last, alone)
    if roll < 0.75:
        lo, width = rng.randrange(0, 20), rng.choice([0, 0, 0, 2, 3])
        return f"{lo:0{width}d}-{lo + rng.randrange(0, 6):0{rng.choice([0, width])}d}"
    if roll < 0.85:
        return _number(rng, last, alone) + "-" + _number(rng, last, alone)
    odd = ["", "x", "a", "-1", "1-", "1--2", "3-1", "1 ", "1-2-3", "1a-3", "2-", "1x-2"]
    return rng.choice(odd + ["1- -1"] * last + ["0-65535", "0-65536"] * (last and alone))


def _name(rng: random.Random) -> str:
    groups = rng.choice([0, 1, 1, 1, 2, 2, 3])
    parts = []
    for group in range(groups):
        parts.append(rng.choice(["n", "node", "gpu-", "rack", "a.b", "", "c0", "x", "N-", "\u00e9"]))
        last = group == groups - 1
        ranges = (_range(rng, last, groups == 1) for _ in range(rng.choice([1, 1, 2, 3])))
        parts.append("[" + ",".join(ranges) + "]")
    if groups == 0 or rng.random() < 0.2:
        parts.append(rng.choice(["n1", "node007", "login", "", "x", "-s", "a1b2", "12"]))
    return "".join(parts)


def _mutate(rng: random.Random, expr: str) -> str:
    chars = list(expr)
    for _ in range(rng.randrange(1, 4)):
        roll, at = rng.random(), rng.randrange(0, len(chars) + 1)
        if roll < 0.4 and chars:
            del chars[min(at, len(chars) - 1)]
        elif roll < 0.8:
            chars.insert(at, rng.choice("[],- \t0x+9\n"))
        elif len(chars) > 1:
            i = rng.randrange(0, len(chars) - 1)
            chars[i], chars[i + 1] = chars[i + 1], chars[i]
    return "".join(chars)


def generated_corpus(seed: int, count: int) -> list[str]:
    """`count` expressions, about half of them ones Slurm rejects."""
    rng = random.Random(seed)
    corpus: list[str] = []
    while len(corpus) < count:
        names = [_name(rng) for _ in range(rng.choice([1, 1, 2, 3]))]
        separators = [rng.choice([",", ",", ",", " ", "\t", ",,", ", "]) for _ in names]
        joined = "".join(name + sep for name, sep in zip(names, separators, strict=True))
        expr = joined[: -len(separators[-1])]
        if rng.random() < 0.1:
            expr = rng.choice([",", " ", ""]) + expr + rng.choice([",", " ", ""])
        if rng.random() < 0.35:
            expr = _mutate(rng, expr)
        if expr.count("[") > 1 and _REACHES_ULONG_MAX.search(expr):
            continue
        corpus.append(expr)
    return corpus


CORPUS = [expr for expr, _ in VALID] + [expr for expr, _, _ in INVALID] + generated_corpus(2205, 300)


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if shutil.which("scontrol") is None:
        reason = "scontrol is not on PATH: install slurm-client to compare with the real parser"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true requires it)")
        pytest.skip(reason)
    # All that scontrol 22.05 needs to run offline: without ClusterName it stops ("ClusterName
    # needs to be specified"), without SlurmctldHost too ("No SlurmctldHost defined"); nodes and
    # partitions are not needed.
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=hostlist-test\nSlurmctldHost=localhost\n")
    yield conf


def _scontrol_hostnames(expr: str, conf: Path) -> bytes | None:
    """What scontrol prints for `expr`, or None when it rejects it."""
    result = subprocess.run(
        # `--` keeps an expression like `-a` from being taken for an option of scontrol.
        ["scontrol", "--", "show", "hostnames", expr],
        capture_output=True,
        env={"PATH": os.environ["PATH"], "SLURM_CONF": str(conf), "LC_ALL": "C"},
        timeout=60,
        check=False,
    )
    # Rejection leaves the exit code at 0 and prints "Invalid hostlist: EXPR" on stderr; a
    # fatal error exits 1; a crash dies of a signal (negative code). A stderr line starting with
    # "scontrol: error:" alone is not a rejection: Slurm may drop names and carry on.
    if result.returncode != 0 or re.search(rb"(^|\n)Invalid hostlist: ", result.stderr):
        return None
    return result.stdout


def _expand_as_stdout(expr: str) -> bytes | None:
    try:
        hosts = expand(expr)
    except HostlistError:
        return None
    return b"".join(host.encode("utf-8", "surrogateescape") + b"\n" for host in hosts)


def test_generated_corpus_is_varied() -> None:
    corpus = generated_corpus(2205, 300)
    assert len(set(corpus)) > 280
    rejected = sum(_expand_as_stdout(expr) is None for expr in corpus)
    assert 0.3 < rejected / len(corpus) < 0.7


def test_expand_agrees_with_real_scontrol(slurm_conf: Path) -> None:
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        answers = list(pool.map(lambda expr: _scontrol_hostnames(expr, slurm_conf), CORPUS))
    mismatches = [
        f"{expr!r}: scontrol {want!r:.200} / expand {got!r:.200}"
        for expr, want in zip(CORPUS, answers, strict=True)
        if (got := _expand_as_stdout(expr)) != want
    ]
    assert not mismatches, f"{len(mismatches)} of {len(CORPUS)} differ:\n" + "\n".join(mismatches)
    assert sum(answer is None for answer in answers) > 100  # both kinds were compared
