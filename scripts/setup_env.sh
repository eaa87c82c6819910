#!/usr/bin/env bash
# Create (or reuse) .venv and install trainwell with the given extras. torch is pinned to the CPU build that
# this environment provides locally; an unpinned torch would download several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"

# pip here warns about every configured local package folder that does not exist; keep the rest of its output.
# setuptools adds a 12-line notice to every editable install ("Editable installation. Please be careful with
# folders in your working directory with the same name as your package"): informational only, and it buried the
# demo's first lines, so that one warning (matched by its first words) is filtered; pip's others still show.
pip_install() {
  local status=0
  PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation" \
    .venv/bin/python -m pip install -q "$@" 2>&1 | grep -v "^WARNING: Location 'file:" || status=${PIPESTATUS[0]}
  return "$status"
}

python3 -m venv .venv
pip_install --upgrade pip
pip_install "torch==2.13.0"
# The pin goes with the project install too, so no dependency's resolver can move torch off it.
if [ -n "$extras" ]; then
  pip_install -e ".[$extras]" "torch==2.13.0"
else
  pip_install -e . "torch==2.13.0"
fi
