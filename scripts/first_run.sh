#!/usr/bin/env bash
# The README's first command on a machine that has nothing but Python: a new venv holding only
# torch and `pip install .` (no dev extra, which would bring packages the base install forgets),
# then the quickstart, run from outside the checkout so that the installed package is the one used.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q torch==2.13.0
"$work/venv/bin/python" -m pip install -q "$root"
cd "$work"
# The run goes into this throwaway directory's index of submissions, not the user's own.
export XDG_STATE_HOME="$work/state"
"$work/venv/bin/python" -m slurmddp submit "$root/examples/quickstart.yaml" executor=local "output_dir=$work/runs"
