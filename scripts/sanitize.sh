#!/usr/bin/env bash
# compute-sanitizer (memcheck, then racecheck) over a small pytest selection of the attention and
# KV-cache GPU tests (small shapes: the whole run takes well under a minute on an H200): the decode
# kernels of every route (CTA, fold + merge, pair CTAs / clusters, clusters of 8- and 4-warp CTAs),
# PDL chains, and the engine's fused attention.
#
#   scripts/sanitize.sh [extra pytest args]
#
# Run from the repository root on a GPU machine, after a CUDA build of the Python package
# (PYTHONPATH defaults to ./python). Exits non-zero when compute-sanitizer reports any error
# (its --error-exitcode), when a selected test fails, or when no sanitizer is found.
# Environment: SANITIZER (path of compute-sanitizer), PYTHON (default python3), TOOLS (default
# "memcheck racecheck"; synccheck and initcheck also work), SANITIZE_TESTS (space-separated pytest
# node ids replacing the default selection).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-$PWD/python}

find_sanitizer() {
  [ -n "${SANITIZER:-}" ] && [ -x "$SANITIZER" ] && { echo "$SANITIZER"; return; }
  command -v compute-sanitizer 2>/dev/null && return
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-* /opt/cuda /usr/lib/nvidia-cuda-toolkit; do
    [ -n "$d" ] || continue
    for f in "$d/bin/compute-sanitizer" "$d/compute-sanitizer/compute-sanitizer"; do
      [ -x "$f" ] && { echo "$f"; return; }
    done
  done
  # the pip wheel (nvidia-cuda-sanitizer-api-cu12 / -cu13) ships the binary too
  f=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site
for s in site.getsitepackages():
    for p in glob.glob(os.path.join(s, "nvidia", "**", "compute-sanitizer"), recursive=True):
        if os.access(p, os.X_OK) and os.path.isfile(p):
            print(p); raise SystemExit
EOF
)
  [ -n "$f" ] && echo "$f"
}

SAN=$(find_sanitizer)
if [ -z "$SAN" ]; then
  echo "sanitize.sh: compute-sanitizer not found (set SANITIZER=/path/to/compute-sanitizer)" >&2
  exit 2
fi
echo "sanitize.sh: using $SAN ($("$SAN" --version 2>/dev/null | tail -1))"

# Small shapes only: each selected test launches a handful of kernels on at most a few thousand keys.
T=tests/python
SEL=(
  "$T/test_attention.py::test_cuda_paged_vs_float64[64-32-8-bfloat16]"
  "$T/test_attention.py::test_cuda_paged_vs_float64[128-32-8-bfloat16]"
  "$T/test_attention.py::test_cuda_paged_vs_float64[128-40-8-float16]"
  "$T/test_attention.py::test_cuda_paged_vs_float64[256-8-8-float32]"
  "$T/test_attention.py::test_cuda_device_metadata_validate"
  "$T/test_attention.py::test_cuda_fp8_cache_decode"
  "$T/test_attention_decode.py::test_cuda_poisoned_outputs_and_determinism"
  "$T/test_attention_decode.py::test_cuda_window_softcap[kw1]"
  "$T/test_attention_decode.py::test_cuda_split_override[4096,4096,1]"
  "$T/test_attention_decode.py::test_cuda_split_override[64,512,32,1]"
  "$T/test_attention_decode.py::test_cuda_split_override[64,512,32,0,1]"
  "$T/test_attention_decode.py::test_cuda_split_override[64,2048,32,5]"
  "$T/test_attention_decode.py::test_cuda_mma_heads_dims[32-8-128-bfloat16]"
  "$T/test_attention_decode.py::test_cuda_mma_heads_dims[6-3-64-float16]"
  "$T/test_attention_decode.py::test_cuda_mma_heads_dims[12-1-256-bfloat16]"
  "$T/test_attention_decode.py::test_cuda_mma_paged_window_softcap[kw1-48]"
  "$T/test_attention_decode.py::test_cuda_mma_many_items_per_warp"
  "$T/test_attention_decode.py::test_cuda_mma_masked_blocks_and_capacity"
  "$T/test_attention_decode.py::test_cuda_mma_dense_items[37]"
  "$T/test_attention_decode.py::test_cuda_split_override[64,2048,16,12]"
  "$T/test_attention_decode_fold.py::test_cuda_fold_units_same_bits[64,256,16-64-12-1]"
  "$T/test_attention_decode_fold.py::test_cuda_fold_units_window_softcap[kw0]"
  "$T/test_attention_decode_fold.py::test_cuda_fold_pair_clusters_small"
  "$T/test_attention_decode_fold.py::test_cuda_pdl_chain[3]"
  "$T/test_attention_decode_fold.py::test_cuda_auto_cluster_short_b1[300-64-bfloat16]"
  "$T/test_attention_decode_route.py::test_cuda_cluster4_chain[2500-64-33-16]"
  "$T/test_attention_decode_route.py::test_cuda_cluster4_chain[2500-64-34-512]"
  "$T/test_attention_decode_route.py::test_cuda_cluster4_chain[2500-64-36-1024]"
  "$T/test_attention_decode_route.py::test_cuda_cluster4_chain[2500-64-38-4096]"
  "$T/test_llm_attention_fused.py::test_attention_rope_matches_composition[128-1-32-8-128-positions0-bfloat16]"
  "$T/test_llm_attention_fused.py::test_attention_rope_matches_composition[64-3-8-8-64-positions4-float16]"
  "$T/test_kvcache.py::test_cuda_matches_cpu[True-128-bfloat16]"
  "$T/test_kvcache.py::test_cuda_matches_cpu[False-6-float32]"
  "$T/test_kvcache.py::test_cuda_matches_cpu[False-64-float16]"
  "$T/test_kvcache.py::test_cuda_device_metadata_guarded_and_validated"
  "$T/test_kvcache_rope.py::test_cuda_matches_cpu_and_unfused[True-6-4-True-bfloat16]"
  "$T/test_kvcache_rope.py::test_cuda_matches_cpu_and_unfused[False-None-0-False-float16]"
  "$T/test_kvcache_rope.py::test_cuda_device_positions_and_unvalidated_metadata"
)
[ -n "${SANITIZE_TESTS:-}" ] && read -r -a SEL <<<"$SANITIZE_TESTS"

rc=0
for tool in ${TOOLS:-memcheck racecheck}; do
  extra=()
  case $tool in
    memcheck) extra=(--leak-check no --report-api-errors no) ;;
    racecheck) extra=(--racecheck-report all) ;;
  esac
  echo "=== compute-sanitizer --tool $tool"
  t0=$(date +%s)
  "$SAN" --tool "$tool" "${extra[@]}" --error-exitcode 97 --print-limit 30 --target-processes all \
    "$PY" -m pytest -q -x -p no:cacheprovider "${SEL[@]}" "$@"
  r=$?
  echo "=== $tool: exit $r ($(( $(date +%s) - t0 )) s)"
  if [ $r -eq 97 ]; then echo "sanitize.sh: $tool reported errors"; fi
  [ $r -ne 0 ] && rc=1
done
exit $rc
