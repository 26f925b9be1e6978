//! tq2_r's CPU fast path (rotate the activation once, dot the 2-bit codes) against a q4_0
//! mat-vec of the same shape, measured in the same run (plain main, no harness):
//!
//!     cargo bench --bench tq2r                # full
//!     cargo bench --bench tq2r -- --quick     # shorter runs
//!
//! Single-threaded, best of 5 rounds. The q4_0 peer is the same kind of loop (decode codes and
//! multiply by x on the fly, one f32 accumulator per block, no SIMD intrinsics), so the ratio
//! compares formats, not implementations: tq2_r reads 10 bytes per 32 weights and pays one
//! whole-row rotation per mat-vec; q4_0 reads 18 bytes per 32 and rotates nothing. The reference
//! path (dequantize each row, then dot) is shown too.

mod common;

use common::{best_time, cpu_name, logical_cpus};
use std::hint::black_box;
use std::time::Duration;
use tq::types::{tq2r, TensorType};

fn gauss(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut u = move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 + 1e-300
    };
    (0..n)
        .map(|_| ((-2.0 * u().ln()).sqrt() * (std::f64::consts::TAU * u()).cos()) as f32 * 0.02)
        .collect()
}

/// q4_0 mat-vec on the fly: `y_n = Σ_b d_b Σ_j (q_j − 8)·x_j` (low nibbles 0..15, high 16..31).
fn matvec_q4_0(blocks: &[u8], x: &[f32], y: &mut [f32]) {
    let rb = x.len() / 32 * 18;
    for (yn, row) in y.iter_mut().zip(blocks.chunks_exact(rb)) {
        let mut acc = 0f32;
        for (b, xs) in row.chunks_exact(18).zip(x.chunks_exact(32)) {
            let d = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            let mut s = 0f32;
            for j in 0..16 {
                s += ((b[2 + j] & 15) as i32 - 8) as f32 * xs[j]
                    + ((b[2 + j] >> 4) as i32 - 8) as f32 * xs[j + 16];
            }
            acc += d * s;
        }
        *yn = acc;
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let min = Duration::from_millis(if quick { 50 } else { 300 });
    println!(
        "CPU: {} ({} logical), single thread, best of 5\n",
        cpu_name(),
        logical_cpus()
    );
    println!("| shape (rows x K) | q4_0 µs | tq2_r fast µs | tq2_r reference µs | fast / q4_0 time | weight bytes q4_0 / tq2_r |");
    println!("|---|---|---|---|---|---|");
    for (rows, k, name) in [
        (1536, 576, "SmolLM2 ffn_up"),
        (576, 1536, "SmolLM2 ffn_down"),
        (4096, 4096, "square"),
    ] {
        let w = gauss(rows * k, 1);
        let x = gauss(k, 2);
        let mut q4 = vec![0u8; rows * k / 32 * 18];
        tq::types::quantize(TensorType::Q4_0, &w, &mut q4, "bench").unwrap();
        let mut q2 = vec![0u8; rows * k / 32 * 10];
        tq::types::quantize_rows(TensorType::TQ2R, &w, &mut q2, k, "bench").unwrap();
        let mut y = vec![0f32; rows];
        let t4 = best_time(min, || matvec_q4_0(black_box(&q4), black_box(&x), &mut y));
        let t2 = best_time(min, || {
            tq2r::matvec(black_box(&q2), black_box(&x), &mut y).unwrap()
        });
        let tr = best_time(min, || {
            tq2r::matvec_ref(black_box(&q2), black_box(&x), &mut y).unwrap()
        });
        println!(
            "| {name} ({rows} x {k}) | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            t4.wall * 1e6,
            t2.wall * 1e6,
            tr.wall * 1e6,
            t2.wall / t4.wall,
            q4.len() as f64 / q2.len() as f64
        );
    }
}
