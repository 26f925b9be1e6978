//! tq2_r's whole-row rotation on the device: one workgroup per row up to [`ROTATE_MAX`] values,
//! a multi-pass path above (sub-block butterflies, global butterfly stages, the dense factor).

use super::args::tq2r_args;
use super::{
    count_u32, f32_bytes, run, Args, Device, Tq2rParams, TQ2R_INVERSE, TQ2R_MIX_THEN_SCALE,
};
use crate::error::{Error, Result};
use crate::gpu::kernels::{self, Kernel, Op, ROTATE_MAX};
use crate::types::{tq2r, TensorType};

/// Which launch sequence rotates rows (`Backend::rotate_rows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotatePath {
    /// One workgroup per row up to [`ROTATE_MAX`] values, the multi-pass path above.
    Auto,
    /// One workgroup per row (an error above [`ROTATE_MAX`]).
    SingleWorkgroup,
    /// Sub-block butterflies, global butterfly stages, then the dense factor: any row length.
    MultiPass,
}

fn tq2r_kernel(op: Op) -> Result<&'static Kernel> {
    kernels::kernel(TensorType::TQ2R, op)
}

pub(super) fn rotate_rows<D: Device>(
    d: &mut D,
    cols: usize,
    x: &[f32],
    inverse: bool,
    path: RotatePath,
) -> Result<Vec<f32>> {
    if cols == 0 || !x.len().is_multiple_of(cols) {
        return Err(Error::Unsupported(format!(
            "rotation: {} values are not whole rows of {cols}",
            x.len()
        )));
    }
    if x.is_empty() {
        return Ok(vec![]);
    }
    let xd = d.upload(&f32_bytes(x))?;
    let y = rotate_launches(d, &xd, x.len() / cols, cols, inverse, path)?;
    d.download(&y, x.len())
}

/// tq2_r's rotation of `rows` rows of `cols` values, prepared on the device: the signs, the
/// dense factor (transposed for the inverse), the scalars, the scratch and output buffers.
pub(super) struct RotPlan<B> {
    signs: B,
    mat: B,
    p: Tq2rParams,
    rows: u32,
    cols: u32,
    /// Values in all rows.
    n: usize,
    /// FWHT segment length.
    w: usize,
    single: bool,
    scratch: Option<B>,
    /// The rotated rows.
    pub(super) out: B,
}

pub(super) fn rot_plan<D: Device>(
    d: &mut D,
    rows: usize,
    cols: usize,
    inverse: bool,
    path: RotatePath,
) -> Result<RotPlan<D::Buf>> {
    let rot = tq2r::rotation(cols)?;
    let f = rot.factors().ok_or_else(|| {
        Error::Unsupported(format!(
            "tq2_r: the rotation of {cols} ({}) has no GPU kernel",
            rot.describe()
        ))
    })?;
    let single = match path {
        RotatePath::Auto => cols <= ROTATE_MAX,
        RotatePath::MultiPass => false,
        RotatePath::SingleWorkgroup if cols <= ROTATE_MAX => true,
        RotatePath::SingleWorkgroup => {
            return Err(Error::Unsupported(format!(
                "tq2_r: rows of {cols} are longer than the single-workgroup rotation's {ROTATE_MAX}"
            )))
        }
    };
    let n = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::Unsupported(format!("rotation: {rows} x {cols} overflows")))?;
    let signs = d.upload(&f32_bytes(f.signs))?;
    let mat: Vec<f32> = if inverse {
        (0..f.h * f.h)
            .map(|i| f.mat[(i % f.h) * f.h + i / f.h])
            .collect()
    } else {
        f.mat.to_vec()
    };
    let mat = d.upload(&f32_bytes(&mat))?;
    let mut flags = 0;
    if inverse {
        flags |= TQ2R_INVERSE;
    }
    if f.mix_then_scale {
        flags |= TQ2R_MIX_THEN_SCALE;
    }
    let p = Tq2rParams {
        flags,
        h: count_u32("factor order", f.h)?,
        scale: f.scale.to_bits(),
        step: 0,
    };
    count_u32("values", n)?;
    let scratch = if single { None } else { Some(d.alloc_f32(n)?) };
    Ok(RotPlan {
        signs,
        mat,
        p,
        rows: count_u32("rows", rows)?,
        cols: count_u32("columns", cols)?,
        n,
        w: f.w,
        single,
        scratch,
        out: d.alloc_f32(n)?,
    })
}

/// Queue the launches of a prepared rotation on `input`; the result is in `plan.out`. Rows up to
/// [`ROTATE_MAX`] values: one workgroup per row (the row in workgroup memory). Longer rows: the
/// signs and the butterflies inside sub-blocks of up to [`ROTATE_MAX`] values, one launch per
/// remaining butterfly stage, then the dense factor and the scale. Both paths do the same
/// operations in the same order (bit-identical results).
pub(super) fn rot_enqueue<D: Device>(
    d: &mut D,
    plan: &RotPlan<D::Buf>,
    input: &D::Buf,
) -> Result<()> {
    let p = plan.p;
    let scratch = match &plan.scratch {
        None => {
            let mut a = Args::new(&plan.out, plan.rows);
            a.vec_in = Some(input);
            a.cols = Some(plan.cols);
            a.tq2r = tq2r_args(Some(&plan.signs), Some(&plan.mat), p);
            return run(d, tq2r_kernel(Op::Rotate)?, &a);
        }
        Some(s) => s,
    };
    debug_assert!(!plan.single);
    // 1. Signs (forward) and the butterfly stages below `l`, per sub-block of `l` values.
    let l = plan.w.min(ROTATE_MAX);
    let mut a = Args::new(scratch, (plan.n / l) as u32);
    a.vec_in = Some(input);
    a.cols = Some(plan.cols);
    a.tq2r = tq2r_args(
        Some(&plan.signs),
        None,
        Tq2rParams {
            step: l as u32,
            ..p
        },
    );
    run(d, tq2r_kernel(Op::RotateLocal)?, &a)?;
    // 2. The remaining stages of each segment's butterfly, in place.
    let mut step = l;
    while step < plan.w {
        let mut a = Args::new(scratch, (plan.n / 2) as u32);
        a.cols = Some(plan.cols);
        a.tq2r = tq2r_args(
            None,
            None,
            Tq2rParams {
                step: step as u32,
                ..p
            },
        );
        run(d, tq2r_kernel(Op::RotateStage)?, &a)?;
        step *= 2;
    }
    // 3. The dense factor and the scale (inverse: then the signs).
    let mut a = Args::new(&plan.out, plan.n as u32);
    a.vec_in = Some(scratch);
    a.cols = Some(plan.cols);
    a.tq2r = tq2r_args(Some(&plan.signs), Some(&plan.mat), p);
    run(d, tq2r_kernel(Op::RotateMix)?, &a)
}

/// Prepare and queue a rotation of `input`; returns the output buffer.
pub(super) fn rotate_launches<D: Device>(
    d: &mut D,
    input: &D::Buf,
    rows: usize,
    cols: usize,
    inverse: bool,
    path: RotatePath,
) -> Result<D::Buf> {
    let plan = rot_plan(d, rows, cols, inverse, path)?;
    rot_enqueue(d, &plan, input)?;
    Ok(plan.out)
}
