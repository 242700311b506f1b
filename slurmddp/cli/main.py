"""`python -m slurmddp ...`: the top-level parser over each group's commands, and the map from
errors to exit statuses. The commands themselves live in the *_cmd modules, one per group."""

from __future__ import annotations

import argparse
import sys

from slurmddp.cli import doctor_cmd, manage_cmd, scale_cmd, submit_cmd
from slurmddp.errors import EXIT_INTERRUPTED, SlurmddpError


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args))
    except SlurmddpError as exc:
        print(f"slurmddp: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("slurmddp: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _parse(argv: list[str]) -> argparse.Namespace:
    # One parser per command, each parsed with parse_intermixed_args so options may stand
    # anywhere among the KEY=VALUE overrides (argparse's subparsers do not allow that).
    commands = {
        **submit_cmd.parsers(),
        **scale_cmd.parsers(),
        **doctor_cmd.parsers(),
        **manage_cmd.parsers(),
    }
    top = argparse.ArgumentParser(prog="slurmddp", description="Multi-node PyTorch DDP on Slurm.")
    top.add_argument(
        "command",
        choices=sorted(commands),
        help="; ".join(f"{name}: {parser.description}" for name, parser in sorted(commands.items())),
    )
    if not argv or argv[0] not in commands:
        top.parse_args(argv[:1])  # prints usage and exits 2, or help for -h
    return commands[argv[0]].parse_intermixed_args(argv[1:])
