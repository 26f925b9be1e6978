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
use super::sweep::{sweep, sweep_scalar};
use super::Factor;
use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};
use crate::types::tq::{self, BlockQ, QK};
use crate::types::TensorType;

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

pub(super) fn quantize_rows(ty: TensorType, rows: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    quantize_rows_with(ty, rows, f, band, out, false)
}

pub(super) fn quantize_rows_with(
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
}
