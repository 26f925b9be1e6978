//! tq2_r's kernels in the harness: block decode, the whole-row rotation (both launch paths, both
//! directions), rows decoded to the original domain, and the word-oriented GEMV (alone over a
//! pre-rotated input, and after the device's own rotation), on
//! - the seed design's vectors (`seed2bit.json`) in the design's own layout: decode bit-exact
//!   with its `(2q − 3)·s`, the reconstruction held to its `deq` (bit-exact without rotation),
//!   the GEMV; and the vectors' inputs re-quantized as tq2_r blocks;
//! - random bytes (every f16 scale pattern; subnormal, inf and NaN f32 scales in the design's
//!   layout);
//! - Gaussian weights at real shapes: SmolLM2's (576, 1536), and wider rows that take the
//!   multi-pass rotation (8192, 14336) or the DCT factor (1376, 4672).
//!
//! Tolerances: decode bit-exact; rotation and row decode bit-exact with the CPU transform for
//! Hadamard rotations (the ±1 factor makes every operation the CPU's), else (DCT factor, or
//! against the design's f64 reconstruction) `|err_i| ≤ DOT_REL_BOUND · Σ_j |R_ij·x_j|`; GEMV
//! `|err| ≤ DOT_REL_BOUND · Σ_j |ŵ'_j·x'_j|` against an f64 dot in the rotated domain (`R·x` in
//! f64 for the end-to-end mat-vec: orthogonality makes it the original-domain product).

use super::compare::{compare_dots, compare_exact, merge, KernelKind, KernelResult, DOT_REL_BOUND};
use super::data::{load_seed2bit, random_activation, Rng, Seed2bitCase, Shape};
use super::{CheckOptions, Report};
use crate::error::Result;
use crate::gpu::{Backend, RotatePath, TwoBit, TwoBitLayout, ROTATE_MAX};
use crate::math::rotation::Rotation;
use crate::types::{dequantize_rows, quantize_rows, seed2bit, tq2r, tq2t, TensorType};

const TY: TensorType = TensorType::TQ2R;

/// Rows wider than SmolLM2's: a power of two at the single-workgroup limit, two that take the
/// multi-pass rotation (a global butterfly stage at 8192; Llama-3-8B's FFN width 14336 = 28·512,
/// Paley), and two without a Paley order (DCT factor: 1376 = 43·32 in one workgroup, 4672 = 73·64
/// multi-pass).
pub(super) fn wide_shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "llama.attn 4096",
            rows: 32,
            cols: 4096,
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
            name: "dct 1376 = 43x32",
            rows: 24,
            cols: 1376,
        },
        Shape {
            name: "dct 4672 = 73x64 (multi-pass)",
            rows: 4,
            cols: 4672,
        },
    ]
}

/// Whether tq2_r's rotation of `cols` is a Hadamard one (±1 factor: the kernels are bit-exact
/// with the CPU transform) rather than the DCT fallback.
pub(crate) fn is_hadamard(cols: usize) -> Result<bool> {
    Ok(tq2r::rotation(cols)?
        .factors()
        .is_some_and(|f| f.mix_then_scale))
}

/// The CPU reference of the rotated-domain decode (tq2_t: the reference trellis decoder, every
/// value's state read from its block on its own).
pub(super) fn rotated_values(w: &TwoBit) -> Result<Vec<f32>> {
    let nblk = w.blocks()?;
    let mut out = vec![0f32; nblk * w.layout.block_values()];
    match w.layout {
        TwoBitLayout::Tq2r => tq2r::dequantize_tq2r_rotated(w.data, &mut out),
        TwoBitLayout::Tq2t => tq2t::dequantize_tq2t_rotated_ref(w.data, &mut out),
        TwoBitLayout::Seed => {
            let rd = |o: usize| {
                u32::from_le_bytes([w.data[o], w.data[o + 1], w.data[o + 2], w.data[o + 3]])
            };
            for (i, v) in out.iter_mut().enumerate() {
                let word = rd(4 * (i / 16));
                let s = f32::from_bits(rd(8 * nblk + 4 * (i / 32)));
                *v = seed2bit::level((word >> (2 * (i % 16))) & 3, s) as f32;
            }
        }
    }
    Ok(out)
}

/// `R·x` of every row of `x` in f64 (rows of `cols`).
fn rotate_f64(cols: usize, x: &[f32], inverse: bool) -> Result<(Vec<f64>, Vec<f64>)> {
    let r = tq2r::rotation(cols)?;
    let (mut y, mut s) = (Vec::with_capacity(x.len()), Vec::with_capacity(x.len()));
    for row in x.chunks_exact(cols) {
        let v: Vec<f64> = row.iter().map(|&a| a as f64).collect();
        let f = if inverse {
            r.inverse_f64(&v)
        } else {
            r.forward_f64(&v)
        };
        y.extend(f.expect("tq2_r rotations are Hadamard or DCT"));
        s.extend(r.abs_sums(&v, inverse).expect("as above"));
    }
    Ok((y, s))
}

/// The CPU f32 transform of every row.
fn rotate_cpu(r: &Rotation, x: &[f32], inverse: bool) -> Vec<f32> {
    x.chunks_exact(r.len())
        .flat_map(|row| {
            if inverse {
                r.inverse(row)
            } else {
                r.forward(row)
            }
        })
        .collect()
}

/// Rotated-domain f64 dots `Σ_j ŵ'_j·x'_j` per row and their `Σ|ŵ'_j·x'_j|`.
fn gemv_reference(vals: &[f32], cols: usize, xr: &[f64]) -> (Vec<f64>, Vec<f64>) {
    vals.chunks_exact(cols)
        .map(|row| {
            row.iter().zip(xr).fold((0f64, 0f64), |(d, s), (&a, &b)| {
                let p = a as f64 * b;
                (d + p, s + p.abs())
            })
        })
        .unzip()
}

pub(super) fn tagged(mut r: KernelResult, kind: KernelKind) -> KernelResult {
    r.kind = kind;
    r
}

fn add(acc: &mut Option<KernelResult>, r: KernelResult) {
    *acc = Some(match acc.take() {
        None => r,
        Some(a) => merge(a, r),
    });
}

/// GEMV of `w` with `x`: end to end (the device rotates `x`) against `R·x` in f64, and alone over
/// the CPU-rotated `x`. `vals` are the rotated-domain weights (finite).
pub(super) fn gemv(
    b: &mut dyn Backend,
    w: &TwoBit,
    vals: &[f32],
    x: &[f32],
    data: &str,
) -> Result<[KernelResult; 2]> {
    let xr64 = if w.rotated {
        rotate_f64(w.cols, x, false)?.0
    } else {
        x.iter().map(|&v| v as f64).collect()
    };
    let ty = w.layout.kernel_type();
    let (dots, sums) = gemv_reference(vals, w.cols, &xr64);
    let y = b.twobit_matvec(w, x, false)?;
    let full = compare_dots(
        ty,
        KernelKind::MatVec,
        data,
        &y,
        &dots,
        &sums,
        DOT_REL_BOUND,
    );
    let xr = if w.rotated {
        tq2r::rotation(w.cols)?.forward(x)
    } else {
        x.to_vec()
    };
    let xr64: Vec<f64> = xr.iter().map(|&v| v as f64).collect();
    let (dots, sums) = gemv_reference(vals, w.cols, &xr64);
    let y = b.twobit_matvec(w, &xr, true)?;
    let alone = compare_dots(
        ty,
        KernelKind::MatVec,
        &format!("{data} [GEMV alone]"),
        &y,
        &dots,
        &sums,
        DOT_REL_BOUND,
    );
    Ok([full, alone])
}

/// Rows decoded to the original domain against the CPU's `dequantize_rows` (tq2_r or tq2_t
/// blocks): bit-exact for Hadamard rotations, else bounded against the f64 inverse.
pub(crate) fn row_decode(b: &mut dyn Backend, w: &TwoBit, data: &str) -> Result<KernelResult> {
    let ty = w.layout.kernel_type();
    let got = b.twobit_decode(w, true)?;
    if is_hadamard(w.cols)? {
        let mut want = vec![0f32; w.rows * w.cols];
        dequantize_rows(ty, w.data, &mut want, w.cols, "reference")?;
        return Ok(tagged(
            compare_exact(ty, data, &got, &want),
            KernelKind::RowDecode,
        ));
    }
    let (want, sums) = rotate_f64(w.cols, &rotated_values(w)?, true)?;
    Ok(compare_dots(
        ty,
        KernelKind::RowDecode,
        data,
        &got,
        &want,
        &sums,
        DOT_REL_BOUND,
    ))
}

/// Blocks (tq2_r's or tq2_t's `layout`) of `rows × cols` Gaussian-or-given weights through
/// decode, row decode and GEMV.
pub(super) fn blocks_through(
    b: &mut dyn Backend,
    layout: TwoBitLayout,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    data: &str,
    rng: &mut Rng,
) -> Result<Vec<KernelResult>> {
    let w = TwoBit {
        layout,
        data: bytes,
        rows,
        cols,
        rotated: true,
    };
    let vals = rotated_values(&w)?;
    let got = b.twobit_decode(&w, false)?;
    let mut out = vec![compare_exact(layout.kernel_type(), data, &got, &vals)];
    out.push(row_decode(b, &w, data)?);
    let x = random_activation(cols, rng);
    out.extend(gemv(b, &w, &vals, &x, data)?);
    Ok(out)
}

/// The seed design's vectors: decode, reconstruction and GEMV in the design's own layout, and
/// the vectors' inputs re-quantized as tq2_r blocks.
fn conformance(
    b: &mut dyn Backend,
    cases: &[Seed2bitCase],
    rng: &mut Rng,
    rep: &mut Report,
) -> Result<()> {
    const DATA: &str = "seed2bit.json, design layout";
    // 1. Every case's blocks, decoded in the rotated domain.
    let qw: Vec<u32> = cases.iter().flat_map(|c| c.qw.iter().copied()).collect();
    let sc: Vec<f32> = cases.iter().flat_map(|c| c.sc.iter().copied()).collect();
    let all = TwoBit::seed_bytes(&qw, &sc);
    let w = TwoBit {
        layout: TwoBitLayout::Seed,
        data: &all,
        rows: sc.len(),
        cols: tq2r::QK,
        rotated: false,
    };
    let got = b.twobit_decode(&w, false)?;
    rep.results
        .push(compare_exact(TY, DATA, &got, &rotated_values(&w)?));
    // 2. Per case: the reconstruction (design's `deq`; requant2bit: the CPU reconstruction of
    //    the expected codes), and the GEMV.
    let (mut exact, mut bounded, mut mv, mut alone) = (None, None, None, None);
    let mut inputs = None;
    for c in cases {
        let data = TwoBit::seed_bytes(&c.qw, &c.sc);
        let w = TwoBit {
            layout: TwoBitLayout::Seed,
            data: &data,
            rows: c.rows,
            cols: c.cols,
            rotated: c.incoherent,
        };
        let want = if c.deq.is_empty() {
            let p = seed2bit::Packed {
                qw: c.qw.clone(),
                sc: c.sc.clone(),
            };
            seed2bit::reconstruct(&p, c.rows, c.cols, c.incoherent)?
        } else {
            c.deq.clone()
        };
        let got = b.twobit_decode(&w, true)?;
        if c.incoherent {
            // The design rotates back in f64 and rounds once; the kernels work in f32.
            let (_, sums) = rotate_f64(c.cols, &rotated_values(&w)?, true)?;
            let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            let r = compare_dots(
                TY,
                KernelKind::RowDecode,
                &format!("{DATA}, reconstruction (rotated rows)"),
                &got,
                &want,
                &sums,
                DOT_REL_BOUND,
            );
            add(&mut bounded, r);
        } else {
            let r = compare_exact(
                TY,
                &format!("{DATA}, reconstruction (plain rows)"),
                &got,
                &want,
            );
            add(&mut exact, tagged(r, KernelKind::RowDecode));
        }
        let vals = rotated_values(&w)?;
        let x = random_activation(c.cols, rng);
        let [m, a] = gemv(b, &w, &vals, &x, DATA)?;
        add(&mut mv, m);
        add(&mut alone, a);
        // The inputs, re-quantized as tq2_r by the CPU reference (edge cases: zeros, constant,
        // a spike, tiny and huge values, grid ties).
        if !c.w.is_empty() {
            let mut bytes = vec![0u8; c.rows * c.cols / tq2r::QK * tq2r::TQ2R_BYTES];
            quantize_rows(TY, &c.w, &mut bytes, c.cols, "seed2bit inputs")?;
            let inputs_as = "seed2bit.json inputs";
            for r in blocks_through(
                b,
                TwoBitLayout::Tq2r,
                &bytes,
                c.rows,
                c.cols,
                inputs_as,
                rng,
            )? {
                let i = inputs.get_or_insert_with(Vec::new);
                match i.iter().position(|x: &KernelResult| {
                    x.kind == r.kind && x.data == r.data && x.tolerance == r.tolerance
                }) {
                    Some(k) => {
                        let prev = i.remove(k);
                        i.insert(k, merge(prev, r));
                    }
                    None => i.push(r),
                }
            }
        }
    }
    rep.results
        .extend([exact, bounded, mv, alone].into_iter().flatten());
    rep.results.extend(inputs.unwrap_or_default());
    Ok(())
}

/// Random bytes: tq2_r blocks (every f16 scale), also as rows of 576 through the inverse
/// rotation; the design's layout with random words and scales (a quarter subnormal, and inf,
/// NaN, zeros).
fn random_bytes(b: &mut dyn Backend, quick: bool, rng: &mut Rng, rep: &mut Report) -> Result<()> {
    let rows = if quick { 64 } else { 2048 };
    let cols = 576;
    let bytes = rng.bytes(rows * cols / tq2r::QK * tq2r::TQ2R_BYTES);
    let w = TwoBit {
        layout: TwoBitLayout::Tq2r,
        data: &bytes,
        rows,
        cols,
        rotated: true,
    };
    let got = b.twobit_decode(&w, false)?;
    rep.results.push(compare_exact(
        TY,
        "random-bytes",
        &got,
        &rotated_values(&w)?,
    ));
    rep.results
        .push(row_decode(b, &w, "random-bytes, rows of 576")?);
    let nblk = rows * cols / tq2r::QK;
    let qw: Vec<u32> = (0..2 * nblk).map(|_| rng.next_u64() as u32).collect();
    let sc: Vec<f32> = (0..nblk)
        .map(|i| {
            let r = rng.next_u64() as u32;
            f32::from_bits(match i % 8 {
                0 | 1 => r & 0x807f_ffff,                       // subnormal
                2 => (r & 0x8000_0000) | 0x7f80_0000 | (r & 1), // ±inf or NaN
                3 => r & 0x8000_0000,                           // ±0
                _ => r,
            })
        })
        .collect();
    let data = TwoBit::seed_bytes(&qw, &sc);
    let w = TwoBit {
        layout: TwoBitLayout::Seed,
        data: &data,
        rows: nblk,
        cols: tq2r::QK,
        rotated: false,
    };
    let got = b.twobit_decode(&w, false)?;
    rep.results.push(compare_exact(
        TY,
        "random-bytes, design layout (subnormal, inf, NaN scales)",
        &got,
        &rotated_values(&w)?,
    ));
    Ok(())
}

/// The rotation kernels alone: random activations (outlier channels) through `R` and `Rᵀ`, on
/// every launch path the row length allows, against the CPU transform.
fn rotations(b: &mut dyn Backend, quick: bool, rng: &mut Rng, rep: &mut Report) -> Result<()> {
    let lens: &[usize] = if quick {
        &[576, 1376, 8192]
    } else {
        &[576, 1536, 1376, 4096, 4672, 8192, 14336]
    };
    for &cols in lens {
        let r = tq2r::rotation(cols)?;
        let rows = (16384 / cols).clamp(1, 8);
        let x = random_activation(rows * cols, rng);
        let mut paths = vec![RotatePath::Auto];
        if cols <= ROTATE_MAX {
            paths.push(RotatePath::MultiPass);
        }
        for inverse in [false, true] {
            for &path in &paths {
                let how = match (path, cols <= ROTATE_MAX) {
                    (RotatePath::Auto, true) => "one workgroup per row",
                    _ => "multi-pass",
                };
                let data = format!(
                    "K={cols} {}, {}, {how}",
                    r.describe(),
                    if inverse { "inverse" } else { "forward" }
                );
                let got = b.rotate_rows(cols, &x, inverse, path)?;
                let res = if is_hadamard(cols)? {
                    let want = rotate_cpu(&r, &x, inverse);
                    tagged(compare_exact(TY, &data, &got, &want), KernelKind::Rotate)
                } else {
                    let (want, sums) = rotate_f64(cols, &x, inverse)?;
                    compare_dots(
                        TY,
                        KernelKind::Rotate,
                        &data,
                        &got,
                        &want,
                        &sums,
                        DOT_REL_BOUND,
                    )
                };
                rep.results.push(res);
            }
        }
    }
    Ok(())
}

/// Gaussian weights quantized by the CPU reference at SmolLM2's shapes and wider rows.
fn shapes(b: &mut dyn Backend, quick: bool, rng: &mut Rng, rep: &mut Report) -> Result<()> {
    let mut list = super::data::smollm2_weight_shapes();
    let mut wide = wide_shapes();
    if quick {
        list.truncate(2);
        wide.retain(|s| s.cols == 8192 || s.cols == 1376);
        for s in &mut wide {
            s.rows = s.rows.min(4);
        }
    }
    for s in list.into_iter().chain(wide) {
        let bytes = super::data::random_weights(TY, s.rows, s.cols, rng)?;
        rep.results.extend(blocks_through(
            b,
            TwoBitLayout::Tq2r,
            &bytes,
            s.rows,
            s.cols,
            s.name,
            rng,
        )?);
    }
    Ok(())
}

/// Everything the harness runs for tq2_r.
pub(super) fn check(
    b: &mut dyn Backend,
    opts: &CheckOptions,
    rng: &mut Rng,
    rep: &mut Report,
) -> Result<()> {
    match &opts.conformance_dir {
        Some(dir) => conformance(b, &load_seed2bit(dir)?, rng, rep)?,
        None => rep.notes.push(format!(
            "{TY}: seed2bit.json not found (set TQ_CONFORMANCE or --conformance): skipped"
        )),
    }
    random_bytes(b, opts.quick, rng, rep)?;
    rotations(b, opts.quick, rng, rep)?;
    shapes(b, opts.quick, rng, rep)
}
