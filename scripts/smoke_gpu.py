import time, numpy as np, gpukit as gk
print(gk.devices(), gk.cuda.get_device_properties())
a = gk.arange(12, dtype=gk.float32, device="cuda").reshape(3,4)
print(a, (a*2+1).numpy())
x = np.random.rand(1023, 7).astype(np.float32)
g = gk.asarray(x, device="cuda")
for f, nf in [(gk.exp, np.exp), (gk.tanh, np.tanh), (gk.silu, lambda v: v/(1+np.exp(-v)))]:
    print(f.__name__, np.abs(f(g.T).numpy() - nf(x.T)).max())
print("bf16", np.abs(g.astype(gk.bfloat16).numpy().astype(np.float32) - gk.asarray(x).astype(gk.bfloat16).numpy().astype(np.float32)).max())
s = gk.Stream("cuda")
with s:
    y = g + 1
s.synchronize()
print("stream ok", np.allclose(y.numpy(), x+1))
st = gk.Stream("cuda")
g2 = gk.Graph(st)
inp = gk.asarray(x, device="cuda")
with g2:
    out = gk.silu(inp * 2 + 1)
g2.replay(); st.synchronize()
eager = gk.silu(inp*2+1).numpy()
print("graph bitwise", np.array_equal(out.numpy(), eager))
# bandwidth
n = 1 << 26
for dt in [gk.float32, gk.bfloat16]:
    nn = n if dt == gk.float32 else 2*n
    A = gk.ones(nn, dtype=dt, device="cuda"); B = gk.ones(nn, dtype=dt, device="cuda")
    e0, e1 = gk.Event(), gk.Event()
    for _ in range(3): C = A + B
    ts = []
    for _ in range(20):
        e0.record(); C = A + B; e1.record(); e1.synchronize(); ts.append(e0.elapsed_time(e1))
    t = np.median(ts)
    print(dt, "add TB/s", 3 * nn * dt.itemsize / (t*1e-3) / 1e12, "ms", t)
    e0.record(); gk.copy_into(C, A); e1.record(); e1.synchronize(); 
    ts=[]
    for _ in range(20):
        e0.record(); gk.copy_into(C, A); e1.record(); e1.synchronize(); ts.append(e0.elapsed_time(e1))
    print(dt, "copy TB/s", 2 * nn * dt.itemsize / (np.median(ts)*1e-3) / 1e12)
a = gk.ones(16, device="cuda"); b = gk.ones(16, device="cuda")
for _ in range(1000): c = a + b
gk.synchronize()
t0 = time.perf_counter()
for _ in range(10000): c = a + b
gk.synchronize()
print("overhead us", (time.perf_counter()-t0)/10000*1e6)
print(gk.memory_stats("cuda:0"))
try:
    gk.set_memory_limit("cuda:0", 1<<30)
    big = gk.empty((1<<31,), device="cuda")
except MemoryError as e:
    print("OOM ok:", type(e).__name__, e)
gk.set_memory_limit("cuda:0", 0)
z = gk.ones(10, device="cuda"); print("after oom", z.numpy().sum())
