//! What the three i-quant LDLQ paths share (`iq_grid` for IQ2_XXS / IQ2_XS / IQ2_S, `iq_lattice`
//! for IQ3_XXS / IQ3_S, `iq1_lattice` for IQ1_S / IQ1_M), in the weights' own basis and natural
//! column order:
//! 1. the scales: every row is encoded first by llama.cpp's importance-weighted encoder
//!    (`iquants::weighted_encoder`, what `--imatrix` writes) with an importance from the damped
//!    Hessian diagonal; the blocks keep these scales through the sweep;
//! 2. the kind's sweep pass at those scales: GPTQ's sweep with a vector quantizer as its rounding
//!    step ([`sweep_groups`]), each group rounded under the weights `1/U_jj²` ([`col_weights`]),
//!    its grid indices and signs written into the blocks;
//! 3. with `--ldlq-refit N` (the factor keeps the Hessian; not IQ1): the scales refitted under the
//!    Hessian and the pass repeated (`iq_refit`).

use super::normal::RefitH;
use super::sweep::sweep;
use super::Factor;
use crate::types::iquants::weighted_encoder;
use crate::types::TensorType;

/// A kind's sweep pass (step 2): the grid indices and signs of `rows` at the scales `out` holds,
/// written into `out`.
pub(super) type SweepPass = fn(TensorType, &[f32], &Factor, usize, &mut [u8]);

/// Steps 1–3 of the module comment for rows of an i-quant `ty` sharing one factor (`imp`: the
/// importance step 1 gives the encoder, one per column), into `out`; `rh`: the refit's Hessian
/// (`Factor::refit_hessian`).
#[allow(clippy::too_many_arguments)]
pub(super) fn quantize_rows(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    rh: Option<RefitH>,
    band: usize,
    imp: &[f32],
    pass: SweepPass,
    out: &mut [u8],
) {
    assert!(f.perm.is_none(), "i-quant LDLQ sweeps in natural order");
    let n = f.n;
    let row_bytes = ty.bytes_for(n as u64).unwrap() as usize;
    let enc = weighted_encoder(ty).expect("an i-quant with a weighted encoder");
    for (row, o) in rows.chunks_exact(n).zip(out.chunks_exact_mut(row_bytes)) {
        enc(row, imp, o);
    }
    pass(ty, rows, f, band, out);
    super::iq_refit::refit(ty, rows, f, rh, band, out, pass);
}

/// The damped Hessian diagonal over its mean (all 1 where the mean is not positive): the
/// importance the IQ1 and IQ3 paths give the encoder (IQ2's takes the diagonal as it is).
pub(super) fn diag_over_mean(f: &Factor) -> Vec<f32> {
    let mean = f.diag.iter().sum::<f64>() / f.n as f64;
    f.diag
        .iter()
        .map(|&d| if mean > 0.0 { (d / mean) as f32 } else { 1.0 })
        .collect()
}

/// [`sweep`] with a vector quantizer as its rounding step: at the first column `j` of every `G`,
/// `pick(r, j, x_r)` rounds the group `x_r[j..j + G]` (its error-fed values so far) and returns
/// the group's `G` decoded values; every column of the group then takes its value, and its error
/// goes forward as usual.
pub(super) fn sweep_groups<const G: usize>(
    x: &mut [f64],
    n: usize,
    f: &Factor,
    band: usize,
    mut pick: impl FnMut(usize, usize, &[f64]) -> [f32; G],
) -> Vec<f64> {
    debug_assert_eq!(n % G, 0);
    let mut vals = vec![[0f32; G]; x.len() / n];
    sweep(x, n, f, band, |r, j, xr| {
        if j % G == 0 {
            vals[r] = pick(r, j, xr);
        }
        vals[r][j % G] as f64
    })
}

/// The weight `1 / U_jj²` of each column's squared rounding error in the sweep (the vector
/// quantizers' per-value weights).
pub(super) fn col_weights(f: &Factor) -> Vec<f64> {
    let (n, u) = (f.n, f.u_ref());
    (0..n)
        .map(|j| 1.0 / (u.get(j * n + j) * u.get(j * n + j)))
        .collect()
}
