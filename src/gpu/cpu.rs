//! The kernels' arithmetic on the CPU, as one more [`Device`]: lets the harness (and its tests) run
//! without a GPU, through the same launch sequences and size checks as the GPU backends. It is
//! also the scalar statement of what each kernel computes (tq2_r: the layout-aware block read,
//! the exact subnormal product, the rotation's steps, the GEMV's summation order).

use super::device::{
    Args, Device, Grid, Tq2rParams, TQ2R_INVERSE, TQ2R_MIX_THEN_SCALE, TQ2R_SEED_LAYOUT,
};
use super::kernels::{Dialect, Kernel, Op};
use super::turbo_spec::turbo_bits;
use super::BackendKind;
use crate::error::Result;
use crate::math::hadamard::fwht;
use crate::types::tq as tqs;
use crate::types::tq2t;
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

/// `(2q − 3)·s` for the f32 scale with bits `sbits`, correctly rounded, as the tq2_r kernels
/// compute it: a float product for a normal (or zero, inf, NaN) scale, whose result cannot be
/// subnormal; integer arithmetic for a subnormal scale, which WGSL lets a device flush to zero
/// (the seed design's f32 scales can be subnormal). Equals `seed2bit::level(q, s) as f32`.
pub(crate) fn scaled_level(q: u32, sbits: u32) -> f32 {
    let lev = (2 * (q & 3) as i32 - 3) as f32;
    let m = sbits & 0x7f_ffff;
    if (sbits >> 23) & 0xff != 0 || m == 0 {
        return lev * f32::from_bits(sbits);
    }
    let sign = (sbits & 0x8000_0000) ^ if q < 2 { 0x8000_0000 } else { 0 };
    let mag = if q == 1 || q == 2 {
        m
    } else {
        // 3m·2^-149: below 2^24 the bits are 3m itself (subnormal, or exponent field 1);
        // above, exponent field 2 and 3m/2 rounded to nearest, ties to even.
        let t = 3 * m;
        if t < 1 << 24 {
            t
        } else {
            let mut r = t >> 1;
            if t & 1 == 1 && r & 1 == 1 {
                r += 1;
            }
            r + (1 << 23)
        }
    };
    f32::from_bits(sign | mag)
}

/// The u32 word `half` (0, 1) of the codes of block `gb` and the f32 bits of its scale, in the
/// layout the flags name (tq2_r blocks: f16 scale, codes at an even byte offset; the design's
/// layout: words `2gb, 2gb+1`, scales after the `2·nblk` words).
pub(crate) fn tq2r_block(src: &[u8], gb: usize, nblk: usize, flags: u32) -> ([u32; 2], u32) {
    let rd = |o: usize| u32::from_le_bytes([src[o], src[o + 1], src[o + 2], src[o + 3]]);
    if flags & TQ2R_SEED_LAYOUT != 0 {
        ([rd(8 * gb), rd(8 * gb + 4)], rd(8 * nblk + 4 * gb))
    } else {
        let o = gb * crate::types::tq2r::TQ2R_BYTES;
        let d = crate::types::float::f16_bits_to_f32(u16::from_le_bytes([src[o], src[o + 1]]));
        ([rd(o + 2), rd(o + 6)], d.to_bits())
    }
}

/// tq2_t's scale byte as the kernels build it, from bits: 0, or `(1 + m/8)·2^(E − 24)` with
/// `E = e >> 3`, `m = e & 7` (equals `tq2t::scale_of`, a test checks every byte).
pub(crate) fn tq2t_scale(e: u8) -> f32 {
    if e == 0 {
        return 0.0;
    }
    let (ex, m) = ((e >> 3) as u32, (e & 7) as u32);
    f32::from_bits(((ex + 103) << 23) | (m << 20))
}

/// Code `j` of a tq2_t block (`blk` = its 17 bytes).
fn tq2t_code(blk: &[u8], j: usize) -> u32 {
    ((blk[1 + j / 4] >> (2 * (j % 4))) & 3) as u32
}

/// The tail-biting state of value `j`, read from its block as one GPU thread does: its code in
/// the low bits, the five before it (wrapping inside the block) above.
pub(crate) fn tq2t_state(blk: &[u8], j: usize) -> u32 {
    (0..6).fold(0, |s, t| {
        s | tq2t_code(blk, (j + tq2t::QK - t) % tq2t::QK) << (2 * t)
    })
}

/// The GEMV's two states, of values `j` (even) and `j + 1`, from one 14-bit window of the code
/// stream (codes `j − 5 ..= j + 1`; for `j < 5` it wraps to the block's end) with its 2-bit digits
/// reversed: digit `k` of `r` is code `j + 1 − k`. Three byte reads inside the block where
/// [`tq2t_state`] makes six; a test holds the two equal for every `j`.
pub(crate) fn tq2t_states(blk: &[u8], j: usize) -> (u32, u32) {
    let q = |k: usize| blk[1 + k] as u32;
    let w = if j >= 5 {
        let c0 = j - 5;
        let k = c0 / 4;
        let v = q(k) | q(k + 1) << 8 | q((k + 2).min(15)) << 16;
        (v >> (2 * (c0 % 4))) & 0x3fff
    } else {
        let hi = (q(14) | q(15) << 8) >> (2 * (3 + j));
        let lo = (q(0) | q(1) << 8) & ((1 << (2 * (j + 2))) - 1);
        hi | lo << (2 * (5 - j))
    };
    let b = w.reverse_bits() >> 18;
    let r = ((b >> 1) & 0x1555) | ((b & 0x1555) << 1);
    ((r >> 2) & 0xfff, r & 0xfff)
}

/// The 1MAD codeword as the kernels write it: wrapping u32 multiply-add, the byte sum, then one
/// f32 product with the constant's bits (equals `tq2t::codeword`, a test checks every state).
pub(crate) fn tq2t_codeword(s: u32) -> f32 {
    let x = tq2t::MAD_A.wrapping_mul(s).wrapping_add(tq2t::MAD_B);
    let sum = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24);
    (sum as i32 - 510) as f32 * f32::from_bits(TQ2T_INV_STD_BITS)
}

/// `tq2t::MAD_INV_STD`'s bits, as every kernel source spells it.
pub(crate) const TQ2T_INV_STD_BITS: u32 = 0x3bdd_b447;

/// The tq2_r rotation kernels' last step for output `i` of a row `v` (after the segment
/// butterflies, and for a DCT factor after the scale): the dense factor (skipped when `h = 1`),
/// the Hadamard scale, the inverse's sign.
fn rot_output(v: &[f32], i: usize, p: &Tq2rParams, mat: &[f32], signs: &[f32]) -> f32 {
    let h = p.h as usize;
    let w = v.len() / h;
    let (a, c) = (i / w, i % w);
    let mut y = if h == 1 {
        v[i]
    } else {
        let mut acc = 0f32;
        for a2 in 0..h {
            acc += mat[a * h + a2] * v[a2 * w + c];
        }
        acc
    };
    if p.flags & TQ2R_MIX_THEN_SCALE != 0 {
        y *= f32::from_bits(p.scale);
    }
    if p.flags & TQ2R_INVERSE != 0 {
        y *= signs[i];
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
        let tq = a.tq2r.as_ref().map(|t| {
            (
                t.p,
                t.signs.map(|b| f32s(&b.borrow())).unwrap_or_default(),
                t.mat.map(|b| f32s(&b.borrow())).unwrap_or_default(),
            )
        });
        let cols = a.cols.unwrap_or(0) as usize;
        let y: Vec<f32> = match (k.op, k.ty) {
            (Op::Dequantize, Some(TensorType::TQ2R)) => {
                let (p, _, _) = tq.as_ref().expect("tq2_r arguments");
                let src = blocks.unwrap();
                (0..n * 32)
                    .map(|i| {
                        let (words, sbits) = tq2r_block(&src, i / 32, n, p.flags);
                        let j = i % 32;
                        scaled_level((words[j / 16] >> (2 * (j % 16))) & 3, sbits)
                    })
                    .collect()
            }
            (Op::MatVec, Some(TensorType::TQ2R)) => {
                // 32 lanes per row, lane l over words l, l+32, …; tree sum (the WGSL order).
                let (p, _, _) = tq.as_ref().expect("tq2_r arguments");
                let (src, xr) = (blocks.unwrap(), vec_in.unwrap());
                let bpr = cols / 32;
                (0..n)
                    .map(|r| {
                        let mut part = vec![0f32; 32];
                        for (l, acc) in part.iter_mut().enumerate() {
                            for wi in (l..cols / 16).step_by(32) {
                                let (words, sbits) =
                                    tq2r_block(&src, r * bpr + wi / 2, n * bpr, p.flags);
                                let word = words[wi % 2];
                                let mut s = 0f32;
                                for i in 0..16 {
                                    let lev = (2 * ((word >> (2 * i)) & 3) as i32 - 3) as f32;
                                    s += lev * xr[wi * 16 + i];
                                }
                                *acc += f32::from_bits(sbits) * s;
                            }
                        }
                        tree_sum(part)
                    })
                    .collect()
            }
            (Op::Dequantize, Some(TensorType::TQ2T)) => {
                // One thread per value: its state from its block, codeword × scale.
                let src = blocks.unwrap();
                (0..n * tq2t::QK)
                    .map(|i| {
                        let blk = &src[i / tq2t::QK * tq2t::TQ2T_BYTES..][..tq2t::TQ2T_BYTES];
                        tq2t_scale(blk[0]) * tq2t_codeword(tq2t_state(blk, i % tq2t::QK))
                    })
                    .collect()
            }
            (Op::MatVec, Some(TensorType::TQ2T)) => {
                // 32 lanes per row, lane l on values 2l, 2l+1 of every block (both states from one
                // window of codes), acc += d·(c0·x0 + c1·x1); tree sum (the WGSL order).
                let (src, xr) = (blocks.unwrap(), vec_in.unwrap());
                let bpr = cols / tq2t::QK;
                (0..n)
                    .map(|r| {
                        let mut part = vec![0f32; 32];
                        for (l, acc) in part.iter_mut().enumerate() {
                            let j = 2 * l;
                            for b in 0..bpr {
                                let o = (r * bpr + b) * tq2t::TQ2T_BYTES;
                                let blk = &src[o..o + tq2t::TQ2T_BYTES];
                                let (s0, s1) = tq2t_states(blk, j);
                                let x = b * tq2t::QK + j;
                                let p = tq2t_codeword(s0) * xr[x] + tq2t_codeword(s1) * xr[x + 1];
                                *acc += tq2t_scale(blk[0]) * p;
                            }
                        }
                        tree_sum(part)
                    })
                    .collect()
            }
            (Op::Rotate, _) => {
                let (p, signs, mat) = tq.as_ref().expect("tq2_r arguments");
                let x = vec_in.unwrap();
                let (h, inv) = (p.h as usize, p.flags & TQ2R_INVERSE != 0);
                let mut y = Vec::with_capacity(n * cols);
                for row in x[..n * cols].chunks_exact(cols) {
                    let mut v: Vec<f32> = if inv {
                        row.to_vec()
                    } else {
                        row.iter().zip(signs).map(|(a, s)| a * s).collect()
                    };
                    for seg in v.chunks_exact_mut(cols / h) {
                        fwht(seg);
                    }
                    if p.flags & TQ2R_MIX_THEN_SCALE == 0 {
                        v.iter_mut().for_each(|a| *a *= f32::from_bits(p.scale));
                    }
                    y.extend((0..cols).map(|i| rot_output(&v, i, p, mat, signs)));
                }
                y
            }
            (Op::RotateLocal, _) => {
                let (p, signs, _) = tq.as_ref().expect("tq2_r arguments");
                let (x, l) = (vec_in.unwrap(), p.step as usize);
                let inv = p.flags & TQ2R_INVERSE != 0;
                let mut y = x[..n * l].to_vec();
                for (b, sub) in y.chunks_exact_mut(l).enumerate() {
                    if !inv {
                        let at = b * l % cols;
                        sub.iter_mut()
                            .zip(&signs[at..at + l])
                            .for_each(|(a, s)| *a *= s);
                    }
                    fwht(sub);
                }
                y
            }
            (Op::RotateStage, _) => {
                // One butterfly stage (`step`) in place over segments of `cols / h`.
                let (p, _, _) = tq.as_ref().expect("tq2_r arguments");
                let mut v = f32s(&a.out.borrow());
                let (w, step) = (cols / p.h as usize, p.step as usize);
                for pair in 0..n {
                    let (seg, j) = (pair / (w / 2), pair % (w / 2));
                    let lo = seg * w + j / step * 2 * step + j % step;
                    let (x, y) = (v[lo], v[lo + step]);
                    v[lo] = x + y;
                    v[lo + step] = x - y;
                }
                v
            }
            (Op::RotateMix, _) => {
                let (p, signs, mat) = tq.as_ref().expect("tq2_r arguments");
                let t = vec_in.unwrap();
                let dct = p.flags & TQ2R_MIX_THEN_SCALE == 0;
                let mut y = Vec::with_capacity(n);
                for row in t[..n].chunks_exact(cols) {
                    let v: Vec<f32> = if dct {
                        row.iter().map(|a| a * f32::from_bits(p.scale)).collect()
                    } else {
                        row.to_vec()
                    };
                    y.extend((0..cols).map(|i| rot_output(&v, i, p, mat, signs)));
                }
                y
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::seed2bit::level;

    /// The kernels' tq2_t pieces are the format's: the scale from bits for every byte, the
    /// codeword for every state, and the state read from the block for every position of
    /// random blocks (against the reference decoder).
    #[test]
    fn tq2t_kernel_arithmetic_is_the_format() {
        assert_eq!(TQ2T_INV_STD_BITS, tq2t::MAD_INV_STD.to_bits());
        for e in 0..=255u8 {
            assert_eq!(
                tq2t_scale(e).to_bits(),
                tq2t::scale_of(e).to_bits(),
                "e={e}"
            );
        }
        for s in 0..1u32 << tq2t::L {
            assert_eq!(
                tq2t_codeword(s).to_bits(),
                tq2t::codeword(s).to_bits(),
                "s={s}"
            );
        }
        let mut g = crate::math::splitmix::SplitMix64::new(5);
        let bytes = g.bytes(40 * tq2t::TQ2T_BYTES);
        let mut want = vec![0f32; 40 * tq2t::QK];
        tq2t::dequantize_tq2t_rotated_ref(&bytes, &mut want);
        for (i, w) in want.iter().enumerate() {
            let blk = &bytes[i / 64 * 17..][..17];
            let got = tq2t_scale(blk[0]) * tq2t_codeword(tq2t_state(blk, i % 64));
            assert_eq!(got.to_bits(), w.to_bits(), "value {i}");
        }
        // The GEMV's windowed pair of states is the per-value state, for every even j (the
        // wrapping ones included) of every block.
        for blk in bytes.chunks_exact(tq2t::TQ2T_BYTES) {
            for j in (0..tq2t::QK).step_by(2) {
                let want = (tq2t_state(blk, j), tq2t_state(blk, j + 1));
                assert_eq!(tq2t_states(blk, j), want, "j={j}");
            }
        }
    }

    /// The kernels' product equals the design's f64 product rounded once, for every code and
    /// subnormal scales (both halves of the `3m < 2^24` split, ties included), and for normal,
    /// zero, inf and NaN scales.
    #[test]
    fn scaled_level_is_the_rounded_f64_product() {
        let mut bits: Vec<u32> = (1..0x80_0000u32).step_by(997).collect();
        bits.extend([
            1, 2, 3, 0x55_5555, 0x55_5556, 0x7f_ffff, 0x40_0000, 0x2a_aaab,
        ]);
        bits.extend([
            0,
            0x3f80_0000,
            0x0080_0000,
            0x7f7f_ffff,
            0x7f80_0000,
            0x7fc0_0000,
        ]);
        for b in bits {
            for sign in [0, 0x8000_0000u32] {
                let s = f32::from_bits(b | sign);
                for q in 0..4 {
                    let got = scaled_level(q, b | sign);
                    let want = level(q, s) as f32;
                    assert!(
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                        "q={q} s={:08x}: {:08x} vs {:08x}",
                        b | sign,
                        got.to_bits(),
                        want.to_bits()
                    );
                }
            }
        }
    }
}
