//! Type names as users write them (`--weights`, `--tensor-type`, `-ctk`): the one parser, so every
//! flag accepts the same spellings and reports an unknown name the same way.

use super::{TensorType, TYPES};
use crate::error::{Error, Result};

impl TensorType {
    /// The type named `s` (surrounding white space ignored); an unknown name is a usage error
    /// listing the types tq can write.
    pub fn parse(s: &str) -> Result<TensorType> {
        TensorType::from_name(s.trim()).ok_or_else(|| {
            let known: Vec<&str> = TYPES
                .iter()
                .filter(|t| t.quantize.is_some())
                .map(|t| t.name)
                .collect();
            Error::Usage(format!(
                "unknown tensor type '{s}'; types tq can write: {}",
                known.join(", ")
            ))
        })
    }
}
