//! TQ4_1S / TQ3_1S weight blocks (FORMATS.md §2): 32 values per block, rotated by a fixed
//! randomized 32-point Hadamard transform, two f16 half-block scales, and 4- or 3-bit indices
//! into a Lloyd-Max codebook for N(0, 1).
//!
//! The scalar reference (`*_ref`) reproduces the fork's `quantize_row_tq*_1s_ref` /
//! `dequantize_row_tq*_1s` f32 arithmetic operation by operation (every op rounded on its own,
//! same order), so that its output is byte-exact with the conformance vectors.

use crate::math::hadamard::fwht_scalar;
use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};

/// Values per block.
pub const QK: usize = 32;
/// Bytes per TQ4_1S block.
pub const TQ4_BYTES: usize = 20;
/// Bytes per TQ3_1S block.
pub const TQ3_BYTES: usize = 16;

/// `1/sqrt(32)` as the f32 constant the engine uses.
const INV_SQRT32: f32 = 0.176_776_695_296_636_88;

/// 4-bit codebook (Lloyd-Max for N(0, 1)).
pub const C4: [f32; 16] = [
    -2.732590, -2.069017, -1.618046, -1.256231, -0.942340, -0.656759, -0.388048, -0.128395,
    0.128395, 0.388048, 0.656759, 0.942340, 1.256231, 1.618046, 2.069017, 2.732590,
];
/// Hard-coded 4-bit decision thresholds: index = first `i` with `v < T4[i]`, else 15.
pub const T4: [f32; 15] = [
    -2.400804, -1.843532, -1.437139, -1.099286, -0.799550, -0.522404, -0.258222, 0.000000,
    0.258222, 0.522404, 0.799550, 1.099286, 1.437139, 1.843532, 2.400804,
];
/// 3-bit codebook (deliberately asymmetric).
pub const C3: [f32; 8] = [
    -1.996684, -1.291398, -0.740341, -0.247508, 0.230106, 0.725222, 1.277503, 1.988943,
];
/// Hard-coded 3-bit decision thresholds: index = first `i` with `v < T3[i]`, else 7.
pub const T3: [f32; 7] = [
    -1.644041, -1.015870, -0.493925, -0.008701, 0.477664, 1.001363, 1.633223,
];

/// The scale multipliers tried by the scale search, in order.
const MULTS: [f32; 9] = [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5];
/// Refinement rounds of the reference quantizer.
pub const REFINE_ROUNDS: usize = 6;

/// Block signs (`golden_ratio_sign(i)` for i < 32), computed at compile time.
const SIGNS: [f32; 32] = {
    let mut s = [1.0f32; 32];
    let mut i = 0;
    while i < 32 {
        if (i as u32).wrapping_mul(0x9E37_79B9) & 0x8000_0000 != 0 {
            s[i] = -1.0;
        }
        i += 1;
    }
    s
};

/// Index of `v` under a threshold table: the first `i` with `v < t[i]`, else `t.len()`.
/// NaN compares false everywhere and maps to the top index.
#[inline]
pub fn tq_index(v: f32, t: &[f32]) -> usize {
    for (i, &th) in t.iter().enumerate() {
        if v < th {
            return i;
        }
    }
    t.len()
}

/// Forward block rotation: `b *= s`, butterfly, `b *= 1/sqrt(32)`.
pub fn forward_rotate(b: &mut [f32; QK]) {
    for (v, s) in b.iter_mut().zip(SIGNS.iter()) {
        *v *= *s;
    }
    fwht_scalar(b);
    for v in b.iter_mut() {
        *v *= INV_SQRT32;
    }
}

/// Inverse block rotation: butterfly, then `b *= (1/sqrt(32)) * s` (one f32 product).
pub fn inverse_rotate(b: &mut [f32; QK]) {
    fwht_scalar(b);
    for (v, s) in b.iter_mut().zip(SIGNS.iter()) {
        *v *= INV_SQRT32 * *s;
    }
}

/// Result of quantizing one block: f32 half scales (before f16 rounding) and indices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ {
    pub d: [f32; 2],
    pub idx: [u8; QK],
}

#[inline]
fn inv_of(d: f32) -> f32 {
    if d > 1e-10 {
        1.0 / d
    } else {
        0.0
    }
}

/// The reference quantizer for one block with a parameterized number of refinement rounds
/// (the fork uses [`REFINE_ROUNDS`]; the parameter exists for the property tests).
pub fn quantize_block_param(x: &[f32], c: &[f32], t: &[f32], rounds: usize) -> BlockQ {
    let mut buf = [0f32; QK];
    buf.copy_from_slice(&x[..QK]);
    forward_rotate(&mut buf);

    // Per-half RMS.
    let mut rms = [0f32; 2];
    for h in 0..2 {
        let mut s = 0f32;
        for v in &buf[h * 16..h * 16 + 16] {
            s += v * v;
        }
        rms[h] = (s / 16.0).sqrt();
    }

    // Scale search: one multiplier for both halves, error over all 32 values.
    let mut best = rms;
    let mut best_err = 1e30f32;
    for &m in MULTS.iter() {
        let d = [rms[0] * m, rms[1] * m];
        let inv = [inv_of(d[0]), inv_of(d[1])];
        let mut err = 0f32;
        for j in 0..QK {
            let h = j / 16;
            let i = tq_index(buf[j] * inv[h], t);
            let diff = buf[j] - c[i] * d[h];
            err += diff * diff;
        }
        if err < best_err {
            best_err = err;
            best = d;
        }
    }

    // Refinement: least-squares scale for the current indices, per half.
    let mut d = best;
    for _ in 0..rounds {
        for h in 0..2 {
            let inv = inv_of(d[h]);
            let mut sxc = 0f32;
            let mut scc = 0f32;
            for v in &buf[h * 16..h * 16 + 16] {
                let cv = c[tq_index(v * inv, t)];
                sxc += v * cv;
                scc += cv * cv;
            }
            if scc > 1e-10 {
                d[h] = sxc / scc;
            }
        }
    }

    // Final indices from the f32 scales.
    let mut idx = [0u8; QK];
    for j in 0..QK {
        let h = j / 16;
        idx[j] = tq_index(buf[j] * inv_of(d[h]), t) as u8;
    }
    BlockQ { d, idx }
}

fn put_scales(out: &mut [u8], d: [f32; 2]) {
    out[0..2].copy_from_slice(&f32_to_f16_bits(d[0]).to_le_bytes());
    out[2..4].copy_from_slice(&f32_to_f16_bits(d[1]).to_le_bytes());
}

fn get_scales(b: &[u8]) -> [f32; 2] {
    [
        f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])),
        f16_bits_to_f32(u16::from_le_bytes([b[2], b[3]])),
    ]
}

/// Pack a TQ4_1S block.
pub fn pack_tq4(q: &BlockQ, out: &mut [u8]) {
    put_scales(out, q.d);
    for j in 0..16 {
        out[4 + j] = (q.idx[2 * j] & 15) | ((q.idx[2 * j + 1] & 15) << 4);
    }
}

/// Pack a TQ3_1S block.
pub fn pack_tq3(q: &BlockQ, out: &mut [u8]) {
    put_scales(out, q.d);
    for g in 0..4 {
        let mut w = 0u32;
        for i in 0..8 {
            w |= ((q.idx[8 * g + i] & 7) as u32) << (3 * i);
        }
        out[4 + 3 * g..4 + 3 * g + 3].copy_from_slice(&w.to_le_bytes()[..3]);
    }
}

/// Unpack the indices of a TQ4_1S block.
pub fn unpack_tq4(b: &[u8]) -> [u8; QK] {
    let mut idx = [0u8; QK];
    for j in 0..16 {
        idx[2 * j] = b[4 + j] & 15;
        idx[2 * j + 1] = b[4 + j] >> 4;
    }
    idx
}

/// Unpack the indices of a TQ3_1S block.
pub fn unpack_tq3(b: &[u8]) -> [u8; QK] {
    let mut idx = [0u8; QK];
    for g in 0..4 {
        let o = 4 + 3 * g;
        let w = b[o] as u32 | (b[o + 1] as u32) << 8 | (b[o + 2] as u32) << 16;
        for i in 0..8 {
            idx[8 * g + i] = ((w >> (3 * i)) & 7) as u8;
        }
    }
    idx
}

fn dequantize_block(b: &[u8], idx: &[u8; QK], c: &[f32], out: &mut [f32]) {
    let d = get_scales(b);
    let mut buf = [0f32; QK];
    for j in 0..QK {
        buf[j] = c[idx[j] as usize] * d[j / 16];
    }
    inverse_rotate(&mut buf);
    out[..QK].copy_from_slice(&buf);
}

/// Scalar reference TQ4_1S quantizer (whole blocks).
pub fn quantize_tq4_1s_ref(src: &[f32], out: &mut [u8]) {
    for (x, o) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ4_BYTES)) {
        pack_tq4(&quantize_block_param(x, &C4, &T4, REFINE_ROUNDS), o);
    }
}

/// Scalar reference TQ4_1S dequantizer (whole blocks).
pub fn dequantize_tq4_1s_ref(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ4_BYTES).zip(out.chunks_exact_mut(QK)) {
        dequantize_block(b, &unpack_tq4(b), &C4, o);
    }
}

pub fn quantize_tq3_1s(src: &[f32], out: &mut [u8]) {
    for (x, o) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ3_BYTES)) {
        pack_tq3(&quantize_block_param(x, &C3, &T3, REFINE_ROUNDS), o);
    }
}

pub fn dequantize_tq3_1s(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ3_BYTES).zip(out.chunks_exact_mut(QK)) {
        dequantize_block(b, &unpack_tq3(b), &C3, o);
    }
}

pub fn quantize_tq4_1s(src: &[f32], out: &mut [u8]) {
    quantize_tq4_1s_ref(src, out)
}

pub fn dequantize_tq4_1s(blocks: &[u8], out: &mut [f32]) {
    dequantize_tq4_1s_ref(blocks, out)
}
