#!/usr/bin/env bash
# Set up .venv and run the main job: the bundled end-to-end example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python examples/quickstart.py "$@"
