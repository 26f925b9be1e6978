//! Dense f32 matrix products through the `gemm` crate (the kernel layer `faer` is built on), and
//! the optional rounding of activations that reproduces what ggml's CPU backend feeds its dot
//! products.
//!
//! ggml multiplies a weight of type T by activations converted to T's `vec_dot_type`: f16 for
//! f16 weights, Q8_0/Q8_1 blocks for the legacy 4/5/8-bit types, Q8_K for k-quants. The integer
//! dot product of two such blocks equals, up to float rounding, the f32 dot product of their
//! dequantized values — so rounding the activations the same way and then multiplying by the
//! dequantized weights in f32 reproduces llama.cpp's numerics closely enough for perplexity and
//! KL divergence to agree, without writing an integer kernel per type.

use crate::types::TensorType;
use gemm::Parallelism;
use rayon::prelude::*;

/// `out[r * out_stride + c] = sum_i x[r * k + i] * w[c * k + i]` for `r < rows`, `c < n`:
/// activations (row-major `rows × k`) times the transpose of a weight stored the ggml way
/// (row-major `n × k`, one output feature per row). `threads > 1` splits the product with rayon.
#[allow(clippy::too_many_arguments)] // a GEMM signature: operands, shapes and strides
pub fn matmul_t(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &[f32],
    n: usize,
    out: &mut [f32],
    out_stride: usize,
    threads: usize,
) {
    assert!(x.len() >= rows * k, "matmul: activations too short");
    assert!(w.len() >= n * k, "matmul: weight too short");
    assert!(out_stride >= n, "matmul: output stride");
    if rows == 0 || n == 0 {
        return;
    }
    assert!(
        out.len() >= (rows - 1) * out_stride + n,
        "matmul: output too short"
    );
    if k == 0 {
        for r in 0..rows {
            out[r * out_stride..r * out_stride + n].fill(0.0);
        }
        return;
    }
    let par = if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    // SAFETY: the asserts above bound every index gemm touches: dst is rows × n with row stride
    // out_stride; lhs is rows × k row-major; rhs is k × n with element (i, c) at w[c * k + i].
    unsafe {
        gemm::gemm(
            rows,
            n,
            k,
            out.as_mut_ptr(),
            1,
            out_stride as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `out = a · bᵀ` with explicit strides (all row-major): `a` is `m × k` with row stride `lda`,
/// `b` is `n × k` with row stride `ldb`, `out` is `m × n` with row stride `ldo`. Single-threaded
/// (used inside already-parallel attention).
#[allow(clippy::too_many_arguments)]
pub fn gemm_abt(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    out: &mut [f32],
    ldo: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(a.len() >= (m - 1) * lda + k && b.len() >= (n - 1) * ldb + k);
    assert!(out.len() >= (m - 1) * ldo + n && ldo >= n);
    // SAFETY: bounds asserted above.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            ldo as isize,
            false,
            a.as_ptr(),
            1,
            lda as isize,
            b.as_ptr(),
            ldb as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// `out = a · b` (all row-major): `a` is `m × k` (row stride `lda`), `b` is `k × n` (row stride
/// `ldb`), `out` is `m × n` (row stride `ldo`). Single-threaded.
#[allow(clippy::too_many_arguments)]
pub fn gemm_ab(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    out: &mut [f32],
    ldo: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(a.len() >= (m - 1) * lda + k && (k == 0 || b.len() >= (k - 1) * ldb + n));
    assert!(out.len() >= (m - 1) * ldo + n && ldo >= n);
    // SAFETY: bounds asserted above.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            ldo as isize,
            false,
            a.as_ptr(),
            1,
            lda as isize,
            b.as_ptr(),
            1,
            ldb as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// How activations are rounded before they meet a weight (see the module note).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActRound {
    /// Exact f32.
    None,
    /// Round to f16 (ggml's vec_dot_type for f16 weights).
    F16,
    /// Round to bf16.
    BF16,
    /// Blocks of 32 quantized to 8 bits with an f16 scale (Q8_0 / Q8_1).
    Q8_0,
    /// Blocks of 256 quantized to 8 bits with an f32 scale (Q8_K).
    Q8K,
}

impl ActRound {
    /// The rounding ggml's CPU backend applies to activations multiplied by a weight of type `ty`.
    pub fn for_weight(ty: TensorType) -> ActRound {
        use TensorType::*;
        match ty {
            F16 => ActRound::F16,
            BF16 => ActRound::BF16,
            // ggml-cpu.c type_traits: Q1_0, Q2_0, MXFP4 and NVFP4 also dot with Q8_0.
            Q1_0 | Q2_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4NL | MXFP4 | NVFP4 => {
                ActRound::Q8_0
            }
            Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ2XXS | IQ2XS | IQ3XXS | IQ1S | IQ3S | IQ2S
            | IQ4XS | IQ1M | TQ1_0 | TQ2_0 => ActRound::Q8K,
            _ => ActRound::None,
        }
    }

    /// Block length the rounding works on (the row length must be a multiple of it).
    pub fn block(self) -> usize {
        match self {
            ActRound::Q8_0 => 32,
            ActRound::Q8K => 256,
            _ => 1,
        }
    }

    /// Round one row in place. Rows whose length is not a multiple of the block are left as is.
    pub fn apply(self, row: &mut [f32]) {
        match self {
            ActRound::None => {}
            ActRound::F16 => {
                for v in row.iter_mut() {
                    *v = half::f16::from_f32(*v).to_f32();
                }
            }
            ActRound::BF16 => {
                for v in row.iter_mut() {
                    *v = half::bf16::from_f32(*v).to_f32();
                }
            }
            ActRound::Q8_0 => {
                if row.len().is_multiple_of(32) {
                    with_roundps(row, false)
                }
            }
            ActRound::Q8K => {
                if row.len().is_multiple_of(256) {
                    with_roundps(row, true)
                }
            }
        }
    }

    /// Round every row of a row-major `rows × cols` matrix, in parallel.
    pub fn apply_rows(self, x: &mut [f32], cols: usize) {
        use rayon::prelude::*;
        if self == ActRound::None || cols == 0 {
            return;
        }
        x.par_chunks_mut(cols * 16).for_each(|c| {
            for r in c.chunks_mut(cols) {
                self.apply(r);
            }
        });
    }
}

/// Run `f` on `row`, compiled for SSE4.1 where the CPU has it: `round_ties_even` is then one
/// `roundps` (round to nearest even, the same result for every input) instead of a call to
/// `rintf` per value, which baseline x86-64 (SSE2) has no instruction for. Same bits either way
/// (`q8_rounding_sse41_equals_portable`).
/// `q8k`: Q8_K's rounding ([`round_q8k`]), else Q8_0's ([`round_q8_0`]).
#[inline(always)]
fn with_roundps(row: &mut [f32], q8k: bool) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.1") {
        // SAFETY: SSE4.1 was detected on this CPU.
        return unsafe { sse41(row, q8k) };
    }
    match q8k {
        true => round_q8k(row),
        false => round_q8_0(row),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn sse41(row: &mut [f32], q8k: bool) {
    match q8k {
        true => round_q8k(row),
        false => round_q8_0(row),
    }
}

/// ggml's Q8_0 activation rounding of one row (a multiple of 32 long): per 32 values
/// `d = max|v| / 127` (stored as f16), `v ← round(v · 127 / max|v|) · d`.
#[inline(always)]
fn round_q8_0(row: &mut [f32]) {
    for b in row.chunks_exact_mut(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let dh = half::f16::from_f32(d).to_f32();
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for v in b.iter_mut() {
            *v = (*v * id).round_ties_even() * dh;
        }
    }
}

/// ggml's Q8_K activation rounding of one row (a multiple of 256 long): per 256 values the
/// signed value of largest magnitude `max` sets `iscale = -127 / max`, `v ← min(round(iscale ·
/// v), 127) / iscale`.
#[inline(always)]
fn round_q8k(row: &mut [f32]) {
    for b in row.chunks_exact_mut(256) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in b.iter() {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.fill(0.0);
            continue;
        }
        let iscale = -127.0 / max;
        let d = 1.0 / iscale;
        for v in b.iter_mut() {
            let q = (iscale * *v).round_ties_even().min(127.0);
            *v = q * d;
        }
    }
}

/// The token-chunked driver of the integer matmuls (`q8dot`, `tqdot`): `out` holds `rows` tokens'
/// outputs `stride` apart (`n` used per token), split into chunks of tokens run in parallel; each
/// call gets its tokens `c0..c1` and `out` from token `c0`'s row. A token's outputs come from one
/// call whatever the thread count, so the result does not depend on it.
pub(crate) fn for_token_chunks(
    rows: usize,
    n: usize,
    stride: usize,
    threads: usize,
    out: &mut [f32],
    run: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    if rows == 0 || n == 0 {
        return;
    }
    assert!(stride >= n && out.len() >= (rows - 1) * stride + n);
    // Tokens per task: enough tasks for the threads, few enough to reuse each weight tile.
    let per = rows.div_ceil(threads.max(1) * 4).clamp(4, 64);
    out.par_chunks_mut(per * stride)
        .enumerate()
        .for_each(|(ci, o)| {
            let c0 = ci * per;
            if c0 < rows {
                run(c0, rows.min(c0 + per), o);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SSE4.1 build of the activation rounding gives the portable build's bits: random rows
    /// over many magnitudes, rows whose scaled values are exact halves (ties), zeros, ±0.
    #[test]
    fn q8_rounding_sse41_equals_portable() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut rows: Vec<Vec<f32>> = vec![];
        for k in 0..40i32 {
            let e = (k % 20 - 10) as f32;
            rows.push(
                (0..512)
                    .map(|_| ((next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * 2f32.powf(e))
                    .collect(),
            );
        }
        // max|v| = 127 (Q8_0: id = 1; Q8_K: iscale = -1): values k + 0.5 are exact ties.
        rows.push(
            (0..512)
                .map(|i| {
                    if i % 32 == 0 {
                        127.0
                    } else {
                        (i % 64) as f32 - 31.5
                    }
                })
                .collect(),
        );
        rows.push(
            (0..512)
                .map(|i| {
                    if i % 256 == 0 {
                        -127.0
                    } else {
                        (i % 50) as f32 - 24.5
                    }
                })
                .collect(),
        );
        rows.push(vec![0.0; 512]);
        rows.push(
            (0..512)
                .map(|i| if i % 2 == 0 { 0.0 } else { -0.0 })
                .collect(),
        );
        let mut ties = 0;
        for r in &rows {
            for (q8k, f) in [(false, round_q8_0 as fn(&mut [f32])), (true, round_q8k)] {
                let mut a = r.clone();
                f(&mut a);
                let mut b = r.clone();
                with_roundps(&mut b, q8k);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b));
                ties += r.iter().filter(|v| v.fract().abs() == 0.5).count();
            }
        }
        assert!(ties > 500, "{ties}");
        // And the dispatching entry point is the same function.
        let mut a = rows[3].clone();
        ActRound::Q8K.apply(&mut a);
        let mut b = rows[3].clone();
        round_q8k(&mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn matmul_matches_naive() {
        let (rows, k, n) = (7, 13, 5);
        let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 5) % 13) as f32 * 0.5 - 3.0)
            .collect();
        let mut out = vec![0f32; rows * (n + 2)];
        matmul_t(&x, rows, k, &w, n, &mut out, n + 2, 1);
        for r in 0..rows {
            for c in 0..n {
                let want: f32 = (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum();
                assert!((out[r * (n + 2) + c] - want).abs() < 1e-4, "{r} {c}");
            }
        }
    }

    #[test]
    fn q8_rounding_matches_registry_dequantize() {
        // Values on an exact grid survive; rounding error is bounded by half a step.
        let mut row: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.013).collect();
        let orig = row.clone();
        ActRound::Q8_0.apply(&mut row);
        for b in 0..2 {
            let amax = orig[b * 32..b * 32 + 32]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            for i in b * 32..b * 32 + 32 {
                assert!((row[i] - orig[i]).abs() <= amax / 127.0 * 0.51 + 1e-6);
            }
        }
        let mut r2 = orig.clone();
        ActRound::Q8K.apply(&mut r2[..]);
        assert_eq!(r2, orig, "64 is not a Q8_K block multiple: untouched");
    }
}
