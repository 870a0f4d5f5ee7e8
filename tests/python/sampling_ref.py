"""Independent NumPy reference of the gpukit.sampling definitions (see
python/gpukit/sampling.py): thresholds from sorting, exact integer masses, and a
pure-Python Philox4x32-10 for the draw."""
import numpy as np

SCALE = 2.0 ** 40
M32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    c = list(ctr)
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k1) & M32, p0 & M32]
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c


def draw_bits(seed, position, tag):
    seed &= (1 << 64) - 1
    position &= (1 << 64) - 1
    r = philox4x32_10([position & M32, position >> 32, tag, 0], [seed & M32, seed >> 32])
    return (r[0] << 32) | r[1]


def det_exp(d):
    """exp(d) for float32 d <= 0 exactly as gpukit computes it (src/ops/sampling_args.h:
    det_exp): every step one rounded float32 operation, so the reference weights are
    bit-identical to the CPU and CUDA ones."""
    f = np.float32
    d = np.asarray(d, np.float32)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        live = d > f(-104)
        x = np.where(live, np.minimum(d, f(0)), f(0)).astype(np.float32)
        k = np.rint(x * f(1.44269502)).astype(np.float32)
        r = (x + k * f(-0.693145751953125)).astype(np.float32)
        r = (r + k * f(-1.42860677e-06)).astype(np.float32)
        p = np.full_like(r, f(1.98412698e-04))
        for c in (1.38888889e-03, 8.33333333e-03, 4.16666667e-02, 1.66666667e-01, 0.5, 1.0, 1.0):
            p = (p * r + f(c)).astype(np.float32)
        ki = k.astype(np.int64)
        k1 = np.trunc(ki / 2).astype(np.int64)  # C++ integer division truncates
        k2 = ki - k1
        p = (p * np.ldexp(f(1), k1).astype(np.float32)).astype(np.float32)
        p = (p * np.ldexp(f(1), k2).astype(np.float32)).astype(np.float32)
    return np.where(live, p, f(0)).astype(np.float32)


def weights(s):
    """s: float32 row (no NaN). Returns (m, e float32, w uint64-as-python-int array)."""
    s = np.asarray(s, np.float32)
    m = s.max()
    with np.errstate(invalid="ignore", over="ignore"):
        e = det_exp((s - m).astype(np.float32))
    e = np.where(np.isneginf(s), np.float32(0), e)
    w = np.floor(e.astype(np.float64) * SCALE)
    w = np.where(w >= 1, w, 0).astype(np.uint64)
    return m, e, w


def _threshold(keys, w, idx, target):
    """Largest key among idx whose mass of keys >= it reaches target (groups of ties)."""
    order = idx[np.argsort(-keys[idx], kind="stable")]
    cum = 0
    i = 0
    while i < len(order):
        g = keys[order[i]]
        while i < len(order) and keys[order[i]] == g:
            cum += int(w[order[i]])
            i += 1
        if cum >= target:
            return g
    return keys[order[-1]]


def kept_mask(s, top_k=None, top_p=1.0, min_p=0.0, typical_p=1.0):
    s = np.asarray(s, np.float32)
    V = s.size
    m, e, w = weights(s)
    keys = s.astype(np.float64)
    keep = np.ones(V, bool)
    if top_k is not None and 0 < top_k < V:
        kth = np.sort(keys)[::-1][top_k - 1]
        keep &= keys >= kth
    if top_p < 1.0:
        idx = np.nonzero(keep)[0]
        Wk = int(sum(int(v) for v in w[idx]))
        target = int(float(np.float32(top_p)) * float(Wk))
        keep &= keys >= _threshold(keys, w, idx, target)
    if min_p > 0:
        keep &= e >= np.float32(min_p)
    if typical_p < 1.0:
        idx = np.nonzero(keep)[0]
        W1 = int(sum(int(v) for v in w[idx]))
        sm = (s - m).astype(np.float32)
        S1 = 0
        for i in idx:
            if w[i]:
                S1 += int(np.rint(float(w[i]) * float(sm[i])))
        mean = S1 / W1
        d = np.abs(sm.astype(np.float64) - mean).astype(np.float32)
        tkey = -d.astype(np.float64)
        target = int(float(np.float32(typical_p)) * float(W1))
        keep &= tkey >= _threshold(tkey, w, idx, target)
    return keep, w


def filtered_probs(s, **kw):
    keep, w = kept_mask(s, **kw)
    wk = np.where(keep, w, 0).astype(np.float64)
    return wk / wk.sum()


def draw(s, seed, position, tag, **kw):
    keep, w = kept_mask(s, **kw)
    wk = [int(v) if k else 0 for v, k in zip(w, keep)]
    W = sum(wk)
    t = (W * draw_bits(seed, position, tag)) >> 64
    acc = 0
    for i, v in enumerate(wk):
        acc += v
        if acc > t:
            return i
    return int(np.argmax(s))


def penalize(x, hist, rep=1.0, pres=0.0, freq=0.0):
    x = np.array(x, np.float32)
    V = x.size
    ids, counts = np.unique([h for h in hist if 0 <= h < V], return_counts=True)
    for t, c in zip(ids, counts):
        v = x[t]
        if rep != 1.0:
            v = v / np.float32(rep) if v > 0 else v * np.float32(rep)
        v = np.float32(v - np.float32(freq) * np.float32(c)) if freq else v
        v = np.float32(v - np.float32(pres)) if pres else v
        x[t] = v
    return x


# chi-square critical values at alpha = 1e-4 (Wilson-Hilferty approximation, z = 3.719)
def chi2_critical(df, z=3.719):
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * np.sqrt(h)) ** 3


def chi_square(counts, probs):
    n = counts.sum()
    nz = probs > 0
    exp = probs[nz] * n
    stat = float(((counts[nz] - exp) ** 2 / exp).sum())
    return stat, int(nz.sum()) - 1


# The chi-square tests' distributions and settings (test_sampling.py on the CPU,
# test_sampling_cuda_wide.py on CUDA).
CHI_FAMILIES = {
    "peaked": np.log(np.array([0.4, 0.2, 0.12, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02, 4e-3, 1e-3], np.float32)),
    "flat": np.zeros(11, np.float32) + np.linspace(0, 0.02, 11, dtype=np.float32),
    "ties": np.array([1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0, 0, 0, -0.5], np.float32),
}
CHI_SETTINGS = [dict(), dict(top_k=4), dict(top_p=0.8), dict(min_p=0.3), dict(typical_p=0.7),
                dict(temperature=0.6, top_k=8, top_p=0.95)]


def chi_setting_id(kw):
    return ",".join(f"{a}={b}" for a, b in kw.items()) or "plain"


def check_draw_counts(counts, s, kw, label):
    """counts (per token of row s, drawn with the sample() keywords kw) never hit a filtered-out
    token and follow the filtered distribution (chi-square, alpha = 1e-4)."""
    t = kw.get("temperature", 1.0)
    probs = filtered_probs((s / np.float32(t)).astype(np.float32), **{k: v for k, v in kw.items()
                                                                      if k != "temperature"})
    assert counts[probs == 0].sum() == 0, "drew a filtered-out token"
    stat, df = chi_square(counts, probs)
    if df:
        crit = chi2_critical(df)
        print(f"{label} {kw}: chi2={stat:.2f} df={df} crit={crit:.2f}")
        assert stat < crit
