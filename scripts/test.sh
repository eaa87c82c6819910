#!/usr/bin/env bash
# Set up .venv with the test extras, lint with ruff, and run the test suite (slow tests excluded unless
# TRAINWELL_SLOW=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
# Lint before the (much longer) test run; with `set -e` a finding fails the script here.
.venv/bin/ruff check .
markers=(-m "not slow")
if [ "${TRAINWELL_SLOW:-0}" = "1" ]; then markers=(); fi
exec .venv/bin/python -m pytest -q "${markers[@]}" "$@"
