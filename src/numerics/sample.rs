//! Deterministic test data for kernels and numerics models: Gaussian weights quantized with the
//! CPU reference quantizer, activations with outlier channels, and the f64 reference dots that
//! mat-vec results are held to.

use crate::error::Result;
use crate::math::splitmix::SplitMix64 as Rng;
use crate::types::{dequantize_rows, quantize_rows, TensorType};

/// Gaussian weights quantized with the CPU reference quantizer (by rows of `cols`, so row-rotated
/// types get their rotation).
pub fn random_weights(ty: TensorType, rows: usize, cols: usize, rng: &mut Rng) -> Result<Vec<u8>> {
    let sigma = 0.02 + 0.05 * rng.uniform();
    let src: Vec<f32> = (0..rows * cols)
        .map(|_| (rng.gauss() * sigma) as f32)
        .collect();
    let mut out = vec![0u8; (rows * cols) / ty.block_size() * ty.block_bytes()];
    quantize_rows(ty, &src, &mut out, cols, "random weights")?;
    Ok(out)
}

/// An activation like an RMS-normed hidden state: Gaussian with a few large outlier channels.
pub fn random_activation(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let g = rng.gauss();
            if rng.uniform() < 1.0 / 64.0 {
                (g * 20.0) as f32
            } else {
                g as f32
            }
        })
        .collect()
}

/// CPU reference of a mat-vec / Q·K: dequantize each row (CPU reference) and dot with `x` in f64.
/// Returns the dots and `Σ|w_j·x_j|` per row.
pub fn reference_dots(
    ty: TensorType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut w = vec![0f32; rows * cols];
    dequantize_rows(ty, bytes, &mut w, cols, "reference")?;
    Ok(dots_of(&w, rows, cols, x))
}

/// f64 dots of the rows of `w` (`rows × cols`) with `x`, and `Σ|w_j·x_j|` per row.
pub fn dots_of(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut dots = Vec::with_capacity(rows);
    let mut sums = Vec::with_capacity(rows);
    for r in 0..rows {
        let row = &w[r * cols..(r + 1) * cols];
        let (mut d, mut s) = (0f64, 0f64);
        for (a, b) in row.iter().zip(x) {
            let p = *a as f64 * *b as f64;
            d += p;
            s += p.abs();
        }
        dots.push(d);
        sums.push(s);
    }
    (dots, sums)
}
