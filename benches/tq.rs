//! Benchmarks of the TQ4_1S / TQ3_1S weight encoders and decoders (plain main, no harness):
//!
//!     cargo bench --bench tq                # full
//!     cargo bench --bench tq -- --quick     # shorter runs
//!
//! Prints Markdown: single-threaded throughput in M values/s (best of 5 rounds) of the scalar
//! references and of the registry paths (`quantize_tq4_1s` etc., the fastest bit-exact versions),
//! on 2^20 Gaussian values with a per-row scale (rows of 4096, like a weight matrix).

mod common;

use common::{best_time, cpu_name, logical_cpus, Timing};
use std::hint::black_box;
use std::time::Duration;
use tq::types::tq::{
    dequantize_tq3_1s, dequantize_tq3_1s_ref, dequantize_tq4_1s, dequantize_tq4_1s_ref,
    quantize_tq3_1s, quantize_tq3_1s_portable, quantize_tq3_1s_ref, quantize_tq4_1s,
    quantize_tq4_1s_portable, quantize_tq4_1s_ref, QK, TQ3_BYTES, TQ4_BYTES,
};

fn row(name: &str, n: usize, Timing { wall, cpu }: Timing) {
    let cpu = cpu.map_or("-".to_string(), |c| format!("{:.1}", n as f64 / c / 1e6));
    println!("| {name} | {:.1} | {cpu} |", n as f64 / wall / 1e6);
}

/// Deterministic Gaussian weights (SplitMix64 + Box-Muller), each row of 4096 with its own scale.
fn data(n: usize) -> Vec<f32> {
    let mut s = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 + 1e-300
    };
    let mut out = Vec::with_capacity(n);
    let mut scale = 0.02;
    for i in 0..n {
        if i % 4096 == 0 {
            scale = 0.005 + 0.05 * next();
        }
        let (u1, u2) = (next(), next());
        let g = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        out.push((g * scale) as f32);
    }
    out
}

type QFn = fn(&[f32], &mut [u8]);
type DFn = fn(&[u8], &mut [f32]);

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let min = Duration::from_millis(if quick { 50 } else { 300 });
    let n = 1usize << 20;
    let x = data(n);
    let nb = n / QK;
    println!("# TQ weight encoder benchmarks\n");
    println!(
        "Machine: {}, {} logical CPUs; single-threaded; {} values (Gaussian, per-row scale). \
         Command: `cargo bench --bench tq`. M values/s, best of 5 rounds, by wall time and by the \
         thread's CPU time.\n",
        cpu_name(),
        logical_cpus(),
        n
    );
    #[cfg(target_arch = "x86_64")]
    println!(
        "AVX2 detected: {}\n",
        std::arch::is_x86_feature_detected!("avx2")
    );
    println!("| path | M values/s (wall) | M values/s (CPU time) |\n|---|---|---|");
    let quants: [(&str, usize, QFn); 6] = [
        (
            "tq4_1s quantize (scalar reference)",
            TQ4_BYTES,
            quantize_tq4_1s_ref,
        ),
        (
            "tq4_1s quantize (portable cross-block)",
            TQ4_BYTES,
            quantize_tq4_1s_portable,
        ),
        ("tq4_1s quantize (registry)", TQ4_BYTES, quantize_tq4_1s),
        (
            "tq3_1s quantize (scalar reference)",
            TQ3_BYTES,
            quantize_tq3_1s_ref,
        ),
        (
            "tq3_1s quantize (portable cross-block)",
            TQ3_BYTES,
            quantize_tq3_1s_portable,
        ),
        ("tq3_1s quantize (registry)", TQ3_BYTES, quantize_tq3_1s),
    ];
    for (name, bytes, f) in quants {
        let mut out = vec![0u8; nb * bytes];
        row(
            name,
            n,
            best_time(min, || f(black_box(&x), black_box(&mut out))),
        );
    }
    let mut q4 = vec![0u8; nb * TQ4_BYTES];
    quantize_tq4_1s(&x, &mut q4);
    let mut q3 = vec![0u8; nb * TQ3_BYTES];
    quantize_tq3_1s(&x, &mut q3);
    let deqs: [(&str, &[u8], DFn); 4] = [
        (
            "tq4_1s dequantize (scalar reference)",
            &q4,
            dequantize_tq4_1s_ref,
        ),
        ("tq4_1s dequantize (registry)", &q4, dequantize_tq4_1s),
        (
            "tq3_1s dequantize (scalar reference)",
            &q3,
            dequantize_tq3_1s_ref,
        ),
        ("tq3_1s dequantize (registry)", &q3, dequantize_tq3_1s),
    ];
    for (name, q, f) in deqs {
        let mut out = vec![0f32; n];
        row(
            name,
            n,
            best_time(min, || f(black_box(q), black_box(&mut out))),
        );
    }
}
