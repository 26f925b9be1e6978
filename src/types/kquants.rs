//! k-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-value super-blocks), dequantization only.
//!
//! Block layouts (little-endian, as ggml's `block_q*_K` structs, `QK_K = 256`):
//!
//! | type | bytes | layout |
//! |---|---|---|
//! | Q2_K | 84 | `scales[16]` (lo nibble scale, hi nibble min), `qs[64]`, `d: f16`, `dmin: f16` |
//! | Q3_K | 110 | `hmask[32]`, `qs[64]`, `scales[12]` (16 packed 6-bit), `d: f16` |
//! | Q4_K | 144 | `d: f16`, `dmin: f16`, `scales[12]` (8 scales + 8 mins, 6-bit), `qs[128]` |
//! | Q5_K | 176 | `d: f16`, `dmin: f16`, `scales[12]`, `qh[32]`, `qs[128]` |
//! | Q6_K | 210 | `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d: f16` |
//!
//! Each kernel follows ggml's `dequantize_row_q*_K` in f32 operation by operation: the sub-block
//! factor is formed first (`d * sc`, `dmin * m`), then `factor * q - min`, no fused multiply-add.

use crate::types::float::f16_bits_to_f32;

/// Values per super-block.
pub const QK_K: usize = 256;
pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

pub fn dequantize_q2_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q2_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let scales = &b[0..16];
        let d = f16_at(b, 80);
        let min = f16_at(b, 82);
        // 16 groups of 16 values, each with its own scale byte (lo nibble scale, hi nibble min).
        // Group k: 128-value half k/8 (32 qs bytes), 2-bit field (k%8)/2, byte range 16*(k%2).
        for (k, y) in y.chunks_exact_mut(16).enumerate() {
            let q0 = 16 + 32 * (k / 8) + 16 * (k % 2);
            let q = &b[q0..q0 + 16];
            let shift = 2 * ((k % 8) / 2);
            let sc = scales[k];
            let dl = d * (sc & 0x0F) as f32;
            let ml = min * (sc >> 4) as f32;
            for (o, &ql) in y.iter_mut().zip(q) {
                *o = dl * ((ql >> shift) & 3) as f32 - ml;
            }
        }
    }
}

/// The 16 signed 6-bit scales of a Q3_K block: low 4 bits from `s[k % 8]` (low nibble for
/// k < 8, high nibble after), high 2 bits from `s[8 + k % 4]` at bit `2 * (k / 4)`, minus 32.
#[inline(always)]
fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let lo = if k < 8 { s[k] & 0x0F } else { s[k - 8] >> 4 };
        let hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        *o = (lo | (hi << 4)) as i32 - 32;
    }
    out
}

pub fn dequantize_q3_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q3_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let hmask = &b[0..32];
        let scales = q3_k_scales(&b[96..108]);
        let d_all = f16_at(b, 108);
        // Group k of 16 values: as Q2_K for the low 2 bits; the high bit is bit (k/2) of the
        // hmask bytes 16*(k%2)..; a clear bit subtracts 4.
        for (k, y) in y.chunks_exact_mut(16).enumerate() {
            let q0 = 32 + 32 * (k / 8) + 16 * (k % 2);
            let q = &b[q0..q0 + 16];
            let hm = &hmask[16 * (k % 2)..16 * (k % 2) + 16];
            let shift = 2 * ((k % 8) / 2);
            let m = 1u8 << (k / 2);
            let dl = d_all * scales[k] as f32;
            for ((o, &ql), &h) in y.iter_mut().zip(q).zip(hm) {
                let v = ((ql >> shift) & 3) as i32 - if h & m != 0 { 0 } else { 4 };
                *o = dl * v as f32;
            }
        }
    }
}

/// ggml's `get_scale_min_k4`: scale and min `j` (0..8) of a Q4_K/Q5_K block.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub fn dequantize_q4_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q4_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        for (g, y) in y.chunks_exact_mut(64).enumerate() {
            let q = &b[16 + 32 * g..16 + 32 * g + 32];
            let (sc, m) = scale_min_k4(2 * g, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = scale_min_k4(2 * g + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0x0F) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

pub fn dequantize_q5_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q5_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        let qh = &b[16..48];
        for (g, y) in y.chunks_exact_mut(64).enumerate() {
            let ql = &b[48 + 32 * g..48 + 32 * g + 32];
            let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
            let (sc, m) = scale_min_k4(2 * g, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = scale_min_k4(2 * g + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                let v1 = (ql[l] & 0x0F) + if qh[l] & u1 != 0 { 16 } else { 0 };
                let v2 = (ql[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * v1 as f32 - m1;
                y[l + 32] = d2 * v2 as f32 - m2;
            }
        }
    }
}

pub fn dequantize_q6_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q6_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 208);
        for (h, y) in y.chunks_exact_mut(128).enumerate() {
            let ql = &b[64 * h..64 * h + 64];
            let qh = &b[128 + 32 * h..128 + 32 * h + 32];
            let sc = &b[192 + 8 * h..192 + 8 * h + 8];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                // `d * sc[is] * q` in C: (d * sc) first, then * q.
                y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q3_k_scale_unpacking_matches_ggml_aux_trick() {
        // ggml unpacks the 12 bytes with four u32 words and masks; check our per-index formula
        // against that word arithmetic on a few byte patterns.
        for seed in 0u32..64 {
            let s: Vec<u8> = (0..12u32)
                .map(|i| (i.wrapping_mul(97) ^ seed.wrapping_mul(131)) as u8)
                .collect();
            let mut aux = [0u32; 4];
            for k in 0..3 {
                aux[k] = u32::from_le_bytes([s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]]);
            }
            let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
            let tmp = aux[2];
            aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
            aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
            aux[0] = (aux[0] & k2) | ((tmp & k1) << 4);
            aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
            let bytes: Vec<i32> = aux
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .map(|b| b as i8 as i32 - 32)
                .collect();
            assert_eq!(q3_k_scales(&s).to_vec(), bytes);
        }
    }

    #[test]
    fn q4_k_simple_block() {
        // d = 1, dmin = 0.5, scale 0 = 2, min 0 = 1, all nibbles 3 -> first 32 values 2*3 - 0.5.
        let mut b = [0u8; Q4_K_BYTES];
        b[0..2].copy_from_slice(&0x3C00u16.to_le_bytes());
        b[2..4].copy_from_slice(&0x3800u16.to_le_bytes());
        b[4] = 2;
        b[8] = 1;
        for q in &mut b[16..] {
            *q = 0x33;
        }
        let mut y = [0f32; QK_K];
        dequantize_q4_k(&b, &mut y);
        assert!(y[..32].iter().all(|&v| v == 5.5));
        assert!(y[32..].iter().all(|&v| v == 0.0));
    }
}
