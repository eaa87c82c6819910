#!/usr/bin/env bash
# The main job: set up .venv (trainwell with the report extra, for the plots) and run `trainwell demo`, which
# trains a small byte-level transformer on Python's own sources for about two minutes on a 2-core CPU, then
# prints a generated sample and writes a run report. Extra arguments go to `trainwell demo` (see --help).
# Run it again with the same --output-dir (default ./trainwell-demo) and it resumes from the last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh report
exec .venv/bin/trainwell demo "$@"
