//! Quantization proper: rows of f32 → a type's bytes, by round-to-nearest through the registry or
//! by banded LDLQ with an input Hessian. Below `plan`, `calib` and `convert`, which all ask it.
//!
//! - [`Encoder`] and [`encode_rows`]: the one encoder path: the bytes `tq convert` writes for a
//!   block of rows (the mix's sensitivity and sequential calibration call it too, so what they
//!   measure or simulate is what the file holds).
//! - [`hessian`]: `H = Σ x xᵀ`, its accumulation and its file format.
//! - [`ldlq`]: banded LDLQ for TQ4_1S/TQ3_1S in the rotated domain.

mod encode;
pub(crate) mod hessian;
pub mod ldlq;
pub(crate) mod ldlq2;
pub mod sensitivity;

pub use encode::{decode_rows, encode_rows, Encoder, LdlqSettings};
pub use hessian::{
    expert_key, tensor_of, Diagonal, Hessian, HessianFile, HessianReader, HessianWriter, Hessians,
    Store, WriteMode,
};

use crate::error::{Error, Result};

/// A non-finite weight is an error naming the tensor, row and column.
pub fn check_finite(name: &str, row_index: u64, row: &[f32]) -> Result<()> {
    match row.iter().position(|v| !v.is_finite()) {
        Some(c) => Err(Error::Unsupported(format!(
            "{name}: non-finite weight {} at row {row_index}, column {c}; fix the source model (NaN/Inf cannot be quantized)",
            row[c]
        ))),
        None => Ok(()),
    }
}
