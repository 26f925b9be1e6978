//! Block dequantize: the table's kernel of a type (turbo types through [`super::kv`], the
//! whole-row types' blocks through [`super::twobit`]).

use super::kv::turbo_dequantize;
use super::twobit::twobit_decode;
use super::{count_u32, run, Args, Device, TwoBit, TwoBitLayout};
use crate::error::{Error, Result};
use crate::gpu::kernels::{self, Op};
use crate::gpu::TurboSpec;
use crate::types::TensorType;

/// The rule every dequantize input follows: whole blocks only.
fn whole_blocks(ty: TensorType, bytes: usize, block_bytes: usize) -> Result<usize> {
    if !bytes.is_multiple_of(block_bytes) {
        return Err(Error::Unsupported(format!(
            "{ty}: {bytes} bytes is not a whole number of {block_bytes}-byte blocks"
        )));
    }
    Ok(bytes / block_bytes)
}

pub(super) fn dequantize<D: Device>(d: &mut D, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>> {
    if let Ok(spec) = TurboSpec::stock(ty) {
        return turbo_dequantize(d, &spec, blocks);
    }
    if ty.rotates_rows() {
        // Blocks alone: the rotated-domain values (the registry's per-block decoder).
        let nblk = whole_blocks(ty, blocks.len(), ty.block_bytes())?;
        let w = TwoBit {
            layout: TwoBitLayout::of(ty),
            data: blocks,
            rows: nblk,
            cols: ty.block_size(),
            rotated: false,
        };
        return twobit_decode(d, &w, false);
    }
    let k = kernels::kernel(ty, Op::Dequantize)?;
    let nblk = whole_blocks(ty, blocks.len(), ty.block_bytes())?;
    let n = nblk * ty.block_size();
    if n == 0 {
        return Ok(vec![]);
    }
    let src = d.upload(blocks)?;
    let out = d.alloc_f32(n)?;
    let args = Args {
        blocks: Some(&src),
        vec_in: None,
        out: &out,
        n: count_u32("blocks", nblk)?,
        cols: None,
        tokens: None,
        turbo: None,
        tq2r: None,
    };
    run(d, k, &args)?;
    d.download(&out, n)
}
