#!/usr/bin/env bash
# Sets up a virtualenv, builds gpukit with its C++ tests, and runs every test
# (GoogleTest through ctest, then pytest). CUDA code is compiled when the CUDA
# toolkit is present; CUDA tests skip on machines without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
. .venv/bin/activate
if [ ! -f /usr/include/gtest/gtest.h ] && [ ! -d .gtest ]; then
  (apt-get update -qq && apt-get install -y -qq libgtest-dev) >/dev/null 2>&1 || true
fi
GT=""
[ -f /usr/include/gtest/gtest.h ] || GT="-DGPUKIT_GTEST_SOURCE=$PWD/.gtest"
JOBS=${JOBS:-$(nproc)}
cmake -S . -B build/dev -G Ninja -DGPUKIT_TESTS=ON -DGPUKIT_PYTHON_INPLACE=ON \
  -DPython_EXECUTABLE="$(command -v python)" $GT ${CMAKE_ARGS:-} || exit 1
cmake --build build/dev -j "$JOBS" || exit 1
rc=0
(cd build/dev && ctest --output-on-failure -j "$JOBS") || rc=1
PYTHONPATH="$PWD/python" python -m pytest tests/python -q -ra ${PYTEST_ARGS:-} || rc=1
exit $rc
