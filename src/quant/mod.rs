//! Quantization proper: rows of f32 → a type's bytes, by round-to-nearest through the registry or
//! by banded LDLQ with an input Hessian. Below `plan`, `calib` and `convert`, which all ask it.
//!
//! - [`encode_rows`]: the bytes `tq convert` writes for a block of rows (sequential calibration
//!   calls it too, to simulate the converted model).
//! - [`hessian`]: `H = Σ x xᵀ`, its accumulation and its file format.
//! - [`ldlq`]: banded LDLQ for TQ4_1S/TQ3_1S in the rotated domain.

pub(crate) mod hessian;
pub mod ldlq;
#[cfg(test)]
// the old path of tq2_t's block-LDLQ, still named by convert.rs's trellis_proxy test
pub(crate) use self::ldlq::trellis as ldlq2;
pub mod sensitivity;

pub use hessian::{
    expert_key, tensor_of, Diagonal, Hessian, HessianFile, HessianReader, HessianWriter, Hessians,
    Store, WriteMode,
};

use crate::error::{Error, Result};
use rayon::prelude::*;

/// Encode whole rows (`x` is `rows × row_len`) as `dst`: banded LDLQ when `ldlq` gives a factor
/// and band, else round-to-nearest row by row. These are the bytes `tq convert` writes for the
/// rows; sequential calibration calls it to simulate the converted model. Rows in parallel: the
/// bytes do not depend on the thread count.
pub fn encode_rows(
    dst: crate::types::TensorType,
    name: &str,
    x: &[f32],
    row_len: usize,
    ldlq: Option<(&crate::quant::ldlq::Factor, usize)>,
) -> Result<Vec<u8>> {
    if let Some((f, band)) = ldlq {
        return Ok(crate::quant::ldlq::quantize_ldlq(dst, x, row_len, f, band));
    }
    let row_bytes = dst.bytes_for(row_len as u64).ok_or_else(|| {
        Error::Unsupported(format!(
            "{name}: row length {row_len} does not fit type {dst}"
        ))
    })? as usize;
    if row_len == 0 || x.is_empty() {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; x.len() / row_len * row_bytes];
    buf.par_chunks_mut(row_bytes)
        .zip(x.par_chunks(row_len))
        .try_for_each(|(ob, row)| crate::types::quantize_rows(dst, row, ob, row_len, name))?;
    Ok(buf)
}

/// Encode one row of a stock type with a grid encoder (`TensorType::ldlq_unrotated`) by
/// importance-weighted round-to-nearest: `importance` has one weight per column (an imatrix
/// entry, or a Hessian diagonal). Diagonal-only: no error feedback.
pub fn encode_row_weighted(
    dst: crate::types::TensorType,
    row: &[f32],
    importance: &[f32],
    out: &mut [u8],
) {
    crate::types::grid::quantize_weighted(dst, row, importance, out);
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
