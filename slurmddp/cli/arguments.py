"""The arguments several commands share, spelt and explained the same way in each."""

from __future__ import annotations

import argparse
from pathlib import Path


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run_arg(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    parser.add_argument(
        "run",
        metavar="RUN",
        nargs="?" if optional else None,
        help="a run or sweep directory, a folder of runs (its newest), or a job id"
        + (" (default: the newest submission)" if optional else ""),
    )


def index_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", type=int, help="the sweep element (its index in status)")


def experiment_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", type=Path, help="the experiment YAML file")
    # A default: without one argparse counts a "*" positional as required, and `submit` alone
    # said "the following arguments are required: experiment, KEY=VALUE".
    parser.add_argument(
        "overrides", nargs="*", default=[], metavar="KEY=VALUE", help="e.g. resources.nodes=2 lr=0.1"
    )


def wait_arg(parser: argparse.ArgumentParser, help_text: str) -> None:
    # None means "not given": each command picks its own default (local runs, studies).
    parser.add_argument("--wait", action=argparse.BooleanOptionalAction, default=None, help=help_text)
