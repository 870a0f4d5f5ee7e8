#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, CPU-only sources) and runs
# each for the given number of seconds.
#   fuzz/run.sh [seconds=60] [target...]     targets: safetensors gguf (default: both)
# Environment: JOBS (libFuzzer -jobs, default 1), CXX (default clang++), FUZZ_ARGS (extra libFuzzer flags).
# Crash inputs are written to fuzz/artifacts/; copy them to fuzz/regressions/<target>/
# so tests/python/test_io_hostile.py replays them.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}; shift || true
TARGETS=("$@"); [ ${#TARGETS[@]} -eq 0 ] && TARGETS=(safetensors gguf)
. fuzz/core_lib.sh  # CXX, OUT (fuzz/build), FLAGS, CORE, build_core
mkdir -p fuzz/artifacts
# The runtime (core, ops, cpu) is built once into an archive; src/io with each target.
build_core
for t in "${TARGETS[@]}"; do
  if [ ! -x "$OUT/fuzz_$t" ] || [ -n "$(find src/io "$CORE" include fuzz/fuzz_$t.cpp -newer "$OUT/fuzz_$t" 2>/dev/null | head -1)" ]; then
    echo "building fuzz_$t"
    $CXX $FLAGS fuzz/fuzz_$t.cpp src/io/*.cpp "$CORE" -o "$OUT/fuzz_$t" -lpthread -ldl
  fi
done
for t in "${TARGETS[@]}"; do
  mkdir -p fuzz/corpus/$t fuzz/work/$t
  [ -z "$(ls -A fuzz/corpus/$t)" ] && python3 fuzz/gen_seeds.py fuzz/corpus
  echo "running fuzz_$t for $SECS s"
  PAR=(); [ "${JOBS:-1}" -gt 1 ] && PAR=(-jobs="$JOBS" -workers="$JOBS")
  "$OUT/fuzz_$t" -max_total_time="$SECS" "${PAR[@]}" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -timeout=10 -artifact_prefix=fuzz/artifacts/$t- -print_final_stats=1 ${FUZZ_ARGS:-} fuzz/work/$t fuzz/corpus/$t 2>&1 | tee fuzz/work/$t.log | tail -25
done
