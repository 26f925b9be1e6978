//! IQ1_S / IQ1_M encoders, byte for byte what `llama-quantize` writes (ggml's
//! `quantize_row_iq1_s_impl` / `quantize_row_iq1_m_impl`; checked in `tests/iquants3_llama.rs`).
//!
//! A group (32 values for IQ1_S, 16 for IQ1_M) takes values `s · (l − 1 + δ)`, `l ∈ {0, 1, 2}`,
//! with a shift `δ = ±1/8` per group (IQ1_S) or per 8 values (IQ1_M). With weights `w`
//! (`imp · √(σ² + x²)`, `σ² = 2·Σx²/256` over the super-block; IQ1_M without an importance
//! matrix: `x²`), the weighted least-squares problem is solved exactly over every split of the
//! group's values, sorted ascending (a stable sort: ties keep their order, as glibc's merge-sort
//! `qsort` does), into three runs `l = 0, 1, 2`: prefix sums of `w·x` and `w` give each split's
//! fit `(Σ w x q)² / Σ w q²`, for each choice of shifts. The best split's 8-value tuples that are
//! not rows of `iq1s_grid` become their neighbour (`iq13_gridmap`, three distance shells) of
//! least `Σ w (s·q − x)²`, and the scale is refitted. The super-block scale `d = max_scale / 15`
//! is stored as f16 of `d · 1.125` (IQ1_S), the 3-bit group scales as `round((s/d − 1)/2)`; IQ1_M
//! refits `d` by least squares over the whole super-block at the stored group scales and stores
//! f16 of `d · 1.1125` in the scale words' top nibbles.
//!
//! llama.cpp refuses IQ1_S without an importance matrix (`quantize_iq1_s` asserts one); tq's
//! registry encoder for IQ1_S uses importance 1 for every column, which is what
//! `llama-quantize --imatrix` writes for an imatrix of ones.

use super::iq13_gridmap::{GridMap, Lookup};
use super::{grids, IQ1_M_BYTES, IQ1_S_BYTES, QK_K};
use crate::types::kquants::{nearest_int, put_f16};
use std::sync::OnceLock;

/// ggml's `IQ1S_DELTA` / `IQ1M_DELTA`.
const DELTA: f32 = 0.125;
const GROUP_MAX_EPS_S: f32 = 1e-12;
const GROUP_MAX_EPS_M: f32 = 1e-7;
/// The group values for a positive / negative shift.
const X_P: [f32; 3] = [-1.0 + DELTA, DELTA, 1.0 + DELTA];
const X_M: [f32; 3] = [-1.0 - DELTA, -DELTA, 1.0 - DELTA];

pub(crate) fn grid() -> &'static GridMap<8> {
    static G: OnceLock<GridMap<8>> = OnceLock::new();
    G.get_or_init(|| GridMap::new(&grids::IQ1S_PACKED, 2, 2, 3))
}

fn sigma2(xbl: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in xbl {
        s += v * v;
    }
    2.0 * s / QK_K as f32
}

fn weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32, w: &mut [f32]) {
    match qw {
        Some(q) => {
            for i in 0..w.len() {
                w[i] = q[i] * (sigma2 + xb[i] * xb[i]).sqrt();
            }
        }
        None => {
            for i in 0..w.len() {
                w[i] = xb[i] * xb[i];
            }
        }
    }
}

fn fmax(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Indices of `xb` in ascending order of value, ties in index order.
fn sorted(xb: &[f32], idx: &mut [usize]) {
    for (j, v) in idx.iter_mut().enumerate() {
        *v = j;
    }
    idx.sort_by(|&a, &b| {
        if xb[a] < xb[b] {
            std::cmp::Ordering::Less
        } else if xb[a] > xb[b] {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    });
}

/// The grid rows of `k8` 8-tuples of levels `l` (off-grid tuples replaced by their best
/// neighbour at scale `s`, shift table per tuple `xx(k)`); returns whether all were on the grid.
fn rows_for(
    l: &mut [i8],
    xb: &[f32],
    w: &[f32],
    s: f32,
    xx: impl Fn(usize) -> &'static [f32; 3],
    index: &mut [usize],
) -> bool {
    let g = grid();
    let mut all = true;
    for (k, ix) in index.iter_mut().enumerate() {
        let r = 8 * k..8 * k + 8;
        *ix = match g.find(&l[r.clone()]) {
            Lookup::Row(row) => row,
            Lookup::Near(n) => {
                all = false;
                // ggml's `iq1_find_best_neighbour2`: the grid coordinate `c` scales as the
                // tuple's shifted level `xx(k)[(c − 1) / 2]`.
                let xk = xx(k);
                let value = |c: i8| xk[((c - 1) / 2) as usize];
                g.best_neighbour(n, &xb[r.clone()], &w[r.clone()], s, value, &mut l[r])
            }
        };
    }
    all
}

/// `Σ w q x`, `Σ w q²` over the chosen rows (`q = xx(k)[level]`).
fn refit(
    index: &[usize],
    xb: &[f32],
    w: &[f32],
    xx: impl Fn(usize) -> &'static [f32; 3],
) -> (f32, f32) {
    let g = grid();
    let (mut sqx, mut sq2) = (0f32, 0f32);
    for (k, &ix) in index.iter().enumerate() {
        let row = &g.rows[ix];
        for j in 0..8 {
            let wv = w[8 * k + j];
            let q = xx(k)[((row[j] - 1) / 2) as usize];
            sqx += wv * q * xb[8 * k + j];
            sq2 += wv * q * q;
        }
    }
    (sqx, sq2)
}

/// IQ1_S super-blocks of one row with the row's importance `qw` (one per value).
pub(crate) fn quantize_row_iq1_s(x: &[f32], qw: &[f32], out: &mut [u8]) {
    const BS: usize = 32;
    const QS: usize = 2;
    const QH: usize = QS + QK_K / 8;
    let (mut w, mut l, mut idx) = ([0f32; BS], [0i8; BS], [0usize; BS]);
    let (mut sumx, mut sumw) = ([0f32; BS + 1], [0f32; BS + 1]);
    let mut index = [0usize; BS / 8];
    for (ibl, (xbl, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(IQ1_S_BYTES))
        .enumerate()
    {
        b.fill(0);
        let mut qh = [0u16; QK_K / BS];
        let mut scales = [0f32; QK_K / BS];
        let mut shifts = [0i8; QK_K / BS];
        let mut max_scale = 0f32;
        let s2 = sigma2(xbl);
        for (ib, xb) in xbl.chunks_exact(BS).enumerate() {
            let o = QK_K * ibl + BS * ib;
            weights(xb, Some(&qw[o..o + BS]), s2, &mut w);
            let mut max = xb[0].abs();
            for v in &xb[1..] {
                max = fmax(max, v.abs());
            }
            if max < GROUP_MAX_EPS_S {
                shifts[ib] = 1;
                continue;
            }
            sorted(xb, &mut idx);
            for j in 0..BS {
                let i = idx[j];
                sumx[j + 1] = sumx[j] + w[i] * xb[i];
                sumw[j + 1] = sumw[j] + w[i];
            }
            let (mut best, mut scale) = (-f32::MAX, max);
            let (mut bi1, mut bi2, mut bshift) = (usize::MAX, usize::MAX, 0i8);
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    for (xs, sh) in [(&X_P, 1i8), (&X_M, -1)] {
                        let sqx = (sumx[i1] - sumx[0]) * xs[0]
                            + (sumx[i2] - sumx[i1]) * xs[1]
                            + (sumx[BS] - sumx[i2]) * xs[2];
                        let sq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0]
                            + (sumw[i2] - sumw[i1]) * xs[1] * xs[1]
                            + (sumw[BS] - sumw[i2]) * xs[2] * xs[2];
                        if sq2 > 0.0 && sqx * sqx > best * sq2 {
                            scale = sqx / sq2;
                            best = scale * sqx;
                            (bi1, bi2, bshift) = (i1, i2, sh);
                        }
                    }
                }
            }
            if bi1 == usize::MAX || bshift == 0 {
                shifts[ib] = 1;
                continue;
            }
            for (j, &i) in idx.iter().enumerate() {
                l[i] = if j < bi1 {
                    0
                } else if j < bi2 {
                    1
                } else {
                    2
                };
            }
            if scale < 0.0 {
                for v in &mut l {
                    *v = 2 - *v;
                }
                scale = -scale;
                bshift = -bshift;
            }
            let xx: &'static [f32; 3] = if bshift == 1 { &X_P } else { &X_M };
            let all = rows_for(&mut l, xb, &w, scale, |_| xx, &mut index);
            if !all {
                let (sqx, sq2) = refit(&index, xb, &w, |_| xx);
                if sqx > 0.0 && sq2 > 0.0 {
                    scale = sqx / sq2;
                }
            }
            let mut h = 0u16;
            for (k, &ix) in index.iter().enumerate() {
                b[QS + (BS / 8) * ib + k] = (ix & 255) as u8;
                h |= ((ix >> 8) as u16) << (3 * k);
            }
            qh[ib] = h;
            scales[ib] = scale;
            shifts[ib] = bshift;
            max_scale = fmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            // ggml leaves d = 0 and the group words as written.
            for (ib, h) in qh.iter().enumerate() {
                b[QH + 2 * ib..QH + 2 * ib + 2].copy_from_slice(&h.to_le_bytes());
            }
            continue;
        }
        let d = max_scale / 15.0;
        put_f16(b, 0, d * 1.125);
        let id = 1.0 / d;
        for ib in 0..QK_K / BS {
            let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            if shifts[ib] == -1 {
                l |= 8;
            }
            let h = qh[ib] | (l as u16) << 12;
            b[QH + 2 * ib..QH + 2 * ib + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
}

/// IQ1_M super-blocks of one row; `qw` is the row's importance (one per value) or `None`.
pub(crate) fn quantize_row_iq1_m(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    const BS: usize = 16;
    const QH: usize = QK_K / 8;
    const SC: usize = QH + QK_K / 16;
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    // Shift table of row k (0 or 1) of a group for shift choice `bk` (0: +,+ 1: +,− 2: −,+ 3: −,−).
    fn xx_of(bk: i8, k: usize) -> &'static [f32; 3] {
        let plus = if k == 0 { bk < 2 } else { bk % 2 == 0 };
        if plus {
            &X_P
        } else {
            &X_M
        }
    }
    let (mut w, mut l, mut idx) = ([0f32; BS], [0i8; BS], [0usize; BS]);
    let mut index = [0usize; BS / 8];
    let (p2, m2) = (X_P[2], X_M[2]);
    let cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1];
    let cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2];
    let cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1];
    let cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2];
    for (ibl, (xbl, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(IQ1_M_BYTES))
        .enumerate()
    {
        b.fill(0);
        let mut scales = [0f32; QK_K / BS];
        let mut shifts = [0i8; QK_K / BS];
        let mut max_scale = 0f32;
        let s2 = sigma2(xbl);
        let qw_of = |ib: usize| qw.map(|q| &q[QK_K * ibl + BS * ib..QK_K * ibl + BS * ib + BS]);
        for (ib, xb) in xbl.chunks_exact(BS).enumerate() {
            weights(xb, qw_of(ib), s2, &mut w);
            let mut max = xb[0].abs();
            for v in &xb[1..] {
                max = fmax(max, v.abs());
            }
            if max < GROUP_MAX_EPS_M {
                continue; // scale 0, shifts 0
            }
            sorted(xb, &mut idx);
            // Prefix sums per half of the group (each half has its own shift).
            let mut px = [[0f32; BS + 1]; 2];
            let mut pw = [[0f32; BS + 1]; 2];
            for j in 0..BS {
                let i = idx[j];
                let h = usize::from(i >= BS / 2);
                px[h][j + 1] = px[h][j] + w[i] * xb[i];
                px[1 - h][j + 1] = px[1 - h][j];
                pw[h][j + 1] = pw[h][j] + w[i];
                pw[1 - h][j + 1] = pw[1 - h][j];
            }
            let txs = [px[0][BS], px[1][BS]];
            let tws = [pw[0][BS], pw[1][BS]];
            let (mut best, mut scale) = (-f32::MAX, max);
            let (mut bi1, mut bi2, mut bk) = (usize::MAX, usize::MAX, -1i8);
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    let (mut qxp, mut qxm, mut q2p, mut q2m) =
                        ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
                    for h in 0..2 {
                        let sx = px[h][i1] + px[h][i2];
                        qxp[h] = txs[h] * p2 - sx;
                        qxm[h] = txs[h] * m2 - sx;
                        q2p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                        q2m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                    }
                    let sqx = [
                        qxp[0] + qxp[1],
                        qxp[0] + qxm[1],
                        qxm[0] + qxp[1],
                        qxm[0] + qxm[1],
                    ];
                    let sq2 = [
                        q2p[0] + q2p[1],
                        q2p[0] + q2m[1],
                        q2m[0] + q2p[1],
                        q2m[0] + q2m[1],
                    ];
                    for k in 0..4 {
                        if sq2[k] > 0.0 && sqx[k] * sqx[k] > best * sq2[k] {
                            scale = sqx[k] / sq2[k];
                            best = scale * sqx[k];
                            (bi1, bi2, bk) = (i1, i2, k as i8);
                        }
                    }
                }
            }
            if bi1 == usize::MAX || bk < 0 {
                continue;
            }
            for (j, &i) in idx.iter().enumerate() {
                l[i] = if j < bi1 {
                    0
                } else if j < bi2 {
                    1
                } else {
                    2
                };
            }
            if scale < 0.0 {
                for v in &mut l {
                    *v = 2 - *v;
                }
                scale = -scale;
                bk = 3 - bk;
            }
            let all = rows_for(&mut l, xb, &w, scale, |k| xx_of(bk, k), &mut index);
            if !all {
                let (sqx, sq2) = refit(&index, xb, &w, |k| xx_of(bk, k));
                if sqx > 0.0 && sq2 > 0.0 {
                    scale = sqx / sq2;
                }
            }
            b[2 * ib] = (index[0] & 255) as u8;
            b[2 * ib + 1] = (index[1] & 255) as u8;
            b[QH + ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
            scales[ib] = scale;
            shifts[ib] = bk;
            max_scale = fmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let g = grid();
        let mut sc = [0u16; 4];
        let mut d = max_scale / 15.0;
        let id = 1.0 / d;
        let (mut sqx, mut sq2) = (0f32, 0f32);
        for ib in 0..QK_K / BS {
            let ls = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            sc[ib / 4] |= (ls as u16) << (3 * (ib % 4));
            b[QH + ib] |= MASKS[shifts[ib] as usize];
            let xb = &xbl[BS * ib..BS * ib + BS];
            weights(xb, qw_of(ib), s2, &mut w);
            let h = b[QH + ib] as usize;
            for k in 0..BS / 8 {
                let xx = xx_of(shifts[ib], k);
                let r = b[2 * ib + k] as usize + ((h << (8 - 4 * k)) & 0x700);
                let row = &g.rows[r];
                for j in 0..8 {
                    let wv = w[8 * k + j];
                    let q = xx[((row[j] - 1) / 2) as usize] * (2 * ls + 1) as f32;
                    sqx += wv * q * xb[8 * k + j];
                    sq2 += wv * q * q;
                }
            }
        }
        if sq2 > 0.0 {
            d = sqx / sq2;
        }
        let mut hb = [0u8; 2];
        put_f16(&mut hb, 0, d * 1.1125);
        let s = u16::from_le_bytes(hb);
        sc[0] |= (s & 0x000f) << 12;
        sc[1] |= (s & 0x00f0) << 8;
        sc[2] |= (s & 0x0f00) << 4;
        sc[3] |= s & 0xf000;
        for (w, v) in sc.iter().enumerate() {
            b[SC + 2 * w..SC + 2 * w + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// IQ1_S with importance 1 for every value (module comment): the registry's encoder.
pub(crate) fn quantize_iq1_s(src: &[f32], out: &mut [u8]) {
    let ones = vec![1f32; src.len()];
    quantize_row_iq1_s(src, &ones, out);
}

/// IQ1_M without an importance matrix (weights `x²`): the registry's encoder.
pub(crate) fn quantize_iq1_m(src: &[f32], out: &mut [u8]) {
    quantize_row_iq1_m(src, None, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TensorType;

    /// Round trip through the registry's decoders: a 1.5–1.75-bit code keeps the error under
    /// the signal energy, zero blocks decode to zero, and the encoder is deterministic.
    #[test]
    fn round_trip() {
        let x: Vec<f32> = (0..8 * QK_K)
            .map(|i| ((i as f32 * 0.618).sin() * 3.0 + (i as f32 * 0.1).cos()) * 0.01)
            .collect();
        for (ty, q) in [
            (TensorType::IQ1S, quantize_iq1_s as fn(&[f32], &mut [u8])),
            (TensorType::IQ1M, quantize_iq1_m),
        ] {
            let nb = ty.bytes_for(x.len() as u64).unwrap() as usize;
            let (mut b, mut b2) = (vec![0u8; nb], vec![0u8; nb]);
            q(&x, &mut b);
            q(&x, &mut b2);
            assert_eq!(b, b2);
            let mut y = vec![0f32; x.len()];
            crate::types::dequantize(ty, &b, &mut y, "t").unwrap();
            let e: f32 = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum();
            let s: f32 = x.iter().map(|a| a * a).sum();
            assert!(e < 0.5 * s, "{ty}: {e} vs {s}");
            let z = vec![0f32; QK_K];
            let mut bz = vec![0xAAu8; ty.bytes_for(QK_K as u64).unwrap() as usize];
            q(&z, &mut bz);
            crate::types::dequantize(ty, &bz, &mut y[..QK_K], "t").unwrap();
            assert!(y[..QK_K].iter().all(|&v| v == 0.0), "{ty}");
        }
    }
}
