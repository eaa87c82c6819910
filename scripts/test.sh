#!/usr/bin/env bash
# Set up .venv with the test extras, lint with ruff, and run the test suite (slow tests excluded unless
# TRAINWELL_SLOW=1), printing its time at the end (see below). Extra arguments go to pytest.
#
# The set-up runs once: .venv/.trainwell-test-setup records a checksum of pyproject.toml and
# scripts/setup_env.sh, and later runs skip it unless those files changed or .venv cannot import this
# checkout's trainwell. Delete the stamp file to force a reinstall.
set -euo pipefail
cd "$(dirname "$0")/.."
STAMP=.venv/.trainwell-test-setup
fingerprint() { { printf 'test\n'; cat pyproject.toml scripts/setup_env.sh; } | cksum; }
current() {
  [ "$(cat "$STAMP" 2>/dev/null)" = "$(fingerprint)" ] && .venv/bin/python -c 'import os, sys, trainwell
sys.exit(not os.path.realpath(trainwell.__file__).startswith(os.path.realpath(".") + os.sep))' 2>/dev/null
}
if ! current; then
  bash scripts/setup_env.sh test
  fingerprint > "$STAMP"
fi
# Lint before the (much longer) test run; with `set -e` a finding fails the script here.
.venv/bin/ruff check .
# One pytest run on pytest-xdist workers, listing its 30 slowest tests (--durations), then the suite's time.
# TRAINWELL_TEST_WORKERS workers ("auto", the default: one more than the cores; 0: no workers, in this process).
# --dist loadgroup keeps the tests of a module-scoped fixture on one worker (the fixture is built once), and keeps
# the `serial` tests together: those that launch several processes (torchrun, accelerate launch, a process group),
# bind a port or start Ray. One worker runs them first, one at a time, while the others run the rest at a lower
# priority (tests/common/scheduling.py). They are found from what their code (and their fixtures' and helpers')
# runs, so a new test needs no marker; @pytest.mark.serial makes a test serial by hand, @pytest.mark.parallel_safe
# takes one the rule misjudges out of the chain.
select=(-m "not slow")
if [ "${TRAINWELL_SLOW:-0}" = "1" ]; then select=(); fi
workers="${TRAINWELL_TEST_WORKERS:-auto}"
if [ "$workers" = auto ]; then workers=$(($(nproc) + 1)); fi
xdist=()
if [ "$workers" != "0" ]; then xdist=(-n "$workers" --dist loadgroup); fi
status=0
start=$SECONDS
.venv/bin/python -m pytest -q --durations=30 "${xdist[@]}" "${select[@]}" "$@" || status=$?
total=$((SECONDS - start))
printf 'suite: %dm%02ds on %s xdist workers (%s cores)\n' $((total / 60)) $((total % 60)) "$workers" "$(nproc)"
exit "$status"
