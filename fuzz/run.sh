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
CXX=${CXX:-clang++}
OUT=fuzz/build; mkdir -p "$OUT" fuzz/artifacts
FLAGS="-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DGPUKIT_WITH_CUDA=0 -Iinclude -Isrc"
# The runtime (core, ops, cpu) is built once into an archive; src/io with each target.
CORE=$OUT/libgkcore.a
if [ ! -f "$CORE" ] || [ -n "$(find src/core src/ops src/cpu include -newer "$CORE" 2>/dev/null | head -1)" ]; then
  echo "building $CORE"
  mkdir -p "$OUT/obj"; rm -f "$OUT"/obj/*.o
  for f in src/core/*.cpp src/ops/*.cpp src/cpu/*.cpp; do
    $CXX ${FLAGS/fuzzer,/fuzzer-no-link,} -c "$f" -o "$OUT/obj/$(echo "$f" | tr / _).o"
  done
  rm -f "$CORE"; ar rcs "$CORE" "$OUT"/obj/*.o
fi
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
