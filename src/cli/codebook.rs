//! `tq codebook` (in progress).
use crate::error::{Error, Result};

#[derive(clap::Args)]
pub struct CodebookArgs {}

pub fn run(_a: CodebookArgs) -> Result<()> {
    Err(Error::Usage("tq codebook: not implemented yet".into()))
}
