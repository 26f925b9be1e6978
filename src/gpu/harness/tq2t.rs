//! tq2_t's kernels in the harness (issue 19): the trellis block decode, rows decoded to the
//! original domain (decode + tq2_r's inverse rotation kernels), and the GEMV (alone over a
//! pre-rotated input, and after the device's own rotation), on
//! - random bytes: every scale byte (0 included) and random codes, decoded against the reference
//!   decoder (each value's state read from its block on its own), also as rows of 576;
//! - rows quantized by the CPU encoder (Viterbi) from Gaussian weights at SmolLM2's widths;
//! - random-code rows at real and odd shapes: SmolLM2's (576, 1536), one-block rows (64), a
//!   3-block row (192), an odd row count, and rows that take the multi-pass rotation (8192,
//!   14336) or the DCT factor (4672 = 73·64).
//!
//! Tolerances (the tq2_r harness's): decode bit-exact (the kernels' integer state and codeword
//! index, the CPU's two f32 products; no subnormal can occur); row decode bit-exact for Hadamard
//! rotations, else `DOT_REL_BOUND · Σ|R_ij·x_j|` against the f64 inverse; GEMV
//! `DOT_REL_BOUND · Σ|ŵ'_j·x'_j|` against an f64 dot in the rotated domain.

use super::compare::compare_exact;
use super::data::{Rng, Shape};
use super::tq2r::{blocks_through, rotated_values};
use super::{CheckOptions, Report};
use crate::error::Result;
use crate::gpu::{Backend, TwoBit, TwoBitLayout};
use crate::types::{quantize_rows, tq2t, TensorType};

const TY: TensorType = TensorType::TQ2T;
const LAYOUT: TwoBitLayout = TwoBitLayout::Tq2t;

/// `rows × cols` of random tq2_t blocks: random codes, scale bytes around 2^-6 (weights of
/// a trained matrix; the random-bytes case covers every byte).
pub(crate) fn random_blocks(rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b = rng.bytes(rows * cols / tq2t::QK * tq2t::TQ2T_BYTES);
    for blk in b.chunks_exact_mut(tq2t::TQ2T_BYTES) {
        // E in 17..=19 (2^-7 .. 2^-5), any mantissa.
        blk[0] = ((17 + rng.next_u64() % 3) << 3) as u8 | (rng.next_u64() & 7) as u8;
    }
    b
}

fn shapes(quick: bool) -> Vec<Shape> {
    let mut v = vec![
        Shape {
            name: "smollm2.ffn_up 1536x576",
            rows: 1536,
            cols: 576,
        },
        Shape {
            name: "smollm2.ffn_down 576x1536",
            rows: 576,
            cols: 1536,
        },
        Shape {
            name: "one block per row 7x64",
            rows: 7,
            cols: 64,
        },
        Shape {
            name: "odd 13x192",
            rows: 13,
            cols: 192,
        },
        Shape {
            name: "pow2 8192 (multi-pass, global stage)",
            rows: 8,
            cols: 8192,
        },
        Shape {
            name: "llama3-8b.ffn_down 14336 (multi-pass)",
            rows: 4,
            cols: 14336,
        },
        Shape {
            name: "dct 4672 = 73x64 (multi-pass)",
            rows: 3,
            cols: 4672,
        },
    ];
    if quick {
        for s in &mut v {
            s.rows = s.rows.min(40);
        }
    }
    v
}

/// Everything the harness runs for tq2_t.
pub(super) fn check(
    b: &mut dyn Backend,
    opts: &CheckOptions,
    rng: &mut Rng,
    rep: &mut Report,
) -> Result<()> {
    // 1. Random bytes, every scale byte: blocks alone, then as rows of 576.
    let rows = if opts.quick { 16 } else { 512 };
    let cols = 576;
    let mut bytes = rng.bytes(rows * cols / tq2t::QK * tq2t::TQ2T_BYTES);
    for (i, blk) in bytes.chunks_exact_mut(tq2t::TQ2T_BYTES).enumerate() {
        blk[0] = (i % 256) as u8;
    }
    let w = TwoBit {
        layout: LAYOUT,
        data: &bytes,
        rows,
        cols,
        rotated: true,
    };
    let got = b.twobit_decode(&w, false)?;
    rep.results.push(compare_exact(
        TY,
        "random-bytes (every scale byte)",
        &got,
        &rotated_values(&w)?,
    ));
    rep.results
        .push(super::tq2r::row_decode(b, &w, "random-bytes, rows of 576")?);
    // 2. Gaussian rows through the CPU encoder (the Viterbi search is slow: a few rows).
    let enc_rows = if opts.quick { 2 } else { 8 };
    for cols in [576, 1536] {
        let sigma = 0.02 + 0.03 * rng.uniform();
        let src: Vec<f32> = (0..enc_rows * cols)
            .map(|_| (rng.gauss() * sigma) as f32)
            .collect();
        let mut bytes = vec![0u8; enc_rows * cols / tq2t::QK * tq2t::TQ2T_BYTES];
        quantize_rows(TY, &src, &mut bytes, cols, "gaussian rows")?;
        let data = format!("gaussian {enc_rows}x{cols}, CPU Viterbi encoder");
        rep.results.extend(blocks_through(
            b, LAYOUT, &bytes, enc_rows, cols, &data, rng,
        )?);
    }
    // 3. Random-code rows at real and odd shapes.
    for s in shapes(opts.quick) {
        let bytes = random_blocks(s.rows, s.cols, rng);
        rep.results.extend(blocks_through(
            b, LAYOUT, &bytes, s.rows, s.cols, s.name, rng,
        )?);
    }
    Ok(())
}
