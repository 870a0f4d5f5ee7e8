#!/usr/bin/env bash
# Builds the tokenizer fuzz target with libFuzzer + AddressSanitizer + UBSan (clang)
# and runs it for SECONDS (default 60) on a copy of the seed corpus.
#   fuzz/run_tokenizer.sh 600            # ten minutes
#   fuzz/run_tokenizer.sh replay         # only replay fuzz/regressions/tokenizer
# Crashes are written to build-fuzz/tokenizer/crashes/; copy each into fuzz/regressions/tokenizer/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-60}"
. fuzz/core_lib.sh  # CXX (CXX_FUZZ here), FLAGS, CORE, build_core
CXX="${CXX_FUZZ:-$CXX}"
OUT=build-fuzz/tokenizer
mkdir -p "$OUT/corpus" "$OUT/crashes"
BIN="$OUT/fuzz_tokenizer"
# src/text needs src/io and the runtime's Array: linked with the CPU runtime archive of fuzz/run.sh.
build_core
if [ ! -x "$BIN" ] || [ -n "$(find src/text src/io "$CORE" include fuzz/fuzz_tokenizer.cpp -newer "$BIN" 2>/dev/null | head -1)" ]; then
  echo "building $BIN"
  "$CXX" $FLAGS fuzz/fuzz_tokenizer.cpp src/text/*.cpp src/io/*.cpp "$CORE" -o "$BIN" -lpthread -ldl
fi
if [ "$SECS" = replay ]; then
  exec "$BIN" fuzz/regressions/tokenizer/*
fi
cp -n fuzz/corpus/tokenizer/* "$OUT/corpus/" 2>/dev/null || true
"$BIN" -max_total_time="$SECS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$OUT/crashes/" -print_final_stats=1 "$OUT/corpus" fuzz/regressions/tokenizer
