//! Progress on stderr for the pipeline's long phases: a bar on a terminal, hidden under `--quiet`.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar counting `len` steps of `what` (sensitivity, KLD fit, …) with an ETA.
pub(crate) fn steps(quiet: bool, len: u64, what: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(&format!("{what} {{bar:40}} {{pos}}/{{len}} eta {{eta}}"))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// A bar counting the output's `total` bytes, with the rate and an ETA.
pub(crate) fn bytes(quiet: bool, total: u64) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}
