"""Drawing a followed job over time: on a terminal, a region that rich redraws in place below the
lines said (a state change, rank 0's output); anywhere else (CI, nohup, a pipe), each phase of the
start once and a plain progress line at most every PLAIN_EVERY_S, so such logs stay readable."""

from __future__ import annotations

import math
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console, RenderableType
from rich.control import Control
from rich.live import Live
from rich.segment import ControlType, Segment
from rich.text import Text

from slurmddp.manage.display import plain_line, render
from slurmddp.manage.snapshot import Snapshot

PLAIN_EVERY_S = 10.0
"""Off a terminal: the least time between two progress lines."""


class LiveView:
    """The live region: lines said go above it, the snapshot shown is redrawn in it.

    rich moves the cursor up over the region by as many lines as it drew. A terminal made
    narrower wraps the region's longer lines onto more rows than that (tmux, VTE, iTerm2 and
    Windows Terminal reflow their screen), and the top rows stayed behind as a stale fragment:
    so before each draw after a shrink, those extra rows are erased first."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.region: RenderableType = Text("")
        self.progressed = False
        """Whether the region shows a step (not only the start's phases)."""
        self.drawn: list[int] = []
        """The length of each line of the region as last drawn."""
        self.drawn_width = console.width
        self.live = Live(
            console=console,
            # Redrawn by `show` (each poll), so that nothing else draws between a shrink's
            # clean-up and the redraw.
            auto_refresh=False,
            transient=True,
            get_renderable=lambda: self.region,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def __enter__(self) -> LiveView:
        self.live.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._unwrap()
        self.live.stop()
        # The region stays only when the job ended: after a Ctrl-C, following goes on below (the
        # run being cancelled), in a region of its own; and only with progress in it: a run that
        # ended before its first step would leave a spinner frozen on its last phase.
        if kind is None and self.progressed:
            self.console.print(self.region)

    def say(self, line: str) -> None:
        self._unwrap()
        # Not markup: rank 0's output is the user's text ("[rank 0]" alone would be a style tag).
        self.console.print(Text(line), soft_wrap=True)

    def show(self, snap: Snapshot, final: bool = False) -> None:
        self._unwrap()
        self.region = render(snap)
        self.progressed = snap.step is not None
        self._measure()
        self.live.refresh()

    def _unwrap(self) -> None:
        width = self.console.width
        if width < self.drawn_width:
            rows = sum(max(1, math.ceil(length / width)) for length in self.drawn)
            extra = rows - len(self.drawn)
            if extra > 0:
                up = ((ControlType.CURSOR_UP, 1), (ControlType.ERASE_IN_LINE, 2)) * extra
                self.console.control(Control((ControlType.ERASE_IN_LINE, 2), *up))
            self._measure()
        self.drawn_width = width

    def _measure(self) -> None:
        lines = self.console.render_lines(self.region, pad=False)
        self.drawn = [Segment.get_line_length(line) for line in lines]
        self.drawn_width = self.console.width


class PlainView:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.shown = ""
        self.shown_at = -math.inf
        self.phase: str | None = None

    def __enter__(self) -> PlainView:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        return None

    def say(self, line: str) -> None:
        self.out.write(f"{line}\n")
        self.out.flush()

    def show(self, snap: Snapshot, final: bool = False) -> None:
        if snap.step is None:
            # Each step of the start once; the elapsed time alone is nothing new.
            if snap.starting is not None and snap.starting != self.phase and not final:
                self.phase = snap.starting
                self.say(f"slurmddp: {snap.starting}")
            return
        line = plain_line(snap)
        # A line is written only when it says something new: a new record changes it.
        if line == self.shown:
            return
        if final or time.monotonic() - self.shown_at >= PLAIN_EVERY_S:
            self.say(line)
            self.shown, self.shown_at = line, time.monotonic()
