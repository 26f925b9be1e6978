//! ggml's ternary types TQ1_0 and TQ2_0 (BitNet-style weights in {−1, 0, 1} times one f16 scale
//! per 256 values; not TurboQuant): dequantization as ggml's `dequantize_row_tq*_0`, and
//! round-to-nearest encoding as ggml's `quantize_row_tq*_0_ref` (what llama-quantize runs; it
//! takes no importance matrix): `d` = the block's largest |x|, each value `round(x / d)`.
//!
//! | type | values | bytes | layout |
//! |---|---|---|---|
//! | TQ1_0 | 256 | 54 | `qs[48]` (5 trits per byte), `qh[4]` (4 trits per byte), `d: f16` |
//! | TQ2_0 | 256 | 66 | `qs[64]` (2 bits per value, `q − 1`), `d: f16` |
//!
//! A TQ1_0 byte holds trits as a fixed-point fraction: trit n of byte b is
//! `((b · 3ⁿ mod 256) · 3) >> 8` (ggml's `pow3` trick), so no division is needed.

use super::kquants::QK_K;
use crate::types::float::{f16_at, f32_to_f16_bits};

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

/// A block's scale: its largest |x| (C's `MAX(amax, fabsf(v))`), and its reciprocal (0 for an
/// all-zero block).
#[inline(always)]
fn ternary_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |m, &v| {
        let a = v.abs();
        if m > a {
            m
        } else {
            a
        }
    });
    (amax, if amax != 0.0 { 1.0 / amax } else { 0.0 })
}

/// ggml's `lroundf(x · id) + 1` (round half away from zero: −1, 0, 1 → 0, 1, 2) as an `int`.
/// `id` overflows to infinity when the block's largest |x| is below 1/f32::MAX (a block of tiny
/// subnormals); then `x · id` is ±inf, glibc's `lroundf` on x86-64 returns `LONG_MIN`, and the
/// `+ 1` truncated to `int` is 1: the value encodes as 0. Checked live against llama-quantize
/// (tests/ternary_llama.rs, the subnormal edge row).
#[inline(always)]
fn trit_of(v: f32) -> u8 {
    if v.is_finite() {
        (v.round() as i32 + 1) as u8
    } else {
        1
    }
}

/// `n` trits (each 0..=2, the first most significant) packed as ggml does: their base-3 number,
/// times 3^(5 − n) so the first trit is the byte's top one, then scaled to a byte by ceiling
/// division, `⌈t · 256 / 243⌉` (the inverse of [`trit`]'s fixed-point reading).
#[inline(always)]
fn pack_trits(trits: impl Iterator<Item = u8>, n: u32) -> u8 {
    let t = trits.fold(0u16, |q, xi| q * 3 + xi as u16) * 3u16.pow(5 - n);
    (t * 256).div_ceil(243) as u8
}

/// TQ1_0 from f32, as ggml's `quantize_row_tq1_0_ref`: bytes 0..32 hold values `m + 32n`,
/// bytes 32..48 hold `160 + m + 16n` (n = 0..5, five trits each), `qh[j]` holds `240 + j + 4n`
/// (n = 0..4, four trits then a zero trit), the f16 `d` last.
pub(crate) fn quantize_tq1_0(src: &[f32], out: &mut [u8]) {
    const QS: usize = (QK_K - 4 * QK_K / 64) / 5; // 48
    for (x, b) in src
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(TQ1_0_BYTES))
    {
        let (d, id) = ternary_scale(x);
        let q = |i: usize| trit_of(x[i] * id);
        for (m, o) in b[..32].iter_mut().enumerate() {
            *o = pack_trits((0..5).map(|n| q(m + 32 * n)), 5);
        }
        for (m, o) in b[32..QS].iter_mut().enumerate() {
            *o = pack_trits((0..5).map(|n| q(160 + m + 16 * n)), 5);
        }
        for (j, o) in b[QS..QS + QK_K / 64].iter_mut().enumerate() {
            *o = pack_trits((0..4).map(|n| q(240 + j + 4 * n)), 4);
        }
        b[TQ1_0_BYTES - F16..].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    }
}

/// TQ2_0 from f32, as ggml's `quantize_row_tq2_0_ref`: in each half of 128 values, byte m holds
/// values `m + 32l` in bits 2l..2l+2 (`round(x / d) + 1`), the f16 `d` last.
pub(crate) fn quantize_tq2_0(src: &[f32], out: &mut [u8]) {
    for (x, b) in src
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(TQ2_0_BYTES))
    {
        let (d, id) = ternary_scale(x);
        for (x, qs) in x.chunks_exact(128).zip(b[..QK_K / 4].chunks_exact_mut(32)) {
            for (m, o) in qs.iter_mut().enumerate() {
                *o = (0..4).fold(0u8, |q, l| q | (trit_of(x[m + 32 * l] * id) & 3) << (2 * l));
            }
        }
        b[QK_K / 4..].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
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

    /// Round trips: every value decodes to the nearest of {−d, 0, d} (d the block's largest |x|
    /// rounded to f16), ties away from zero; an all-zero block is all zero.
    #[test]
    fn round_trip_is_nearest_ternary() {
        let mut x: Vec<f32> = (0..QK_K * 3)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        x[QK_K..2 * QK_K].fill(0.0);
        x[2 * QK_K + 7] = 1.0; // block 2: amax 2, so ±1 is a tie: away from zero
        for (enc, dec, bytes) in [
            (
                quantize_tq1_0 as fn(&[f32], &mut [u8]),
                dequantize_tq1_0 as fn(&[u8], &mut [f32]),
                TQ1_0_BYTES,
            ),
            (quantize_tq2_0, dequantize_tq2_0, TQ2_0_BYTES),
        ] {
            let mut b = vec![0u8; 3 * bytes];
            enc(&x, &mut b);
            let mut y = vec![0f32; x.len()];
            dec(&b, &mut y);
            for (blk, (x, y)) in x.chunks(QK_K).zip(y.chunks(QK_K)).enumerate() {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = half::f16::from_f32(amax).to_f32();
                for (i, (&x, &y)) in x.iter().zip(y).enumerate() {
                    let r = if amax == 0.0 { 0.0 } else { (x / amax).round() };
                    assert_eq!(y, r * d, "block {blk} value {i}: x {x}");
                }
            }
            assert_eq!(y[2 * QK_K + 7], 2.0);
        }
    }

    /// The packing by hand: trits 1, 0, 2, 1, 0 (base 3: 102) → ⌈102 · 256 / 243⌉ = 108, the
    /// byte `tq1_0_hand_block` decodes; four trits 1, 0, 2, 1 get a zero fifth.
    #[test]
    fn pack_trits_by_hand() {
        assert_eq!(pack_trits([1, 0, 2, 1, 0].into_iter(), 5), 108);
        assert_eq!(pack_trits([1, 0, 2, 1].into_iter(), 4), 108);
        assert_eq!(pack_trits([2; 5].into_iter(), 5), 255);
        assert_eq!(pack_trits([0; 5].into_iter(), 5), 0);
        assert_eq!(trit_of(f32::INFINITY), 1);
        assert_eq!((trit_of(-0.5), trit_of(0.49), trit_of(0.5)), (0, 1, 2));
    }
}
