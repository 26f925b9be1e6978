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
use crate::types::TensorType;
use faer::{Mat, Par, Side};
use rayon::prelude::*;

/// The factor for one input dimension: `u` is n×n row-major upper triangular with
/// `(R H Rᵀ + λ·mean(diag)·I)^{-1} = Uᵀ U`.
#[derive(Debug)]
pub struct Factor {
    pub n: usize,
    pub u: Vec<f64>,
    /// Damping actually used (relative to mean(diag)), after escalation.
    pub damp: f64,
}

/// `R H Rᵀ` with `R` the block-diagonal 32-point forward rotation of the TQ formats (exact, f64).
pub fn rotate_hessian(h: &[f64], n: usize) -> Vec<f64> {
    assert_eq!(h.len(), n * n);
    assert_eq!(n % QK, 0);
    let mut a = h.to_vec();
    // Rotate every row (as a vector of 32-blocks), then every column.
    a.par_chunks_mut(n).for_each(rotate_vec);
    let mut t = transpose(&a, n);
    t.par_chunks_mut(n).for_each(rotate_vec);
    transpose(&t, n)
}

fn transpose(a: &[f64], n: usize) -> Vec<f64> {
    let mut t = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..n {
            t[j * n + i] = a[i * n + j];
        }
    }
    t
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
    for attempt in 0..7 {
        // Reversal trick: chol(J H J) = L Lᵀ ⇒ H = M Mᵀ with M = J L J upper ⇒ H⁻¹ = Uᵀ U, U = J L⁻¹ J.
        let a = Mat::<f64>::from_fn(n, n, |i, j| {
            let (ri, rj) = (n - 1 - i, n - 1 - j);
            h[ri * n + rj] + if i == j { lambda * mean_diag } else { 0.0 }
        });
        match a.llt(Side::Lower) {
            Ok(llt) => {
                let mut linv = Mat::<f64>::zeros(n, n);
                faer::linalg::triangular_inverse::invert_lower_triangular(
                    linv.as_mut(),
                    llt.L(),
                    Par::rayon(0),
                );
                let mut u = vec![0f64; n * n];
                for i in 0..n {
                    for j in i..n {
                        // U[i][j] = Linv[n-1-i][n-1-j] (lower part of Linv, since n-1-i >= n-1-j).
                        u[i * n + j] = linv[(n - 1 - i, n - 1 - j)];
                    }
                }
                if attempt > 0 {
                    eprintln!("tq: {what}: Hessian not positive definite; damping raised to {lambda:.3e}·mean(diag)");
                }
                return Ok(Factor { n, u, damp: lambda });
            }
            Err(_) => lambda *= 10.0,
        }
    }
    Err(Error::Unsupported(format!(
        "{what}: Hessian is not positive definite even with damping {lambda:.1e}; recalibrate with more tokens"
    )))
}

/// Rotate (with the rotation of `ty`'s decoder), damp and factor one calibration Hessian (what
/// `tq convert --calib` and sequential calibration do for every Hessian group).
pub fn factor_hessian(
    ty: TensorType,
    h: &crate::quant::Hessian,
    damp: f64,
    what: &str,
) -> Result<Factor> {
    let rotated = if ty.rotates_rows() {
        super::ldlq2::rotate_hessian_rows(&h.h, h.n)?
    } else {
        rotate_hessian(&h.h, h.n)
    };
    factor(&rotated, h.n, damp, what)
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

/// Quantize `rows` rows of length `n` (row-major `w`) to `ty` with banded LDLQ (`band` = 0: full).
/// Deterministic and independent of the thread count (rows are independent).
pub fn quantize_ldlq(ty: TensorType, w: &[f32], n: usize, f: &Factor, band: usize) -> Vec<u8> {
    assert_eq!(f.n, n);
    let (bb, bs) = (ty.block_bytes(), ty.block_size());
    let mut out = vec![0u8; w.len() / bs * bb];
    out.par_chunks_mut(n / bs * bb)
        .zip(w.par_chunks(n))
        .for_each(|(o, row)| {
            if ty == TensorType::TQ2T {
                super::ldlq2::quantize_row_trellis(row, f, band, o)
            } else if ty.is_row_rotated() {
                super::ldlq2::quantize_row(row, f, band, o)
            } else {
                quantize_row(ty, row, f, band, o)
            }
        });
    out
}

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
    fn hessian(n: usize, tokens: usize, seed: u64) -> Vec<f64> {
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
}
