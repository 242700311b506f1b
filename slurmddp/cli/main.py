# PYTHON_ARGCOMPLETE_OK (argcomplete looks for this marker in the entry point's first lines)
"""`python -m slurmddp ...`: the top-level parser over each group's commands, and the map from
errors to exit statuses. The commands themselves live in the *_cmd modules, one per group."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import textwrap
from importlib import metadata

import argcomplete

from slurmddp.cli import doctor_cmd, habits, init_cmd, manage_cmd, scale_cmd, submit_cmd
from slurmddp.defaults import VERSION
from slurmddp.errors import EXIT_INTERRUPTED, SlurmddpError

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
"""What a shell reports for a process that SIGPIPE ended, as it ends `git log | head`."""


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:
        return _reader_gone()


def _run(argv: list[str]) -> int:
    # Each flush here, where a closed pipe is caught, not at the interpreter's exit.
    try:
        args = _parse(argv)
    finally:
        sys.stdout.flush()  # --help's text
    try:
        return int(args.func(args))
    except SlurmddpError as exc:
        print(f"slurmddp: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("slurmddp: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        sys.stdout.flush()


def _reader_gone() -> int:
    """The reader of stdout left (`| head`, `| true`): end quietly, as git and coreutils do, with
    128 + SIGPIPE, so a pipeline under `set -o pipefail` still sees the output was cut short."""
    # Python's recipe (library/signal.html, "Note on SIGPIPE"): stdout points at /dev/null, so
    # that the flush at the interpreter's exit does not fail again with a traceback.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def version() -> str:
    """The installed distribution's version; the package's own where slurmddp runs from a checkout."""
    try:
        return metadata.version("slurmddp")
    except metadata.PackageNotFoundError:
        return VERSION


def top_parser(commands: dict[str, argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The whole command line as one tree: for --help (one line per command) and shell completion."""
    top = argparse.ArgumentParser(
        prog="slurmddp",
        description="Multi-node PyTorch DDP on Slurm.",
        epilog=command_list(commands),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"slurmddp {version()}")
    chosen = top.add_subparsers(
        metavar="command",
        dest="command",
        required=True,
        help="one of those below; `slurmddp COMMAND --help` shows its arguments",
    )
    for name, parser in commands.items():
        # parents= copies the command's own arguments (and its -h), so completion offers them.
        chosen.add_parser(
            name, parents=[parser], add_help=False, description=parser.description, epilog=parser.epilog
        )
    return top


def command_list(commands: dict[str, argparse.ArgumentParser]) -> str:
    """One entry a command, its description wrapped to the terminal beside its name (argparse's own
    list of subcommands pushes the help of a long name to the next line)."""
    indent = " " * (2 + max(map(len, commands)) + 2)
    width = max(60, min(shutil.get_terminal_size().columns, 100) - 2)
    entries = [
        textwrap.fill(
            parser.description or "",
            width,
            initial_indent=f"  {name:<{len(indent) - 4}}  ",
            subsequent_indent=indent,
        )
        for name, parser in commands.items()
    ]
    return "commands:\n" + "\n".join(entries)


def _parse(argv: list[str]) -> argparse.Namespace:
    # One parser per command, each parsed with parse_intermixed_args so options may stand
    # anywhere among the KEY=VALUE overrides (argparse's subparsers do not allow that).
    commands = {
        **submit_cmd.parsers(),
        **init_cmd.parsers(),
        **scale_cmd.parsers(),
        **doctor_cmd.parsers(),
        **manage_cmd.parsers(),
    }
    top = top_parser(commands)
    argcomplete.autocomplete(top)
    if not argv or argv[0] not in commands:
        top.parse_args(argv[:1])  # prints usage and exits 2, or help for -h, or the version
    parser = commands[argv[0]]
    args, extras = parser.parse_known_intermixed_args(argv[1:])
    if extras:
        # Flags from sbatch or torchrun (--nodes 2) are answered with the override to write instead.
        parser.error(habits.unrecognized(argv[1:], extras, takes_overrides=hasattr(args, "overrides")))
    return args
