#!/usr/bin/env bash
# Create (or reuse) .venv and install trainwell with the given extras. torch is pinned to the CPU build that
# this environment provides locally; an unpinned torch would download several GB of CUDA packages.
#
# It says what it does before each step, with how long the step takes (measured on this project's 2-core machine,
# busy with other work: torch about 40 s, the demo's extras about 1 min, the test extras about 4 min), and shows
# pip's progress: a line per package collected, downloaded and installed (pip's "Requirement already satisfied"
# lines are left out: on a rerun they would be all there is).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
started=$SECONDS

# pip here warns about every configured local package folder that does not exist; keep the rest of its output.
# setuptools adds a 12-line notice to every editable install ("Editable installation. Please be careful with
# folders in your working directory with the same name as your package"): informational only, and it buried the
# demo's first lines, so that one warning (matched by its first words) is filtered; pip's others still show.
pip_install() {
  local status=0
  PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation" \
    .venv/bin/python -m pip install --progress-bar off "$@" 2>&1 \
    | grep -v -e "^WARNING: Location 'file:" -e "^Requirement already satisfied" || status=${PIPESTATUS[0]}
  return "$status"
}

# One line per step: its number, what it does and how long it usually takes.
step() {
  printf '\n[set-up %s] %s\n' "$1" "$2"
}

case "$extras" in
  "") estimate="about 1 minute" ;;
  test) estimate="about 5 minutes (the test extras: transformers, TRL, Ray, DeepSpeed, ...)" ;;
  *) estimate="about 1-2 minutes" ;;
esac
echo "Setting up .venv/ (a Python virtual environment in this folder) with torch 2.13.0 and trainwell" \
  "${extras:+[$extras] }in editable mode: $estimate the first time, on a 2-core machine; later runs skip it."

step 1/4 "creating .venv with $(python3 --version 2>&1) (a few seconds)"
python3 -m venv .venv
step 2/4 "upgrading pip (a few seconds)"
pip_install -q --upgrade pip
step 3/4 "installing torch 2.13.0, the largest package (about 40 s; a CUDA build downloads several GB)"
pip_install "torch==2.13.0"
# The pin goes with the project install too, so no dependency's resolver can move torch off it.
step 4/4 "installing trainwell${extras:+[$extras]} and its dependencies ($estimate in all)"
if [ -n "$extras" ]; then
  pip_install -e ".[$extras]" "torch==2.13.0"
else
  pip_install -e . "torch==2.13.0"
fi
printf '\n[set-up done] in %dm%02ds\n' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60))
