//! Benchmarks of `tq::math` (plain main, no harness):
//!
//!     cargo bench --bench math > bench-math.md
//!
//! Prints Markdown: the machine's copy bandwidth (a large memcpy), FWHT throughput (scalar
//! reference vs optimized, in cache and streaming over a large array), full-row rotations of
//! non-power-of-two rows, and Lloyd-Max codebook computation times. Single-threaded.

mod common;

use common::{best_time, cpu_name, logical_cpus};
use std::hint::black_box;
use std::time::Duration;
use tq::math::hadamard::{fwht, fwht_scalar, rht_forward};
use tq::math::lloyd_max::{lloyd_max_bits, Dist};
use tq::math::pcg64::{row_signs, DEFAULT_ROW_SEED};
use tq::math::rotation::{Method, Rotation};

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 2654435761usize) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let min = Duration::from_millis(if quick { 20 } else { 200 });
    println!("# tq::math benchmarks\n");
    println!(
        "Machine: {}, {} logical CPUs; single-threaded. Command: `cargo bench --bench math`.\n",
        cpu_name(),
        logical_cpus()
    );

    // Memory bandwidth: copy 256 MiB.
    let big = 64 << 20; // f32 elements = 256 MiB
    let src = data(big);
    let mut dst = vec![0f32; big];
    let t = best_time(min, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&dst);
    })
    .wall;
    let bytes = (big * 4) as f64;
    let copy_gbs = bytes / t / 1e9;
    println!("## Memory bandwidth\n");
    println!(
        "memcpy of 256 MiB: {copy_gbs:.2} GB/s copied ({:.2} GB/s of read + write traffic).\n",
        2.0 * copy_gbs
    );

    // FWHT.
    println!("## FWHT (unnormalized, in place)\n");
    println!("In cache: one 64 KiB working set transformed repeatedly. Streaming: every row of a 256 MiB array once");
    println!("(each element read and written once per pass; compare with the memcpy rate: a transform that keeps up");
    println!("with memory moves {:.2} G elements/s).\n", copy_gbs / 4.0);
    println!("| n | scalar, in cache (elem/s) | optimized, in cache (elem/s) | speed-up | optimized, streaming (elem/s) | streaming GB/s (r+w) | vs memcpy |");
    println!("|---|---|---|---|---|---|---|");
    for n in [32usize, 128, 4096, 16384] {
        let rows_c = (16384 / n).max(1);
        let mut buf = data(n * rows_c);
        let ts = best_time(min, || {
            for r in buf.chunks_exact_mut(n) {
                fwht_scalar(r);
            }
            black_box(&buf);
        })
        .wall;
        let to = best_time(min, || {
            for r in buf.chunks_exact_mut(n) {
                fwht(r);
            }
            black_box(&buf);
        })
        .wall;
        let elems = (n * rows_c) as f64;
        let tstream = best_time(min, || {
            for r in dst.chunks_exact_mut(n) {
                fwht(r);
            }
            black_box(&dst);
        })
        .wall;
        let es = big as f64 / tstream;
        println!(
            "| {n} | {:.3e} | {:.3e} | {:.2}x | {:.3e} | {:.2} | {:.0}% |",
            elems / ts,
            elems / to,
            ts / to,
            es,
            es * 8.0 / 1e9,
            100.0 * es * 4.0 / 1e9 / copy_gbs
        );
        // Keep values bounded between rounds.
        dst.iter_mut().for_each(|v| *v = v.signum());
    }
    println!();

    // Randomized Hadamard and full-row rotations.
    println!("## Rotations of one row (in cache)\n");
    println!("| n | rotation | ns/row | elem/s |\n|---|---|---|---|");
    for n in [128usize, 4096] {
        let s = row_signs(DEFAULT_ROW_SEED, n);
        let mut x = data(n);
        let t = best_time(min, || {
            rht_forward(black_box(&mut x), &s);
        })
        .wall;
        println!(
            "| {n} | rht (signs, FWHT, 1/√n) | {:.0} | {:.3e} |",
            t * 1e9,
            n as f64 / t
        );
    }
    for (n, m) in [
        (576usize, Method::Auto),
        (576, Method::Block),
        (1536, Method::Auto),
        (172, Method::Auto),
    ] {
        let r = Rotation::new(n, m, DEFAULT_ROW_SEED).unwrap();
        let x = data(n);
        let t = best_time(min, || {
            black_box(r.forward(black_box(&x)));
        })
        .wall;
        println!(
            "| {n} | {} | {:.0} | {:.3e} |",
            r.describe(),
            t * 1e9,
            n as f64 / t
        );
    }
    println!();

    // Codebooks.
    println!("## Lloyd-Max codebook computation (exact beta density; goal < 50 ms each)\n");
    println!("| d | b=1 | b=2 | b=3 | b=4 | b=5 | b=6 | b=7 | b=8 |\n|---|---|---|---|---|---|---|---|---|");
    let mut worst: f64 = 0.0;
    for d in [64usize, 128, 256, 576] {
        let mut cells = Vec::new();
        for bits in 1..=8u32 {
            let t = best_time(Duration::from_millis(if quick { 5 } else { 50 }), || {
                black_box(lloyd_max_bits(&Dist::Beta { d }, bits));
            })
            .wall;
            worst = worst.max(t);
            cells.push(format!("{:.2} ms", t * 1e3));
        }
        println!("| {d} | {} |", cells.join(" | "));
    }
    let t = best_time(Duration::from_millis(50), || {
        black_box(lloyd_max_bits(&Dist::Normal01, 8));
    })
    .wall;
    println!(
        "\nN(0,1), 8 bits: {:.2} ms. Slowest beta codebook: {:.2} ms.",
        t * 1e3,
        worst * 1e3
    );
}
