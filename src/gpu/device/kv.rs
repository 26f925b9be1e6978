//! Turbo KV-cache blocks of any layout and codebook: dequantize (rotated domain) and the Q·K
//! dot with a pre-rotated query.

use super::{count_u32, f32_bytes, run, Args, Device, TurboParams};
use crate::error::{Error, Result};
use crate::gpu::kernels::{self, Op};
use crate::gpu::TurboSpec;

pub(super) fn turbo_dequantize<D: Device>(
    d: &mut D,
    spec: &TurboSpec,
    blocks: &[u8],
) -> Result<Vec<f32>> {
    spec.validate(blocks.len(), None)?;
    let k = kernels::kernel(spec.ty, Op::Dequantize)?;
    let nblk = blocks.len() / spec.layout.block_bytes();
    let n = nblk * spec.layout.group;
    if n == 0 {
        return Ok(vec![]);
    }
    let src = d.upload(blocks)?;
    let cb = d.upload(&f32_bytes(&spec.codebook))?;
    let out = d.alloc_f32(n)?;
    let args = Args {
        blocks: Some(&src),
        vec_in: None,
        out: &out,
        n: count_u32("blocks", nblk)?,
        cols: None,
        tokens: None,
        turbo: Some((&cb, TurboParams::of(spec))),
        tq2r: None,
    };
    run(d, k, &args)?;
    d.download(&out, n)
}

pub(super) fn turbo_qk<D: Device>(
    d: &mut D,
    spec: &TurboSpec,
    k: &[u8],
    rows: usize,
    cols: usize,
    q_rot: &[f32],
) -> Result<Vec<f32>> {
    let kern = kernels::kernel(spec.ty, Op::TurboQk)?;
    spec.validate(k.len(), Some((rows, cols)))?;
    if q_rot.len() < cols {
        return Err(Error::Unsupported(format!(
            "{}: query shorter than a key row",
            spec.ty
        )));
    }
    if rows == 0 || cols == 0 {
        return Ok(vec![0.0; rows]);
    }
    let kd = d.upload(k)?;
    let qd = d.upload(&f32_bytes(q_rot))?;
    let cb = d.upload(&f32_bytes(&spec.codebook))?;
    let out = d.alloc_f32(rows)?;
    let args = Args {
        blocks: Some(&kd),
        vec_in: Some(&qd),
        out: &out,
        n: count_u32("rows", rows)?,
        cols: Some(count_u32("columns", cols)?),
        tokens: None,
        turbo: Some((&cb, TurboParams::of(spec))),
        tq2r: None,
    };
    run(d, kern, &args)?;
    d.download(&out, rows)
}
