#!/usr/bin/env python3
"""Independent oracle for `tq::math` (run by scripts/oracle.sh with the pinned venv).

Writes under OUT/math/:
  lloyd_max.json  Lloyd-Max codebooks computed with scipy for several (dist, d, bits):
                  solved with scipy.optimize.root on the fixed-point equations, cell masses and
                  moments from scipy.stats / scipy.special.betainc (a formula different from the
                  Rust one), then *checked with scipy.integrate.quad* (centroid = quad conditional
                  mean, MSE = sum of quad integrals of (x - c)^2 f). Also the MSE of the fork's
                  May-2026 turbo4 table and its ratio to the optimum.
  lloyd_max_mp.json  (only where mpmath is importable, or with --mp-only) a few 8-bit tables
                  solved to 40 digits with mpmath (Newton on the fixed-point equations, residual
                  < 1e-30): a reference sharper than the float64 scipy solve, whose root-finder
                  stops ~1e-9 σ short on the worst-conditioned 8-bit tables.
  pcg64.json      numpy's SeedSequence pools / generate_state words, PCG64 initial state and
                  raw 64-bit outputs for several seeds, default_rng(42).choice([-1.0, 1.0], 128)
                  drawn twice (the turbo KV sign arrays), and tq's own full-row sign stream.
Nothing here is derived from the Rust code.
"""
import os
import sys

# Keep this directory off sys.path so that a sibling oracle script can never be imported in place
# of a library module of the same name (this file was once called math.py and shadowed the stdlib).
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

try:
    import numpy as np  # noqa: E402
    from scipy import integrate, optimize, special, stats  # noqa: E402
except ImportError:  # --mp-only runs with any Python that has mpmath
    np = None


# ---------------------------------------------------------------- distributions
class Normal:
    def __init__(self, sigma):
        self.s = sigma
        self.rv = stats.norm(scale=sigma)
        self.lo, self.hi = -np.inf, np.inf
        self.var = sigma * sigma

    def mass(self, a, b):
        # accurate in both tails: sf for the upper half, cdf for the lower half
        return np.where(a >= 0, self.rv.sf(a) - self.rv.sf(b), self.rv.cdf(b) - self.rv.cdf(a))

    def m1(self, a, b):
        return self.var * (self.rv.pdf(a) - self.rv.pdf(b))

    def pdf(self, x):
        return self.rv.pdf(x)

    def compander_ppf(self, p):
        return stats.norm(scale=self.s * np.sqrt(3.0)).ppf(p)


class SymBeta:
    """X = 2B - 1, B ~ Beta(al, al), al = (d-1)/2: coordinate of a random unit vector in R^d."""

    def __init__(self, d):
        self.al = (d - 1) / 2.0
        self.rv = stats.beta(self.al, self.al, loc=-1.0, scale=2.0)
        self.lo, self.hi = -1.0, 1.0
        self.var = 1.0 / d
        self.d = d

    def mass(self, a, b):
        return np.where(a >= 0, self.rv.sf(a) - self.rv.sf(b), self.rv.cdf(b) - self.rv.cdf(a))

    def m1(self, a, b):
        # x Beta(al,al)(u) = al/(2al) * Beta(al+1, al)(u): E[B 1{u<B<v}] = 1/2 (I_v(al+1,al) - I_u(al+1,al))
        u, v = (a + 1) / 2, (b + 1) / 2
        eb = 0.5 * (special.betainc(self.al + 1, self.al, v) - special.betainc(self.al + 1, self.al, u))
        return 2 * eb - self.mass(a, b)

    def pdf(self, x):
        return self.rv.pdf(x)

    def compander_ppf(self, p):
        # density ∝ f^(1/3) = (1-x²)^(m/3), m = (d-3)/2  ->  Beta(m/3 + 1, m/3 + 1) on [-1, 1]
        a3 = (self.d - 3) / 6.0 + 1.0
        return stats.beta(a3, a3, loc=-1.0, scale=2.0).ppf(p)


def make(dist, d):
    if dist == "normal01":
        return Normal(1.0)
    if dist == "gaussian":
        return Normal(1.0 / np.sqrt(d))
    return SymBeta(d)


# ---------------------------------------------------------------- Lloyd-Max
def cell_means(D, t):
    full = np.concatenate([[D.lo], t, [D.hi]])
    a, b = full[:-1], full[1:]
    return D.m1(a, b) / D.mass(a, b)


def solve(D, n):
    if n == 1:
        return np.array([0.0]), 0
    p = (np.arange(n) + 0.5) / n
    c0 = D.compander_ppf(p)
    t0 = 0.5 * (c0[1:] + c0[:-1])
    # a few Lloyd steps, then MINPACK hybrd on t - midpoints(c(t)) = 0
    for _ in range(20):
        c = cell_means(D, t0)
        t0 = 0.5 * (c[1:] + c[:-1])
    scale = np.sqrt(D.var)

    def F(ts):
        c = cell_means(D, ts * scale)
        return ts - 0.5 * (c[1:] + c[:-1]) / scale

    sol = optimize.root(F, t0 / scale, method="hybr", options={"xtol": 1e-15, "maxfev": 200000})
    t = sol.x * scale
    c = cell_means(D, t)
    # polish with Lloyd steps (each step is a contraction towards the unique optimum)
    for _ in range(5):
        t = 0.5 * (c[1:] + c[:-1])
        c = cell_means(D, t)
    return c, sol.nfev


def quad_check(D, c):
    """Conditional means and MSE by adaptive quadrature (independent of the closed forms)."""
    t = 0.5 * (c[1:] + c[:-1])
    full = np.concatenate([[D.lo], t, [D.hi]])
    mse = 0.0
    worst = 0.0
    for i in range(len(c)):
        a, b = full[i], full[i + 1]
        kw = dict(epsabs=0.0, epsrel=1e-13, limit=200)
        if np.isfinite(a) and np.isfinite(b):
            # give quad the scale of the cell via a substitution-free interval; points help near 0
            pass
        p, _ = integrate.quad(D.pdf, a, b, **kw)
        q, _ = integrate.quad(lambda x: x * D.pdf(x), a, b, **kw)
        e, _ = integrate.quad(lambda x: (x - c[i]) ** 2 * D.pdf(x), a, b, **kw)
        if p > 1e-200:
            worst = max(worst, abs(q / p - c[i]))
        mse += e
    return mse, worst


def table_mse_quad(D, table):
    c = np.sort(np.asarray(table, dtype=np.float64))
    t = 0.5 * (c[1:] + c[:-1])
    full = np.concatenate([[D.lo], t, [D.hi]])
    mse = 0.0
    for i in range(len(c)):
        e, _ = integrate.quad(lambda x: (x - c[i]) ** 2 * D.pdf(x), full[i], full[i + 1], epsabs=0.0, epsrel=1e-13, limit=200)
        mse += e
    return mse


TURBO4_MAY = [0.006938, 0.020989, 0.035597, 0.051262, 0.068756, 0.089527, 0.117195, 0.173926]


def lloyd_max_oracle():
    cases = [("normal01", None, b) for b in range(1, 9)]
    for d in (3, 64, 96, 128, 160, 256, 576):
        cases += [("beta", d, b) for b in range(1, 9)]
    cases += [("gaussian", 128, b) for b in range(1, 5)]
    tables = []
    for dist, d, bits in cases:
        t0 = time.time()
        D = make(dist, d)
        n = 1 << bits
        c, nfev = solve(D, n)
        c = 0.5 * (c - c[::-1])  # the densities are symmetric
        mse_q, worst = quad_check(D, c)
        # closed-form MSE at the fixed point: E[x²] - Σ c² P
        full = np.concatenate([[D.lo], 0.5 * (c[1:] + c[:-1]), [D.hi]])
        mse_cf = D.var - float(np.sum(c * c * D.mass(full[:-1], full[1:])))
        assert worst < 1e-10 * np.sqrt(D.var), (dist, d, bits, worst)
        assert abs(mse_q - mse_cf) < 1e-8 * mse_q, (dist, d, bits, mse_q, mse_cf)
        tables.append(
            dict(dist=dist, d=d, bits=bits, centroids=c.tolist(), mse=mse_q, mse_closed_form=mse_cf,
                 quad_worst_centroid_dev=worst, nfev=int(nfev))
        )
        print(f"  {dist:8s} d={d} bits={bits}: mse={mse_q:.10e} ({time.time() - t0:.2f}s)", flush=True)
    turbo = []
    tab = np.array([-x for x in TURBO4_MAY[::-1]] + TURBO4_MAY)
    for dist in ("beta", "gaussian"):
        D = make(dist, 128)
        opt = next(t for t in tables if t["dist"] == dist and t["d"] == 128 and t["bits"] == 4)
        m = table_mse_quad(D, tab)
        turbo.append(dict(dist=dist, d=128, table=tab.tolist(), mse=m, optimum_mse=opt["mse"], ratio=m / opt["mse"]))
        print(f"  turbo4 May table on {dist} d=128: mse={m:.6e} ratio={m / opt['mse']:.4f}")
    return dict(
        method="scipy.optimize.root(hybr) on t = midpoints(c(t)); masses from scipy.stats cdf/sf, "
               "first moments from scipy.special.betainc / norm.pdf; checked by scipy.integrate.quad",
        numpy=np.__version__,
        tables=tables,
        turbo4_may=turbo,
    )


# ---------------------------------------------------------------- PCG64
def u64s(a):
    return [str(int(x)) for x in a]


def pcg64_oracle():
    seeds = [42, 0, 1, 12345, 2**32 + 5, 2**64 + 7, 2**100 + 3]
    out = []
    for s in seeds:
        ss = np.random.SeedSequence(s)
        bg = np.random.PCG64(ss)
        st = bg.state["state"]
        rng = np.random.default_rng(s)
        raw = rng.bit_generator.random_raw(32)
        out.append(dict(
            seed=str(s),
            pool=[int(x) for x in ss.pool],
            state_u64x4=u64s(np.random.SeedSequence(s).generate_state(4, np.uint64)),
            state_u32x8=[int(x) for x in np.random.SeedSequence(s).generate_state(8, np.uint32)],
            init_state=str(st["state"]),
            init_inc=str(st["inc"]),
            raw=u64s(raw),
        ))
    rng = np.random.default_rng(42)
    s1 = rng.choice([-1.0, 1.0], size=128)
    s2 = rng.choice([-1.0, 1.0], size=128)
    # other draws that exercise the bounded-integer paths from the same stream position
    rng = np.random.default_rng(42)
    ints2 = rng.integers(0, 2, size=64)
    ints7 = rng.integers(0, 7, size=64)
    ints_big = rng.integers(0, 10**12, size=16)
    # tq's own full-row sign stream: bit i%64 of raw output i//64 (set -> -1)
    own = {}
    for seed, n in ((0x7471, 576), (0x7471, 1536), (7, 172)):
        raw = np.random.default_rng(seed).bit_generator.random_raw((n + 63) // 64)
        bits = np.unpackbits(raw.astype("<u8").view(np.uint8), bitorder="little")[:n]
        own[f"{seed}_{n}"] = dict(seed=seed, n=n, signs=(1 - 2 * bits.astype(np.int64)).tolist())
    # TQ 32-block signs: top bit of (i * 0x9E3779B9) mod 2^32 set -> -1
    i = np.arange(32, dtype=np.uint64)
    gr = (((i * np.uint64(0x9E3779B9)) & np.uint64(0xFFFFFFFF)) >> np.uint64(31)).astype(np.int64)
    return dict(
        numpy=np.__version__,
        golden_ratio_signs=(1 - 2 * gr).tolist(),
        seeds=out,
        choice_s1=[int(x) for x in s1],
        choice_s2=[int(x) for x in s2],
        integers_0_2=[int(x) for x in ints2],
        integers_0_7=[int(x) for x in ints7],
        integers_0_1e12=[str(int(x)) for x in ints_big],
        own_signs=own,
    )


# ---------------------------------------------------------------- 40-digit references (mpmath)
def mp_tables():
    import mpmath as mp

    mp.mp.dps = 40
    half = mp.mpf(1) / 2
    out = []
    for dist, d, bits in (("beta", 96, 8), ("beta", 576, 8), ("normal01", None, 8), ("beta", 128, 4)):
        t0 = time.time()
        n = 1 << bits
        K = n // 2  # symmetric: solve the positive half, boundaries 0 = t_0 < ... < t_K = end
        if dist == "beta":
            m = mp.mpf(d - 3) / 2
            c0 = 1 / mp.beta(half, m + 1)
            sig = mp.sqrt(mp.mpf(1) / d)
            end = mp.mpf(1)

            def pdf(x):
                return c0 * (1 - x * x) ** m if x < 1 else mp.mpf(0)

            def cdf0(x):  # P(0 < X < x)
                return mp.betainc(half, m + 1, 0, x * x, regularized=True) / 2

            def g(x):  # antiderivative of -x f(x)
                return c0 / (2 * (m + 1)) * (1 - x * x) ** (m + 1) if x < 1 else mp.mpf(0)
        else:
            sig = mp.mpf(1)
            end = mp.inf

            def pdf(x):
                return mp.npdf(x) if x != mp.inf else mp.mpf(0)

            def cdf0(x):
                return (mp.ncdf(x) - half) if x != mp.inf else half

            def g(x):
                return mp.npdf(x) if x != mp.inf else mp.mpf(0)

        def cells(t):
            F = [cdf0(x) for x in t]
            G = [g(x) for x in t]
            P = [F[i + 1] - F[i] for i in range(K)]
            return P, [(G[i] - G[i + 1]) / P[i] for i in range(K)]

        # companding start: Gaussian quantiles with variance 3σ²
        c = [sig * mp.sqrt(3) * mp.sqrt(2) * mp.erfinv(2 * ((K + i + half) / n) - 1) for i in range(K)]
        if dist == "beta":
            c = [min(x, 1 - mp.mpf(1) / (4 * n)) for x in c]
        t = [mp.mpf(0)] + [(c[i] + c[i + 1]) / 2 for i in range(K - 1)] + [end]

        def resid(t):
            P, C = cells(t)
            return P, C, [t[j] - (C[j - 1] + C[j]) / 2 for j in range(1, K)]

        P, C, r = resid(t)
        for it in range(60):
            rn = max([abs(x) for x in r] + [mp.mpf(0)])
            if rn < mp.mpf(10) ** -32 * sig:
                break
            J = mp.zeros(K - 1, K - 1)
            for k in range(K - 1):
                j = k + 1
                up = pdf(t[j]) * (t[j] - C[j - 1]) / P[j - 1]
                lo = pdf(t[j]) * (C[j] - t[j]) / P[j]
                J[k, k] = 1 - (up + lo) / 2
                if k > 0:
                    J[k, k - 1] = -pdf(t[j - 1]) * (C[j - 1] - t[j - 1]) / P[j - 1] / 2
                if k < K - 2:
                    J[k, k + 1] = -pdf(t[j + 1]) * (t[j + 1] - C[j]) / P[j] / 2
            dx = mp.lu_solve(J, mp.matrix([-x for x in r])) if K > 1 else []
            lam = mp.mpf(1)
            while True:
                t2 = [t[0]] + [t[j] + lam * dx[j - 1] for j in range(1, K)] + [t[K]]
                ok = all(t2[i] < t2[i + 1] for i in range(K))
                if ok:
                    P2, C2, r2 = resid(t2)
                    if max([abs(x) for x in r2] + [mp.mpf(0)]) < rn:
                        t, P, C, r = t2, P2, C2, r2
                        break
                lam /= 2
                if lam < mp.mpf(2) ** -40:
                    raise RuntimeError("mp Newton stalled")
        var = mp.mpf(1) / d if dist == "beta" else mp.mpf(1)
        mse = var - 2 * sum(C[i] ** 2 * P[i] for i in range(K))
        cen = [-x for x in C[::-1]] + C
        rmax = max([abs(x) for x in r] + [mp.mpf(0)])
        out.append(dict(dist=dist, d=d, bits=bits, centroids=[mp.nstr(x, 30) for x in cen],
                        mse=mp.nstr(mse, 30), residual=mp.nstr(rmax, 5)))
        print(f"  mpmath {dist} d={d} bits={bits}: mse={mp.nstr(mse, 15)} residual={mp.nstr(rmax, 3)} "
              f"({time.time() - t0:.1f}s)", flush=True)
    return dict(method="mpmath 40 digits, Newton on the symmetric half; values as decimal strings", tables=out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smollm2", default=None)  # unused here
    ap.add_argument("--mp-only", action="store_true", help="only the mpmath references")
    a = ap.parse_args()
    d = os.path.join(a.out, "math")
    os.makedirs(d, exist_ok=True)
    try:
        import mpmath  # noqa: F401
        have_mp = True
    except ImportError:
        have_mp = False
    if have_mp:
        with open(os.path.join(d, "lloyd_max_mp.json"), "w") as f:
            json.dump(mp_tables(), f)
        print("  lloyd_max_mp.json written")
    elif a.mp_only:
        sys.exit("codebooks.py --mp-only needs mpmath")
    else:
        print("  (mpmath not importable: lloyd_max_mp.json skipped)")
    if a.mp_only:
        return
    with open(os.path.join(d, "pcg64.json"), "w") as f:
        json.dump(pcg64_oracle(), f)
    print("  pcg64.json written")
    with open(os.path.join(d, "lloyd_max.json"), "w") as f:
        json.dump(lloyd_max_oracle(), f)
    print("  lloyd_max.json written")


if __name__ == "__main__":
    main()
