//! Phase timers for LDLQ (`TQ_LDLQ_PROF=1`): wall nanoseconds summed over calls (the sweeps of
//! different row groups run on different threads, so their sum is thread-seconds; the Cholesky and
//! inverse are one call each that faer parallelizes inside, so theirs is wall time) in the
//! Hessian rotation, the Cholesky, the triangular inverse and the sweep (split into the in-batch
//! part, which is rounding plus the feedback inside a 128-column batch, and the GEMM that carries a
//! batch's errors past it, with its copies). Plain `Instant` counters, so they work on a copied
//! binary without a profiler; [`report`] prints them as one line at the end of `tq convert`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

#[derive(Clone, Copy)]
pub(crate) enum Phase {
    Rotate,
    Cholesky,
    Inverse,
    SweepBatch,
    SweepGemm,
}

const NAMES: [&str; 5] = [
    "rotate",
    "cholesky",
    "inverse",
    "sweep-in-batch",
    "sweep-gemm",
];
static NS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

/// Whether `TQ_LDLQ_PROF` is set (read once).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("TQ_LDLQ_PROF").is_some_and(|v| v != "0"))
}

/// A start time when profiling is on.
pub(crate) fn start() -> Option<Instant> {
    enabled().then(Instant::now)
}

/// Add the time since `t` (from [`start`]) to `p`.
pub(crate) fn add(p: Phase, t: Option<Instant>) {
    if let Some(t) = t {
        NS[p as usize].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// One line with every phase's total seconds, when profiling is on.
pub fn report() {
    if !enabled() {
        return;
    }
    let parts: Vec<String> = NAMES
        .iter()
        .zip(&NS)
        .map(|(n, a)| format!("{n} {:.2} s", a.load(Ordering::Relaxed) as f64 * 1e-9))
        .collect();
    eprintln!(
        "tq: ldlq phases (wall-seconds summed over calls): {}",
        parts.join(", ")
    );
}
