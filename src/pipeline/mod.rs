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
mod progress;
pub mod report;
mod run;

pub use job::{CalibInput, ConvertFlags, Job};
pub use run::{convert, Done, Outcome};

#[cfg(test)]
mod tests;
