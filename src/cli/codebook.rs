//! `tq codebook`: Lloyd-Max codebooks per head dim / bit width, emitted as constants for an engine,
//! and `--evaluate` to score any table against the optimum. Guide: `docs/codebook.md`.
use std::path::PathBuf;
use tq::codebook::job::{self, CodebookFlags};
use tq::error::Result;

#[derive(clap::Args)]
pub struct CodebookArgs {
    /// Head dim(s) d: the dimension of the rotation (comma-separated for a batch, e.g. 64,128,256).
    /// Needed for --dist beta and gaussian.
    #[arg(long, value_delimiter = ',')]
    pub head_dim: Vec<usize>,
    /// Bit width(s), 1..=8 (comma-separated for a batch, e.g. 2,3,4). Default 4.
    #[arg(long, value_delimiter = ',')]
    pub bits: Vec<u32>,
    /// Distribution: beta (exact coordinate of a rotated unit vector, the default), gaussian
    /// (its N(0, 1/d) limit), normal01 (N(0,1), weight-block convention), empirical FILE (or
    /// empirical with --samples FILE).
    #[arg(long, num_args = 1..=2, value_names = ["DIST", "FILE"])]
    pub dist: Vec<String>,
    /// Sample file for --dist empirical: raw little-endian f32 values, or a 1-D .npy (<f4 / <f8).
    #[arg(long)]
    pub samples: Option<PathBuf>,
    /// Output format: text (default), json, c, cuda, metal, wgsl, rust.
    #[arg(long, default_value = "text")]
    pub format: String,
    /// Write to this file instead of standard output.
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Prefix of the emitted constant names.
    #[arg(long, default_value = "TQ_CB")]
    pub name: String,
    /// Evaluate a table instead of computing one: a file (JSON from this command, or numbers
    /// separated by commas/whitespace) or an inline list "v1,v2,..."; a leading "±" (or "pm:")
    /// means the list is the positive half of a symmetric table.
    #[arg(long, allow_hyphen_values = true)]
    pub evaluate: Option<String>,
    /// Units of the --evaluate table: value (default) or sigma (multiples of σ = 1/√d).
    #[arg(long, default_value = "value")]
    pub units: String,
}

pub fn run(a: CodebookArgs) -> Result<()> {
    let flags = CodebookFlags {
        head_dim: a.head_dim,
        bits: a.bits,
        dist: a.dist,
        samples: a.samples,
        format: a.format,
        out: a.out,
        name: a.name,
        evaluate: a.evaluate,
        units: a.units,
    };
    if let Some(text) = job::run(flags)? {
        print!("{text}");
    }
    Ok(())
}
