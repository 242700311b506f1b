#!/usr/bin/env bash
# Set up this machine for the test suite and run all of it: lint, types, unit tests, and the
# real-Slurm tests, which start (and stop) their own 3-node cluster from tests/slurm_lab.
# Extra arguments go to pytest, e.g. `scripts/test.sh -k hostlist`.
set -euo pipefail
cd "$(dirname "$0")/.."

# torch first and pinned: the CPU build of 2.13.0 is what the suite is run with; an unpinned
# `torch` requirement could pull a multi-GB CUDA build.
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[dev]'

ruff check .
ruff format --check .
mypy

set +e
python3 -m pytest "$@"
code=$?
# The cluster tests of what a Slurm release changes (preemption, time limit, arrays, requeue, MPI,
# GPU binding, accounting, resubmit, node failure) once more on the Slurm 24.11 lab (Debian 13's;
# its root is built on first use).
second=0
if [ "$code" -ne 5 ]; then
  SLURMDDP_LAB_SLURM=24.11 python3 -m pytest -m generations "$@"
  second=$?
  # Arguments that select no such test (scripts/test.sh -k hostlist) leave nothing to run again.
  [ "$second" -eq 5 ] && second=0
fi
set -e
# pytest says 5 when it collected no test: for this suite that means something is broken.
if [ "$code" -eq 5 ]; then
  echo "scripts/test.sh: pytest ran no test" >&2
  exit 1
fi
[ "$code" -ne 0 ] && exit "$code"
exit "$second"
