//! Reconstruction error of the TQ weight types on Gaussian data. The fork-exact TQ4_1S encoder gives a
//! relative MSE of 0.0053 on N(0,1) (and on SmolLM2's real weights, scripts/e2e-convert.sh); the issue
//! quoted ≈ 0.0047, which our bit-exact reproduction of the reference encoder does not reach (this test
//! is where the number is recorded). A broken codebook, rotation or scale search moves these numbers.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use tq::types::{dequantize, quantize, TensorType};

fn rel_mse(ty: TensorType, x: &[f32]) -> f64 {
    let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
    quantize(ty, x, &mut q, "gaussian").unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &q, &mut y, "gaussian").unwrap();
    let num: f64 = x
        .iter()
        .zip(&y)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    num / den
}

#[test]
fn gaussian_relative_mse() {
    let x = fixtures::gguf_gen::gaussian(2026, 1 << 20, 1.0);
    let tq4 = rel_mse(TensorType::TQ4_1S, &x);
    let tq3 = rel_mse(TensorType::TQ3_1S, &x);
    let q4_0 = rel_mse(TensorType::Q4_0, &x);
    let q4_1 = rel_mse(TensorType::Q4_1, &x);
    eprintln!(
        "relative MSE on N(0,1): tq4_1s {tq4:.5} tq3_1s {tq3:.5} q4_0 {q4_0:.5} q4_1 {q4_1:.5}"
    );
    assert!((0.0050..0.0056).contains(&tq4), "tq4_1s {tq4}");
    assert!((0.020..0.025).contains(&tq3), "tq3_1s {tq3}");
    // Same 5.0 bpw as q4_1: TQ4_1S must be clearly better; and better than 4.5-bpw q4_0.
    assert!(tq4 < 0.9 * q4_1, "tq4_1s {tq4} vs q4_1 {q4_1}");
    assert!(tq4 < q4_0, "tq4_1s {tq4} vs q4_0 {q4_0}");
}
