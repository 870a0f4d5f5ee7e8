#!/usr/bin/env bash
# Device machine: configure (once) and build gpukit in place for sm_90a into build/h200.
set -e
cd "$(dirname "$0")/.."
if [ ! -f build/h200/build.ninja ]; then
  cmake -S . -B build/h200 -G Ninja -DGPUKIT_PYTHON_INPLACE=ON -DGPUKIT_TESTS=${GPUKIT_TESTS:-OFF} \
    -DPython_EXECUTABLE="$(command -v python3)" ${CMAKE_ARGS:-} > /tmp/cmake.log 2>&1 || { tail -30 /tmp/cmake.log; exit 1; }
fi
ninja -C build/h200 > /tmp/build.log 2>&1 || { grep -E "error" /tmp/build.log | head -30; tail -20 /tmp/build.log; exit 1; }
echo "build ok"
