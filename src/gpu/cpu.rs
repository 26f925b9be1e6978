//! The kernels' arithmetic on the CPU, as one more [`Device`]: lets the harness (and its tests) run
//! without a GPU, through the same launch sequences and size checks as the GPU backends.

use super::device::{Args, Device, Grid};
use super::kernels::{Dialect, Kernel, Op};
use super::turbo_spec::turbo_bits;
use super::BackendKind;
use crate::error::Result;
use crate::types::tq as tqs;
use crate::types::turbo;
use crate::types::{dequantize as cpu_dequantize, TensorType};
use std::cell::RefCell;
use std::time::Instant;

/// The kernels' arithmetic on the CPU, in the order the WGSL kernels use (dequantize: the CPU
/// reference itself; mat-vec: rotated activation, 64 strided f32 partial sums, tree reduction;
/// mat-mul: rotated activation rows, per 32-block a lane-order block sum, block sums in order;
/// Q·K: 128 strided partial sums, tree reduction). Lets the harness run without a GPU.
pub struct CpuEmulation;

fn tree_sum(mut v: Vec<f32>) -> f32 {
    let mut s = v.len() / 2;
    while s > 0 {
        for t in 0..s {
            v[t] += v[t + s];
        }
        s /= 2;
    }
    v[0]
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// CPU reference dequantize of whole blocks of `ty` (the registry's decoder).
pub(crate) fn cpu_reference(ty: TensorType, bytes: &[u8]) -> Result<Vec<f32>> {
    let n = bytes.len() / ty.block_bytes() * ty.block_size();
    let mut out = vec![0f32; n];
    cpu_dequantize(ty, bytes, &mut out, "reference")?;
    Ok(out)
}

/// Rotated-domain weight `C[idx_j] · d_half(j)` of element `j` of a TQ block.
pub fn rotated_weight(ty: TensorType, blk: &[u8], j: usize) -> f32 {
    let half = if j < 16 { 0 } else { 2 };
    let d = crate::types::float::f16_bits_to_f32(u16::from_le_bytes([blk[half], blk[half + 1]]));
    match ty {
        TensorType::TQ4_1S => tqs::C4[tqs::unpack_tq4(blk)[j] as usize] * d,
        _ => tqs::C3[tqs::unpack_tq3(blk)[j] as usize] * d,
    }
}

/// `threads` strided f32 partial sums of `f(j)` over `0..cols`, then the tree reduction.
fn strided_dot(cols: usize, threads: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut part = vec![0f32; threads];
    for (t, p) in part.iter_mut().enumerate() {
        let mut j = t;
        while j < cols {
            *p += f(j);
            j += threads;
        }
    }
    tree_sum(part)
}

/// The WGSL mat-mul's arithmetic: `Y[t][r]` = Σ over blocks, in order, of the block sum of the
/// 32 products `(C[idx]·d_half)·x̂` in lane order (separate f32 multiply and add, as written).
/// `Y` is `tokens × rows`. Rows in parallel (each output's order is fixed).
fn matmul_wgsl_order(
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    xr: &[f32],
    tokens: usize,
) -> Vec<f32> {
    use rayon::prelude::*;
    let (bpr, bb) = (cols / tqs::QK, ty.block_bytes());
    let by_row: Vec<Vec<f32>> = (0..rows)
        .into_par_iter()
        .map(|r| {
            let mut acc = vec![0f32; tokens];
            let mut blk = vec![0f32; tokens];
            for b in 0..bpr {
                let block = &w[(r * bpr + b) * bb..(r * bpr + b + 1) * bb];
                let wv: Vec<f32> = (0..tqs::QK).map(|l| rotated_weight(ty, block, l)).collect();
                blk.fill(0.0);
                for (l, &wl) in wv.iter().enumerate() {
                    for (t, s) in blk.iter_mut().enumerate() {
                        *s += wl * xr[t * cols + b * tqs::QK + l];
                    }
                }
                for (a, s) in acc.iter_mut().zip(&blk) {
                    *a += s;
                }
            }
            acc
        })
        .collect();
    let mut y = vec![0f32; tokens * rows];
    for (r, col) in by_row.iter().enumerate() {
        for (t, v) in col.iter().enumerate() {
            y[t * rows + r] = *v;
        }
    }
    y
}

impl Device for CpuEmulation {
    type Buf = RefCell<Vec<u8>>;
    const DIALECT: Dialect = Dialect::Wgsl;
    const TIMING_REPS: usize = 1;

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn device_name(&self) -> String {
        "CPU (emulated kernel arithmetic)".into()
    }
    fn upload(&mut self, bytes: &[u8]) -> Result<Self::Buf> {
        Ok(RefCell::new(bytes.to_vec()))
    }
    fn alloc_f32(&mut self, n: usize) -> Result<Self::Buf> {
        Ok(RefCell::new(vec![0u8; n * 4]))
    }
    fn download(&mut self, buf: &Self::Buf, n: usize) -> Result<Vec<f32>> {
        Ok(f32s(&buf.borrow()[..n * 4]))
    }
    fn timed(&mut self, work: &mut dyn FnMut(&mut Self) -> Result<()>) -> Result<f64> {
        let t = Instant::now();
        work(self)?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// What kernel `k` computes, with its summation order (the grid only matters on a GPU).
    fn launch(&mut self, k: &'static Kernel, _: Grid, a: &Args<Self::Buf>) -> Result<()> {
        let n = a.n as usize;
        let blocks = a.blocks.map(|b| b.borrow());
        let vec_in = a.vec_in.map(|v| f32s(&v.borrow()));
        let turbo = match a.turbo {
            Some((cb, p)) => {
                let bits = turbo_bits(k.ty.expect("turbo kernels have a type"))?;
                let layout = turbo::TurboLayout::new(bits, p.group as usize, p.hdr as usize);
                debug_assert_eq!(layout.block_bytes(), p.bytes as usize);
                Some((layout, f32s(&cb.borrow())))
            }
            None => None,
        };
        let y: Vec<f32> = match (k.op, k.ty) {
            (Op::Dequantize, Some(ty)) => match &turbo {
                None => cpu_reference(ty, &blocks.unwrap()[..n * ty.block_bytes()])?,
                Some((l, cb)) => {
                    let mut out = vec![0f32; n * l.group];
                    let src = &blocks.unwrap()[..n * l.block_bytes()];
                    turbo::dequantize_blocks(l, cb, src, &mut out);
                    out
                }
            },
            (Op::Prerotate, _) => {
                let mut xr = vec_in.unwrap()[..n * tqs::QK].to_vec();
                for b in xr.chunks_exact_mut(tqs::QK) {
                    let mut a = [0f32; tqs::QK];
                    a.copy_from_slice(b);
                    tqs::forward_rotate(&mut a);
                    b.copy_from_slice(&a);
                }
                xr
            }
            (Op::MatVec, Some(ty)) => {
                let (w, xr) = (blocks.unwrap(), vec_in.unwrap());
                let cols = a.cols.unwrap() as usize;
                let (bpr, bb) = (cols / tqs::QK, ty.block_bytes());
                (0..n)
                    .map(|r| {
                        strided_dot(cols, k.wgsl.threads as usize, |j| {
                            let blk = &w[(r * bpr + j / 32) * bb..(r * bpr + j / 32 + 1) * bb];
                            rotated_weight(ty, blk, j % 32) * xr[j]
                        })
                    })
                    .collect()
            }
            (Op::MatMul, Some(ty)) => {
                let (w, xr) = (blocks.unwrap(), vec_in.unwrap());
                let cols = a.cols.unwrap() as usize;
                let tokens = a.tokens.unwrap() as usize;
                matmul_wgsl_order(ty, &w, n, cols, &xr, tokens)
            }
            (Op::TurboQk, Some(_)) => {
                let (l, cb) = turbo.as_ref().unwrap();
                let cols = a.cols.unwrap() as usize;
                let src = &blocks.unwrap()[..n * cols / l.group * l.block_bytes()];
                let mut deq = vec![0f32; n * cols];
                turbo::dequantize_blocks(l, cb, src, &mut deq);
                let q = vec_in.unwrap();
                (0..n)
                    .map(|r| {
                        let row = &deq[r * cols..(r + 1) * cols];
                        strided_dot(cols, k.wgsl.threads as usize, |j| q[j] * row[j])
                    })
                    .collect()
            }
            _ => unreachable!("{}: every typed kernel has a type", k.entry),
        };
        for (o, v) in a.out.borrow_mut().chunks_exact_mut(4).zip(&y) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }
}
