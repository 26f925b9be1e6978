//! Banded LDLQ for the TQ weight formats (TQ4_1S, TQ3_1S): Hessian-aware rounding in the rotated
//! domain, producing blocks the fork's unchanged decoder reads.
//!
//! For one output row `w` (length n = input dim) the loss of a quantized row `q` is
//! `(w − q) H (w − q)ᵀ` with `H = Σ x xᵀ` over calibration inputs. TQ decodes `q = Rᵀ (c ⊙ d)` per
//! 32-block with `R = blockdiag(forward)` orthonormal, so with `w' = R w` and `H' = R H Rᵀ` the loss is
//! `(w' − q') H' (w' − q')ᵀ` and the rounding happens directly on `q' = c ⊙ d`.
//!
//! The sweep is GPTQ's: with `U` upper triangular and `H'^{-1} = Uᵀ U`, for each column `j`
//! (in order) round `w'_j`, then feed `(w'_j − q'_j) / U_jj · U_j,k` back into the next `band`
//! columns `k`. `U` comes from one Cholesky and one triangular inverse (the reversal trick, below).
//! Each 16-column half-block's scale is chosen when the sweep reaches it, from the error-fed values.

use super::factor::rotate_vec;
use super::sweep::{sweep_cm, sweep_cm_scalar, Elem};
#[cfg(test)]
use super::tq_round::index;
use super::tq_round::{half_scale, half_scales, round_column, round_one};
use super::Factor;
use crate::types::tq::{self, BlockQ, QK};
use crate::types::TensorType;

fn codebook(ty: TensorType) -> (&'static [f32], &'static [f32]) {
    match ty {
        TensorType::TQ4_1S => (&tq::C4, &tq::T4),
        TensorType::TQ3_1S => (&tq::C3, &tq::T3),
        _ => unreachable!("LDLQ supports TQ4_1S and TQ3_1S"),
    }
}

pub(super) fn quantize_rows(ty: TensorType, rows: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    if super::precision::sweep_f64() {
        quantize_rows_in::<f64>(ty, rows, &f.u, f.n, band, out, Path::Simd)
    } else {
        quantize_rows_in::<f32>(ty, rows, f.u_f32(), f.n, band, out, Path::Simd)
    }
}

/// How [`quantize_rows_in`] sweeps: the lazy-batch sweep with the AVX2 kernels where the CPU has
/// them (the default), the same sweep on the portable path (their reference: the same bits), or
/// the one-column-at-a-time reference [`sweep_cm_scalar`] (portable rounding).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Path {
    Simd,
    #[cfg_attr(not(test), allow(dead_code))]
    Portable,
    #[cfg_attr(not(test), allow(dead_code))]
    Scalar,
}

/// One group of rows through [`sweep_cm`] (or its reference [`sweep_cm_scalar`]) in precision
/// `T`, with `u` the factor in `T`: the rows are rotated in f64, then held column-major in `T`;
/// each half-block's scale is chosen (in f64) from its error-fed values when the sweep reaches it.
/// In f32 the rounding takes the group's rows eight at a time with AVX2 ([`half_scales`],
/// [`round_column`]; `Path::Simd`), the same bits as one at a time.
pub(super) fn quantize_rows_in<T: Elem>(
    ty: TensorType,
    rows: &[f32],
    u: &[T],
    n: usize,
    band: usize,
    out: &mut [u8],
    path: Path,
) {
    let (c, t) = codebook(ty);
    let nr = rows.len() / n;
    let mut x = vec![T::ZERO; nr * n];
    let mut row = vec![0f64; n];
    for (r, src) in rows.chunks_exact(n).enumerate() {
        for (a, &b) in row.iter_mut().zip(src) {
            *a = b as f64;
        }
        rotate_vec(&mut row);
        for (k, &v) in row.iter().enumerate() {
            x[k * nr + r] = T::of(v);
        }
    }
    let empty = BlockQ {
        d: [0.0; 2],
        idx: [0; QK],
    };
    let mut blocks = vec![vec![empty; n / QK]; nr];
    let mut d = vec![0f32; nr];
    let mut idx = vec![0u8; nr];
    let simd = path == Path::Simd && super::tq_round::avx2();
    let round = |j: usize, x: &[T], q: &mut [T]| {
        if let (Some(xf), Some(qf)) = (T::as_f32(x), T::as_f32_mut(q)) {
            if j.is_multiple_of(16) {
                half_scales(xf, nr, j, c, t, &mut d, simd);
                for (b, &dr) in blocks.iter_mut().zip(&d) {
                    b[j / QK].d[(j % QK) / 16] = dr;
                }
            }
            round_column(&xf[j * nr..(j + 1) * nr], &d, c, t, &mut idx, qf, simd);
            for (b, &i) in blocks.iter_mut().zip(&idx) {
                b[j / QK].idx[j % QK] = i;
            }
            return;
        }
        if j.is_multiple_of(16) {
            for (r, dr) in d.iter_mut().enumerate() {
                let mut v = [0f64; 16];
                for (i, vi) in v.iter_mut().enumerate() {
                    *vi = x[(j + i) * nr + r].f64();
                }
                *dr = half_scale(&v, c, t);
                blocks[r][j / QK].d[(j % QK) / 16] = *dr;
            }
        }
        for (r, &xr) in x[j * nr..(j + 1) * nr].iter().enumerate() {
            let (i, v) = round_one(xr.f64(), d[r], c, t);
            blocks[r][j / QK].idx[j % QK] = i as u8;
            q[r] = T::of(v);
        }
    };
    if path == Path::Scalar {
        sweep_cm_scalar(&mut x, nr, n, u, band, round);
    } else {
        sweep_cm(&mut x, nr, n, u, band, simd, round);
    }
    let bb = ty.block_bytes();
    for (b, o) in blocks.iter().flatten().zip(out.chunks_exact_mut(bb)) {
        match ty {
            TensorType::TQ4_1S => tq::pack_tq4(b, o),
            _ => tq::pack_tq3(b, o),
        }
    }
}

/// The f64 row-major scalar sweep of the rows of a group (the sweep before the column-major one),
/// kept as a reference.
#[cfg(test)]
pub(super) fn quantize_rows_with(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    band: usize,
    out: &mut [u8],
    scalar: bool,
) {
    assert!(scalar, "the reference is the scalar sweep");
    let n = f.n;
    let (c, t) = codebook(ty);
    let mut x: Vec<f64> = rows.iter().map(|&v| v as f64).collect();
    x.chunks_mut(n).for_each(rotate_vec);
    let nr = rows.len() / n;
    let empty = BlockQ {
        d: [0.0; 2],
        idx: [0; QK],
    };
    let mut blocks = vec![vec![empty; n / QK]; nr];
    let mut d = vec![0f32; nr];
    let round = |r: usize, j: usize, x: &[f64]| {
        if j.is_multiple_of(16) {
            d[r] = half_scale(&x[j..j + 16], c, t);
            blocks[r][j / QK].d[(j % QK) / 16] = d[r];
        }
        let inv = if d[r] > 1e-10 { 1.0 / d[r] as f64 } else { 0.0 };
        let i = index((x[j] * inv) as f32, t);
        blocks[r][j / QK].idx[j % QK] = i as u8;
        c[i] as f64 * d[r] as f64
    };
    super::sweep::sweep_scalar(&mut x, n, f, band, round);
    let bb = ty.block_bytes();
    for (b, o) in blocks.iter().flatten().zip(out.chunks_exact_mut(bb)) {
        match ty {
            TensorType::TQ4_1S => tq::pack_tq4(b, o),
            _ => tq::pack_tq3(b, o),
        }
    }
}

/// The one-row sweep, kept as the reference [`quantize_rows`] is held equal to.
#[cfg(test)]
pub(super) fn quantize_row(ty: TensorType, row: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    let n = f.n;
    let (c, t) = codebook(ty);
    let band = if band == 0 { n } else { band };
    let mut x: Vec<f64> = row.iter().map(|&v| v as f64).collect();
    rotate_vec(&mut x);
    let mut blocks = vec![
        BlockQ {
            d: [0.0; 2],
            idx: [0; QK]
        };
        n / QK
    ];
    let mut d = 0f32;
    for j in 0..n {
        if j % 16 == 0 {
            d = half_scale(&x[j..j + 16], c, t);
            blocks[j / QK].d[(j % QK) / 16] = d;
        }
        let inv = if d > 1e-10 { 1.0 / d as f64 } else { 0.0 };
        let i = index((x[j] * inv) as f32, t);
        blocks[j / QK].idx[j % QK] = i as u8;
        let q = c[i] as f64 * d as f64;
        let urow = &f.u[j * n..(j + 1) * n];
        let err = (x[j] - q) / urow[j];
        let end = (j + 1 + band).min(n);
        for k in j + 1..end {
            x[k] -= err * urow[k];
        }
    }
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(ty.block_bytes())) {
        match ty {
            TensorType::TQ4_1S => tq::pack_tq4(b, o),
            _ => tq::pack_tq3(b, o),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::factor::{factor, rotate_hessian};
    use super::super::tests::{hessian, lcg};
    use super::super::{proxy_loss, quantize_ldlq};
    use crate::types::TensorType;

    #[test]
    fn ldlq_beats_rtn_on_correlated_inputs_and_decodes_with_the_engine_decoder() {
        let n = 128;
        let rows = 48;
        let h = hessian(n, 400, 2);
        let mut s = 9;
        let w: Vec<f32> = (0..rows * n).map(|_| lcg(&mut s) as f32 * 0.05).collect();
        for ty in [TensorType::TQ4_1S, TensorType::TQ3_1S] {
            let mut rtn = vec![0u8; ty.bytes_for(w.len() as u64).unwrap() as usize];
            crate::types::quantize(ty, &w, &mut rtn, "w").unwrap();
            let mut q_rtn = vec![0f32; w.len()];
            crate::types::dequantize(ty, &rtn, &mut q_rtn, "w").unwrap();
            let f = factor(&rotate_hessian(&h, n), n, 0.01, "w").unwrap();
            let mut losses = vec![];
            for band in [0, 16, 64] {
                let bytes = quantize_ldlq(ty, &w, n, &f, band);
                assert_eq!(bytes.len(), rtn.len(), "same bytes per weight as RTN");
                let mut q = vec![0f32; w.len()];
                crate::types::dequantize(ty, &bytes, &mut q, "w").unwrap();
                losses.push(proxy_loss(&h, n, &w, &q));
            }
            let l_rtn = proxy_loss(&h, n, &w, &q_rtn);
            eprintln!(
                "{ty}: proxy loss rtn {l_rtn:.5} ldlq full {:.5} band16 {:.5} band64 {:.5}",
                losses[0], losses[1], losses[2]
            );
            assert!(
                losses[0] < 0.8 * l_rtn,
                "{ty}: full LDLQ {} vs RTN {l_rtn}",
                losses[0]
            );
            assert!(
                losses[2] < l_rtn,
                "{ty}: band 64 {} vs RTN {l_rtn}",
                losses[2]
            );
        }
    }

    /// The default (f32 column-major) path gives the same bytes for 1 and 2 threads, with more
    /// than one 32-row group, a partial group, and full and narrow bands.
    #[test]
    fn deterministic_across_thread_counts() {
        let n = 384;
        let h = hessian(n, 500, 3);
        let mut s = 4;
        let w: Vec<f32> = (0..70 * n).map(|_| lcg(&mut s) as f32).collect();
        let f = factor(&rotate_hessian(&h, n), n, 0.01, "w").unwrap();
        for band in [0, 200] {
            let run = |threads| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap()
                    .install(|| quantize_ldlq(TensorType::TQ4_1S, &w, n, &f, band))
            };
            assert!(run(1) == run(2), "band {band}: 1 vs 2 threads");
        }
    }

    /// The branch-free index is the scan's, on every threshold, its neighbours, signed zeros,
    /// infinities, NaN and a dense grid.
    #[test]
    fn fast_index_equals_the_scan() {
        for t in [&crate::types::tq::T4[..], &crate::types::tq::T3[..]] {
            assert!(t.windows(2).all(|p| p[0] < p[1]), "thresholds ascend");
            let mut vs = vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
            for &th in t {
                let (up, down) = (th * (1.0 + f32::EPSILON), th * (1.0 - f32::EPSILON));
                vs.extend([th, up, down, th + f32::MIN_POSITIVE, th - f32::MIN_POSITIVE]);
            }
            vs.extend((0..200_001).map(|i| (i as f32 - 100_000.0) * 4e-5));
            for v in vs {
                assert_eq!(
                    super::super::tq_round::index(v, t),
                    crate::types::tq::tq_index(v, t),
                    "v = {v}"
                );
            }
        }
    }

    /// The half-block scale search (branch-free index, quotients in their own pass) against the
    /// plain one it restates (the scan, each quotient where it is used), bit for bit, on random
    /// half-blocks of many magnitudes, with outliers and exact zeros.
    #[test]
    fn half_scale_equals_the_plain_search() {
        use crate::types::tq::{tq_index, REFINE_ROUNDS};
        let plain = |v: &[f64], c: &[f32], t: &[f32]| -> f32 {
            let rms = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
            if !(rms > 1e-30) {
                return 0.0;
            }
            let err_of = |d: f64| -> f64 {
                v.iter()
                    .map(|&x| {
                        let q = c[tq_index((x / d) as f32, t)] as f64 * d;
                        (x - q) * (x - q)
                    })
                    .sum()
            };
            let (mut best, mut best_err) = (rms, f64::INFINITY);
            for m in [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5] {
                let e = err_of(rms * m);
                if e < best_err {
                    (best_err, best) = (e, rms * m);
                }
            }
            let mut d = best;
            for _ in 0..REFINE_ROUNDS {
                let (mut sxc, mut scc) = (0f64, 0f64);
                for &x in v {
                    let cv = c[tq_index((x / d) as f32, t)] as f64;
                    sxc += x * cv;
                    scc += cv * cv;
                }
                if scc > 1e-20 && sxc / scc > 0.0 {
                    d = sxc / scc;
                }
            }
            crate::types::float::f16_bits_to_f32(crate::types::float::f32_to_f16_bits(d as f32))
        };
        let mut s = 17;
        for ty in [TensorType::TQ4_1S, TensorType::TQ3_1S] {
            let (c, t) = super::codebook(ty);
            for case in 0..20_000 {
                let mag = 10f64.powi(case % 9 - 6);
                let mut v: Vec<f64> = (0..16).map(|_| lcg(&mut s) * mag).collect();
                if case % 7 == 0 {
                    v[case as usize % 16] *= 40.0;
                }
                if case % 11 == 0 {
                    v[3] = 0.0;
                    v[9] = 0.0;
                }
                let (a, b) = (super::half_scale(&v, c, t), plain(&v, c, t));
                assert_eq!(a.to_bits(), b.to_bits(), "{ty} case {case}");
            }
        }
    }

    /// The column-major lazy-batch sweep against its scalar reference in the same precision (f32
    /// and f64; ≥ 97% of bytes equal, proxy loss equal to 1e-3, as the row-major GEMM sweep is
    /// held), and the f64 scalar column-major sweep bit for bit to the row-major one before it.
    #[test]
    fn column_major_sweep_matches_its_references() {
        use super::super::tests::{assert_sweeps_agree, uniform_rows};
        let (n, rows) = (384usize, 37usize);
        let h = hessian(n, 500, 11);
        let w = uniform_rows(rows * n, 3);
        let f = factor(&rotate_hessian(&h, n), n, 0.01, "w").unwrap();
        for ty in [TensorType::TQ4_1S, TensorType::TQ3_1S] {
            let rb = n / crate::types::tq::QK * ty.block_bytes();
            for band in [0, 7, 200] {
                let run = |f32_: bool, scalar: bool| {
                    let mut o = vec![0u8; rows * rb];
                    let scalar = if scalar {
                        super::Path::Scalar
                    } else {
                        super::Path::Simd
                    };
                    if f32_ {
                        super::quantize_rows_in(ty, &w, f.u_f32(), n, band, &mut o, scalar);
                    } else {
                        super::quantize_rows_in(ty, &w, &f.u, n, band, &mut o, scalar);
                    }
                    o
                };
                let mut old = vec![0u8; rows * rb];
                super::quantize_rows_with(ty, &w, &f, band, &mut old, true);
                let s64 = run(false, true);
                assert!(
                    s64 == old,
                    "{ty} band {band}: f64 column-major scalar vs row-major"
                );
                let mut one_b = vec![0u8; rows * rb];
                for (o, row) in one_b.chunks_mut(rb).zip(w.chunks(n)) {
                    super::quantize_row(ty, row, &f, band, o);
                }
                assert_sweeps_agree(ty, band, &h, &w, &run(false, false), &s64, &one_b);
                let s32 = run(true, true);
                assert_sweeps_agree(ty, band, &h, &w, &run(true, false), &s32, &s32);
                // f32 against f64: the same rounding problem to f32 precision.
                assert_sweeps_agree(ty, band, &h, &w, &s32, &s64, &s64);
            }
        }
    }

    /// The AVX2 path (rounding eight rows per lane group, in-batch feedback eight lanes wide)
    /// against the portable path of the same sweep, **bit for bit**: f32, a real width (1056
    /// columns: eight full lazy batches and a partial one), a full group, a group whose row count
    /// leaves a tail past the last eight (29 rows) and a group of fewer than eight rows, full and
    /// narrow bands, both formats, rows of very different magnitudes (and one all zero).
    #[test]
    fn simd_path_equals_the_portable_path() {
        use super::super::tests::uniform_rows;
        if !super::super::tq_round::avx2() {
            eprintln!("no AVX2 on this CPU: only the portable path exists");
            return;
        }
        let n = 1056usize;
        let h = hessian(n, 300, 5);
        let f = factor(&rotate_hessian(&h, n), n, 0.01, "w").unwrap();
        for (nr, seed) in [(32usize, 1u64), (29, 2), (5, 3)] {
            let mut w = uniform_rows(nr * n, seed);
            for (r, row) in w.chunks_mut(n).enumerate() {
                let s = [1.0f32, 1e-3, 40.0, 0.0, 0.02][r % 5];
                row.iter_mut().for_each(|v| *v *= s);
            }
            for ty in [TensorType::TQ4_1S, TensorType::TQ3_1S] {
                let rb = n / crate::types::tq::QK * ty.block_bytes();
                for band in [0, 100] {
                    let run = |path| {
                        let mut o = vec![0u8; nr * rb];
                        super::quantize_rows_in(ty, &w, f.u_f32(), n, band, &mut o, path);
                        o
                    };
                    let (a, b) = (run(super::Path::Simd), run(super::Path::Portable));
                    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
                    assert!(
                        a == b,
                        "{ty} rows {nr} band {band}: {same} of {} bytes equal",
                        a.len()
                    );
                }
            }
        }
    }
}
