//! The machine's f32 GEMM rate on faer, the peer the calibration FLOP/s report is read against
//! (issue 13: "≥ 60% of peak for the forward and XᵀX").
//!
//! `cargo run --release --example gemm_peak -- [--n 2048] [--threads T]`
//!
//! Prints GFLOP/s of a square `n³` product on all threads (the forward pass's shape class: a
//! weight matrix times many tokens) and of the calibration's `XᵀX` tile shape (`n × 64` outputs
//! over `n` rows, one tile per thread, as `quant::hessian` runs them), best of 3 runs each.

use faer::{Accum, Mat, Par};
use rayon::prelude::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get = |k: &str, d: usize| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = get("--n", 2048);
    let threads = get("--threads", rayon::current_num_threads());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool");
    let a = Mat::<f32>::from_fn(n, n, |i, j| ((i * 31 + j * 17) % 97) as f32 / 97.0 - 0.5);
    let b = Mat::<f32>::from_fn(n, n, |i, j| ((i * 13 + j * 7) % 89) as f32 / 89.0 - 0.5);
    let best = |f: &dyn Fn()| {
        (0..3)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let square = best(&|| {
        let mut c = Mat::<f32>::zeros(n, n);
        pool.install(|| {
            faer::linalg::matmul::matmul(
                c.as_mut(),
                Accum::Replace,
                a.as_ref(),
                b.as_ref(),
                1.0,
                Par::rayon(threads),
            )
        });
        std::hint::black_box(&c);
    });
    // XᵀX tiles: X is n rows (tokens) × n columns; each tile is Xᵀ·X[:, c0..c0+64].
    let tiles = n / 64;
    let tile = best(&|| {
        pool.install(|| {
            (0..tiles).into_par_iter().for_each(|t| {
                let mut c = Mat::<f32>::zeros(n, 64);
                faer::linalg::matmul::matmul(
                    c.as_mut(),
                    Accum::Replace,
                    a.as_ref().transpose(),
                    a.as_ref().subcols(t * 64, 64),
                    1.0,
                    Par::Seq,
                );
                std::hint::black_box(&c);
            })
        })
    });
    let fl = 2.0 * (n as f64).powi(3);
    println!("threads {threads}, n {n}");
    println!("square f32 GEMM:      {:.1} GFLOP/s", fl / square / 1e9);
    println!("XᵀX 64-column tiles:  {:.1} GFLOP/s", fl / tile / 1e9);
}
