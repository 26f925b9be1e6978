//! The factor LDLQ sweeps with: the input Hessian rotated into the basis the decoder rounds in
//! (TQ4_1S/TQ3_1S: the block-diagonal 32-point rotation; tq2_r/tq2_t: the whole-row rotation of
//! `types::tq2r`; stock types: none, but the columns permuted to act-order), damped, and turned
//! into the upper-triangular inverse factor `U` with `H⁻¹ = Uᵀ U` by one Cholesky and one
//! triangular inverse (the reversal trick, [`factor_owned`]).

use super::precision::{factor_f32, sweep_f64, tq_factor_f64, F32_FACTOR_ABOVE};
use crate::error::{Error, Result};
use crate::types::tq::QK;
use crate::types::{tq2r, LdlqKind, TensorType};
use faer::{Mat, Par};
use rayon::prelude::*;

/// The factor for one input dimension: `u` is n×n row-major upper triangular with
/// `(R H Rᵀ + λ·mean(diag)·I)^{-1} = Uᵀ U` — or empty, for the TQ formats' factors that keep `U`
/// in f32 only ([`Factor::u_f32`]; `precision.rs`).
#[derive(Debug)]
pub struct Factor {
    pub n: usize,
    pub u: Vec<f64>,
    /// The damped Hessian's diagonal (in the factor's basis): the per-column importance that
    /// stock block parameters are fitted with.
    pub diag: Vec<f64>,
    /// Column order of the sweep (`u` is the factor of the Hessian permuted to it), or `None`
    /// for the natural order. Stock types sweep by decreasing diagonal (act-order).
    pub perm: Option<Vec<usize>>,
    /// Damping actually used (relative to mean(diag)), after escalation.
    pub damp: f64,
    /// The damped Hessian in the natural column order (stock types with `refit > 0` only: the
    /// block parameters are refitted under it after the sweep, `stock::refit_params`).
    pub h: Option<RefitHessian>,
    /// Refit passes after the sweep (stock types; `--ldlq-refit`).
    pub refit: usize,
    /// `u` rounded to f32, made on first use by the f32 sweep ([`Factor::u_f32`]).
    pub(crate) u32: std::sync::OnceLock<Vec<f32>>,
}

/// `U` (row-major) in whichever precision the factor keeps it ([`Factor::u_ref`]), read as f64.
#[derive(Clone, Copy)]
pub(crate) enum URef<'a> {
    F64(&'a [f64]),
    F32(&'a [f32]),
}

impl URef<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            URef::F64(u) => u.len(),
            URef::F32(u) => u.len(),
        }
    }

    #[inline]
    pub(crate) fn get(&self, k: usize) -> f64 {
        match self {
            URef::F64(u) => u[k],
            URef::F32(u) => u[k] as f64,
        }
    }
}

/// Where the refit's damped Hessian ([`Factor::h`]) is.
#[derive(Debug)]
pub enum RefitHessian {
    /// Kept by the factor.
    Kept(Vec<f64>),
    /// The Hessian the factor was made from, which its caller keeps anyway and passes to the
    /// encoder with the factor (`Encoder::with_hessian`): read as `keep·H` off the diagonal and
    /// the factor's damped diagonal on it ([`factor_hessian`] above [`REFIT_VIEW_ABOVE`]
    /// columns).
    Callers { keep: Option<f64> },
}

/// Above this width [`factor_hessian`] keeps no copy of the refit's Hessian but reads the
/// caller's ([`RefitHessian::Callers`]): a 70B FFN input's is 6.6 GB, a third of the mix's peak.
/// Below it the copy stays (the products over it are one GEMM, the bytes as before).
pub(crate) const REFIT_VIEW_ABOVE: usize = F32_FACTOR_ABOVE;

impl Factor {
    /// The damped Hessian the refit reads, when the factor has one: its own copy, or `base` (the
    /// Hessian the factor was made from) read through the shrink and the damped diagonal.
    /// Panics when the factor reads its caller's Hessian and none is given: a caller of
    /// [`factor_hessian`] passes its Hessian along (`Encoder::with_hessian`).
    pub(super) fn refit_hessian<'a>(
        &'a self,
        base: Option<&'a [f64]>,
    ) -> Option<super::normal::RefitH<'a>> {
        use super::normal::RefitH;
        let n = self.n;
        match self.h.as_ref()? {
            RefitHessian::Kept(m) => Some(RefitH::Whole { n, m }),
            RefitHessian::Callers { keep } => Some(RefitH::View {
                n,
                base: base.filter(|b| b.len() == n * n).expect(
                    "a factor that reads its caller's Hessian is given it (Encoder::with_hessian)",
                ),
                keep: *keep,
                diag: &self.diag,
            }),
        }
    }

    /// The refit's Hessian when the factor keeps it (tests).
    #[cfg(test)]
    pub(crate) fn kept_hessian(&self) -> Option<&[f64]> {
        match self.h.as_ref()? {
            RefitHessian::Kept(m) => Some(m),
            RefitHessian::Callers { .. } => None,
        }
    }

    /// `U` as the f64 sweeps read it: the f64 copy, or the f32 one the factor keeps instead
    /// ([`factor_for_sweep`] above [`F32_FACTOR_ABOVE`] columns: the same values, widened).
    pub(crate) fn u_ref(&self) -> URef<'_> {
        if self.u.is_empty() {
            URef::F32(self.u_f32())
        } else {
            URef::F64(&self.u)
        }
    }

    /// `u` rounded to f32 (computed once, then shared by every tensor that uses this factor).
    pub(crate) fn u_f32(&self) -> &[f32] {
        self.u32
            .get_or_init(|| self.u.par_iter().map(|&v| v as f32).collect())
    }
}

/// `h` with its diagonal replaced by the damped one the factor used.
fn damped(mut h: Vec<f64>, n: usize, diag: &[f64]) -> Vec<f64> {
    for (i, &d) in diag.iter().enumerate() {
        h[i * n + i] = d;
    }
    h
}

/// `R H Rᵀ` with `R` the block-diagonal 32-point forward rotation of the TQ formats (exact, f64):
/// [`rotate_hessian_in_place`] on a copy (tests).
#[cfg(test)]
pub(crate) fn rotate_hessian(h: &[f64], n: usize) -> Vec<f64> {
    let mut a = h.to_vec();
    rotate_hessian_in_place(&mut a, n);
    a
}

/// [`rotate_hessian`] without a copy: a 70B model's FFN-input Hessian is 6.6 GB in f64, so the
/// rotation must not hold two or three of them (rows, then columns gathered 32 rows at a time).
pub fn rotate_hessian_in_place(a: &mut [f64], n: usize) {
    assert_eq!(a.len(), n * n);
    assert_eq!(n % QK, 0);
    // Rotate every row (as a vector of 32-blocks), then every column: R·(H Rᵀ).
    a.par_chunks_mut(n).for_each(rotate_vec);
    a.par_chunks_mut(QK * n).for_each(|strip| {
        let mut col = [0f64; QK];
        for j in 0..n {
            for (i, c) in col.iter_mut().enumerate() {
                *c = strip[i * n + j];
            }
            rotate_vec(&mut col);
            for (i, c) in col.iter().enumerate() {
                strip[i * n + j] = *c;
            }
        }
    });
}

/// Forward TQ rotation of every 32-block of `v`, in f64: `(1/√32) · H32 · diag(s)`.
pub fn rotate_vec(v: &mut [f64]) {
    let signs = crate::math::signs::tq_block_signs();
    let scale = 1.0 / (QK as f64).sqrt();
    for b in v.chunks_exact_mut(QK) {
        for (x, s) in b.iter_mut().zip(signs.iter()) {
            *x *= *s as f64;
        }
        let mut step = 1;
        while step < QK {
            for i in (0..QK).step_by(2 * step) {
                for j in i..i + step {
                    let (a, c) = (b[j], b[j + step]);
                    b[j] = a + c;
                    b[j + step] = a - c;
                }
            }
            step *= 2;
        }
        for x in b.iter_mut() {
            *x *= scale;
        }
    }
}

/// `R H Rᵀ` for tq2_r's rotation of length `n` (symmetrized: the f32 transform leaves
/// rounding-level asymmetry).
#[cfg(test)]
pub(crate) fn rotate_hessian_rows(h: &[f64], n: usize) -> Result<Vec<f64>> {
    let mut a = h.to_vec();
    rotate_hessian_rows_in_place(&mut a, n)?;
    Ok(a)
}

/// [`rotate_hessian_rows`] in place (one n×n matrix alive, not four).
pub(crate) fn rotate_hessian_rows_in_place(h: &mut [f64], n: usize) -> Result<()> {
    let r = tq2r::rotation(n)?;
    if h.len() != n * n {
        return Err(Error::Unsupported(format!(
            "Hessian of {} entries is not {n} x {n}",
            h.len()
        )));
    }
    // Rotating a column scaled to unit max keeps the f32 transform's relative error ~1e-7.
    let rot = |v: &mut [f64]| {
        let m = v.iter().fold(0f64, |a, x| a.max(x.abs()));
        if m == 0.0 {
            v.fill(0.0);
            return;
        }
        let x: Vec<f32> = v.iter().map(|&a| (a / m) as f32).collect();
        for (o, a) in v.iter_mut().zip(r.forward(&x)) {
            *o = a as f64 * m;
        }
    };
    // A = H Rᵀ row by row (H symmetric: row i of H Rᵀ is R·H[i]); then R·A column by column, which
    // is R applied to the rows of Aᵀ: B = (R A)ᵀ.
    h.par_chunks_mut(n).for_each(rot);
    transpose_in_place(h, n);
    h.par_chunks_mut(n).for_each(rot);
    // R A is symmetric up to rounding: average it with its transpose (B[i][j] + B[j][i] is the
    // same sum either way, and the diagonal is unchanged).
    for i in 0..n {
        for j in i + 1..n {
            let s = 0.5 * (h[j * n + i] + h[i * n + j]);
            h[i * n + j] = s;
            h[j * n + i] = s;
        }
    }
    Ok(())
}

fn transpose_in_place(a: &mut [f64], n: usize) {
    for i in 0..n {
        for j in i + 1..n {
            a.swap(i * n + j, j * n + i);
        }
    }
}

/// Shrink the Hessian towards its diagonal: `H ← (1 − s)·H + s·diag(H)`, i.e. every off-diagonal
/// entry scaled by `1 − s` (`s` clamped to [0, 1]; `s = 0` leaves `h` untouched, bit for bit).
/// The off-diagonal correlations of a Hessian from a few thousand tokens are what LDLQ's error
/// feedback exploits and what held-out text does not share; the diagonal (llama.cpp's imatrix)
/// is estimated far better. `s = 1` is diagonal-only weighting: no feedback at all.
pub fn shrink_to_diagonal(h: &mut [f64], n: usize, s: f64) {
    assert_eq!(h.len(), n * n);
    let Some(keep) = shrink_keep(s) else {
        return;
    };
    h.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        for (j, v) in row.iter_mut().enumerate() {
            if j != i {
                *v *= keep;
            }
        }
    });
}

/// The factor [`shrink_to_diagonal`] scales the off-diagonal by for shrinkage `s`; None: no change.
fn shrink_keep(s: f64) -> Option<f64> {
    (s > 0.0 && !s.is_nan()).then(|| 1.0 - s.min(1.0))
}

/// Damp and factor a (rotated) Hessian. Escalates λ ×10 (up to 6 times) when Cholesky fails and
/// says so with the tensor named.
pub fn factor(h: &[f64], n: usize, damp: f64, what: &str) -> Result<Factor> {
    factor_owned(h.to_vec(), n, damp, what)
}

/// [`factor`] taking the Hessian by value, so that at most two n×n f64 matrices are alive at any
/// point (the Hessian and the matrix being factored, then the factor and its inverse): the
/// Cholesky runs in place and the Hessian is dropped as soon as it succeeds.
/// Above [`F32_FACTOR_ABOVE`] columns the factor is computed in f32 (memory; `precision.rs`).
pub fn factor_owned(h: Vec<f64>, n: usize, damp: f64, what: &str) -> Result<Factor> {
    factor_owned_above(h, n, damp, what, F32_FACTOR_ABOVE, false)
}

/// [`factor_owned`] for the sweeps that read `U` through [`Factor::u_ref`] (stock act-order,
/// the i-quants): an f32 factor keeps `U` in f32 only — the values it would widen to f64 are the
/// same — so a 28,672-wide one holds 3.3 GB instead of 6.6.
pub(crate) fn factor_for_sweep(h: Vec<f64>, n: usize, damp: f64, what: &str) -> Result<Factor> {
    factor_owned_above(h, n, damp, what, F32_FACTOR_ABOVE, true)
}

/// [`factor_owned`] with the width above which it is f32 given (tests use small widths), and
/// whether an f32 factor keeps `U` in f32 only.
fn factor_owned_above(
    h: Vec<f64>,
    n: usize,
    damp: f64,
    what: &str,
    f32_above: usize,
    u32_only: bool,
) -> Result<Factor> {
    let prec = if factor_f32() || n > f32_above {
        Prec::F32
    } else {
        Prec::F64
    };
    factor_with(h, n, damp, what, prec, u32_only && prec == Prec::F32)
}

/// The precision of the Cholesky and the triangular inverse (the switches and the measurements
/// behind the defaults: `precision.rs`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Prec {
    F32,
    F64,
}

/// `U` as it comes out of the inverse: f64, or rounded to f32 (then only the f32 copy is kept).
pub(crate) enum UOut {
    F64(Vec<f64>),
    F32(Vec<f32>),
}

/// [`factor_owned`] with the factor's precision given, and with `u_f32_only` the factor keeping
/// `U` in f32 only (`Factor::u` empty, [`Factor::u_f32`] set): the TQ formats' f32 sweep reads
/// nothing else, and at a 70B FFN width the f64 `U` is 6.6 GB.
pub(crate) fn factor_with(
    h: Vec<f64>,
    n: usize,
    damp: f64,
    what: &str,
    prec: Prec,
    u_f32_only: bool,
) -> Result<Factor> {
    if let Some(i) = h.iter().position(|v| !v.is_finite()) {
        return Err(Error::Unsupported(format!(
            "{what}: Hessian has a non-finite entry at ({}, {}); recalibrate (NaN/Inf in activations)",
            i / n,
            i % n
        )));
    }
    let mean_diag = (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64;
    let mean_diag = if mean_diag > 0.0 { mean_diag } else { 1.0 };
    let mut lambda = damp;
    // The f32 factor reads the Hessian rounded to f32 (the diagonal, where the damping shift is
    // added, in f64): narrowed in place, the retry source is half the size of the f64 matrix.
    let mut src = match prec {
        Prec::F32 => Some(Source::F32(Narrowed::new(h, n))),
        Prec::F64 => Some(Source::F64(h)),
    };
    for attempt in 0..7 {
        let shift = lambda * mean_diag;
        let diag = match src.as_ref().expect("kept until the Cholesky succeeds") {
            Source::F32(h) => h.diag.iter().map(|d| d + shift).collect(),
            Source::F64(hh) => (0..n).map(|i| hh[i * n + i] + shift).collect(),
        };
        let Some(u) = (match prec {
            Prec::F32 => inverse_factor_f32(&mut src, n, shift, u_f32_only),
            Prec::F64 => inverse_factor_f64(&mut src, n, shift, u_f32_only),
        }) else {
            lambda *= 10.0;
            continue;
        };
        if attempt > 0 {
            eprintln!(
                "tq: {what}: Hessian not positive definite; damping raised to {lambda:.3e}·mean(diag)"
            );
        }
        let (u, u32) = match u {
            UOut::F64(u) => (u, std::sync::OnceLock::new()),
            UOut::F32(v) => (Vec::new(), std::sync::OnceLock::from(v)),
        };
        return Ok(Factor {
            n,
            u,
            diag,
            perm: None,
            damp: lambda,
            h: None,
            refit: 0,
            u32,
        });
    }
    Err(Error::Unsupported(format!(
        "{what}: Hessian is not positive definite even with damping {lambda:.1e}; recalibrate with more tokens"
    )))
}

/// What a factorization is computed from, kept until its Cholesky succeeds (a failed one is
/// retried with more damping from the same values).
enum Source {
    F64(Vec<f64>),
    F32(Narrowed),
}

/// An n×n f64 matrix rounded to f32 in its own allocation: two f32 bit patterns per f64 slot (in
/// safe Rust, no reinterpreting casts), the tail freed, the diagonal kept in f64 beside it. At a
/// 70B FFN width this is 3.3 GB where the f64 matrix was 6.6 GB, so the f32 factorization peaks
/// at two f32 matrices (this and the factor) instead of the f64 matrix plus one.
pub(crate) struct Narrowed {
    packed: Vec<f64>,
    diag: Vec<f64>,
}

impl Narrowed {
    pub(crate) fn new(mut h: Vec<f64>, n: usize) -> Narrowed {
        let diag = (0..n).map(|i| h[i * n + i]).collect();
        let len = h.len();
        let half = len.div_ceil(2);
        // Slot k takes values 2k and 2k+1: both are read before any write reaches them (k ≤ 2k).
        // `v + 0.0` (−0.0 to +0.0) before rounding, as the factor's sum with a zero shift did.
        let narrow = |v: f64| (v + 0.0) as f32;
        for k in 0..half {
            let lo = narrow(h[2 * k]).to_bits() as u64;
            let hi = h.get(2 * k + 1).map_or(0, |&v| narrow(v).to_bits() as u64);
            h[k] = f64::from_bits(lo | (hi << 32));
        }
        h.truncate(half);
        h.shrink_to_fit();
        Narrowed { packed: h, diag }
    }

    /// Value `k` (row-major), rounded to f32.
    #[inline]
    pub(crate) fn get(&self, k: usize) -> f32 {
        f32::from_bits((self.packed[k / 2].to_bits() >> (32 * (k & 1))) as u32)
    }
}

/// `U[i][j] = Linv[n−1−i][n−1−j]` for `j ≥ i` (the reversal; the lower part of `Linv`), zero below,
/// in f64 or rounded to f32 (the same values as rounding the f64 `U`).
fn reversed_upper<E: Copy + Send + Sync>(
    linv: &Mat<E>,
    n: usize,
    f32_only: bool,
    to64: impl Fn(E) -> f64 + Sync,
) -> UOut {
    if f32_only {
        let mut u = vec![0f32; n * n];
        u.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            for j in i..n {
                row[j] = to64(linv[(n - 1 - i, n - 1 - j)]) as f32;
            }
        });
        UOut::F32(u)
    } else {
        let mut u = vec![0f64; n * n];
        u.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            for j in i..n {
                row[j] = to64(linv[(n - 1 - i, n - 1 - j)]);
            }
        });
        UOut::F64(u)
    }
}

/// `U` (n×n row-major, upper) with `(H + shift·I)⁻¹ = Uᵀ U`, or `None` when the Cholesky fails
/// (`h` is then kept for a retry with more damping; on success it is dropped once factored).
/// Reversal trick: chol(J H J) = L Lᵀ ⇒ H = M Mᵀ with M = J L J upper ⇒ H⁻¹ = Uᵀ U, U = J L⁻¹ J.
/// Both the Cholesky and the triangular inverse run in f64.
/// With `f32_only`, `U` comes back rounded to f32 (the same values as rounding the f64 `U`).
fn inverse_factor_f64(
    h: &mut Option<Source>,
    n: usize,
    shift: f64,
    f32_only: bool,
) -> Option<UOut> {
    let Some(Source::F64(hh)) = h.as_ref() else {
        unreachable!("the f64 factor reads the f64 Hessian, kept until the Cholesky succeeds")
    };
    let mut l = Mat::<f64>::from_fn(n, n, |i, j| {
        if j > i {
            return 0.0; // only the lower triangle is read (as faer's `llt` copies it)
        }
        let (ri, rj) = (n - 1 - i, n - 1 - j);
        hh[ri * n + rj] + if i == j { shift } else { 0.0 }
    });
    let t = super::prof::start();
    let ok = cholesky_lower_in_place(&mut l);
    super::prof::add(super::prof::Phase::Cholesky, t);
    ok.ok()?;
    drop(h.take()); // at most two n×n f64 matrices alive: the factor and its inverse
    let t = super::prof::start();
    let mut linv = Mat::<f64>::zeros(n, n);
    faer::linalg::triangular_inverse::invert_lower_triangular(
        linv.as_mut(),
        l.as_ref(),
        Par::rayon(0),
    );
    drop(l);
    let u = reversed_upper(&linv, n, f32_only, |v| v);
    super::prof::add(super::prof::Phase::Inverse, t);
    Some(u)
}

/// [`inverse_factor_f64`] with the Cholesky and the triangular inverse in f32 (the Hessian
/// rounded to f32, its diagonal after the shift; `U` is widened back to f64 unless `f32_only`).
/// At most two n×n f32 matrices are alive: the narrowed Hessian and the factor until the Cholesky
/// succeeds, then the factor and its inverse.
fn inverse_factor_f32(
    h: &mut Option<Source>,
    n: usize,
    shift: f64,
    f32_only: bool,
) -> Option<UOut> {
    let Some(Source::F32(hh)) = h.as_ref() else {
        unreachable!("the f32 factor reads the narrowed Hessian, kept until the Cholesky succeeds")
    };
    use faer::dyn_stack::{MemBuffer, MemStack};
    use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch};
    let mut l = reversed_lower_f32(hh, n, shift);
    let t = super::prof::start();
    let par = faer::get_global_parallelism();
    let mut mem = MemBuffer::new(cholesky_in_place_scratch::<f32>(n, par, Default::default()));
    let ok = cholesky_in_place(
        l.as_mut(),
        Default::default(),
        par,
        MemStack::new(&mut mem),
        Default::default(),
    );
    super::prof::add(super::prof::Phase::Cholesky, t);
    ok.ok()?;
    drop(h.take());
    for j in 1..n {
        for i in 0..j {
            l[(i, j)] = 0.0;
        }
    }
    let t = super::prof::start();
    let mut linv = Mat::<f32>::zeros(n, n);
    faer::linalg::triangular_inverse::invert_lower_triangular(
        linv.as_mut(),
        l.as_ref(),
        Par::rayon(0),
    );
    drop(l);
    let u = reversed_upper(&linv, n, f32_only, |v| v as f64);
    super::prof::add(super::prof::Phase::Inverse, t);
    Some(u)
}

/// The lower triangle of `J (H + shift·I) J` (J the reversal) in f32, what the f32 Cholesky
/// factors in place: the off-diagonal as narrowed, the diagonal shifted in f64 and then rounded.
fn reversed_lower_f32(hh: &Narrowed, n: usize, shift: f64) -> Mat<f32> {
    Mat::<f32>::from_fn(n, n, |i, j| {
        if j > i {
            return 0.0;
        }
        let (ri, rj) = (n - 1 - i, n - 1 - j);
        if i == j {
            (hh.diag[ri] + shift) as f32
        } else {
            hh.get(ri * n + rj)
        }
    })
}

/// Damp and factor `h` permuted to decreasing diagonal (ties by index: deterministic), for the
/// stock types' act-order sweep; `diag` stays in the natural order (it weights the block fits).
pub fn factor_act_order(
    h: Vec<f64>,
    n: usize,
    damp: f64,
    refit: usize,
    what: &str,
) -> Result<Factor> {
    let (perm, hp) = act_order_permuted(&h, n, None);
    // Kept for the refit (a third n×n matrix alive while factoring), damped below as the factor
    // was; without a refit it is freed before factoring.
    let hn = (refit > 0).then_some(h);
    let mut f = in_act_order(factor_for_sweep(hp, n, damp, what)?, perm);
    f.h = hn.map(|hn| RefitHessian::Kept(damped(hn, n, &f.diag)));
    f.refit = refit;
    Ok(f)
}

/// The act-order permutation of `h` (columns by decreasing diagonal, ties by index:
/// deterministic) and `h` permuted to it, its off-diagonal scaled by `keep` when given (what
/// [`shrink_to_diagonal`] does, so that a borrowed Hessian need not be shrunk in a copy first).
fn act_order_permuted(h: &[f64], n: usize, keep: Option<f64>) -> (Vec<usize>, Vec<f64>) {
    let mut perm: Vec<usize> = (0..n).collect();
    perm.sort_by(|&a, &b| h[b * n + b].total_cmp(&h[a * n + a]).then(a.cmp(&b)));
    let mut hp = vec![0f64; n * n];
    hp.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        for (j, v) in row.iter_mut().enumerate() {
            let x = h[perm[i] * n + perm[j]];
            *v = match keep {
                Some(k) if i != j => x * k,
                _ => x,
            };
        }
    });
    (perm, hp)
}

/// `f`, the factor of a Hessian permuted by `perm`, with its diagonal back in the natural order
/// (it weights the block fits) and the permutation recorded for the sweep.
fn in_act_order(mut f: Factor, perm: Vec<usize>) -> Factor {
    let mut diag = vec![0f64; f.n];
    for (i, &pi) in perm.iter().enumerate() {
        diag[pi] = f.diag[i];
    }
    f.diag = diag;
    f.perm = Some(perm);
    f
}

/// Whether `ty`'s factor keeps the damped Hessian for a refit after the sweep: the stock types
/// (`stock::refit_params`) and the IQ2/IQ3 grids (`iq_refit`) when `refit > 0`; never IQ1_S/IQ1_M.
pub(crate) fn keeps_refit_hessian(ty: TensorType, refit: usize) -> bool {
    refit > 0
        && match ty.ldlq() {
            Some(LdlqKind::Stock) => true,
            Some(LdlqKind::Lattice | LdlqKind::IqGrid) => {
                !matches!(ty, TensorType::IQ1S | TensorType::IQ1M)
            }
            _ => false,
        }
}

/// faer's `Mat::llt(Side::Lower)` without its copy of the input: the same kernel, parameters and
/// parallelism (so the same bits), with the strict upper triangle zeroed as `Llt::L` returns it.
fn cholesky_lower_in_place(l: &mut Mat<f64>) -> std::result::Result<(), ()> {
    use faer::dyn_stack::{MemBuffer, MemStack};
    use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch};
    let par = faer::get_global_parallelism();
    let n = l.nrows();
    let mut mem = MemBuffer::new(cholesky_in_place_scratch::<f64>(n, par, Default::default()));
    let stack = MemStack::new(&mut mem);
    cholesky_in_place(
        l.as_mut(),
        Default::default(),
        par,
        stack,
        Default::default(),
    )
    .map_err(|_| ())?;
    for j in 1..n {
        for i in 0..j {
            l[(i, j)] = 0.0;
        }
    }
    Ok(())
}

/// Shrink towards the diagonal ([`shrink_to_diagonal`], `shrink` 0: none), rotate (with the
/// rotation of `ty`'s decoder), damp and factor one calibration Hessian (what `tq convert --calib`
/// and sequential calibration do for every Hessian group). Above [`REFIT_VIEW_ABOVE`] columns a
/// factor with a refit reads `h` itself for it ([`RefitHessian::Callers`]): pass `h.h` to the
/// encoder with the factor.
pub fn factor_hessian(
    ty: TensorType,
    h: &crate::quant::Hessian,
    damp: f64,
    shrink: f64,
    refit: usize,
    what: &str,
) -> Result<Factor> {
    factor_hessian_viewing_above(ty, h, damp, shrink, refit, what, REFIT_VIEW_ABOVE)
}

/// [`factor_hessian`] with the width above which the refit reads the caller's Hessian given
/// (tests force it).
pub(crate) fn factor_hessian_viewing_above(
    ty: TensorType,
    h: &crate::quant::Hessian,
    damp: f64,
    shrink: f64,
    refit: usize,
    what: &str,
    view_above: usize,
) -> Result<Factor> {
    let n = h.n;
    if !keeps_refit_hessian(ty, refit) || h.h.len() != n * n {
        return factor_hessian_owned(ty, h.h.clone(), n, damp, shrink, refit, what);
    }
    // A factor that keeps the damped Hessian for the refit, from a Hessian the caller keeps: the
    // kept copy is made after the factorization, not beside it (the owned path holds it from
    // the start), so the peak is the caller's matrix plus two, not three; above `view_above`
    // no copy is kept at all (a 70B FFN input: 13.2 GB, not 19.8). The same values as the owned
    // path: shrinking is `v × keep` either way.
    super::prof::count_factor();
    let mut f = if ty.ldlq() == Some(LdlqKind::Stock) {
        let (perm, hp) = act_order_permuted(&h.h, n, shrink_keep(shrink));
        in_act_order(factor_for_sweep(hp, n, damp, what)?, perm)
    } else {
        let mut a = h.h.clone();
        shrink_to_diagonal(&mut a, n, shrink);
        factor_for_sweep(a, n, damp, what)?
    };
    f.h = Some(if n > view_above {
        RefitHessian::Callers {
            keep: shrink_keep(shrink),
        }
    } else {
        let mut hn = h.h.clone();
        shrink_to_diagonal(&mut hn, n, shrink);
        RefitHessian::Kept(damped(hn, n, &f.diag))
    });
    f.refit = refit;
    Ok(f)
}

/// [`factor_hessian`] consuming the Hessian's matrix: rotation in place, then [`factor_owned`], so
/// the peak is two n×n f64 matrices (13 GB for a 70B model's FFN input, not five or six).
pub fn factor_hessian_owned(
    ty: TensorType,
    mut h: Vec<f64>,
    n: usize,
    damp: f64,
    shrink: f64,
    refit: usize,
    what: &str,
) -> Result<Factor> {
    super::prof::count_factor();
    let t = super::prof::start();
    if h.len() == n * n {
        shrink_to_diagonal(&mut h, n, shrink);
    }
    match ty.ldlq() {
        Some(LdlqKind::Stock) => return factor_act_order(h, n, damp, refit, what),
        Some(LdlqKind::RowRotated | LdlqKind::Trellis) => rotate_hessian_rows_in_place(&mut h, n)?,
        // The i-quant grid types: the weights' own basis, natural order; the IQ2/IQ3 scale refit
        // keeps the damped Hessian (`iq_refit`).
        Some(LdlqKind::Lattice | LdlqKind::IqGrid) => {
            if keeps_refit_hessian(ty, refit) {
                super::prof::add(super::prof::Phase::Rotate, t);
                let hn = h.clone();
                let mut f = factor_for_sweep(h, n, damp, what)?;
                f.h = Some(RefitHessian::Kept(damped(hn, n, &f.diag)));
                f.refit = refit;
                return Ok(f);
            }
        }
        Some(LdlqKind::Rotated) => {
            rotate_hessian_in_place(&mut h, n);
            super::prof::add(super::prof::Phase::Rotate, t);
            // The f32 sweep reads `U` in f32 only; its factor is f32 unless asked for f64.
            if !sweep_f64() {
                let prec = if tq_factor_f64() {
                    Prec::F64
                } else {
                    Prec::F32
                };
                return factor_with(h, n, damp, what, prec, true);
            }
            return factor_owned(h, n, damp, what);
        }
        None => rotate_hessian_in_place(&mut h, n),
    }
    super::prof::add(super::prof::Phase::Rotate, t);
    match ty.ldlq() {
        Some(LdlqKind::Lattice | LdlqKind::IqGrid) => factor_for_sweep(h, n, damp, what),
        _ => factor_owned(h, n, damp, what),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{hessian, lcg};
    use super::*;
    use crate::types::tq;

    /// `shrink_to_diagonal`: 0 leaves the bits alone, s scales the off-diagonal by 1 − s and keeps
    /// the diagonal, 1 (and above) leaves the diagonal only; a shrunk Hessian still factors.
    #[test]
    fn shrink_pulls_the_off_diagonal_towards_zero() {
        let n = 48;
        let h = hessian(n, 30, 9); // 30 tokens < 48 dims: singular before damping
        let mut h0 = h.clone();
        shrink_to_diagonal(&mut h0, n, 0.0);
        assert!(h0.iter().zip(&h).all(|(a, b)| a.to_bits() == b.to_bits()));
        for s in [0.25, 1.0, 3.0] {
            let mut hs = h.clone();
            shrink_to_diagonal(&mut hs, n, s);
            for i in 0..n {
                for j in 0..n {
                    let want = if i == j {
                        h[i * n + j]
                    } else {
                        h[i * n + j] * (1.0 - f64::min(s, 1.0))
                    };
                    assert_eq!(hs[i * n + j], want, "s {s} ({i}, {j})");
                }
            }
            // Shrinking keeps the matrix positive semi-definite (a convex combination of two such
            // matrices): it factors with the default damping and no escalation.
            let f = factor(&hs, n, 0.01, "t").unwrap();
            assert_eq!(f.damp, 0.01, "s {s}");
        }
    }

    /// The factor of a borrowed Hessian (no copy held beside the factorization) is the owned
    /// path's, bit for bit, for every kind: act-order with and without the refit's kept
    /// Hessian, the i-quants' natural order with it, IQ1 without it, the rotated kinds.
    #[test]
    fn borrowed_factor_equals_the_owned_one() {
        let n = 256;
        let h = crate::quant::Hessian {
            tensors: vec!["t".into()],
            n,
            h: hessian(n, 300, 5),
            tokens: 300,
        };
        let tys = [
            TensorType::Q4K,
            TensorType::Q6K,
            TensorType::IQ4XS,
            TensorType::IQ2XS,
            TensorType::IQ1S,
            TensorType::TQ4_1S,
        ];
        let mut kept = 0;
        for ty in tys {
            for (shrink, refit) in [(0.0, 0), (0.0, 2), (0.3, 2), (0.3, 0)] {
                let a = factor_hessian(ty, &h, 0.01, shrink, refit, "t").unwrap();
                let b = factor_hessian_owned(ty, h.h.clone(), n, 0.01, shrink, refit, "t").unwrap();
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let what = format!("{ty:?} shrink {shrink} refit {refit}");
                assert_eq!(bits(&a.u), bits(&b.u), "{what}: u");
                assert_eq!(bits(&a.diag), bits(&b.diag), "{what}: diag");
                assert_eq!(a.perm, b.perm, "{what}: perm");
                assert_eq!(
                    a.kept_hessian().map(bits),
                    b.kept_hessian().map(bits),
                    "{what}: h"
                );
                assert_eq!((a.damp, a.refit), (b.damp, b.refit), "{what}");
                assert_eq!(a.u32.get(), b.u32.get(), "{what}: u32");
                kept += a.kept_hessian().is_some() as usize;
            }
        }
        assert!(
            kept >= 6,
            "the kept-Hessian path was not exercised ({kept})"
        );
    }

    /// An f32 factor of the stock and i-quant sweeps keeps `U` in f32 only (the wide path, forced
    /// here at 256 columns): the sweeps read the same values widened, so the bytes equal those
    /// of the factor that also keeps the widened f64 copy, refit included.
    #[test]
    fn an_f32_only_u_encodes_as_its_widened_copy() {
        use super::super::quantize_ldlq;
        let n = 256;
        let h = hessian(n, 300, 4);
        let mut s = 5;
        let w: Vec<f32> = (0..16 * n).map(|_| lcg(&mut s) as f32).collect();
        for ty in [
            TensorType::Q4K,
            TensorType::Q5_0,
            TensorType::IQ2XS,
            TensorType::IQ3S,
        ] {
            let stock = ty.ldlq() == Some(LdlqKind::Stock);
            let (perm, hp) = act_order_permuted(&h, n, None);
            let make = |u32_only: bool| {
                let src = if stock { hp.clone() } else { h.clone() };
                let mut f = factor_owned_above(src, n, 0.01, "t", 0, u32_only).unwrap();
                if stock {
                    f = in_act_order(f, perm.clone());
                }
                f.h = Some(RefitHessian::Kept(damped(h.clone(), n, &f.diag)));
                f.refit = 2;
                f
            };
            let (wide, only) = (make(false), make(true));
            assert_eq!(wide.u.len(), n * n, "{ty}");
            assert!(
                only.u.is_empty() && matches!(only.u_ref(), URef::F32(_)),
                "{ty}"
            );
            assert!(wide
                .u
                .iter()
                .zip(only.u_f32())
                .all(|(a, b)| *a == *b as f64));
            assert_eq!(
                quantize_ldlq(ty, &w, n, &wide, 0),
                quantize_ldlq(ty, &w, n, &only, 0),
                "{ty}"
            );
        }
    }

    /// A factor whose refit reads its caller's Hessian (the wide path, forced here) encodes
    /// what the factor with its own copy encodes: the refit's sums then run in another order, so
    /// the bytes are only required equal at n 256 (they are, for these inputs) and the
    /// Hessian-weighted error equal within float noise at n 1280, for the stock act-order sweep
    /// with and without mins, and the IQ2/IQ3 scale refits.
    #[test]
    fn a_refit_reading_the_callers_hessian_encodes_as_a_kept_copy() {
        use super::super::{proxy_loss, quantize_ldlq, quantize_ldlq_given};
        for (n, rows) in [(256usize, 12usize), (1280, 4)] {
            let h = crate::quant::Hessian {
                tensors: vec!["t".into()],
                n,
                h: hessian(n, n + 64, 3),
                tokens: 300,
            };
            let mut s = 9;
            let w: Vec<f32> = (0..rows * n).map(|_| lcg(&mut s) as f32).collect();
            for ty in [
                TensorType::Q4K,
                TensorType::Q6K,
                TensorType::IQ2XS,
                TensorType::IQ3S,
            ] {
                for shrink in [0.0, 0.3] {
                    let what = format!("{ty:?} n {n} shrink {shrink}");
                    let kept = factor_hessian(ty, &h, 0.01, shrink, 2, "t").unwrap();
                    let view =
                        factor_hessian_viewing_above(ty, &h, 0.01, shrink, 2, "t", 0).unwrap();
                    assert!(kept.kept_hessian().is_some(), "{what}");
                    assert!(
                        matches!(view.h, Some(RefitHessian::Callers { .. })),
                        "{what}"
                    );
                    let a = quantize_ldlq(ty, &w, n, &kept, 0);
                    let b = quantize_ldlq_given(ty, &w, n, &view, 0, Some(&h.h));
                    if n <= 512 {
                        assert_eq!(a, b, "{what}");
                        continue;
                    }
                    let dec = |q: &[u8]| {
                        let mut x = vec![0f32; w.len()];
                        crate::types::dequantize(ty, q, &mut x, "t").unwrap();
                        x
                    };
                    let (la, lb) = (
                        proxy_loss(&h.h, n, &w, &dec(&a)),
                        proxy_loss(&h.h, n, &w, &dec(&b)),
                    );
                    assert!((la - lb).abs() <= 1e-6 * la, "{what}: {la} vs {lb}");
                }
            }
        }
    }

    #[test]
    fn reversal_trick_gives_inverse_factor() {
        let n = 64;
        let h = hessian(n, 200, 1);
        let f = factor(&h, n, 0.0, "t").unwrap();
        // Uᵀ U H = I.
        let mut max = 0f64;
        for i in 0..n {
            for j in 0..n {
                let mut s = 0f64;
                for k in 0..n {
                    let mut utu = 0f64;
                    for m in 0..=i.min(k) {
                        utu += f.u[m * n + i] * f.u[m * n + k];
                    }
                    s += utu * h[k * n + j];
                }
                max = max.max((s - if i == j { 1.0 } else { 0.0 }).abs());
            }
            for j in 0..i {
                assert_eq!(f.u[i * n + j], 0.0, "U is upper triangular");
            }
        }
        assert!(max < 1e-8, "UᵀU H - I max {max}");
    }

    #[test]
    fn rotation_is_orthonormal() {
        let mut s = 5;
        let v: Vec<f64> = (0..96).map(|_| lcg(&mut s)).collect();
        let mut r = v.clone();
        rotate_vec(&mut r);
        let n0: f64 = v.iter().map(|x| x * x).sum();
        let n1: f64 = r.iter().map(|x| x * x).sum();
        assert!((n0 - n1).abs() < 1e-12 * n0);
        // Matches the engine's f32 forward rotation.
        let mut b = [0f32; 32];
        for (x, y) in b.iter_mut().zip(&v) {
            *x = *y as f32;
        }
        tq::forward_rotate(&mut b);
        for (x, y) in b.iter().zip(&r) {
            assert!((*x as f64 - y).abs() < 1e-6);
        }
    }

    #[test]
    fn bad_hessians_are_named_errors() {
        let n = 32;
        let mut h = vec![0f64; n * n];
        h[5] = f64::NAN;
        let e = factor(&h, n, 0.01, "blk.3.attn_q.weight")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("blk.3.attn_q.weight") && e.contains("non-finite"),
            "{e}"
        );
        // An all-zero Hessian is rescued by damping (identity).
        let z = vec![0f64; n * n];
        assert!(factor(&z, n, 0.01, "x").is_ok());
    }

    /// In-place rotation and factoring give the bits of the copying versions they replaced.
    #[test]
    fn in_place_rotation_matches_the_transposing_one() {
        let n = 96;
        let h = hessian(n, 200, 4);
        let mut a = h.clone();
        a.chunks_mut(n).for_each(rotate_vec);
        let mut t = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                t[j * n + i] = a[i * n + j];
            }
        }
        t.chunks_mut(n).for_each(rotate_vec);
        let mut want = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                want[j * n + i] = t[i * n + j];
            }
        }
        assert!(rotate_hessian(&h, n) == want);
    }

    /// The f32 factor (an experiment behind `TQ_LDLQ_FACTOR_F32`) against the f64 one on a
    /// correlated Hessian of the TQ4_1S basis, 1% damping: `U` within 1e-4 of max|U| entrywise, and
    /// the TQ4_1S full-band proxy loss tr(ΔW H ΔWᵀ) within 1% (tolerances stated here, measured
    /// errors are far below them); and its bits do not depend on the thread count.
    #[test]
    fn f32_factor_agrees_with_f64_and_is_thread_independent() {
        let (n, rows) = (384, 8);
        let h = rotate_hessian(&hessian(n, 600, 9), n);
        let shift = 0.01 * (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64;
        let wide = |u: UOut| match u {
            UOut::F64(u) => u,
            UOut::F32(_) => unreachable!("asked for f64"),
        };
        let u64_ =
            wide(inverse_factor_f64(&mut Some(Source::F64(h.clone())), n, shift, false).unwrap());
        let in_pool = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let src = Source::F32(Narrowed::new(h.clone(), n));
                wide(inverse_factor_f32(&mut Some(src), n, shift, false).unwrap())
            })
        };
        let u32_ = in_pool(1);
        assert!(
            in_pool(2) == u32_,
            "f32 factor differs between 1 and 2 threads"
        );
        let max = u64_.iter().fold(0f64, |a, x| a.max(x.abs()));
        let err = u64_
            .iter()
            .zip(&u32_)
            .fold(0f64, |a, (x, y)| a.max((x - y).abs()));
        assert!(err < 1e-4 * max, "|U32 - U64| {err:e} vs max|U| {max:e}");
        // Proxy loss of TQ4_1S full-band LDLQ with either factor (H in the natural basis).
        let h0 = hessian(n, 600, 9);
        let mut s = 3;
        let w: Vec<f32> = (0..rows * n).map(|_| lcg(&mut s) as f32 * 0.05).collect();
        let loss = |u: Vec<f64>| {
            let diag = (0..n).map(|i| h[i * n + i] + shift).collect();
            let f = Factor {
                n,
                u,
                diag,
                perm: None,
                damp: 0.01,
                h: None,
                refit: 0,
                u32: Default::default(),
            };
            let q = super::super::quantize_ldlq(TensorType::TQ4_1S, &w, n, &f, 0);
            let mut y = vec![0f32; w.len()];
            crate::types::dequantize_rows(TensorType::TQ4_1S, &q, &mut y, n, "w").unwrap();
            super::super::proxy_loss(&h0, n, &w, &y)
        };
        let (l64, l32) = (loss(u64_), loss(u32_));
        assert!(
            (l32 - l64).abs() < 0.01 * l64,
            "proxy loss f32 {l32:e} vs f64 {l64:e}"
        );
        eprintln!(
            "proxy loss f64 {l64:e}, f32 {l32:e}, |dU|/max|U| {:e}",
            err / max
        );
    }

    /// The Hessian narrowed in place gives the f32 Cholesky exactly the matrix it was given
    /// before narrowing existed, `((h + shift·δ) as f32)` from the f64 matrix — −0.0, values
    /// below f32's range, an odd number of entries and a retry's larger shift included — in half
    /// the memory.
    #[test]
    fn narrowed_hessian_gives_the_f32_factor_the_same_matrix() {
        let n = 37; // n² odd: the last slot holds one value
        let mut h = hessian(n, 80, 4);
        h[n + 2] = -0.0;
        h[2 * n + 1] = -0.0;
        h[3 * n + 5] = -1e-50;
        h[5 * n + 3] = -1e-50;
        h[4 * n + 6] = 1e-300;
        h[6 * n + 4] = 1e-300;
        let before = |shift: f64| {
            Mat::<f32>::from_fn(n, n, |i, j| {
                if j > i {
                    return 0.0;
                }
                let (ri, rj) = (n - 1 - i, n - 1 - j);
                (h[ri * n + rj] + if i == j { shift } else { 0.0 }) as f32
            })
        };
        let narrowed = Narrowed::new(h.clone(), n);
        assert_eq!(narrowed.packed.len(), (n * n).div_ceil(2));
        assert!(narrowed.packed.capacity() < n * n, "the tail is freed");
        for shift in [0.0, 0.37, 3.7] {
            let (a, b) = (before(shift), reversed_lower_f32(&narrowed, n, shift));
            for i in 0..n {
                for j in 0..n {
                    assert_eq!(
                        a[(i, j)].to_bits(),
                        b[(i, j)].to_bits(),
                        "({i}, {j}), shift {shift}"
                    );
                }
            }
        }
    }

    /// Above the width limit the factor is the f32 one (same `U` bits as asking for f32), at or
    /// below it the f64 one (unless the environment asks for f32 everywhere).
    #[test]
    fn wide_factors_are_f32() {
        let n = 96;
        let h = hessian(n, 200, 11);
        let f32_ = factor_with(h.clone(), n, 0.01, "w", Prec::F32, false).unwrap();
        let f64_ = factor_with(h.clone(), n, 0.01, "w", Prec::F64, false).unwrap();
        assert!(
            f32_.u != f64_.u,
            "the two precisions give different bits here"
        );
        let above = factor_owned_above(h.clone(), n, 0.01, "w", n - 1, false).unwrap();
        assert!(above.u == f32_.u, "wider than the limit: f32");
        let at = factor_owned_above(h, n, 0.01, "w", n, false).unwrap();
        let want = if factor_f32() { &f32_.u } else { &f64_.u };
        assert!(&at.u == want, "at the limit: the default precision");
    }

    /// The TQ formats' factor keeps `U` in f32 only: with the f64 factor, exactly the f64 `U`
    /// rounded (so `TQ_LDLQ_FACTOR_F64=1` gives the bytes before); with the f32 factor (the
    /// default), the f32 factor's values; and `factor_hessian_owned` for TQ4_1S takes that route
    /// (unless the environment asks for f64), and LDLQ runs on it.
    #[test]
    fn tq_factor_keeps_u_in_f32_only() {
        let n = 256;
        let h0 = hessian(n, 400, 7);
        let h = rotate_hessian(&h0, n);
        let rounded = |u: &[f64]| u.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let wide = factor_with(h.clone(), n, 0.01, "w", Prec::F64, false).unwrap();
        let only = factor_with(h.clone(), n, 0.01, "w", Prec::F64, true).unwrap();
        assert!(only.u.is_empty(), "no f64 U kept");
        assert!(
            only.u_f32() == &rounded(&wide.u)[..],
            "f64 factor, U rounded"
        );
        assert_eq!(
            (only.diag.clone(), only.damp),
            (wide.diag.clone(), wide.damp)
        );
        let w32 = factor_with(h.clone(), n, 0.01, "w", Prec::F32, false).unwrap();
        let o32 = factor_with(h, n, 0.01, "w", Prec::F32, true).unwrap();
        assert!(o32.u.is_empty() && o32.u_f32() == &rounded(&w32.u)[..]);
        assert!(
            o32.u_f32() != only.u_f32(),
            "the f32 factor is another factor"
        );
        if sweep_f64() || tq_factor_f64() {
            return;
        }
        let f = factor_hessian_owned(TensorType::TQ4_1S, h0, n, 0.01, 0.0, 0, "w").unwrap();
        assert!(f.u.is_empty() && f.u_f32() == o32.u_f32());
        let mut s = 5;
        let w: Vec<f32> = (0..40 * n).map(|_| lcg(&mut s) as f32).collect();
        let a = super::super::quantize_ldlq(TensorType::TQ4_1S, &w, n, &f, 0);
        let b = super::super::quantize_ldlq(TensorType::TQ4_1S, &w, n, &o32, 0);
        assert!(a == b && a.len() == 40 * n / 32 * TensorType::TQ4_1S.block_bytes());
    }
}
