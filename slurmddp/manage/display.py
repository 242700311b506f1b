"""How a followed job looks: on a terminal, a region (a bar with step/total, then the speed, ETA,
epoch and attempt, then the latest metrics, each line packed to the width it is drawn at, so
nothing is cut at any width); anywhere else, the same as one plain line; at the end, the result
block. Drawing them over time: manage/views.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from slurmddp.manage import numbers
from slurmddp.manage.snapshot import Snapshot

GAP = "  "


def step_text(snap: Snapshot) -> str:
    """`65/176 (36%)`, or `65` where the total is not known."""
    if snap.step is None:
        return "?"
    if not snap.total_steps:
        return str(snap.step)
    return f"{snap.step}/{snap.total_steps} ({100 * snap.step // snap.total_steps}%)"


def epoch_text(epoch: int, epochs: int) -> str:
    """The epoch counted from 0, as ctx.loop and the metrics count it, with the range it runs in."""
    return f"epoch {epoch} (0-{epochs - 1})"


def detail_items(snap: Snapshot) -> list[str]:
    items = [
        f"{numbers.rate(snap.rate) if snap.rate is not None else numbers.NOT_KNOWN} steps/s",
        f"ETA {numbers.duration(snap.eta_s)}",
    ]
    if snap.epoch is not None and snap.epochs:
        items.append(epoch_text(snap.epoch, snap.epochs))
    if snap.attempt is not None:
        items.append(f"attempt {snap.attempt}")
    return items


def metric_items(snap: Snapshot) -> list[str]:
    return [f"{name}={numbers.metric(value)}" for name, value in snap.metrics.items()]


def starting_text(snap: Snapshot) -> str:
    state = f"{snap.state} " if snap.state is not None else ""
    return f"{state}{numbers.duration(snap.elapsed_s)}  {snap.starting}"


def plain_line(snap: Snapshot) -> str:
    """The whole snapshot on one line: a log file is not cut at any width."""
    if snap.step is None:
        return f"slurmddp: {starting_text(snap)}"
    return "slurmddp: " + GAP.join([f"step {step_text(snap)}", *detail_items(snap), *metric_items(snap)])


class Packed:
    """Items side by side, as many to a line as the width at render time holds; an item is never
    split unless it is wider than a whole line."""

    def __init__(self, items: Iterable[str], style: str = "") -> None:
        self.items = list(items)
        self.style = style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # One column short of the width: a line that fills it leaves the cursor waiting to wrap,
        # and some terminals then count it as two lines when the region is redrawn.
        width = max(options.max_width - 1, 1)
        line = ""
        for item in self.items:
            if line and len(line) + len(GAP) + len(item) > width:
                yield Text(line, style=self.style, overflow="fold")
                line = ""
            line = f"{line}{GAP}{item}" if line else item
        if line:
            yield Text(line, style=self.style, overflow="fold")


class Bar:
    """The progress bar and `step/total (percent)` beside it: the bar gives way on a narrow
    terminal, the count does not."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        total = self.snap.total_steps or 0
        grid = Table.grid(expand=True, padding=(0, 1))
        grid.add_column(ratio=1)
        grid.add_column(no_wrap=True)
        done = min(self.snap.step or 0, total)
        grid.add_row(ProgressBar(total=total, completed=done), step_text(self.snap))
        # One column short, as Packed's lines.
        yield from console.render(grid, options.update_width(max(options.max_width - 1, 1)))


def render(snap: Snapshot) -> RenderableType:
    """The live region for `snap`."""
    if snap.step is None:
        return Spinner("dots", Text(starting_text(snap), overflow="fold"))
    rows: list[RenderableType] = [Bar(snap) if snap.total_steps else Text(f"step {step_text(snap)}")]
    rows.append(Packed(detail_items(snap), style="cyan"))
    rows.append(Packed(metric_items(snap), style="bold"))
    return Group(*rows)


def print_block(
    out: TextIO, rows: list[tuple[str, str | list[str]]], next_steps: list[tuple[str, str]]
) -> None:
    """Labelled rows, then the next commands with what each does. A row of several items (the
    metrics) is packed to the terminal's width, an item never split; a single value (a path, a
    command) is one line that the terminal wraps itself: a soft wrap, so it copies whole."""
    console = Console(file=out, highlight=False)
    width = max((len(label) for label, _ in rows), default=0)
    for label, value in rows:
        head = f"  {f'{label}:':<{width + 1}} "
        if isinstance(value, list) and console.is_terminal:
            grid = Table.grid()
            grid.add_column(no_wrap=True, style="bold", width=len(head))
            grid.add_column()
            grid.add_row(head, Packed(value))
            console.print(grid)
            continue
        shown = value if isinstance(value, str) else GAP.join(value)
        console.print(Text(head, style="bold").append(shown, style=""), soft_wrap=True)
    console.print(Text("next:", style="bold"), soft_wrap=True)
    for command, what in next_steps:
        console.print(Text(f"  {command}", style="cyan").append(f"  # {what}", style="dim"), soft_wrap=True)
