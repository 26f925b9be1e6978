//! LDLQ for the IQ2 grid types (IQ2_XXS, IQ2_XS, IQ2_S: [`LdlqKind::IqGrid`]) in the weights' own
//! basis and natural column order (the 8 values of a grid row are adjacent columns, so no
//! act-order), the steps of `iq`: every block's scales are fixed first by llama.cpp's
//! importance-weighted encoder with the damped Hessian diagonal as the importance, then GPTQ's
//! sweep runs column by column; at the first column of each 8-value group the row's current
//! targets (its weights plus the error fed forward so far) are rounded to the best grid row and
//! signs at the group's scale under the weights `1/U_jj²` (`iquants::iq2_groups::best_group`),
//! and every column's error then goes forward as usual. With `--ldlq-refit N` the scales are
//! then refitted under the Hessian and the sweep repeated (`iq_refit`).
//!
//! [`LdlqKind::IqGrid`]: crate::types::LdlqKind::IqGrid

use super::iq::{col_weights, sweep_groups};
use super::normal::RefitH;
use super::Factor;
use crate::types::iquants::iq2_groups;
use crate::types::TensorType;

/// Rows of an IQ2 type sharing one sweep (`rows`: whole rows of `f.n`), written into `out`: the
/// scales from the encoder under the damped Hessian diagonal, then [`sweep_pass`] (`iq`).
pub(super) fn quantize_rows(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    rh: Option<RefitH>,
    band: usize,
    out: &mut [u8],
) {
    let imp: Vec<f32> = f.diag.iter().map(|&v| v as f32).collect();
    super::iq::quantize_rows(ty, rows, f, rh, band, &imp, sweep_pass, out);
}

/// The sweep at the scales `out` holds: every group's grid row and signs written into `out`.
pub(super) fn sweep_pass(ty: TensorType, rows: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    let n = f.n;
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let nr = rows.len() / n;
    const G: usize = iq2_groups::GROUP;
    let ng = n / G;
    let mut scales = vec![0f32; nr * ng];
    for (b, s) in out.chunks_exact(bb).zip(scales.chunks_exact_mut(bs / G)) {
        iq2_groups::group_scales(ty, b, s);
    }
    let w = col_weights(f);
    let mut x: Vec<f64> = rows.iter().map(|&v| v as f64).collect();
    let mut codes = vec![(0u16, 0u8); nr * ng];
    sweep_groups::<G>(&mut x, n, f, band, |r, j, xr| {
        let g = j / G;
        let (idx, s, v) =
            iq2_groups::best_group(ty, scales[r * ng + g], &xr[j..j + G], &w[j..j + G]);
        codes[r * ng + g] = (idx, s);
        v
    });
    let gpb = bs / G;
    for (k, b) in out.chunks_exact_mut(bb).enumerate() {
        for g in 0..gpb {
            let (idx, s) = codes[k * gpb + g];
            iq2_groups::put_group(ty, b, g, idx, s);
        }
    }
}
