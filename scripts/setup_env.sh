#!/usr/bin/env bash
# Create (or reuse) .venv and install trainwell with the given extras. torch is pinned to the CPU build that
# this environment provides locally; an unpinned torch would download several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q "torch==2.13.0"
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install -q -e ".[$extras]"
else
  .venv/bin/python -m pip install -q -e .
fi
