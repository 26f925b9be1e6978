//! IQ3_XXS / IQ3_S encoders, byte for byte what `llama-quantize` writes (ggml's
//! `quantize_row_iq3_xxs_impl` / `quantize_row_iq3_s_impl`; checked in `tests/iquants3_llama.rs`).
//!
//! Per 32-value group of a 256-value super-block, with weights `w` (`x²` without an importance
//! matrix; `imp · √(σ² + x²)` with one, `σ² = 2·Σx²/256` over the super-block):
//! - signs come out (`|x|`); IQ3_XXS keeps 7 sign bits per 8 values with even parity, so an odd
//!   count flips the value of smallest `w·x²` (it is then fitted as `−|x|`);
//! - trial inverse scales `(15 + 0.2·k) / max|x|` (`k = −15..=15` for IQ3_XXS, `−9..=9` for
//!   IQ3_S); each rounds every 4 values to levels `l = round((x·id − 1)/2)` in `0..8` (the value
//!   is `2l + 1`); a 4-tuple that is not a grid row becomes its neighbour (`iq13_gridmap`) of
//!   least `Σ √w (s·q − x)²` at the trial scale; the trial of best weighted least-squares fit
//!   `(Σ w x q)² / Σ w q²` wins, with its scale `Σ w x q / Σ w q²`;
//! - the winner's off-grid tuples (IQ3_S: all tuples) are re-rounded at that scale, moved to
//!   their best neighbour again, and the scale refitted;
//! - the super-block scale `d = max_scale / 31` is stored as f16 of `d · 1.0125` (IQ3_XXS) or
//!   `d · 1.033` (IQ3_S), the 4-bit group scales as `round((s/d − 1)/2)`.
//!
//! All arithmetic is f32 in ggml's order (ggml-base is built without FMA contraction), ties of
//! `nearest_int` to even. One llama.cpp quirk is kept for identical bytes: in IQ3_S an all-zero
//! group does not advance the `qs` / `signs` write position, so later groups' grid indices and
//! signs land one group early (their `qh` bits do not move).

use super::iq13_gridmap::{GridMap, Lookup};
use super::{grids, IQ3_S_BYTES, IQ3_XXS_BYTES, QK_K};
use crate::types::kquants::{nearest_int, put_f16};
use std::sync::OnceLock;

/// ggml's `GROUP_MAX_EPS_IQ3_XXS`.
const GROUP_MAX_EPS_XXS: f32 = 1e-8;
const KMAXQ: i32 = 8;

pub(crate) fn grid_xxs() -> &'static GridMap<4> {
    static G: OnceLock<GridMap<4>> = OnceLock::new();
    G.get_or_init(|| GridMap::new(&grids::IQ3XXS_PACKED, 3, 7, 2))
}

pub(crate) fn grid_s() -> &'static GridMap<4> {
    static G: OnceLock<GridMap<4>> = OnceLock::new();
    G.get_or_init(|| GridMap::new(&grids::IQ3S_PACKED, 3, 7, 3))
}

#[inline]
fn level(id: f32, x: f32) -> i8 {
    nearest_int(0.5 * (id * x - 1.0)).clamp(0, KMAXQ - 1) as i8
}

/// `Σ w x q`, `Σ w q²` with `q = 2l + 1`.
#[inline]
fn fit(w: &[f32], xv: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sqx, mut sq2) = (0f32, 0f32);
    for i in 0..w.len() {
        let q = (2 * l[i] as i32 + 1) as f32;
        sqx += w[i] * xv[i] * q;
        sq2 += w[i] * q * q;
    }
    (sqx, sq2)
}

/// The group weights: `x²`, or `imp · √(σ² + x²)`.
#[inline]
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

fn sigma2(xbl: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in xbl {
        s += v * v;
    }
    2.0 * s / QK_K as f32
}

/// One group's search (module comment): levels into `lv`, returns the scale (≥ 0; signs flipped
/// when it came out negative: `flip` is set).
struct Group {
    scale: f32,
    flip: bool,
}

fn search(
    g: &GridMap<4>,
    xv: &[f32; 32],
    w: &[f32; 32],
    max: f32,
    ntry: i32,
    refit_all: bool,
    lv: &mut [i8; 32],
) -> Group {
    let mut waux = [0f32; 32];
    for i in 0..32 {
        waux[i] = w[i].sqrt();
    }
    let mut laux = [0i8; 32];
    let mut on = [!refit_all; 8];
    let mut on_aux = [false; 8];
    let mut best = 0f32;
    let mut scale = max / (2 * KMAXQ - 1) as f32;
    *lv = [0; 32];
    for is in -ntry..=ntry {
        let id = ((2 * KMAXQ - 1) as f32 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        for k in 0..8 {
            for i in 0..4 {
                laux[4 * k + i] = level(id, xv[4 * k + i]);
            }
            on_aux[k] = true;
            if let Lookup::Near(n) = g.find(&laux[4 * k..4 * k + 4]) {
                on_aux[k] = false;
                let (x4, w4) = (&xv[4 * k..4 * k + 4], &waux[4 * k..4 * k + 4]);
                g.best_neighbour(
                    n,
                    x4,
                    w4,
                    this_scale,
                    |c| c as f32,
                    &mut laux[4 * k..4 * k + 4],
                );
            }
        }
        let (sqx, sq2) = fit(w, xv, &laux);
        if sq2 > 0.0 && sqx * sqx > best * sq2 {
            scale = sqx / sq2;
            best = scale * sqx;
            *lv = laux;
            on = on_aux;
        }
    }
    if on.iter().any(|&o| !o) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            if on[k] && !refit_all {
                continue;
            }
            let mut l4 = [0i8; 4];
            for i in 0..4 {
                l4[i] = level(id, xv[4 * k + i]);
            }
            let row = match g.find(&l4) {
                Lookup::Row(r) => r,
                Lookup::Near(n) => {
                    let (x4, w4) = (&xv[4 * k..4 * k + 4], &waux[4 * k..4 * k + 4]);
                    g.best_neighbour(n, x4, w4, scale, |c| c as f32, &mut lv[4 * k..4 * k + 4])
                }
            };
            lv[4 * k..4 * k + 4].copy_from_slice(&g.levels(row));
        }
        let (sqx, sq2) = fit(w, xv, lv);
        if sq2 > 0.0 {
            scale = sqx / sq2;
        }
    }
    let flip = scale < 0.0;
    Group {
        scale: if flip { -scale } else { scale },
        flip,
    }
}

/// Grid row of levels known to be on the grid.
#[inline]
fn row_of(g: &GridMap<4>, l: &[i8]) -> usize {
    match g.find(l) {
        Lookup::Row(r) => r,
        // ggml aborts ("found point not on grid"); the search only leaves grid rows.
        Lookup::Near(_) => unreachable!("iq3: levels off the grid"),
    }
}

/// IQ3_XXS super-blocks of one row; `qw` is the row's importance (one per value) or `None`.
pub(crate) fn quantize_row_iq3_xxs(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let g = grid_xxs();
    let (mut w, mut xv, mut lv) = ([0f32; 32], [0f32; 32], [0i8; 32]);
    for (ibl, (xbl, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(IQ3_XXS_BYTES))
        .enumerate()
    {
        b.fill(0);
        let mut q3 = [0u8; 64];
        let mut ss = [0u32; 8];
        let mut scales = [0f32; 8];
        let mut max_scale = 0f32;
        let s2 = sigma2(xbl);
        for (ib, xb) in xbl.chunks_exact(32).enumerate() {
            let q = qw.map(|q| &q[QK_K * ibl + 32 * ib..QK_K * ibl + 32 * ib + 32]);
            weights(xb, q, s2, &mut w);
            let mut signs = [0u8; 4];
            for k in 0..4 {
                let (mut nflip, mut s) = (0, 0u8);
                for i in 0..8 {
                    let v = xb[8 * k + i];
                    if v >= 0.0 {
                        xv[8 * k + i] = v;
                    } else {
                        xv[8 * k + i] = -v;
                        nflip += 1;
                        s |= 1 << i;
                    }
                }
                if nflip % 2 == 1 {
                    let mut imin = 0;
                    let mut min = w[8 * k] * xb[8 * k] * xb[8 * k];
                    for i in 1..8 {
                        let ax = w[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                        if ax < min {
                            min = ax;
                            imin = i;
                        }
                    }
                    xv[8 * k + imin] = -xv[8 * k + imin];
                    s ^= 1 << imin;
                }
                signs[k] = s & 127;
            }
            let mut max = xv[0];
            for &v in &xv[1..] {
                max = if max > v { max } else { v };
            }
            if max < GROUP_MAX_EPS_XXS {
                scales[ib] = 0.0;
                continue;
            }
            let gr = search(g, &xv, &w, max, 15, false, &mut lv);
            if gr.flip {
                for s in &mut signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..8 {
                q3[8 * ib + k] = row_of(g, &lv[4 * k..4 * k + 4]) as u8;
            }
            ss[ib] = signs[0] as u32
                | (signs[1] as u32) << 7
                | (signs[2] as u32) << 14
                | (signs[3] as u32) << 21;
            scales[ib] = gr.scale;
            max_scale = if max_scale > gr.scale {
                max_scale
            } else {
                gr.scale
            };
        }
        if max_scale == 0.0 {
            continue; // d = 0, everything zero
        }
        let d = max_scale / 31.0;
        put_f16(b, 0, d * 1.0125);
        let id = 1.0 / d;
        for ib in 0..8 {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            ss[ib] |= (l as u32) << 28;
        }
        b[2..66].copy_from_slice(&q3);
        for (ib, s) in ss.iter().enumerate() {
            b[66 + 4 * ib..70 + 4 * ib].copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// IQ3_S super-blocks of one row; `qw` is the row's importance (one per value) or `None`.
pub(crate) fn quantize_row_iq3_s(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    const QS: usize = 2;
    const QH: usize = QS + QK_K / 4;
    const SIGNS: usize = QH + QK_K / 32;
    const SCALES: usize = SIGNS + QK_K / 8;
    let g = grid_s();
    let (mut w, mut xv, mut lv) = ([0f32; 32], [0f32; 32], [0i8; 32]);
    for (ibl, (xbl, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(IQ3_S_BYTES))
        .enumerate()
    {
        b.fill(0);
        let (mut qs_at, mut signs_at) = (QS, SIGNS);
        let mut scales = [0f32; 8];
        let mut max_scale = 0f32;
        let s2 = sigma2(xbl);
        for (ib, xb) in xbl.chunks_exact(32).enumerate() {
            let q = qw.map(|q| &q[QK_K * ibl + 32 * ib..QK_K * ibl + 32 * ib + 32]);
            weights(xb, q, s2, &mut w);
            let mut signs = [0u8; 4];
            for k in 0..4 {
                let mut s = 0u8;
                for i in 0..8 {
                    let v = xb[8 * k + i];
                    if v >= 0.0 {
                        xv[8 * k + i] = v;
                    } else {
                        xv[8 * k + i] = -v;
                        s |= 1 << i;
                    }
                }
                signs[k] = s;
            }
            let mut max = xv[0];
            for &v in &xv[1..] {
                max = if max > v { max } else { v };
            }
            if max == 0.0 {
                scales[ib] = 0.0;
                continue; // llama.cpp: qs / signs positions do not advance (module comment)
            }
            let gr = search(g, &xv, &w, max, 9, true, &mut lv);
            if gr.flip {
                for s in &mut signs {
                    *s = !*s;
                }
            }
            for k in 0..8 {
                let r = row_of(g, &lv[4 * k..4 * k + 4]);
                b[qs_at + k] = r as u8;
                b[QH + ib] |= ((r >> 8) as u8) << k;
            }
            qs_at += 8;
            b[signs_at..signs_at + 4].copy_from_slice(&signs);
            signs_at += 4;
            scales[ib] = gr.scale;
            max_scale = if max_scale > gr.scale {
                max_scale
            } else {
                gr.scale
            };
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        put_f16(b, 0, d * 1.033);
        let id = 1.0 / d;
        for ib in (0..8).step_by(2) {
            let l1 = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            let l2 = nearest_int(0.5 * (id * scales[ib + 1] - 1.0)).clamp(0, 15);
            b[SCALES + ib / 2] = (l1 | l2 << 4) as u8;
        }
    }
}

/// IQ3_XXS without an importance matrix (weights `x²`): the registry's encoder.
pub(crate) fn quantize_iq3_xxs(src: &[f32], out: &mut [u8]) {
    quantize_row_iq3_xxs(src, None, out);
}

/// IQ3_S without an importance matrix (weights `x²`): the registry's encoder.
pub(crate) fn quantize_iq3_s(src: &[f32], out: &mut [u8]) {
    quantize_row_iq3_s(src, None, out);
}

/// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: LDLQ rounds them onto their grids (`quant::ldlq::iq_lattice`,
/// `quant::ldlq::iq1_lattice`).
pub(crate) fn has_lattice_ldlq(ty: crate::types::TensorType) -> bool {
    use crate::types::TensorType::*;
    matches!(ty, IQ3XXS | IQ3S | IQ1S | IQ1M)
}

/// The importance-weighted row encoder of IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (llama.cpp's, byte for
/// byte), if `ty` is one of them.
pub(crate) fn weighted_encoder(ty: crate::types::TensorType) -> Option<super::WeightedFn> {
    use super::iq1_quant::{quantize_row_iq1_m, quantize_row_iq1_s};
    use crate::types::TensorType::*;
    match ty {
        IQ3XXS => Some(|x, w, o| quantize_row_iq3_xxs(x, Some(w), o)),
        IQ3S => Some(|x, w, o| quantize_row_iq3_s(x, Some(w), o)),
        IQ1S => Some(quantize_row_iq1_s),
        IQ1M => Some(|x, w, o| quantize_row_iq1_m(x, Some(w), o)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TensorType;

    fn data(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.618).sin() * 3.0 + (i as f32 * 0.1).cos()) * 0.01)
            .collect()
    }

    /// Round trip through the registry's decoders: the weighted relative error is that of a
    /// 3-bit code (well under 10 % of the signal energy), zero blocks decode to zero, and
    /// importance-weighted encoding lowers the importance-weighted error.
    #[test]
    fn round_trip() {
        let x = data(16 * QK_K);
        for (ty, q, qw) in [
            (
                TensorType::IQ3XXS,
                quantize_iq3_xxs as fn(&[f32], &mut [u8]),
                quantize_row_iq3_xxs as fn(&[f32], Option<&[f32]>, &mut [u8]),
            ),
            (TensorType::IQ3S, quantize_iq3_s, quantize_row_iq3_s),
        ] {
            let nb = ty.bytes_for(x.len() as u64).unwrap() as usize;
            let mut b = vec![0u8; nb];
            q(&x, &mut b);
            let mut y = vec![0f32; x.len()];
            crate::types::dequantize(ty, &b, &mut y, "t").unwrap();
            let e: f32 = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum();
            let s: f32 = x.iter().map(|a| a * a).sum();
            assert!(e < 0.1 * s, "{ty}: {e} vs {s}");
            // Importance on the first half of every row of 1024: its error must drop.
            let imp: Vec<f32> = (0..x.len())
                .map(|i| if i % 1024 < 512 { 100.0 } else { 0.01 })
                .collect();
            let mut bw = vec![0u8; nb];
            for ((xr, ir), br) in x
                .chunks(1024)
                .zip(imp.chunks(1024))
                .zip(bw.chunks_mut(nb / (x.len() / 1024)))
            {
                qw(xr, Some(ir), br);
            }
            let mut yw = vec![0f32; x.len()];
            crate::types::dequantize(ty, &bw, &mut yw, "t").unwrap();
            let we = |y: &[f32]| -> f64 {
                x.iter()
                    .zip(y)
                    .zip(&imp)
                    .map(|((a, b), w)| (*w * (a - b).powi(2)) as f64)
                    .sum()
            };
            assert!(we(&yw) < we(&y), "{ty}: {} vs {}", we(&yw), we(&y));
            let z = vec![0f32; QK_K];
            let mut bz = vec![0xAAu8; ty.bytes_for(QK_K as u64).unwrap() as usize];
            q(&z, &mut bz);
            crate::types::dequantize(ty, &bz, &mut y[..QK_K], "t").unwrap();
            assert!(y[..QK_K].iter().all(|&v| v == 0.0), "{ty}");
        }
    }
}
