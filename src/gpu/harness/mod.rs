//! The parity harness: [`check`] runs every kernel of a [`Backend`] on the conformance vectors and
//! on random tensors of real shapes, and compares each output with the CPU reference
//! ([`compare`]); [`data`] makes the inputs, [`report`] prints the result; [`job`] is `tq kernels
//! check` (every requested backend through [`check`], and the CUDA paths' CPU model).

pub mod compare;
pub mod data;
pub mod job;
pub mod report;
pub mod tq2r;
pub mod tq2t;

use self::compare::{compare_dots, compare_exact, merge, KernelKind, KernelResult, DOT_REL_BOUND};
use self::data::*;
use super::cpu::cpu_reference;
use super::{turbo_specs, Backend, BackendKind, TurboSpec, KERNEL_TYPES};
use crate::error::{Error, Result};
use crate::types::turbo;
use crate::types::TensorType;
use std::path::PathBuf;

/// What [`check`] runs.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    pub types: Vec<TensorType>,
    /// Directory with the conformance vectors (`None`: that part is skipped and reported).
    pub conformance_dir: Option<PathBuf>,
    /// Fewer/smaller random tensors (tests).
    pub quick: bool,
    /// Also time the dequantize kernels on a large tensor.
    pub bench: bool,
    pub seed: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            types: KERNEL_TYPES.to_vec(),
            conformance_dir: find_conformance_dir(),
            quick: false,
            bench: false,
            seed: 0x7167_7075,
        }
    }
}

/// Decode throughput of one type.
#[derive(Clone, Debug)]
pub struct Throughput {
    pub ty: TensorType,
    pub values: usize,
    pub seconds: f64,
    /// Bytes read (blocks) + bytes written (f32) per second, in GB/s.
    pub gbs: f64,
}

/// Mat-vec time of one type at one shape (`--bench`).
#[derive(Clone, Debug)]
pub struct MatvecTime {
    pub ty: TensorType,
    pub shape: &'static str,
    pub rows: usize,
    pub cols: usize,
    pub seconds: f64,
    /// Weight bytes read per second, in GB/s.
    pub gbs: f64,
}

/// Everything [`check`] found.
#[derive(Clone, Debug)]
pub struct Report {
    pub backend: BackendKind,
    pub device: String,
    pub results: Vec<KernelResult>,
    pub notes: Vec<String>,
    pub throughput: Vec<Throughput>,
    pub matvec_times: Vec<MatvecTime>,
    pub peak_gbs: Option<f64>,
}

impl Report {
    pub fn pass(&self) -> bool {
        self.results.iter().all(|r| r.pass)
    }
}

/// Run every kernel of `opts.types` on `backend` and compare with the CPU reference.
pub fn check(backend: &mut dyn Backend, opts: &CheckOptions) -> Result<Report> {
    let mut rep = Report {
        backend: backend.kind(),
        device: backend.device_name(),
        results: vec![],
        notes: vec![],
        throughput: vec![],
        matvec_times: vec![],
        peak_gbs: backend.peak_bandwidth_gbs(),
    };
    let mut rng = Rng(opts.seed);
    for &ty in &opts.types {
        if !KERNEL_TYPES.contains(&ty) {
            return Err(Error::Unsupported(format!(
                "{ty}: no GPU kernel (kernels exist for tq4_1s, tq3_1s, turbo2, turbo3, turbo4, tq2_r, tq2_t)"
            )));
        }
        if ty.is_row_rotated() {
            // Row-rotated 2-bit weights: their own data sets (seed2bit.json, rotations).
            tq2r::check(backend, opts, &mut rng, &mut rep)?;
        } else if ty == TensorType::TQ2T {
            // Trellis-coded 2-bit weights on the same rotation (issue 19).
            tq2t::check(backend, opts, &mut rng, &mut rep)?;
        } else {
            check_blocks(backend, ty, opts, &mut rng, &mut rep)?;
        }
        // 5. Throughput.
        if opts.bench {
            let values = backend.bench_values(ty);
            let bytes = random_weights_fast(ty, values, &mut rng);
            let secs = backend.time_dequantize(ty, &bytes, 10)?;
            let moved = bytes.len() as f64 + 4.0 * values as f64;
            rep.throughput.push(Throughput {
                ty,
                values,
                seconds: secs,
                gbs: moved / secs / 1e9,
            });
            if ty.is_tq_weight() || ty.rotates_rows() {
                // The mat-vec (TQ: prerotate + mat-vec; tq2_r: rotation + GEMV) at SmolLM2's
                // FFN shapes, weights resident.
                for s in smollm2_weight_shapes().into_iter().skip(2) {
                    let w = random_weights_fast(ty, s.rows * s.cols, &mut rng);
                    let secs = backend.time_matvec(ty, &w, s.rows, s.cols, 10)?;
                    rep.matvec_times.push(MatvecTime {
                        ty,
                        shape: s.name,
                        rows: s.rows,
                        cols: s.cols,
                        seconds: secs,
                        gbs: w.len() as f64 / secs / 1e9,
                    });
                }
            }
        }
    }
    Ok(rep)
}

/// The block types (TQ weights, turbo KV): conformance vectors, random bytes, real shapes, and
/// the other turbo layouts.
fn check_blocks(
    backend: &mut dyn Backend,
    ty: TensorType,
    opts: &CheckOptions,
    rng: &mut Rng,
    rep: &mut Report,
) -> Result<()> {
    // 1. Conformance vectors: dequantize every case; dot every all-finite case.
    match &opts.conformance_dir {
        Some(dir) => {
            let conf = load_conformance(dir, ty)?;
            let all: Vec<u8> = conf
                .cases
                .iter()
                .flat_map(|c| c.1.iter().copied())
                .collect();
            let want = cpu_reference(ty, &all)?;
            let got = backend.dequantize(ty, &all)?;
            rep.results
                .push(compare_exact(ty, "conformance", &got, &want));
            rep.results.push(conformance_dots(backend, ty, &conf, rng)?);
        }
        None => rep.notes.push(format!(
            "{ty}: conformance vectors not found (set TQ_CONFORMANCE or --conformance): skipped"
        )),
    }
    // 2. Random bytes: every scale bit pattern (subnormal, inf, NaN) and index.
    let nblk = if opts.quick { 2048 } else { 1 << 16 };
    let bytes = rng.bytes(nblk * ty.block_bytes());
    let want = cpu_reference(ty, &bytes)?;
    let got = backend.dequantize(ty, &bytes)?;
    rep.results
        .push(compare_exact(ty, "random-bytes", &got, &want));
    // 3. Real shapes: quantized Gaussian tensors, dequantize + dot.
    check_shapes(backend, ty, opts.quick, rng, rep)?;
    // 4. The other turbo layouts and codebooks `tq eval` / `tq kv` simulate.
    if !ty.is_tq_weight() {
        for spec in turbo_specs(ty)?.into_iter().filter(|s| !s.is_stock()) {
            check_turbo_variant(backend, &spec, opts, rng, rep)?;
        }
    }
    Ok(())
}

/// Gaussian tensors quantized by the CPU reference at real shapes (SmolLM2's weights for TQ, KV
/// caches for turbo): dequantize (bit-exact), and mat-vec with an outlier activation or Q·K with
/// a rotated query (relative bound).
fn check_shapes(
    backend: &mut dyn Backend,
    ty: TensorType,
    quick: bool,
    rng: &mut Rng,
    rep: &mut Report,
) -> Result<()> {
    let shapes = if ty.is_tq_weight() {
        let mut s = smollm2_weight_shapes();
        if quick {
            s.truncate(2);
        }
        s
    } else {
        let mut s = kv_shapes();
        if quick {
            s[0].rows = 512;
            s.truncate(2);
        }
        s
    };
    for s in shapes {
        let w = random_weights(ty, s.rows, s.cols, rng)?;
        let want = cpu_reference(ty, &w)?;
        let got = backend.dequantize(ty, &w)?;
        rep.results.push(compare_exact(ty, s.name, &got, &want));
        let (kind, x) = if ty.is_tq_weight() {
            (KernelKind::MatVec, random_activation(s.cols, rng))
        } else {
            (
                KernelKind::QkDot,
                rotate_query(&random_activation(s.cols, rng)),
            )
        };
        let (dots, sums) = reference_dots(ty, &w, s.rows, s.cols, &x)?;
        let got = if ty.is_tq_weight() {
            backend.matvec(ty, &w, s.rows, s.cols, &x)?
        } else {
            backend.qk_dot(ty, &w, s.rows, s.cols, &x)?
        };
        rep.results.push(compare_dots(
            ty,
            kind,
            s.name,
            &got,
            &dots,
            &sums,
            DOT_REL_BOUND,
        ));
        if ty.is_tq_weight() {
            rep.results
                .push(check_matmul(backend, ty, &w, &s, quick, rng)?);
        }
    }
    Ok(())
}

/// The mat-mul on a weight of a real shape: a token count that is not a multiple of the tile
/// (the padding path), each row of Y held to the f64 reference dot of its token, like the mat-vec.
fn check_matmul(
    backend: &mut dyn Backend,
    ty: TensorType,
    w: &[u8],
    s: &Shape,
    quick: bool,
    rng: &mut Rng,
) -> Result<KernelResult> {
    let tokens = if quick { 11 } else { 37 };
    let x: Vec<f32> = (0..tokens)
        .flat_map(|_| random_activation(s.cols, rng))
        .collect();
    let (mut dots, mut sums) = (vec![], vec![]);
    for t in 0..tokens {
        let (d, a) = reference_dots(ty, w, s.rows, s.cols, &x[t * s.cols..(t + 1) * s.cols])?;
        dots.extend(d);
        sums.extend(a);
    }
    let got = backend.matmul(ty, w, s.rows, s.cols, &x, tokens)?;
    Ok(compare_dots(
        ty,
        KernelKind::MatMul,
        &format!("{} x {tokens} tokens", s.name),
        &got,
        &dots,
        &sums,
        DOT_REL_BOUND,
    ))
}

/// One non-registry turbo layout/codebook: the conformance inputs re-quantized in that layout,
/// random bytes, and a KV cache of a real shape (SmolLM2's 64-wide heads for 64-value groups,
/// Llama-3-8B's for 128), through dequantize (bit-exact) and Q·K (relative bound).
fn check_turbo_variant(
    backend: &mut dyn Backend,
    spec: &TurboSpec,
    opts: &CheckOptions,
    rng: &mut Rng,
    rep: &mut Report,
) -> Result<()> {
    let ty = spec.ty;
    let g = spec.layout.group;
    let tag = |d: &str| format!("[{}] {d}", spec.label());
    let mut run = |rep: &mut Report,
                   data: &str,
                   bytes: &[u8],
                   rows: usize,
                   cols: usize,
                   rng: &mut Rng|
     -> Result<()> {
        let want = spec.reference(bytes);
        let got = backend.turbo_dequantize(spec, bytes)?;
        rep.results.push(compare_exact(ty, &tag(data), &got, &want));
        if rows == 0 {
            return Ok(());
        }
        // Rows whose decode is not all finite are left to the dequantize check.
        let finite: Vec<usize> = (0..rows)
            .filter(|r| want[r * cols..(r + 1) * cols].iter().all(|v| v.is_finite()))
            .collect();
        let rb = cols / g * spec.layout.block_bytes();
        let k: Vec<u8> = finite
            .iter()
            .flat_map(|r| bytes[r * rb..(r + 1) * rb].iter().copied())
            .collect();
        let w: Vec<f32> = finite
            .iter()
            .flat_map(|r| want[r * cols..(r + 1) * cols].iter().copied())
            .collect();
        let q = rotate_query_groups(&random_activation(cols, rng), g);
        let (dots, sums) = dots_of(&w, finite.len(), cols, &q);
        let got = backend.turbo_qk(spec, &k, finite.len(), cols, &q)?;
        rep.results.push(compare_dots(
            ty,
            KernelKind::QkDot,
            &tag(data),
            &got,
            &dots,
            &sums,
            DOT_REL_BOUND,
        ));
        Ok(())
    };
    // Conformance inputs, quantized in this layout by the CPU reference (`quantize_group`).
    if let Some(dir) = &opts.conformance_dir {
        let conf = load_conformance(dir, ty)?;
        let src: Vec<f32> = conf
            .inputs
            .iter()
            .filter(|x| !x.is_empty() && x.len() % g == 0)
            .flat_map(|x| x.iter().copied())
            .collect();
        if !src.is_empty() {
            let bytes = spec.quantize(&src);
            run(rep, "conformance inputs", &bytes, src.len() / g, g, rng)?;
        }
    }
    let nblk = if opts.quick { 1024 } else { 8192 };
    let bytes = rng.bytes(nblk * spec.layout.block_bytes());
    run(rep, "random-bytes", &bytes, 0, 0, rng)?;
    let s = if g == 64 {
        Shape {
            name: "smollm2.k_cache[512 tok x 3 heads, hd 64]",
            rows: 1536,
            cols: 64,
        }
    } else {
        Shape {
            name: "llama3-8b.k_cache[128 tok x 8 heads, hd 128]",
            rows: 1024,
            cols: 128,
        }
    };
    let rows = if opts.quick { s.rows / 4 } else { s.rows };
    let sigma = 0.02 + 0.05 * rng.uniform();
    let src: Vec<f32> = (0..rows * s.cols)
        .map(|_| (rng.gauss() * sigma) as f32)
        .collect();
    let bytes = spec.quantize(&src);
    run(rep, s.name, &bytes, rows, s.cols, rng)
}

/// Blocks for the throughput run: random indices with sane (finite, normal) scales; quantizing
/// 16 Mi values with the reference would take longer than the benchmark.
fn random_weights_fast(ty: TensorType, values: usize, rng: &mut Rng) -> Vec<u8> {
    if ty == TensorType::TQ2T {
        let cols = crate::types::tq2t::QK;
        return tq2t::random_blocks(values / cols, cols, rng);
    }
    let nb = values / ty.block_size();
    let bb = ty.block_bytes();
    let mut out = rng.bytes(nb * bb);
    let scale_bytes = if ty.is_tq_weight() { 4 } else { 2 };
    for b in out.chunks_exact_mut(bb) {
        for k in (0..scale_bytes).step_by(2) {
            // f16 in [2^-8, 2^-6): exponent 7..8, random mantissa.
            let h: u16 = (7 + (rng.next_u64() & 1) as u16) << 10 | (rng.next_u64() as u16 & 0x3ff);
            b[k..k + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    out
}

/// The conformance rows as mat-vec (TQ: each case is one row of `n`) or Q·K (turbo: each
/// case's groups are rows of 128) inputs. Rows whose reference dequantization is not all finite
/// are left to the dequantize check (their dot is inf/NaN in any order).
fn conformance_dots(
    backend: &mut dyn Backend,
    ty: TensorType,
    conf: &Conformance,
    rng: &mut Rng,
) -> Result<KernelResult> {
    // Group cases by row length so each group is one matrix.
    let mut by_len: std::collections::BTreeMap<usize, Vec<u8>> = Default::default();
    let mut skipped = 0;
    for (_, bytes) in &conf.cases {
        let n = bytes.len() / ty.block_bytes() * ty.block_size();
        let deq = cpu_reference(ty, bytes)?;
        if tq_row_cols(ty, n) == 0 {
            continue;
        }
        let cols = tq_row_cols(ty, n);
        for (rb, rv) in bytes
            .chunks_exact(cols / ty.block_size() * ty.block_bytes())
            .zip(deq.chunks_exact(cols))
        {
            if rv.iter().all(|v| v.is_finite()) {
                by_len.entry(cols).or_default().extend_from_slice(rb);
            } else {
                skipped += 1;
            }
        }
    }
    let kind = if ty.is_tq_weight() {
        KernelKind::MatVec
    } else {
        KernelKind::QkDot
    };
    let mut total: Option<KernelResult> = None;
    for (cols, bytes) in by_len {
        let rows = bytes.len() / (cols / ty.block_size() * ty.block_bytes());
        let mut x = random_activation(cols, rng);
        if !ty.is_tq_weight() {
            x = rotate_query(&x);
        }
        let (dots, sums) = reference_dots(ty, &bytes, rows, cols, &x)?;
        let got = if ty.is_tq_weight() {
            backend.matvec(ty, &bytes, rows, cols, &x)?
        } else {
            backend.qk_dot(ty, &bytes, rows, cols, &x)?
        };
        let r = compare_dots(ty, kind, "conformance", &got, &dots, &sums, DOT_REL_BOUND);
        total = Some(match total {
            None => r,
            Some(t) => merge(t, r),
        });
    }
    let mut r = total
        .unwrap_or_else(|| compare_dots(ty, kind, "conformance", &[], &[], &[], DOT_REL_BOUND));
    if skipped > 0 {
        r.data = format!("conformance ({skipped} non-finite rows left to dequantize)");
    }
    Ok(r)
}

/// Row length used for a conformance case of `n` values: TQ cases are one row; turbo cases are
/// rows of 128 (one KV head each).
fn tq_row_cols(ty: TensorType, n: usize) -> usize {
    if ty.is_tq_weight() {
        n
    } else {
        turbo::QK_TURBO
    }
}
