#!/usr/bin/env bash
# Builds the tokenizer fuzz target with libFuzzer + AddressSanitizer + UBSan (clang)
# and runs it for SECONDS (default 60) on a copy of the seed corpus.
#   fuzz/run_tokenizer.sh 600            # ten minutes
#   fuzz/run_tokenizer.sh replay         # only replay fuzz/regressions/tokenizer
# Crashes are written to build-fuzz/tokenizer/crashes/; copy each into fuzz/regressions/tokenizer/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-60}"
OUT=build-fuzz/tokenizer
mkdir -p "$OUT/corpus" "$OUT/crashes"
BIN="$OUT/fuzz_tokenizer"
CXX="${CXX_FUZZ:-clang++}"
"$CXX" -std=c++20 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Iinclude -Isrc fuzz/fuzz_tokenizer.cpp src/text/*.cpp -o "$BIN"
if [ "$SECS" = replay ]; then
  exec "$BIN" fuzz/regressions/tokenizer/*
fi
cp -n fuzz/corpus/tokenizer/* "$OUT/corpus/" 2>/dev/null || true
"$BIN" -max_total_time="$SECS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$OUT/crashes/" -print_final_stats=1 "$OUT/corpus" fuzz/regressions/tokenizer
