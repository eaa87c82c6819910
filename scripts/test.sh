#!/usr/bin/env bash
# Set up .venv with the test extras, lint with ruff, and run the test suite (slow tests excluded unless
# TRAINWELL_SLOW=1). Extra arguments go to pytest.
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
markers=(-m "not slow")
if [ "${TRAINWELL_SLOW:-0}" = "1" ]; then markers=(); fi
# --durations: the 20 slowest tests close the output, so a test that grows slow shows.
exec .venv/bin/python -m pytest -q --durations=20 "${markers[@]}" "$@"
