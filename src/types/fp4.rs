//! Micro-scaled 4-bit floats, dequantization only, as ggml's `dequantize_row_mxfp4` /
//! `dequantize_row_nvfp4`.
//!
//! | type | values | bytes | layout |
//! |---|---|---|---|
//! | MXFP4 | 32 | 17 | `e: u8` (E8M0 scale), `qs[16]` (E2M1 nibbles: low = values 0..16, high = 16..32) |
//! | NVFP4 | 64 | 36 | `d[4]` (UE4M3 scale per 16 values), `qs[32]` (8 bytes per 16 values, split the same way) |
//!
//! ggml keeps the E2M1 values doubled (`kvalues_mxfp4` = 2 × {0, 0.5, 1, 1.5, 2, 3, 4, 6}, OCP MX
//! spec v1.0) and halves the scales instead, so both scale decoders return half the scale.

/// ggml's `kvalues_mxfp4` (`kvalues_fp4`): E2M1 codes, doubled.
const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `block_mxfp4`.
pub(crate) const QK_MXFP4: usize = 32;
pub(crate) const MXFP4_BYTES: usize = 17;
const _: () = assert!(MXFP4_BYTES == size_of::<u8>() + QK_MXFP4 / 2);

/// `block_nvfp4`.
pub(crate) const QK_NVFP4: usize = 64;
const QK_NVFP4_SUB: usize = 16;
pub(crate) const NVFP4_BYTES: usize = 36;
const _: () = assert!(NVFP4_BYTES == QK_NVFP4 / QK_NVFP4_SUB + QK_NVFP4 / 2);

/// ggml's `ggml_e8m0_to_fp32_half`: 2^(e − 128), built from bits (e < 2 gives f32 subnormals;
/// e = 255 is 2^127, not NaN).
#[inline(always)]
fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((e as u32 - 1) << 23)
    }
}

/// ggml's `ggml_ue4m3_to_fp32`: unsigned E4M3 (bias 7), halved; 0 and 0x7F (NaN) give 0. Bit 7
/// is not part of the format and is ignored, as ggml does.
#[inline(always)]
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let (exp, man) = (((x >> 3) & 0xF) as i32, (x & 7) as f32);
    // 2^k for k in −9..=8: a normal f32 built from its exponent bits (exact, like ldexpf).
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let raw = if exp == 0 {
        man * pow2(-9)
    } else {
        (1.0 + man / 8.0) * pow2(exp - 7)
    };
    raw * 0.5
}

/// 16 nibbles of `qs` (low nibbles first, then high) times `d` into `y`.
#[inline(always)]
fn nibbles(y: &mut [f32], qs: &[u8], d: f32) {
    let h = qs.len();
    for (j, &q) in qs.iter().enumerate() {
        y[j] = KVALUES[(q & 0x0F) as usize] as f32 * d;
        y[j + h] = KVALUES[(q >> 4) as usize] as f32 * d;
    }
}

pub(crate) fn dequantize_mxfp4(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(MXFP4_BYTES)
        .zip(out.chunks_exact_mut(QK_MXFP4))
    {
        nibbles(y, &b[1..], e8m0_half(b[0]));
    }
}

pub(crate) fn dequantize_nvfp4(blocks: &[u8], out: &mut [f32]) {
    const N_SUB: usize = QK_NVFP4 / QK_NVFP4_SUB;
    for (b, y) in blocks
        .chunks_exact(NVFP4_BYTES)
        .zip(out.chunks_exact_mut(QK_NVFP4))
    {
        for (s, y) in y.chunks_exact_mut(QK_NVFP4_SUB).enumerate() {
            let qs = &b[N_SUB + s * QK_NVFP4_SUB / 2..N_SUB + (s + 1) * QK_NVFP4_SUB / 2];
            nibbles(y, qs, ue4m3_half(b[s]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scale decoders against values worked out by hand from the formats' definitions.
    #[test]
    fn scales_by_hand() {
        assert_eq!(e8m0_half(127), 0.5); // 2^0, halved
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(255), 2f32.powi(127));
        assert_eq!(e8m0_half(1), 2f32.powi(-127)); // subnormal
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(ue4m3_half(0x38), 0.5); // exp 7, man 0: 1.0
        assert_eq!(ue4m3_half(0x7E), 448.0 / 2.0); // largest finite: 1.75 · 2^8
        assert_eq!(ue4m3_half(0x7F), 0.0); // NaN code
        assert_eq!(ue4m3_half(0x01), 2f32.powi(-9) / 2.0); // smallest subnormal
        assert_eq!(ue4m3_half(0x80 | 0x38), 0.5); // bit 7 ignored
    }

    #[test]
    fn mxfp4_hand_block() {
        let mut b = [0u8; MXFP4_BYTES];
        b[0] = 129; // d = 2
        b[1] = 0xF7; // value 0: code 7 (12) · 2 = 24; value 16: code 15 (−12) · 2 = −24
        let mut y = [0f32; QK_MXFP4];
        dequantize_mxfp4(&b, &mut y);
        assert_eq!((y[0], y[16], y[1]), (24.0, -24.0, 0.0));
    }

    #[test]
    fn nvfp4_hand_block() {
        let mut b = [0u8; NVFP4_BYTES];
        b[2] = 0x40; // sub-block 2: exp 8, man 0 → 2.0, halved → 1.0
        b[4 + 2 * 8] = 0x9A; // its value 0: code 0xA (−2), value 8: code 9 (−1)
        let mut y = [0f32; QK_NVFP4];
        dequantize_nvfp4(&b, &mut y);
        assert_eq!((y[32], y[40]), (-2.0, -1.0));
        assert!(y[..32].iter().chain(&y[33..40]).all(|&v| v == 0.0));
    }
}
