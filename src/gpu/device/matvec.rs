//! TQ weight mat-vec (prerotate the activation, then the mat-vec kernel) and mat-mul (weights
//! resident on the device, activations in chunks); the whole-row types' mat-vec goes to
//! [`super::twobit`].

use super::twobit::twobit_matvec;
use super::{count_u32, f32_bytes, run, Args, Device, TwoBit, TwoBitLayout};
use crate::error::{Error, Result};
use crate::gpu::kernels::{self, Kernel, Op, MATMUL_TOKENS};
use crate::types::TensorType;

pub(super) fn matvec<D: Device>(
    d: &mut D,
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
) -> Result<Vec<f32>> {
    let k = kernels::kernel(ty, Op::MatVec)?;
    if ty.rotates_rows() {
        let rb = cols / ty.block_size() * ty.block_bytes();
        let need = rows
            .checked_mul(rb)
            .filter(|&n| n <= w.len() && cols.is_multiple_of(ty.block_size()));
        let Some(need) = need else {
            return Err(Error::Unsupported(format!(
                "{ty}: mat-vec {rows}x{cols} does not match its buffers"
            )));
        };
        let m = TwoBit {
            layout: TwoBitLayout::of(ty),
            data: &w[..need],
            rows,
            cols,
            rotated: true,
        };
        return twobit_matvec(d, &m, x, false);
    }
    if !cols.is_multiple_of(32) || x.len() < cols || w.len() < rows * cols / 32 * ty.block_bytes() {
        return Err(Error::Unsupported(format!(
            "{ty}: mat-vec {rows}x{cols} does not match its buffers"
        )));
    }
    if rows == 0 || cols == 0 {
        return Ok(vec![0.0; rows]);
    }
    let wd = d.upload(w)?;
    let xd = d.upload(&f32_bytes(x))?;
    let xr = d.alloc_f32(cols)?;
    let y = d.alloc_f32(rows)?;
    let (r, c) = (count_u32("rows", rows)?, count_u32("columns", cols)?);
    // 1. x̂ = each 32-block of x rotated forward, once for all rows.
    let rot = Args {
        blocks: None,
        vec_in: Some(&xd),
        out: &xr,
        n: c / 32,
        cols: None,
        tokens: None,
        turbo: None,
        tq2r: None,
    };
    run(d, kernels::prerotate(), &rot)?;
    // 2. y[r] = Σ C[idx]·d_half · x̂ over each row (the weight is never un-rotated).
    let mv = Args {
        blocks: Some(&wd),
        vec_in: Some(&xr),
        out: &y,
        n: r,
        cols: Some(c),
        tokens: None,
        turbo: None,
        tq2r: None,
    };
    run(d, k, &mv)?;
    d.download(&y, rows)
}

/// The mat-mul kernel of `ty`, after checking that `bytes` hold a `rows × cols` weight.
pub(crate) fn matmul_weight_check(
    ty: TensorType,
    bytes: usize,
    rows: usize,
    cols: usize,
) -> Result<&'static Kernel> {
    let k = kernels::kernel(ty, Op::MatMul)?;
    if !cols.is_multiple_of(32) || bytes < rows * (cols / 32) * ty.block_bytes() {
        return Err(Error::Unsupported(format!(
            "{ty}: mat-mul weight {rows}x{cols} does not match its {bytes} bytes"
        )));
    }
    Ok(k)
}

/// Activation (and output) bytes per mat-mul launch at most: the device scratch of one call is
/// about three times this (X, X̂, Y), whatever the number of tokens.
pub(super) const MATMUL_CHUNK_BYTES: usize = 32 << 20;

/// Tokens per mat-mul launch: a multiple of [`MATMUL_TOKENS`] with X̂ and Y within
/// [`MATMUL_CHUNK_BYTES`].
fn matmul_chunk(rows: usize, cols: usize) -> usize {
    let per = MATMUL_CHUNK_BYTES / (4 * rows.max(cols).max(1));
    (per / MATMUL_TOKENS).max(1) * MATMUL_TOKENS
}

/// `Y = X·Wᵀ` with the weight `wd` (`rows × cols`, checked by [`matmul_weight_check`]) already on
/// the device: per chunk of tokens, upload X padded with zero rows to a multiple of
/// [`MATMUL_TOKENS`], rotate every 32-block of it once (prerotate), one mat-mul launch, download
/// Y (`tokens × rows`).
pub(crate) fn matmul_resident<D: Device>(
    d: &mut D,
    k: &'static Kernel,
    wd: &D::Buf,
    rows: usize,
    cols: usize,
    x: &[f32],
    tokens: usize,
) -> Result<Vec<f32>> {
    if x.len() < tokens * cols {
        return Err(Error::Unsupported(format!(
            "mat-mul of {tokens} rows of {cols}: activation too short"
        )));
    }
    let mut y = Vec::with_capacity(tokens * rows);
    if rows == 0 || cols == 0 {
        y.resize(tokens * rows, 0.0);
        return Ok(y);
    }
    let (r, c) = (count_u32("rows", rows)?, count_u32("columns", cols)?);
    let chunk = matmul_chunk(rows, cols);
    let mut t0 = 0;
    while t0 < tokens {
        let n = chunk.min(tokens - t0);
        let padded = n.next_multiple_of(MATMUL_TOKENS);
        let mut xb = f32_bytes(&x[t0 * cols..(t0 + n) * cols]);
        xb.resize(padded * cols * 4, 0);
        let xd = d.upload(&xb)?;
        let xr = d.alloc_f32(padded * cols)?;
        let yd = d.alloc_f32(n * rows)?;
        // 1. X̂: every 32-block of every activation row rotated forward, once for all rows of W.
        let rot = Args {
            blocks: None,
            vec_in: Some(&xd),
            out: &xr,
            n: count_u32("blocks", padded * cols / 32)?,
            cols: None,
            tokens: None,
            turbo: None,
            tq2r: None,
        };
        run(d, kernels::prerotate(), &rot)?;
        // 2. Y[t][r] = Σ C[idx]·d_half · X̂[t] over each row (the weight is never un-rotated).
        let mm = Args {
            blocks: Some(wd),
            vec_in: Some(&xr),
            out: &yd,
            n: r,
            cols: Some(c),
            tokens: Some(count_u32("tokens", n)?),
            turbo: None,
            tq2r: None,
        };
        run(d, k, &mm)?;
        y.extend(d.download(&yd, n * rows)?);
        t0 += n;
    }
    Ok(y)
}
