//! `tq inspect FILE [--json]`.
use std::path::PathBuf;
use tq::error::{Error, Result};
use tq::types::profile::Profile;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// GGUF or safetensors file, or a Hugging Face model directory (shown as the GGUF
    /// `tq convert DIR` would write before quantizing).
    pub file: PathBuf,
    /// Machine-readable JSON output.
    #[arg(long)]
    pub json: bool,
    /// Print metadata arrays in full instead of summarizing long ones.
    #[arg(long)]
    pub full: bool,
    /// Leave out the per-tensor table (metadata and totals only).
    #[arg(long)]
    pub no_tensors: bool,
    /// Target profile used to resolve type ids: fork (default), fork-pre-2026-04-15, upstream.
    #[arg(long)]
    pub target: Option<String>,
    /// JSON type map for other forks: {"name": "...", "types": {"tq4_1s": 46, ...}}.
    #[arg(long, conflicts_with = "target")]
    pub type_map: Option<PathBuf>,
}

pub fn run(a: InspectArgs) -> Result<()> {
    let profile = Profile::select(a.target.as_deref(), a.type_map.as_deref())?;
    let mut r = tq::inspect::inspect(&a.file, &profile, a.full)?;
    if a.no_tensors {
        r.tensors.clear();
    }
    if a.json {
        let s = serde_json::to_string_pretty(&r)
            .map_err(|e| Error::internal(format!("JSON encoding of the report failed: {e}")))?;
        println!("{s}");
    } else {
        print!("{}", tq::inspect::render_text(&r, !a.no_tensors));
    }
    Ok(())
}
