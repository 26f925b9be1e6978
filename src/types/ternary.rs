//! ggml's ternary types TQ1_0 and TQ2_0 (BitNet-style weights in {−1, 0, 1} times one f16 scale
//! per 256 values; not TurboQuant), dequantization only, as ggml's `dequantize_row_tq*_0`.
//!
//! | type | values | bytes | layout |
//! |---|---|---|---|
//! | TQ1_0 | 256 | 54 | `qs[48]` (5 trits per byte), `qh[4]` (4 trits per byte), `d: f16` |
//! | TQ2_0 | 256 | 66 | `qs[64]` (2 bits per value, `q − 1`), `d: f16` |
//!
//! A TQ1_0 byte holds trits as a fixed-point fraction: trit n of byte b is
//! `((b · 3ⁿ mod 256) · 3) >> 8` (ggml's `pow3` trick), so no division is needed.

use super::kquants::QK_K;
use crate::types::float::f16_at;

const F16: usize = size_of::<u16>();

/// `block_tq1_0`.
pub(crate) const TQ1_0_BYTES: usize = 54;
const _: () = assert!(TQ1_0_BYTES == (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + F16);

/// `block_tq2_0`.
pub(crate) const TQ2_0_BYTES: usize = 66;
const _: () = assert!(TQ2_0_BYTES == QK_K / 4 + F16);

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `n` of a packed byte, minus one, times `d` (ggml: `(float)(xi - 1) * d`).
#[inline(always)]
fn trit(b: u8, n: usize, d: f32) -> f32 {
    let q = b.wrapping_mul(POW3[n]);
    let xi = ((q as u16 * 3) >> 8) as i16;
    (xi - 1) as f32 * d
}

pub(crate) fn dequantize_tq1_0(blocks: &[u8], out: &mut [f32]) {
    const QS: usize = (QK_K - 4 * QK_K / 64) / 5; // 48
    for (b, y) in blocks
        .chunks_exact(TQ1_0_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, TQ1_0_BYTES - F16);
        let (qs, qh) = (&b[..QS], &b[QS..QS + QK_K / 64]);
        // qs[0..32]: values n·32 + m; qs[32..48]: 160 + n·16 + m; qh: 240 + n·4 + m.
        let mut k = 0;
        for (start, width, trits) in [(0, 32, 5), (32, 16, 5)] {
            for n in 0..trits {
                for &q in &qs[start..start + width] {
                    y[k] = trit(q, n, d);
                    k += 1;
                }
            }
        }
        for n in 0..4 {
            for &q in qh {
                y[k] = trit(q, n, d);
                k += 1;
            }
        }
    }
}

pub(crate) fn dequantize_tq2_0(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(TQ2_0_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, QK_K / 4);
        // Each 32 bytes hold 128 values: value l·32 + m in bits 2l..2l+2 of byte m.
        for (half, y) in y.chunks_exact_mut(128).enumerate() {
            let qs = &b[32 * half..32 * half + 32];
            for (l, y) in y.chunks_exact_mut(32).enumerate() {
                for (v, &q) in y.iter_mut().zip(qs) {
                    *v = (((q >> (2 * l)) & 3) as i8 - 1) as f32 * d;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: trits of a byte are the base-3 digits of ceil(t · 256 / 243), most significant
    /// first. 0xFF packs 2,2,2,2,2 (digit 242 → 255 after ggml's rounding); t = 1·81 + 0·27 +
    /// 2·9 + 1·3 + 0 = 102 → byte ceil(102 · 256 / 243) = 108 decodes to 1, 0, 2, 1, 0.
    #[test]
    fn tq1_0_hand_block() {
        let mut b = [0u8; TQ1_0_BYTES];
        b[0] = 108;
        b[32] = 0xFF;
        b[48] = 108;
        b[52..54].copy_from_slice(&0x4000u16.to_le_bytes()); // d = 2
        let mut y = [0f32; QK_K];
        dequantize_tq1_0(&b, &mut y);
        let at = |base: usize, stride: usize, n: usize| -> Vec<f32> {
            (0..n).map(|i| y[base + i * stride]).collect()
        };
        assert_eq!(at(0, 32, 5), [0.0, -2.0, 2.0, 0.0, -2.0]);
        assert_eq!(at(160, 16, 5), [2.0; 5]);
        assert_eq!(at(240, 4, 4), [0.0, -2.0, 2.0, 0.0]);
        assert_eq!(y[1], -2.0); // byte 0 decodes to all −1 (trit 0)
    }

    #[test]
    fn tq2_0_hand_block() {
        let mut b = [0u8; TQ2_0_BYTES];
        b[0] = 0b11_10_01_00; // values 0, 32, 64, 96: q = 0, 1, 2, 3
        b[64..66].copy_from_slice(&0xC000u16.to_le_bytes()); // d = −2
        let mut y = [0f32; QK_K];
        dequantize_tq2_0(&b, &mut y);
        assert_eq!([y[0], y[32], y[64], y[96]], [2.0, -0.0, -2.0, -4.0]);
        assert_eq!(y[128], 2.0);
    }
}
