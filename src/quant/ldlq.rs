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

use crate::error::{Error, Result};
use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};
use crate::types::tq::{self, BlockQ, QK};
use crate::types::{grid, TensorType};
use faer::{Mat, Par};
use rayon::prelude::*;

/// The factor for one input dimension: `u` is n×n row-major upper triangular with
/// `(R H Rᵀ + λ·mean(diag)·I)^{-1} = Uᵀ U`.
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
    /// block parameters are refitted under it after the sweep, [`refit_params`]).
    pub h: Option<Vec<f64>>,
    /// Refit passes after the sweep (stock types; `--ldlq-refit`).
    pub refit: usize,
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

/// Damp and factor a (rotated) Hessian. Escalates λ ×10 (up to 6 times) when Cholesky fails and
/// says so with the tensor named.
pub fn factor(h: &[f64], n: usize, damp: f64, what: &str) -> Result<Factor> {
    factor_owned(h.to_vec(), n, damp, what)
}

/// [`factor`] taking the Hessian by value, so that at most two n×n f64 matrices are alive at any
/// point (the Hessian and the matrix being factored, then the factor and its inverse): the
/// Cholesky runs in place and the Hessian is dropped as soon as it succeeds.
pub fn factor_owned(h: Vec<f64>, n: usize, damp: f64, what: &str) -> Result<Factor> {
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
    let mut h = Some(h);
    for attempt in 0..7 {
        let hh = h.as_ref().expect("kept until the Cholesky succeeds");
        // Reversal trick: chol(J H J) = L Lᵀ ⇒ H = M Mᵀ with M = J L J upper ⇒ H⁻¹ = Uᵀ U, U = J L⁻¹ J.
        let mut l = Mat::<f64>::from_fn(n, n, |i, j| {
            if j > i {
                return 0.0; // only the lower triangle is read (as faer's `llt` copies it)
            }
            let (ri, rj) = (n - 1 - i, n - 1 - j);
            hh[ri * n + rj] + if i == j { lambda * mean_diag } else { 0.0 }
        });
        if cholesky_lower_in_place(&mut l).is_err() {
            lambda *= 10.0;
            continue;
        }
        let diag = (0..n).map(|i| hh[i * n + i] + lambda * mean_diag).collect();
        drop(h.take());
        let mut linv = Mat::<f64>::zeros(n, n);
        faer::linalg::triangular_inverse::invert_lower_triangular(
            linv.as_mut(),
            l.as_ref(),
            Par::rayon(0),
        );
        drop(l);
        let mut u = vec![0f64; n * n];
        u.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            for j in i..n {
                // U[i][j] = Linv[n-1-i][n-1-j] (lower part of Linv, since n-1-i >= n-1-j).
                row[j] = linv[(n - 1 - i, n - 1 - j)];
            }
        });
        if attempt > 0 {
            eprintln!(
                "tq: {what}: Hessian not positive definite; damping raised to {lambda:.3e}·mean(diag)"
            );
        }
        return Ok(Factor {
            n,
            u,
            diag,
            perm: None,
            damp: lambda,
            h: None,
            refit: 0,
        });
    }
    Err(Error::Unsupported(format!(
        "{what}: Hessian is not positive definite even with damping {lambda:.1e}; recalibrate with more tokens"
    )))
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
    let mut perm: Vec<usize> = (0..n).collect();
    perm.sort_by(|&a, &b| h[b * n + b].total_cmp(&h[a * n + a]).then(a.cmp(&b)));
    let mut hp = vec![0f64; n * n];
    for (i, &pi) in perm.iter().enumerate() {
        for (j, &pj) in perm.iter().enumerate() {
            hp[i * n + j] = h[pi * n + pj];
        }
    }
    // Kept for the refit (a third n×n matrix alive while factoring), damped below as the factor
    // was; without a refit it is freed before factoring.
    let mut hn = (refit > 0).then_some(h);
    let mut f = factor_owned(hp, n, damp, what)?;
    let mut diag = vec![0f64; n];
    for (i, &pi) in perm.iter().enumerate() {
        diag[pi] = f.diag[i];
    }
    if let Some(hn) = hn.as_mut() {
        for (i, &d) in diag.iter().enumerate() {
            hn[i * n + i] = d;
        }
    }
    f.diag = diag;
    f.perm = Some(perm);
    f.h = hn;
    f.refit = refit;
    Ok(f)
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

/// Rotate (with the rotation of `ty`'s decoder), damp and factor one calibration Hessian (what
/// `tq convert --calib` and sequential calibration do for every Hessian group).
pub fn factor_hessian(
    ty: TensorType,
    h: &crate::quant::Hessian,
    damp: f64,
    refit: usize,
    what: &str,
) -> Result<Factor> {
    factor_hessian_owned(ty, h.h.clone(), h.n, damp, refit, what)
}

/// [`factor_hessian`] consuming the Hessian's matrix: rotation in place, then [`factor_owned`], so
/// the peak is two n×n f64 matrices (13 GB for a 70B model's FFN input, not five or six).
pub fn factor_hessian_owned(
    ty: TensorType,
    mut h: Vec<f64>,
    n: usize,
    damp: f64,
    refit: usize,
    what: &str,
) -> Result<Factor> {
    if ty.ldlq_unrotated() {
        return factor_act_order(h, n, damp, refit, what);
    }
    if ty.rotates_rows() {
        super::ldlq2::rotate_hessian_rows_in_place(&mut h, n)?;
    } else {
        rotate_hessian_in_place(&mut h, n);
    }
    factor_owned(h, n, damp, what)
}

fn codebook(ty: TensorType) -> (&'static [f32], &'static [f32]) {
    match ty {
        TensorType::TQ4_1S => (&tq::C4, &tq::T4),
        TensorType::TQ3_1S => (&tq::C3, &tq::T3),
        _ => unreachable!("LDLQ supports TQ4_1S and TQ3_1S"),
    }
}

/// The scale of one half-block chosen from its current (error-fed) values: the fork's RTN search
/// restricted to the half (9 multipliers of the RMS, then 6 least-squares refinements), rounded to
/// f16 since that is what the decoder will use.
fn half_scale(v: &[f64], c: &[f32], t: &[f32]) -> f32 {
    let rms = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
    if !(rms > 1e-30) {
        return 0.0;
    }
    let err_of = |d: f64| -> f64 {
        v.iter()
            .map(|&x| {
                let q = c[tq::tq_index((x / d) as f32, t)] as f64 * d;
                (x - q) * (x - q)
            })
            .sum()
    };
    let mut best = rms;
    let mut best_err = f64::INFINITY;
    for m in [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5] {
        let e = err_of(rms * m);
        if e < best_err {
            best_err = e;
            best = rms * m;
        }
    }
    let mut d = best;
    for _ in 0..tq::REFINE_ROUNDS {
        let (mut sxc, mut scc) = (0f64, 0f64);
        for &x in v {
            let cv = c[tq::tq_index((x / d) as f32, t)] as f64;
            sxc += x * cv;
            scc += cv * cv;
        }
        if scc > 1e-20 && sxc / scc > 0.0 {
            d = sxc / scc;
        }
    }
    f16_bits_to_f32(f32_to_f16_bits(d as f32))
}

/// Rows swept together by [`sweep`] (a fixed partition, so the bytes do not depend on the thread
/// count): each panel of `U` is read once per 32 rows, and the feedback between column batches is
/// one matrix product per panel.
const ROWS: usize = 32;

/// Columns per lazy batch (GPTQ's "lazy batch updates"): inside a batch the error feedback is
/// applied column by column; the batch's errors reach the columns after it in one GEMM.
const LAZY: usize = 128;

/// Quantize `rows` rows of length `n` (row-major `w`) to `ty` with banded LDLQ (`band` = 0: full).
/// Deterministic and independent of the thread count (rows are independent and grouped by a
/// fixed [`ROWS`]). Stock types refit their block parameters after the sweep, `f.refit` passes
/// under the full Hessian.
pub fn quantize_ldlq(ty: TensorType, w: &[f32], n: usize, f: &Factor, band: usize) -> Vec<u8> {
    let refit = Refit {
        passes: f.refit,
        full: true,
    };
    quantize_ldlq_refit(ty, w, n, f, band, refit)
}

/// [`quantize_ldlq`] with the stock types' parameter refit given.
pub fn quantize_ldlq_refit(
    ty: TensorType,
    w: &[f32],
    n: usize,
    f: &Factor,
    band: usize,
    refit: Refit,
) -> Vec<u8> {
    assert_eq!(f.n, n);
    if ty == TensorType::TQ2T {
        return super::ldlq2::quantize_trellis(w, n, f, band, super::ldlq2::TrellisInner::FORMAT);
    }
    if ty.ldlq_unrotated() {
        let (bs, bb) = (ty.block_size(), ty.block_bytes());
        let row_bytes = n / bs * bb;
        let mut out = vec![0u8; w.len() / bs * bb];
        out.par_chunks_mut(ROWS * row_bytes)
            .zip(w.par_chunks(ROWS * n))
            .for_each(|(o, rows)| quantize_rows_stock(ty, rows, f, band, refit, o, Mode::Gemm));
        return out;
    }
    let bb = ty.block_bytes();
    let row_bytes = n / QK * bb;
    let mut out = vec![0u8; w.len() / QK * bb];
    out.par_chunks_mut(ROWS * row_bytes)
        .zip(w.par_chunks(ROWS * n))
        .for_each(|(o, rows)| {
            if ty.is_row_rotated() {
                super::ldlq2::quantize_rows(rows, f, band, o)
            } else {
                quantize_rows(ty, rows, f, band, o)
            }
        });
    out
}

/// GPTQ's sweep over a group of rows sharing one factor (`x`: rows × n, row-major): for each
/// column `j`, `round(r, j, x_r)` is row `r`'s quantized value at `j` (it may look at `x_r[j..]`
/// to fix a block scale), and `e = (x_r[j] − q) / U_jj` is fed into the next `band` columns as
/// `x_r[k] −= e · U_jk`.
///
/// The feedback is the scalar sweep's, reordered: within a batch of [`LAZY`] columns it is applied
/// column by column; into the columns after the batch it is `X −= E · U[batch, after]`, one GEMM
/// (faer, single-threaded per group, so deterministic). Full-band LDLQ costs rows·n² multiply-adds
/// (1.2·10¹² for one 7B block): as one-row column loops that was bound by memory and scalar
/// throughput; as GEMMs it runs near the machine's f64 peak. The sums are the same up to f64
/// rounding order; [`sweep_scalar`] is the reference it is held to.
pub(crate) fn sweep(
    x: &mut [f64],
    n: usize,
    f: &Factor,
    band: usize,
    mut round: impl FnMut(usize, usize, &[f64]) -> f64,
) -> Vec<f64> {
    use faer::{linalg::matmul::matmul, Accum};
    let rows = x.len() / n;
    let band = if band == 0 { n } else { band };
    let mut loss = vec![0f64; rows];
    let mut e = Mat::<f64>::zeros(rows, LAZY);
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + LAZY).min(n);
        for j in j0..j1 {
            let urow = &f.u[j * n..(j + 1) * n];
            for r in 0..rows {
                let xr = &x[r * n..(r + 1) * n];
                let q = round(r, j, xr);
                let er = (xr[j] - q) / urow[j];
                e[(r, j - j0)] = er;
                loss[r] += er * er;
            }
            let end = (j + 1 + band).min(j1);
            let u = &urow[j + 1..end];
            for r in 0..rows {
                let er = e[(r, j - j0)];
                for (xk, &uk) in x[r * n + j + 1..r * n + end].iter_mut().zip(u) {
                    *xk -= er * uk;
                }
            }
        }
        // Columns after the batch that the band reaches: k in [j1, (j1 − 1) + band].
        let k_end = (j1 - 1 + band + 1).min(n);
        if k_end > j1 {
            let (b, w) = (j1 - j0, k_end - j1);
            // U's panel, with entries beyond each row's band zeroed, and the rows' columns it
            // reaches, copied to contiguous matrices (a strided view of `x` crashed faer's AVX-512
            // kernels in a test; the copies cost O(rows·n) per batch against O(rows·n·128) flops).
            let panel = Mat::<f64>::from_fn(b, w, |a, c| {
                let (j, k) = (j0 + a, j1 + c);
                if k <= j + band {
                    f.u[j * n + k]
                } else {
                    0.0
                }
            });
            let mut xs = Mat::<f64>::from_fn(rows, w, |r, c| x[r * n + j1 + c]);
            matmul(
                xs.as_mut(),
                Accum::Add,
                e.as_ref().subcols(0, b),
                panel.as_ref(),
                -1.0,
                Par::Seq,
            );
            for r in 0..rows {
                for (c, v) in x[r * n + j1..r * n + k_end].iter_mut().enumerate() {
                    *v = xs[(r, c)];
                }
            }
        }
        j0 = j1;
    }
    loss
}

/// The scalar sweep [`sweep`] reorders (one column at a time, every row): the reference.
pub(crate) fn sweep_scalar(
    x: &mut [f64],
    n: usize,
    f: &Factor,
    band: usize,
    mut round: impl FnMut(usize, usize, &[f64]) -> f64,
) -> Vec<f64> {
    let rows = x.len() / n;
    let band = if band == 0 { n } else { band };
    let mut loss = vec![0f64; rows];
    for j in 0..n {
        let urow = &f.u[j * n..(j + 1) * n];
        for r in 0..rows {
            let xr = &mut x[r * n..(r + 1) * n];
            let q = round(r, j, xr);
            let err = (xr[j] - q) / urow[j];
            loss[r] += err * err;
            for k in j + 1..(j + 1 + band).min(n) {
                xr[k] -= err * urow[k];
            }
        }
    }
    loss
}

fn quantize_rows(ty: TensorType, rows: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    quantize_rows_with(ty, rows, f, band, out, false)
}

fn quantize_rows_with(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    band: usize,
    out: &mut [u8],
    scalar: bool,
) {
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
        if j % 16 == 0 {
            d[r] = half_scale(&x[j..j + 16], c, t);
            blocks[r][j / QK].d[(j % QK) / 16] = d[r];
        }
        let inv = if d[r] > 1e-10 { 1.0 / d[r] as f64 } else { 0.0 };
        let i = tq::tq_index((x[j] * inv) as f32, t);
        blocks[r][j / QK].idx[j % QK] = i as u8;
        c[i] as f64 * d[r] as f64
    };
    if scalar {
        sweep_scalar(&mut x, n, f, band, round);
    } else {
        sweep(&mut x, n, f, band, round);
    }
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
fn quantize_row(ty: TensorType, row: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
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
        let i = tq::tq_index((x[j] * inv) as f32, t);
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

/// Rows of a stock type (a group sharing the GEMM sweep), in the weights' own basis. Every block's
/// parameters are fitted first, to the original values weighted by the damped Hessian diagonal
/// (`types::grid::fit`, the same fit `--imatrix` uses), so every grid is fixed before the sweep;
/// then the values are rounded onto their block's grid in the factor's column order (`f.perm`:
/// decreasing Hessian diagonal, GPTQ's act-order, possible only because the grids are already
/// fixed), each error fed into the next `band` columns of that order. Measured on SmolLM2
/// (docs/bench/stock-ldlq.md): fitting each block when the sweep reaches it, in natural order, was no
/// better than importance-weighted round-to-nearest, and worse with the full band.
///
/// Then up to `refit` times: every row's block parameters are refitted to its rounded codes
/// ([`refit_params`]) and the sweep runs again on the new grids; a row keeps the new parameters
/// and codes only when its sweep loss `Σ e²` (with the full band exactly `(w − q) H (w − q)ᵀ`
/// under the damped Hessian) went down, so a refit never makes a row worse by that measure.
fn quantize_rows_stock(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    band: usize,
    refit: Refit,
    out: &mut [u8],
    mode: Mode,
) {
    let n = f.n;
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let row_bytes = n / bs * bb;
    let mut grids: Vec<Vec<grid::BlockGrid>> = rows
        .chunks_exact(n)
        .zip(out.chunks_exact_mut(row_bytes))
        .map(|(row, o)| fit_grids(ty, row, f, o))
        .collect();
    let (mut codes, mut loss) = stock_pass(ty, rows, f, band, &grids, mode);
    if let (Some(h), true) = (f.h.as_deref(), refit.passes > 0) {
        let mut trial = out.to_vec();
        for _ in 0..refit.passes {
            let eqs: Vec<(Vec<f64>, Vec<f64>)> = match (refit.full, mode) {
                (true, Mode::Gemm) => normal_equations_rows(ty, rows, h, &codes, n),
                _ => rows
                    .chunks_exact(n)
                    .zip(codes.chunks_exact(n))
                    .map(|(row, c)| normal_equations_row(ty, row, h, c, refit.full))
                    .collect(),
            };
            let new: Vec<Vec<grid::BlockGrid>> = eqs
                .into_iter()
                .zip(trial.chunks_exact_mut(row_bytes))
                .zip(&grids)
                .map(|((eq, o), g)| refit_params(ty, n, eq, g, o))
                .collect();
            let (c2, l2) = stock_pass(ty, rows, f, band, &new, mode);
            let mut any = false;
            for (r, g) in new.into_iter().enumerate() {
                if l2[r] < loss[r] {
                    any = true;
                    loss[r] = l2[r];
                    grids[r] = g;
                    codes[r * n..(r + 1) * n].copy_from_slice(&c2[r * n..(r + 1) * n]);
                    out[r * row_bytes..(r + 1) * row_bytes]
                        .copy_from_slice(&trial[r * row_bytes..(r + 1) * row_bytes]);
                } else {
                    // Refit from the kept row next time (deterministic either way).
                    trial[r * row_bytes..(r + 1) * row_bytes]
                        .copy_from_slice(&out[r * row_bytes..(r + 1) * row_bytes]);
                }
            }
            if !any {
                break;
            }
        }
    }
    for (o, c) in out.chunks_exact_mut(bb).zip(codes.chunks_exact(bs)) {
        grid::pack(ty, c, o);
    }
}

/// How the stock rows are swept: [`sweep`] (GEMM), [`sweep_scalar`] (its reference), or one row
/// at a time by the plain GPTQ loop (the reference for the grouping, tests).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    Gemm,
    #[cfg(test)]
    Scalar,
    #[cfg(test)]
    OneRow,
}

/// Refitting the block parameters after the sweep ([`quantize_rows_stock`]): `passes` rounds,
/// each under the full damped Hessian (`full`) or its diagonal only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Refit {
    pub passes: usize,
    pub full: bool,
}

impl Refit {
    pub const NONE: Refit = Refit {
        passes: 0,
        full: true,
    };
    /// What `tq convert` does: two passes under the full Hessian. On SmolLM2 at llama.cpp's
    /// Q4_K_M types (docs/bench/stock-ldlq.md) the mean KLD went 0.02522 → 0.02513 (4 passes: 0.02496,
    /// the diagonal instead of the full Hessian: 0.02517) for 3.3× the LDLQ CPU time.
    pub const DEFAULT: Refit = Refit {
        passes: 2,
        full: true,
    };
}

/// One sweep of `rows` onto fixed `grids`: every row's codes (natural column order) and its sweep
/// loss `Σ e²`.
fn stock_pass(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    band: usize,
    grids: &[Vec<grid::BlockGrid>],
    mode: Mode,
) -> (Vec<i32>, Vec<f64>) {
    let n = f.n;
    let bs = ty.block_size();
    let nr = rows.len() / n;
    let order = |t: usize| f.perm.as_ref().map_or(t, |p| p[t]);
    // x in the sweep's order.
    let mut x: Vec<f64> = rows
        .chunks_exact(n)
        .flat_map(|row| (0..n).map(move |t| row[order(t)] as f64))
        .collect();
    let mut codes = vec![0i32; nr * n];
    let round = |r: usize, t: usize, xr: &[f64]| {
        let j = order(t);
        let (g, i) = (&grids[r][j / bs], j % bs);
        let c = g.nearest(i, xr[t]);
        codes[r * n + j] = c;
        g.value(i, c) as f64
    };
    let loss = match mode {
        Mode::Gemm => sweep(&mut x, n, f, band, round),
        #[cfg(test)]
        Mode::Scalar => sweep_scalar(&mut x, n, f, band, round),
        #[cfg(test)]
        Mode::OneRow => {
            let mut round = round;
            let band = if band == 0 { n } else { band };
            let mut loss = vec![0f64; nr];
            for (r, xr) in x.chunks_exact_mut(n).enumerate() {
                for t in 0..n {
                    let q = round(r, t, xr);
                    let urow = &f.u[t * n..(t + 1) * n];
                    let err = (xr[t] - q) / urow[t];
                    loss[r] += err * err;
                    for k in t + 1..(t + 1 + band).min(n) {
                        xr[k] -= err * urow[k];
                    }
                }
            }
            loss
        }
    };
    (codes, loss)
}

/// Every block of `row` fitted (its parameters written into `out`) under the damped Hessian
/// diagonal, and the grids the sweep rounds onto.
fn fit_grids(ty: TensorType, row: &[f32], f: &Factor, out: &mut [u8]) -> Vec<grid::BlockGrid> {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let mut grids: Vec<grid::BlockGrid> = (0..row.len() / bs)
        .map(|_| grid::BlockGrid::new(ty))
        .collect();
    let mut ws = vec![0f32; bs];
    for (blk, (o, g)) in out.chunks_exact_mut(bb).zip(grids.iter_mut()).enumerate() {
        let j0 = blk * bs;
        // Relative weights: normalized by the block's mean so f32 never over/underflows.
        let mean = f.diag[j0..j0 + bs].iter().sum::<f64>() / bs as f64;
        for i in 0..bs {
            ws[i] = if mean > 0.0 {
                (f.diag[j0 + i] / mean) as f32
            } else {
                1.0
            };
        }
        grid::fit(ty, &row[j0..j0 + bs], &ws, o, g);
    }
    grids
}

/// The block parameters of one row refitted to its codes: with the codes fixed, the decoded row
/// `q = D p` is linear in the group parameters `p` (each group's scale, and min for q4_K/q5_K),
/// so `min_p (w − D p) H (w − D p)ᵀ` is the least-squares problem `(Dᵀ H D) p = Dᵀ H w`, whose
/// normal equations ([`normal_equations_row`], [`normal_equations_rows`]) are solved jointly for
/// the whole row (a Cholesky of groups³/3). Then the stock format's own quantization of the
/// parameters (`grid::set_params`) writes them into `out` and gives the new grids. A group whose
/// codes are all zero keeps its parameters; a singular system keeps the old grids.
fn refit_params(
    ty: TensorType,
    n: usize,
    (mut a, mut rhs): (Vec<f64>, Vec<f64>),
    old: &[grid::BlockGrid],
    out: &mut [u8],
) -> Vec<grid::BlockGrid> {
    let (bs, bb, gs) = (ty.block_size(), ty.block_bytes(), grid::group_size(ty));
    let ng = n / gs;
    let hm = grid::has_min(ty);
    let np = rhs.len();
    // The current parameters: kept for groups the codes do not determine.
    let mut p0 = vec![0f64; np];
    for g in 0..ng {
        let (blk, i) = ((g * gs) / bs, (g * gs) % bs);
        p0[g] = old[blk].a[i] as f64;
        if hm {
            p0[ng + g] = old[blk].b[i] as f64;
        }
    }
    let scale = (0..np).map(|p| a[p * np + p]).fold(0f64, f64::max);
    if scale <= 0.0 || !scale.is_finite() {
        return old.to_vec();
    }
    for p in 0..np {
        if a[p * np + p] <= 1e-12 * scale {
            for q in 0..np {
                a[p * np + q] = 0.0;
                a[q * np + p] = 0.0;
            }
            a[p * np + p] = 1.0;
            rhs[p] = p0[p];
        } else {
            a[p * np + p] *= 1.0 + 1e-9;
        }
    }
    let Some(p) = cholesky_solve(&mut a, &rhs, np) else {
        return old.to_vec();
    };
    let mut grids: Vec<grid::BlockGrid> = (0..n / bs).map(|_| grid::BlockGrid::new(ty)).collect();
    let per = bs / gs;
    let (mut sc, mut mn) = (vec![0f32; per], vec![0f32; per]);
    for (blk, (o, g)) in out.chunks_exact_mut(bb).zip(grids.iter_mut()).enumerate() {
        for k in 0..per {
            let gi = blk * per + k;
            let (s, b) = (p[gi], if hm { p[ng + gi] } else { 0.0 });
            // q4_K/q5_K store a scale and a min that are both >= 0.
            sc[k] = if hm { s.max(0.0) as f32 } else { s as f32 };
            mn[k] = b.max(0.0) as f32;
        }
        grid::set_params(ty, &sc, &mn, o, g);
    }
    grids
}

/// The refit's normal equations `(Dᵀ H D, Dᵀ H w)` for one row with codes `c` (natural order):
/// parameters are every group's scale (`0..ng`), then for q4_K/q5_K every group's min
/// (`ng..2ng`), the decoded value being `scale·c − min`. Under the full Hessian (`full`, n²
/// multiply-adds) or its diagonal. The reference [`normal_equations_rows`] is held to.
fn normal_equations_row(
    ty: TensorType,
    row: &[f32],
    h: &[f64],
    c: &[i32],
    full: bool,
) -> (Vec<f64>, Vec<f64>) {
    let n = row.len();
    let gs = grid::group_size(ty);
    let ng = n / gs;
    let hm = grid::has_min(ty);
    let np = if hm { 2 * ng } else { ng };
    let cf: Vec<f64> = c.iter().map(|&v| grid::code_value(ty, v)).collect();
    let mut a = vec![0f64; np * np];
    let mut rhs = vec![0f64; np];
    let (mut m, mut nn) = (vec![0f64; ng], vec![0f64; ng]);
    for t in 0..n {
        let gt = t / gs;
        let hrow = &h[t * n..(t + 1) * n];
        let mut hx = 0f64;
        if full {
            for g in 0..ng {
                let (mut sm, mut sn) = (0f64, 0f64);
                for k in g * gs..(g + 1) * gs {
                    sm += hrow[k] * cf[k];
                    sn += hrow[k];
                }
                m[g] = sm;
                nn[g] = sn;
            }
            for (k, &hv) in hrow.iter().enumerate() {
                hx += hv * row[k] as f64;
            }
        } else {
            m.fill(0.0);
            nn.fill(0.0);
            m[gt] = hrow[t] * cf[t];
            nn[gt] = hrow[t];
            hx = hrow[t] * row[t] as f64;
        }
        let ct = cf[t];
        for g in 0..ng {
            a[gt * np + g] += ct * m[g];
            if hm {
                a[gt * np + ng + g] -= ct * nn[g];
                a[(ng + gt) * np + g] -= m[g];
                a[(ng + gt) * np + ng + g] += nn[g];
            }
        }
        rhs[gt] += ct * hx;
        if hm {
            rhs[ng + gt] -= hx;
        }
    }
    (a, rhs)
}

/// [`normal_equations_row`] (full Hessian) for a group of rows as GEMMs: `H W` once, and for
/// each group `g` the products `H D_g` of every row's group-`g` codes (`(rows × gs)·(gs × n)`),
/// reduced per row. n²·rows multiply-adds like the scalar loops, at GEMM speed.
fn normal_equations_rows(
    ty: TensorType,
    rows: &[f32],
    h: &[f64],
    codes: &[i32],
    n: usize,
) -> Vec<(Vec<f64>, Vec<f64>)> {
    use faer::{linalg::matmul::matmul, Accum, MatRef};
    let nr = rows.len() / n;
    let gs = grid::group_size(ty);
    let ng = n / gs;
    let hm = grid::has_min(ty);
    let np = if hm { 2 * ng } else { ng };
    let hmat = MatRef::from_row_major_slice(h, n, n);
    let x = Mat::<f64>::from_fn(nr, n, |r, t| rows[r * n + t] as f64);
    let c = Mat::<f64>::from_fn(nr, n, |r, t| grid::code_value(ty, codes[r * n + t]));
    let mut hx = Mat::<f64>::zeros(nr, n);
    matmul(hx.as_mut(), Accum::Replace, x.as_ref(), hmat, 1.0, Par::Seq);
    let mut res: Vec<(Vec<f64>, Vec<f64>)> = (0..nr)
        .map(|_| (vec![0f64; np * np], vec![0f64; np]))
        .collect();
    let mut mg = Mat::<f64>::zeros(nr, n);
    for g in 0..ng {
        // mg[r][t] = Σ_{s∈g} c_rs H_st: column t of H D_g (H symmetric).
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
        // The mins' columns are the same for every row: Σ_{s∈g} H_ts.
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

/// Solve `A p = b` for a symmetric positive definite `A` (n×n, row-major, overwritten by its
/// Cholesky factor); `None` when `A` is not positive definite.
fn cholesky_solve(a: &mut [f64], b: &[f64], n: usize) -> Option<Vec<f64>> {
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

/// The one-row sweep of a stock type (the plain GPTQ loop, refit included), kept as the reference
/// [`quantize_rows_stock`] is held to.
#[cfg(test)]
fn quantize_row_stock(
    ty: TensorType,
    row: &[f32],
    f: &Factor,
    band: usize,
    refit: Refit,
    out: &mut [u8],
) {
    quantize_rows_stock(ty, row, f, band, refit, out, Mode::OneRow)
}

/// `Σ_rows (w − q) H (w − q)ᵀ / Σ_rows w H wᵀ`: the calibration-weighted relative error.
pub fn proxy_loss(h: &[f64], n: usize, w: &[f32], q: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (wr, qr) in w.chunks(n).zip(q.chunks(n)) {
        let e: Vec<f64> = wr.iter().zip(qr).map(|(a, b)| (*a - *b) as f64).collect();
        let wv: Vec<f64> = wr.iter().map(|&a| a as f64).collect();
        for i in 0..n {
            let (mut he, mut hw) = (0f64, 0f64);
            for k in 0..n {
                he += h[i * n + k] * e[k];
                hw += h[i * n + k] * wv[k];
            }
            num += e[i] * he;
            den += wv[i] * hw;
        }
    }
    num / den
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    /// Correlated inputs: x = A z with a random mixing matrix, H = Σ x xᵀ.
    pub(super) fn hessian(n: usize, tokens: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        let a: Vec<f64> = (0..n * n).map(|_| lcg(&mut s)).collect();
        let mut h = vec![0f64; n * n];
        for _ in 0..tokens {
            let z: Vec<f64> = (0..n).map(|_| lcg(&mut s)).collect();
            let x: Vec<f64> = (0..n)
                .map(|i| (0..n).map(|k| a[i * n + k] * z[k]).sum::<f64>() + 3.0 * z[i])
                .collect();
            for i in 0..n {
                for j in 0..n {
                    h[i * n + j] += x[i] * x[j];
                }
            }
        }
        h
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

    #[test]
    fn deterministic_across_thread_counts() {
        let n = 64;
        let h = hessian(n, 100, 3);
        let mut s = 4;
        let w: Vec<f32> = (0..16 * n).map(|_| lcg(&mut s) as f32).collect();
        let f = factor(&rotate_hessian(&h, n), n, 0.01, "w").unwrap();
        let a = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| quantize_ldlq(TensorType::TQ4_1S, &w, n, &f, 0));
        let b = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap()
            .install(|| quantize_ldlq(TensorType::TQ4_1S, &w, n, &f, 0));
        assert_eq!(a, b);
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

    /// Stock types: LDLQ in the weights' own basis writes ordinary blocks (decoded by the
    /// registry's stock decoders) with a lower Hessian-weighted error than round-to-nearest, and
    /// lower than importance-weighted round-to-nearest (the `--imatrix` path, diagonal only).
    #[test]
    fn stock_ldlq_beats_rtn_on_correlated_inputs() {
        use TensorType::*;
        let n = 256;
        let rows = 24;
        let h = hessian(n, 400, 7);
        let mut s = 11;
        let w: Vec<f32> = (0..rows * n).map(|_| lcg(&mut s) as f32 * 0.05).collect();
        for ty in [Q8_0, Q4_0, Q5_0, Q4K, Q5K, Q6K, IQ4NL, IQ4XS] {
            let f = factor_act_order(h.clone(), n, 0.01, Refit::DEFAULT.passes, "w").unwrap();
            let bytes = ty.bytes_for(w.len() as u64).unwrap() as usize;
            let dec = |b: &[u8]| {
                let mut q = vec![0f32; w.len()];
                crate::types::dequantize(ty, b, &mut q, "w").unwrap();
                q
            };
            let mut rtn = vec![0u8; bytes];
            crate::types::quantize(ty, &w, &mut rtn, "w").unwrap();
            let mut wrtn = vec![0u8; bytes];
            let imp: Vec<f32> = (0..w.len()).map(|i| f.diag[i % n] as f32).collect();
            grid::quantize_weighted(ty, &w, &imp, &mut wrtn);
            let q = quantize_ldlq(ty, &w, n, &f, 0);
            assert_eq!(q.len(), bytes);
            let (l_rtn, l_w, l_q) = (
                proxy_loss(&h, n, &w, &dec(&rtn)),
                proxy_loss(&h, n, &w, &dec(&wrtn)),
                proxy_loss(&h, n, &w, &dec(&q)),
            );
            eprintln!("{ty}: proxy loss rtn {l_rtn:.3e} weighted {l_w:.3e} ldlq {l_q:.3e}");
            assert!(
                l_q < 0.8 * l_rtn && l_q < 0.8 * l_w,
                "{ty}: {l_q} vs {l_rtn} / {l_w}"
            );
        }
    }

    #[test]
    fn stock_ldlq_is_deterministic_across_thread_counts() {
        let n = 512;
        let h = hessian(n, 60, 3);
        let mut s = 4;
        let w: Vec<f32> = (0..12 * n).map(|_| lcg(&mut s) as f32).collect();
        let f = factor_act_order(h.clone(), n, 0.01, Refit::DEFAULT.passes, "w").unwrap();
        for ty in [TensorType::Q4K, TensorType::Q5_0, TensorType::IQ4XS] {
            let run = |t: usize| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .unwrap()
                    .install(|| quantize_ldlq(ty, &w, n, &f, 64))
            };
            assert_eq!(run(1), run(3), "{ty}");
        }
    }
}

#[cfg(test)]
mod group_tests {
    use super::tests::hessian;
    use super::*;

    /// The lazy-batch GEMM sweep against the scalar one-column-at-a-time sweep, for every LDLQ
    /// type, full and narrow bands (narrower and wider than a batch), more than one batch, and
    /// a row count that leaves a partial group: the same feedback summed in another order, so
    /// nearly all bytes agree and the calibration-weighted error is the same to 1e-3. The scalar
    /// group sweep is held bit-exact to one-row sweeps.
    #[test]
    fn gemm_sweep_matches_the_scalar_sweep() {
        let (n, rows) = (384usize, 37usize);
        let h = hessian(n, 500, 11);
        let w = uniform_rows(rows * n, 3);
        for ty in [TensorType::TQ4_1S, TensorType::TQ3_1S, TensorType::TQ2R] {
            let hr = if ty.is_row_rotated() {
                super::super::ldlq2::rotate_hessian_rows(&h, n).unwrap()
            } else {
                rotate_hessian(&h, n)
            };
            let f = factor(&hr, n, 0.01, "w").unwrap();
            let rb = n / QK * ty.block_bytes();
            for band in [0, 7, 200] {
                let got = quantize_ldlq(ty, &w, n, &f, band);
                let mut scalar = vec![0u8; rows * rb];
                let mut one = vec![0u8; rows * rb];
                for (o, row) in one.chunks_mut(rb).zip(w.chunks(n)) {
                    if ty.is_row_rotated() {
                        super::super::ldlq2::quantize_row(row, &f, band, o)
                    } else {
                        quantize_row(ty, row, &f, band, o)
                    }
                }
                for (o, rws) in scalar.chunks_mut(rb * ROWS).zip(w.chunks(n * ROWS)) {
                    if ty.is_row_rotated() {
                        super::super::ldlq2::quantize_rows_with(rws, &f, band, o, true)
                    } else {
                        quantize_rows_with(ty, rws, &f, band, o, true)
                    }
                }
                assert_sweeps_agree(ty, band, &h, &w, &got, &scalar, &one);
            }
        }
    }

    /// `scalar` (grouped scalar sweep) equals `one` (one-row sweeps) bit for bit; `got` (the GEMM
    /// sweep) has ≥ 97% of its bytes equal and the same calibration-weighted error to 1e-3.
    fn assert_sweeps_agree(
        ty: TensorType,
        band: usize,
        h: &[f64],
        w: &[f32],
        got: &[u8],
        scalar: &[u8],
        one: &[u8],
    ) {
        let n = (h.len() as f64).sqrt() as usize;
        assert!(
            scalar == one,
            "{} band {band}: scalar group sweep",
            ty.name()
        );
        let same = got.iter().zip(one).filter(|(a, b)| a == b).count();
        assert!(
            same as f64 >= 0.97 * got.len() as f64,
            "{} band {band}: {same} of {} bytes equal",
            ty.name(),
            got.len()
        );
        let loss = |b: &[u8]| {
            let mut q = vec![0f32; w.len()];
            crate::types::dequantize_rows(ty, b, &mut q, n, "w").unwrap();
            proxy_loss(h, n, w, &q)
        };
        let (lg, l1) = (loss(got), loss(one));
        assert!(
            (lg - l1).abs() <= 1e-3 * l1,
            "{} band {band}: loss {lg} vs one-row {l1}",
            ty.name()
        );
    }

    /// `len` values uniform in [-1, 1) from a 64-bit LCG seeded with `seed`.
    fn uniform_rows(len: usize, mut s: u64) -> Vec<f32> {
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
            })
            .collect()
    }

    /// The stock types' grouped sweep: the scalar group sweep equals one-row sweeps bit for bit,
    /// and the GEMM sweep agrees on nearly all bytes with the same calibration-weighted error.
    #[test]
    fn stock_gemm_sweep_matches_one_row_sweeps() {
        let (n, rows) = (512usize, 37usize);
        let h = hessian(n, 700, 5);
        let w = uniform_rows(rows * n, 9);
        let f = factor_act_order(h.clone(), n, 0.01, Refit::DEFAULT.passes, "w").unwrap();
        for ty in [
            TensorType::Q4_0,
            TensorType::Q8_0,
            TensorType::Q2K,
            TensorType::Q3K,
            TensorType::Q4K,
            TensorType::Q6K,
            TensorType::IQ4NL,
            TensorType::IQ4XS,
        ] {
            let rb = n / ty.block_size() * ty.block_bytes();
            let refit2 = Refit {
                passes: 2,
                full: true,
            };
            for (band, refit) in [(0, Refit::NONE), (7, Refit::NONE), (200, Refit::NONE)]
                .into_iter()
                .chain([(0, refit2), (200, refit2)])
            {
                let got = quantize_ldlq_refit(ty, &w, n, &f, band, refit);
                let mut one = vec![0u8; rows * rb];
                for (o, row) in one.chunks_mut(rb).zip(w.chunks(n)) {
                    quantize_row_stock(ty, row, &f, band, refit, o);
                }
                let mut scalar = vec![0u8; rows * rb];
                for (o, rws) in scalar.chunks_mut(rb * ROWS).zip(w.chunks(n * ROWS)) {
                    quantize_rows_stock(ty, rws, &f, band, refit, o, Mode::Scalar);
                }
                assert_sweeps_agree(ty, band, &h, &w, &got, &scalar, &one);
            }
        }
    }

    /// The refit's normal equations as GEMMs equal the scalar loops (to f64 rounding), for a
    /// symmetric type, q6_K's 16-value groups, q4_K's scales and mins, and the iq4 table codes.
    #[test]
    fn refit_normal_equations_gemm_match_the_scalar_loops() {
        let (n, rows) = (512usize, 5usize);
        let h = hessian(n, 700, 8);
        let w = uniform_rows(rows * n, 3);
        for ty in [
            TensorType::Q5_0,
            TensorType::Q6K,
            TensorType::Q4K,
            TensorType::IQ4NL,
            TensorType::IQ4XS,
        ] {
            let g = grid::BlockGrid::new(ty);
            let mut s = 11u64;
            let codes: Vec<i32> = (0..rows * n)
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(7);
                    g.lo + ((s >> 33) % (g.hi - g.lo + 1) as u64) as i32
                })
                .collect();
            let fast = normal_equations_rows(ty, &w, &h, &codes, n);
            for (r, (fa, fr)) in fast.iter().enumerate() {
                let (sa, sr) =
                    normal_equations_row(ty, &w[r * n..][..n], &h, &codes[r * n..][..n], true);
                let m = sa.iter().fold(0f64, |a, v| a.max(v.abs()));
                let mr = sr.iter().fold(0f64, |a, v| a.max(v.abs()));
                for (x, y) in fa.iter().zip(&sa) {
                    assert!((x - y).abs() <= 1e-10 * m, "{ty} row {r}: A {x} vs {y}");
                }
                for (x, y) in fr.iter().zip(&sr) {
                    assert!((x - y).abs() <= 1e-10 * mr, "{ty} row {r}: rhs {x} vs {y}");
                }
            }
        }
    }

    /// `--ldlq-refit N` reaches the sweep through the factor: N passes as asked, and with 0 the
    /// factor keeps no Hessian copy and writes the plain sweep's bytes.
    #[test]
    fn factor_carries_the_refit_passes() {
        let (n, rows) = (256usize, 8usize);
        let h = hessian(n, 500, 3);
        let w = uniform_rows(rows * n, 4);
        let ty = TensorType::Q4K;
        let f2 = factor_act_order(h.clone(), n, 0.01, 2, "w").unwrap();
        let f0 = factor_act_order(h.clone(), n, 0.01, 0, "w").unwrap();
        let f1 = factor_act_order(h, n, 0.01, 1, "w").unwrap();
        assert!(f0.h.is_none() && f1.h.is_some() && f2.h.is_some());
        assert_eq!(f0.u, f2.u, "the factor itself does not depend on the refit");
        let plain = quantize_ldlq_refit(ty, &w, n, &f2, 0, Refit::NONE);
        assert_eq!(quantize_ldlq(ty, &w, n, &f0, 0), plain);
        let two = quantize_ldlq(ty, &w, n, &f2, 0);
        assert_eq!(two, quantize_ldlq_refit(ty, &w, n, &f2, 0, Refit::DEFAULT));
        let one = quantize_ldlq(ty, &w, n, &f1, 0);
        let r1 = Refit {
            passes: 1,
            full: true,
        };
        assert_eq!(one, quantize_ldlq_refit(ty, &w, n, &f2, 0, r1));
        assert_ne!(
            two, plain,
            "the refit changed nothing on these rows: the test is vacuous"
        );
    }

    /// Refitting the block parameters to the rounded codes never raises the calibration loss
    /// under the damped Hessian (a row keeps a refit only when its loss falls), lowers it for
    /// every type, keeps the bytes' size, and does not depend on the thread count.
    #[test]
    fn refit_lowers_the_damped_loss_deterministically() {
        let (n, rows) = (512usize, 40usize);
        let h = hessian(n, 900, 12);
        let w = uniform_rows(rows * n, 21);
        let f = factor_act_order(h, n, 0.01, Refit::DEFAULT.passes, "w").unwrap();
        let hd = f.h.clone().unwrap();
        for ty in [
            TensorType::Q4_0,
            TensorType::Q5_0,
            TensorType::Q8_0,
            TensorType::Q2K,
            TensorType::Q3K,
            TensorType::Q4K,
            TensorType::Q5K,
            TensorType::Q6K,
            TensorType::IQ4NL,
            TensorType::IQ4XS,
        ] {
            let loss = |b: &[u8]| {
                let mut q = vec![0f32; w.len()];
                crate::types::dequantize_rows(ty, b, &mut q, n, "w").unwrap();
                proxy_loss(&hd, n, &w, &q)
            };
            let base = quantize_ldlq_refit(ty, &w, n, &f, 0, Refit::NONE);
            let r = Refit {
                passes: 2,
                full: true,
            };
            let re = quantize_ldlq_refit(ty, &w, n, &f, 0, r);
            assert_eq!(re.len(), base.len());
            let (lb, lr) = (loss(&base), loss(&re));
            assert!(lr < lb, "{ty}: refit {lr} vs {lb}");
            let one = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap()
                .install(|| quantize_ldlq_refit(ty, &w, n, &f, 0, r));
            assert!(one == re, "{ty}: bytes depend on the thread count");
        }
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
}
