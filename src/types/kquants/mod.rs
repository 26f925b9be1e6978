//! k-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-value super-blocks).
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
//!
//! The quantizers reproduce ggml's `quantize_row_q*_K_ref` — what `llama-quantize` runs when no
//! importance matrix is given — byte for byte: the same searches (`make_qkx2_quants` for
//! Q2_K/Q4_K/Q5_K, `make_qx_quants` for Q6_K, `make_q3_quants` for Q3_K) with the same
//! parameters, every f32 operation in the C evaluation order (Rust never contracts `a*b + c` into
//! an FMA, and ggml-base is compiled for baseline x86-64 without FMA either), `nearest_int`'s
//! magic-number rounding, C's integer narrowing (`as u8` / `as i8` wrap like gcc's conversions) and
//! ggml's f32 → f16 rounding of the super-block scales. Checked against llama-quantize's output in
//! `tests/kquants_llama.rs`.
//!
//! One file per type family: `q2_k`, `q3_k`, `q45_k` (Q4_K and Q5_K share their scale packing
//! and level search), `q6_k`; `search` holds ggml's shared scale searches.

mod imatrix;
mod q2_k;
mod q3_k;
mod q45_k;
mod q6_k;
mod search;

pub(crate) use imatrix::{
    fit_q2_k, fit_q45_k, quantize_q2_k_imatrix, quantize_q4_k_imatrix, quantize_q5_k_imatrix,
};
pub(crate) use q3_k::{q3_k_scales, quantize_q3_k_imatrix};
pub(crate) use q45_k::{pack_scale_min_k4, scale_min_k4};
pub(crate) use q6_k::quantize_q6_k_imatrix;
pub(crate) use search::{make_qkx2_quants, make_qp_quants, make_qx_quants_rmse1};

pub use q2_k::{dequantize_q2_k, quantize_q2_k};
pub use q3_k::{dequantize_q3_k, quantize_q3_k};
pub use q45_k::{dequantize_q4_k, dequantize_q5_k, quantize_q4_k, quantize_q5_k};
pub use q6_k::{dequantize_q6_k, quantize_q6_k};

use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};

/// Values per super-block.
pub const QK_K: usize = 256;
pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;

// Layouts (ggml's `block_q*_K`; `K_SCALE_SIZE` = 12 packed 6-bit scale/min bytes).
const F16: usize = size_of::<u16>();
const K_SCALE_SIZE: usize = 12;
const _: () = assert!(Q2_K_BYTES == QK_K / 16 + QK_K / 4 + 2 * F16);
const _: () = assert!(Q3_K_BYTES == QK_K / 8 + QK_K / 4 + 12 + F16);
const _: () = assert!(Q4_K_BYTES == 2 * F16 + K_SCALE_SIZE + QK_K / 2);
const _: () = assert!(Q5_K_BYTES == 2 * F16 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2);
const _: () = assert!(Q6_K_BYTES == QK_K / 2 + QK_K / 4 + QK_K / 16 + F16);

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// ggml's `GROUP_MAX_EPS`: groups whose largest |x| is below this are all-zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: add 1.5 * 2^23 so the FPU rounds to nearest-even into the low mantissa
/// bits, then read them back. Exact for |v| <= 2^22 - 1; outside that range it returns the same
/// (meaningless) bits as the C code does, so even degenerate inputs stay byte-identical.
#[inline(always)]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0f32;
    (t.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `GGML_FP32_TO_FP16` (round to nearest-even; NaN becomes sign | 0x7E00).
#[inline(always)]
fn f16_ggml(v: f32) -> u16 {
    if v.is_nan() {
        ((v.to_bits() >> 16) as u16 & 0x8000) | 0x7E00
    } else {
        f32_to_f16_bits(v)
    }
}

/// Write `v` as ggml's f16 at `b[i..i+2]` and return the f32 it decodes to (what the C code reads
/// back with `GGML_FP16_TO_FP32(y[i].d)`).
#[inline(always)]
pub(crate) fn put_f16(b: &mut [u8], i: usize, v: f32) -> f32 {
    let h = f16_ggml(v);
    b[i..i + 2].copy_from_slice(&h.to_le_bytes());
    f16_bits_to_f32(h)
}

/// Pack 256 2-bit levels as ggml: byte `j/4 + l` of each 128-value half holds values
/// `j + l`, `j + l + 32`, `j + l + 64`, `j + l + 96` in bits 0-1, 2-3, 4-5, 6-7.
#[inline(always)]
pub(crate) fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            qs[j / 4 + k] =
                l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::q3_k::q3_k_scales;
    use super::*;

    type Kernels = (
        &'static str,
        fn(&[f32], &mut [u8]),
        fn(&[u8], &mut [f32]),
        usize,
    );

    const ALL: [Kernels; 5] = [
        ("q2_K", quantize_q2_k, dequantize_q2_k, Q2_K_BYTES),
        ("q3_K", quantize_q3_k, dequantize_q3_k, Q3_K_BYTES),
        ("q4_K", quantize_q4_k, dequantize_q4_k, Q4_K_BYTES),
        ("q5_K", quantize_q5_k, dequantize_q5_k, Q5_K_BYTES),
        ("q6_K", quantize_q6_k, dequantize_q6_k, Q6_K_BYTES),
    ];

    /// Deterministic roughly-Gaussian values (sum of 4 uniforms, SplitMix64).
    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed;
        let mut u = || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
        };
        (0..n)
            .map(|_| (u() + u() + u() + u() - 2.0) * 1.7)
            .collect()
    }

    fn round_trip(
        q: fn(&[f32], &mut [u8]),
        dq: fn(&[u8], &mut [f32]),
        bb: usize,
        x: &[f32],
    ) -> (Vec<u8>, Vec<f32>) {
        let mut b = vec![0u8; x.len() / QK_K * bb];
        q(x, &mut b);
        let mut y = vec![0f32; x.len()];
        dq(&b, &mut y);
        (b, y)
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for i in -40_000..40_000 {
            let v = i as f32 * 0.25;
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        assert_eq!(nearest_int(-4_194_303.0), -4_194_303);
        assert_eq!(nearest_int(-0.0), 0);
        assert_eq!(nearest_int(0.49999997), 0);
    }

    #[test]
    fn f16_scale_rounding_matches_ggml_bit_trick() {
        // ggml's branch-free fp32 -> fp16 (FP16 library), written out here as an independent
        // check of the `half` + NaN path used for d/dmin.
        fn ggml(f: f32) -> u16 {
            let base = (f.abs() * f32::from_bits(0x7780_0000)) * f32::from_bits(0x0880_0000);
            let w = f.to_bits();
            let shl1_w = w.wrapping_add(w);
            let sign = w & 0x8000_0000;
            let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
            let base = f32::from_bits((bias >> 1) + 0x0780_0000) + base;
            let bits = base.to_bits();
            let nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
            ((sign >> 16)
                | if shl1_w > 0xFF00_0000 {
                    0x7E00
                } else {
                    nonsign
                }) as u16
        }
        let mut s = 1u32;
        for i in 0..2_000_000u32 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            // Every exponent, random mantissas; plus a sweep of the f16 subnormal/overflow edges.
            let v = if i % 2 == 0 {
                f32::from_bits(s)
            } else {
                f32::from_bits(0x3300_0000 + (i >> 1) * 97)
            };
            let (a, b) = (f16_ggml(v), ggml(v));
            assert_eq!(a, b, "{v:e} ({:#010x})", v.to_bits());
        }
        for v in [
            0.0f32,
            -0.0,
            65504.0,
            65519.996,
            65520.0,
            f32::INFINITY,
            f32::NAN,
            -f32::NAN,
        ] {
            assert_eq!(f16_ggml(v), ggml(v), "{v}");
        }
    }

    #[test]
    fn zero_blocks_encode_to_zero() {
        let x = vec![0f32; 2 * QK_K];
        for (name, q, dq, bb) in ALL {
            let (b, y) = round_trip(q, dq, bb, &x);
            assert!(b.iter().all(|&v| v == 0), "{name}: {b:?}");
            assert!(y.iter().all(|&v| v == 0.0), "{name}");
        }
    }

    #[test]
    fn round_trip_error_is_within_format_bounds() {
        // Relative RMS error on Gaussian-like data, upper bounds ~1.2x what the reference
        // algorithm achieves (measured 0.287, 0.147, 0.0695, 0.0351, 0.0170; --nocapture).
        let bounds = [
            ("q2_K", 0.34),
            ("q3_K", 0.18),
            ("q4_K", 0.085),
            ("q5_K", 0.042),
            ("q6_K", 0.021),
        ];
        let x = noise(7, 64 * QK_K);
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
        for ((name, q, dq, bb), (bname, bound)) in ALL.into_iter().zip(bounds) {
            assert_eq!(name, bname);
            let (_, y) = round_trip(q, dq, bb, &x);
            let err = (x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                / x.len() as f32)
                .sqrt();
            let rel = err / rms;
            println!("{name}: relative RMS error {rel:.4}");
            assert!(rel < bound, "{name}: relative RMS error {rel} >= {bound}");
            // Scale invariance by powers of two (away from f16 range limits): every operation is
            // exact under a 2^k scaling, so the levels and scales codes are identical.
            let x4: Vec<f32> = x.iter().map(|v| v * 4.0).collect();
            let (b1, _) = round_trip(q, dq, bb, &x);
            let (b4, y4) = round_trip(q, dq, bb, &x4);
            for (blk, (c1, c4)) in b1.chunks(bb).zip(b4.chunks(bb)).enumerate() {
                assert_eq!(
                    codes_only(name, c1),
                    codes_only(name, c4),
                    "{name} block {blk}"
                );
            }
            for (a, b) in y.iter().zip(&y4) {
                assert_eq!(a * 4.0, *b, "{name}");
            }
        }
    }

    /// A block with its f16 super-scales zeroed (what remains must not depend on a 2^k scaling).
    fn codes_only(name: &str, b: &[u8]) -> Vec<u8> {
        let mut c = b.to_vec();
        let r = match name {
            "q2_K" => 80..84,
            "q3_K" => 108..110,
            "q6_K" => 208..210,
            _ => 0..4,
        };
        c[r].fill(0);
        c
    }

    #[test]
    fn requantizing_is_stable() {
        // Quantizing the dequantized values again must reproduce them closely: the decoded grid
        // is (nearly) representable, so the second pass loses (almost) nothing more.
        let x = noise(11, 16 * QK_K);
        for (name, q, dq, bb) in ALL {
            let (_, y1) = round_trip(q, dq, bb, &x);
            let (_, y2) = round_trip(q, dq, bb, &y1);
            let e1 = x
                .iter()
                .zip(&y1)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>();
            let e12 = y1
                .iter()
                .zip(&y2)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>();
            println!("{name}: first-pass error {e1:.4}, second pass moves {e12:.4}");
            assert!(e12 < 0.1 * e1, "{name}: {e12} vs {e1}");
        }
    }

    #[test]
    fn q6_k_and_q3_k_scale_codes_are_packed_as_ggml_reads_them() {
        // The largest |scale| sub-block gets code -128 (Q6_K) / -32 (Q3_K) relative to d's sign.
        let mut x = noise(3, QK_K);
        for v in &mut x[32..48] {
            *v *= 8.0;
        }
        let (b, _) = round_trip(quantize_q6_k, dequantize_q6_k, Q6_K_BYTES, &x);
        assert_eq!(b[192 + 2] as i8, -128);
        let (b, _) = round_trip(quantize_q3_k, dequantize_q3_k, Q3_K_BYTES, &x);
        assert_eq!(q3_k_scales(&b[96..108])[2], -32);
    }
}
