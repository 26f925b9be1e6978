//! Microbenchmark: one free Viterbi pass over a 64-value block, repeated; prints thread-CPU
//! nanoseconds per state update for each L (measurement aid for the tq2_t step).
//!
//!   cargo run --release --example tq2t_step_bench -- [--l 10,12] [--reps N]

use tq::types::tq2t::{codebook, viterbi, Ends, Scratch, QK};

/// Flags (clap, as the CLI's).
#[derive(clap::Parser)]
struct Args {
    /// State sizes L to time.
    #[arg(long = "l", value_delimiter = ',', default_values_t = [10u32, 12])]
    ls: Vec<u32>,
    /// Passes per L.
    #[arg(long, default_value_t = 2000)]
    reps: usize,
}

fn main() {
    let Args { ls, reps } = clap::Parser::parse();
    let x: Vec<f32> = (0..QK)
        .map(|j| ((j * 37 % 64) as f32 - 31.5) / 20.0)
        .collect();
    let wt = vec![1f32; QK];
    for l in ls {
        let dc: Vec<f32> = codebook(l).iter().map(|c| 0.9 * c).collect();
        let mut sc = Scratch::new(l, QK);
        let mut codes = [0u8; QK];
        let c0 = cpu();
        let mut acc = 0f32;
        for _ in 0..reps {
            acc += viterbi(&x, &wt, &dc, l, Ends::Free, &mut sc, &mut codes);
        }
        let t = cpu() - c0;
        let updates = reps as f64 * (QK - 1) as f64 * (1u64 << l) as f64;
        println!(
            "L {l}: {:.1} µs per pass, {:.3} ns per state update ({acc:.1})",
            t / reps as f64 * 1e6,
            t / updates * 1e9
        );
    }
}

fn cpu() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
