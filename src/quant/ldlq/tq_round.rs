//! The TQ4_1S / TQ3_1S rounding step of the LDLQ sweep: each half-block's scale search and each
//! column's nearest codebook entry, for the rows of a group held column-major
//! (`x[k·rows + r]`, [`super::sweep::sweep_cm`]).
//!
//! [`half_scale`] and [`index`] are the scalar definitions (one row, one value). [`half_scales`]
//! and [`round_column`] apply them to every row of a group: with AVX2 eight rows at a time, one row
//! per lane (each row's search is independent, and a lane performs the scalar operations in the
//! scalar order, f64 where the scalar is f64, division where it divides, no fused multiply-adds),
//! so the bits are the scalar path's; the portable path is the scalar loop over rows. Tests hold
//! the two equal bit for bit.

use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};
use crate::types::tq;

/// `tq::tq_index` (the first `i` with `v < t[i]`, else `t.len()`) as a branch-free binary search
/// (`t.len() + 1` a power of two: 15 or 7 thresholds, 4 or 3 compares): the same index for
/// ascending `t`, NaN included (every comparison false gives `t.len()`), without the scan's
/// data-dependent branch (a misprediction per value, and [`half_scale`] looks up 15 indices per
/// value). Held to `tq_index` by `fast_index_equals_the_scan`. The AVX2 lanes count instead
/// (`Σ_k !(v < t[k])`), the same index for ascending `t`.
#[inline]
pub(super) fn index(v: f32, t: &[f32]) -> usize {
    debug_assert!((t.len() + 1).is_power_of_two());
    let (mut i, mut step) = (0, t.len().div_ceil(2));
    while step > 0 {
        i += step * usize::from(!(v < t[i + step - 1]));
        step /= 2;
    }
    i
}

/// `(x / d) as f32` for the (16) values of a half-block, a separate pass so the divisions
/// vectorize (the same quotients as one at a time).
#[inline]
fn quotients(v: &[f64], d: f64) -> [f32; 16] {
    let mut y = [0f32; 16];
    for (yi, &x) in y.iter_mut().zip(v) {
        *yi = (x / d) as f32;
    }
    y
}

/// The multipliers of the RMS that the scale search tries first, in order.
const MULTS: [f64; 9] = [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5];

/// The scale of one half-block chosen from its current (error-fed) values: the fork's RTN search
/// restricted to the half (9 multipliers of the RMS, then 6 least-squares refinements), rounded to
/// f16 since that is what the decoder will use. All arithmetic in f64 but the quotients, which are
/// rounded to f32 before the codebook lookup (as the fork's quantizer does).
pub(super) fn half_scale(v: &[f64], c: &[f32], t: &[f32]) -> f32 {
    debug_assert_eq!(v.len(), 16);
    let rms = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
    if !(rms > 1e-30) {
        return 0.0;
    }
    let err_of = |d: f64| -> f64 {
        let y = quotients(v, d);
        v.iter()
            .zip(&y)
            .map(|(&x, &yi)| {
                let q = c[index(yi, t)] as f64 * d;
                (x - q) * (x - q)
            })
            .sum()
    };
    let mut best = rms;
    let mut best_err = f64::INFINITY;
    for m in MULTS {
        let e = err_of(rms * m);
        if e < best_err {
            best_err = e;
            best = rms * m;
        }
    }
    let mut d = best;
    for _ in 0..tq::REFINE_ROUNDS {
        let (mut sxc, mut scc) = (0f64, 0f64);
        let y = quotients(v, d);
        for (&x, &yi) in v.iter().zip(&y) {
            let cv = c[index(yi, t)] as f64;
            sxc += x * cv;
            scc += cv * cv;
        }
        if scc > 1e-20 && sxc / scc > 0.0 {
            d = sxc / scc;
        }
    }
    f16_bits_to_f32(f32_to_f16_bits(d as f32))
}

/// Whether the AVX2 kernels may run (checked once per call site; false off x86-64).
#[inline]
pub(super) fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Every row's scale for the half-block starting at column `j` (`x`: `nr` rows column-major):
/// `d[r] = half_scale(x_r[j..j + 16])`. `simd`: eight rows per AVX2 call (the caller checked
/// [`avx2`]); the rows past the last multiple of eight, and every row when `simd` is false, take
/// the scalar [`half_scale`]. The same bits either way.
pub(super) fn half_scales(
    x: &[f32],
    nr: usize,
    j: usize,
    c: &[f32],
    t: &[f32],
    d: &mut [f32],
    simd: bool,
) {
    let mut r0 = 0;
    #[cfg(target_arch = "x86_64")]
    if simd && (c.len() == 16 || c.len() == 8) && t.len() + 1 == c.len() {
        while r0 + 8 <= nr {
            // SAFETY: the caller checked AVX2 (`simd`); the kernel reads x[(j + i)·nr + r0 + l]
            // for i < 16, l < 8, inside `x` since r0 + 8 ≤ nr and j + 16 ≤ n.
            unsafe { avx2::half_scales8(x, nr, j, r0, c, t, &mut d[r0..r0 + 8]) };
            r0 += 8;
        }
    }
    let _ = simd;
    for (r, dr) in d.iter_mut().enumerate().take(nr).skip(r0) {
        let mut v = [0f64; 16];
        for (i, vi) in v.iter_mut().enumerate() {
            *vi = x[(j + i) * nr + r] as f64;
        }
        *dr = half_scale(&v, c, t);
    }
}

/// Every row's rounding at column `j` under its half-block scale `d[r]`: the codebook index
/// (`idx[r]`) and the value `q[r] = c[idx] · d[r]` (f64 product rounded to f32). `simd` as in
/// [`half_scales`]; the same bits either way.
#[allow(clippy::too_many_arguments)]
pub(super) fn round_column(
    xj: &[f32],
    d: &[f32],
    c: &[f32],
    t: &[f32],
    idx: &mut [u8],
    q: &mut [f32],
    simd: bool,
) {
    let nr = xj.len();
    let mut r0 = 0;
    #[cfg(target_arch = "x86_64")]
    if simd && (c.len() == 16 || c.len() == 8) && t.len() + 1 == c.len() {
        while r0 + 8 <= nr {
            // SAFETY: the caller checked AVX2 (`simd`); eight lanes from r0, r0 + 8 ≤ every
            // slice's length (all are `nr` long).
            unsafe {
                avx2::round8(
                    &xj[r0..r0 + 8],
                    &d[r0..r0 + 8],
                    c,
                    t,
                    &mut idx[r0..r0 + 8],
                    &mut q[r0..r0 + 8],
                )
            };
            r0 += 8;
        }
    }
    let _ = simd;
    for r in r0..nr {
        let (i, v) = round_one(xj[r] as f64, d[r], c, t);
        idx[r] = i as u8;
        q[r] = v as f32;
    }
}

/// One value's rounding under scale `d`: the index and `c[i] · d` in f64 (the scalar definition).
#[inline]
pub(super) fn round_one(x: f64, d: f32, c: &[f32], t: &[f32]) -> (usize, f64) {
    let inv = if d > 1e-10 { 1.0 / d as f64 } else { 0.0 };
    let i = index((x * inv) as f32, t);
    (i, c[i] as f64 * d as f64)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};
    use crate::types::tq;
    use std::arch::x86_64::*;

    /// The codebook and thresholds as vectors: `c` in two 8-lane halves (the second unused for
    /// TQ3), the thresholds broadcast.
    struct Book {
        lo: __m256,
        hi: __m256,
        big: bool,
        t: [__m256; 15],
        nt: usize,
    }

    #[target_feature(enable = "avx2")]
    unsafe fn book(c: &[f32], t: &[f32]) -> Book {
        let big = c.len() == 16;
        let lo = _mm256_loadu_ps(c.as_ptr());
        let hi = if big {
            _mm256_loadu_ps(c.as_ptr().add(8))
        } else {
            lo
        };
        let mut tv = [_mm256_setzero_ps(); 15];
        for (v, &th) in tv.iter_mut().zip(t) {
            *v = _mm256_set1_ps(th);
        }
        Book {
            lo,
            hi,
            big,
            t: tv,
            nt: t.len(),
        }
    }

    /// Per lane: the index `Σ_k !(y < t[k])` (the first `k` with `y < t[k]` for ascending
    /// thresholds; `t.len()` for NaN, as [`super::index`]) and `c[index]`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn lookup(b: &Book, y: __m256) -> (__m256i, __m256) {
        let mut i = _mm256_setzero_si256();
        for tk in &b.t[..b.nt] {
            let ge = _mm256_cmp_ps::<_CMP_NLT_UQ>(y, *tk);
            i = _mm256_sub_epi32(i, _mm256_castps_si256(ge));
        }
        let lo = _mm256_permutevar8x32_ps(b.lo, i);
        let v = if b.big {
            let hi = _mm256_permutevar8x32_ps(b.hi, i);
            let upper = _mm256_cmpgt_epi32(i, _mm256_set1_epi32(7));
            _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(upper))
        } else {
            lo
        };
        (i, v)
    }

    /// `(x / d) as f32` for the eight lanes held as two f64 halves.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn quot(x: [__m256d; 2], d: [__m256d; 2]) -> __m256 {
        let a = _mm256_cvtpd_ps(_mm256_div_pd(x[0], d[0]));
        let b = _mm256_cvtpd_ps(_mm256_div_pd(x[1], d[1]));
        _mm256_set_m128(b, a)
    }

    /// An f32 vector widened to two f64 halves (lanes 0–3, 4–7).
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn widen(v: __m256) -> [__m256d; 2] {
        [
            _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)),
        ]
    }

    /// `err(d) = Σ_i (x_i − c[idx((x_i / d) as f32)]·d)²` per lane, summed in `i` order.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn err_of(b: &Book, v: &[[__m256d; 2]; 16], d: [__m256d; 2]) -> [__m256d; 2] {
        let mut e = [_mm256_setzero_pd(); 2];
        for vi in v {
            let (_, cv) = lookup(b, quot(*vi, d));
            let cv = widen(cv);
            for h in 0..2 {
                let q = _mm256_mul_pd(cv[h], d[h]);
                let r = _mm256_sub_pd(vi[h], q);
                e[h] = _mm256_add_pd(e[h], _mm256_mul_pd(r, r));
            }
        }
        e
    }

    /// [`super::half_scale`] for rows `r0..r0 + 8` of the half-block at column `j`, one row per
    /// lane, each lane's operations those of the scalar search in its order.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn half_scales8(
        x: &[f32],
        nr: usize,
        j: usize,
        r0: usize,
        c: &[f32],
        t: &[f32],
        out: &mut [f32],
    ) {
        let b = book(c, t);
        let mut v = [[_mm256_setzero_pd(); 2]; 16];
        for (i, vi) in v.iter_mut().enumerate() {
            let s = &x[(j + i) * nr + r0..(j + i) * nr + r0 + 8];
            *vi = widen(_mm256_loadu_ps(s.as_ptr()));
        }
        let mut rms = [_mm256_setzero_pd(); 2];
        for h in 0..2 {
            let mut s = _mm256_setzero_pd();
            for vi in &v {
                s = _mm256_add_pd(s, _mm256_mul_pd(vi[h], vi[h]));
            }
            rms[h] = _mm256_sqrt_pd(_mm256_div_pd(s, _mm256_set1_pd(16.0)));
        }
        let mut best = rms;
        let mut best_err = [_mm256_set1_pd(f64::INFINITY); 2];
        for m in super::MULTS {
            let mv = _mm256_set1_pd(m);
            let d = [_mm256_mul_pd(rms[0], mv), _mm256_mul_pd(rms[1], mv)];
            let e = err_of(&b, &v, d);
            for h in 0..2 {
                let lt = _mm256_cmp_pd::<_CMP_LT_OQ>(e[h], best_err[h]);
                best_err[h] = _mm256_blendv_pd(best_err[h], e[h], lt);
                best[h] = _mm256_blendv_pd(best[h], d[h], lt);
            }
        }
        let mut d = best;
        for _ in 0..tq::REFINE_ROUNDS {
            let (mut sxc, mut scc) = ([_mm256_setzero_pd(); 2], [_mm256_setzero_pd(); 2]);
            for vi in &v {
                let (_, cv) = lookup(&b, quot(*vi, d));
                let cv = widen(cv);
                for h in 0..2 {
                    sxc[h] = _mm256_add_pd(sxc[h], _mm256_mul_pd(vi[h], cv[h]));
                    scc[h] = _mm256_add_pd(scc[h], _mm256_mul_pd(cv[h], cv[h]));
                }
            }
            for h in 0..2 {
                let r = _mm256_div_pd(sxc[h], scc[h]);
                let ok = _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_GT_OQ>(scc[h], _mm256_set1_pd(1e-20)),
                    _mm256_cmp_pd::<_CMP_GT_OQ>(r, _mm256_setzero_pd()),
                );
                d[h] = _mm256_blendv_pd(d[h], r, ok);
            }
        }
        let (mut dl, mut rl) = ([0f64; 8], [0f64; 8]);
        for h in 0..2 {
            _mm256_storeu_pd(dl.as_mut_ptr().add(4 * h), d[h]);
            _mm256_storeu_pd(rl.as_mut_ptr().add(4 * h), rms[h]);
        }
        for ((o, &dv), &r) in out.iter_mut().zip(&dl).zip(&rl) {
            *o = if r > 1e-30 {
                f16_bits_to_f32(f32_to_f16_bits(dv as f32))
            } else {
                0.0
            };
        }
    }

    /// [`super::round_one`] for eight rows, one per lane.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn round8(
        xj: &[f32],
        d: &[f32],
        c: &[f32],
        t: &[f32],
        idx: &mut [u8],
        q: &mut [f32],
    ) {
        let b = book(c, t);
        let dv = _mm256_loadu_ps(d.as_ptr());
        let x = widen(_mm256_loadu_ps(xj.as_ptr()));
        let dw = widen(dv);
        // inv = 1/d where d > 1e-10 (compared in f32), else 0.
        // inv = 1/d where d > 1e-10 (the scalar compares in f32; widening is exact), else 0.
        let tiny = _mm256_set1_pd(1e-10f32 as f64);
        let one = _mm256_set1_pd(1.0);
        let mut y = [_mm_setzero_ps(); 2];
        for h in 0..2 {
            let nz = _mm256_cmp_pd::<_CMP_GT_OQ>(dw[h], tiny);
            let inv = _mm256_and_pd(_mm256_div_pd(one, dw[h]), nz);
            y[h] = _mm256_cvtpd_ps(_mm256_mul_pd(x[h], inv));
        }
        let yv = _mm256_set_m128(y[1], y[0]);
        let (i, cv) = lookup(&b, yv);
        let cw = widen(cv);
        let qa = _mm256_cvtpd_ps(_mm256_mul_pd(cw[0], dw[0]));
        let qb = _mm256_cvtpd_ps(_mm256_mul_pd(cw[1], dw[1]));
        _mm256_storeu_ps(q.as_mut_ptr(), _mm256_set_m128(qb, qa));
        let mut il = [0i32; 8];
        _mm256_storeu_si256(il.as_mut_ptr().cast(), i);
        for (o, &v) in idx.iter_mut().zip(&il) {
            *o = v as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::types::tq::{C3, C4, T3, T4};

    /// A column-major group of `nr` rows × `n` columns: rows of many magnitudes (1e-7 to 1e2), some
    /// with an outlier, one all zero, exact zeros and codebook thresholds scattered in.
    fn group(nr: usize, n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        let mut x = vec![0f32; nr * n];
        for r in 0..nr {
            let mag = 10f64.powi((r % 10) as i32 - 7);
            for k in 0..n {
                let mut v = next() * mag;
                if (r + k) % 23 == 0 {
                    v *= 40.0;
                }
                if (r * 7 + k) % 19 == 0 {
                    v = 0.0;
                }
                if r % 13 == 12 {
                    v = 0.0;
                }
                x[k * nr + r] = v as f32;
            }
        }
        x
    }

    /// [`super::half_scales`] with AVX2 equals the scalar [`super::half_scale`] row by row, bit
    /// for bit, for both codebooks, group sizes with and without a tail past the last eight rows.
    #[test]
    fn simd_half_scales_equal_the_scalar_search() {
        if !super::avx2() {
            eprintln!("no AVX2 on this CPU: only the portable path exists");
            return;
        }
        for (c, t) in [(&C4[..], &T4[..]), (&C3[..], &T3[..])] {
            for nr in [8usize, 32, 29, 3] {
                let n = 256;
                let x = group(nr, n, nr as u64 + c.len() as u64);
                for j in (0..n).step_by(16) {
                    let (mut a, mut b) = (vec![0f32; nr], vec![0f32; nr]);
                    super::half_scales(&x, nr, j, c, t, &mut a, true);
                    super::half_scales(&x, nr, j, c, t, &mut b, false);
                    for r in 0..nr {
                        let v: Vec<f64> = (0..16).map(|i| x[(j + i) * nr + r] as f64).collect();
                        let s = super::half_scale(&v, c, t);
                        assert_eq!(b[r].to_bits(), s.to_bits(), "portable, row {r} col {j}");
                        assert_eq!(a[r].to_bits(), s.to_bits(), "AVX2, row {r} col {j}");
                    }
                }
            }
        }
    }

    /// [`super::round_column`] with AVX2 equals the scalar [`super::round_one`] (index and value),
    /// for scales from the search, zero and tiny scales, and values on and beside the thresholds.
    #[test]
    fn simd_round_column_equals_the_scalar_rounding() {
        if !super::avx2() {
            eprintln!("no AVX2 on this CPU: only the portable path exists");
            return;
        }
        for (c, t) in [(&C4[..], &T4[..]), (&C3[..], &T3[..])] {
            let nr = 37;
            let n = 64;
            let mut x = group(nr, n, 99);
            // Values exactly on a threshold (scale 1) and one ulp beside it.
            for (r, th) in t.iter().cycle().take(nr).enumerate() {
                x[r] = *th;
                x[nr + r] = f32::from_bits(th.to_bits() + 1);
            }
            for j in 0..n {
                let mut d = vec![0f32; nr];
                super::half_scales(&x, nr, j - j % 16, c, t, &mut d, false);
                if j < 2 {
                    d.fill(1.0);
                }
                d[3] = 0.0;
                d[5] = 1e-11;
                d[9] = 2e-10;
                let xj = &x[j * nr..(j + 1) * nr];
                let (mut ia, mut qa) = (vec![0u8; nr], vec![0f32; nr]);
                let (mut ib, mut qb) = (vec![0u8; nr], vec![0f32; nr]);
                super::round_column(xj, &d, c, t, &mut ia, &mut qa, true);
                super::round_column(xj, &d, c, t, &mut ib, &mut qb, false);
                for r in 0..nr {
                    let (i, v) = super::round_one(xj[r] as f64, d[r], c, t);
                    assert_eq!((ib[r] as usize, qb[r].to_bits()), (i, (v as f32).to_bits()));
                    assert_eq!(
                        (ia[r], qa[r].to_bits()),
                        (ib[r], qb[r].to_bits()),
                        "r {r} j {j}"
                    );
                }
            }
        }
    }
}
