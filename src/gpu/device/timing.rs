//! The throughput run: dequantize and mat-vec launches on resident data, best of a number of
//! timed batches.

use super::args::{tq2r_args, Tq2rArgs};
use super::rotate::{rot_enqueue, rot_plan, RotatePath};
use super::{count_u32, f32_bytes, run, Args, Device, Tq2rParams, TurboParams};
use crate::error::{Error, Result};
use crate::gpu::kernels::{self, Op};
use crate::gpu::TurboSpec;
use crate::types::TensorType;

/// Best of `iters` timings of `work` (after one warm-up), per repetition of
/// [`Device::TIMING_REPS`].
fn best_time<D: Device>(
    d: &mut D,
    iters: usize,
    work: &mut dyn FnMut(&mut D) -> Result<()>,
) -> Result<f64> {
    d.timed(&mut |d| work(d))?;
    let mut best = f64::INFINITY;
    for _ in 0..iters.max(1) {
        let secs = d.timed(&mut |d| {
            for _ in 0..D::TIMING_REPS {
                work(d)?;
            }
            Ok(())
        })?;
        best = best.min(secs / D::TIMING_REPS as f64);
    }
    Ok(best)
}

/// The mat-vec's launches on resident data, timed: TQ prerotate + mat-vec, tq2_r rotation + GEMV.
pub(super) fn time_matvec<D: Device>(
    d: &mut D,
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    iters: usize,
) -> Result<f64> {
    let k = kernels::kernel(ty, Op::MatVec)?;
    let bs = ty.block_size();
    let need = cols / bs * rows * ty.block_bytes();
    if rows == 0 || cols == 0 || !cols.is_multiple_of(bs) || w.len() < need {
        return Err(Error::Unsupported(format!(
            "{ty}: mat-vec {rows}x{cols} does not match its buffers"
        )));
    }
    let wd = d.upload(&w[..need])?;
    let x: Vec<f32> = (0..cols).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect();
    let xd = d.upload(&f32_bytes(&x))?;
    let xr = d.alloc_f32(cols)?;
    let y = d.alloc_f32(rows)?;
    let (r, c) = (count_u32("rows", rows)?, count_u32("columns", cols)?);
    let plan = if ty.rotates_rows() {
        Some(rot_plan(d, 1, cols, false, RotatePath::Auto)?)
    } else {
        None
    };
    best_time(d, iters, &mut |d| {
        match &plan {
            Some(p) => rot_enqueue(d, p, &xd)?,
            None => {
                let mut a = Args::new(&xr, c / 32);
                a.vec_in = Some(&xd);
                run(d, kernels::prerotate(), &a)?;
            }
        }
        let mut a = Args::new(&y, r);
        a.blocks = Some(&wd);
        a.vec_in = Some(plan.as_ref().map_or(&xr, |p| &p.out));
        a.cols = Some(c);
        if plan.is_some() {
            a.tq2r = tq2r_args(None, None, Tq2rParams::default());
        }
        run(d, k, &a)
    })
}

/// Upload once, one warm-up launch (pipeline creation, first touch of the buffers), then the
/// best over `iters` measurements of [`Device::TIMING_REPS`] back-to-back launches, per launch.
pub(super) fn time_dequantize<D: Device>(
    d: &mut D,
    ty: TensorType,
    blocks: &[u8],
    iters: usize,
) -> Result<f64> {
    let k = kernels::kernel(ty, Op::Dequantize)?;
    let spec = TurboSpec::stock(ty).ok();
    let nblk = blocks.len() / ty.block_bytes();
    if nblk == 0 {
        return Err(Error::Unsupported(format!(
            "{}: nothing to time",
            Device::kind(d).name()
        )));
    }
    let src = d.upload(&blocks[..nblk * ty.block_bytes()])?;
    let cb = match &spec {
        Some(s) => Some(d.upload(&f32_bytes(&s.codebook))?),
        None => None,
    };
    let out = d.alloc_f32(nblk * ty.block_size())?;
    let args = Args {
        blocks: Some(&src),
        vec_in: None,
        out: &out,
        n: count_u32("blocks", nblk)?,
        cols: None,
        tokens: None,
        turbo: spec
            .as_ref()
            .zip(cb.as_ref())
            .map(|(s, cb)| (cb, TurboParams::of(s))),
        tq2r: ty.rotates_rows().then_some(Tq2rArgs {
            signs: None,
            mat: None,
            p: Tq2rParams::default(),
        }),
    };
    best_time(d, iters, &mut |d| run(d, k, &args))
}
