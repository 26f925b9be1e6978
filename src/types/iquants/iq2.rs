//! IQ2_XXS, IQ2_XS, IQ2_S: 8 values per grid row (levels 8, 25, 43), one sign byte per row, a
//! 4-bit scale per 16 or 32 values: `y = d · (0.5 + scale) · 0.25 · grid · sign`, as ggml's
//! `dequantize_row_iq2_*` (same operation order, so the same f32 bits).

use super::{expand, grids, sign, KSIGNS, QK_K};
use crate::types::float::f16_at;

const F16: usize = size_of::<u16>();
pub(super) const LEVELS: [i8; 3] = [0x08, 0x19, 0x2b];

/// `block_iq2_xxs`: `d: f16`, `qs: [u16; 32]`.
pub(crate) const IQ2_XXS_BYTES: usize = 66;
const _: () = assert!(IQ2_XXS_BYTES == F16 + QK_K / 8 * size_of::<u16>());

/// `block_iq2_xs`: `d: f16`, `qs: [u16; 32]`, `scales[8]`.
pub(crate) const IQ2_XS_BYTES: usize = 74;
const _: () = assert!(IQ2_XS_BYTES == F16 + QK_K / 8 * size_of::<u16>() + QK_K / 32);

/// `block_iq2_s`: `d: f16`, `qs[64]` (32 grid bytes, then 32 sign bytes), `qh[8]`, `scales[8]`.
pub(crate) const IQ2_S_BYTES: usize = 82;
const _: () = assert!(IQ2_S_BYTES == F16 + QK_K / 4 + QK_K / 32 + QK_K / 32);

static GRID_XXS: [[i8; 8]; 256] = expand(&grids::IQ2XXS_PACKED, &LEVELS, 2);
static GRID_XS: [[i8; 8]; 512] = expand(&grids::IQ2XS_PACKED, &LEVELS, 2);
static GRID_S: [[i8; 8]; 1024] = expand(&grids::IQ2S_PACKED, &LEVELS, 2);

/// `db · grid[j] · sign_j` for the 8 values of one grid row.
#[inline(always)]
fn row(y: &mut [f32], db: f32, grid: &[i8; 8], signs: u8) {
    for j in 0..8 {
        y[j] = db * grid[j] as f32 * sign(signs, j);
    }
}

/// Sub-block scale factor `d · (0.5 + s) · 0.25`, in ggml's order.
#[inline(always)]
fn db(d: f32, s: u32) -> f32 {
    d * (0.5 + s as f32) * 0.25
}

pub(crate) fn dequantize_iq2_xxs(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(IQ2_XXS_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            // Two u32: four grid indices (bytes), then 4 × 7 sign bits and the scale on top.
            let q = &b[F16 + 8 * ib..F16 + 8 * ib + 8];
            let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
            let db = db(d, aux >> 28);
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                row(y, db, &GRID_XXS[q[l] as usize], signs);
            }
        }
    }
}

pub(crate) fn dequantize_iq2_xs(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(IQ2_XS_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let scales = &b[F16 + QK_K / 4..];
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let dbs = [
                db(d, (scales[ib] & 15) as u32),
                db(d, (scales[ib] >> 4) as u32),
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let o = F16 + 2 * (4 * ib + l);
                let q = u16::from_le_bytes([b[o], b[o + 1]]);
                let signs = KSIGNS[(q >> 9) as usize];
                row(y, dbs[l / 2], &GRID_XS[(q & 511) as usize], signs);
            }
        }
    }
}

pub(crate) fn dequantize_iq2_s(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(IQ2_S_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let qs = &b[F16..F16 + QK_K / 8];
        let signs = &b[F16 + QK_K / 8..F16 + QK_K / 4];
        let qh = &b[F16 + QK_K / 4..F16 + QK_K / 4 + QK_K / 32];
        let scales = &b[F16 + QK_K / 4 + QK_K / 32..];
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let dbs = [
                db(d, (scales[ib] & 15) as u32),
                db(d, (scales[ib] >> 4) as u32),
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                // Grid index bits 8-9 of row l are bits 2l, 2l+1 of qh[ib].
                let idx = qs[4 * ib + l] as usize | ((qh[ib] as usize) << (8 - 2 * l) & 0x300);
                row(y, dbs[l / 2], &GRID_S[idx], signs[4 * ib + l]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of ggml-common.h's `iq2xxs_grid` / `iq2xs_grid` / `iq2s_grid` (u64, byte j = value
    /// j): the generated tables must give back ggml's literals.
    #[test]
    fn grids_match_ggml_literals() {
        let pack = |r: &[i8; 8]| r.iter().rev().fold(0u64, |a, &v| a << 8 | v as u8 as u64);
        assert_eq!(pack(&GRID_XXS[0]), 0x0808080808080808);
        assert_eq!(pack(&GRID_XXS[1]), 0x080808080808082b);
        assert_eq!(pack(&GRID_XXS[19]), 0x080808082b082b2b);
        assert_eq!(pack(&GRID_XXS[255]), 0x2b2b2b1908081908);
        assert_eq!(pack(&GRID_XS[0]), 0x0808080808080808);
        assert_eq!(pack(&GRID_XS[300]), 0x1908190808191908);
        assert_eq!(pack(&GRID_XS[511]), 0x2b2b2b2b2b2b2b2b);
        assert_eq!(pack(&GRID_S[0]), 0x0808080808080808);
        assert_eq!(pack(&GRID_S[517]), 0x1908081919190808);
        assert_eq!(pack(&GRID_S[1023]), 0x2b2b2b2b2b2b2b2b);
    }

    /// A block computed by hand: d = 1, sub-block 0 scale 3 → db = 3.5 / 4 = 0.875, row 0 is grid
    /// row 1 (0x080808080808082b: value 0 is 43, the rest 8) with sign index 1 (ksigns 129:
    /// values 0 and 7 negative).
    #[test]
    fn iq2_xxs_hand_block() {
        let mut b = [0u8; IQ2_XXS_BYTES];
        b[0..2].copy_from_slice(&0x3C00u16.to_le_bytes());
        b[2] = 1; // row 0: grid row 1
        b[6..10].copy_from_slice(&(3u32 << 28 | 1).to_le_bytes());
        let mut y = [0f32; QK_K];
        dequantize_iq2_xxs(&b, &mut y);
        assert_eq!(y[0], -0.875 * 43.0);
        assert_eq!(y[1..7], [7.0; 6]);
        assert_eq!(y[7], -7.0);
        // Rows 1..3 of sub-block 0: grid row 0, sign index 0 → all +8 · db.
        assert!(y[8..32].iter().all(|&v| v == 7.0));
        // Sub-block 1: scale 0 → db = 0.125.
        assert!(y[32..64].iter().all(|&v| v == 1.0));
    }
}
