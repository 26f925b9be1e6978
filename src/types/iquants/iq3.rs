//! IQ3_XXS, IQ3_S: 4 values per grid row, two rows per sign byte, as ggml's
//! `dequantize_row_iq3_*` (same operation order, so the same f32 bits).
//!
//! * IQ3_XXS: levels 4, 12, … 62; `y = d · (0.5 + scale) · 0.5 · grid · sign`, signs through
//!   `ksigns_iq2xs` like IQ2_XXS.
//! * IQ3_S: levels 1, 3, … 15; 9-bit grid indices (`qh` holds bit 8), explicit sign bits,
//!   `y = d · (1 + 2 · scale) · grid · sign`.

use super::{expand, grids, sign, KSIGNS, QK_K};
use crate::types::float::f16_at;

const F16: usize = size_of::<u16>();

/// `block_iq3_xxs`: `d: f16`, `qs[96]` (64 grid indices, then 8 × u32 of signs and scale).
pub(crate) const IQ3_XXS_BYTES: usize = 98;
const _: () = assert!(IQ3_XXS_BYTES == F16 + 3 * QK_K / 8);

/// `block_iq3_s`: `d: f16`, `qs[64]`, `qh[8]`, `signs[32]`, `scales[4]`.
pub(crate) const IQ3_S_BYTES: usize = 110;
const _: () = assert!(IQ3_S_BYTES == F16 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64);

static GRID_XXS: [[i8; 4]; 256] = expand(
    &grids::IQ3XXS_PACKED,
    &[0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e],
    3,
);
static GRID_S: [[i8; 4]; 512] = expand(
    &grids::IQ3S_PACKED,
    &[0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f],
    3,
);

/// Two grid rows (8 values) under one sign byte.
#[inline(always)]
fn rows(y: &mut [f32], db: f32, g1: &[i8; 4], g2: &[i8; 4], signs: u8) {
    for j in 0..4 {
        y[j] = db * g1[j] as f32 * sign(signs, j);
        y[j + 4] = db * g2[j] as f32 * sign(signs, j + 4);
    }
}

pub(crate) fn dequantize_iq3_xxs(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(IQ3_XXS_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let qs = &b[F16..F16 + QK_K / 4];
        let ss = &b[F16 + QK_K / 4..];
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let aux =
                u32::from_le_bytes([ss[4 * ib], ss[4 * ib + 1], ss[4 * ib + 2], ss[4 * ib + 3]]);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            let q = &qs[8 * ib..8 * ib + 8];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                let (g1, g2) = (
                    &GRID_XXS[q[2 * l] as usize],
                    &GRID_XXS[q[2 * l + 1] as usize],
                );
                rows(y, db, g1, g2, signs);
            }
        }
    }
}

pub(crate) fn dequantize_iq3_s(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(IQ3_S_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let qs = &b[F16..F16 + QK_K / 4];
        let qh = &b[F16 + QK_K / 4..F16 + QK_K / 4 + QK_K / 32];
        let signs = &b[F16 + QK_K / 4 + QK_K / 32..F16 + QK_K / 4 + QK_K / 32 + QK_K / 8];
        let scales = &b[IQ3_S_BYTES - QK_K / 64..];
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let s = (scales[ib / 2] >> (4 * (ib % 2))) & 15;
            let db = d * (1 + 2 * s as i32) as f32;
            let (q, h) = (&qs[8 * ib..8 * ib + 8], qh[ib] as usize);
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                // Bit 8 of grid index k (of this sub-block's 8) is bit k of qh[ib].
                let i1 = q[2 * l] as usize | (h << (8 - 2 * l) & 256);
                let i2 = q[2 * l + 1] as usize | (h << (7 - 2 * l) & 256);
                rows(y, db, &GRID_S[i1], &GRID_S[i2], signs[4 * ib + l]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of ggml-common.h's `iq3xxs_grid` / `iq3s_grid` (u32, byte j = value j).
    #[test]
    fn grids_match_ggml_literals() {
        let pack = |r: &[i8; 4]| r.iter().rev().fold(0u32, |a, &v| a << 8 | v as u8 as u32);
        assert_eq!(pack(&GRID_XXS[0]), 0x04040404);
        assert_eq!(pack(&GRID_XXS[100]), 0x14040c1c);
        assert_eq!(pack(&GRID_XXS[255]), 0x3e341c04);
        assert_eq!(pack(&GRID_S[0]), 0x01010101);
        assert_eq!(pack(&GRID_S[300]), 0x07030503);
        assert_eq!(pack(&GRID_S[511]), 0x0f0f0101);
    }

    /// By hand: IQ3_S with d = 0.5, sub-block 1 scale 2 → db = 2.5; its first grid index is
    /// 0x2c | 256 = 300 (0x07030503: values 3, 5, 3, 7) with signs 0b0000_0101.
    #[test]
    fn iq3_s_hand_block() {
        let mut b = [0u8; IQ3_S_BYTES];
        b[0..2].copy_from_slice(&0x3800u16.to_le_bytes());
        b[2 + 8] = 0x2c; // sub-block 1, grid index 0 (low 8 bits)
        b[66 + 1] = 1; // qh[1] bit 0: index 0 of sub-block 1 gets bit 8
        b[74 + 4] = 0b101; // signs of sub-block 1, row 0
        b[106] = 2 << 4; // scales[0] high nibble: sub-block 1
        let mut y = [0f32; QK_K];
        dequantize_iq3_s(&b, &mut y);
        assert_eq!(y[32..36], [-7.5, 12.5, -7.5, 17.5]);
        assert_eq!(y[36], 2.5); // grid index 0 → 0x01010101
        assert!(y[..32].iter().all(|&v| v == 0.5)); // scale 0 → db = d
    }
}
