"""CUDA matmul / linear / gate_up_swiglu: cuBLASLt (when present) and the fallback
kernel against the CPU reference and float64 NumPy, odd shapes, transposed and
strided operands, batches, out_dtype, TF32 only when asked, bitwise run-to-run
determinism (also across streams and graph replay), and the fallback path in a
subprocess with GPUKIT_DISABLE_CUBLASLT=1. Skipped without a GPU."""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpukit as gk
from test_gemm import act_ref, assert_close, f64, linear_ref, rand

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")

ACC = {"float64": 2.0**-53}


def cu(x):
    return gk.asarray(x).to("cuda")


def bits(x):
    return gk.to_numpy(x).tobytes()


def check_mm(got, a, b, out):
    ref = f64(a) @ f64(b)
    bound = np.abs(f64(a)) @ np.abs(f64(b))
    k = np.shape(a)[-1]
    assert_close(got, ref, bound, k, out, ACC.get(str(np.asarray(a).dtype), 2.0**-24), deriv=1.0)


def test_cublaslt_found_and_used():
    info = gk.linalg.cublaslt_info()
    if os.environ.get("GPUKIT_DISABLE_CUBLASLT", "0") not in ("", "0"):
        pytest.skip("cuBLASLt disabled by the environment")
    assert info["available"], info["reason"]  # the toolkit or the nvidia-cublas wheel is on the GPU machine
    before = info["lt_calls"]
    a, b = rand((64, 128), "bfloat16"), rand((128, 96), "bfloat16")
    check_mm(gk.matmul(cu(a), cu(b)), a, b, "bfloat16")
    assert gk.linalg.cublaslt_info()["lt_calls"] > before


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 4096, 1), (7, 7, 7), (65, 17, 129), (1023, 33, 65),
                                   (3, 4097, 5), (256, 512, 384), (130, 0, 3), (5, 1, 4097)])
def test_matmul_2d(dtype, m, k, n):
    a, b = rand((m, k), dtype), rand((k, n), dtype)
    got = gk.matmul(cu(a), cu(b))
    assert got.dtype == getattr(gk, dtype) and got.device.type == "cuda"
    check_mm(got, a, b, dtype)


@pytest.mark.parametrize("dt,out", [("bfloat16", "float32"), ("float16", "float32"), ("float32", "bfloat16"),
                                    ("float16", "bfloat16"), ("bfloat16", "bfloat16")])
def test_matmul_out_dtype(dt, out):
    a, b = rand((3, 37, 129), dt), rand((129, 61), dt)
    got = gk.matmul(cu(a), cu(b), out_dtype=out)
    assert got.dtype == getattr(gk, out)
    check_mm(got, a, b, out)


def test_matmul_transposed_strided_batched():
    a, b = rand((6, 40, 72), "bfloat16"), rand((6, 72, 56), "bfloat16")
    ag, bg = cu(a), cu(b)
    cases = [
        (ag, bg, a, b),                                                    # plain strided batch
        (ag.transpose(1, 2).transpose(1, 2), bg, a, b),
        (cu(np.ascontiguousarray(a.transpose(0, 2, 1))).transpose(1, 2), bg, a, b),  # A column-major
        (ag, cu(np.ascontiguousarray(b.transpose(0, 2, 1))).transpose(1, 2), a, b),  # B column-major (w^T)
        (ag[:, ::2, :], bg[:, :, 1:], a[:, ::2, :], b[:, :, 1:]),          # row-strided A, offset B
        (ag[::2], bg[1::2], a[::2], b[1::2]),                              # batch stride 2 matrices
        (ag[:, :, ::2], bg[:, ::2, :], a[:, :, ::2], b[:, ::2, :]),        # element strides: copied or fallback
        (ag[:, :, 1:], bg[:, 1:, :], a[:, :, 1:], b[:, 1:, :]),            # odd offsets: 2-byte alignment
        (ag, bg[0], a, b[0]),                                              # shared B: folded into M
        (ag[0], bg, a[0], b),                                              # shared A: batch stride 0
        (ag.reshape(2, 3, 40, 72), bg.reshape(2, 3, 72, 56), a.reshape(2, 3, 40, 72), b.reshape(2, 3, 72, 56)),
        (ag.reshape(2, 3, 40, 72).transpose(0, 1), bg.reshape(3, 2, 72, 56),  # batch dims not collapsible
         a.reshape(2, 3, 40, 72).transpose(1, 0, 2, 3), b.reshape(3, 2, 72, 56)),
        (ag[:, :1, :], bg, a[:, :1, :], b),                                # m = 1 per batch
        (ag[:, :1, :], bg[0], a[:, :1, :], b[0]),                          # m = 1, shared B: folded
    ]
    for i, (x, y, xn, yn) in enumerate(cases):
        got = gk.matmul(x, y)
        assert got.shape == np.matmul(xn, yn).shape, i
        check_mm(got, xn, yn, "bfloat16")
        cpu = gk.matmul(x.to("cpu"), y.to("cpu"))
        assert_close(got, f64(cpu), np.abs(f64(xn)) @ np.abs(f64(yn)), 72, "bfloat16", deriv=2.0)


def test_matmul_many_batches_and_1d():
    x, y = rand((70_000, 2, 3), "float32"), rand((3, 2), "float32")
    check_mm(gk.matmul(cu(x), cu(y)), x, y, "float32")
    v, m = rand((300,), "float16"), rand((300, 7), "float16")
    got = gk.matmul(cu(v), cu(m))
    assert got.shape == (7,)
    check_mm(got, v, m, "float16")
    got = gk.matmul(cu(m.T.copy()), cu(v))
    assert got.shape == (7,)


def test_fp32_is_true_fp32_unless_asked():
    # TF32 keeps 10 mantissa bits: with K = 4096 its error is far above the fp32 bound
    a, b = rand((64, 4096), "float32"), rand((4096, 64), "float32")
    ref = f64(a) @ f64(b)
    bound = np.abs(f64(a)) @ np.abs(f64(b))
    exact = gk.matmul(cu(a), cu(b))
    assert_close(exact, ref, bound, 4096, "float32", deriv=1.0)
    fast = gk.matmul(cu(a), cu(b), allow_tf32=True)
    err = np.abs(f64(fast) - ref)
    assert np.all(err <= 2.0**-9 * bound + 1e-6)  # within TF32 accuracy
    with gk.matmul_precision("tf32"):
        ctx = gk.matmul(cu(a), cu(b))
        forced = gk.matmul(cu(a), cu(b), allow_tf32=False)
    assert bits(forced) == bits(exact)
    assert bits(ctx) == bits(fast)
    if gk.linalg.cublaslt_available():
        assert bits(fast) != bits(exact)  # TF32 was really used


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_determinism_runs_and_streams(dtype):
    a, b = cu(rand((1000, 3000), dtype)), cu(rand((3000, 700), dtype))
    first = bits(gk.matmul(a, b))
    for _ in range(3):
        assert bits(gk.matmul(a, b)) == first
    s1, s2 = gk.Stream("cuda"), gk.Stream("cuda")
    r1, r2 = gk.matmul(a, b, stream=s1), gk.matmul(a, b, stream=s2)
    s1.synchronize()
    s2.synchronize()
    assert bits(r1) == first and bits(r2) == first
    # small M, large K: the shape where split-K configurations are chosen
    x, w = cu(rand((4, 14336), dtype)), cu(rand((4096, 14336), dtype))
    ref = bits(gk.linear(x, w))
    for _ in range(3):
        assert bits(gk.linear(x, w)) == ref


def test_graph_replay_same_bits():
    a, b = cu(rand((257, 1024), "bfloat16")), cu(rand((1024, 513), "bfloat16"))
    x, w, bias = cu(rand((9, 1024), "bfloat16")), cu(rand((300, 1024), "bfloat16")), cu(rand((300,), "bfloat16"))
    s = gk.Stream("cuda")
    with s:
        eager = (bits(gk.matmul(a, b)), bits(gk.linear(x, w, bias=bias, activation="silu")))
    g = gk.Graph(gk.Stream("cuda"))
    with g.stream:  # warm-up on the capture stream: handle, workspace and plans exist before capture
        gk.matmul(a, b)
        gk.linear(x, w, bias=bias, activation="silu")
    g.stream.synchronize()
    with g:
        o1 = gk.matmul(a, b)
        o2 = gk.linear(x, w, bias=bias, activation="silu")
    for _ in range(2):
        g.replay()
        g.stream.synchronize()
        assert (bits(o1), bits(o2)) == eager


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("act", [None, "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("use_bias,use_res", [(False, False), (True, False), (False, True), (True, True)])
def test_linear_matches_cpu(dtype, act, use_bias, use_res):
    for xs, n in [((1, 64), 128), ((3, 5, 96), 33), ((127, 129), 257)]:
        k = xs[-1]
        x, w = rand(xs, dtype), rand((n, k), dtype, 1 / math.sqrt(k))
        bias = rand((n,), dtype) if use_bias else None
        res = rand(xs[:-1] + (n,), dtype) if use_res else None
        args = dict(activation=act)
        got = gk.linear(cu(x), cu(w), bias=None if bias is None else cu(bias), residual=None if res is None
                        else cu(res), **args)
        ref, bound = linear_ref(x, w, bias, act, res, dtype)
        assert_close(got, ref, bound, k, dtype)
        cpu = gk.linear(gk.asarray(x), gk.asarray(w), bias=None if bias is None else gk.asarray(bias),
                        residual=None if res is None else gk.asarray(res), **args)
        assert_close(got, f64(cpu), bound, k, dtype, deriv=2.0)


BIAS_EPILOGUE_SCRIPT = textwrap.dedent("""
    import numpy as np, ml_dtypes, gpukit as gk
    rng = np.random.default_rng(5)
    worst = {}
    for name, dt in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)):
        x = rng.standard_normal((127, 129)).astype(dt)
        w = (rng.standard_normal((257, 129)) / np.sqrt(129)).astype(dt)
        b = rng.standard_normal(257).astype(dt)
        got = gk.linear(gk.asarray(x).to("cuda"), gk.asarray(w).to("cuda"), bias=gk.asarray(b).to("cuda"))
        g = got.numpy().astype(np.float64)
        acc = x.astype(np.float64) @ w.astype(np.float64).T
        once = (acc + b.astype(np.float64)).astype(dt).astype(np.float64)       # one rounding
        twice = (acc.astype(dt).astype(np.float64) + b.astype(np.float64)).astype(dt).astype(np.float64)
        ulp = np.abs(np.spacing(once.astype(dt)).astype(np.float64))
        tol = ulp + 2 * 133 * 2.0**-24 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T)
        worst[name] = (float(np.max(np.abs(g - once) / tol)), float(np.mean(g == once)), float(np.mean(g == twice)))
    print("fused bias epilogue: max |err| / (1 ulp + fp32 bound), fraction == one rounding, == two roundings:", worst)
    assert all(v[0] <= 1.0 for v in worst.values()), worst
""")


@pytest.mark.xfail(reason="cuBLASLt's bias epilogue with a bf16/f16 output: measured, not relied upon", strict=False)
def test_cublaslt_bias_epilogue_rounding_subprocess():
    """What the fused epilogue does (GPUKIT_CUBLASLT_BIAS_EPILOGUE=1): within one output ulp of
    the once-rounded exact value? linear does not use it for bf16/f16 outputs by default."""
    if not gk.linalg.cublaslt_available():
        pytest.skip("no cuBLASLt")
    env = dict(os.environ, GPUKIT_CUBLASLT_BIAS_EPILOGUE="1")
    r = subprocess.run([sys.executable, "-c", BIAS_EPILOGUE_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    print(r.stdout, r.stderr[-2000:])
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_linear_bias_low_precision_rounded_once(dtype):
    """The default bias path for a bf16/f16 output: the result is the exact x @ w^T + b
    rounded once, up to the fp32 accumulation error (one output ulp plus the fp32 bound)."""
    rng = np.random.default_rng(6)
    dt = {"bfloat16": rand((1,), "bfloat16").dtype, "float16": np.float16}[dtype]
    x = rng.standard_normal((127, 129)).astype(dt)
    w = (rng.standard_normal((257, 129)) / np.sqrt(129)).astype(dt)
    b = (-(x.astype(np.float64) @ w.astype(np.float64).T)[0] + rng.standard_normal(257) * 0.01).astype(dt)
    got = f64(gk.linear(cu(x), cu(w), bias=cu(b)))  # row 0 nearly cancels: |acc + b| << |acc|
    acc = f64(x) @ f64(w).T
    once = (acc + f64(b)).astype(dt).astype(np.float64)
    ulp = np.abs(np.spacing(once.astype(dt)).astype(np.float64))
    tol = ulp + 2 * (129 + 4) * 2.0**-24 * (np.abs(f64(x)) @ np.abs(f64(w)).T)  # one rounding + fp32 sums
    err = np.abs(got - once) / tol
    worst = np.unravel_index(int(np.argmax(err)), err.shape)
    assert err.max() <= 1.0, (f"error {err.max():.3g} x tolerance at {worst}: got {got[worst]!r}, once-rounded "
                              f"{once[worst]!r}, acc {acc[worst]!r}, bias {f64(b)[worst[1]]!r}, ulp {ulp[worst]:.3g}")
    cpu = f64(gk.linear(gk.asarray(x), gk.asarray(w), bias=gk.asarray(b)))
    assert np.max(np.abs(cpu - once) / tol) <= 1.0


def test_linear_strided_and_out_dtype():
    wb = rand((96, 2, 80), "bfloat16")
    w = cu(wb)[:, 1, :]  # rows 160 apart
    xb = rand((80, 7), "bfloat16")
    x = cu(xb).T          # column-major x
    bias = cu(rand((192,), "float32"))[1::2]
    got = gk.linear(x, w, bias=bias, out_dtype="float32")
    assert got.dtype == gk.float32
    ref, bound = linear_ref(xb.T, wb[:, 1, :], f64(bias), None, None, "float32")
    assert_close(got, ref, bound, 80, "float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gate_up_swiglu_matches(dtype):
    k, i = 256, 344
    x, w = rand((5, k), dtype), rand((2 * i, k), dtype, 1 / math.sqrt(k))
    got = gk.gate_up_swiglu(cu(x), cu(w))
    g, u = f64(x) @ f64(w)[:i].T, f64(x) @ f64(w)[i:].T
    ref = act_ref(g, "silu") * u
    bg, bu = np.abs(f64(x)) @ np.abs(f64(w)[:i]).T, np.abs(f64(x)) @ np.abs(f64(w)[i:]).T
    assert_close(got, ref, bg * np.abs(u) + bu * np.abs(g) + bg * bu, k, dtype, deriv=1.5)
    assert bits(gk.gate_up_swiglu(cu(x), cu(w))) == bits(got)


FALLBACK_SCRIPT = textwrap.dedent("""
    import numpy as np, ml_dtypes, gpukit as gk
    info = gk.linalg.cublaslt_info()
    assert not info["available"] and "GPUKIT_DISABLE_CUBLASLT" in info["reason"], info
    rng = np.random.default_rng(1)
    for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
        a = rng.standard_normal((3, 65, 129)).astype(dt)
        b = rng.standard_normal((129, 33)).astype(dt)
        g = gk.matmul(gk.asarray(a).to("cuda"), gk.asarray(b).to("cuda"), out_dtype="float32")
        ref = a.astype(np.float64) @ b.astype(np.float64)
        bound = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
        assert np.all(np.abs(g.numpy().astype(np.float64) - ref) <= 2 * 131 * 2.0**-24 * bound + 1e-30)
        x = rng.standard_normal((7, 129)).astype(dt)
        w = rng.standard_normal((33, 129)).astype(dt)
        bias = rng.standard_normal(33).astype(dt)
        y = gk.linear(gk.asarray(x).to("cuda"), gk.asarray(w).to("cuda"), bias=gk.asarray(bias).to("cuda"),
                      activation="gelu_tanh")
        yc = gk.linear(gk.asarray(x), gk.asarray(w), bias=gk.asarray(bias), activation="gelu_tanh")
        np.testing.assert_allclose(y.numpy().astype(np.float64), yc.numpy().astype(np.float64),
                                   rtol=2e-2, atol=2e-2)
        h = gk.gate_up_swiglu(gk.asarray(x).to("cuda"), gk.asarray(np.concatenate([w, w])).to("cuda"))
        assert h.shape == (7, 33)
    info = gk.linalg.cublaslt_info()
    assert info["lt_calls"] == 0 and info["fallback_calls"] >= 9, info
    print("fallback ok")
""")


def test_fallback_without_cublaslt_subprocess():
    env = dict(os.environ, GPUKIT_DISABLE_CUBLASLT="1")
    r = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fallback ok" in r.stdout


def test_bad_path_env_reports_reason_subprocess():
    script = ("import gpukit as gk; i = gk.linalg.cublaslt_info(); "
              "print(i['available'], i['path'])")
    env = dict(os.environ, GPUKIT_CUBLASLT_PATH="/nonexistent/libcublasLt.so.13")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr  # a bad explicit path falls through to the other candidates
