//! The 2-bit matrices of tq2_r / tq2_t (and the seed design's own layout): the layouts, the
//! shape check, block decode (optionally back to the original basis) and the GEMV over the
//! rotated input.

use super::args::tq2r_args;
use super::rotate::{rotate_launches, RotatePath};
use super::{count_u32, f32_bytes, run, Args, Device, Tq2rParams, TQ2R_SEED_LAYOUT};
use crate::error::{Error, Result};
use crate::gpu::kernels::{self, Kernel, Op};
use crate::types::{tq2r, tq2t, TensorType};

/// Where a 2-bit matrix of the seed design's family keeps its codes and scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwoBitLayout {
    /// tq2_r GGUF blocks: f16 scale + 8 code bytes per 32 values (10 bytes), rows consecutive.
    Tq2r,
    /// The seed design's own arrays (FORMATS.md §6) in one buffer: the u32 code words (16 codes
    /// per word over the whole tensor), then one f32 scale per 32 values; little-endian.
    Seed,
    /// tq2_t GGUF blocks (issue 19): scale byte + 16 code bytes per 64 values (17 bytes), decoded
    /// by the tail-biting trellis; rows consecutive, on tq2_r's rotation.
    Tq2t,
}

impl TwoBitLayout {
    /// The layout of a GGUF type's blocks: tq2_t's, else tq2_r's.
    pub fn of(ty: TensorType) -> TwoBitLayout {
        if ty == TensorType::TQ2T {
            TwoBitLayout::Tq2t
        } else {
            TwoBitLayout::Tq2r
        }
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            TwoBitLayout::Tq2r | TwoBitLayout::Seed => tq2r::QK,
            TwoBitLayout::Tq2t => tq2t::QK,
        }
    }

    /// The GGUF type whose kernels decode this layout.
    pub(crate) fn kernel_type(self) -> TensorType {
        match self {
            TwoBitLayout::Tq2r | TwoBitLayout::Seed => TensorType::TQ2R,
            TwoBitLayout::Tq2t => TensorType::TQ2T,
        }
    }
}

/// A 2-bit weight matrix for the tq2_r / tq2_t kernels: `rows × cols` values, `cols` a multiple of
/// the layout's block (32; tq2_t 64).
#[derive(Clone, Copy, Debug)]
pub struct TwoBit<'a> {
    pub layout: TwoBitLayout,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    /// The rows are stored rotated by tq2_r's whole-row rotation of `cols` (always for tq2_r;
    /// the design's `incoherent`, which needs a power-of-two `cols`).
    pub rotated: bool,
}

impl TwoBit<'_> {
    /// Bytes per block of [`TwoBitLayout::block_values`] values.
    pub fn block_bytes(layout: TwoBitLayout) -> usize {
        match layout {
            TwoBitLayout::Tq2r => tq2r::TQ2R_BYTES,
            TwoBitLayout::Seed => 12,
            TwoBitLayout::Tq2t => tq2t::TQ2T_BYTES,
        }
    }

    /// The design's codes and scales as one [`TwoBitLayout::Seed`] buffer.
    pub fn seed_bytes(qw: &[u32], sc: &[f32]) -> Vec<u8> {
        qw.iter()
            .flat_map(|w| w.to_le_bytes())
            .chain(sc.iter().flat_map(|s| s.to_le_bytes()))
            .collect()
    }

    /// The number of blocks (of [`TwoBitLayout::block_values`]), after checking the shape
    /// against the data.
    pub fn blocks(&self) -> Result<usize> {
        let bad = |why: String| Err(Error::Unsupported(format!("2-bit matrix: {why}")));
        let qk = self.layout.block_values();
        if self.cols == 0 || !self.cols.is_multiple_of(qk) {
            return bad(format!(
                "row length {} is not a positive multiple of {qk}",
                self.cols
            ));
        }
        let Some(n) = self.rows.checked_mul(self.cols) else {
            return bad(format!("{} x {} values overflow", self.rows, self.cols));
        };
        let nblk = n / qk;
        let want = nblk.checked_mul(Self::block_bytes(self.layout));
        if want != Some(self.data.len()) {
            return bad(format!(
                "{} bytes for {} x {} values in the {:?} layout",
                self.data.len(),
                self.rows,
                self.cols,
                self.layout
            ));
        }
        if self.rotated && self.layout == TwoBitLayout::Seed && !self.cols.is_power_of_two() {
            return bad(format!(
                "the design's rotation needs a power-of-two row length, not {}",
                self.cols
            ));
        }
        Ok(nblk)
    }

    pub(super) fn flags(&self) -> u32 {
        match self.layout {
            TwoBitLayout::Tq2r | TwoBitLayout::Tq2t => 0,
            TwoBitLayout::Seed => TQ2R_SEED_LAYOUT,
        }
    }
}

/// The layout's decode or GEMV kernel (tq2_t's decode its trellis blocks; both share tq2_r's
/// rotation kernels).
fn twobit_kernel(layout: TwoBitLayout, op: Op) -> Result<&'static Kernel> {
    kernels::kernel(layout.kernel_type(), op)
}

pub(super) fn twobit_decode<D: Device>(d: &mut D, w: &TwoBit, original: bool) -> Result<Vec<f32>> {
    let nblk = w.blocks()?;
    let n = nblk * w.layout.block_values();
    if n == 0 {
        return Ok(vec![]);
    }
    let src = d.upload(w.data)?;
    let out = d.alloc_f32(n)?;
    let p = Tq2rParams {
        flags: w.flags(),
        ..Default::default()
    };
    let mut args = Args::new(&out, count_u32("blocks", nblk)?);
    args.blocks = Some(&src);
    args.tq2r = tq2r_args(None, None, p);
    run(d, twobit_kernel(w.layout, Op::Dequantize)?, &args)?;
    if original && w.rotated {
        let y = rotate_launches(d, &out, w.rows, w.cols, true, RotatePath::Auto)?;
        return d.download(&y, n);
    }
    d.download(&out, n)
}

pub(super) fn twobit_matvec<D: Device>(
    d: &mut D,
    w: &TwoBit,
    x: &[f32],
    prerotated: bool,
) -> Result<Vec<f32>> {
    w.blocks()?;
    if x.len() < w.cols {
        return Err(Error::Unsupported(format!(
            "2-bit mat-vec: {} activation values for rows of {}",
            x.len(),
            w.cols
        )));
    }
    if w.rows == 0 {
        return Ok(vec![]);
    }
    let wd = d.upload(w.data)?;
    let xd = d.upload(&f32_bytes(&x[..w.cols]))?;
    let xr = if w.rotated && !prerotated {
        // 1. x' = R·x, once for all rows.
        Some(rotate_launches(d, &xd, 1, w.cols, false, RotatePath::Auto)?)
    } else {
        None
    };
    // 2. y[r] = Σ_b d_b · Σ_j v_j·x'_j (tq2_r: v = 2q − 3, 16 codes per u32 word; tq2_t: the
    //    trellis codeword of each value's state).
    let y = d.alloc_f32(w.rows)?;
    let p = Tq2rParams {
        flags: w.flags(),
        ..Default::default()
    };
    let mut args = Args::new(&y, count_u32("rows", w.rows)?);
    args.blocks = Some(&wd);
    args.vec_in = Some(xr.as_ref().unwrap_or(&xd));
    args.cols = Some(count_u32("columns", w.cols)?);
    args.tq2r = tq2r_args(None, None, p);
    run(d, twobit_kernel(w.layout, Op::MatVec)?, &args)?;
    d.download(&y, w.rows)
}
