//! Issue 19 measurement: the bitshift trellis of `tq2_t` on i.i.d. Gaussian data. For several
//! state sizes L prints the normalized MSE (‖x − x̂‖² / ‖x‖², i.e. in units of σ²) of 64-value
//! tail-biting blocks and the single-thread encode speed, with a float scale and with the format's
//! one-byte scale; plus the ablations (no tail-biting, no scale refit).
//!
//!   cargo run --release --example tq2t_mse -- [--blocks N] [--l 8,10,12,14,16]
//!
//! Speeds are given per wall second and per CPU second of the one thread (the latter holds on a
//! loaded machine).

use std::time::Instant;
use tq::types::tq2t::{codebook, encode_block, Scratch, Settings, QK};

/// Flags (clap, as the CLI's).
#[derive(clap::Parser)]
struct Args {
    /// 64-value blocks of Gaussian data.
    #[arg(long, default_value_t = 256)]
    blocks: usize,
    /// State sizes L.
    #[arg(long = "l", value_delimiter = ',', default_values_t = [8u32, 10, 12, 14, 16])]
    ls: Vec<u32>,
}

fn main() {
    let Args { blocks, ls } = clap::Parser::parse();
    // SplitMix64 + Box–Muller: a fixed, reproducible Gaussian sample.
    let mut st = 2026u64;
    let mut next = move || {
        st = st.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = st;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let x: Vec<f32> = (0..blocks * QK)
        .map(|_| {
            let (u, v) = (1.0 - next(), next());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect();
    println!(
        "| L | scale | tail-biting | refit | NMSE (σ²) | encode values/s (1 thread, wall) | values per CPU-second |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &l in &ls {
        let cb = codebook(l);
        let mut sc = Scratch::new(l, QK);
        let base = Settings {
            l,
            ..Settings::FORMAT
        };
        let mut variants = vec![(base, true), (base, false)];
        if l == tq::types::tq2t::L {
            variants.push((
                Settings {
                    tail_biting: false,
                    ..base
                },
                true,
            ));
            variants.push((
                Settings {
                    refit: false,
                    ..base
                },
                true,
            ));
            variants.push((
                Settings {
                    refit_keeps_wrap: true,
                    ..base
                },
                true,
            ));
        }
        for (st, byte) in variants {
            let (mut codes, mut y) = ([0u8; QK], [0f32; QK]);
            let t0 = Instant::now();
            let c0 = thread_cpu_seconds();
            let mut err = 0f64;
            for b in x.chunks_exact(QK) {
                let (_, e) = encode_block(b, &cb, st, byte, &mut sc, &mut codes, &mut y);
                // The decoded values' error; without tail-biting the decoder would wrap anyway, so
                // that row reports the free-start search's own error (what a stored start would give).
                err += if st.tail_biting {
                    b.iter()
                        .zip(&y)
                        .map(|(a, c)| ((a - c) as f64).powi(2))
                        .sum::<f64>()
                } else {
                    e as f64
                };
            }
            let secs = t0.elapsed().as_secs_f64();
            let cpu = thread_cpu_seconds() - c0;
            let s: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
            println!(
                "| {l} | {} | {} | {} | {:.5} | {:.0} | {:.0} |",
                if byte { "u8 (format)" } else { "f32" },
                st.tail_biting,
                match (st.refit, st.refit_keeps_wrap) {
                    (true, true) => "true, keeps the wrap",
                    (r, _) =>
                        if r {
                            "true"
                        } else {
                            "false"
                        },
                },
                err / s,
                x.len() as f64 / secs,
                x.len() as f64 / cpu
            );
        }
    }
}

/// This thread's CPU time (what one core spent, whatever else the machine runs).
#[cfg(unix)]
fn thread_cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[cfg(not(unix))]
fn thread_cpu_seconds() -> f64 {
    f64::NAN
}
