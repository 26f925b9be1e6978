//! Banded LDLQ for the row-rotated 2-bit type (tq2_r): the sweep of [`super::sweep`] in the basis of
//! the whole-row rotation `R` of `types::tq2r`, so `H' = R H Rᵀ` and the rounding is on the
//! rotated row, whose blocks the decoder reads directly.
//!
//! Scales are chosen before rounding, block by block as the sweep reaches a block: the design's
//! `0.5·rms` of the block's current (error-fed) values, rounded to f16 because that is what the
//! decoder multiplies by (the same rule as round-to-nearest, so at band 0 with `H = I` the bytes
//! are RTN's).

use super::sweep::{sweep, sweep_scalar};
use super::Factor;
use crate::types::seed2bit::{code_of, level};
use crate::types::tq2r::{self, QK, TQ2R_BYTES};
use half::f16;

/// A group of rows ([`sweep`]): rotate, then GPTQ's sweep with each block's scale
/// fixed when the sweep enters the block.
pub(crate) fn quantize_rows(rows: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    quantize_rows_with(rows, f, band, out, false)
}

/// [`quantize_rows`] with the reference scalar sweep when `scalar` (tests).
pub(crate) fn quantize_rows_with(
    rows: &[f32],
    f: &Factor,
    band: usize,
    out: &mut [u8],
    scalar: bool,
) {
    let n = f.n;
    let r = tq2r::rotation(n).expect("planner checked the row length");
    let mut x: Vec<f64> = rows
        .chunks(n)
        .flat_map(|row| r.forward(row))
        .map(|v| v as f64)
        .collect();
    out.fill(0);
    let row_bytes = n / QK * TQ2R_BYTES;
    let mut d = vec![0f32; rows.len() / n];
    let round = |ri: usize, j: usize, x: &[f64]| {
        let o = &mut out[ri * row_bytes..(ri + 1) * row_bytes];
        let b = &mut o[j / QK * TQ2R_BYTES..(j / QK + 1) * TQ2R_BYTES];
        if j.is_multiple_of(QK) {
            let ss: f64 = x[j..j + QK].iter().map(|v| v * v).sum();
            let s = f16::from_f64((0.5 * (ss / QK as f64).sqrt()).min(f16::MAX.to_f64()));
            b[..2].copy_from_slice(&s.to_bits().to_le_bytes());
            d[ri] = s.to_f32();
        }
        let q = if d[ri] == 0.0 {
            2
        } else {
            code_of(x[j], d[ri])
        };
        b[2 + (j % QK) / 4] |= (q as u8) << (2 * (j % 4));
        level(q, d[ri])
    };
    if scalar {
        sweep_scalar(&mut x, n, f, band, round);
    } else {
        sweep(&mut x, n, f, band, round);
    }
}

/// One row: rotate, then GPTQ's sweep with the block scale fixed when the sweep enters a block
/// (the reference [`quantize_rows`] is held equal to).
#[cfg(test)]
pub(crate) fn quantize_row(row: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    let n = f.n;
    let band = if band == 0 { n } else { band };
    let r = tq2r::rotation(n).expect("planner checked the row length");
    let mut x: Vec<f64> = r.forward(row).into_iter().map(|v| v as f64).collect();
    out.fill(0);
    let mut d = 0f32;
    for j in 0..n {
        let b = &mut out[j / QK * TQ2R_BYTES..(j / QK + 1) * TQ2R_BYTES];
        if j % QK == 0 {
            let ss: f64 = x[j..j + QK].iter().map(|v| v * v).sum();
            let s = f16::from_f64((0.5 * (ss / QK as f64).sqrt()).min(f16::MAX.to_f64()));
            b[..2].copy_from_slice(&s.to_bits().to_le_bytes());
            d = s.to_f32();
        }
        let q = if d == 0.0 { 2 } else { code_of(x[j], d) };
        b[2 + (j % QK) / 4] |= (q as u8) << (2 * (j % 4));
        let urow = &f.u[j * n..(j + 1) * n];
        let err = (x[j] - level(q, d)) / urow[j];
        for k in j + 1..(j + 1 + band).min(n) {
            x[k] -= err * urow[k];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::factor::{factor, rotate_hessian_rows};
    use super::super::{proxy_loss, quantize_ldlq};
    use crate::math::splitmix::SplitMix64;
    use crate::quant::encode_rows;
    use crate::types::{tq2r, TensorType};

    /// Correlated inputs (x = A z): the rotated Hessian is `R H Rᵀ` (checked against explicit
    /// rotations of the rows), and LDLQ beats RTN on the proxy loss `(w−q) H (w−q)ᵀ` by a wide
    /// margin at identical bytes, band 64 in between.
    #[test]
    fn ldlq_2bit_beats_rtn_on_the_proxy_loss() {
        let (n, rows, samples) = (96usize, 24usize, 600usize);
        let mut g = SplitMix64::new(5);
        let mix: Vec<f64> = (0..n * n).map(|_| g.gauss()).collect();
        let mut h = vec![0f64; n * n];
        for _ in 0..samples {
            let z: Vec<f64> = (0..n).map(|_| g.gauss()).collect();
            // Strongly correlated: a low-rank-ish mix plus a little noise.
            let x: Vec<f64> = (0..n)
                .map(|i| (0..8).map(|t| mix[i * n + t] * z[t]).sum::<f64>() + 0.05 * z[i])
                .collect();
            for i in 0..n {
                for j in 0..n {
                    h[i * n + j] += x[i] * x[j];
                }
            }
        }
        let hr = rotate_hessian_rows(&h, n).unwrap();
        // H' = R H Rᵀ: e_iᵀ H' e_j = (Rᵀe_i)ᵀ H (Rᵀe_j).
        let r = tq2r::rotation(n).unwrap();
        let col = |i: usize| {
            let mut e = vec![0f32; n];
            e[i] = 1.0;
            r.inverse(&e)
        };
        for (i, j) in [(0, 0), (3, 70), (95, 1)] {
            let (a, b) = (col(i), col(j));
            let want: f64 = (0..n)
                .flat_map(|p| (0..n).map(move |q| (p, q)))
                .map(|(p, q)| a[p] as f64 * h[p * n + q] * b[q] as f64)
                .sum();
            assert!(
                (hr[i * n + j] - want).abs() < 1e-4 * want.abs().max(1.0),
                "({i},{j})"
            );
        }
        let w: Vec<f32> = (0..rows * n).map(|_| g.gauss() as f32).collect();
        let f = factor(&hr, n, 0.01, "t").unwrap();
        let rtn = encode_rows(
            TensorType::TQ2R,
            "t",
            &w,
            n,
            &crate::quant::Encoder::Nearest,
        )
        .unwrap();
        let loss = |bytes: &[u8]| {
            let mut q = vec![0f32; w.len()];
            crate::types::dequantize_rows(TensorType::TQ2R, bytes, &mut q, n, "t").unwrap();
            proxy_loss(&h, n, &w, &q)
        };
        let full = quantize_ldlq(TensorType::TQ2R, &w, n, &f, 0);
        let b64 = quantize_ldlq(TensorType::TQ2R, &w, n, &f, 64);
        assert_eq!(full.len(), rtn.len());
        let (lr, lf, lb) = (loss(&rtn), loss(&full), loss(&b64));
        assert!(lf < 0.5 * lr, "full LDLQ {lf} vs RTN {lr}");
        assert!(
            lb < lr && lb >= lf * 0.9,
            "band 64 {lb} vs full {lf}, RTN {lr}"
        );
    }

    /// With H = I the feedback is zero (U = I/√(1+λ)): LDLQ's bytes are exactly RTN's.
    #[test]
    fn identity_hessian_gives_rtn_bytes() {
        let n = 576;
        let mut h = vec![0f64; n * n];
        (0..n).for_each(|i| h[i * n + i] = 1.0);
        let f = factor(&rotate_hessian_rows(&h, n).unwrap(), n, 0.0, "t").unwrap();
        let mut g = SplitMix64::new(9);
        let w: Vec<f32> = (0..3 * n).map(|_| g.gauss() as f32).collect();
        let rtn = encode_rows(
            TensorType::TQ2R,
            "t",
            &w,
            n,
            &crate::quant::Encoder::Nearest,
        )
        .unwrap();
        let l = quantize_ldlq(TensorType::TQ2R, &w, n, &f, 0);
        let same = rtn.iter().zip(&l).filter(|(a, b)| a == b).count();
        // Rotated-Hessian round-off leaves tiny off-diagonal feedback: nearly every byte equal.
        assert!(
            same as f64 > 0.995 * rtn.len() as f64,
            "{same} of {}",
            rtn.len()
        );
    }
}
