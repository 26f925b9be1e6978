//! Stock ggml blocks seen as fixed grids, for calibration-aware rounding (`quant::ldlq` over
//! stock types, and importance-weighted round-to-nearest for `--imatrix`).
//!
//! A block is encoded in two steps: [`fit`] chooses the block's parameters (scales, mins) with
//! per-value importance weights and writes them into the block, returning the grid each value
//! decodes on — value `i` becomes `a[i] · c − b[i]` for an integer code `c` in `lo..=hi` (for
//! iq4_nl / iq4_xs `a[i] · kvalues_iq4nl[c]`, `c` in `0..=15`: [`BlockGrid::level`]), computed
//! in f32 exactly as the stock decoder does; then the caller picks every code (nearest, or with
//! LDLQ error feedback) and [`pack`] stores them. The bytes are ordinary blocks: upstream engines
//! and the registry's (gguf-py-checked) decoders read them unchanged.
//!
//! The parameter search, per scale group, with weights `w` (the Hessian diagonal):
//! - symmetric groups (q8_0, q4_0, q5_0 blocks; q3_K's and q6_K's 16-value groups): 31 trial
//!   inverse scales `−(nmax + 0.1·k) / m`, `k = −15..=15`, with `m` the value of largest |x|;
//!   each trial's codes are rounded to nearest and scored by the weighted least-squares fit
//!   `(Σ w x c)² / Σ w c²` (what ggml's `make_qx_quants` does with an importance matrix, over a
//!   wider range of trials); the best trial's least-squares scale is kept. (llama-quantize's own
//!   q3_K / q6_K imatrix fit — 19 trials, and for q3_K the 16 scales by a weighted fit — as the
//!   LDLQ start measured worse on held-out text: docs/bench/presets.md);
//! - q4_K / q5_K: llama-quantize's imatrix fit (`kquants::fit_q45_k`): ggml's `make_qkx3_quants`
//!   per 32-value group (37 trials from `(−0.9 + nmax)/(max − min)` in steps of 0.05) and the
//!   6-bit scales and mins by ggml's weighted `make_qp_quants` (each group weighted by its weight
//!   sum), the weights `w` in place of llama-quantize's `imp·sqrt(σ² + x²)`;
//! - q2_K: llama-quantize's imatrix fit (`kquants::fit_q2_k`): as q4_K / q5_K over 16-value
//!   groups with nmax 3 and 4-bit scales and mins (`make_qp_quants` nmax 15);
//! - q4_1 / q5_1 blocks (scale and a free offset): ggml's `make_qkx3_quants` with llama.cpp's
//!   imatrix settings (37 trials from `(−0.9 + nmax)/(max − min)` in steps of 0.05), the weights
//!   `w` in place of llama-quantize's `imp·sqrt(σ² + x²)`;
//! - iq4_nl / iq4_xs 32-value groups: llama.cpp's search (`iquants::iq4::search_scale`: the
//!   max-based scale, then 15 trial inverse scales `(k − 127)/m`, `k = −7..=7`, each scored by the
//!   weighted least-squares fit) with the weights `w` in place of its `x²`, and 15 more trials
//!   `(k + 113)/m` that map the largest value onto the table's positive end (the table is
//!   asymmetric, −127..113, so either end can fit a group better);
//! - then, for the other types, the super-block quantization of the group scales exactly as
//!   ggml's reference quantizers (i8 scales over `max/−128` for q6_K, 6-bit signed scales over
//!   `max/−32` for q3_K and iq4_xs), and the f16 rounding of every stored scale: the grid
//!   returned is the one the decoder will use.
//!
//! `--imatrix` does not come here for the k-quants, q4_0 / q4_1 / q5_0 / q5_1 / q8_0 and the
//! i-quants: those have llama-quantize's own encoder (`types::weighted_encoder`); for q2_K, q4_K
//! and q5_K it shares this fit. The refit after LDLQ ([`set_params`]) still quantizes the k-quant
//! scales as the reference quantizers do (`max/63`, `max/15`, `max/−32`).

use super::iquants::{iq4, KV_F32};
use super::kquants::{
    fit_q2_k, fit_q45_k, nearest_int, pack_2bit, pack_scale_min_k4, put_f16, q3_k_scales,
    scale_min_k4, QK_K,
};
use super::legacy::QK;
use super::TensorType;
use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};

/// The grid of one block: value `i` decodes to `a[i] * level(c) - b[i]`, `c` in `lo..=hi`
/// (`level(c) = c`, or the non-linear table of iq4_nl / iq4_xs).
#[derive(Clone, Debug)]
pub(crate) struct BlockGrid {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub lo: i32,
    pub hi: i32,
    /// The values of the codes `lo..=hi` when they are not the integers themselves.
    levels: Option<&'static [f32; 16]>,
}

/// Midpoints between consecutive `kvalues_iq4nl` entries: the nearest level to `t` is the number
/// of midpoints below it (a tie goes up, as ggml's `best_index_int8`).
const IQ4_MIDS: [f64; 15] = {
    let mut m = [0f64; 15];
    let mut i = 0;
    while i < 15 {
        m[i] = (KV_F32[i] as f64 + KV_F32[i + 1] as f64) / 2.0;
        i += 1;
    }
    m
};

impl BlockGrid {
    pub(crate) fn new(ty: TensorType) -> BlockGrid {
        let (lo, hi) = range(ty);
        BlockGrid {
            a: vec![0.0; ty.block_size()],
            b: vec![0.0; ty.block_size()],
            lo,
            hi,
            levels: levels(ty),
        }
    }

    /// The value of code `c` before the scale (`c` itself for the linear grids).
    #[inline]
    pub(crate) fn level(&self, c: i32) -> f32 {
        match self.levels {
            Some(t) => t[c as usize],
            None => c as f32,
        }
    }

    /// The code nearest to `x` on value `i`'s grid (0 when the grid has collapsed to one point).
    #[inline]
    pub(crate) fn nearest(&self, i: usize, x: f64) -> i32 {
        let a = self.a[i] as f64;
        if a == 0.0 {
            return 0i32.clamp(self.lo, self.hi);
        }
        let t = (x + self.b[i] as f64) / a;
        if self.levels.is_some() {
            // |x − a·v| = |a|·|t − v|: the nearest table value to t, whatever the sign of a.
            return IQ4_MIDS.iter().filter(|&&m| m <= t).count() as i32;
        }
        let c = t.round();
        (c.clamp(self.lo as f64, self.hi as f64)) as i32
    }

    /// The decoded value of code `c` on value `i`'s grid, in the decoder's f32 arithmetic.
    #[inline]
    pub(crate) fn value(&self, i: usize, c: i32) -> f32 {
        self.a[i] * self.level(c) - self.b[i]
    }
}

fn levels(ty: TensorType) -> Option<&'static [f32; 16]> {
    matches!(ty, TensorType::IQ4NL | TensorType::IQ4XS).then_some(&KV_F32)
}

/// What code `c` of `ty` multiplies its group scale by (the refit's design matrix).
#[inline]
pub(crate) fn code_value(ty: TensorType, c: i32) -> f64 {
    match levels(ty) {
        Some(t) => t[c as usize] as f64,
        None => c as f64,
    }
}

/// The stock types with a fixed-grid encoder here.
pub(crate) fn supports(ty: TensorType) -> bool {
    use TensorType::*;
    matches!(
        ty,
        Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Q6K | IQ4NL | IQ4XS
    )
}

/// Code range of each type (q8_0 stays symmetric: x86 kernels take |c| of int8 codes, and −128
/// has none).
fn range(ty: TensorType) -> (i32, i32) {
    use TensorType::*;
    match ty {
        Q8_0 => (-127, 127),
        Q4_0 => (-8, 7),
        Q5_0 => (-16, 15),
        Q4_1 => (0, 15),
        Q5_1 => (0, 31),
        Q2K => (0, 3),
        Q3K => (-4, 3),
        Q4K => (0, 15),
        Q5K => (0, 31),
        Q6K => (-32, 31),
        IQ4NL | IQ4XS => (0, 15),
        _ => unreachable!("no grid encoder for {ty}"),
    }
}

fn f16_round(v: f32) -> f32 {
    f16_bits_to_f32(f32_to_f16_bits(v))
}

/// Weighted least-squares symmetric scale for one group (the search in the module comment).
/// Returns the signed scale (0 for an all-zero group).
fn fit_symmetric(x: &[f32], w: &[f32], nmax: i32, lo: i32, hi: i32) -> f32 {
    let mut m = 0f32;
    for &v in x {
        if v.abs() > m.abs() {
            m = v;
        }
    }
    if m.abs() < 1e-30 {
        return 0.0;
    }
    let (mut best, mut best_scale) = (-1f64, 0f32);
    for k in -15..=15 {
        let iscale = -(nmax as f32 + 0.1 * k as f32) / m;
        let (mut sxc, mut scc) = (0f64, 0f64);
        for (&v, &wi) in x.iter().zip(w) {
            let c = nearest_int(iscale * v).clamp(lo, hi) as f64;
            sxc += wi as f64 * v as f64 * c;
            scc += wi as f64 * c * c;
        }
        if scc > 0.0 && sxc * sxc / scc > best {
            best = sxc * sxc / scc;
            best_scale = (sxc / scc) as f32;
        }
    }
    best_scale
}

/// Choose the parameters of one block of `ty` for values `x` with importance `w` (>= 0), write
/// them into `out` (the block's bytes; codes are written later by [`pack`]) and fill `g` with the
/// grid the decoder will use.
pub(crate) fn fit(ty: TensorType, x: &[f32], w: &[f32], out: &mut [u8], g: &mut BlockGrid) {
    use TensorType::*;
    debug_assert_eq!(x.len(), ty.block_size());
    let gs = group_size(ty);
    let mut scales = [0f32; QK_K / 16];
    let mut mins = [0f32; QK_K / 16];
    let ng = ty.block_size() / gs;
    match ty {
        Q2K => {
            // llama.cpp's imatrix fit (`kquants::fit_q2_k`): `make_qkx3_quants` per group, the
            // 4-bit scales and mins by weighted `make_qp_quants`; the grid is what was stored.
            let mut l = [0u8; QK_K];
            let (d, dmin) = fit_q2_k(x, w, out, &mut l);
            for j in 0..16 {
                let sc = out[j];
                g.a[16 * j..16 * j + 16].fill(d * (sc & 0x0F) as f32);
                g.b[16 * j..16 * j + 16].fill(dmin * (sc >> 4) as f32);
            }
            return;
        }
        Q8_0 | Q4_0 | Q5_0 | Q3K | Q6K => {
            let nmax = match ty {
                Q8_0 => 127,
                Q4_0 => 8,
                _ => g.hi + 1,
            };
            for (ib, s) in scales[..ng].iter_mut().enumerate() {
                let r = gs * ib..gs * ib + gs;
                *s = fit_symmetric(&x[r.clone()], &w[r], nmax, g.lo, g.hi);
            }
        }
        Q4K | Q5K => {
            // llama.cpp's imatrix fit (`kquants::fit_q45_k`): make_qkx3_quants per group, the
            // 6-bit scales and mins by weighted make_qp_quants; the grid is what was stored.
            let mut l = [0u8; QK_K];
            fit_q45_k(x, w, g.hi, out, &mut l);
            k45_grid(out, g);
            return;
        }
        Q4_1 | Q5_1 => {
            let wb: &[f32; QK] = w.try_into().expect("a 32-value block");
            let (d, m, _) = super::legacy::qkx3_block(x, wb, g.hi);
            scales[0] = d;
            mins[0] = -m;
        }
        IQ4NL | IQ4XS => {
            let anchors = [KV_F32[0] as i32, KV_F32[15] as i32];
            for (ib, s) in scales[..ng].iter_mut().enumerate() {
                let r = gs * ib..gs * ib + gs;
                *s = iq4::search_scale(&x[r.clone()], &w[r], iq4::NTRY, &anchors);
            }
        }
        _ => unreachable!("no grid encoder for {ty}"),
    }
    set_params(ty, &scales[..ng], &mins[..ng], out, g);
}

/// Values per scale group of `ty` (one scale, and for q4_K/q5_K one min, per group).
pub(crate) fn group_size(ty: TensorType) -> usize {
    match ty {
        TensorType::Q2K | TensorType::Q3K | TensorType::Q6K => 16,
        _ => 32,
    }
}

/// Whether `ty`'s groups have a min (value `a·c − b`) besides the scale.
pub(crate) fn has_min(ty: TensorType) -> bool {
    use TensorType::*;
    matches!(ty, Q2K | Q4K | Q5K | Q4_1 | Q5_1)
}

/// Whether `ty` stores its groups' scale and min as non-negative numbers (the k-quants'
/// quantized super-block scales), so a refit clamps them at 0; q4_1 / q5_1 store both as f16,
/// any sign.
pub(crate) fn nonneg_params(ty: TensorType) -> bool {
    matches!(ty, TensorType::Q2K | TensorType::Q4K | TensorType::Q5K)
}

/// Store one block's group parameters — `scales[k]` (signed for the symmetric types, >= 0 for
/// q4_K/q5_K) and `mins[k]` (q4_K/q5_K: value `scale·c − min`, min >= 0) for each
/// [`group_size`] group — the way the stock format holds them: f16 scales (q8_0/q4_0/q5_0), the
/// super-block quantization of ggml's reference quantizers (6-bit scales/mins over `max/63`
/// for q4_K/q5_K, i8 scales over `max/−128` for q6_K, 4-bit scales/mins over `max/15` for
/// q2_K, 6-bit signed scales over `max/−32` for q3_K and iq4_xs), and fill `g` with the grid
/// that gives.
pub(crate) fn set_params(
    ty: TensorType,
    scales: &[f32],
    mins: &[f32],
    out: &mut [u8],
    g: &mut BlockGrid,
) {
    use TensorType::*;
    g.b.fill(0.0);
    match ty {
        IQ4XS => {
            let (d, ls) = iq4::xs_scales(scales, out);
            let d = f16_round(d);
            for (ib, l) in ls.iter().enumerate() {
                g.a[32 * ib..32 * ib + 32].fill(d * *l as f32);
            }
        }
        Q8_0 | Q4_0 | Q5_0 | IQ4NL => {
            let d = f16_round(scales[0]);
            out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
            g.a.fill(d);
        }
        Q4_1 | Q5_1 => {
            // The decoder's `c·d + m`, with `m = −min`: `a·c − b` with `b = −m` is the same f32.
            let d = put_f16(out, 0, scales[0]);
            let m = put_f16(out, 2, -mins[0]);
            g.a.fill(d);
            g.b.fill(-m);
        }
        Q6K => {
            let (mut max_scale, mut amax) = (0f32, 0f32);
            for &s in scales {
                if s.abs() > amax {
                    amax = s.abs();
                    max_scale = s;
                }
            }
            if amax < 1e-30 {
                out[192..210].fill(0);
                g.a.fill(0.0);
                return;
            }
            let iscale = -128.0f32 / max_scale;
            let d = put_f16(out, 208, 1.0 / iscale);
            for (ib, s) in scales.iter().enumerate() {
                let sc = nearest_int(iscale * s).clamp(-128, 127) as i8;
                out[192 + ib] = sc as u8;
                g.a[16 * ib..16 * ib + 16].fill(d * sc as f32);
            }
        }
        Q2K => {
            let max_scale = scales.iter().cloned().fold(0f32, f32::max);
            let max_min = mins.iter().cloned().fold(0f32, f32::max);
            out[..16].fill(0);
            let d = if max_scale > 0.0 {
                let iscale = 15.0 / max_scale;
                for (o, s) in out[..16].iter_mut().zip(scales) {
                    *o = nearest_int(iscale * s).clamp(0, 15) as u8;
                }
                put_f16(out, 80, max_scale / 15.0)
            } else {
                put_f16(out, 80, 0.0)
            };
            let dmin = if max_min > 0.0 {
                let iscale = 15.0 / max_min;
                for (o, m) in out[..16].iter_mut().zip(mins) {
                    *o |= (nearest_int(iscale * m).clamp(0, 15) as u8) << 4;
                }
                put_f16(out, 82, max_min / 15.0)
            } else {
                put_f16(out, 82, 0.0)
            };
            for j in 0..16 {
                let sc = out[j];
                g.a[16 * j..16 * j + 16].fill(d * (sc & 0x0F) as f32);
                g.b[16 * j..16 * j + 16].fill(dmin * (sc >> 4) as f32);
            }
        }
        Q3K => {
            let (mut max_scale, mut amax) = (0f32, 0f32);
            for &s in scales {
                if s.abs() > amax {
                    amax = s.abs();
                    max_scale = s;
                }
            }
            let sc = &mut out[96..108];
            sc.fill(0);
            let d = if amax >= 1e-30 {
                let iscale = -32.0f32 / max_scale;
                for (j, s) in scales.iter().enumerate() {
                    let li = nearest_int(iscale * s).clamp(-32, 31) + 32;
                    if j < 8 {
                        sc[j] = (li & 0x0F) as u8;
                    } else {
                        sc[j - 8] |= ((li & 0x0F) << 4) as u8;
                    }
                    sc[8 + j % 4] |= ((li >> 4) << (2 * (j / 4))) as u8;
                }
                put_f16(out, 108, 1.0 / iscale)
            } else {
                put_f16(out, 108, 0.0)
            };
            let s = q3_k_scales(&out[96..108]);
            for j in 0..16 {
                g.a[16 * j..16 * j + 16].fill(d * s[j] as f32);
            }
        }
        Q4K | Q5K => {
            let max_scale = scales.iter().cloned().fold(0f32, f32::max);
            let max_min = mins.iter().cloned().fold(0f32, f32::max);
            let inv_scale = if max_scale > 0.0 {
                63.0 / max_scale
            } else {
                0.0
            };
            let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
            let mut ls = [0u8; 8];
            let mut lm = [0u8; 8];
            for j in 0..8 {
                ls[j] = nearest_int(inv_scale * scales[j]).clamp(0, 63) as u8;
                lm[j] = nearest_int(inv_min * mins[j]).clamp(0, 63) as u8;
            }
            out[4..16].fill(0);
            pack_scale_min_k4(&ls, &lm, &mut out[4..16]);
            put_f16(out, 0, max_scale / 63.0);
            put_f16(out, 2, max_min / 63.0);
            k45_grid(out, g);
        }
        _ => unreachable!("no grid encoder for {ty}"),
    }
}

/// The grid of a q4_K / q5_K block whose `d`, `dmin` and packed scales are written.
fn k45_grid(out: &[u8], g: &mut BlockGrid) {
    let d = f16_bits_to_f32(u16::from_le_bytes([out[0], out[1]]));
    let dmin = f16_bits_to_f32(u16::from_le_bytes([out[2], out[3]]));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &out[4..16]);
        g.a[32 * j..32 * j + 32].fill(d * sc as f32);
        g.b[32 * j..32 * j + 32].fill(dmin * m as f32);
    }
}

/// Store the codes of one block (each in the grid's `lo..=hi`) into `out`, whose parameters
/// [`fit`] wrote.
pub(crate) fn pack(ty: TensorType, codes: &[i32], out: &mut [u8]) {
    use TensorType::*;
    match ty {
        Q8_0 => {
            for (o, &c) in out[2..2 + QK].iter_mut().zip(codes) {
                *o = c as i8 as u8;
            }
        }
        Q4_0 => {
            for j in 0..QK / 2 {
                out[2 + j] = (codes[j] + 8) as u8 | (((codes[j + 16] + 8) as u8) << 4);
            }
        }
        Q4_1 | Q5_1 => {
            let mut l = [0u8; QK];
            for (o, &c) in l.iter_mut().zip(codes) {
                *o = c as u8;
            }
            super::legacy::pack_1(&l, out);
        }
        Q5_0 => {
            let mut qh = 0u32;
            for j in 0..QK / 2 {
                let (c0, c1) = ((codes[j] + 16) as u32, (codes[j + 16] + 16) as u32);
                out[6 + j] = ((c0 & 0x0F) | ((c1 & 0x0F) << 4)) as u8;
                qh |= ((c0 >> 4) << j) | ((c1 >> 4) << (j + 16));
            }
            out[2..6].copy_from_slice(&qh.to_le_bytes());
        }
        Q2K => {
            let mut l = [0u8; QK_K];
            for (o, &c) in l.iter_mut().zip(codes) {
                *o = c as u8;
            }
            pack_2bit(&l, &mut out[16..80]);
        }
        Q3K => {
            // Stored value c + 4 in 0..=7: the low 2 bits in `qs`, the high bit in `hmask`.
            let mut l = [0u8; QK_K];
            let (hmask, rest) = out.split_at_mut(32);
            hmask.fill(0);
            for (j, (o, &c)) in l.iter_mut().zip(codes).enumerate() {
                let v = (c + 4) as u8;
                if v > 3 {
                    hmask[j % 32] |= 1 << (j / 32);
                }
                *o = v & 3;
            }
            pack_2bit(&l, &mut rest[..64]);
        }
        Q4K => {
            let qs = &mut out[16..144];
            for g in 0..4 {
                for k in 0..32 {
                    qs[32 * g + k] =
                        codes[64 * g + k] as u8 | ((codes[64 * g + k + 32] as u8) << 4);
                }
            }
        }
        Q5K => {
            let (qh, ql) = out[16..176].split_at_mut(32);
            qh.fill(0);
            for g in 0..4 {
                for k in 0..32 {
                    let (l1, l2) = (codes[64 * g + k] as u8, codes[64 * g + k + 32] as u8);
                    qh[k] |= ((l1 >> 4) << (2 * g)) | ((l2 >> 4) << (2 * g + 1));
                    ql[32 * g + k] = (l1 & 0x0F) | ((l2 & 0x0F) << 4);
                }
            }
        }
        IQ4NL | IQ4XS => {
            let mut l = [0u8; 32];
            let off = if ty == IQ4NL { 2 } else { 8 };
            for (ib, c) in codes.chunks_exact(32).enumerate() {
                for (o, &v) in l.iter_mut().zip(c) {
                    *o = v as u8;
                }
                iq4::pack32(&l, &mut out[off + 16 * ib..off + 16 * ib + 16]);
            }
        }
        Q6K => {
            let (ql, rest) = out.split_at_mut(128);
            let qh = &mut rest[..64];
            for h in 0..2 {
                for k in 0..32 {
                    let v = |o: usize| (codes[128 * h + k + o] + 32) as u8;
                    ql[64 * h + k] = (v(0) & 0x0F) | ((v(64) & 0x0F) << 4);
                    ql[64 * h + k + 32] = (v(32) & 0x0F) | ((v(96) & 0x0F) << 4);
                    qh[32 * h + k] = (v(0) >> 4)
                        | ((v(32) >> 4) << 2)
                        | ((v(64) >> 4) << 4)
                        | ((v(96) >> 4) << 6);
                }
            }
        }
        _ => unreachable!("no grid encoder for {ty}"),
    }
}

/// Importance-weighted round-to-nearest of whole blocks (`w` one weight per value, >= 0): each
/// block's parameters from [`fit`], every code the nearest on its grid. What `--imatrix` (a
/// diagonal-only Hessian) writes.
pub(crate) fn quantize_weighted(ty: TensorType, src: &[f32], w: &[f32], out: &mut [u8]) {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let mut g = BlockGrid::new(ty);
    let mut codes = vec![0i32; bs];
    for ((x, wb), o) in src
        .chunks_exact(bs)
        .zip(w.chunks_exact(bs))
        .zip(out.chunks_exact_mut(bb))
    {
        fit(ty, x, wb, o, &mut g);
        for (i, c) in codes.iter_mut().enumerate() {
            *c = g.nearest(i, x[i] as f64);
        }
        pack(ty, &codes, o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                let mut t = 0f32;
                for _ in 0..4 {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    t += (s >> 40) as f32 / (1u64 << 24) as f32;
                }
                (t - 2.0) * 0.05
            })
            .collect()
    }

    const ALL: [TensorType; 12] = [
        TensorType::Q8_0,
        TensorType::Q4_0,
        TensorType::Q4_1,
        TensorType::Q5_0,
        TensorType::Q5_1,
        TensorType::Q2K,
        TensorType::Q3K,
        TensorType::Q4K,
        TensorType::Q5K,
        TensorType::Q6K,
        TensorType::IQ4NL,
        TensorType::IQ4XS,
    ];

    /// LDLQ over q2_K / q4_K / q5_K starts from llama-quantize's imatrix fit: given the weights
    /// llama.cpp forms from an importance (`imp·sqrt(σ² + x²)`, σ² = `k·Σx²/256` of the
    /// super-block, k = 1 for q2_K and 2 for q4_K / q5_K), [`fit`] writes the same scale bytes
    /// as `types::weighted_encoder` (byte-identical to `llama-quantize --imatrix`,
    /// tests/kquants_imatrix_llama.rs), and its grid is what those bytes decode to.
    #[test]
    fn k_quant_fit_is_llama_imatrix_fit() {
        use TensorType::*;
        for (ty, k, params) in [
            (Q2K, 1.0f32, [(0, 16), (80, 84)]),
            (Q4K, 2.0, [(0, 16), (0, 16)]),
            (Q5K, 2.0, [(0, 16), (0, 16)]),
        ] {
            for seed in 0..16u64 {
                let x = noise(100 + seed, QK_K);
                let imp: Vec<f32> = noise(200 + seed, QK_K)
                    .iter()
                    .map(|v| 10f32.powf(20.0 * v))
                    .collect();
                let mut sx2 = 0f32;
                for v in &x {
                    sx2 += v * v;
                }
                let sigma2 = k * sx2 / QK_K as f32;
                let w: Vec<f32> = imp
                    .iter()
                    .zip(&x)
                    .map(|(q, v)| q * (sigma2 + v * v).sqrt())
                    .collect();
                let mut theirs = vec![0u8; ty.block_bytes()];
                crate::types::weighted_encoder(ty).unwrap()(&x, &imp, &mut theirs);
                let mut ours = vec![0u8; ty.block_bytes()];
                let mut g = BlockGrid::new(ty);
                fit(ty, &x, &w, &mut ours, &mut g);
                for (a, b) in params {
                    assert_eq!(ours[a..b], theirs[a..b], "{ty} seed {seed} bytes {a}..{b}");
                }
                // The grid is the decoder's: each of llama's values is a point of it.
                let mut y = vec![0f32; QK_K];
                crate::types::dequantize(ty, &theirs, &mut y, "t").unwrap();
                for (i, &v) in y.iter().enumerate() {
                    assert!(
                        (g.lo..=g.hi).any(|c| g.value(i, c) == v),
                        "{ty} seed {seed} value {i}: {v} off the grid"
                    );
                }
            }
        }
    }

    /// Codes packed by [`pack`] onto parameters written by [`fit`] decode, through the registry's
    /// decoders (checked against gguf-py and llama-quantize), to exactly `a · c − b`.
    #[test]
    fn packed_codes_decode_to_the_grid() {
        for ty in ALL {
            assert!(supports(ty) && ty.has_ldlq(), "{ty}");
            let bs = ty.block_size();
            let x = noise(3, 4 * bs);
            let w: Vec<f32> = noise(5, 4 * bs).iter().map(|v| v.abs() + 0.01).collect();
            let mut g = BlockGrid::new(ty);
            let mut s = 17u64;
            for blk in 0..4 {
                let mut out = vec![0u8; ty.block_bytes()];
                fit(
                    ty,
                    &x[blk * bs..][..bs],
                    &w[blk * bs..][..bs],
                    &mut out,
                    &mut g,
                );
                let codes: Vec<i32> = (0..bs)
                    .map(|_| {
                        s = s.wrapping_mul(6364136223846793005).wrapping_add(99);
                        g.lo + ((s >> 33) % (g.hi - g.lo + 1) as u64) as i32
                    })
                    .collect();
                pack(ty, &codes, &mut out);
                let mut y = vec![0f32; bs];
                crate::types::dequantize(ty, &out, &mut y, "t").unwrap();
                for i in 0..bs {
                    assert_eq!(y[i], g.value(i, codes[i]), "{ty} block {blk} value {i}");
                }
            }
        }
    }

    /// With weights that follow the error measure, the weighted encoder is no worse than ggml's
    /// reference quantizer by that measure (within 2%), and clearly better when weights vary.
    #[test]
    fn weighted_fit_is_at_least_as_good_as_the_reference() {
        for ty in ALL {
            let n = 64 * QK_K;
            let x = noise(7, n);
            let werr = |w: &[f32], y: &[f32]| -> f64 {
                x.iter()
                    .zip(y)
                    .zip(w)
                    .map(|((a, b), w)| *w as f64 * ((a - b) as f64).powi(2))
                    .sum()
            };
            let enc = |w: Option<&[f32]>| {
                let mut b = vec![0u8; ty.bytes_for(n as u64).unwrap() as usize];
                match w {
                    Some(w) => quantize_weighted(ty, &x, w, &mut b),
                    None => crate::types::quantize(ty, &x, &mut b, "t").unwrap(),
                }
                let mut y = vec![0f32; n];
                crate::types::dequantize(ty, &b, &mut y, "t").unwrap();
                y
            };
            let flat = vec![1f32; n];
            let (e_ref, e_w) = (werr(&flat, &enc(None)), werr(&flat, &enc(Some(&flat))));
            eprintln!("{ty}: flat weights: reference {e_ref:.4e}, weighted {e_w:.4e}");
            assert!(e_w <= 1.02 * e_ref, "{ty}: {e_w} vs {e_ref}");
            // Strongly varying importance (a few columns matter 30x more).
            let imp: Vec<f32> = (0..n)
                .map(|i| if i % 7 == 0 { 30.0 } else { 1.0 })
                .collect();
            let (e_ref, e_w) = (werr(&imp, &enc(None)), werr(&imp, &enc(Some(&imp))));
            eprintln!("{ty}: varied weights: reference {e_ref:.4e}, weighted {e_w:.4e}");
            assert!(e_w < 0.97 * e_ref, "{ty}: {e_w} vs {e_ref}");
        }
    }
}
