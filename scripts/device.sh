#!/usr/bin/env bash
# Builds gpukit with CUDA (sm_90a) and its tests on a GPU machine, runs the C++ tests, the
# Python tests and the benchmarks, and writes every log and result into one folder.
#
#   scripts/device.sh [OUTDIR]        (default: $OUT, else ./device-out)
#
# Run from the repository root. GoogleTest: the installed one, else a source tree at
# .gtest/googletest (carried). pytest and ml_dtypes, when missing, are installed from wheels
# carried in .whl/ (ml_dtypes is optional: the tests that need it skip). Each stage runs even when an earlier one failed; the exit code
# is non-zero when any stage failed. Environment: PYTHON (default python3), JOBS, GPUKIT_CUDA_ARCHS,
# GPUKIT_CUDA (default ON; OFF gives a CPU-only dry run).
set -u
cd "$(dirname "$0")/.."
FINAL=${1:-${OUT:-$PWD/device-out}}
mkdir -p "$FINAL"
FINAL=$(cd "$FINAL" && pwd)
# Everything is written under $FINAL/logs and packed into $FINAL/logs.tgz at the end (the device
# tool returns only a few files); h200.json, summary.txt and pytest.log are also copied to $FINAL.
OUTDIR="$FINAL/logs"
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
ARCHS=${GPUKIT_CUDA_ARCHS:-90a}
BUILD=build-device
STAGES=${DEVICE_STAGES:-build,test,bench}   # any of build, test, bench (comma-separated)
has() { case ",$STAGES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# The image's default compiler (/opt/gcc) links libstdc++ statically into every shared object;
# prefer the system compiler so libgpukit and the extension share one libstdc++.
if [ -x /usr/bin/g++ ] && [ -z "${GPUKIT_KEEP_CXX:-}" ]; then
  export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++
fi
declare -a NAMES=() RESULTS=() TIMES=()

# DEVICE_DEADLINE (seconds since the start): stages that would start later are skipped
# (recorded as FAIL(125)), so a run that must fit a time limit still writes its summary.
DEADLINE=${DEVICE_DEADLINE:-0}
stage() {  # stage NAME LOGFILE cmd...
  local name=$1 log=$2
  shift 2
  if [ "$DEADLINE" -gt 0 ] && [ $SECONDS -ge "$DEADLINE" ]; then
    echo "=== $name skipped: past DEVICE_DEADLINE" | tee "$OUTDIR/$log"
    NAMES+=("$name"); RESULTS+=(125); TIMES+=(0)
    return 0
  fi
  local t0=$SECONDS
  echo "=== $name ($(date -u +%H:%M:%S))"
  "$@" >"$OUTDIR/$log" 2>&1
  local rc=$?
  NAMES+=("$name"); RESULTS+=("$rc"); TIMES+=($((SECONDS - t0)))
  if [ $rc -ne 0 ]; then echo "    failed (rc=$rc), last lines of $log:"; tail -n 15 "$OUTDIR/$log" | sed 's/^/    /'; fi
  return 0
}

{
  echo "date: $(date -u)"; echo "commit: $(git rev-parse HEAD 2>/dev/null)"; uname -a
  nvidia-smi 2>&1 | head -20; command -v nvcc && nvcc --version | tail -2
  "$PY" -c "import sys, numpy; print(sys.version); print('numpy', numpy.__version__)"
  "$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda)" 2>&1 | tail -1
  "$PY" -c "import cupy; print('cupy', cupy.__version__)" 2>&1 | tail -1
  "$PY" -c "import ml_dtypes; print('ml_dtypes', ml_dtypes.__version__)" 2>&1 | tail -1
} >"$OUTDIR/env.txt" 2>&1

# Python packages the tests need but the machine may lack (pytest; ml_dtypes is optional): installed
# offline from wheels carried in .whl/ (pip download pytest ml_dtypes -d .whl); nothing is fetched.
for pkg in pytest ml_dtypes; do
  if ! "$PY" -c "import $pkg" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    stage "install $pkg (.whl)" "pip_$pkg.log" bash -c "'$PY' -m pip install --no-index --find-links .whl $pkg ||
      '$PY' -m pip install --user --break-system-packages --no-index --find-links .whl $pkg"
  fi
done
"$PY" -c "import ml_dtypes" 2>/dev/null || echo "note: ml_dtypes missing: the tests that need it skip"

export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
GTEST_ARG=()
if [ -d .gtest/googletest ] && ! { [ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ]; }; then
  GTEST_ARG=(-DGPUKIT_GTEST_SOURCE="$PWD/.gtest")
fi
if has build; then
stage configure configure.log cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGPUKIT_CUDA="${GPUKIT_CUDA:-ON}" -DGPUKIT_CUDA_ARCHS="$ARCHS" -DGPUKIT_TESTS=ON -DGPUKIT_PYTHON_INPLACE=ON \
  -DPython_EXECUTABLE="$(command -v "$PY")" "${GTEST_ARG[@]}"
stage build build.log ninja -C "$BUILD" -j "$JOBS"
fi

if has test; then
if [ -x "$BUILD/gpukit_tests" ]; then
  stage "C++ tests" gtest.log timeout 150 "$BUILD/gpukit_tests" --gtest_output="xml:$OUTDIR/gtest.xml"
else
  NAMES+=("C++ tests"); RESULTS+=(127); TIMES+=(0)
fi

stage "Python tests" pytest.log timeout "${DEVICE_PYTEST_TIMEOUT:-300}" "$PY" -m pytest ${DEVICE_PYTEST_PATHS:-tests/python} -q -rfEs -p no:cacheprovider \
  --junitxml="$OUTDIR/pytest.xml"
fi

RESULTS_JSON="$OUTDIR/h200.json"
[ -f bench/results/h200.json ] && [ ! -f "$RESULTS_JSON" ] && cp bench/results/h200.json "$RESULTS_JSON"
if has bench; then
for b in ${DEVICE_BENCHES:-elementwise overhead fused sampling jit_launch}; do
  [ -f "bench/$b.py" ] || continue
  stage "bench $b" "bench_$b.log" timeout "${DEVICE_BENCH_TIMEOUT:-150}" "$PY" "bench/$b.py" --out "$RESULTS_JSON"
done
fi

# A plan file (DEVICE_PLAN): one stage per line, `pytest ARGS...`, `bench bench/x.py ARGS...` (gets
# --out results.json when it has no --out) or `cmd COMMAND...`; `# comments` and blank lines are skipped.
# Each stage runs under DEVICE_STAGE_TIMEOUT seconds (default 120).
if [ -n "${DEVICE_PLAN:-}" ] && [ -f "$DEVICE_PLAN" ]; then
  n=0
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%%#*}; line=$(echo "$line" | sed 's/[[:space:]]*$//')
    [ -z "$line" ] && continue
    n=$((n + 1)); kind=${line%% *}; rest=${line#* }
    case "$kind" in
      pytest) stage "plan $n pytest" "plan_${n}_pytest.log" timeout "${DEVICE_STAGE_TIMEOUT:-120}" \
                bash -c "'$PY' -m pytest -q -rfEs -p no:cacheprovider $rest" ;;
      bench)  case "$rest" in *--out*) ;; *) rest="$rest --out $RESULTS_JSON" ;; esac
              stage "plan $n bench" "plan_${n}_bench.log" timeout "${DEVICE_STAGE_TIMEOUT:-120}" \
                bash -c "'$PY' $rest" ;;
      cmd)    stage "plan $n cmd" "plan_${n}_cmd.log" timeout "${DEVICE_STAGE_TIMEOUT:-120}" bash -c "$rest" ;;
      *)      echo "plan line $n: unknown kind '$kind'" ;;
    esac
    echo "$line" > "$OUTDIR/plan_${n}.line"
  done < "$DEVICE_PLAN"
fi

# ---- summary ----
fail=0
for r in "${RESULTS[@]}"; do [ "$r" -ne 0 ] && fail=1; done
{
  echo
  printf '%-22s %-8s %6s\n' stage result seconds
  for i in "${!NAMES[@]}"; do
    r=${RESULTS[$i]}
    printf '%-22s %-8s %6s\n' "${NAMES[$i]}" "$([ "$r" -eq 0 ] && echo ok || echo "FAIL($r)")" "${TIMES[$i]}"
  done
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]" "$OUTDIR/gtest.log" 2>/dev/null | grep -E "tests?[ ,.]" | head -5
  tail -n 1 "$OUTDIR/pytest.log" 2>/dev/null
  for f in "$OUTDIR"/plan_*_pytest.log; do
    [ -f "$f" ] && echo "$(basename "$f"): $(cat "${f%_pytest.log}.line" 2>/dev/null | cut -c1-100) -> $(tail -n 1 "$f")"
  done
  for f in "$OUTDIR"/bench_*.log; do
    [ -f "$f" ] && tail -n 25 "$f"
  done
  echo "logs and results: $OUTDIR"
} | tee "$OUTDIR/summary.txt"
tar czf "$FINAL/logs.tgz" -C "$OUTDIR" . 2>/dev/null
for f in h200.json summary.txt pytest.log; do [ -f "$OUTDIR/$f" ] && cp "$OUTDIR/$f" "$FINAL/$f"; done
rm -rf "$OUTDIR"
exit $fail
