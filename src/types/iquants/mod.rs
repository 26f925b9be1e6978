//! ggml's IQ types: 4-bit indices into the non-linear table
//! `kvalues_iq4nl` (IQ4_NL, IQ4_XS) and the grid types, whose 4 or 8 values come from one row of
//! a fixed table of lattice points (IQ2_XXS … IQ1_M). Layouts are ggml's `block_*` structs
//! (`ggml-common.h`); every value is `d · scale · grid · sign` in ggml's operation order, so the
//! f32 results are bit-identical with ggml's `dequantize_row_*` and gguf-py's numpy kernels
//! (`tests/quants_oracle.rs`).
//!
//! | type | values | bytes | layout |
//! |---|---|---|---|
//! | IQ4_NL | 32 | 18 | `d: f16`, `qs[16]` (low nibbles = values 0..16, high = 16..32) |
//! | IQ4_XS | 256 | 136 | `d: f16`, `scales_h: u16`, `scales_l[4]`, `qs[128]` (8 sub-blocks of 32) |
//! | IQ2_XXS | 256 | 66 | `d: f16`, 8 × (4 grid bytes, u32 of 4 × 7 sign bits + 4-bit scale) |
//! | IQ2_XS | 256 | 74 | `d: f16`, `qs: [u16; 32]` (9-bit grid index, 7-bit sign index), `scales[8]` |
//! | IQ2_S | 256 | 82 | `d: f16`, `qs[32]`, `signs[32]`, `qh[8]` (grid bits 8-9), `scales[8]` |
//! | IQ3_XXS | 256 | 98 | `d: f16`, `qs[64]` (grid indices), 8 × u32 (4 × 7 sign bits + 4-bit scale) |
//! | IQ3_S | 256 | 110 | `d: f16`, `qs[64]`, `qh[8]` (grid bit 8), `signs[32]`, `scales[4]` |
//! | IQ1_S | 256 | 50 | `d: f16`, `qs[32]`, `qh: [u16; 8]` (3-bit scale, delta sign, grid bits 8-10) |
//! | IQ1_M | 256 | 56 | `qs[32]`, `qh[16]`, `scales: [u16; 4]` (3-bit scales; f16 `d` in their top nibbles) |
//!
//! IQ4_XS sub-block `ib` has the 6-bit scale `ls = (scales_l[ib/2] >> 4*(ib%2)) & 15 |
//! ((scales_h >> 2*ib) & 3) << 4`, factor `d * (ls - 32)`, as ggml's `dequantize_row_iq4_xs`.
//!
//! IQ4_NL and IQ4_XS are also written (`iq4.rs`: llama-quantize's encoders, byte for byte; the
//! importance-weighted and LDLQ encoders see them as grids in `types::grid`). IQ3_XXS, IQ3_S,
//! IQ1_S and IQ1_M are written by llama.cpp's encoders, byte for byte with and without an imatrix
//! (`iq3_quant.rs`, `iq1_quant.rs`, over the lattice map and neighbour lists of
//! `iq13_gridmap.rs`); LDLQ rounds them in `quant::ldlq::{iq_lattice, iq1_lattice}`. The IQ2
//! types are read only.
//!
//! The grids are numbers from `ggml-common.h` (via gguf-py; `grids.rs` says how they were made
//! and checked); a 7-bit sign index picks 8 signs with even parity (`ksigns_iq2xs`).

mod grids;
mod iq1;
pub(crate) mod iq13_gridmap;
pub(crate) mod iq1_quant;
mod iq2;
pub(crate) mod iq2_groups;
mod iq2_quant;
mod iq3;
pub(crate) mod iq3_quant;
pub(crate) mod iq4;

pub(crate) use iq1::{dequantize_iq1_m, dequantize_iq1_s, IQ1_M_BYTES, IQ1_S_BYTES};
pub(crate) use iq1_quant::{quantize_iq1_m, quantize_iq1_s};
pub(crate) use iq2::{
    dequantize_iq2_s, dequantize_iq2_xs, dequantize_iq2_xxs, IQ2_S_BYTES, IQ2_XS_BYTES,
    IQ2_XXS_BYTES,
};
pub use iq2_quant::{quantize_iq2_s, quantize_iq2_xs, quantize_iq2_xxs};
pub(crate) use iq3::{dequantize_iq3_s, dequantize_iq3_xxs, IQ3_S_BYTES, IQ3_XXS_BYTES};
pub(crate) use iq3_quant::{quantize_iq3_s, quantize_iq3_xxs};
pub use iq4::{quantize_iq4_nl, quantize_iq4_xs};

use crate::types::float::f16_at;

/// An encoder that takes per-column importance the way llama-quantize takes an imatrix (`src`:
/// whole super-blocks of rows, `imp`: one weight per column of a row), byte-identical with
/// `llama-quantize --imatrix`.
pub(crate) type WeightedFn = fn(src: &[f32], imp: &[f32], out: &mut [u8]);

/// The i-quants whose importance-weighted encoder is llama.cpp's own (`Encoder::Weighted` uses it
/// in place of `types::grid`'s fit): the IQ2 types here, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M in
/// `iq3_quant`. One dispatch for every i-quant encoder.
pub(crate) fn weighted_encoder(ty: crate::types::TensorType) -> Option<WeightedFn> {
    use crate::types::TensorType::*;
    match ty {
        IQ2XXS => Some(iq2_quant::quantize_iq2_xxs_with),
        IQ2XS => Some(iq2_quant::quantize_iq2_xs_with),
        IQ2S => Some(iq2_quant::quantize_iq2_s_with),
        _ => iq3_quant::weighted_encoder(ty),
    }
}

/// ggml's `kvalues_iq4nl`.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The same table as f32 (exact), for the kernels.
pub(crate) const KV_F32: [f32; 16] = {
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

/// ggml's `ksigns_iq2xs`: 7 stored sign bits (bit j = value j negative) and an 8th that makes
/// the count of negatives even.
static KSIGNS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8 | (((i as u32).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    t
};

/// ±1 for value `j` of an 8-sign byte (ggml: `signs & kmask_iq2xs[j] ? -1.f : 1.f`).
#[inline(always)]
fn sign(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 {
        -1.0
    } else {
        1.0
    }
}

/// Expand a packed grid (`grids.rs`: `bits` per value, `W` values per row) into its values.
const fn expand<const N: usize, const W: usize>(
    packed: &[u16; N],
    levels: &[i8],
    bits: u32,
) -> [[i8; W]; N] {
    let mut out = [[0i8; W]; N];
    let mask = (1u16 << bits) - 1;
    let mut r = 0;
    while r < N {
        let mut j = 0;
        while j < W {
            out[r][j] = levels[((packed[r] >> (bits * j as u32)) & mask) as usize];
            j += 1;
        }
        r += 1;
    }
    out
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
