//! Progress on stderr for long phases (the pipeline's, `tq eval`'s and `tq validate`'s blocks): a bar on a terminal; elsewhere (a log, a
//! pipe) a line every 10 s while a phase runs (`tq: PHASE 3/14 (21%), 40 s, eta 2m 30s`) and one
//! when a phase that printed finishes; nothing under `--quiet`. `TQ_PROGRESS_SECS` sets the
//! interval of those lines (default 10).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A phase's progress: an indicatif bar (drawn on a terminal, hidden otherwise) and, off a
/// terminal, a thread printing its state every interval until the phase finishes.
pub(crate) struct Bar {
    pb: ProgressBar,
    ticker: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl Bar {
    pub(crate) fn set_position(&self, pos: u64) {
        self.pb.set_position(pos);
    }

    pub(crate) fn set_length(&self, len: u64) {
        self.pb.set_length(len);
    }

    /// The phase is over: the bar is cleared (the line printer says how long it took).
    pub(crate) fn finish_and_clear(&mut self) {
        self.pb.finish_and_clear();
        self.stop();
    }

    fn stop(&mut self) {
        if let Some((flag, h)) = self.ticker.take() {
            flag.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Seconds between the progress lines off a terminal (`TQ_PROGRESS_SECS`, default 10).
fn interval() -> Duration {
    let s = std::env::var("TQ_PROGRESS_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(10.0);
    Duration::from_secs_f64(s)
}

/// `1h 02m`, `2m 30s`, `40 s`.
fn hms(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// One progress line: `tq: WHAT done/len (pct%), elapsed, eta …` (`bytes`: sizes in MB).
fn line(what: &str, pb: &ProgressBar, t0: Instant, bytes: bool) -> String {
    let (pos, len) = (pb.position(), pb.length().unwrap_or(0));
    let pct = if len > 0 {
        100.0 * pos as f64 / len as f64
    } else {
        0.0
    };
    let count = if bytes {
        format!("{:.1}/{:.1} MB", pos as f64 / 1e6, len as f64 / 1e6)
    } else {
        format!("{pos}/{len}")
    };
    let eta = if pos > 0 && pos < len {
        let el = t0.elapsed().as_secs_f64();
        hms(Duration::from_secs_f64(
            el / pos as f64 * (len - pos) as f64,
        ))
    } else {
        "unknown".into()
    };
    format!(
        "tq: {what} {count} ({pct:.0}%), {} elapsed, eta {eta}",
        hms(t0.elapsed())
    )
}

fn bar(quiet: bool, len: u64, what: &str, template: &str, bytes: bool) -> Bar {
    if quiet {
        return Bar {
            pb: ProgressBar::hidden(),
            ticker: None,
        };
    }
    if std::io::stderr().is_terminal() {
        let pb = ProgressBar::new(len);
        pb.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        return Bar { pb, ticker: None };
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
    let stop = Arc::new(AtomicBool::new(false));
    let (pb2, stop2, what) = (pb.clone(), stop.clone(), what.to_string());
    let every = interval();
    let h = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut next = t0 + every;
        let mut printed = false;
        while !stop2.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20).min(every));
            if Instant::now() >= next {
                eprintln!("{}", line(&what, &pb2, t0, bytes));
                printed = true;
                next += every;
            }
        }
        if printed {
            eprintln!("tq: {what} done in {}", hms(t0.elapsed()));
        }
    });
    Bar {
        pb,
        ticker: Some((stop, h)),
    }
}

/// A bar counting `len` steps of `what` (sensitivity, KLD probes, …) with an ETA.
pub(crate) fn steps(quiet: bool, len: u64, what: &str) -> Bar {
    bar(
        quiet,
        len,
        what,
        &format!("{what} {{bar:40}} {{pos}}/{{len}} eta {{eta}}"),
        false,
    )
}

/// A bar counting the output's `total` bytes, with the rate and an ETA.
pub(crate) fn bytes(quiet: bool, total: u64) -> Bar {
    bar(
        quiet,
        total,
        "writing",
        "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        true,
    )
}

/// The process's user + system CPU seconds (measurement tests print CPU, not wall, beside
/// other jobs).
#[cfg(test)]
pub(crate) fn process_cpu_seconds() -> f64 {
    // SAFETY: a zeroed rusage is a valid output buffer for getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is valid and writable; RUSAGE_SELF is a constant libc knows.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_say_the_phase_count_and_eta() {
        let pb = ProgressBar::with_draw_target(Some(8), ProgressDrawTarget::hidden());
        pb.set_position(2);
        let t0 = Instant::now() - Duration::from_secs(30);
        let l = line("sensitivity", &pb, t0, false);
        // 30 s for 2 of 8: 90 s to go.
        assert_eq!(l, "tq: sensitivity 2/8 (25%), 30 s elapsed, eta 1m 30s");
        pb.set_position(0);
        assert!(line("x", &pb, t0, false).ends_with("eta unknown"));
        assert_eq!(hms(Duration::from_secs(3725)), "1h 02m");
    }
}
