#!/usr/bin/env bash
# Sets up a virtualenv, builds and installs gpukit (pip install .), and runs the
# main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
python -m pip install -q . 
python examples/chat.py "$@"
