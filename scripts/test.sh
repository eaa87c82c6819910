#!/usr/bin/env bash
# Set up .venv with the test extras, lint with ruff, and run the test suite (slow tests excluded unless
# TRAINWELL_SLOW=1) in two phases, printing its time at the end (see below). Extra arguments go to pytest.
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
# Two phases, each listing its 20 slowest tests (--durations), then the suite's time:
# 1. the tests that are safe side by side, on TRAINWELL_TEST_WORKERS pytest-xdist workers ("auto", the default: one
#    per core; 0: no workers, in this process). --dist loadgroup keeps the tests of a module-scoped fixture on one
#    worker, so the fixture is built once;
# 2. the `serial` tests, one at a time: those that launch several processes (torchrun, accelerate launch, a process
#    group), bind a port or start Ray. tests/common/scheduling.py marks them by what their code (and their fixtures'
#    and helpers') runs, so a new test needs no marker; @pytest.mark.serial puts a test in this phase by hand,
#    @pytest.mark.parallel_safe takes one the rule misjudges out of it.
# Extra arguments go to both phases; a phase that selects no test (pytest's status 5) is not a failure.
select="not slow"
if [ "${TRAINWELL_SLOW:-0}" = "1" ]; then select=""; fi
both() { if [ -n "$select" ]; then echo "$select and $1"; else echo "$1"; fi; }
workers="${TRAINWELL_TEST_WORKERS:-auto}"
xdist=()
if [ "$workers" != "0" ]; then xdist=(-n "$workers" --dist loadgroup); fi
status=0
start=$SECONDS
.venv/bin/python -m pytest -q --durations=20 "${xdist[@]}" -m "$(both "not serial")" "$@" || status=$?
[ "$status" = 5 ] && status=0
parallel=$((SECONDS - start))
serial_status=0
.venv/bin/python -m pytest -q --durations=20 -m "$(both serial)" "$@" || serial_status=$?
[ "$serial_status" = 5 ] && serial_status=0
total=$((SECONDS - start))
shown="$workers"
if [ "$workers" = auto ]; then shown="$(nproc)"; fi
printf 'suite: %dm%02ds (side by side on %s workers: %dm%02ds; one at a time: %dm%02ds)\n' $((total / 60)) \
  $((total % 60)) "$shown" $((parallel / 60)) $((parallel % 60)) $(((total - parallel) / 60)) \
  $(((total - parallel) % 60))
if [ "$status" != 0 ]; then exit "$status"; fi
exit "$serial_status"
