//! The bundled GPU kernels on the artifact's own tensors: for every tensor of a type with kernels
//! (TQ4_1S, TQ3_1S, tq2_r, tq2_t), a deterministic sample of rows (every row with `full`) is decoded and
//! multiplied by each requested backend and held to the CPU reference with `tq kernels check`'s
//! tolerances: dequantize bit-exact (tq2_r, tq2_t: decode + the device's inverse row rotation,
//! bit-exact for Hadamard rotations), mat-vec within `DOT_REL_BOUND · Σ|w·x|` per output. A backend that is
//! not built in or has no device is skipped with the reason.

use super::{Check, Status};
use crate::error::{one_line, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::gpu::{
    compare_dots, compare_exact, is_hadamard, open_backend, random_activation, reference_dots,
    row_decode, Backend, BackendKind, KernelKind, OpenError, Rng, TwoBit, TwoBitLayout,
    DOT_REL_BOUND, KERNEL_TYPES,
};

/// Rows sampled per tensor (evenly spaced, first and last included).
pub const SAMPLE_ROWS: u64 = 8;

/// The rows checked of a tensor of `n` rows.
fn sample(n: u64, full: bool) -> Vec<u64> {
    if full || n <= SAMPLE_ROWS {
        return (0..n).collect();
    }
    (0..SAMPLE_ROWS)
        .map(|k| k * (n - 1) / (SAMPLE_ROWS - 1))
        .collect()
}

/// One tensor on one backend: (blocks checked, largest mat-vec error over Σ|w·x|) or the failure.
/// tq2_r tensors whose rotation has a DCT factor are decoded within a bound, not bit-exact
/// (`tq kernels check`'s tolerance for them).
fn tensor(
    b: &mut dyn Backend,
    file: &GgufFile,
    t: &TensorInfo,
    i: usize,
    full: bool,
) -> Result<std::result::Result<(usize, f64), String>> {
    let cols = t.row_len() as usize;
    let row_bytes = t.ty.bytes_for(t.row_len()).unwrap_or(0) as usize;
    let data = file.tensor_data(t);
    let rows = sample(t.n_rows(), full);
    let mut w = Vec::with_capacity(rows.len() * row_bytes);
    for &r in &rows {
        w.extend_from_slice(&data[r as usize * row_bytes..(r as usize + 1) * row_bytes]);
    }
    let d = if t.ty.rotates_rows() {
        let m = TwoBit {
            layout: TwoBitLayout::of(t.ty),
            data: &w,
            rows: rows.len(),
            cols,
            rotated: true,
        };
        row_decode(b, &m, &t.name)?
    } else {
        let mut want = vec![0f32; rows.len() * cols];
        crate::types::dequantize(t.ty, &w, &mut want, &t.name)?;
        let got = b.dequantize(t.ty, &w)?;
        compare_exact(t.ty, &t.name, &got, &want)
    };
    if !d.pass {
        return Ok(Err(format!(
            "{} dequantize on {}: {}",
            t.ty,
            one_line(&t.name),
            d.first_failure.unwrap_or_default()
        )));
    }
    let x = random_activation(cols, &mut Rng::new(0x7165_7661 ^ i as u64));
    let (dots, sums) = reference_dots(t.ty, &w, rows.len(), cols, &x)?;
    let y = b.matvec(t.ty, &w, rows.len(), cols, &x)?;
    let m = compare_dots(
        t.ty,
        KernelKind::MatVec,
        &t.name,
        &y,
        &dots,
        &sums,
        DOT_REL_BOUND,
    );
    if !m.pass {
        return Ok(Err(format!(
            "{} mat-vec on {}: {}",
            t.ty,
            one_line(&t.name),
            m.first_failure.unwrap_or_default()
        )));
    }
    Ok(Ok((w.len() / t.ty.block_bytes(), m.max_err_over_abs_sum)))
}

pub(super) fn checks(file: &GgufFile, backends: &[BackendKind], full: bool) -> Result<Vec<Check>> {
    let tensors: Vec<(usize, &TensorInfo)> = file
        .tensors
        .iter()
        .enumerate()
        .filter(|(_, t)| {
            (t.ty.is_tq_weight() || t.ty.rotates_rows()) && KERNEL_TYPES.contains(&t.ty)
        })
        .collect();
    let mut out = vec![];
    for &kind in backends {
        let name = kind.name();
        if tensors.is_empty() {
            out.push(Check::new(
                "kernels",
                name,
                Status::Skipped,
                "no tensor of a type with bundled GPU kernels (tq4_1s, tq3_1s, tq2_r, tq2_t)",
            ));
            continue;
        }
        let mut b = match open_backend(kind) {
            Ok(b) => b,
            Err(OpenError::Absent(why)) => {
                out.push(Check::new("kernels", name, Status::Skipped, one_line(&why)));
                continue;
            }
            Err(OpenError::Failed(e)) => {
                out.push(Check::new(
                    "kernels",
                    name,
                    Status::Fail,
                    one_line(&e.to_string()),
                ));
                continue;
            }
        };
        let (mut blocks, mut worst) = (0usize, 0f64);
        let mut bounded = 0;
        for &(_, t) in &tensors {
            if t.ty.rotates_rows() && !is_hadamard(t.row_len() as usize)? {
                bounded += 1;
            }
        }
        let mut failure = None;
        for &(i, t) in &tensors {
            match tensor(b.as_mut(), file, t, i, full)? {
                Ok((n, e)) => {
                    blocks += n;
                    worst = worst.max(e);
                }
                Err(f) => {
                    failure = Some(f);
                    break;
                }
            }
        }
        out.push(match failure {
            Some(f) => Check::new("kernels", name, Status::Fail, f),
            None => Check::new(
                "kernels",
                name,
                Status::Pass,
                format!(
                    "{} on {}: {} tensors, {blocks} blocks ({}): dequantize bit-exact{}, mat-vec max |err|/sum|w*x| {worst:.2e} <= {DOT_REL_BOUND:.2e}",
                    name,
                    one_line(&b.device_name()),
                    tensors.len(),
                    if full { "every row" } else { "8 rows per tensor" },
                    if bounded > 0 {
                        format!(" ({bounded} tq2_r/tq2_t tensors with a DCT rotation: within the bound)")
                    } else {
                        String::new()
                    }
                ),
            ),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_rows_are_spread_and_distinct() {
        assert_eq!(sample(3, false), vec![0, 1, 2]);
        let s = sample(576, false);
        assert_eq!(s.len(), 8);
        assert_eq!((s[0], s[7]), (0, 575));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(sample(20, true).len(), 20);
    }
}
