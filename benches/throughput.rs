//! Throughput benchmarks: `cargo bench --bench throughput` (release build, plain `main`, no
//! harness). Prints markdown tables, one section per subsystem; every kernel runs on one thread.
//!
//! Sections (add new ones as `fn section_*()` and call them from `main`):
//! * `section_dequant`: every type with a dequantizer in the registry, ~16M values of random
//!   valid blocks.
//! * `section_quant`: every type with a quantizer, ~4M random normal values.
//!
//! Timing: each kernel runs once to warm up, then `common::best_time` over about `MIN_TIME`
//! (5 rounds); the best round's time per run is reported.

mod common;

use common::{best_time, cpu_name, logical_cpus, Timing, ROUNDS};
use std::hint::black_box;
use std::time::Duration;

use tq::types::{TypeInfo, TYPES};

/// Values decoded per dequantization run.
const DEQUANT_N: usize = 1 << 24;
/// Values encoded per quantization run.
const QUANT_N: usize = 1 << 22;
/// Size of the pool of distinct blocks that is tiled to `DEQUANT_N` values.
const POOL_N: usize = 1 << 20;
/// Least time spent timing one kernel (after its warm-up run).
const MIN_TIME: Duration = Duration::from_millis(600);

// ---------------------------------------------------------------------------------------------
// Shared helpers

/// Small deterministic generator (xorshift64*), enough for benchmark data.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

/// Normal values with a per-32-block scale, like weights.
fn weights(n: usize, rng: &mut Rng) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let s = 0.02 * (1.0 + 3.0 * rng.uniform());
        for _ in 0..32.min(n - v.len()) {
            v.push(s * rng.normal());
        }
    }
    v
}

/// Byte offsets of f16 scales in the block types that have no quantizer (random bytes elsewhere).
fn f16_fields(name: &str) -> &'static [usize] {
    match name {
        "q2_K" => &[80, 82],
        "q3_K" => &[108],
        "q6_K" => &[208],
        "q4_K" | "q5_K" | "q4_1" | "q5_1" => &[0, 2],
        "tq1_0" => &[52],
        "tq2_0" => &[64],
        // u8 scales (E8M0 / UE4M3), or (IQ1_M) d spread over the scale words: random bytes.
        "mxfp4" | "nvfp4" | "iq1_m" => &[],
        _ => &[0],
    }
}

/// `n` values' worth of valid blocks of `t`: quantized random weights where `t` has a quantizer
/// (a pool of `POOL_N` values tiled), otherwise random bytes with finite f16 scales.
fn valid_blocks(t: &TypeInfo, n: usize, rng: &mut Rng) -> Vec<u8> {
    let n_blocks = n / t.block_size;
    let pool_blocks = (POOL_N / t.block_size).min(n_blocks).max(1);
    let mut pool = vec![0u8; pool_blocks * t.block_bytes];
    match t.quantize {
        Some(q) => q(&weights(pool_blocks * t.block_size, rng), &mut pool),
        None => {
            for b in pool.iter_mut() {
                *b = rng.next_u64() as u8;
            }
            if t.block_size > 1 {
                for blk in pool.chunks_exact_mut(t.block_bytes) {
                    for &off in f16_fields(t.name) {
                        let d = 0.001 + 0.01 * rng.uniform();
                        blk[off..off + 2]
                            .copy_from_slice(&tq::types::float::f32_to_f16_bits(d).to_le_bytes());
                    }
                }
            }
        }
    }
    let mut out = Vec::with_capacity(n_blocks * t.block_bytes);
    while out.len() < n_blocks * t.block_bytes {
        let take = pool.len().min(n_blocks * t.block_bytes - out.len());
        out.extend_from_slice(&pool[..take]);
    }
    out
}

/// Time `f` (see the module doc), or `None` if `f` panics (a kernel not implemented yet).
fn time_best(mut f: impl FnMut()) -> Option<Timing> {
    // The panic probe doubles as the warm-up run.
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut f)).is_ok();
    if !ok {
        return None;
    }
    Some(best_time(MIN_TIME / ROUNDS as u32, f))
}

// ---------------------------------------------------------------------------------------------
// Sections

fn section_dequant() {
    println!(
        "## Dequantize (1 thread, {} M values per run, f32 output)\n",
        DEQUANT_N >> 20
    );
    println!("| type | bits/weight | M values/s | GB/s f32 out | GB/s blocks in |");
    println!("|---|---:|---:|---:|---:|");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for t in TYPES {
        let Some(deq) = t.dequantize else { continue };
        let n = DEQUANT_N / t.block_size * t.block_size;
        let blocks = valid_blocks(t, n, &mut rng);
        let mut out = vec![0f32; n];
        match time_best(|| deq(black_box(&blocks), black_box(&mut out))) {
            Some(d) => {
                let r = d.rate(n);
                println!(
                    "| {} | {:.3} | {:.0} | {:.2} | {:.2} |",
                    t.name,
                    t.block_bytes as f64 * 8.0 / t.block_size as f64,
                    r / 1e6,
                    r * 4.0 / 1e9,
                    d.rate(blocks.len()) / 1e9
                );
            }
            None => println!("| {} | | (panicked: not implemented) | | |", t.name),
        }
    }
    println!();
}

fn section_quant() {
    println!(
        "## Quantize (1 thread, {} M values per run, f32 input)\n",
        QUANT_N >> 20
    );
    println!("| type | M values/s | GB/s f32 in |");
    println!("|---|---:|---:|");
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let src = weights(QUANT_N, &mut rng);
    for t in TYPES {
        let Some(q) = t.quantize else { continue };
        let n = QUANT_N / t.block_size * t.block_size;
        let mut out = vec![0u8; n / t.block_size * t.block_bytes];
        match time_best(|| q(black_box(&src[..n]), black_box(&mut out))) {
            Some(d) => {
                let r = d.rate(n);
                println!("| {} | {:.1} | {:.3} |", t.name, r / 1e6, r * 4.0 / 1e9);
            }
            None => println!("| {} | (panicked: not implemented) | |", t.name),
        }
    }
    println!();
}

fn main() {
    // `cargo bench` passes `--bench`; section names select sections (`cargo bench --bench
    // throughput -- quant`). A panicking kernel is reported in its table (message on stderr).
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |name: &str| filter.is_empty() || filter.iter().any(|f| f == name);
    println!(
        "# tq throughput ({}, {} threads available, kernels single-threaded)\n",
        cpu_name(),
        logical_cpus()
    );
    let sections: &[(&str, fn())] = &[
        ("dequant", section_dequant),
        ("quant", section_quant),
        // Further sections go here, e.g. ("fwht", section_fwht).
    ];
    for (name, f) in sections {
        if want(name) {
            f();
        }
    }
}
