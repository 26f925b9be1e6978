//! The int8 path for q8_0 weights: what ggml's CPU backend computes for them.
//!
//! ggml multiplies a q8_0 weight by the activation quantized to Q8_0 (per 32 values `d = max|v| /
//! 127` stored as f16, `q = round(v · 127 / max|v|)`, the rounding `--numerics ggml` applies
//! before the f32 GEMM: `matmul::ActRound::Q8_0`) with integer dot products per block, scaled by
//! the two f16 scales. This does the same: the block's integer dot is exact, so the result
//! differs from the f32 path (rounded activations × dequantized weights) by float rounding only.
//!
//! Layout, chosen so that one 256-bit register holds 8 weight rows' partial sums for one token:
//! - weights, per tile of 8 rows and block: 8 steps `j` of 32 bytes; byte `4r + e` of step `j` is
//!   element `4j + e` of row `r` (the file's int8 quants), plus the 8 rows' f32 scales;
//! - activations, per token: the int8 quants row-major (32 per block) and one f32 scale per block.
//!
//! Per block and token, `isum[r] = Σ_j Σ_e w · x` (exact: |isum| ≤ 32·128·127 < 2²⁴), then
//! `acc[r] = fma(f32(isum[r]), dw[r] · dx, acc[r])` block by block; `acc[r]` is the output. The
//! scalar reference [`tile_ref`] does these operations in this order; the AVX2 kernel
//! (`vpsignb`, `vpmaddubsw`, `vpmaddwd`: ggml's own AVX2 sequence) and the AVX-512 VNNI kernel
//! (`vpdpbusd` on the activation + 128 with a `-128 · Σw` correction) give the same integers, and
//! the tests hold them bit-equal. Every output is computed on its own in a fixed order, so the
//! result does not depend on the thread count.

// The TQ int8 path's rounding: ties to even by the addition, no library call on baseline x86-64.
use super::matmul::for_token_chunks;
use super::tqdot::round_even;
use crate::types::float::f16_bits_to_f32;
use rayon::prelude::*;

/// Values per q8_0 block.
const QK: usize = 32;
/// Bytes per q8_0 block in the file (f16 scale, 32 int8 quants).
const BLOCK_BYTES: usize = 34;
/// Weight rows per tile.
const TILE: usize = 8;
/// Bytes of quants per tile and block.
const TB: usize = QK * TILE;

/// A q8_0 weight prepared for the int8 dot products.
pub struct Q8Int8 {
    n: usize,
    nb: usize,
    quants: Vec<i8>,
    /// `-128 · Σ` of each row's quants per block (the VNNI kernel's correction).
    corr: Vec<i32>,
    scale: Vec<f32>,
}

impl std::fmt::Debug for Q8Int8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Q8Int8 {{ n: {}, k: {} }}", self.n, self.nb * QK)
    }
}

impl Q8Int8 {
    /// Prepare `n` rows of `k` values from their q8_0 bytes. `Err`: a one-line reason (the
    /// caller names the file and tensor).
    pub fn new(bytes: &[u8], n: usize, k: usize) -> Result<Q8Int8, String> {
        if !k.is_multiple_of(QK) {
            return Err(format!("row length {k} is not a multiple of {QK}"));
        }
        let nb = k / QK;
        let need = n
            .checked_mul(nb * BLOCK_BYTES)
            .ok_or_else(|| "tensor too large".to_string())?;
        if bytes.len() < need {
            return Err(format!("{} bytes of data, {need} expected", bytes.len()));
        }
        let tiles = n.div_ceil(TILE);
        let mut quants = vec![0i8; tiles * nb * TB];
        let mut corr = vec![0i32; tiles * nb * TILE];
        let mut scale = vec![0f32; tiles * nb * TILE];
        quants
            .par_chunks_mut(nb * TB)
            .zip(
                corr.par_chunks_mut(nb * TILE)
                    .zip(scale.par_chunks_mut(nb * TILE)),
            )
            .enumerate()
            .try_for_each(|(t, (q, (corr, sc)))| {
                for r in 0..TILE.min(n - t * TILE) {
                    let row = t * TILE + r;
                    for b in 0..nb {
                        let o = (row * nb + b) * BLOCK_BYTES;
                        let blk = &bytes[o..o + BLOCK_BYTES];
                        let d = f16_bits_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                        if !d.is_finite() {
                            return Err(format!("non-finite scale {d} at row {row}, block {b}"));
                        }
                        sc[b * TILE + r] = d;
                        let mut sum = 0i32;
                        for (i, &v) in blk[2..].iter().enumerate() {
                            let (j, e) = (i / 4, i % 4);
                            q[b * TB + j * 32 + r * 4 + e] = v as i8;
                            sum += v as i8 as i32;
                        }
                        corr[b * TILE + r] = -128 * sum;
                    }
                }
                Ok(())
            })?;
        Ok(Q8Int8 {
            n,
            nb,
            quants,
            corr,
            scale,
        })
    }

    fn tiles(&self) -> usize {
        self.n.div_ceil(TILE)
    }
}

/// Activations quantized to Q8_0 for [`matmul`]: `rows` tokens of `nb` blocks.
pub(crate) struct ActQ8 {
    rows: usize,
    nb: usize,
    xq: Vec<i8>,
    xd: Vec<f32>,
}

impl ActQ8 {
    /// Quantize the `rows × k` activations `x` to Q8_0 the way ggml does (and
    /// `ActRound::Q8_0` rounds): per 32 values `d = f16(max|v| / 127)`, `q = round_ties_even(v ·
    /// 127 / max|v|)`. A block holding a NaN or an infinity gets a NaN scale, so it poisons its
    /// results as it does in the f32 path. `k` must be a multiple of 32.
    pub fn new(x: &[f32], rows: usize, k: usize) -> ActQ8 {
        assert!(k.is_multiple_of(QK) && x.len() >= rows * k);
        let nb = k / QK;
        let mut xq = vec![0i8; rows * k];
        let mut xd = vec![0f32; rows * nb];
        if k > 0 {
            #[cfg(target_arch = "x86_64")]
            let avx2 = is_x86_feature_detected!("avx2");
            xq.par_chunks_mut(k)
                .zip(xd.par_chunks_mut(nb))
                .zip(x[..rows * k].par_chunks(k))
                .for_each(|((q, d), xr)| {
                    #[cfg(target_arch = "x86_64")]
                    if avx2 {
                        // SAFETY: the CPU has AVX2.
                        unsafe { quant_row_avx2(xr, q, d) };
                        return;
                    }
                    quant_row(xr, q, d);
                });
        }
        ActQ8 { rows, nb, xq, xd }
    }
}

/// One token's row for [`ActQ8::new`].
#[inline(always)]
fn quant_row(xr: &[f32], q: &mut [i8], d: &mut [f32]) {
    for ((xb, qb), db) in xr.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).zip(d) {
        let finite = xb.iter().all(|v| v.is_finite());
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let dh = half::f16::from_f32(amax / 127.0).to_f32();
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        *db = if finite { dh } else { f32::NAN };
        for (qi, &v) in qb.iter_mut().zip(xb) {
            *qi = round_even(v * id).clamp(-127.0, 127.0) as i8;
        }
    }
}

/// [`quant_row`] compiled for AVX2 (the same IEEE operations, so the same values).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quant_row_avx2(xr: &[f32], q: &mut [i8], d: &mut [f32]) {
    quant_row(xr, q, d)
}

/// The scalar reference: the 8 outputs of weight tile `t` for token `c` (rows past the
/// weight's end are 0).
pub(crate) fn tile_ref(w: &Q8Int8, t: usize, a: &ActQ8, c: usize) -> [f32; TILE] {
    let nb = w.nb;
    let mut acc = [0f32; TILE];
    for b in 0..nb {
        let wb = t * nb + b;
        let x = &a.xq[(c * nb + b) * QK..(c * nb + b + 1) * QK];
        let mut isum = [0i32; TILE];
        for j in 0..QK / 4 {
            for (r, s) in isum.iter_mut().enumerate() {
                for e in 0..4 {
                    *s += w.quants[wb * TB + j * 32 + r * 4 + e] as i32 * x[4 * j + e] as i32;
                }
            }
        }
        let xd = a.xd[c * nb + b];
        for r in 0..TILE {
            acc[r] = (isum[r] as f32).mul_add(w.scale[wb * TILE + r] * xd, acc[r]);
        }
    }
    acc
}

/// Which kernel runs the tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// With the `avx512` cargo feature (on by default), on a CPU with AVX-512 VNNI.
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    Vnni,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub fn best() -> Kernel {
        match super::tqdot::Kernel::best() {
            #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
            super::tqdot::Kernel::Vnni => Kernel::Vnni,
            #[cfg(target_arch = "x86_64")]
            super::tqdot::Kernel::Avx2 => Kernel::Avx2,
            _ => Kernel::Scalar,
        }
    }

    /// Every kernel this CPU runs (tests).
    #[cfg(test)]
    pub fn available() -> Vec<Kernel> {
        super::tqdot::Kernel::available()
            .into_iter()
            .map(|k| match k {
                #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
                super::tqdot::Kernel::Vnni => Kernel::Vnni,
                #[cfg(target_arch = "x86_64")]
                super::tqdot::Kernel::Avx2 => Kernel::Avx2,
                super::tqdot::Kernel::Scalar => Kernel::Scalar,
            })
            .collect()
    }
}

/// Whether the int8 path beats the f32 one on this CPU and build: with the AVX2 or the VNNI
/// kernel (docs/bench/speed.md, "q8_0 int8 path").
pub(crate) fn int8_is_faster() -> bool {
    Kernel::best() != Kernel::Scalar
}

/// `out[c * stride + i] = (x_c · W_i)` for every token `c < a.rows` and output `i < w.n`, with
/// the best kernel.
pub(crate) fn matmul(w: &Q8Int8, a: &ActQ8, out: &mut [f32], stride: usize, threads: usize) {
    matmul_with(Kernel::best(), w, a, out, stride, threads)
}

/// [`matmul`] with a chosen kernel.
pub(crate) fn matmul_with(
    kernel: Kernel,
    w: &Q8Int8,
    a: &ActQ8,
    out: &mut [f32],
    stride: usize,
    threads: usize,
) {
    assert_eq!(w.nb, a.nb, "q8_0 int8 matmul: input widths differ");
    for_token_chunks(a.rows, w.n, stride, threads, out, |c0, c1, o| {
        run_chunk(kernel, w, a, c0, c1, o, stride)
    });
}

/// Tokens per kernel call.
const CT: usize = 4;

/// Tokens `c0..c1` against every weight tile; `o` starts at token `c0`'s output row.
fn run_chunk(
    kernel: Kernel,
    w: &Q8Int8,
    a: &ActQ8,
    c0: usize,
    c1: usize,
    o: &mut [f32],
    stride: usize,
) {
    for t in 0..w.tiles() {
        let i0 = t * TILE;
        let m = TILE.min(w.n - i0);
        let mut c = c0;
        while c < c1 {
            let ct = CT.min(c1 - c);
            let mut res = [[0f32; TILE]; CT];
            match kernel {
                Kernel::Scalar => {
                    for (ci, r) in res.iter_mut().enumerate().take(ct) {
                        *r = tile_ref(w, t, a, c + ci);
                    }
                }
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2 => {
                    // SAFETY: the kernel was chosen from the CPU's detected features; tile `t`
                    // and tokens `c..c + ct` are inside `w` and `a`.
                    unsafe { x86::micro(kernel, w, t, a, c, ct, &mut res) }
                }
                #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
                Kernel::Vnni => {
                    // SAFETY: as for Avx2.
                    unsafe { x86::micro(kernel, w, t, a, c, ct, &mut res) }
                }
            }
            for (ci, v) in res.iter().enumerate().take(ct) {
                let row = &mut o[(c + ci - c0) * stride..];
                row[i0..i0 + m].copy_from_slice(&v[..m]);
            }
            c += ct;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ActQ8, Kernel, Q8Int8, CT, QK, TB, TILE};
    use std::arch::x86_64::*;

    /// Tile `t` × tokens `c..c + ct` (ct ≤ CT) into `res[token]`.
    pub(super) unsafe fn micro(
        kernel: Kernel,
        w: &Q8Int8,
        t: usize,
        a: &ActQ8,
        c: usize,
        ct: usize,
        res: &mut [[f32; TILE]; CT],
    ) {
        macro_rules! go {
            ($f:ident) => {
                match ct {
                    4 => $f::<4>(w, t, a, c, &mut res[..]),
                    _ => {
                        for i in 0..ct {
                            $f::<1>(w, t, a, c + i, &mut res[i..]);
                        }
                    }
                }
            };
        }
        match kernel {
            #[cfg(feature = "avx512")]
            Kernel::Vnni => go!(tile_vnni),
            _ => go!(tile_avx2),
        }
    }

    /// The 4 activation bytes `4j..4j + 3` of token `c`, block `b`, in every 32-bit lane.
    #[inline(always)]
    unsafe fn bcast(a: &ActQ8, c: usize, b: usize, j: usize) -> __m256i {
        let p = a.xq.as_ptr().add((c * a.nb + b) * QK + 4 * j) as *const i32;
        _mm256_set1_epi32(p.read_unaligned())
    }

    /// `acc = fma(f32(isum), dw · dx, acc)` for one block and token.
    #[inline(always)]
    unsafe fn scale_acc(
        acc: __m256,
        isum: __m256i,
        w: &Q8Int8,
        wb: usize,
        a: &ActQ8,
        xb: usize,
    ) -> __m256 {
        let d = _mm256_set1_ps(*a.xd.get_unchecked(xb));
        let s = _mm256_mul_ps(_mm256_loadu_ps(w.scale.as_ptr().add(wb * TILE)), d);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), s, acc)
    }

    /// One tile × `N` tokens with AVX2: `vpmaddubsw` on |w| and x·sign(w) (pairs ≤ 2·128·127, no
    /// saturation), then `vpmaddwd` by ones: the exact lane sums.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const N: usize>(
        w: &Q8Int8,
        t: usize,
        a: &ActQ8,
        c: usize,
        res: &mut [[f32; TILE]],
    ) {
        let nb = w.nb;
        let mut acc = [_mm256_setzero_ps(); N];
        let ones = _mm256_set1_epi16(1);
        for b in 0..nb {
            let wb = t * nb + b;
            let mut is = [_mm256_setzero_si256(); N];
            for j in 0..QK / 4 {
                let wv = _mm256_loadu_si256(w.quants.as_ptr().add(wb * TB + j * 32) as *const _);
                // |−128| is 128 as the unsigned operand: still exact.
                let aw = _mm256_sign_epi8(wv, wv);
                for (ci, s) in is.iter_mut().enumerate() {
                    let sx = _mm256_sign_epi8(bcast(a, c + ci, b, j), wv);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                    *s = _mm256_add_epi32(*s, p);
                }
            }
            for ci in 0..N {
                acc[ci] = scale_acc(acc[ci], is[ci], w, wb, a, (c + ci) * nb + b);
            }
        }
        for ci in 0..N {
            _mm256_storeu_ps(res[ci].as_mut_ptr(), acc[ci]);
        }
    }

    /// One tile × `N` tokens with AVX-512 VNNI (256-bit `vpdpbusd`): the activation made
    /// unsigned (+128), the sums corrected by `-128 · Σw`.
    #[cfg(feature = "avx512")]
    #[allow(clippy::incompatible_msrv)]
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    unsafe fn tile_vnni<const N: usize>(
        w: &Q8Int8,
        t: usize,
        a: &ActQ8,
        c: usize,
        res: &mut [[f32; TILE]],
    ) {
        let nb = w.nb;
        let mut acc = [_mm256_setzero_ps(); N];
        let flip = _mm256_set1_epi8(-128);
        for b in 0..nb {
            let wb = t * nb + b;
            let corr = _mm256_loadu_si256(w.corr.as_ptr().add(wb * TILE) as *const _);
            let mut is = [corr; N];
            for j in 0..QK / 4 {
                let wv = _mm256_loadu_si256(w.quants.as_ptr().add(wb * TB + j * 32) as *const _);
                for (ci, s) in is.iter_mut().enumerate() {
                    let ux = _mm256_xor_si256(bcast(a, c + ci, b, j), flip);
                    *s = _mm256_dpbusd_epi32(*s, ux, wv);
                }
            }
            for ci in 0..N {
                acc[ci] = scale_acc(acc[ci], is[ci], w, wb, a, (c + ci) * nb + b);
            }
        }
        for ci in 0..N {
            _mm256_storeu_ps(res[ci].as_mut_ptr(), acc[ci]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::matmul::{matmul_t, ActRound};
    use crate::types::TensorType;

    /// Deterministic pseudo-random values with a few outliers (activations have them).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                let v = ((u - 0.5) * 3.4) as f32;
                if i % 97 == 5 {
                    v * 9.0
                } else {
                    v
                }
            })
            .collect()
    }

    fn weight(n: usize, k: usize, seed: u64) -> Vec<u8> {
        let w = values(n * k, seed);
        let mut out = vec![0u8; n * k / QK * BLOCK_BYTES];
        crate::types::quantize_rows(TensorType::Q8_0, &w, &mut out, k, "w").unwrap();
        out
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every kernel equals the scalar reference bit for bit: partial tiles and token groups,
    /// and quants of −128 and 127 (the extremes of the sign trick and of the VNNI correction).
    #[test]
    fn kernels_equal_scalar_reference() {
        for (n, k, rows) in [(37, 96, 11), (8, 576, 9), (13, 64, 6), (3, 32, 1)] {
            let mut wb = weight(n, k, 3);
            for (i, blk) in wb.chunks_exact_mut(BLOCK_BYTES).enumerate() {
                blk[2 + i % 32] = 0x80; // −128
                blk[2 + (i + 7) % 32] = 127;
            }
            let w = Q8Int8::new(&wb, n, k).unwrap();
            let mut x = values(rows * k, 7);
            // Blocks whose other values round to 0 and ±1, with quants 127 and −127.
            x[0] = 5e4;
            x[k - 1] = -5e4;
            let a = ActQ8::new(&x, rows, k);
            assert!(a.xq.contains(&127) && a.xq.contains(&-127));
            let stride = n + 3;
            let mut want = vec![0f32; rows * stride];
            matmul_with(Kernel::Scalar, &w, &a, &mut want, stride, 1);
            assert!(want.iter().any(|&v| v != 0.0));
            for kern in Kernel::available() {
                let mut got = vec![0f32; rows * stride];
                matmul_with(kern, &w, &a, &mut got, stride, 2);
                assert_eq!(bits(&got), bits(&want), "{kern:?} n={n} k={k}");
            }
        }
    }

    /// The activation quants times their scale are `ActRound::Q8_0`'s rounded values, bit for
    /// bit (so the two paths see the same activations), ties and zero blocks included.
    #[test]
    fn activation_quants_are_ggml_rounding() {
        let k = 256;
        let mut x = values(3 * k, 9);
        // A block with max 127: scaled values k + 0.5 are exact ties.
        for (i, v) in x[32..64].iter_mut().enumerate() {
            *v = if i == 0 { 127.0 } else { i as f32 - 15.5 };
        }
        x[64..96].fill(0.0);
        let a = ActQ8::new(&x, 3, k);
        let mut want = x.clone();
        ActRound::Q8_0.apply_rows(&mut want, k);
        // Compared as values: an int8 0 has no sign, ActRound's −0 · d is −0.
        for i in 0..3 * k {
            assert_eq!(a.xq[i] as f32 * a.xd[i / QK], want[i], "{i}");
        }
    }

    /// The path equals a direct model of ggml's arithmetic: per block the exact integer dot of
    /// the file's quants with the Q8_0 activation quants times both scales, summed in f64; and
    /// it is within float rounding of the f32 path (rounded activations × dequantized weights).
    #[test]
    fn matches_direct_integer_model_and_f32_path() {
        let (n, k, rows) = (19, 160, 5);
        let wb = weight(n, k, 11);
        let x = values(rows * k, 13);
        let w = Q8Int8::new(&wb, n, k).unwrap();
        let a = ActQ8::new(&x, rows, k);
        let mut got = vec![0f32; rows * n];
        matmul(&w, &a, &mut got, n, 1);
        let mut wf = vec![0f32; n * k];
        crate::types::dequantize_rows(TensorType::Q8_0, &wb, &mut wf, k, "w").unwrap();
        let mut xr = x.clone();
        ActRound::Q8_0.apply_rows(&mut xr, k);
        let mut f32_path = vec![0f32; rows * n];
        matmul_t(&xr, rows, k, &wf, n, &mut f32_path, n, 1);
        let nb = k / QK;
        for c in 0..rows {
            for i in 0..n {
                let mut want = 0f64;
                let mut mag = 0f64;
                for b in 0..nb {
                    let blk = &wb[(i * nb + b) * BLOCK_BYTES..(i * nb + b + 1) * BLOCK_BYTES];
                    let dw = f16_bits_to_f32(u16::from_le_bytes([blk[0], blk[1]])) as f64;
                    let xb = &x[c * k + b * QK..c * k + (b + 1) * QK];
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let dx = half::f16::from_f32(amax / 127.0).to_f32() as f64;
                    let s: i64 = (0..QK)
                        .map(|e| {
                            let q = (xb[e] * (127.0 / amax)).round_ties_even() as i64;
                            q * blk[2 + e] as i8 as i64
                        })
                        .sum();
                    want += s as f64 * dw * dx;
                    mag += (s as f64 * dw * dx).abs();
                }
                let g = got[c * n + i] as f64;
                let f = f32_path[c * n + i] as f64;
                assert!(
                    (g - want).abs() <= 1e-6 * (1.0 + mag),
                    "{c} {i}: {g} vs {want}"
                );
                assert!(
                    (f - want).abs() <= 1e-5 * (1.0 + mag),
                    "{c} {i}: {f} vs {want}"
                );
            }
        }
    }

    /// Thread count changes nothing.
    #[test]
    fn same_bits_for_any_thread_count() {
        let (n, k, rows) = (50, 192, 70);
        let wb = weight(n, k, 31);
        let w = Q8Int8::new(&wb, n, k).unwrap();
        let a = ActQ8::new(&values(rows * k, 37), rows, k);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut o = vec![0f32; rows * n];
            pool.install(|| matmul(&w, &a, &mut o, n, threads));
            bits(&o)
        };
        let one = run(1);
        assert_eq!(one, run(2));
        assert_eq!(one, run(3));
    }

    /// Non-finite activations poison their outputs; a non-finite scale in the file, a short
    /// buffer or a ragged row length is an error, not a panic.
    #[test]
    fn bad_inputs() {
        let (n, k) = (4, 64);
        let mut wb = weight(n, k, 41);
        let w = Q8Int8::new(&wb, n, k).unwrap();
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x = values(2 * k, 43);
            x[3] = bad;
            let mut o = vec![0f32; 2 * n];
            matmul(&w, &ActQ8::new(&x, 2, k), &mut o, n, 1);
            assert!(o[..n].iter().all(|v| v.is_nan()), "{bad}");
            assert!(o[n..].iter().all(|v| v.is_finite()));
        }
        assert!(Q8Int8::new(&wb[..wb.len() - 1], n, k)
            .err()
            .unwrap()
            .contains("expected"));
        assert!(Q8Int8::new(&wb, n, 48).is_err());
        wb[BLOCK_BYTES..BLOCK_BYTES + 2].copy_from_slice(&0x7c00u16.to_le_bytes()); // +inf
        let e = Q8Int8::new(&wb, n, k).err().unwrap();
        assert!(e.contains("non-finite scale"), "{e}");
    }

    /// Speed against the f32 GEMM on a SmolLM2-shaped product (not a check: `--ignored`).
    #[test]
    #[ignore]
    fn bench_against_f32_gemm() {
        for (n, k, rows) in [(1536, 576, 512), (576, 1536, 512)] {
            let wb = weight(n, k, 51);
            let x = values(rows * k, 53);
            let mut wf = vec![0f32; n * k];
            crate::types::dequantize_rows(TensorType::Q8_0, &wb, &mut wf, k, "w").unwrap();
            let mut o = vec![0f32; rows * n];
            let (mut f, mut i) = (f64::MAX, f64::MAX);
            for _ in 0..15 {
                let t0 = std::time::Instant::now();
                let mut xr = x.clone();
                ActRound::Q8_0.apply_rows(&mut xr, k);
                matmul_t(&xr, rows, k, &wf, n, &mut o, n, 1);
                f = f.min(t0.elapsed().as_secs_f64());
                let t0 = std::time::Instant::now();
                let w = Q8Int8::new(&wb, n, k).unwrap();
                let a = ActQ8::new(&x, rows, k);
                matmul(&w, &a, &mut o, n, 1);
                i = i.min(t0.elapsed().as_secs_f64());
            }
            eprintln!("n={n} k={k} rows={rows}: best of 15: f32 {f:.4} s, int8 {i:.4} s");
        }
    }
}
