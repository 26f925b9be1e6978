//! Banded LDLQ: GPTQ's sweep (round a column, feed its error through the inverse factor of the
//! input Hessian into the next `band` columns) for every type the registry gives an LDLQ kind
//! ([`TensorType::ldlq`]). One file per job:
//!
//! - `factor.rs`: the Hessian rotated into the basis the decoder rounds in, damped, and factored
//!   ([`Factor`]; act-order for the stock types);
//! - `sweep.rs`: the sweep itself (lazy batches and GEMMs), shared by the kinds below;
//! - `tq.rs`: TQ4_1S/TQ3_1S, rounding in the 32-block rotated domain ([`LdlqKind::Rotated`]);
//! - `stock.rs`: the stock types, act-order onto pre-fitted grids, then the parameter refit
//!   ([`LdlqKind::Stock`], [`Refit`]);
//! - `rows.rs`: tq2_r in the whole-row rotated domain ([`LdlqKind::RowRotated`]);
//! - `iq_lattice.rs`, `iq1_lattice.rs`: IQ3_XXS / IQ3_S and IQ1_S / IQ1_M, 4- or 8-value grid
//!   rows as the rounding step ([`LdlqKind::Lattice`]);
//! - `iq_grid.rs`: IQ2_XXS / IQ2_XS / IQ2_S, 8-value grid rows at scales fixed by the weighted
//!   encoder ([`LdlqKind::IqGrid`]);
//! - `iq_refit.rs`: the IQ2 / IQ3 scales refitted under the Hessian after a sweep (`--ldlq-refit`);
//! - `trellis.rs`, `psp.rs`: tq2_t's block-LDLQ with the trellis as each block's vector quantizer
//!   ([`LdlqKind::Trellis`]) and its per-survivor Viterbi searches.
//!
//! This file dispatches on the kind ([`quantize_ldlq_refit`]) and holds the proxy loss.

mod factor;
mod iq;
mod iq1_lattice;
mod iq_grid;
mod iq_lattice;
mod iq_refit;
mod normal;
mod precision;
pub mod prof;
mod psp;
mod rows;
mod stock;
mod sweep;
mod tq;
mod tq_round;
pub(crate) mod trellis;

pub(crate) use self::factor::keeps_refit_hessian;
pub use self::factor::{
    factor, factor_act_order, factor_hessian, factor_hessian_owned, factor_owned,
    rotate_hessian_in_place, rotate_vec, shrink_to_diagonal, Factor, RefitHessian,
};
pub use self::stock::Refit;

use crate::types::{LdlqKind, TensorType};
use rayon::prelude::*;

/// Rows swept together by [`sweep`] (a fixed partition, so the bytes do not depend on the thread
/// count): each panel of `U` is read once per 32 rows, and the feedback between column batches is
/// one matrix product per panel.
const ROWS: usize = 32;

/// The band IQ2_XXS / IQ2_XS / IQ2_S and IQ3_XXS / IQ3_S are swept with when `--ldlq-band` is not
/// given: the full band. With the Hessian shrunk towards its diagonal ([`IQ_SHRINK`]) the whole-row
/// feedback no longer overshoots on text the Hessian did not see: on SmolLM2's presets (KLD vs F16
/// on 10 wikitext windows, llama.cpp + imatrix from the same Botchan tokens) IQ3_XXS went from
/// 0.874x (band 64, no shrink) to 0.775x, IQ2_XS from 1.01x to 0.755x (docs/bench/presets.md).
pub const IQ_BAND: usize = 0;

/// The band IQ1_S / IQ1_M keep when `--ldlq-band` is not given: 64, the i-quants' default before
/// [`IQ_BAND`] went to the full band (their whole-model KLD at the full band is not measured).
pub const IQ1_BAND: usize = 64;

/// The damping (`H += λ·mean(diag H)·I`) of every type but the i-quants when `--damp` is not given.
pub const DAMP: f64 = 0.01;

/// The i-quants' damping when `--damp` is not given (today the same as the others'). LDLQ into
/// their grids overfits the calibration tokens: on SmolLM2's `ffn_down` (1536 inputs, 8,192
/// Botchan tokens) the full-band sweep at 0.01 has 0.48x the imatrix encoder's error on the
/// calibration tokens but 0.96x on the evaluation text, and damping 1 keeps more of the win on
/// the evaluation text (examples/iq_proxy.rs, docs/bench/presets.md); the shrinkage towards the
/// diagonal ([`IQ_SHRINK`]) is the default remedy, measured on the whole model.
pub const IQ_DAMP: f64 = 0.01;

/// The shrinkage of the Hessian towards its diagonal ([`shrink_to_diagonal`]) of the stock types
/// ([`LdlqKind::Stock`]: the k-quants, legacy quants, IQ4_NL / IQ4_XS) when `--shrink` is not
/// given. On SmolLM2 with all 69,632 Botchan tokens for both tools, Q4_K_M + LDLQ went from 0.77x
/// llama.cpp + imatrix's KLD (no shrink) to 0.685x, Q3_K_M to 0.693x (docs/bench/presets.md).
pub const SHRINK: f64 = 0.25;

/// The shrinkage of IQ2_XXS / IQ2_XS / IQ2_S and IQ3_XXS / IQ3_S when `--shrink` is not given
/// (with the full band, [`IQ_BAND`]).
pub const IQ_SHRINK: f64 = 0.5;

/// The shrinkage of the 2-bit row types tq2_r and tq2_t ([`LdlqKind::RowRotated`],
/// [`LdlqKind::Trellis`]) when `--shrink` is not given. On SmolLM2 (every tensor in the type, the
/// full band, Hessians of 8,192 Botchan tokens, KLD on 10 held-out wikitext windows) tq2_r + LDLQ
/// went from 1.876 (no shrink) to 1.399 at 0.25 (1.463 at 0.1, 1.397 at 0.5, 1.438 at 0.75), tq2_t
/// (its encoder of 4 searches) to 0.895 at 0.25 (0.927 at 0.5; 1.046 unshrunk with the encoder
/// before) (docs/bench/two-bit.md).
pub const TQ2_SHRINK: f64 = 0.25;

/// The i-quants whose defaults are [`IQ_BAND`] and [`IQ_SHRINK`]; IQ1_S / IQ1_M keep band
/// [`IQ1_BAND`] and no shrinkage.
fn iq_shrunk(ty: TensorType) -> bool {
    !matches!(ty, TensorType::IQ1S | TensorType::IQ1M)
}

/// The shrinkage of `ty`'s Hessian when `--shrink` is not given: [`SHRINK`] for the stock types,
/// [`IQ_SHRINK`] for the IQ2 / IQ3 kinds, [`TQ2_SHRINK`] for tq2_r and tq2_t, none for IQ1 and
/// the TQ weight types (whose whole-model KLD with shrinkage is not measured).
pub fn default_shrink(ty: TensorType) -> f64 {
    match ty.ldlq() {
        Some(LdlqKind::Stock) => SHRINK,
        Some(LdlqKind::IqGrid | LdlqKind::Lattice) if iq_shrunk(ty) => IQ_SHRINK,
        Some(LdlqKind::RowRotated | LdlqKind::Trellis) => TQ2_SHRINK,
        _ => 0.0,
    }
}

/// The damping of `ty` when `--damp` is not given: [`IQ_DAMP`] for the i-quant kinds, [`DAMP`]
/// for every other type.
pub fn default_damp(ty: TensorType) -> f64 {
    match ty.ldlq() {
        Some(LdlqKind::IqGrid | LdlqKind::Lattice) => IQ_DAMP,
        _ => DAMP,
    }
}

/// The band `ty` is swept with when `--ldlq-band` is not given: [`IQ1_BAND`] for IQ1_S / IQ1_M,
/// [`IQ_BAND`] for the other i-quants, 0 (the full band) for every other type.
pub fn default_band(ty: TensorType) -> usize {
    match ty.ldlq() {
        Some(LdlqKind::IqGrid | LdlqKind::Lattice) if !iq_shrunk(ty) => IQ1_BAND,
        Some(LdlqKind::IqGrid | LdlqKind::Lattice) => IQ_BAND,
        _ => 0,
    }
}

/// Quantize `rows` rows of length `n` (row-major `w`) to `ty` with banded LDLQ (`band` = 0: full).
/// Deterministic and independent of the thread count (rows are independent and grouped by a
/// fixed [`ROWS`]). Stock types refit their block parameters after the sweep, `f.refit` passes
/// under the full Hessian.
pub fn quantize_ldlq(ty: TensorType, w: &[f32], n: usize, f: &Factor, band: usize) -> Vec<u8> {
    quantize_ldlq_given(ty, w, n, f, band, None)
}

/// [`quantize_ldlq`] given the Hessian `f` was made from, for a factor whose refit reads it
/// ([`RefitHessian::Callers`]: [`factor_hessian`] of a wide Hessian).
pub(crate) fn quantize_ldlq_given(
    ty: TensorType,
    w: &[f32],
    n: usize,
    f: &Factor,
    band: usize,
    hessian: Option<&[f64]>,
) -> Vec<u8> {
    let refit = Refit {
        passes: f.refit,
        full: true,
    };
    quantize_ldlq_with(ty, w, n, f, band, refit, hessian)
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
    quantize_ldlq_with(ty, w, n, f, band, refit, None)
}

/// [`quantize_ldlq_refit`] with [`quantize_ldlq_given`]'s Hessian.
fn quantize_ldlq_with(
    ty: TensorType,
    w: &[f32],
    n: usize,
    f: &Factor,
    band: usize,
    refit: Refit,
    hessian: Option<&[f64]>,
) -> Vec<u8> {
    assert_eq!(f.n, n);
    let rh = f.refit_hessian(hessian);
    let Some(kind) = ty.ldlq() else {
        panic!("{ty}: no LDLQ for this type (TensorType::ldlq)");
    };
    if kind == LdlqKind::Trellis {
        return trellis::quantize_trellis(w, n, f, band, trellis::TrellisInner::chosen());
    }
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let row_bytes = n / bs * bb;
    let mut out = vec![0u8; w.len() / bs * bb];
    out.par_chunks_mut(ROWS * row_bytes)
        .zip(w.par_chunks(ROWS * n))
        .for_each(|(o, rows)| match kind {
            LdlqKind::Rotated => tq::quantize_rows(ty, rows, f, band, o),
            LdlqKind::Stock => {
                stock::quantize_rows_stock(ty, rows, f, rh, band, refit, o, stock::Mode::Gemm)
            }
            LdlqKind::RowRotated => rows::quantize_rows(rows, f, band, o),
            LdlqKind::Lattice if matches!(ty, TensorType::IQ1S | TensorType::IQ1M) => {
                iq1_lattice::quantize_rows(ty, rows, f, band, o)
            }
            LdlqKind::Lattice => iq_lattice::quantize_rows(ty, rows, f, rh, band, o),
            LdlqKind::IqGrid => iq_grid::quantize_rows(ty, rows, f, rh, band, o),
            LdlqKind::Trellis => unreachable!("handled above"),
        });
    out
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
    use crate::types::tq::QK;

    pub(super) fn lcg(seed: &mut u64) -> f64 {
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
                factor::rotate_hessian_rows(&h, n).unwrap()
            } else {
                factor::rotate_hessian(&h, n)
            };
            let f = factor(&hr, n, 0.01, "w").unwrap();
            let rb = n / QK * ty.block_bytes();
            for band in [0, 7, 200] {
                let got = quantize_ldlq(ty, &w, n, &f, band);
                let mut scalar = vec![0u8; rows * rb];
                let mut one = vec![0u8; rows * rb];
                for (o, row) in one.chunks_mut(rb).zip(w.chunks(n)) {
                    if ty.is_row_rotated() {
                        rows::quantize_row(row, &f, band, o)
                    } else {
                        tq::quantize_row(ty, row, &f, band, o)
                    }
                }
                for (o, rws) in scalar.chunks_mut(rb * ROWS).zip(w.chunks(n * ROWS)) {
                    if ty.is_row_rotated() {
                        rows::quantize_rows_with(rws, &f, band, o, true)
                    } else {
                        tq::quantize_rows_with(ty, rws, &f, band, o, true)
                    }
                }
                assert_sweeps_agree(ty, band, &h, &w, &got, &scalar, &one);
            }
        }
    }

    /// `scalar` (grouped scalar sweep) equals `one` (one-row sweeps) bit for bit; `got` (the GEMM
    /// sweep) has ≥ 97% of its bytes equal and the same calibration-weighted error to 1e-3.
    pub(super) fn assert_sweeps_agree(
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
    pub(super) fn uniform_rows(len: usize, mut s: u64) -> Vec<f32> {
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
            })
            .collect()
    }
}
