# Sourced by fuzz/run.sh and fuzz/run_tokenizer.sh: the flags of the fuzz builds, and
# build_core, which (re)builds the CPU runtime (src/core, src/ops, src/cpu) once into the
# archive $CORE with those flags (objects compiled without the fuzzer's main) when any of
# its sources or headers is newer than the archive.
CXX=${CXX:-clang++}
OUT=fuzz/build; mkdir -p "$OUT"
FLAGS="-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DGPUKIT_WITH_CUDA=0 -Iinclude -Isrc"
CORE=fuzz/build/libgkcore.a; CORE_OBJ=fuzz/build/obj
build_core() {
  if [ ! -f "$CORE" ] || [ -n "$(find src/core src/ops src/cpu include -newer "$CORE" 2>/dev/null | head -1)" ]; then
    echo "building $CORE"
    mkdir -p "$CORE_OBJ"; rm -f "$CORE_OBJ"/*.o
    for f in src/core/*.cpp src/ops/*.cpp src/cpu/*.cpp; do
      $CXX ${FLAGS/fuzzer,/fuzzer-no-link,} -c "$f" -o "$CORE_OBJ/$(echo "$f" | tr / _).o"
    done
    rm -f "$CORE"; ar rcs "$CORE" "$CORE_OBJ"/*.o
  fi
}
