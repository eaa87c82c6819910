#!/usr/bin/env bash
# The main job: set up .venv (trainwell with the report extra, for the plots) and run `trainwell demo`, which
# trains a small byte-level transformer on Python's own sources for about two minutes on a 2-core CPU, then
# prints a generated sample and writes a run report. Extra arguments go to `trainwell demo` (see --help).
# Run it again with the same --output-dir (default ./trainwell-demo) and it resumes from the last checkpoint.
#
# The set-up runs once: .venv/.trainwell-demo-setup records a checksum of pyproject.toml and
# scripts/setup_env.sh, and later runs skip the set-up unless those files changed or .venv cannot import this
# checkout's trainwell (and matplotlib). Delete the stamp file to force a reinstall.
set -euo pipefail

EXTRAS=report
STAMP=.trainwell-demo-setup

# The checksum the stamp holds: the extras and the files that decide what the set-up installs. $1: project root.
setup_fingerprint() {
  { printf '%s\n' "$EXTRAS"; cat "$1/pyproject.toml" "$1/scripts/setup_env.sh"; } | cksum
}

# Exit status 0 when the set-up must run. $1: project root, $2: its virtual environment.
setup_needed() {
  local root=$1 venv=$2
  [ -x "$venv/bin/trainwell" ] || return 0
  [ "$(cat "$venv/$STAMP" 2>/dev/null)" = "$(setup_fingerprint "$root")" ] || return 0
  ! "$venv/bin/python" -c 'import os, sys, matplotlib, trainwell
root = os.path.realpath(sys.argv[1]) + os.sep
sys.exit(not os.path.realpath(trainwell.__file__).startswith(root))' "$root" 2>/dev/null
}

main() {
  cd "$(dirname "$0")/.."
  if setup_needed "$PWD" "$PWD/.venv"; then
    bash scripts/setup_env.sh "$EXTRAS"
    setup_fingerprint "$PWD" > ".venv/$STAMP"
  fi
  exec .venv/bin/trainwell demo "$@"
}

# Sourcing this file (the tests do) defines the functions without running anything.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
