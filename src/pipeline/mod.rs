//! The pipeline room: one conversion job, resolved once from the flags ([`Job::resolve`]), run by
//! one entry point ([`convert`]) through source → plan → (the mix) → calibrate → quantize → write
//! → (verify). The `tq` binary parses flags into [`ConvertFlags`], calls [`convert`] and prints
//! the [`Outcome`] with [`report`]; nothing else of the pipeline lives outside the library.
//!
//! - [`job`]: the flags as plain values, the checks that need no model, the calibration input
//!   detected once ([`CalibInput`]), LDLQ's settings as one value, canonical flags and the
//!   checkpoint key.
//! - [`mix`]: `--target-bpw` / `--target-size`: sensitivity, the KLD fit, the knapsack.
//! - [`report`]: the plan table, JSON and summaries the CLI prints.

pub mod job;
pub mod mix;
pub mod report;
mod run;

pub use job::{CalibInput, ConvertFlags, Job};
pub use run::convert;

use crate::io::progress;

use crate::convert::Stats;
use crate::plan::Plan;
use mix::MixReport;

/// What a conversion did.
pub struct Outcome {
    pub plan: Plan,
    /// The output file's size (the plan's, metadata included).
    pub size: u64,
    pub mix: Option<MixReport>,
    pub done: Done,
}

pub enum Done {
    /// `--dry-run`: nothing written.
    DryRun,
    /// `--shard I/N`: a fragment (its summary line).
    Shard(String),
    /// A GGUF written.
    Written {
        stats: Stats,
        secs: f64,
        /// `--verify`: the written file's mean KLD against the input, and the seconds it took.
        verified: Option<(f64, f64)>,
    },
}

#[cfg(test)]
mod tests;
