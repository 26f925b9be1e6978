//! Quantization proper: rows of f32 → a type's bytes, by round-to-nearest through the registry or
//! by banded LDLQ with an input Hessian. Below `plan`, `calib` and `convert`, which all ask it.
//!
//! - [`Encoder`] and [`encode_rows`]: the one encoder path: the bytes `tq convert` writes for a
//!   block of rows (the mix's sensitivity and sequential calibration call it too, so what they
//!   measure or simulate is what the file holds).
//! - [`hessian`]: `H = Σ x xᵀ`, its accumulation and its file format.
//! - [`ldlq`]: banded LDLQ, a folder by job: factor, sweep, TQ4_1S/TQ3_1S in the rotated domain,
//!   stock types in act-order with refit, tq2_r's whole rows, tq2_t's trellis search.

mod encode;
pub(crate) mod hessian;
pub mod ldlq;
pub mod sensitivity;

pub use encode::{decode_rows, encode_rows, Encoder, LdlqSettings};
pub use hessian::{
    expert_key, tensor_of, Diagonal, Hessian, HessianFile, HessianReader, HessianWriter, Hessians,
    Store, WriteMode,
};

use crate::error::{Error, Result};

/// [`expert_key`] of each of `tensors` for expert `e` (an observer's per-expert inputs).
pub fn expert_keys(tensors: &[&str], e: usize) -> Vec<String> {
    tensors.iter().map(|t| expert_key(t, e)).collect()
}

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
