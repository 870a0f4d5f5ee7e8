#!/usr/bin/env bash
# compute-sanitizer (memcheck, then racecheck) over a small pytest selection of the attention and
# KV-cache GPU tests (small shapes: the whole run takes well under a minute on an H200).
#
#   scripts/sanitize.sh [extra pytest args]
#
# Run from the repository root on a GPU machine, after a CUDA build of the Python package
# (PYTHONPATH defaults to ./python). Exits non-zero when compute-sanitizer reports any error
# (its --error-exitcode), when a selected test fails, or when no sanitizer is found.
# Environment: SANITIZER (path of compute-sanitizer), PYTHON (default python3), TOOLS (default
# "memcheck racecheck"; synccheck and initcheck also work), SANITIZE_K (a pytest -k expression
# replacing the default selection).
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
SEL=(
  "tests/python/test_attention.py::test_cuda_device_metadata_validate"
  "tests/python/test_attention.py::test_cuda_fp8_cache_decode"
  "tests/python/test_attention.py::test_cuda_paged_vs_float64"
  "tests/python/test_attention_decode.py::test_cuda_poisoned_outputs_and_determinism"
  "tests/python/test_attention_decode.py::test_cuda_window_softcap"
  "tests/python/test_attention_decode.py::test_cuda_split_override"
  "tests/python/test_kvcache.py::test_cuda_matches_cpu"
  "tests/python/test_kvcache.py::test_cuda_device_metadata_guarded_and_validated"
  "tests/python/test_kvcache_rope.py::test_cuda_matches_cpu_and_unfused"
  "tests/python/test_kvcache_rope.py::test_cuda_device_positions_and_unvalidated_metadata"
)
K=${SANITIZE_K:-"not (float32 or float16) or fp8 or metadata or determinism"}
# test_cuda_paged_vs_float64: one dtype; the -k keeps the bf16 cases and the tests without a dtype id.

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
    "$PY" -m pytest -q -x -p no:cacheprovider "${SEL[@]}" -k "$K" "$@"
  r=$?
  echo "=== $tool: exit $r ($(( $(date +%s) - t0 )) s)"
  if [ $r -eq 97 ]; then echo "sanitize.sh: $tool reported errors"; fi
  [ $r -ne 0 ] && rc=1
done
exit $rc
