//! `tq inspect` (in progress).
use crate::error::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// GGUF or safetensors file.
    pub file: PathBuf,
    /// Machine-readable JSON output.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: InspectArgs) -> Result<()> {
    Ok(())
}
