//! F32 / F16 / BF16 "block" kernels (block size 1), via `half`'s slice conversions.
//! f32 → f16/bf16 rounds to nearest-even, as ggml does (NaN is rejected before reaching here).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

pub fn dequantize_f32(blocks: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(blocks.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

pub fn quantize_f32(src: &[f32], out: &mut [u8]) {
    for (c, v) in out.chunks_exact_mut(4).zip(src) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

const CHUNK: usize = 1024;

pub fn dequantize_f16(blocks: &[u8], out: &mut [f32]) {
    let mut tmp = [f16::ZERO; CHUNK];
    for (o, b) in out.chunks_mut(CHUNK).zip(blocks.chunks(CHUNK * 2)) {
        let t = &mut tmp[..o.len()];
        for (h, c) in t.iter_mut().zip(b.chunks_exact(2)) {
            *h = f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
        }
        t.convert_to_f32_slice(o);
    }
}

pub fn quantize_f16(src: &[f32], out: &mut [u8]) {
    let mut tmp = [f16::ZERO; CHUNK];
    for (s, o) in src.chunks(CHUNK).zip(out.chunks_mut(CHUNK * 2)) {
        let t = &mut tmp[..s.len()];
        t.convert_from_f32_slice(s);
        for (h, c) in t.iter().zip(o.chunks_exact_mut(2)) {
            c.copy_from_slice(&h.to_bits().to_le_bytes());
        }
    }
}

pub fn dequantize_bf16(blocks: &[u8], out: &mut [f32]) {
    let mut tmp = [bf16::ZERO; CHUNK];
    for (o, b) in out.chunks_mut(CHUNK).zip(blocks.chunks(CHUNK * 2)) {
        let t = &mut tmp[..o.len()];
        for (h, c) in t.iter_mut().zip(b.chunks_exact(2)) {
            *h = bf16::from_bits(u16::from_le_bytes([c[0], c[1]]));
        }
        t.convert_to_f32_slice(o);
    }
}

pub fn quantize_bf16(src: &[f32], out: &mut [u8]) {
    let mut tmp = [bf16::ZERO; CHUNK];
    for (s, o) in src.chunks(CHUNK).zip(out.chunks_mut(CHUNK * 2)) {
        let t = &mut tmp[..s.len()];
        t.convert_from_f32_slice(s);
        for (h, c) in t.iter().zip(o.chunks_exact_mut(2)) {
            c.copy_from_slice(&h.to_bits().to_le_bytes());
        }
    }
}

/// Scalar f16 helpers used by the block formats (IEEE binary16, round-to-nearest-even).
#[inline]
pub fn f16_bits_to_f32(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

#[inline]
pub fn f32_to_f16_bits(v: f32) -> u16 {
    f16::from_f32(v).to_bits()
}

/// The little-endian f16 at byte `i` of a block, as f32 (exact).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_and_rounding() {
        let src = [0.0f32, -0.0, 1.0, 65504.0, 1e-8, 0.1, -3.5, 70000.0];
        let mut b = vec![0u8; src.len() * 2];
        quantize_f16(&src, &mut b);
        let mut back = vec![0f32; src.len()];
        dequantize_f16(&b, &mut back);
        for (s, r) in src.iter().zip(&back) {
            assert_eq!(*r, f16::from_f32(*s).to_f32());
        }
        assert_eq!(back[7], f32::INFINITY);
        assert_eq!(back[1].to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
        let src = [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0];
        let mut b = vec![0u8; 4];
        quantize_bf16(&src, &mut b);
        let mut back = [0f32; 2];
        dequantize_bf16(&b, &mut back);
        assert_eq!(back, [1.0, 1.0 + 4.0 / 256.0]);
    }
}
