#!/usr/bin/env bash
# Normalised SASS of a CUDA object, for proving that a refactor changes no instruction:
#   scripts/sass_norm.sh build-cuda/CMakeFiles/gpukit.dir/src/cuda/x.cu.o > /tmp/x.before
#   (edit, rebuild only that object)  scripts/sass_norm.sh ... > /tmp/x.after; cmp /tmp/x.before /tmp/x.after
# Anonymous-namespace names (they carry a per-file hash) become ANON and the functions are
# sorted by name, so moving code between a .cu and a header does not show as a difference.
# Runs of blanks are folded: cuobjdump pads its columns to the object's longest instruction,
# so one function's change would otherwise show in every line of the others.
# CUOBJDUMP: the cuobjdump to use (default: the one on PATH; a pip wheel's works too).
set -euo pipefail
"${CUOBJDUMP:-cuobjdump}" -sass "$1" |
  sed -E 's/_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+_cu_[0-9a-f]+/ANON/g; s/[[:space:]]+/ /g' |
  python3 -c '
import sys
funcs, cur = {}, None
for line in sys.stdin:
    if "Function :" in line:
        cur = line.strip()
        funcs[cur] = []
    elif cur is not None:
        funcs[cur].append(line.rstrip())
for name in sorted(funcs):
    print(name)
    print("\n".join(funcs[name]))
'
