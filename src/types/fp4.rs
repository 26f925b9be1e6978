//! Micro-scaled 4-bit floats: dequantization as ggml's `dequantize_row_mxfp4` /
//! `dequantize_row_nvfp4`; MXFP4 encoding as ggml's `quantize_row_mxfp4_ref` (what llama-quantize
//! runs; no importance matrix): the E8M0 scale from the block's largest |x|, each value the
//! nearest E2M1 code.
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

/// The E2M1 code (index into [`KVALUES`]) nearest `x` at half-scale `d`, as ggml's
/// `best_index_mxfp4`: the first code of least `|k · d − x|` (so 0, never −0, for zero).
#[inline(always)]
fn nearest_code(x: f32, d: f32) -> u8 {
    let mut best = (0u8, (KVALUES[0] as f32 * d - x).abs());
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best.1 {
            best = (i as u8, err);
        }
    }
    best.0
}

/// The E8M0 exponent ggml gives a block whose largest |x| is `amax`:
/// `(uint8_t)(floorf(log2f(amax)) − 2 + 127)`, 0 for an all-zero block. `log2f` is the C
/// library's (Rust's `f32::log2` calls it), so values just below a power of two round as in
/// ggml. For `amax` < 2^−125 the float is negative; the C cast (x86-64: `cvttss2si` to a 32-bit
/// int, low byte kept) wraps it, which `as i32 as u8` does too (e = 255 for amax in
/// [2^−126, 2^−125): a block llama-quantize's validation then rejects).
#[inline(always)]
fn mxfp4_exponent(amax: f32) -> u8 {
    if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
    } else {
        0
    }
}

/// MXFP4 from f32, as ggml's `quantize_row_mxfp4_ref`: `e` from the largest |x|, then values
/// j and j + 16 nearest codes in the low and high nibble of byte j.
pub(crate) fn quantize_mxfp4(src: &[f32], out: &mut [u8]) {
    for (x, b) in src
        .chunks_exact(QK_MXFP4)
        .zip(out.chunks_exact_mut(MXFP4_BYTES))
    {
        let amax = x
            .iter()
            .fold(0f32, |m, &v| if m < v.abs() { v.abs() } else { m });
        let e = mxfp4_exponent(amax);
        let d = e8m0_half(e);
        b[0] = e;
        let (lo, hi) = x.split_at(QK_MXFP4 / 2);
        for ((o, &a), &c) in b[1..].iter_mut().zip(lo).zip(hi) {
            *o = nearest_code(a, d) | nearest_code(c, d) << 4;
        }
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

    /// Round trips: each value decodes to the nearest representable `k · d` (d = 2^(⌊log2 amax⌋
    /// − 3), so the largest |x| lands in codes 4..=6 · 2 of the E2M1 range), first code on ties.
    #[test]
    fn mxfp4_round_trip_is_nearest() {
        let mut x: Vec<f32> = (0..QK_MXFP4 * 4)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.013)
            .collect();
        x[QK_MXFP4..2 * QK_MXFP4].fill(0.0);
        x[3 * QK_MXFP4..].fill(-0.75);
        let mut b = vec![0u8; 4 * MXFP4_BYTES];
        quantize_mxfp4(&x, &mut b);
        let mut y = vec![0f32; x.len()];
        dequantize_mxfp4(&b, &mut y);
        for (blk, (x, y)) in x.chunks(QK_MXFP4).zip(y.chunks(QK_MXFP4)).enumerate() {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = if amax > 0.0 {
                2f32.powi(amax.log2().floor() as i32 - 3)
            } else {
                0.0
            };
            assert_eq!(
                b[blk * MXFP4_BYTES],
                if amax > 0.0 {
                    (amax.log2().floor() + 125.0) as u8
                } else {
                    0
                }
            );
            for (&x, &y) in x.iter().zip(y) {
                let best = KVALUES
                    .iter()
                    .map(|&k| (k as f32 * d - x).abs())
                    .fold(f32::MAX, f32::min);
                assert_eq!((y - x).abs(), best, "block {blk}: x {x} → {y}");
            }
        }
        assert!(y[3 * QK_MXFP4..].iter().all(|&v| v == -0.75)); // −0.75 = −6 · 2^−3: exact
        assert_eq!(mxfp4_exponent(2f32.powi(-126)), 255); // the C cast's wrap
                                                          // log2f(f32::MAX) rounds to 128.0, so e = 253, not the exact floor's 252.
        assert_eq!(mxfp4_exponent(f32::MAX), 253);
    }
}
