//! The refits' least-squares systems (the stock types' block parameters, `stock.rs`; the
//! i-quants' scale steps, `iq_refit.rs`): the normal equations `(Cᵀ H C) p = Cᵀ H w` of every row
//! of a group, and their solution by Cholesky. Both run once per row and refit pass, for every
//! LDLQ conversion, sensitivity item, KLD probe and measured plan of the mix; on a 7B block the
//! scalar versions were 40 % of the mix's sensitivity pass (`perf`, docs/bench/mix.md).
//!
//! The fast paths compute every value with the same operations in the same order as the scalar
//! references kept beside them (tests hold them bit for bit equal), so the bytes of every
//! conversion are unchanged: the normal matrix is built by groups into each row's transpose
//! (contiguous, where the reference scattered one column of every row's matrix per group), and
//! the Cholesky runs eight rows' dot products side by side (independent sums, each in the
//! reference's order, instead of one latency-bound sum at a time).

use faer::{linalg::matmul::matmul, Accum, Mat, MatMut, MatRef, Par};
use std::borrow::Cow;

/// Rows whose Cholesky dot products run side by side in [`cholesky_solve`].
const LANES: usize = 8;

/// The damped Hessian a refit reads, natural column order: the factor's own copy (`Whole`), or
/// the caller's Hessian read through the factor's shrink and damped diagonal (`View`: `keep·H`
/// off the diagonal, `diag` on it; `factor::RefitHessian::Callers`), so that no second n×n
/// matrix is held (6.6 GB for a 70B FFN input). A view's products are GEMMs on the caller's
/// matrix scaled by `keep`, then the diagonal's correction `diag − keep·H_tt` added: no copy.
#[derive(Clone, Copy)]
pub(super) enum RefitH<'a> {
    Whole {
        n: usize,
        m: &'a [f64],
    },
    View {
        n: usize,
        base: &'a [f64],
        keep: Option<f64>,
        diag: &'a [f64],
    },
}

impl<'a> RefitH<'a> {
    /// Rows `a..b`, row-major (the scalar loops; a view makes them).
    pub(super) fn rows(&self, a: usize, b: usize) -> Cow<'a, [f64]> {
        match *self {
            RefitH::Whole { n, m } => Cow::Borrowed(&m[a * n..b * n]),
            RefitH::View {
                n,
                base,
                keep,
                diag,
            } => {
                let mut s = base[a * n..b * n].to_vec();
                for (i, row) in s.chunks_exact_mut(n).enumerate() {
                    if let Some(k) = keep {
                        row.iter_mut().for_each(|v| *v *= k);
                    }
                    row[a + i] = diag[a + i];
                }
                Cow::Owned(s)
            }
        }
    }

    /// A view's scale of the caller's off-diagonal and correction of its diagonal at `t`:
    /// `H_ts = keep·base_ts + [s = t]·(diag_t − keep·base_tt)`.
    fn view_at(keep: Option<f64>, base: &[f64], diag: &[f64], n: usize, t: usize) -> (f64, f64) {
        let k = keep.unwrap_or(1.0);
        (k, diag[t] - k * base[t * n + t])
    }

    /// `out = x · H[a..a + len, :]` (`x`: rows × len, `out`: rows × n), one GEMM.
    fn rows_times(&self, x: MatRef<f64>, a: usize, len: usize, out: MatMut<f64>) {
        match *self {
            RefitH::Whole { n, m } => {
                let hs = MatRef::from_row_major_slice(&m[a * n..(a + len) * n], len, n);
                matmul(out, Accum::Replace, x, hs, 1.0, Par::Seq);
            }
            RefitH::View {
                n,
                base,
                keep,
                diag,
            } => {
                let k = keep.unwrap_or(1.0);
                let hs = MatRef::from_row_major_slice(&base[a * n..(a + len) * n], len, n);
                let mut out = out;
                matmul(out.as_mut(), Accum::Replace, x, hs, k, Par::Seq);
                for i in 0..len {
                    let t = a + i;
                    let (_, d) = Self::view_at(keep, base, diag, n, t);
                    for r in 0..x.nrows() {
                        out[(r, t)] += x[(r, i)] * d;
                    }
                }
            }
        }
    }

    /// `out = x · H` (`x`: rows × n).
    pub(super) fn times(&self, x: MatRef<f64>, out: MatMut<f64>) {
        self.rows_times(x, 0, x.ncols(), out)
    }

    /// `Σ_{s ∈ a..b} H_ts`.
    fn row_sum(&self, t: usize, a: usize, b: usize) -> f64 {
        match *self {
            RefitH::Whole { n, m } => m[t * n + a..t * n + b].iter().sum(),
            RefitH::View {
                n,
                base,
                keep,
                diag,
            } => {
                let (k, d) = Self::view_at(keep, base, diag, n, t);
                let s: f64 = base[t * n + a..t * n + b].iter().sum();
                k * s + if (a..b).contains(&t) { d } else { 0.0 }
            }
        }
    }
}

/// The normal equations for code values `c` (rows × n): the decoded value at column `t` is
/// `p[g]·c[t] (− p[ng + g])` with `g = t / gs`, the mins only when `hm`. Per row, `(A, rhs)` with
/// `A` row-major `np × np` (`np = ng`, or `2·ng` with mins). Over a whole matrix the same
/// operations in the same order as the reference; over a view ([`RefitH`]) the same products
/// as GEMMs on the caller's matrix and a diagonal correction.
pub(super) fn normal_equations_values(
    rows: &[f32],
    h: RefitH,
    c: &Mat<f64>,
    gs: usize,
    hm: bool,
) -> Vec<(Vec<f64>, Vec<f64>)> {
    let (nr, n) = (c.nrows(), c.ncols());
    let ng = n / gs;
    let np = if hm { 2 * ng } else { ng };
    let x = Mat::<f64>::from_fn(nr, n, |r, t| rows[r * n + t] as f64);
    let mut hx = Mat::<f64>::zeros(nr, n);
    h.times(x.as_ref(), hx.as_mut());
    // Each row's matrix transposed while the groups' columns are added: column g of `A` is row
    // g here, written left to right.
    let mut res: Vec<(Vec<f64>, Vec<f64>)> = (0..nr)
        .map(|_| (vec![0f64; np * np], vec![0f64; np]))
        .collect();
    let mut mg = Mat::<f64>::zeros(nr, n);
    for g in 0..ng {
        // mg[r][t] = Σ_{s∈g} c_rs H_st: column t of H D_g (H symmetric).
        h.rows_times(c.as_ref().subcols(g * gs, gs), g * gs, gs, mg.as_mut());
        for (r, (at, _)) in res.iter_mut().enumerate() {
            let row = &mut at[g * np..(g + 1) * np];
            for t in 0..n {
                let (gt, v) = (t / gs, mg[(r, t)]);
                row[gt] += c[(r, t)] * v;
                if hm {
                    row[ng + gt] -= v;
                }
            }
        }
    }
    for (at, _) in res.iter_mut() {
        transpose_in_place(at, np);
    }
    for (r, (_, rhs)) in res.iter_mut().enumerate() {
        for t in 0..n {
            let gt = t / gs;
            rhs[gt] += c[(r, t)] * hx[(r, t)];
            if hm {
                rhs[ng + gt] -= hx[(r, t)];
            }
        }
    }
    if hm {
        // The mins' columns: Σ_{s∈g} H_ts, the same for every row.
        let mut nn = vec![0f64; ng];
        for t in 0..n {
            let gt = t / gs;
            for (g, v) in nn.iter_mut().enumerate() {
                *v = h.row_sum(t, g * gs, (g + 1) * gs);
            }
            for (r, (a, _)) in res.iter_mut().enumerate() {
                let ct = c[(r, t)];
                let (top, bottom) = a.split_at_mut(ng * np);
                let top = &mut top[gt * np + ng..(gt + 1) * np];
                let bottom = &mut bottom[gt * np + ng..(gt + 1) * np];
                for g in 0..ng {
                    top[g] -= ct * nn[g];
                    bottom[g] += nn[g];
                }
            }
        }
    }
    res
}

/// Transpose a square row-major matrix in place.
fn transpose_in_place(a: &mut [f64], n: usize) {
    for i in 0..n {
        for j in i + 1..n {
            a.swap(i * n + j, j * n + i);
        }
    }
}

/// Solve `A p = b` for a symmetric positive definite `A` (n×n, row-major, overwritten by its
/// Cholesky factor); `None` when `A` is not positive definite.
pub(super) fn cholesky_solve(a: &mut [f64], b: &[f64], n: usize) -> Option<Vec<f64>> {
    for j in 0..n {
        let (head, tail) = a.split_at_mut((j + 1) * n);
        let rj = &mut head[j * n..];
        let mut d = rj[j];
        for k in 0..j {
            d -= rj[k] * rj[k];
        }
        if d <= 0.0 || !d.is_finite() {
            return None;
        }
        let d = d.sqrt();
        rj[j] = d;
        let rj = &rj[..j];
        let mut below = tail.chunks_exact_mut(n);
        let mut lanes: Vec<&mut [f64]> = Vec::with_capacity(LANES);
        loop {
            lanes.clear();
            lanes.extend(below.by_ref().take(LANES));
            if lanes.is_empty() {
                break;
            }
            if lanes.len() == LANES {
                let mut s = [0f64; LANES];
                for (sl, row) in s.iter_mut().zip(lanes.iter()) {
                    *sl = row[j];
                }
                for (k, &x) in rj.iter().enumerate() {
                    for (sl, row) in s.iter_mut().zip(lanes.iter()) {
                        *sl -= row[k] * x;
                    }
                }
                for (sl, row) in s.iter().zip(lanes.iter_mut()) {
                    row[j] = sl / d;
                }
            } else {
                for row in lanes.iter_mut() {
                    let mut s = row[j];
                    for (k, &x) in rj.iter().enumerate() {
                        s -= row[k] * x;
                    }
                    row[j] = s / d;
                }
            }
        }
    }
    let mut y = b.to_vec();
    for i in 0..n {
        for k in 0..i {
            y[i] -= a[i * n + k] * y[k];
        }
        y[i] /= a[i * n + i];
    }
    for i in (0..n).rev() {
        for k in i + 1..n {
            y[i] -= a[k * n + i] * y[k];
        }
        y[i] /= a[i * n + i];
    }
    Some(y)
}

#[cfg(test)]
mod reference {
    use faer::{linalg::matmul::matmul, Accum, Mat, MatRef, Par};

    /// [`super::normal_equations_values`] as first written: each group's column scattered into
    /// every row's matrix.
    pub(super) fn normal_equations_values(
        rows: &[f32],
        h: &[f64],
        c: &Mat<f64>,
        gs: usize,
        hm: bool,
    ) -> Vec<(Vec<f64>, Vec<f64>)> {
        let (nr, n) = (c.nrows(), c.ncols());
        let ng = n / gs;
        let np = if hm { 2 * ng } else { ng };
        let hmat = MatRef::from_row_major_slice(h, n, n);
        let x = Mat::<f64>::from_fn(nr, n, |r, t| rows[r * n + t] as f64);
        let mut hx = Mat::<f64>::zeros(nr, n);
        matmul(hx.as_mut(), Accum::Replace, x.as_ref(), hmat, 1.0, Par::Seq);
        let mut res: Vec<(Vec<f64>, Vec<f64>)> = (0..nr)
            .map(|_| (vec![0f64; np * np], vec![0f64; np]))
            .collect();
        let mut mg = Mat::<f64>::zeros(nr, n);
        for g in 0..ng {
            matmul(
                mg.as_mut(),
                Accum::Replace,
                c.as_ref().subcols(g * gs, gs),
                hmat.subrows(g * gs, gs),
                1.0,
                Par::Seq,
            );
            for (r, (a, _)) in res.iter_mut().enumerate() {
                for t in 0..n {
                    let (gt, v) = (t / gs, mg[(r, t)]);
                    a[gt * np + g] += c[(r, t)] * v;
                    if hm {
                        a[(ng + gt) * np + g] -= v;
                    }
                }
            }
        }
        for (r, (_, rhs)) in res.iter_mut().enumerate() {
            for t in 0..n {
                let gt = t / gs;
                rhs[gt] += c[(r, t)] * hx[(r, t)];
                if hm {
                    rhs[ng + gt] -= hx[(r, t)];
                }
            }
        }
        if hm {
            let mut nn = vec![0f64; ng];
            for t in 0..n {
                let gt = t / gs;
                let hrow = &h[t * n..(t + 1) * n];
                for (g, v) in nn.iter_mut().enumerate() {
                    *v = hrow[g * gs..(g + 1) * gs].iter().sum();
                }
                for (r, (a, _)) in res.iter_mut().enumerate() {
                    let ct = c[(r, t)];
                    for g in 0..ng {
                        a[gt * np + ng + g] -= ct * nn[g];
                        a[(ng + gt) * np + ng + g] += nn[g];
                    }
                }
            }
        }
        res
    }

    /// [`super::cholesky_solve`] one dot product at a time.
    pub(super) fn cholesky_solve(a: &mut [f64], b: &[f64], n: usize) -> Option<Vec<f64>> {
        for j in 0..n {
            let mut d = a[j * n + j];
            for k in 0..j {
                d -= a[j * n + k] * a[j * n + k];
            }
            if d <= 0.0 || !d.is_finite() {
                return None;
            }
            let d = d.sqrt();
            a[j * n + j] = d;
            for i in j + 1..n {
                let mut s = a[i * n + j];
                for k in 0..j {
                    s -= a[i * n + k] * a[j * n + k];
                }
                a[i * n + j] = s / d;
            }
        }
        let mut y = b.to_vec();
        for i in 0..n {
            for k in 0..i {
                y[i] -= a[i * n + k] * y[k];
            }
            y[i] /= a[i * n + i];
        }
        for i in (0..n).rev() {
            for k in i + 1..n {
                y[i] -= a[k * n + i] * y[k];
            }
            y[i] /= a[i * n + i];
        }
        Some(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(s: &mut u64) -> f64 {
        *s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    /// A symmetric positive definite `X Xᵀ / k + λ I` (n × n), as a Hessian is.
    fn spd(n: usize, k: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        let x: Vec<f64> = (0..n * k).map(|_| lcg(&mut s)).collect();
        let mut h = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                let d: f64 = (0..k).map(|t| x[i * k + t] * x[j * k + t]).sum();
                h[i * n + j] = d / k as f64 + if i == j { 1e-3 } else { 0.0 };
            }
        }
        h
    }

    /// The grouped normal equations equal the reference bit for bit, with and without mins,
    /// for group sizes 16 and 32, rows that do not fill a lane, and codes with zeros.
    #[test]
    fn normal_equations_equal_the_reference_bit_for_bit() {
        for (n, nr, gs, hm) in [
            (128usize, 5usize, 16usize, true),
            (256, 3, 32, false),
            (96, 9, 32, true),
            (64, 1, 16, false),
        ] {
            let h = spd(n, 3 * n / 2, n as u64);
            let mut s = 7u64 + n as u64;
            let rows: Vec<f32> = (0..nr * n).map(|_| lcg(&mut s) as f32).collect();
            let c = Mat::<f64>::from_fn(nr, n, |r, t| ((r * 31 + t * 7) % 9) as f64 - 4.0);
            let whole = RefitH::Whole { n, m: &h };
            let fast = normal_equations_values(&rows, whole, &c, gs, hm);
            let slow = reference::normal_equations_values(&rows, &h, &c, gs, hm);
            assert_eq!(fast.len(), slow.len());
            for (r, ((fa, fb), (sa, sb))) in fast.iter().zip(&slow).enumerate() {
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(fa), bits(sa), "n {n} gs {gs} mins {hm} row {r}: A");
                assert_eq!(bits(fb), bits(sb), "n {n} gs {gs} mins {hm} row {r}: rhs");
            }
        }
    }

    /// Read through a view (the caller's Hessian, shrunk and with the damped diagonal: GEMMs on
    /// it and a diagonal correction) the refit's products equal those of the materialized
    /// matrix within float noise.
    #[test]
    fn a_view_of_the_callers_hessian_gives_the_materialized_products() {
        let (n, nr) = (320, 4);
        let base = spd(n, 40, 5);
        let mut s = 3u64;
        let diag: Vec<f64> = (0..n).map(|i| base[i * n + i] * 1.01 + 1e-3).collect();
        for (keep, gs, hm) in [(None, 16usize, true), (Some(0.75), 32, false)] {
            let mut m = base.clone();
            for i in 0..n {
                for j in 0..n {
                    m[i * n + j] = match (i == j, keep) {
                        (true, _) => diag[i],
                        (false, Some(k)) => m[i * n + j] * k,
                        (false, None) => m[i * n + j],
                    };
                }
            }
            let whole = RefitH::Whole { n, m: &m };
            let view = RefitH::View {
                n,
                base: &base,
                keep,
                diag: &diag,
            };
            assert_eq!(view.rows(7, 9), whole.rows(7, 9));
            let rows: Vec<f32> = (0..nr * n).map(|_| lcg(&mut s) as f32).collect();
            let c = Mat::<f64>::from_fn(nr, n, |r, t| ((r * 13 + t * 5) % 7) as f64 - 3.0);
            let a = normal_equations_values(&rows, whole, &c, gs, hm);
            let b = normal_equations_values(&rows, view, &c, gs, hm);
            let close = |x: &[f64], y: &[f64], what: &str| {
                let scale = x.iter().fold(0f64, |m, v| m.max(v.abs()));
                for (u, v) in x.iter().zip(y) {
                    assert!((u - v).abs() <= 1e-12 * scale, "{what}: {u} vs {v}");
                }
            };
            for ((aa, ab), (ba, bb)) in a.iter().zip(&b) {
                close(aa, ba, "A");
                close(ab, bb, "rhs");
            }
            let x = Mat::<f64>::from_fn(nr, n, |r, t| rows[r * n + t] as f64);
            let (mut p, mut q) = (Mat::<f64>::zeros(nr, n), Mat::<f64>::zeros(nr, n));
            whole.times(x.as_ref(), p.as_mut());
            view.times(x.as_ref(), q.as_mut());
            for r in 0..nr {
                let pr: Vec<f64> = (0..n).map(|t| p[(r, t)]).collect();
                let qr: Vec<f64> = (0..n).map(|t| q[(r, t)]).collect();
                close(&pr, &qr, "x·H");
            }
        }
    }

    /// The side-by-side Cholesky gives the reference's factor and solution bit for bit (sizes
    /// below, at and past a multiple of the lanes), and refuses what the reference refuses.
    #[test]
    fn cholesky_solve_equals_the_reference_bit_for_bit() {
        for n in [1usize, 7, 8, 9, 17, 64, 130] {
            let a0 = spd(n, n + 3, 100 + n as u64);
            let mut s = n as u64;
            let b: Vec<f64> = (0..n).map(|_| lcg(&mut s)).collect();
            let (mut fa, mut sa) = (a0.clone(), a0.clone());
            let fast = cholesky_solve(&mut fa, &b, n).expect("positive definite");
            let slow = reference::cholesky_solve(&mut sa, &b, n).expect("positive definite");
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&slow), "n {n}: solution");
            assert_eq!(bits(&fa), bits(&sa), "n {n}: factor");
            // And it solves the system.
            for i in 0..n {
                let r: f64 = (0..n).map(|k| a0[i * n + k] * fast[k]).sum::<f64>() - b[i];
                assert!(r.abs() < 1e-6, "n {n}: residual {r}");
            }
        }
        let mut bad = spd(12, 15, 3);
        bad[5 * 12 + 5] = -1.0;
        let b = vec![1.0; 12];
        assert!(cholesky_solve(&mut bad.clone(), &b, 12).is_none());
        assert!(reference::cholesky_solve(&mut bad, &b, 12).is_none());
    }
}
