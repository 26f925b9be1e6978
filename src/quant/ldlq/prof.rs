//! Phase timers for LDLQ (`TQ_LDLQ_PROF=1`): wall nanoseconds summed over calls (the sweeps of
//! different row groups run on different threads, so their sum is thread-seconds; the Cholesky and
//! inverse are one call each that faer parallelizes inside, so theirs is wall time) in the
//! Hessian rotation, the Cholesky, the triangular inverse and the sweep (split into the in-batch
//! part, which is rounding plus the feedback inside a 128-column batch, and the GEMM that carries a
//! batch's errors past it, with its copies). Plain `Instant` counters, so they work on a copied
//! binary without a profiler; [`report`] prints them as one line at the end of `tq convert`.
//! Beside each phase's wall time the calling thread's CPU time is summed (Unix): on a loaded
//! machine that is the comparable number for the sweep phases (one thread per row group), while
//! for the Cholesky and inverse it counts only the calling thread of faer's parallel kernels.

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
    /// tq2_t block-LDLQ: the Viterbi searches of a block (first search and decision feedback).
    TrellisSearch,
    /// tq2_t block-LDLQ: coordinate descent and the scale under the block's form.
    TrellisDescent,
    /// tq2_t block-LDLQ: the per-survivor beam search.
    TrellisBeam,
    /// tq2_t block-LDLQ: the rest of the row (its sweep through the block's columns, the forms).
    TrellisRow,
}

const NAMES: [&str; 9] = [
    "rotate",
    "cholesky",
    "inverse",
    "sweep-in-batch",
    "sweep-gemm",
    "tq2t-search",
    "tq2t-descent",
    "tq2t-beam",
    "tq2t-row",
];
static NS: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];
static CPU_NS: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];
/// Hessians factored (calls of `factor_hessian_owned`): tensors that share a Hessian share one.
static FACTORS: AtomicU64 = AtomicU64::new(0);

/// Count one factorization (always; printed by [`report`]).
pub(crate) fn count_factor() {
    FACTORS.fetch_add(1, Ordering::Relaxed);
}

/// The calling thread's CPU time in nanoseconds (0 where not available).
pub(crate) fn thread_cpu_ns() -> u64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant libc knows.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        }
    }
    0
}

/// Whether `TQ_LDLQ_PROF` is set (read once).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("TQ_LDLQ_PROF").is_some_and(|v| v != "0"))
}

/// A start time (wall, and the thread's CPU time) when profiling is on.
pub(crate) fn start() -> Option<(Instant, u64)> {
    enabled().then(|| (Instant::now(), thread_cpu_ns()))
}

/// Add the time since `t` (from [`start`], on the same thread) to `p`.
pub(crate) fn add(p: Phase, t: Option<(Instant, u64)>) {
    if let Some((t, c)) = t {
        NS[p as usize].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        CPU_NS[p as usize].fetch_add(thread_cpu_ns().saturating_sub(c), Ordering::Relaxed);
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
        .zip(&CPU_NS)
        .map(|((n, a), c)| {
            let s = |v: &AtomicU64| v.load(Ordering::Relaxed) as f64 * 1e-9;
            format!("{n} {:.2} s ({:.2} s CPU)", s(a), s(c))
        })
        .collect();
    eprintln!(
        "tq: ldlq phases (wall-seconds summed over calls, calling thread's CPU in brackets): {}; factors {}",
        parts.join(", "),
        FACTORS.load(Ordering::Relaxed)
    );
}
