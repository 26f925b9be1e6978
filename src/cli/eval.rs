//! `tq eval` (in progress).
use crate::error::{Error, Result};

#[derive(clap::Args)]
pub struct EvalArgs {}

pub fn run(_a: EvalArgs) -> Result<()> {
    Err(Error::Usage("tq eval: not implemented yet".into()))
}
