//! Q2_K, Q4_K and Q5_K weighted by an importance matrix, as `llama-quantize --imatrix` writes
//! them (ggml's `quantize_row_q{2,4,5}_K_impl`, learnt from llama.cpp's `ggml-quants.c`; checked
//! live and by recorded hashes in `tests/kquants_imatrix_llama.rs`).
//!
//! Per 256-value super-block, with `imp` one importance per column of the row:
//! - weights `imp[j]·sqrt(σ² + x[j]²)`, `σ² = 2·Σx²/256` of the super-block (Q2_K: `Σx²/256`);
//! - per sub-block (32 values; Q2_K 16) ggml's `make_qkx3_quants` with those weights: 37 trial
//!   inverse scales `(−0.9 + 0.05·k + nmax)/(max − min)`, each refined by weighted least squares
//!   (with weights given it is `make_qkx2_quants` step for step: [`make_qkx2_quants`]);
//! - the sub-block scales and mins quantized by ggml's weighted `make_qp_quants` (6-bit, Q2_K
//!   4-bit), each sub-block weighted by the sum of its weights, in place of the reference
//!   quantizer's `max/63`;
//! - every level recomputed from the stored scales (a sub-block whose scale decodes to 0 keeps
//!   the levels its search found).
//!
//! [`fit_q45_k`] and [`fit_q2_k`] are the parameter halves, shared with `types::grid`'s fit
//! (LDLQ over q2_K/q4_K/q5_K starts from them, with the Hessian diagonal as the weights).

use super::q45_k::{pack_q4_k, pack_q5_k, pack_scale_min_k4, requantize};
use super::search::{make_qkx2_quants, make_qp_quants};
use super::{pack_2bit, put_f16, Q2_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, QK_K};

/// ggml's `make_qkx3_quants` with llama.cpp's imatrix settings over one group of `N` values.
#[inline]
fn qkx3<const N: usize>(nmax: i32, x: &[f32], w: &[f32], l: &mut [u8]) -> (f32, f32) {
    let mut laux = [0u8; N];
    make_qkx2_quants::<N>(
        nmax,
        x.try_into().expect("a whole group"),
        w.try_into().expect("a whole group"),
        l.try_into().expect("a whole group"),
        &mut laux,
        -0.9,
        0.05,
        36,
        false,
    )
}

/// The parameters of one Q4_K (`nmax` 15) / Q5_K (31) block of values `x` with weights `w`:
/// `make_qkx3_quants` per 32-value group, then the 6-bit scales and mins by `make_qp_quants`
/// weighted by each group's weight sum, written with the f16 `d`/`dmin` into `y[0..16]`. The
/// levels the group searches found are left in `l`.
pub(crate) fn fit_q45_k(x: &[f32], w: &[f32], nmax: i32, y: &mut [u8], l: &mut [u8; QK_K]) {
    let mut scales = [0f32; QK_K / 32];
    let mut mins = [0f32; QK_K / 32];
    let mut sw = [0f32; QK_K / 32];
    for j in 0..QK_K / 32 {
        let r = 32 * j..32 * j + 32;
        let mut sumw = 0f32;
        for &v in &w[r.clone()] {
            sumw += v;
        }
        sw[j] = sumw;
        (scales[j], mins[j]) = qkx3::<32>(nmax, &x[r.clone()], &w[r.clone()], &mut l[r]);
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d = make_qp_quants(63, &scales, &sw, &mut ls);
    let m = make_qp_quants(63, &mins, &sw, &mut lm);
    if nmax == 31 {
        // Q5_K clamps the stored levels (`MIN(63, ls)`); Q4_K stores them as found.
        for v in ls.iter_mut().chain(lm.iter_mut()) {
            *v = (*v).min(63);
        }
    }
    pack_scale_min_k4(&ls, &lm, &mut y[4..16]);
    put_f16(y, 0, d);
    put_f16(y, 2, m);
}

/// The weights of one super-block as ggml forms them: `qw[j]·sqrt(σ² + x[j]²)`, `σ²` the
/// super-block's `scale·Σx²/256` (Σ in f32, index order).
fn block_weights(x: &[f32], qw: &[f32], scale: f32, w: &mut [f32; QK_K]) {
    let mut sum_x2 = 0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let sigma2 = scale * sum_x2 / QK_K as f32;
    for ((o, &q), &v) in w.iter_mut().zip(qw).zip(x) {
        *o = q * (sigma2 + v * v).sqrt();
    }
}

fn q45_rows(src: &[f32], imp: &[f32], out: &mut [u8], nmax: i32, bytes: usize) {
    let n = imp.len();
    let (mut w, mut l) = ([0f32; QK_K], [0u8; QK_K]);
    for (row, ob) in src
        .chunks_exact(n)
        .zip(out.chunks_exact_mut(n / QK_K * bytes))
    {
        for ((x, qw), y) in row
            .chunks_exact(QK_K)
            .zip(imp.chunks_exact(QK_K))
            .zip(ob.chunks_exact_mut(bytes))
        {
            block_weights(x, qw, 2.0, &mut w);
            fit_q45_k(x, &w, nmax, y, &mut l);
            requantize(x, y, nmax, &mut l);
            if nmax == 15 {
                pack_q4_k(&l, y);
            } else {
                pack_q5_k(&l, y);
            }
        }
    }
}

/// Q4_K rows weighted by an importance matrix (ggml's `quantize_row_q4_K_impl`): `src` is whole
/// rows of `imp.len()` values, `imp` one importance per column.
pub(crate) fn quantize_q4_k_imatrix(src: &[f32], imp: &[f32], out: &mut [u8]) {
    q45_rows(src, imp, out, 15, Q4_K_BYTES)
}

/// Q5_K rows weighted by an importance matrix (ggml's `quantize_row_q5_K_impl`).
pub(crate) fn quantize_q5_k_imatrix(src: &[f32], imp: &[f32], out: &mut [u8]) {
    q45_rows(src, imp, out, 31, Q5_K_BYTES)
}

/// Q2_K rows weighted by an importance matrix (ggml's `quantize_row_q2_K_impl`): 16-value
/// groups of `make_qkx3_quants` (nmax 3), 4-bit scales and mins by `make_qp_quants` (nmax 15).
pub(crate) fn quantize_q2_k_imatrix(src: &[f32], imp: &[f32], out: &mut [u8]) {
    let n = imp.len();
    let (mut w, mut l) = ([0f32; QK_K], [0u8; QK_K]);
    for (row, ob) in src
        .chunks_exact(n)
        .zip(out.chunks_exact_mut(n / QK_K * Q2_K_BYTES))
    {
        for ((x, qw), y) in row
            .chunks_exact(QK_K)
            .zip(imp.chunks_exact(QK_K))
            .zip(ob.chunks_exact_mut(Q2_K_BYTES))
        {
            block_weights(x, qw, 1.0, &mut w);
            let (d, dmin) = fit_q2_k(x, &w, y, &mut l);
            let (sc, rest) = y.split_at_mut(16);
            super::q2_k::levels_from_scales(x, sc, d, dmin, &mut l);
            pack_2bit(&l, &mut rest[..64]);
        }
    }
}

/// The parameters of one Q2_K block of values `x` with weights `w`: `make_qkx3_quants` (nmax 3)
/// per 16-value group, the 4-bit scales and mins by `make_qp_quants` (nmax 15) weighted by each
/// group's weight sum, written into `y[0..16]` with the f16 `d`/`dmin`; returns the stored
/// `(d, dmin)`. The levels the group searches found are left in `l`. Shared with
/// `types::grid`'s fit (LDLQ over q2_K starts from it, the Hessian diagonal as the weights).
pub(crate) fn fit_q2_k(x: &[f32], w: &[f32], y: &mut [u8], l: &mut [u8; QK_K]) -> (f32, f32) {
    let mut scales = [0f32; QK_K / 16];
    let mut mins = [0f32; QK_K / 16];
    let mut sw = [0f32; QK_K / 16];
    for j in 0..QK_K / 16 {
        let r = 16 * j..16 * j + 16;
        for &v in &w[r.clone()] {
            sw[j] += v;
        }
        (scales[j], mins[j]) = qkx3::<16>(3, &x[r.clone()], &w[r.clone()], &mut l[r]);
    }
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    let dm = make_qp_quants(15, &scales, &sw, &mut ls);
    let mm = make_qp_quants(15, &mins, &sw, &mut lm);
    let d = put_f16(y, 80, dm);
    let dmin = put_f16(y, 82, mm);
    for j in 0..QK_K / 16 {
        y[j] = ls[j] | (lm[j] << 4);
    }
    (d, dmin)
}
