#!/usr/bin/env bash
# Set up this machine for the test suite and run all of it: lint, types, unit tests, and the
# real-Slurm tests on both lab generations (Slurm 22.05 and 24.11), which start (and stop) their own
# 3-node clusters from tests/slurm_lab. Tests run in SLURMDDP_TEST_WORKERS pytest-xdist workers
# (default 4), each with labs of its own: one lab test alone mostly waits (scheduler passes,
# requeue gaps), four keep 2 cores ~98% busy. Beside them, where the machine has lab roots cached,
# tests/slurm_lab/fresh_root_check builds the 24.11 root and the bundle from scratch and starts a
# lab from them (the cached roots the tests use could hide a broken build; on a machine without
# them the tests' own build is that proof; SLURMDDP_FRESH_ROOT_CHECK=0 leaves it out). It runs
# only where what such a build reads changed since it last passed here (--if-changed).
# Extra arguments go to pytest, e.g. `scripts/test.sh -k hostlist`.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
took() { printf 'scripts/test.sh: %s (%ss)\n' "$1" "$((SECONDS - t0))" >&2; }

# torch first and pinned: the CPU build of 2.13.0 is what the suite is run with; an unpinned
# `torch` requirement could pull a multi-GB CUDA build.
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[dev]'
took "installed"

ruff check .
ruff format --check .
# mypy's cache beside the lab's roots, where those are kept: a fresh clone otherwise checks torch's
# and the other dependencies' stubs anew (82 s here, against 4 s with the cache). mypy compares
# each file's hash with the cached one, so a cache from another checkout is never taken for this one.
if [[ -z ${MYPY_CACHE_DIR:-} && -w /var/cache/slurmddp-lab ]]; then
  export MYPY_CACHE_DIR=/var/cache/slurmddp-lab/mypy
fi
mypy
took "lint and types"

fresh_log=$(mktemp)
trap 'rm -f -- "$fresh_log"' EXIT
fresh_pid=
# On a machine that has built neither the 24.11 root nor the bundle's root, the suite's own labs
# build both from nothing, which is what the check proves: building them twice side by side cost
# the run ~10 min of its 2 cores.
cache=/var/cache/slurmddp-lab
cold=1
for built in "${SLURMDDP_LAB_ROOT:-$cache/trixie-root}" "${SLURMDDP_LAB_BUNDLE_CACHE:-$cache/bundle-rootfs}"; do
  [[ -e $built/.slurmddp-lab-complete ]] && cold=0
done
if [[ $EUID -eq 0 && ${SLURMDDP_FRESH_ROOT_CHECK:-1} != 0 && $cold == 1 ]]; then
  echo "scripts/test.sh: no lab root is cached: the suite builds the 24.11 root and the bundle from nothing (the fresh-root check's proof)" >&2
elif [[ $EUID -eq 0 && ${SLURMDDP_FRESH_ROOT_CHECK:-1} != 0 ]]; then
  tests/slurm_lab/fresh_root_check --if-changed >"$fresh_log" 2>&1 &
  fresh_pid=$!
fi

# Bytecode for the package once: every rank, batch-script step and `python -m slurmddp` of the
# suite imports it, and where PYTHONDONTWRITEBYTECODE is set each would compile it again (~0.3 s
# of CPU a command).
python3 -m compileall -q slurmddp

# Where the time goes (tests/suite_clock.py, scripts/suite_time.py): the table at the end, the
# records kept in build/suite-time/ for a closer look.
times=build/suite-time
rm -rf -- "$times"
mkdir -p -- "$times"
set +e
# --durations: the slowest tests in the log, where time is to be won when the run nears its limit.
# -rfEs: the short summary lists failures, errors and skips; conftest.py lists the tests run again
# after a failure (LOADED_RERUNS).
SLURMDDP_SUITE_TIMES="$times/records" python3 -m pytest -n "${SLURMDDP_TEST_WORKERS:-4}" --dist loadgroup \
  --durations=25 -rfEs --junitxml="$times/junit.xml" "$@"
code=$?
took "pytest"
# The junit report is missing where pytest stopped before its end: the records alone then.
junit=()
[[ -f $times/junit.xml ]] && junit=(--junit "$times/junit.xml")
python3 scripts/suite_time.py --times "$times/records" "${junit[@]}" >"$times/table.md"
cat -- "$times/table.md" >&2
fresh=0
if [[ -n $fresh_pid ]]; then
  wait "$fresh_pid"
  fresh=$?
  tail -n 40 -- "$fresh_log" >&2
fi
set -e
# pytest says 5 when it collected no test: for this suite that means something is broken.
if [[ $code -eq 5 ]]; then
  echo "scripts/test.sh: pytest ran no test" >&2
  exit 1
fi
[[ $code -ne 0 ]] && exit "$code"
exit "$fresh"
