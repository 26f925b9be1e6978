//! IQ1_S, IQ1_M: 8 values per row of `iq1s_grid` (levels −1, 0, 1), shifted by ±1/8
//! (`IQ1S_DELTA`) and scaled by `d · (2 · s + 1)` with a 3-bit `s`, as ggml's
//! `dequantize_row_iq1_*` (same operation order, so the same f32 bits).
//!
//! IQ1_M has no `d` field: the f16 bits of `d` sit in the top nibbles of its four u16 scale words
//! (word w's bits 12-15 are bits 4w..4w+4 of `d`).

use super::{expand, grids, QK_K};
use crate::types::float::{f16_at, f16_bits_to_f32};

const F16: usize = size_of::<u16>();
/// ggml's `IQ1S_DELTA` (IQ1_M uses the same value).
const DELTA: f32 = 0.125;

/// `block_iq1_s`: `d: f16`, `qs[32]`, `qh: [u16; 8]`.
pub(crate) const IQ1_S_BYTES: usize = 50;
const _: () = assert!(IQ1_S_BYTES == F16 + QK_K / 8 + QK_K / 32 * size_of::<u16>());

/// `block_iq1_m`: `qs[32]`, `qh[16]`, `scales[8]` (the f16 scale is spread over the scales).
pub(crate) const IQ1_M_BYTES: usize = 56;
const _: () = assert!(IQ1_M_BYTES == QK_K / 8 + QK_K / 16 + QK_K / 32);

static GRID: [[i8; 8]; 2048] = expand(&grids::IQ1S_PACKED, &[-1, 0, 1], 2);

#[inline(always)]
fn row(y: &mut [f32], dl: f32, grid: &[i8; 8], delta: f32) {
    for j in 0..8 {
        y[j] = dl * (grid[j] as f32 + delta);
    }
}

#[inline(always)]
fn delta(negative: bool) -> f32 {
    if negative {
        -DELTA
    } else {
        DELTA
    }
}

pub(crate) fn dequantize_iq1_s(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(IQ1_S_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let qs = &b[F16..F16 + QK_K / 8];
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let o = F16 + QK_K / 8 + 2 * ib;
            let qh = u16::from_le_bytes([b[o], b[o + 1]]);
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let dt = delta(qh & 0x8000 != 0);
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let idx = qs[4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
                row(y, dl, &GRID[idx], dt);
            }
        }
    }
}

pub(crate) fn dequantize_iq1_m(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(IQ1_M_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let qs = &b[..QK_K / 8];
        let qh = &b[QK_K / 8..QK_K / 8 + QK_K / 16];
        let o = QK_K / 8 + QK_K / 16;
        let sc: [u16; 4] =
            std::array::from_fn(|w| u16::from_le_bytes([b[o + 2 * w], b[o + 2 * w + 1]]));
        let d = f16_bits_to_f32(
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000),
        );
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let s = sc[ib / 2] >> (6 * (ib % 2));
            let dl = [
                d * (2 * (s & 7) + 1) as f32,
                d * (2 * ((s >> 3) & 7) + 1) as f32,
            ];
            let (h0, h1) = (qh[2 * ib] as usize, qh[2 * ib + 1] as usize);
            // Each qh byte: grid bits 8-10 and the delta sign of two rows (low, high nibble).
            let idx = [
                qs[4 * ib] as usize | (h0 << 8 & 0x700),
                qs[4 * ib + 1] as usize | (h0 << 4 & 0x700),
                qs[4 * ib + 2] as usize | (h1 << 8 & 0x700),
                qs[4 * ib + 3] as usize | (h1 << 4 & 0x700),
            ];
            let dt = [
                h0 & 0x08 != 0,
                h0 & 0x80 != 0,
                h1 & 0x08 != 0,
                h1 & 0x80 != 0,
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                row(y, dl[l / 2], &GRID[idx[l]], delta(dt[l]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of ggml-common.h's `iq1s_grid` (u64 of int8, byte j = value j).
    #[test]
    fn grid_matches_ggml_literals() {
        let pack = |r: &[i8; 8]| r.iter().rev().fold(0u64, |a, &v| a << 8 | v as u8 as u64);
        assert_eq!(pack(&GRID[0]), 0xffffffffffffffff);
        assert_eq!(pack(&GRID[1]), 0xffffffffffffff01);
        assert_eq!(pack(&GRID[1000]), 0x00000000ffff00ff);
        assert_eq!(pack(&GRID[2047]), 0x0101010101010101);
    }

    /// By hand: IQ1_M with d = 2 (f16 0x4000: nibbles 0, 0, 0, 4 → only word 3 carries bits),
    /// sub-block 0 first scale 1 → dl = 2 · 3 = 6; row 0 is grid row 2047 (all +1) with a
    /// negative delta: 6 · (1 − 0.125) = 5.25. Row 1: grid row 0 (all −1), positive delta:
    /// 6 · (−1 + 0.125) = −5.25.
    #[test]
    fn iq1_m_hand_block() {
        let mut b = [0u8; IQ1_M_BYTES];
        b[0] = 0xff; // qs[0]: low 8 bits of 2047
        b[32] = 0x07 | 0x08; // qh[0]: row 0 bits 8-10 = 7, row 0 delta negative
        b[48] = 1; // sc[0] bits 0-2: scale 1 for rows 0-1 of sub-block 0
        b[54..56].copy_from_slice(&0x4000u16.to_le_bytes()); // sc[3]: d's top nibble
        let mut y = [0f32; QK_K];
        dequantize_iq1_m(&b, &mut y);
        assert!(y[..8].iter().all(|&v| v == 5.25), "{:?}", &y[..8]);
        assert!(y[8..16].iter().all(|&v| v == -5.25), "{:?}", &y[8..16]);
        // Rows 2-3 of sub-block 0: scale 0 → dl = 2; grid row 0, delta +: 2 · (−0.875).
        assert!(y[16..32].iter().all(|&v| v == -1.75));
    }
}
