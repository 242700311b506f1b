"""Slurm hostlist expressions (`node[01-04,07]`), expanded exactly as `scontrol show hostnames` does.

slurmddp must agree with Slurm on which node is which (rank 0's node is MASTER_ADDR), so this is a
port of the parser in Slurm's src/common/hostlist.c, quirks included, checked against
`scontrol show hostnames` of Slurm 22.05.8 (Debian 12) by tests/cluster/test_hostlist.py. What that version
does, surprising parts included:

- Names are separated by ',', ' ' or TAB; empty names vanish (`,a,,b,` is `a b`). A newline is
  not a separator: `a\\nb` is one name. Order is kept and duplicates are kept (no sort, no dedupe).
- Only the LAST bracket group of a name may be followed by nothing but the end of the name:
  `n[1-2]x` is rejected, yet `n[1-2]-[3-4]` and `rack[1-2]-node[01-02]` are fine. Earlier groups
  vary slowest: `a[1-2]b[1-2]` is `a1b1 a1b2 a2b1 a2b2`.
- Zero padding is the length of the LOW bound as written, nothing else: `n[01-10]` is n01..n10,
  `n[1-010]` is n1..n10, `n[+1-2]` and `n[ 1-2]` are n01 n02 (strtoul skips blanks and '+').
  Text after the low bound is ignored when a high bound follows: `n[1a-3]` is n01 n02 n03.
- Descending ranges (`n[3-1]`), empty ranges (`n[]`, `n[1,]`), 'x' anywhere in a range, `--`
  and any range of more than 65536 hosts are rejected; `n[1-]` is n1.
- A '[' without a ']' is not an error but is mangled: `n[1-2` is the single name `n]`, and `[ab`
  is `ab`. A ']' before any '[' is part of the name.
- Numbers past 2**64-1 saturate to 18446744073709551615 and keep their written width. A range
  that reaches 2**64-1 with hosts after it crashes scontrol (SIGSEGV), and one in a non-final
  bracket group makes it loop forever: both raise HostlistError here.
- A bad bracket group that is neither the last nor the one before it does not reject the
  expression: Slurm logs an error (or nothing) and drops those names, so `a[x]b[1]c[1]` is empty.
  We log a warning and drop them too.
- Merging of adjacent ranges compares prefixes in natural order, which ignores blanks, so
  `a[ b[1],a[b[2]` is `a[ b1 a[ b2`, and Slurm's host counter is a C int that wraps:
  `a[0-65535]b[0-65535]` (2**32 names) expands to nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

from slurmddp.errors import HostlistError

_LOG = logging.getLogger(__name__)

MAX_HOSTS = 1 << 20
"""slurmddp's own ceiling (not Slurm's) on the hosts, and on the internal steps, of one expansion:
far beyond any real job, and it keeps a hostile expression from eating the login node's memory."""

_ULONG_MAX = (1 << 64) - 1
# Limits compiled into Slurm 22.05's hostlist.c.
_MAX_RANGE = 64 * 1024  # hosts in one lo-hi range
_MAX_RANGES = 256 * 1024  # comma-separated ranges in one bracket group (more is a fatal error)
_MAX_PREFIX_CNT = 64 * 1024  # names one non-final bracket group may produce
_SEPARATORS = b"\t, "
_C_SPACE = b" \t\n\v\f\r"  # isspace() in the C locale, as strtoul and strnatcmp use it
_DIGITS = b"0123456789"


class _Range(NamedTuple):
    lo: int
    hi: int
    width: int
    offset: int  # where it was written, for messages


@dataclass(slots=True)
class _HostRange:
    """hostrange_t: `prefix` followed by each number lo..hi zero-padded to `width`, or, when
    `single`, just `prefix` (a name with no numeric suffix)."""

    prefix: bytes
    lo: int
    hi: int
    width: int
    single: bool
    origin: int  # byte offset of the text it came from, for messages


class _Invalid(Exception):
    """A range Slurm refuses (its `return -1` path); `offset` is a byte offset in the expression."""

    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(problem)
        self.offset = offset
        self.problem = problem


def expand(expr: str, *, max_hosts: int = MAX_HOSTS) -> list[str]:
    """The host names `scontrol show hostnames EXPR` prints, in its order, duplicates kept.

    Raises HostlistError where scontrol prints "Invalid hostlist", aborts, crashes or hangs, with
    what is wrong and at which character; also when the expansion would exceed `max_hosts`.
    """
    src = _encode(expr)
    hosts = _HostList(src, max_hosts)
    pos = 0
    while (token := _next_token(src, pos)) is not None:
        start, pos = token
        try:
            _add_token(hosts, src, start, pos)
        except _Invalid as invalid:
            raise _error(src, invalid.offset, invalid.problem) from None
    if hosts.skipped:
        first = hosts.skipped[0]
        _LOG.warning(
            "hostlist %r: Slurm 22.05 accepts it but drops %d group(s) of names from it; the first "
            "because, at character %d, %s",
            _excerpt(expr, _column(src, first.offset) - 1),
            len(hosts.skipped),
            _column(src, first.offset),
            first.problem,
        )
    return [host.decode("utf-8", "surrogateescape") for host in _shift_all(hosts)]


def _encode(expr: str) -> bytes:
    # Slurm sees bytes: widths are strlen() of the UTF-8 text, and the environment carries
    # undecodable bytes as surrogate escapes.
    if "\0" in expr:
        at = expr.index("\0")
        raise HostlistError(
            f"invalid Slurm hostlist {_excerpt(expr, at)!r} at character {at + 1}: a NUL character "
            "cannot reach Slurm (C strings end there); remove it"
        )
    try:
        return expr.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise HostlistError(
            f"the hostlist {_excerpt(expr, exc.start)!r} holds a character that is not text "
            f"(at character {exc.start + 1}); pass the node list exactly as Slurm gave it"
        ) from None


def _column(src: bytes, offset: int) -> int:
    return len(src[:offset].decode("utf-8", "surrogateescape")) + 1


def _excerpt(text: str, at: int) -> str:
    if len(text) <= 80:
        return text
    lo = max(0, at - 30)
    return ("..." if lo else "") + text[lo : lo + 60] + ("..." if lo + 60 < len(text) else "")


def _error(src: bytes, offset: int, problem: str) -> HostlistError:
    text = src.decode("utf-8", "surrogateescape")
    column = _column(src, offset)
    return HostlistError(
        f"invalid Slurm hostlist {_excerpt(text, column - 1)!r} at character {column}: {problem}"
    )


def _show(raw: bytes) -> str:
    return repr(raw.decode("utf-8", "surrogateescape"))


class _HostList:
    """The hostlist_t being built: ranges in the order pushed, and Slurm's host counter."""

    def __init__(self, src: bytes, max_hosts: int) -> None:
        self.src = src
        self.max_hosts = max_hosts
        self.ranges: list[_HostRange] = []
        self.nhosts = 0
        self.steps = 0
        self.skipped: list[_Invalid] = []

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.max_hosts:
            raise self.too_big(f"needs more than {self.max_hosts} steps to expand")

    def too_big(self, what: str) -> HostlistError:
        return HostlistError(
            f"the hostlist {_excerpt(self.src.decode('utf-8', 'surrogateescape'), 0)!r} {what}; "
            "slurmddp stops there (no real job has that many nodes): check the ranges"
        )

    def push_host(self, name: bytes, origin: int) -> None:
        """hostlist_push_host: a trailing run of digits becomes the range number."""
        cut = len(name)
        while cut > 0 and name[cut - 1] in _DIGITS:
            cut -= 1
        if cut == len(name):
            self.push(_HostRange(name, 0, 0, 0, single=True, origin=origin))
            return
        number = min(int(name[cut:]), _ULONG_MAX)  # strtoul saturates
        self.push(_HostRange(name[:cut], number, number, len(name) - cut, False, origin))

    def push_ranges(self, prefix: bytes, ranges: list[_Range]) -> None:
        for lo, hi, width, offset in ranges:
            self.push(_HostRange(prefix, lo, hi, width, single=False, origin=offset))

    def push(self, new: _HostRange) -> None:
        """hostlist_push_range: extend the last range when `new` continues it, else append."""
        self.step()
        tail = self.ranges[-1] if self.ranges else None
        merged = False
        if (
            tail is not None
            and tail.hi == (new.lo - 1) & _ULONG_MAX
            and tail.single == new.single
            and (tail.prefix == new.prefix or _natural_equal(tail.prefix, new.prefix))
        ):
            merged, tail.width = _width_equiv(tail.lo, tail.width, new.lo, new.width)
            if merged:
                # Keeps the tail's prefix: natural order calls `a[ b` and `a[b` equal.
                tail.hi = new.hi
        if not merged:
            self.ranges.append(new)
        # Slurm's counter is a C int; it is wrapped once, when read (_shift_all).
        self.nhosts += 1 if new.single else (new.hi - new.lo + 1) & _ULONG_MAX


def _c_int(value: int) -> int:
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


def _strtoul(text: bytes) -> tuple[int, int]:
    """C strtoul(text, &end, 10) in the C locale: (value, index of end); end 0 means no number."""
    if text.isdigit():  # the common case; bytes.isdigit() is ASCII-only, like C's
        return min(int(text), _ULONG_MAX), len(text)
    i = 0
    while i < len(text) and text[i] in _C_SPACE:
        i += 1
    negative = i < len(text) and text[i] == ord("-")
    if i < len(text) and text[i] in b"+-":
        i += 1
    first = i
    while i < len(text) and text[i] in _DIGITS:
        i += 1
    if i == first:
        return 0, 0
    value = int(text[first:i])
    if value > _ULONG_MAX:
        return _ULONG_MAX, i
    return (-value & _ULONG_MAX) if negative else value, i


def _zero_padded(num: int, width: int) -> int:
    return max(width - len(str(num)), 0)


def _width_equiv(n: int, wn: int, m: int, wm: int) -> tuple[bool, int]:
    """_width_equiv: whether widths wn (of n) and wm (of m) pad alike, and n's width to keep."""
    if wn == wm:
        return True, wn
    n_own, n_other = _zero_padded(n, wn), _zero_padded(n, wm)
    m_own, m_other = _zero_padded(m, wm), _zero_padded(m, wn)
    if n_own != n_other and m_own != m_other:
        return False, wn
    if n_own != n_other:
        return True, wn  # Slurm adjusts m's width instead, and m is discarded after a merge
    return True, wm


def _natural_equal(a: bytes, b: bytes) -> bool:
    """strnatcmp(a, b) == 0: blanks are skipped, runs of digits compared as numbers."""
    ai = bi = 0
    while True:
        while ai < len(a) and a[ai] in _C_SPACE:
            ai += 1
        while bi < len(b) and b[bi] in _C_SPACE:
            bi += 1
        ca = a[ai] if ai < len(a) else 0
        cb = b[bi] if bi < len(b) else 0
        if ca in _DIGITS and cb in _DIGITS and not _digit_runs_equal(a, ai, b, bi):
            return False
        if ca == 0 and cb == 0:
            return True
        if ca != cb:
            return False
        ai += 1
        bi += 1


def _digit_runs_equal(a: bytes, ai: int, b: bytes, bi: int) -> bool:
    # strnatcmp's compare_left (after a leading zero) and compare_right both report "equal"
    # exactly when the two digit runs are identical.
    while True:
        da = ai < len(a) and a[ai] in _DIGITS
        db = bi < len(b) and b[bi] in _DIGITS
        if not da and not db:
            return True
        if da != db or a[ai] != b[bi]:
            return False
        ai += 1
        bi += 1


def _next_token(src: bytes, pos: int) -> tuple[int, int] | None:
    """_next_tok: the next name as (start, end), separators inside a [...] pair included."""
    n = len(src)
    while pos < n and src[pos] in _SEPARATORS:
        pos += 1
    if pos == n:
        return None
    start = parse = end = pos
    while True:
        while end < n and src[end] not in _SEPARATORS:
            end += 1
        while True:
            # Slurm pairs the first '[' with the first ']' after `parse`, even one before it.
            opening = src.find(b"[", parse)
            if opening < 0 or opening > end:
                return start, end
            closing = src.find(b"]", parse)
            if closing < 0 or closing < opening:
                return start, end
            if closing < end:
                parse = closing + 1
                continue
            end = closing
            break


def _add_token(hosts: _HostList, src: bytes, start: int, end: int) -> None:
    token = src[start:end]
    opening = token.rfind(b"[")
    if opening < 0:
        hosts.push_host(token, start)
        return
    prefix, rest = token[:opening], token[opening + 1 :]
    closing = rest.find(b"]")
    if closing < 0:
        # Slurm 22.05 "tacks on" the missing ']' after cutting the name at '[': `n[1-2` -> `n]`.
        hosts.push_host(prefix + b"]" if prefix else rest, start)
        return
    after = rest[closing + 1 : closing + 2]
    if after not in (b"", b","):
        raise _Invalid(
            start + opening + 1 + closing + 1,
            f"{_show(rest[closing + 1 :])} follows the last ']' of {_show(token)}; Slurm allows "
            "nothing but ',' after the last bracket group of a name, so names with a fixed suffix "
            "must be listed one by one (`n1x,n2x`, not `n[1-2]x`)",
        )
    ranges = _parse_range_list(rest[:closing], start + opening + 1, src)
    _push_range_list(hosts, prefix, ranges, start)


def _parse_range_list(text: bytes, offset: int, src: bytes) -> list[_Range]:
    """_parse_range_list: the comma-separated ranges of one bracket group starting at `offset`."""
    ranges: list[_Range] = []
    pos = 0
    while True:
        if len(ranges) == _MAX_RANGES:
            raise _error(
                src,
                offset,
                f"this bracket group lists more than {_MAX_RANGES} ranges, which makes Slurm abort "
                "(fatal: Too many ranges); merge them into lo-hi ranges",
            )
        comma = text.find(b",", pos)
        piece = text[pos:] if comma < 0 else text[pos:comma]
        ranges.append(_parse_single_range(piece, offset + pos))
        if comma < 0:
            return ranges
        pos = comma + 1


def _parse_single_range(piece: bytes, offset: int) -> _Range:
    """_parse_single_range: `lo` or `lo-hi`, with strtoul's leniency and Slurm's checks."""
    if piece.isdigit():  # the common case, `7` or `007`, needs none of the checks below
        number = min(int(piece), _ULONG_MAX)
        return _Range(number, number, len(piece), offset)
    shown = _show(piece)
    if b"x" in piece:
        raise _Invalid(offset, f"range {shown} contains 'x' (Slurm keeps it for 3-D boxes)")
    dash = piece.find(b"-")
    low_text, high_text = (piece, None) if dash < 0 else (piece[:dash], piece[dash + 1 :])
    if high_text is not None and high_text.startswith(b"-"):
        raise _Invalid(offset, f"range {shown} has a negative bound; bounds are numbers >= 0")
    lo, low_end = _strtoul(low_text)
    if low_end == 0:
        if not piece.strip(_C_SPACE):
            raise _Invalid(offset, "empty range; remove the stray ',' or write a number or lo-hi")
        raise _Invalid(offset, f"range {shown} does not start with a number")
    if high_text:
        hi, high_end = _strtoul(high_text)
        if high_end == 0:
            raise _Invalid(offset, f"range {shown} has no number after '-'")
        if high_end != len(high_text):
            raise _Invalid(offset, f"range {shown} has text after its upper bound")
    else:
        hi = lo
        if low_end != len(low_text):
            raise _Invalid(offset, f"range {shown} has text after its number")
    if lo > hi:
        raise _Invalid(offset, f"range {shown} runs backwards; Slurm only accepts ascending lo-hi ranges")
    count = (hi - lo + 1) & _ULONG_MAX
    if count > _MAX_RANGE and high_text and high_text.lstrip(_C_SPACE).startswith(b"-"):
        raise _Invalid(offset, f"range {shown} has a negative upper bound; bounds are numbers >= 0")
    if count > _MAX_RANGE:
        raise _Invalid(
            offset,
            f"range {shown} holds {count} hosts, more than the {_MAX_RANGE} Slurm allows in one "
            "range; split it into several ranges",
        )
    # The padding width is the written length of the low bound, blanks and signs included.
    return _Range(lo, hi, len(low_text), offset)


def _push_range_list(hosts: _HostList, prefix: bytes, ranges: list[_Range], base: int) -> None:
    """_push_range_list: a bracket group inside `prefix` multiplies the names, outermost slowest.

    `base` is the offset of `prefix` in the expression; prefixes built here keep their brackets
    at the same offsets, since only text after the last bracket group is replaced.
    """
    opening = prefix.rfind(b"[")
    closing = prefix.rfind(b"]", opening + 1) if opening >= 0 else -1
    if closing < 0:
        hosts.push_ranges(prefix, ranges)
        return
    head, tail = prefix[:opening], prefix[closing + 1 :]
    nested = b"[" in head
    variants = _parse_range_list(prefix[opening + 1 : closing], base + opening + 1, hosts.src)
    total = 0
    for lo, hi, width, _ in variants:
        total = (total + hi - lo + 1) & _ULONG_MAX
        if total > _MAX_PREFIX_CNT:
            raise _Invalid(
                base + opening,
                f"this bracket group, before the last one, makes more than {_MAX_PREFIX_CNT} name "
                "variants, which Slurm refuses; use fewer or smaller ranges",
            )
        if hi == _ULONG_MAX:
            # Slurm's `for (j = lo; j <= hi; j++)` never ends when hi is ULONG_MAX.
            raise _error(
                hosts.src,
                base + opening + 1,
                f"a range reaching {_ULONG_MAX} in a bracket group before the last one makes "
                "Slurm loop forever; use smaller numbers",
            )
        for number in range(lo, hi + 1):
            variant = head + b"%0*d" % (width, number) + tail
            if not nested:
                hosts.push_ranges(variant, ranges)
                continue
            hosts.step()
            try:
                _push_range_list(hosts, variant, ranges, base)
            except _Invalid as invalid:
                # Slurm keeps the largest return code of these nested calls, i.e. 0: their
                # errors are logged and the names dropped, but the hostlist is accepted.
                hosts.skipped.append(invalid)


def _shift_all(hosts: _HostList) -> list[bytes]:
    """What `while ((host = hostlist_shift(hl)))` yields, including its off-by-one failures."""
    out: list[bytes] = []
    ranges = hosts.ranges
    head = 0  # index of hl->hr[0]; popping the front of a list is O(n)
    nhosts = _c_int(hosts.nhosts)
    culprit = 0
    while nhosts > 0:
        if head == len(ranges):
            # hostlist_shift dereferences hr[0] == NULL: the counter says hosts are left, but a
            # range ending at 2**64-1 was dropped early (see below).
            raise _error(
                hosts.src,
                culprit,
                f"a range reaching {_ULONG_MAX} (2**64-1) with hosts after it crashes scontrol "
                "(SIGSEGV); use smaller numbers",
            )
        hr = ranges[head]
        if hr.single:
            _check_room(hosts, len(out) + 1)
            out.append(hr.prefix)
            nhosts -= 1
            head += 1
            continue
        count = (hr.hi - hr.lo + 1) & _ULONG_MAX
        if count == 0:
            # hostrange_shift returns NULL for the wrapped range `0-(2**64-1)`: output stops.
            return out
        if hr.lo == hr.hi < 10**16:  # a single number of <= 16 digits (no truncation): quick
            _check_room(hosts, len(out) + 1)
            out.append(hr.prefix + b"%0*d" % (hr.width, hr.lo))
            nhosts -= 1
            head += 1
            continue
        if hr.lo <= hr.hi and hr.hi != _ULONG_MAX:
            take = min(count, nhosts)
            _check_room(hosts, len(out) + take)
            out.extend(_names(hr, take))
            hr.lo += take
            nhosts -= take
            if hr.lo > hr.hi:
                head += 1
            continue
        # A range ending at 2**64-1, or one that wrapped past it when merged: step exactly as
        # hostrange_shift does; hostrange_empty() calls any range ending at 2**64-1 empty.
        _check_room(hosts, len(out) + 1)
        out.extend(_names(hr, 1))
        hr.lo = (hr.lo + 1) & _ULONG_MAX
        nhosts -= 1
        culprit = hr.origin
        if hr.hi < hr.lo or hr.hi == _ULONG_MAX:
            head += 1
    return out


def _names(hr: _HostRange, count: int) -> list[bytes]:
    """The first `count` names of `hr`, as hostrange_shift's snprintf writes them."""
    names = [hr.prefix + b"%0*d" % (hr.width, n) for n in range(hr.lo, hr.lo + count)]
    # Its buffer holds prefix + width + 15 bytes: a merge can leave a range whose width is far
    # below its numbers' length (`99999999999999999999,0` prints `1844674407370955`, `0`).
    room = len(hr.prefix) + hr.width + 15
    if len(str(hr.lo + count - 1)) > hr.width + 15:
        names = [name[:room] for name in names]
    return names


def _check_room(hosts: _HostList, needed: int) -> None:
    if needed > hosts.max_hosts:
        raise hosts.too_big(f"expands to more than {hosts.max_hosts} hosts")
