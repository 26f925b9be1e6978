//! `tq2_r`: the seed design's incoherent 2-bit weights (FORMATS.md §6) as a GGUF type.
//!
//! Block (10 bytes per 32 values, 2.5 bpw): `d` (f16, little-endian) then `qs[8]`, code `j` of
//! the block at bits `2·(j mod 4)` of byte `j / 4` (the design's u32 words, little-endian); value
//! `(2q − 3)·d`. The 32 values are consecutive elements of the **rotated row** `R·w`, where `R` is
//! a whole-row orthonormal transform of the row length K ([`rotation`]):
//! - K a power of two: the design's `R = (1/√K)·H_K·diag(signsFor(K))`;
//! - K = h·2^k with a Paley order h (576 = 36·16, 1536 = 12·128): `(H_h ⊗ H_{2^k})/√K ·
//!   diag(signsFor(K))` (`math::rotation`, Method::Hadamard), keeping 2.5 bpw without padding;
//! - otherwise the DCT fallback of `math::rotation` (Method::Auto).
//!
//! The rotation is a row-level step, so the registry's per-block functions are the
//! *rotated-domain* codec; [`crate::types::quantize_rows`] and [`crate::types::dequantize_rows`]
//! (the only entry points callers use) add the rotation. The scale: the design's `0.5·rms` in
//! f64, rounded to the nearest f16 (ties to even, saturating at 65504), and the codes are rounded
//! against that *decoded* f16 scale, so they are the best codes for the scale a decoder
//! multiplies by (the design truncates to f16 after choosing codes against the f32 scale).

use super::seed2bit::{code_of, signs_for, QK2};
use crate::error::{Error, Result};
use crate::math::rotation::{Method, Rotation};
use half::f16;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Values per block.
pub const QK: usize = QK2;
/// Bytes per block: f16 scale + 32 two-bit codes.
pub const TQ2R_BYTES: usize = 2 + QK / 4;
const _: () = assert!(TQ2R_BYTES == 10);

/// GGUF metadata key naming the rotation, written by `tq convert` when a file holds tq2_r.
pub const META_ROTATION: &str = "tq.tq2_r.rotation";
/// Its value: the construction above, versioned.
pub const ROTATION_ID: &str = "seed2bit-signs/hadamard-paley-or-dct/v1";

/// The f16 scale of a block of rotated values: `0.5·sqrt(Σa²/32)` (f64), nearest f16,
/// saturating at the f16 maximum instead of overflowing to inf.
fn block_scale_f16(a: &[f32]) -> f16 {
    let ss: f64 = a.iter().map(|&v| v as f64 * v as f64).sum();
    let s = 0.5 * (ss / QK as f64).sqrt();
    f16::from_f64(s.min(f16::MAX.to_f64()))
}

/// Encode rotated values (whole blocks) — the registry's per-block quantizer.
pub fn quantize_tq2r_rotated(src: &[f32], out: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ2R_BYTES)) {
        let d = block_scale_f16(x);
        b[..2].copy_from_slice(&d.to_bits().to_le_bytes());
        let df = d.to_f32();
        b[2..].fill(0);
        for (j, &v) in x.iter().enumerate() {
            // A zero scale (an all-zero or f16-underflowing block) stores +0 everywhere.
            let q = if df == 0.0 { 2 } else { code_of(v as f64, df) };
            b[2 + j / 4] |= (q as u8) << (2 * (j % 4));
        }
    }
}

/// Decode blocks to rotated values — the registry's per-block dequantizer.
pub fn dequantize_tq2r_rotated(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(TQ2R_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        for (j, v) in y.iter_mut().enumerate() {
            let q = (b[2 + j / 4] >> (2 * (j % 4))) & 3;
            *v = (2 * q as i32 - 3) as f32 * d;
        }
    }
}

/// The rotation of rows of length `k` (built once per length, shared).
pub fn rotation(k: usize) -> Result<Arc<Rotation>> {
    static CACHE: OnceLock<Mutex<HashMap<usize, Arc<Rotation>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(r) = cache.lock().expect("rotation cache").get(&k) {
        return Ok(r.clone());
    }
    if k == 0 || !k.is_multiple_of(QK) {
        return Err(Error::Unsupported(format!(
            "tq2_r: row length {k} is not a positive multiple of {QK}"
        )));
    }
    let signs: Vec<f32> = signs_for(k).into_iter().map(|s| s as f32).collect();
    let r = Arc::new(
        Rotation::with_signs(k, Method::Auto, signs)
            .map_err(|e| Error::Unsupported(format!("tq2_r: rotation of length {k}: {e}")))?,
    );
    cache.lock().expect("rotation cache").insert(k, r.clone());
    Ok(r)
}

/// Quantize one row (length a multiple of 32): rotate, then the blocks.
pub fn quantize_row(src: &[f32], out: &mut [u8]) -> Result<()> {
    let r = rotation(src.len())?;
    quantize_tq2r_rotated(&r.forward(src), out);
    Ok(())
}

/// Dequantize one row: the blocks, then `Rᵀ`.
pub fn dequantize_row(blocks: &[u8], out: &mut [f32]) -> Result<()> {
    let r = rotation(out.len())?;
    let mut y = vec![0f32; out.len()];
    dequantize_tq2r_rotated(blocks, &mut y);
    out.copy_from_slice(&r.inverse(&y));
    Ok(())
}

/// Reference mat-vec: dequantize every row to the original basis and dot with `x` (f64 sums).
pub fn matvec_ref(blocks: &[u8], x: &[f32], y: &mut [f32]) -> Result<()> {
    matvec_ref_by(blocks, x, y, x.len() / QK * TQ2R_BYTES, dequantize_row)
}

/// The reference mat-vec of any row-decoded type (tq2_r, tq2_t): rows of `row_bytes` decoded by
/// `dequantize_row`, each dotted with `x` in f64.
pub(crate) fn matvec_ref_by(
    blocks: &[u8],
    x: &[f32],
    y: &mut [f32],
    row_bytes: usize,
    dequantize_row: impl Fn(&[u8], &mut [f32]) -> Result<()>,
) -> Result<()> {
    let mut w = vec![0f32; x.len()];
    for (yn, b) in y.iter_mut().zip(blocks.chunks_exact(row_bytes)) {
        dequantize_row(b, &mut w)?;
        *yn = w
            .iter()
            .zip(x)
            .map(|(&a, &b)| a as f64 * b as f64)
            .sum::<f64>() as f32;
    }
    Ok(())
}

/// The fast path (the design's): rotate the activation once, `x' = R·x`, then each output is
/// `Σ_b d_b · Σ_j (2q_j − 3)·x'_j` over the codes, never forming the weights. Since `R` is
/// orthogonal, `w·x = (R·w)·(R·x)`; it equals [`matvec_ref`] up to rounding.
pub fn matvec(blocks: &[u8], x: &[f32], y: &mut [f32]) -> Result<()> {
    let k = x.len();
    let xr = rotation(k)?.forward(x);
    let row_bytes = k / QK * TQ2R_BYTES;
    // Per block, Σ(2q−3)·x' = 2·Σ q·x' − 3·Σ x': the block sums of x' are shared by every row.
    let xsum: Vec<f32> = xr.chunks_exact(QK).map(|c| c.iter().sum()).collect();
    for (yn, row) in y.iter_mut().zip(blocks.chunks_exact(row_bytes)) {
        let mut acc = 0f32;
        for ((b, xs), sum) in row
            .chunks_exact(TQ2R_BYTES)
            .zip(xr.chunks_exact(QK))
            .zip(&xsum)
        {
            let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            let mut qx = 0f32;
            for (byte, x4) in b[2..].iter().zip(xs.chunks_exact(4)) {
                qx += (byte & 3) as f32 * x4[0]
                    + ((byte >> 2) & 3) as f32 * x4[1]
                    + ((byte >> 4) & 3) as f32 * x4[2]
                    + (byte >> 6) as f32 * x4[3];
            }
            acc += d * (2.0 * qx - 3.0 * sum);
        }
        *yn = acc;
    }
    Ok(())
}

/// Zero padding, the design's other option for non-power-of-two rows (measured, not a GGUF
/// layout): rotate `[w, 0…]` of length `Kp = next_power_of_two(K)` with `signsFor(Kp)` and keep
/// `Kp/32` blocks. Returns the reconstruction of the first `K` values.
pub fn padded_roundtrip(src: &[f32]) -> Vec<f32> {
    let kp = src.len().next_power_of_two();
    let mut x = src.to_vec();
    x.resize(kp, 0.0);
    let signs: Vec<f32> = signs_for(kp).into_iter().map(|s| s as f32).collect();
    let r = Rotation::with_signs(kp, Method::Hadamard, signs).expect("power of two");
    let mut b = vec![0u8; kp / QK * TQ2R_BYTES];
    quantize_tq2r_rotated(&r.forward(&x), &mut b);
    let mut y = vec![0f32; kp];
    dequantize_tq2r_rotated(&b, &mut y);
    let mut w = r.inverse(&y);
    w.truncate(src.len());
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::math::splitmix::gauss_f32 as gauss;

    /// For a power-of-two row the codes are the design's `pack2bit` codes wherever the f16 scale
    /// rounding does not move a value across a decision boundary: compare with the f32-scale
    /// packer on scales exactly representable in f16.
    #[test]
    fn power_of_two_rows_are_the_designs_rotation() {
        let k = 256;
        let w = gauss(k, 7);
        let p = crate::types::seed2bit::pack2bit(&w, 1, k, true).unwrap();
        let mut b = vec![0u8; k / QK * TQ2R_BYTES];
        quantize_row(&w, &mut b).unwrap();
        let mut same = 0;
        for i in 0..k {
            let ours = (b[i / QK * TQ2R_BYTES + 2 + (i % QK) / 4] >> (2 * (i % 4))) & 3;
            same += (ours as u32 == crate::types::seed2bit::get_code(&p.qw, i)) as usize;
        }
        // f32 vs f64 rotation and the f16 scale move only values within rounding of a boundary.
        assert!(same >= k - 2, "{same} of {k} codes agree");
        for (blk, s) in p.sc.iter().enumerate() {
            let d = f16::from_bits(u16::from_le_bytes([
                b[blk * TQ2R_BYTES],
                b[blk * TQ2R_BYTES + 1],
            ]));
            assert!(
                (d.to_f32() - s).abs() <= s * 1e-3,
                "block {blk}: {d} vs {s}"
            );
        }
    }

    #[test]
    fn fast_path_equals_reference() {
        for (rows, k) in [(7, 576), (5, 1536), (3, 256), (2, 96)] {
            let w = gauss(rows * k, 1 + k as u64);
            let x = gauss(k, 99);
            let rb = k / QK * TQ2R_BYTES;
            let mut b = vec![0u8; rows * rb];
            for (r, o) in w.chunks_exact(k).zip(b.chunks_exact_mut(rb)) {
                quantize_row(r, o).unwrap();
            }
            let (mut y0, mut y1) = (vec![0f32; rows], vec![0f32; rows]);
            matvec_ref(&b, &x, &mut y0).unwrap();
            matvec(&b, &x, &mut y1).unwrap();
            let scale = (k as f32).sqrt();
            for (a, c) in y0.iter().zip(&y1) {
                assert!((a - c).abs() <= 2e-5 * scale, "K={k}: {a} vs {c}");
            }
        }
    }

    /// 2-bit rotated RTN on Gaussian rows: the normalized error of a 4-level MSE-optimal grid
    /// (≈0.12) for both non-power-of-two options; zero padding is not worse by much but costs
    /// Kp/K the bytes.
    #[test]
    fn paley_and_padding_reconstruct_gaussian_rows() {
        for k in [576usize, 1536] {
            let w = gauss(k, 3);
            let mut b = vec![0u8; k / QK * TQ2R_BYTES];
            quantize_row(&w, &mut b).unwrap();
            let mut out = vec![0f32; k];
            dequantize_row(&b, &mut out).unwrap();
            let nmse = |o: &[f32]| {
                let e: f64 = o
                    .iter()
                    .zip(&w)
                    .map(|(a, b)| ((a - b) as f64).powi(2))
                    .sum();
                e / w.iter().map(|v| (*v as f64).powi(2)).sum::<f64>()
            };
            let (a, p) = (nmse(&out), nmse(&padded_roundtrip(&w)));
            assert!(a > 0.09 && a < 0.14, "K={k} paley nmse {a}");
            assert!(p > 0.05 && p < 0.14, "K={k} padded nmse {p}");
        }
    }

    #[test]
    fn zero_rows_and_huge_values() {
        let mut b = vec![0u8; TQ2R_BYTES * 2];
        quantize_row(&[0.0; 64], &mut b).unwrap();
        let mut out = vec![1f32; 64];
        dequantize_row(&b, &mut out).unwrap();
        assert!(out.iter().all(|v| *v == 0.0));
        quantize_row(&[1e30; 64], &mut b).unwrap();
        dequantize_row(&b, &mut out).unwrap();
        assert!(out.iter().all(|v| v.is_finite()));
        assert!(rotation(48).is_err());
    }
}
