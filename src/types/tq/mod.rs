//! TQ4_1S / TQ3_1S weight blocks (FORMATS.md §2): 32 values per block, rotated by a fixed
//! randomized 32-point Hadamard transform, two f16 half-block scales, and 4- or 3-bit indices
//! into a Lloyd-Max codebook for N(0, 1).
//!
//! - this file: the block layout (constants, codebooks, rotation, packing) and the registry
//!   entry points (`quantize_tq4_1s`, `quantize_tq3_1s`, `dequantize_*`), the fastest bit-exact
//!   paths for the CPU;
//! - `reference`: the scalar reference (`*_ref`), which reproduces the fork's
//!   `quantize_row_tq*_1s_ref` / `dequantize_row_tq*_1s` f32 arithmetic operation by operation
//!   (every op rounded on its own, same order), so that its output is byte-exact with the
//!   conformance vectors;
//! - `simd`: the cross-block quantizers (8 blocks at once, one block per SIMD lane; AVX2 when
//!   the CPU has it, else portable lane loops).
//!
//! Every optimized kernel is held bit-equal to the reference by the tests beside it.

mod reference;
mod simd;
#[cfg(test)]
mod testutil;

pub use reference::{
    dequantize_tq3_1s_ref, dequantize_tq4_1s_ref, quantize_block_ref, quantize_tq3_1s_ref,
    quantize_tq4_1s_ref,
};
pub use simd::{
    quantize_tq3_1s_avx2, quantize_tq3_1s_portable, quantize_tq4_1s_avx2, quantize_tq4_1s_portable,
};

use crate::math::hadamard::fwht_scalar;
use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};

/// Values per block.
pub const QK: usize = 32;
/// Bytes per TQ4_1S block.
pub const TQ4_BYTES: usize = 20;
/// Bytes per TQ3_1S block.
pub const TQ3_BYTES: usize = 16;

// Layout: two f16 half-block scales, then `QK` indices of 4 (TQ4_1S) or 3 (TQ3_1S) bits.
const SCALES_BYTES: usize = 2 * size_of::<u16>();
const _: () = assert!(TQ4_BYTES == SCALES_BYTES + QK * 4 / 8);
const _: () = assert!(TQ3_BYTES == SCALES_BYTES + QK * 3 / 8);

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

// ---------------------------------------------------------------------------------------------
// Optimized dequantizers, bit-equal to the references (held by the `*_dequant_matches_ref_*`
// tests): the same f32 operations in the same order, with a fixed-size butterfly and the
// inverse rotation's `(1/sqrt(32)) * s` factors precomputed (each is one f32 product either way).
// ---------------------------------------------------------------------------------------------

/// Unnormalized 32-point butterfly (`step = 1, 2, 4, 8, 16`), fixed size.
#[inline(always)]
fn fwht32(b: &mut [f32; QK]) {
    let mut step = 1;
    while step < QK {
        for i in (0..QK).step_by(2 * step) {
            for j in i..i + step {
                let a = b[j];
                let c = b[j + step];
                b[j] = a + c;
                b[j + step] = a - c;
            }
        }
        step *= 2;
    }
}

/// Signs times `1/sqrt(32)`, one f32 product each (the inverse rotation's factors).
const SIGNS_SCALED: [f32; QK] = {
    let mut o = [0f32; QK];
    let mut i = 0;
    while i < QK {
        o[i] = INV_SQRT32 * SIGNS[i];
        i += 1;
    }
    o
};

/// Optimized TQ4_1S dequantizer (whole blocks), bit-equal to [`dequantize_tq4_1s_ref`].
pub fn dequantize_tq4_1s(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ4_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = get_scales(b);
        let mut buf = [0f32; QK];
        for k in 0..16 {
            let q = b[4 + k];
            let h = k >> 3;
            buf[2 * k] = C4[(q & 15) as usize] * d[h];
            buf[2 * k + 1] = C4[(q >> 4) as usize] * d[h];
        }
        fwht32(&mut buf);
        for ((o, v), s) in o.iter_mut().zip(buf).zip(SIGNS_SCALED.iter()) {
            *o = v * s;
        }
    }
}

/// Optimized TQ3_1S dequantizer (whole blocks), bit-equal to [`dequantize_tq3_1s_ref`].
pub fn dequantize_tq3_1s(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ3_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = get_scales(b);
        let idx = unpack_tq3(b);
        let mut buf = [0f32; QK];
        for j in 0..QK {
            buf[j] = C3[idx[j] as usize] * d[j >> 4];
        }
        fwht32(&mut buf);
        for ((o, v), s) in o.iter_mut().zip(buf).zip(SIGNS_SCALED.iter()) {
            *o = v * s;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Registry entry points: the fastest bit-exact path for the CPU.
// ---------------------------------------------------------------------------------------------

/// TQ4_1S quantizer (whole blocks), bit-equal to [`quantize_tq4_1s_ref`]: the AVX2 cross-block
/// kernel where the CPU has AVX2, else the portable one.
pub fn quantize_tq4_1s(src: &[f32], out: &mut [u8]) {
    if quantize_tq4_1s_avx2(src, out).is_none() {
        quantize_tq4_1s_portable(src, out)
    }
}

/// TQ3_1S quantizer (whole blocks), bit-equal to [`quantize_tq3_1s_ref`].
pub fn quantize_tq3_1s(src: &[f32], out: &mut [u8]) {
    if quantize_tq3_1s_avx2(src, out).is_none() {
        quantize_tq3_1s_portable(src, out)
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::{varied_block, Rng};
    use super::*;
    use crate::math::signs::tq_block_signs;

    #[test]
    fn signs_match_math_module() {
        assert_eq!(SIGNS, tq_block_signs());
        let expect: [f32; QK] = std::array::from_fn(|i| INV_SQRT32 * tq_block_signs()[i]);
        assert_eq!(SIGNS_SCALED, expect);
    }

    #[test]
    fn fast_tq4_matches_ref_random_blocks() {
        let mut r = Rng(3);
        let n_blocks = 50_000;
        let mut src = Vec::with_capacity(n_blocks * QK);
        for _ in 0..n_blocks {
            src.extend_from_slice(&varied_block(&mut r));
        }
        // Extremes: f16 overflow, f32 overflow of the sum of squares, subnormals.
        for s in [6e4f32, 65504.0, 1e6, 1e20, 1e-40, 1e-45] {
            src.extend((0..QK).map(|i| if i % 3 == 0 { -s } else { s }));
        }
        let nb = src.len() / QK;
        let (mut a, mut b) = (vec![0u8; nb * TQ4_BYTES], vec![0u8; nb * TQ4_BYTES]);
        quantize_tq4_1s(&src, &mut a);
        quantize_tq4_1s_ref(&src, &mut b);
        for k in 0..nb {
            let s = k * TQ4_BYTES..(k + 1) * TQ4_BYTES;
            assert_eq!(a[s.clone()], b[s], "block {k}");
        }
        let (mut da, mut db) = (vec![0f32; nb * QK], vec![0f32; nb * QK]);
        dequantize_tq4_1s(&a, &mut da);
        dequantize_tq4_1s_ref(&a, &mut db);
        for (j, (x, y)) in da.iter().zip(&db).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "value {j}"
            );
        }
    }

    #[test]
    fn fast_tq4_dequant_matches_ref_on_random_bytes() {
        let mut r = Rng(4);
        let mut bytes = vec![0u8; 20_000 * TQ4_BYTES];
        for b in bytes.iter_mut() {
            *b = r.next() as u8;
        }
        let (mut da, mut db) = (vec![0f32; 20_000 * QK], vec![0f32; 20_000 * QK]);
        dequantize_tq4_1s(&bytes, &mut da);
        dequantize_tq4_1s_ref(&bytes, &mut db);
        for (j, (x, y)) in da.iter().zip(&db).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "value {j}"
            );
        }
    }

    #[test]
    fn fast_tq3_dequant_matches_ref_on_random_bytes() {
        let mut r = Rng(25);
        let n = 20_000;
        let mut bytes = vec![0u8; n * TQ3_BYTES];
        for b in bytes.iter_mut() {
            *b = r.next() as u8;
        }
        let (mut da, mut db) = (vec![0f32; n * QK], vec![0f32; n * QK]);
        dequantize_tq3_1s(&bytes, &mut da);
        dequantize_tq3_1s_ref(&bytes, &mut db);
        for (j, (x, y)) in da.iter().zip(&db).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "value {j}"
            );
        }
    }

    /// Ad-hoc throughput, best of 5 runs (run:
    /// `cargo test --release --lib types::tq::tests::throughput -- --ignored --nocapture`;
    /// `cargo bench --bench tq` is the fuller benchmark).
    #[test]
    #[ignore]
    fn throughput() {
        use std::time::Instant;
        let mut r = Rng(9);
        let nb = 50_000;
        let n = (nb * QK) as f64;
        let src: Vec<f32> = (0..nb * QK).map(|_| r.gauss() as f32).collect();
        let mut q = vec![0u8; nb * TQ4_BYTES];
        let mut o = vec![0f32; nb * QK];
        let best = |f: &mut dyn FnMut()| {
            (0..5)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let s = best(&mut || quantize_tq4_1s_ref(&src, &mut q));
        eprintln!("tq4_1s quantize ref:    {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || quantize_tq4_1s(&src, &mut q));
        eprintln!("tq4_1s quantize fast:   {:.1} M elements/s", n / s / 1e6);
        let mut q3b = vec![0u8; nb * TQ3_BYTES];
        let s = best(&mut || quantize_tq3_1s_ref(&src, &mut q3b));
        eprintln!("tq3_1s quantize ref:    {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || quantize_tq3_1s(&src, &mut q3b));
        eprintln!("tq3_1s quantize fast:   {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || dequantize_tq4_1s_ref(&q, &mut o));
        eprintln!("tq4_1s dequantize ref:  {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || dequantize_tq4_1s(&q, &mut o));
        eprintln!("tq4_1s dequantize fast: {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || dequantize_tq3_1s_ref(&q3b, &mut o));
        eprintln!("tq3_1s dequantize ref:  {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || dequantize_tq3_1s(&q3b, &mut o));
        eprintln!("tq3_1s dequantize fast: {:.1} M elements/s", n / s / 1e6);
    }
}
