"""gk.jit: NVRTC compilation, caches, argument checking (run without a GPU), and
launches, graphs and faults (GPU only)."""
import os
import struct
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import gpukit as gk

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYPATH = os.path.join(ROOT, "python")

needs_nvrtc = pytest.mark.skipif(not gk.jit.is_available(), reason="NVRTC not available")
needs_gpu = pytest.mark.skipif(not (gk.cuda.is_available() and gk.jit.is_available()),
                               reason="needs a CUDA device and NVRTC")

AXPY = r"""
#include <cstdint>
template <typename T>
__global__ void axpy(T a, const T* __restrict__ x, T* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""

SIG = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>
extern "C" __global__ void __launch_bounds__(128)
sig(const __nv_bfloat16* x, /* a comment, with a comma */ float* y, unsigned n, size_t m,
    bool flag, double d, __half h, __nv_bfloat16 b, signed char c, long long q, void* raw) {}
"""


def unique(src):
    """A source no other test (or earlier run) compiled: forces a fresh compile."""
    return f"// {uuid.uuid4().hex}\n" + src


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Keeps the tests' compiled programs out of the user's ~/.cache/gpukit."""
    monkeypatch.setenv("GPUKIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "gk-cache"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUKIT_CACHE_DIR", str(tmp_path))
    return tmp_path


def run_py(code, env_extra=None, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYPATH + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------- NVRTC only

@needs_nvrtc
def test_compile_cubin_and_ptx():
    k = gk.jit(unique('extern "C" __global__ void f(float* x) { x[threadIdx.x] = 1.0f; }'), "f", arch="sm_90a")
    assert k.is_cubin and k.arch == "sm_90a"
    assert k.binary[:4] == b"\x7fELF"
    assert k.lowered_name == "f"
    p = gk.jit(unique('extern "C" __global__ void f(float* x) { x[threadIdx.x] = 1.0f; }'), "f", arch="compute_80")
    assert not p.is_cubin and p.arch == "compute_80"
    assert b".entry f" in p.binary and b".target sm_80" in p.binary
    assert gk.jit.nvrtc_version()[0] >= 12
    assert 90 in gk.jit.supported_archs()


@needs_nvrtc
def test_arch_spellings():
    src = unique('extern "C" __global__ void f(int* x) { x[0] = 1; }')
    assert gk.jit(src, "f", arch="90a").arch == "sm_90a"
    assert gk.jit(src, "f", arch="sm_80").arch == "sm_80"
    for bad in ("sm90", "90b", "compute_", "x86"):
        with pytest.raises(ValueError, match="arch"):
            gk.jit(src, "f", arch=bad)
    with pytest.raises(ValueError, match="arch="):
        gk.jit(src, "f", options=["--gpu-architecture=sm_80"], arch="sm_90a")


@pytest.mark.skipif(gk.cuda.is_available() or not gk.jit.is_available(), reason="needs NVRTC and no GPU")
def test_no_device_needs_arch():
    with pytest.raises(ValueError, match="arch="):
        gk.jit('extern "C" __global__ void f() {}', "f")


@needs_nvrtc
def test_templates_and_name_expressions():
    kf = gk.jit(AXPY, "axpy<float>", arch="sm_90a")
    kd = gk.jit(AXPY, "axpy<double>", arch="sm_90a")
    assert kf.lowered_name != kd.lowered_name
    assert kf.lowered_name.startswith("_Z") and "axpy" in kf.lowered_name
    assert kf.param_types == ["float", "const float * __restrict__", "float *", "int64_t"]
    assert kd.param_types[0] == "double" and kd.param_names == ["a", "x", "y", "n"]
    assert kf.cache_key != kd.cache_key
    # Layout: float at 0, pointers at 8 and 16, int64 at 24.
    assert kf.pack_args(2.5, None, None, 7) == struct.pack("<f4xQQq", 2.5, 0, 0, 7)
    assert kd.pack_args(2.5, None, None, 7) == struct.pack("<dQQq", 2.5, 0, 0, 7)


@needs_nvrtc
def test_default_template_argument_and_namespace():
    src = r"""
    namespace ops {
    template <typename T, int BLOCK = 128, typename Acc = float>
    __global__ void scale(T* y, Acc s, int n) {}
    }
    """
    k = gk.jit(src, "ops::scale<double, 64>", arch="sm_90a")
    assert k.param_types == ["double *", "float", "int"]


@needs_nvrtc
def test_compile_error_reports_log_and_line():
    src = unique('extern "C" __global__ void f(float* x) {\n  int ok = 1;\n  x[0] = not_declared + ok;\n}\n')
    with pytest.raises(gk.JitError) as ei:
        gk.jit(src, "f", arch="sm_90a")
    e = ei.value
    assert isinstance(e, RuntimeError)
    assert e.line == 4  # the uuid comment is line 1
    assert "not_declared" in e.source_line
    assert "not_declared" in e.log and "error" in e.log
    msg = str(e)
    assert "line 4" in msg and "x[0] = not_declared + ok;" in msg and "sm_90a" in msg


@needs_nvrtc
def test_compile_error_in_header_and_missing_kernel():
    with pytest.raises(gk.JitError) as ei:
        gk.jit(unique('#include "no_such_header.h"\nextern "C" __global__ void f() {}'), "f", arch="sm_90a")
    assert "no_such_header.h" in ei.value.log
    # A name that is no kernel in the source.
    with pytest.raises((gk.JitError, ValueError)):
        gk.jit(unique('extern "C" __global__ void f() {}'), "g", arch="sm_90a")


@needs_nvrtc
def test_headers_cuda_types_and_cstdint():
    k = gk.jit(unique(SIG), "sig", arch="sm_90a")
    assert k.param_names == ["x", "y", "n", "m", "flag", "d", "h", "b", "c", "q", "raw"]
    assert k.param_types[:3] == ["const __nv_bfloat16 *", "float *", "unsigned"]


@needs_nvrtc
def test_memory_cache_hit(cache_dir):
    src = unique(AXPY)
    gk.jit.reset_stats()
    k1 = gk.jit(src, "axpy<float>", arch="sm_90a")
    s = gk.jit.stats()
    assert s["nvrtc_compiles"] == 1 and s["memory_hits"] == 0 and s["disk_writes"] == 1
    k2 = gk.jit(src, "axpy<float>", arch="sm_90a")
    s = gk.jit.stats()
    assert s["nvrtc_compiles"] == 1 and s["memory_hits"] == 1
    assert k1.binary == k2.binary and k1.cache_key == k2.cache_key
    # Anything that changes the code changes the key: options, arch, name expression.
    k3 = gk.jit(src, "axpy<float>", options=["-DFOO=1"], arch="sm_90a")
    k4 = gk.jit(src, "axpy<float>", arch="sm_80")
    k5 = gk.jit(src, "axpy<double>", arch="sm_90a")
    assert len({k1.cache_key, k3.cache_key, k4.cache_key, k5.cache_key}) == 4
    assert gk.jit.stats()["nvrtc_compiles"] == 4
    # cache=False always compiles.
    gk.jit(src, "axpy<float>", arch="sm_90a", cache=False)
    assert gk.jit.stats()["nvrtc_compiles"] == 5


@needs_nvrtc
def test_disk_cache_across_processes(cache_dir):
    src = unique(AXPY)
    code = f"""
    import gpukit as gk, json
    k = gk.jit({src!r}, "axpy<float>", arch="sm_90a")
    print(json.dumps([gk.jit.stats(), k.origin, k.cache_key, gk.jit.cache_dir()]))
    """
    import json
    r1 = run_py(code)
    assert r1.returncode == 0, r1.stderr
    s1, origin1, key1, dir1 = json.loads(r1.stdout.strip().splitlines()[-1])
    assert s1["nvrtc_compiles"] == 1 and s1["disk_writes"] == 1 and origin1 == "nvrtc"
    assert dir1 == str(cache_dir / "jit")
    assert os.path.exists(os.path.join(dir1, key1 + ".bin"))
    r2 = run_py(code)
    assert r2.returncode == 0, r2.stderr
    s2, origin2, key2, _ = json.loads(r2.stdout.strip().splitlines()[-1])
    assert s2["nvrtc_compiles"] == 0 and s2["disk_hits"] == 1 and origin2 == "disk" and key2 == key1
    # In this process too: a cleared memory cache falls back to the disk.
    gk.jit.clear_memory_cache()
    gk.jit.reset_stats()
    k = gk.jit(src, "axpy<float>", arch="sm_90a")
    assert gk.jit.stats()["nvrtc_compiles"] == 0 and k.origin == "disk"


@needs_nvrtc
@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_disk_cache_is_ignored(cache_dir, damage):
    src = unique(AXPY)
    k = gk.jit(src, "axpy<float>", arch="sm_90a")
    path = os.path.join(gk.jit.cache_dir(), k.cache_key + ".bin")
    data = bytearray(open(path, "rb").read())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) // 3]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(os.urandom(len(data)))
    open(path, "wb").write(bytes(data))
    gk.jit.clear_memory_cache()
    gk.jit.reset_stats()
    k2 = gk.jit(src, "axpy<float>", arch="sm_90a")
    s = gk.jit.stats()
    assert s["nvrtc_compiles"] == 1 and s["disk_hits"] == 0
    assert s["disk_errors"] >= 1
    assert k2.binary == k.binary and k2.origin == "nvrtc"


@needs_nvrtc
def test_unwritable_cache_dir_still_compiles(tmp_path, monkeypatch):
    f = tmp_path / "a_file"
    f.write_text("x")
    monkeypatch.setenv("GPUKIT_CACHE_DIR", str(f))  # a file: the cache directory cannot exist
    gk.jit.reset_stats()
    k = gk.jit(unique(AXPY), "axpy<float>", arch="sm_90a")
    assert k.binary[:4] == b"\x7fELF" and gk.jit.stats()["disk_errors"] >= 1


# ---------------------------------------------------------------- argument checking (no launch)

@needs_nvrtc
def test_pack_scalars_and_layout():
    k = gk.jit(SIG, "sig", arch="sm_90a")
    b = k.pack_args(None, None, 3, 2**64 - 1, True, 1.5, 1.0, -2.0, -5, -(2**40), None)
    half_one = np.float16(1.0).view(np.uint16)
    import ml_dtypes
    bf_m2 = np.array(-2.0, dtype=ml_dtypes.bfloat16).view(np.uint16)
    expected = struct.pack("<QQI4xQ?7xdHHb3xqQ", 0, 0, 3, 2**64 - 1, True, 1.5, half_one, bf_m2, -5, -(2**40), 0)
    assert b == expected
    # numpy scalars are numbers too
    b2 = k.pack_args(None, None, np.uint32(3), np.int64(2**62), np.bool_(False), np.float32(0.5), 1, 2, 3, 4, None)
    assert struct.unpack_from("<I", b2, 16)[0] == 3 and struct.unpack_from("<d", b2, 40)[0] == 0.5
    assert struct.unpack_from("<?", b2, 32)[0] is False


@needs_nvrtc
def test_wrong_argument_count_and_types():
    k = gk.jit(AXPY, "axpy<float>", arch="sm_90a")
    with pytest.raises(TypeError, match=r"takes 4 argument\(s\).*got 3"):
        k.pack_args(1.0, None, None)
    with pytest.raises(TypeError, match=r"takes 4"):
        k.pack_args(1.0, None, None, 4, 5)
    with pytest.raises(TypeError, match=r"argument 3 \('n'\).*integer.*got float"):
        k.pack_args(1.0, None, None, 2.5)
    with pytest.raises(TypeError, match=r"argument 0 \('a'\).*number.*got str"):
        k.pack_args("1", None, None, 2)
    with pytest.raises(TypeError, match=r"argument 1 \('x'\).*array or tensor"):
        k.pack_args(1.0, 3.0, None, 2)
    with pytest.raises(TypeError, match=r"argument 1.*float16"):
        k.pack_args(1.0, gk.zeros(3, dtype=gk.float16), None, 1)
    with pytest.raises(ValueError, match=r"argument 1 \('x'\).*on cpu"):
        k.pack_args(1.0, gk.zeros(3), None, 1)
    with pytest.raises(TypeError, match=r"argument 1 \('x'\).*got list"):
        k.pack_args(1.0, [1, 2], None, 1)
    with pytest.raises(ValueError, match="64 bits"):
        k.pack_args(1.0, None, None, 2**70)
    # the call path checks the same things before anything reaches a device
    with pytest.raises(TypeError, match=r"takes 4"):
        k(1, 32, 1.0, None, None)
    with pytest.raises(TypeError, match="grid"):
        k("1", 32, 1.0, None, None, 1)
    with pytest.raises(TypeError, match="keyword"):
        k(1, 32, 1.0, None, None, 1, shared=4)
    with pytest.raises(TypeError, match="shared_mem"):
        k(1, 32, 1.0, None, None, 1, shared_mem=1.5)


@needs_nvrtc
def test_odd_python_objects_raise_not_crash():
    k = gk.jit(AXPY, "axpy<float>", arch="sm_90a")

    class BadCAI:
        __cuda_array_interface__ = {"shape": (1,)}  # no "data"

    class NotDict:
        __cuda_array_interface__ = 5

    class BadFloat:
        def __float__(self):
            raise ZeroDivisionError("no")

        def __add__(self, o):
            return 0
    for bad in (1j, BadCAI(), NotDict(), BadFloat(), object(), b"x", {"a": 1}, float("nan")):
        try:
            k.pack_args(bad, None, None, 1)
        except Exception as e:  # any Python exception is fine; a crash is not
            assert not isinstance(e, SystemError), e
    with pytest.raises(Exception):
        k.pack_args(1.0, BadCAI(), None, 1)
    with pytest.raises(Exception):
        k.pack_args(1.0, NotDict(), None, 1)


@needs_nvrtc
def test_integer_ranges():
    k = gk.jit(SIG, "sig", arch="sm_90a")
    base = [None, None, 3, 4, True, 1.0, 1.0, 1.0, 1, 1, None]

    def with_(i, v):
        a = list(base)
        a[i] = v
        return a
    with pytest.raises(ValueError, match="unsigned"):
        k.pack_args(*with_(2, -1))
    with pytest.raises(ValueError, match="unsigned"):
        k.pack_args(*with_(2, 2**32))
    k.pack_args(*with_(2, 2**32 - 1))
    with pytest.raises(ValueError, match="signed char"):
        k.pack_args(*with_(8, 128))
    k.pack_args(*with_(8, -128))
    with pytest.raises(ValueError, match="size_t"):
        k.pack_args(*with_(3, -1))
    with pytest.raises(TypeError, match="bool"):
        k.pack_args(*with_(4, 2))
    with pytest.raises(TypeError, match="bool"):
        k.pack_args(*with_(4, 1.0))


@needs_nvrtc
def test_pointer_dtype_rules():
    src = r"""
    #include <cuda_bf16.h>
    #include <cstdint>
    extern "C" __global__ void p(void* a, char* b, unsigned int* c, uint8_t* d, __nv_bfloat16* e, float4* f) {}
    """
    k = gk.jit(src, "p", arch="sm_90a")
    assert k.param_types[0] == "void *"
    # Dtype checks come before the device check: CPU arrays of a wrong dtype raise TypeError.
    with pytest.raises(TypeError, match=r"argument 2.*unsigned"):
        k.pack_args(None, None, gk.zeros(2, dtype=gk.float32), None, None, None)
    with pytest.raises(TypeError, match=r"argument 3"):
        k.pack_args(None, None, None, gk.zeros(2, dtype=gk.int8), None, None)
    with pytest.raises(TypeError, match=r"argument 4.*bfloat16"):
        k.pack_args(None, None, None, None, gk.zeros(2, dtype=gk.float16), None)
    with pytest.raises(TypeError, match=r"argument 5.*float32"):
        k.pack_args(None, None, None, None, None, gk.zeros(2, dtype=gk.int32))
    # Accepted dtypes reach the device check (CPU arrays), proving the dtype passed.
    for i, dt in [(0, gk.float64), (1, gk.int64), (2, gk.int32), (3, gk.uint8), (3, gk.bool_), (4, gk.bfloat16),
                  (5, gk.float32)]:
        args = [None] * 6
        args[i] = gk.zeros(2, dtype=dt)
        with pytest.raises(ValueError, match="on cpu"):
            k.pack_args(*args)


@needs_nvrtc
def test_explicit_types_and_unparsable_signatures():
    src = r"""
    #define DECLARE(n) extern "C" __global__ void n(float* x, int k)
    DECLARE(mac) {}
    struct Pair { int a, b; };
    extern "C" __global__ void bystruct(Pair p, float* x) {}
    """
    k = gk.jit(src, "mac", arch="sm_90a")
    with pytest.raises(TypeError, match="types="):
        k.pack_args(None, 1)
    k2 = gk.jit(src, "mac", arch="sm_90a", types=["float*", gk.int32])
    assert k2.param_types == ["float*", "int"]
    assert k2.pack_args(None, 7) == struct.pack("<Qi", 0, 7)
    k3 = gk.jit(src, "bystruct", arch="sm_90a")
    with pytest.raises(TypeError, match="Pair"):
        k3.pack_args(None, None)
    with pytest.raises(ValueError, match=r"types\[0\]"):
        gk.jit(src, "bystruct", arch="sm_90a", types=["Pair", "float*"])
    with pytest.raises(TypeError, match="types"):
        gk.jit(src, "mac", arch="sm_90a", types=[3.5])


@needs_nvrtc
@pytest.mark.parametrize("spelling,kind,size,dtype", [
    ("float", "float", 4, gk.float32), ("const double", "float", 8, gk.float64),
    ("__half", "float", 2, gk.float16), ("__nv_bfloat16", "float", 2, gk.bfloat16),
    ("int", "int", 4, gk.int32), ("unsigned", "uint", 4, None), ("unsigned int", "uint", 4, None),
    ("long long int", "int", 8, gk.int64), ("std::int64_t", "int", 8, gk.int64), ("uint64_t", "uint", 8, None),
    ("size_t", "uint", 8, None), ("bool", "bool", 1, gk.bool_), ("short", "int", 2, gk.int16),
    ("unsigned char", "uint", 1, gk.uint8), ("const float* __restrict__", "pointer", 8, gk.float32),
    ("float const * const", "pointer", 8, gk.float32), ("const __nv_bfloat16*", "pointer", 8, gk.bfloat16),
    ("int**", "pointer", 8, None), ("MyStruct*", "pointer", 8, None), ("__nv_fp8_e4m3*", "pointer", 8, gk.float8_e4m3fn),
])
def test_parse_type(spelling, kind, size, dtype):
    r = gk._C._jit_parse_type(spelling)
    assert (r["kind"], r["size"]) == (kind, size)
    assert r["dtype"] == dtype


@needs_nvrtc
@pytest.mark.parametrize("spelling", ["float&", "int[4]", "MyStruct", "void", "long double", "float4", "int float"])
def test_parse_type_rejects(spelling):
    with pytest.raises(ValueError, match="types="):
        gk._C._jit_parse_type(spelling)


def test_find_signature_forms():
    fs = gk._C._jit_find_signature
    assert fs('extern "C" __global__ void f(void) {}', "f") == []
    assert fs('extern "C" __global__ void f() {}', "f") == []
    assert fs("__device__ void f(int a);  __global__ void f(float* p, int n) {}", "f") == [("float *", "p"), ("int", "n")]
    # a call of f inside another kernel is not its declaration
    assert fs("__global__ void g(int* q) { f(q); }\n__global__ void f(double x) {}", "f") == [("double", "x")]
    # comments, strings and preprocessor lines are ignored
    src = '#define F f(int)\n/* __global__ void f(char c) */ // __global__ void f(short s)\n' \
          'const char* s = "__global__ void f(bool b)";\n__global__ void f(unsigned long long u) {}'
    assert fs(src, "f") == [("unsigned long long", "u")]
    assert fs("template <class T> __global__ void f(T a, T* b = nullptr) {}", "f<int>") == [("int", "a"), ("int *", "b")]
    assert fs("template <class T> __global__ void f(T a) {}", "&f<float>") == [("float", "a")]
    assert fs('__global__ void g() {}', "f") is None
    assert fs("__global__ void fx(int a) {}", "f") is None


def test_find_signature_garbage_never_crashes():
    rng = np.random.default_rng(0)
    alphabet = list("()<>{};,*&:=/\"'#\n tf_") + ["__global__", "template", "void", "f", "int", "/*", "*/", "//"]
    for _ in range(3000):
        src = "".join(rng.choice(alphabet, size=int(rng.integers(0, 40))))
        name = "".join(rng.choice(["f", "<", ">", "int", ",", "&", "::", " "], size=int(rng.integers(1, 6))))
        try:
            r = gk._C._jit_find_signature(src, name)
        except ValueError:
            continue  # unsupported parameter types are reported, not crashed on
        assert r is None or isinstance(r, list)


# ---------------------------------------------------------------- availability

def test_without_nvrtc_everything_else_works(tmp_path):
    r = run_py("""
    import gpukit as gk, numpy as np
    assert gk.jit.is_available() is False
    reason = gk.jit.unavailable_reason()
    assert "/nonexistent/libnvrtc.so.13" in reason or "not found" in reason, reason
    try:
        gk.jit('extern "C" __global__ void f() {}', "f", arch="sm_90a")
    except RuntimeError as e:
        assert "NVRTC is not available" in str(e) and "GPUKIT_NVRTC_PATH" in str(e), str(e)
    else:
        raise SystemExit("gk.jit did not raise")
    x = gk.arange(5, dtype=gk.float32) * 2 + 1
    assert np.array_equal(x.numpy(), np.arange(5, dtype=np.float32) * 2 + 1)
    print("OK")
    """, {"GPUKIT_NVRTC_PATH": "/nonexistent/libnvrtc.so.13", "GPUKIT_NVRTC_NO_SEARCH": "1",
          "GPUKIT_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_nvrtc_path_that_is_not_nvrtc(tmp_path):
    import gpukit._C as C
    r = run_py("""
    import gpukit as gk
    assert not gk.jit.is_available()
    print(gk.jit.unavailable_reason())
    """, {"GPUKIT_NVRTC_PATH": C.__file__, "GPUKIT_NVRTC_NO_SEARCH": "1"})
    assert r.returncode == 0, r.stderr
    assert "not NVRTC" in r.stdout or "too old" in r.stdout


@needs_nvrtc
def test_nvrtc_path_env_selects_library(tmp_path):
    path = gk.jit.nvrtc_path()
    r = run_py("""
    import gpukit as gk
    print(gk.jit.is_available(), gk.jit.nvrtc_path())
    """, {"GPUKIT_NVRTC_PATH": os.path.dirname(path), "GPUKIT_NVRTC_NO_SEARCH": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "True"
    assert os.path.realpath(r.stdout.split()[1]) == os.path.realpath(path)


def test_wheel_locations_are_found(tmp_path):
    # The layout of the PyPI wheels: site-packages/nvidia/{cu13,cuda_nvrtc}/lib (a namespace package).
    for sub in ("cu13", "cuda_nvrtc"):
        (tmp_path / "nvidia" / sub / "lib").mkdir(parents=True)
    (tmp_path / "nvidia" / "cu13" / "include").mkdir()
    r = run_py("""
    import gpukit as gk
    libs, incs = gk.jit._wheel_paths()
    print(sorted(libs)); print(incs)
    """, {"PYTHONPATH": str(tmp_path) + os.pathsep + PYPATH})
    assert r.returncode == 0, r.stderr
    libs, incs = r.stdout.strip().splitlines()
    assert os.path.join(str(tmp_path), "nvidia", "cu13", "lib") in libs
    assert os.path.join(str(tmp_path), "nvidia", "cuda_nvrtc", "lib") in libs
    assert os.path.join(str(tmp_path), "nvidia", "cu13", "include") in incs
