//! Timing shared by the benches (`mod common;` in each): one way to time a kernel and name the
//! machine, so the numbers in the three reports are comparable.
#![allow(dead_code)] // each bench uses a subset

use std::time::{Duration, Instant};

/// Rounds per measurement; the best round is reported (the others absorb interference).
pub const ROUNDS: usize = 5;

/// Best time of one call of a measured closure, in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Wall-clock time.
    pub wall: f64,
    /// CPU time of the calling thread (steadier on a loaded machine), where the OS reports it.
    pub cpu: Option<f64>,
}

impl Timing {
    /// Items per second by wall time, for `n` items per call.
    pub fn rate(&self, n: usize) -> f64 {
        n as f64 / self.wall
    }
}

/// CPU time of the calling thread in seconds (Linux: `/proc/thread-self/schedstat`), if known.
fn thread_cpu() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(s.split_whitespace().next()?.parse::<f64>().ok()? * 1e-9)
}

/// Run `f` for `ROUNDS` rounds, each repeating it for at least `min` (and at least once); return
/// the best per-call time of a round, by wall time and by the thread's CPU time.
pub fn best_time(min: Duration, mut f: impl FnMut()) -> Timing {
    let mut best = Timing {
        wall: f64::INFINITY,
        cpu: None,
    };
    for _ in 0..ROUNDS {
        let c0 = thread_cpu();
        let t = Instant::now();
        let mut iters = 0u64;
        while t.elapsed() < min || iters == 0 {
            f();
            iters += 1;
        }
        best.wall = best.wall.min(t.elapsed().as_secs_f64() / iters as f64);
        if let (Some(a), Some(b)) = (c0, thread_cpu()) {
            let c = (b - a) / iters as f64;
            best.cpu = Some(best.cpu.map_or(c, |x| x.min(c)));
        }
    }
    best
}

/// The CPU's model name (from `/proc/cpuinfo`), for report headers.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Logical CPUs available to this process.
pub fn logical_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
