//! Test hooks: the one place library code may end the process (`tests/hooks.rs` holds every other
//! file under `src/` but `main.rs` to that).
//!
//! A *kill point* is a place a resumable run can be stopped abruptly, to test that `--resume`
//! picks up after it: the N-th time the run passes the point, where N is the value of the point's
//! environment variable, it prints one line and exits with status [`KILLED`] (137, the status a
//! shell reports for `kill -9`) through `std::process::exit`. Like `kill -9` it runs no cleanup:
//! no destructor runs, so the partial output, its checkpoint and its temporary files stay where
//! they are, and bytes still buffered are lost. Unset, empty, zero or not a number: the point never
//! fires. The variables are read once per process, on the first pass of any point.
//!
//! | point | variable | passed |
//! |---|---|---|
//! | [`KillPoint::ConvertCheckpoint`] | `TQ_CONVERT_ABORT_AFTER` | after `tq convert` checkpoints a tensor |
//! | [`KillPoint::CalibCheckpoint`] | `TQ_CALIB_ABORT_AFTER` | after `tq calib` checkpoints a block that leaves work to resume |
//!
//! A *pause* slows a run down where it passes, so that a test killing the process from outside
//! (`tests/kill.rs`: SIGKILL at random instants) lands in a window that is otherwise too short to
//! hit: it sleeps for the number of milliseconds in its variable (same parsing; at most 10 s),
//! and does nothing else. Like the kill points, the variables are read once per process.
//!
//! | pause | variable | sleeps |
//! |---|---|---|
//! | [`Pause::Data`] | `TQ_TEST_DATA_DELAY_MS` | after each chunk of a resumable output's data is written (`tq convert`: a tensor's bytes; `tq calib`: a Hessian group's), before its checkpoint |
//! | [`Pause::Rename`] | `TQ_TEST_RENAME_DELAY_MS` | in every output's commit, between the fsync of its temporary file and the rename: each checkpoint write, and the final rename of a partial output |

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The exit status of a run stopped at a kill point: 128 + SIGKILL, as a shell reports `kill -9`.
pub const KILLED: i32 = 137;

/// A place where a test may stop the process (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillPoint {
    /// `tq convert` (and `--resume`) made a tensor durable and wrote its checkpoint.
    ConvertCheckpoint,
    /// `tq calib` made a block of Hessians durable and wrote its checkpoint, with blocks left.
    CalibCheckpoint,
}

impl KillPoint {
    pub const ALL: [KillPoint; 2] = [KillPoint::ConvertCheckpoint, KillPoint::CalibCheckpoint];

    /// The environment variable that arms this point.
    pub fn env(self) -> &'static str {
        match self {
            KillPoint::ConvertCheckpoint => "TQ_CONVERT_ABORT_AFTER",
            KillPoint::CalibCheckpoint => "TQ_CALIB_ABORT_AFTER",
        }
    }

    /// The command that passes this point (the start of the line printed when it fires).
    fn command(self) -> &'static str {
        match self {
            KillPoint::ConvertCheckpoint => "tq convert",
            KillPoint::CalibCheckpoint => "tq calib",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A place where a test may slow a run down (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pause {
    /// A chunk of a resumable output's data was written (not yet checkpointed).
    Data,
    /// An output's temporary file is complete and synced, not yet renamed into place.
    Rename,
}

impl Pause {
    pub const ALL: [Pause; 2] = [Pause::Data, Pause::Rename];

    /// The environment variable that sets this pause's milliseconds.
    pub fn env(self) -> &'static str {
        match self {
            Pause::Data => "TQ_TEST_DATA_DELAY_MS",
            Pause::Rename => "TQ_TEST_RENAME_DELAY_MS",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The longest pause, in milliseconds (a typo must not hang a run).
const MAX_PAUSE_MS: usize = 10_000;

/// Each pause's milliseconds, read from the environment once.
fn pauses() -> &'static [Option<usize>; Pause::ALL.len()] {
    static PAUSES: OnceLock<[Option<usize>; Pause::ALL.len()]> = OnceLock::new();
    PAUSES.get_or_init(|| {
        Pause::ALL
            .map(|p| parse(std::env::var(p.env()).ok().as_deref()).map(|ms| ms.min(MAX_PAUSE_MS)))
    })
}

/// Sleep for `p`'s milliseconds; does nothing when its variable is not set.
pub fn pause(p: Pause) {
    if let Some(ms) = pauses()[p.index()] {
        std::thread::sleep(std::time::Duration::from_millis(ms as u64));
    }
}

/// The pass count at which each point fires, read from the environment once.
fn armed() -> &'static [Option<usize>; KillPoint::ALL.len()] {
    static ARMED: OnceLock<[Option<usize>; KillPoint::ALL.len()]> = OnceLock::new();
    ARMED.get_or_init(|| KillPoint::ALL.map(|p| parse(std::env::var(p.env()).ok().as_deref())))
}

/// How many times each point has been passed in this process.
static PASSES: [AtomicUsize; KillPoint::ALL.len()] =
    [const { AtomicUsize::new(0) }; KillPoint::ALL.len()];

/// A variable's value as a pass count: a positive integer, else never.
fn parse(v: Option<&str>) -> Option<usize> {
    v.and_then(|v| v.parse().ok()).filter(|&n| n > 0)
}

/// Count a pass of `p`; on the pass its variable names, stop the process as `kill -9` would
/// (exit status [`KILLED`], no cleanup). Does nothing when `p` is not armed.
pub fn kill_point(p: KillPoint) {
    let Some(at) = armed()[p.index()] else {
        return;
    };
    let passes = PASSES[p.index()].fetch_add(1, Ordering::SeqCst) + 1;
    if passes == at {
        eprintln!(
            "{}: stopped by {} (test hook); rerun with --resume",
            p.command(),
            p.env()
        );
        std::process::exit(KILLED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_that_arm_a_point() {
        assert_eq!(parse(Some("3")), Some(3));
        assert_eq!(parse(Some("1")), Some(1));
        for never in [None, Some(""), Some("0"), Some("-1"), Some("x"), Some(" 2")] {
            assert_eq!(parse(never), None, "{never:?}");
        }
    }

    #[test]
    fn every_point_has_its_own_variable() {
        let mut envs: Vec<&str> = KillPoint::ALL.iter().map(|p| p.env()).collect();
        envs.sort();
        envs.dedup();
        assert_eq!(envs.len(), KillPoint::ALL.len());
        for (i, p) in KillPoint::ALL.iter().enumerate() {
            assert_eq!(p.index(), i);
            assert!(p.env().starts_with("TQ_") && p.env().ends_with("_ABORT_AFTER"));
        }
        for (i, p) in Pause::ALL.iter().enumerate() {
            assert_eq!(p.index(), i);
            assert!(p.env().starts_with("TQ_TEST_") && p.env().ends_with("_DELAY_MS"));
            assert!(!envs.contains(&p.env()));
        }
    }
}
