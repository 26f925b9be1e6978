//! IQ4_NL / IQ4_XS: 4-bit indices into ggml's fixed non-linear table `kvalues_iq4nl`,
//! dequantization only.
//!
//! | type | values | bytes | layout |
//! |---|---|---|---|
//! | IQ4_NL | 32 | 18 | `d: f16`, `qs[16]` (low nibbles = values 0..16, high = 16..32) |
//! | IQ4_XS | 256 | 136 | `d: f16`, `scales_h: u16`, `scales_l[4]`, `qs[128]` (8 sub-blocks of 32) |
//!
//! IQ4_XS sub-block `ib` has the 6-bit scale `ls = (scales_l[ib/2] >> 4*(ib%2)) & 15 |
//! ((scales_h >> 2*ib) & 3) << 4`, factor `d * (ls - 32)`, as ggml's `dequantize_row_iq4_xs`.

use crate::types::float::f16_bits_to_f32;

/// ggml's `kvalues_iq4nl`.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The same table as f32 (exact), for the kernels.
const KV_F32: [f32; 16] = {
    let mut t = [0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = KVALUES_IQ4NL[i] as f32;
        i += 1;
    }
    t
};

pub const QK4_NL: usize = 32;
pub const IQ4_NL_BYTES: usize = 18;
pub const QK_K: usize = 256;
pub const IQ4_XS_BYTES: usize = 136;

// Layouts (the table above).
const _: () = assert!(IQ4_NL_BYTES == size_of::<u16>() + QK4_NL / 2);
const _: () = assert!(IQ4_XS_BYTES == 2 * size_of::<u16>() + QK_K / 64 + QK_K / 2);

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

pub fn dequantize_iq4_nl(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(IQ4_NL_BYTES)
        .zip(out.chunks_exact_mut(QK4_NL))
    {
        let d = f16_at(b, 0);
        let qs = &b[2..18];
        for j in 0..QK4_NL / 2 {
            y[j] = d * KV_F32[(qs[j] & 0x0F) as usize];
            y[j + QK4_NL / 2] = d * KV_F32[(qs[j] >> 4) as usize];
        }
    }
}

pub fn dequantize_iq4_xs(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(IQ4_XS_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        let scales_l = &b[4..8];
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
            let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) as i32
                | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
            let dl = d * (ls - 32) as f32;
            for j in 0..16 {
                y[j] = dl * KV_F32[(qs[j] & 0x0F) as usize];
                y[j + 16] = dl * KV_F32[(qs[j] >> 4) as usize];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq4_nl_table_lookup() {
        let mut b = [0u8; IQ4_NL_BYTES];
        b[0..2].copy_from_slice(&0x3800u16.to_le_bytes()); // 0.5
        b[2] = 0xF0;
        let mut y = [0f32; QK4_NL];
        dequantize_iq4_nl(&b, &mut y);
        assert_eq!(y[0], -63.5);
        assert_eq!(y[16], 56.5);
        assert_eq!(y[1], -63.5);
    }

    #[test]
    fn iq4_xs_scales() {
        let mut b = [0u8; IQ4_XS_BYTES];
        b[0..2].copy_from_slice(&0x3C00u16.to_le_bytes()); // 1.0
                                                           // sub-block 1: ls = 0x1 | (2 << 4) = 33 -> factor 1; sub-block 0: ls = 0 -> -32.
        b[2..4].copy_from_slice(&(2u16 << 2).to_le_bytes());
        b[4] = 0x10;
        for q in &mut b[8..] {
            *q = 0x88; // value 1
        }
        let mut y = [0f32; QK_K];
        dequantize_iq4_xs(&b, &mut y);
        assert!(y[..32].iter().all(|&v| v == -32.0));
        assert!(y[32..64].iter().all(|&v| v == 1.0));
        assert!(y[64..].iter().all(|&v| v == -32.0));
    }
}
