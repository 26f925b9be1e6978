//! The int8 path for TQ4_1S / TQ3_1S weights: integer dot products in the rotated domain.
//!
//! A TQ block's dot product with an activation block equals `(C[idx] ⊙ d) · forward(x)`
//! (FORMATS.md §2), so the weights need no decoding: the activation is rotated once per 32
//! values, quantized to int8 per 32 (one f32 scale per block, like Q8_0), and meets the codebook
//! held as int8 (`C · 127 / max|C|`, rounded: for TQ4_1S the fork's CUDA table
//! `[-127, -96, …, 96, 127]`) with the codebook's scale folded into the two half-block scales.
//!
//! Layout, chosen so that one 256-bit register accumulates 4 weight rows × 2 half blocks for one
//! activation (lane `L = 4·h + r`: half `h`, row `r` of a tile of 4 weight rows):
//! - weights, per tile and block: 4 steps `j` of 32 bytes; lane `L` holds elements
//!   `16h + 4j .. 16h + 4j + 3` of row `r` (signed int8), plus per lane the half scale
//!   `d[r][h] · max|C| / 127` and the correction `-128 · Σ` of the lane's codes over the block;
//! - activations, per token and block: the same 4 × 32 bytes with every row slot `r` holding the
//!   token's own elements (unsigned: the int8 value + 128), and the block's f32 scale.
//!
//! Per block `isum = corr + Σ_j dpbusd(x_j, w_j)` is the exact integer dot of each lane (|isum| ≤
//! 32·127·127 < 2²⁴, exact in f32), then `acc = fma(f32(isum), scale_w · scale_x, acc)` lane by
//! lane, and the row's result is `acc[r] + acc[r + 4]`. The scalar reference [`tile_ref`] does the
//! same operations in the same order; the AVX-512 VNNI and AVX2 kernels are held bit-equal to it
//! by the tests below. Every output is computed on its own in a fixed order, so the result does
//! not depend on the thread count.

use super::matmul::for_token_chunks;
use crate::types::float::f16_bits_to_f32;
use crate::types::tq::{unpack_tq3, unpack_tq4, C3, C4, QK, TQ3_BYTES, TQ4_BYTES};
use crate::types::TensorType;
use rayon::prelude::*;

/// Weight rows per tile.
const TILE: usize = 4;
/// Bytes of codes (or of one token's activation) per tile and block.
const TB: usize = QK * TILE;
/// Lanes per tile and block (half × row).
const LANES: usize = 8;

/// A TQ4_1S / TQ3_1S weight prepared for the int8 dot products.
pub struct TqInt8 {
    n: usize,
    nb: usize,
    codes: Vec<i8>,
    corr: Vec<i32>,
    scale: Vec<f32>,
}

/// The int8 codebook of a TQ weight type and the f32 step it stands for (`max|C| / 127`).
pub(crate) fn int_codebook(ty: TensorType) -> Option<(Vec<i8>, f32)> {
    let c: &[f32] = match ty {
        TensorType::TQ4_1S => &C4,
        TensorType::TQ3_1S => &C3,
        _ => return None,
    };
    let cmax = c.iter().fold(0f32, |m, v| m.max(v.abs()));
    let q = c.iter().map(|v| (v * 127.0 / cmax).round() as i8).collect();
    Some((q, cmax / 127.0))
}

impl std::fmt::Debug for TqInt8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TqInt8 {{ n: {}, k: {} }}", self.n, self.k())
    }
}

impl TqInt8 {
    /// Prepare `n` rows of `k` values of type `ty` from their GGUF bytes. `Err`: a one-line
    /// reason (the caller names the file and tensor).
    pub fn new(ty: TensorType, bytes: &[u8], n: usize, k: usize) -> Result<TqInt8, String> {
        let (cb, step) =
            int_codebook(ty).ok_or_else(|| format!("{} has no int8 path", ty.name()))?;
        let bb = if ty == TensorType::TQ4_1S {
            TQ4_BYTES
        } else {
            TQ3_BYTES
        };
        if !k.is_multiple_of(QK) {
            return Err(format!("row length {k} is not a multiple of {QK}"));
        }
        let nb = k / QK;
        if bytes.len() < n * nb * bb {
            return Err(format!(
                "{} bytes of data, {} expected",
                bytes.len(),
                n * nb * bb
            ));
        }
        let tiles = n.div_ceil(TILE);
        let mut codes = vec![0i8; tiles * nb * TB];
        let mut corr = vec![0i32; tiles * nb * LANES];
        let mut scale = vec![0f32; tiles * nb * LANES];
        let per_tile = |t: usize,
                        (codes, (corr, scale)): (&mut [i8], (&mut [i32], &mut [f32]))|
         -> Result<(), String> {
            for r in 0..TILE.min(n - t * TILE) {
                let row = t * TILE + r;
                for b in 0..nb {
                    let blk = &bytes[(row * nb + b) * bb..(row * nb + b + 1) * bb];
                    let idx = if bb == TQ4_BYTES {
                        unpack_tq4(blk)
                    } else {
                        unpack_tq3(blk)
                    };
                    for h in 0..2 {
                        let d = f16_bits_to_f32(u16::from_le_bytes([blk[2 * h], blk[2 * h + 1]]));
                        if !d.is_finite() {
                            return Err(format!("non-finite scale {d} at row {row}, block {b}"));
                        }
                        let lane = 4 * h + r;
                        scale[b * LANES + lane] = d * step;
                        let mut sum = 0i32;
                        for j in 0..4 {
                            for e in 0..4 {
                                let w = cb[idx[16 * h + 4 * j + e] as usize];
                                codes[b * TB + j * 32 + lane * 4 + e] = w;
                                sum += w as i32;
                            }
                        }
                        corr[b * LANES + lane] = -128 * sum;
                    }
                }
            }
            Ok(())
        };
        codes
            .par_chunks_mut(nb * TB)
            .zip(
                corr.par_chunks_mut(nb * LANES)
                    .zip(scale.par_chunks_mut(nb * LANES)),
            )
            .enumerate()
            .try_for_each(|(t, parts)| per_tile(t, parts))?;
        Ok(TqInt8 {
            n,
            nb,
            codes,
            corr,
            scale,
        })
    }

    /// Input width.
    pub fn k(&self) -> usize {
        self.nb * QK
    }

    fn tiles(&self) -> usize {
        self.n.div_ceil(TILE)
    }
}

/// `v` rounded to the nearest integer, ties to even, for |v| < 2²² (the default rounding of
/// the addition does it; a library call otherwise, without SSE4.1 in the build's baseline).
#[inline(always)]
pub(super) fn round_even(v: f32) -> f32 {
    const M: f32 = 12_582_912.0; // 1.5 · 2²³
    (v + M) - M
}

/// Activations rotated and quantized for [`matmul`]: `rows` tokens of `nb` blocks.
pub(crate) struct ActQ {
    rows: usize,
    nb: usize,
    xv: Vec<u8>,
    xd: Vec<f32>,
}

impl ActQ {
    /// Rotate each 32-block of the `rows × k` activations `x` (the TQ block rotation), quantize
    /// it to int8 with one f32 scale `max|v| / 127` (round half to even) and lay it out for the
    /// kernels. A block holding a NaN or an infinity gets a NaN scale, so it poisons its results
    /// as it would in f32.
    pub fn new(x: &[f32], rows: usize, k: usize) -> ActQ {
        assert!(k.is_multiple_of(QK) && x.len() >= rows * k);
        let nb = k / QK;
        let mut xv = vec![0u8; rows * nb * TB];
        let mut xd = vec![0f32; rows * nb];
        #[cfg(target_arch = "x86_64")]
        let avx2 = is_x86_feature_detected!("avx2");
        xv.par_chunks_mut(nb * TB)
            .zip(xd.par_chunks_mut(nb))
            .zip(x[..rows * k].par_chunks(k))
            .for_each(|((v, d), xr)| {
                #[cfg(target_arch = "x86_64")]
                if avx2 {
                    // SAFETY: the CPU has AVX2.
                    unsafe { quant_row_avx2(xr, v, d) };
                    return;
                }
                quant_row(xr, v, d);
            });
        ActQ { rows, nb, xv, xd }
    }
}

/// Block signs of the TQ rotation (FORMATS.md §2: `-1` where the top bit of `i · 0x9E3779B9`
/// is set).
const SIGNS: [f32; QK] = {
    let mut s = [1f32; QK];
    let mut i = 0;
    while i < QK {
        if (i as u32).wrapping_mul(0x9E37_79B9) & 0x8000_0000 != 0 {
            s[i] = -1.0;
        }
        i += 1;
    }
    s
};

/// The TQ forward block rotation, the same f32 operations in the same order as
/// [`forward_rotate`] (held bit-equal by a test), inlined so that it is compiled for the
/// vector width of its caller.
#[inline(always)]
fn rotate(b: &mut [f32; QK]) {
    for (v, s) in b.iter_mut().zip(SIGNS) {
        *v *= s;
    }
    let mut step = 1;
    while step < QK {
        for i in (0..QK).step_by(2 * step) {
            for j in i..i + step {
                let (a, c) = (b[j], b[j + step]);
                b[j] = a + c;
                b[j + step] = a - c;
            }
        }
        step *= 2;
    }
    for v in b.iter_mut() {
        *v *= 0.176_776_695_296_636_88;
    }
}

/// One token's row for [`ActQ::new`]: `v` its laid-out bytes, `d` its block scales.
#[inline(always)]
fn quant_row(xr: &[f32], v: &mut [u8], d: &mut [f32]) {
    let nb = d.len();
    for b in 0..nb {
        let mut buf = [0f32; QK];
        buf.copy_from_slice(&xr[b * QK..(b + 1) * QK]);
        rotate(&mut buf);
        let finite = buf.iter().all(|v| v.is_finite());
        let amax = buf.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        d[b] = if finite { amax / 127.0 } else { f32::NAN };
        let mut q = [0u8; QK];
        for (qi, &bv) in q.iter_mut().zip(&buf) {
            *qi = (round_even(bv * id).clamp(-127.0, 127.0) as i32 + 128) as u8;
        }
        // Each 4-value group goes to the 4 row slots of its lane.
        let out = &mut v[b * TB..(b + 1) * TB];
        for h in 0..2 {
            for j in 0..4 {
                let g = &q[16 * h + 4 * j..16 * h + 4 * j + 4];
                for r in 0..TILE {
                    let o = j * 32 + (4 * h + r) * 4;
                    out[o..o + 4].copy_from_slice(g);
                }
            }
        }
    }
}

/// [`quant_row`] compiled for AVX2 (the same operations: IEEE results do not depend on it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quant_row_avx2(xr: &[f32], v: &mut [u8], d: &mut [f32]) {
    quant_row(xr, v, d)
}

/// The scalar reference: the 4 outputs of weight tile `t` for token `c` (rows past the
/// weight's end are 0).
pub(crate) fn tile_ref(w: &TqInt8, t: usize, a: &ActQ, c: usize) -> [f32; TILE] {
    let nb = w.nb;
    let mut acc = [0f32; LANES];
    for b in 0..nb {
        let wb = t * nb + b;
        let xb = c * nb + b;
        let mut isum = [0i32; LANES];
        isum.copy_from_slice(&w.corr[wb * LANES..(wb + 1) * LANES]);
        for j in 0..4 {
            for (l, s) in isum.iter_mut().enumerate() {
                for e in 0..4 {
                    let o = j * 32 + l * 4 + e;
                    *s += a.xv[xb * TB + o] as i32 * w.codes[wb * TB + o] as i32;
                }
            }
        }
        let xd = a.xd[xb];
        for l in 0..LANES {
            acc[l] = (isum[l] as f32).mul_add(w.scale[wb * LANES + l] * xd, acc[l]);
        }
    }
    [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ]
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
        #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
        {
            if is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
            {
                return Kernel::Vnni;
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Kernel::Avx2;
            }
        }
        Kernel::Scalar
    }

    /// Every kernel this CPU runs (tests).
    #[cfg(test)]
    pub fn available() -> Vec<Kernel> {
        let mut v = vec![Kernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(Kernel::Avx2);
            }
            #[cfg(feature = "avx512")]
            if Kernel::best() == Kernel::Vnni {
                v.push(Kernel::Vnni);
            }
        }
        v
    }
}

/// Whether the int8 path beats the f32 one on this CPU and build: only with the VNNI kernel (the
/// AVX2 kernel's sign/`vpmaddubsw`/`vpmaddwd` sequence measured slower than the f32 GEMM,
/// docs/bench/eval.md).
pub(crate) fn int8_is_faster() -> bool {
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    if Kernel::best() == Kernel::Vnni {
        return true;
    }
    false
}

/// `out[c * stride + i] = (x_c · W_i)` for every token `c < a.rows()` and output `i < w.n()`,
/// with the best kernel.
pub(crate) fn matmul(w: &TqInt8, a: &ActQ, out: &mut [f32], stride: usize, threads: usize) {
    matmul_with(Kernel::best(), w, a, out, stride, threads)
}

/// [`matmul`] with a chosen kernel.
pub(crate) fn matmul_with(
    kernel: Kernel,
    w: &TqInt8,
    a: &ActQ,
    out: &mut [f32],
    stride: usize,
    threads: usize,
) {
    assert_eq!(w.nb, a.nb, "tq int8 matmul: input widths differ");
    for_token_chunks(a.rows, w.n, stride, threads, out, |c0, c1, o| {
        run_chunk(kernel, w, a, c0, c1, o, stride)
    });
}

/// Tokens `c0..c1` against every weight tile; `o` starts at token `c0`'s output row.
fn run_chunk(
    kernel: Kernel,
    w: &TqInt8,
    a: &ActQ,
    c0: usize,
    c1: usize,
    o: &mut [f32],
    stride: usize,
) {
    const RT: usize = 2;
    const CT: usize = 4;
    let tiles = w.tiles();
    let mut t = 0;
    while t < tiles {
        let rt = RT.min(tiles - t);
        let mut c = c0;
        while c < c1 {
            let ct = CT.min(c1 - c);
            let mut res = [[[0f32; TILE]; RT]; CT];
            match kernel {
                Kernel::Scalar => {
                    for (ci, rc) in res.iter_mut().enumerate().take(ct) {
                        for (ti, rt_) in rc.iter_mut().enumerate().take(rt) {
                            *rt_ = tile_ref(w, t + ti, a, c + ci);
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2 => {
                    // SAFETY: the kernel was chosen from the CPU's detected features; the
                    // tile and token ranges are inside `w` and `a` (t + rt ≤ tiles, c + ct ≤ rows).
                    unsafe { x86::micro(kernel, w, t, rt, a, c, ct, &mut res) }
                }
                #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
                Kernel::Vnni => {
                    // SAFETY: as for Avx2.
                    unsafe { x86::micro(kernel, w, t, rt, a, c, ct, &mut res) }
                }
            }
            for (ci, rc) in res.iter().enumerate().take(ct) {
                let row = &mut o[(c + ci - c0) * stride..];
                for (ti, v) in rc.iter().enumerate().take(rt) {
                    let i0 = (t + ti) * TILE;
                    let m = TILE.min(w.n - i0);
                    row[i0..i0 + m].copy_from_slice(&v[..m]);
                }
            }
            c += ct;
        }
        t += rt;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ActQ, Kernel, TqInt8, LANES, TB, TILE};
    use std::arch::x86_64::*;

    /// Tiles `t..t + rt` (rt ≤ 2) × tokens `c..c + ct` (ct ≤ 4) into `res[token][tile]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn micro(
        kernel: Kernel,
        w: &TqInt8,
        t: usize,
        rt: usize,
        a: &ActQ,
        c: usize,
        ct: usize,
        res: &mut [[[f32; TILE]; 2]; 4],
    ) {
        macro_rules! go {
            ($f:ident) => {
                match (rt, ct) {
                    (2, 4) => $f::<2, 4>(w, t, a, c, &mut res[..]),
                    (1, 4) => $f::<1, 4>(w, t, a, c, &mut res[..]),
                    (2, _) => {
                        for i in 0..ct {
                            $f::<2, 1>(w, t, a, c + i, &mut res[i..]);
                        }
                    }
                    _ => {
                        for i in 0..ct {
                            $f::<1, 1>(w, t, a, c + i, &mut res[i..]);
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

    #[inline(always)]
    unsafe fn finish(acc: __m256) -> [f32; TILE] {
        let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let mut o = [0f32; TILE];
        _mm_storeu_ps(o.as_mut_ptr(), s);
        o
    }

    /// `RT` tiles × `CT` tokens with AVX-512 VNNI (256-bit `vpdpbusd`).
    #[cfg(feature = "avx512")]
    #[allow(clippy::incompatible_msrv)]
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    unsafe fn tile_vnni<const RT: usize, const CT: usize>(
        w: &TqInt8,
        t: usize,
        a: &ActQ,
        c: usize,
        res: &mut [[[f32; TILE]; 2]],
    ) {
        let nb = w.nb;
        let mut acc = [[_mm256_setzero_ps(); RT]; CT];
        let (wc, wcorr, wsc) = (w.codes.as_ptr(), w.corr.as_ptr(), w.scale.as_ptr());
        let (xv, xd) = (a.xv.as_ptr(), a.xd.as_ptr());
        for b in 0..nb {
            let mut is = [[_mm256_setzero_si256(); RT]; CT];
            for row in is.iter_mut() {
                for (i, v) in row.iter_mut().enumerate() {
                    *v = _mm256_loadu_si256(wcorr.add(((t + i) * nb + b) * LANES) as *const _);
                }
            }
            for j in 0..4 {
                let mut x = [_mm256_setzero_si256(); CT];
                for (ci, xv_) in x.iter_mut().enumerate() {
                    *xv_ =
                        _mm256_loadu_si256(xv.add(((c + ci) * nb + b) * TB + j * 32) as *const _);
                }
                for i in 0..RT {
                    let wv =
                        _mm256_loadu_si256(wc.add(((t + i) * nb + b) * TB + j * 32) as *const _);
                    for ci in 0..CT {
                        is[ci][i] = _mm256_dpbusd_epi32(is[ci][i], x[ci], wv);
                    }
                }
            }
            for ci in 0..CT {
                let d = _mm256_set1_ps(*xd.add((c + ci) * nb + b));
                for i in 0..RT {
                    let s = _mm256_mul_ps(_mm256_loadu_ps(wsc.add(((t + i) * nb + b) * LANES)), d);
                    acc[ci][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[ci][i]), s, acc[ci][i]);
                }
            }
        }
        for ci in 0..CT {
            for i in 0..RT {
                res[ci][i] = finish(acc[ci][i]);
            }
        }
    }

    /// `RT` tiles × `CT` tokens with AVX2: `vpmaddubsw` on |w| and x·sign(w) (pairs ≤ 2·127·127,
    /// no saturation), then `vpmaddwd` — the same exact lane sums as `vpdpbusd`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const RT: usize, const CT: usize>(
        w: &TqInt8,
        t: usize,
        a: &ActQ,
        c: usize,
        res: &mut [[[f32; TILE]; 2]],
    ) {
        let nb = w.nb;
        let mut acc = [[_mm256_setzero_ps(); RT]; CT];
        let (wc, wsc) = (w.codes.as_ptr(), w.scale.as_ptr());
        let (xv, xd) = (a.xv.as_ptr(), a.xd.as_ptr());
        let flip = _mm256_set1_epi8(-128);
        let ones = _mm256_set1_epi16(1);
        for b in 0..nb {
            // x is made signed below, so the sums need no correction.
            let mut is = [[_mm256_setzero_si256(); RT]; CT];
            for j in 0..4 {
                let mut x = [_mm256_setzero_si256(); CT];
                for (ci, xv_) in x.iter_mut().enumerate() {
                    let u =
                        _mm256_loadu_si256(xv.add(((c + ci) * nb + b) * TB + j * 32) as *const _);
                    *xv_ = _mm256_xor_si256(u, flip);
                }
                for i in 0..RT {
                    let wv =
                        _mm256_loadu_si256(wc.add(((t + i) * nb + b) * TB + j * 32) as *const _);
                    let aw = _mm256_sign_epi8(wv, wv);
                    for ci in 0..CT {
                        let sx = _mm256_sign_epi8(x[ci], wv);
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                        is[ci][i] = _mm256_add_epi32(is[ci][i], p);
                    }
                }
            }
            for ci in 0..CT {
                let d = _mm256_set1_ps(*xd.add((c + ci) * nb + b));
                for i in 0..RT {
                    let s = _mm256_mul_ps(_mm256_loadu_ps(wsc.add(((t + i) * nb + b) * LANES)), d);
                    acc[ci][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[ci][i]), s, acc[ci][i]);
                }
            }
        }
        for ci in 0..CT {
            for i in 0..RT {
                res[ci][i] = finish(acc[ci][i]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::matmul::matmul_t;
    use crate::types::tq::forward_rotate;

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

    fn weight(ty: TensorType, n: usize, k: usize, seed: u64) -> Vec<u8> {
        let w = values(n * k, seed);
        let bb = ty.block_bytes();
        let mut out = vec![0u8; n * k / QK * bb];
        crate::types::quantize_rows(ty, &w, &mut out, k, "w").unwrap();
        out
    }

    fn dequant(ty: TensorType, bytes: &[u8], n: usize, k: usize) -> Vec<f32> {
        let mut w = vec![0f32; n * k];
        crate::types::dequantize_rows(ty, bytes, &mut w, k, "w").unwrap();
        w
    }

    /// Every kernel equals the scalar reference bit for bit (shapes with partial tiles and
    /// partial token groups), for both types.
    #[test]
    fn kernels_equal_scalar_reference() {
        for (ty, n, k, rows) in [
            (TensorType::TQ4_1S, 37, 96, 11),
            (TensorType::TQ4_1S, 8, 576, 9),
            (TensorType::TQ3_1S, 13, 64, 6),
        ] {
            let wb = weight(ty, n, k, 3);
            let w = TqInt8::new(ty, &wb, n, k).unwrap();
            let a = ActQ::new(&values(rows * k, 7), rows, k);
            let stride = n + 3;
            let mut want = vec![0f32; rows * stride];
            matmul_with(Kernel::Scalar, &w, &a, &mut want, stride, 1);
            assert!(want.iter().any(|&v| v != 0.0));
            for kern in Kernel::available() {
                let mut got = vec![0f32; rows * stride];
                matmul_with(kern, &w, &a, &mut got, stride, 2);
                let gb: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                let wbits: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                assert_eq!(gb, wbits, "{kern:?} {} n={n} k={k}", ty.name());
            }
        }
    }

    /// The laid-out integer arithmetic equals a direct model of the path: for each half block,
    /// Σ int8 code × int8 activation (exact, i64) times the two scales, summed in f64.
    #[test]
    fn layout_matches_direct_integer_model() {
        let (ty, n, k, rows) = (TensorType::TQ4_1S, 9, 128, 5);
        let wb = weight(ty, n, k, 11);
        let w = TqInt8::new(ty, &wb, n, k).unwrap();
        let x = values(rows * k, 13);
        let a = ActQ::new(&x, rows, k);
        let mut got = vec![0f32; rows * n];
        matmul(&w, &a, &mut got, n, 1);
        let (cb, step) = int_codebook(ty).unwrap();
        assert_eq!(
            cb,
            [-127, -96, -75, -58, -44, -31, -18, -6, 6, 18, 31, 44, 58, 75, 96, 127]
        );
        let nb = k / QK;
        for c in 0..rows {
            for i in 0..n {
                let mut want = 0f64;
                for b in 0..nb {
                    let mut buf = [0f32; QK];
                    buf.copy_from_slice(&x[c * k + b * QK..c * k + (b + 1) * QK]);
                    forward_rotate(&mut buf);
                    let amax = buf.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let q: Vec<i64> = buf
                        .iter()
                        .map(|v| (v * (127.0 / amax)).round_ties_even() as i64)
                        .collect();
                    let blk = &wb[(i * nb + b) * TQ4_BYTES..(i * nb + b + 1) * TQ4_BYTES];
                    let idx = unpack_tq4(blk);
                    for h in 0..2 {
                        let d = f16_bits_to_f32(u16::from_le_bytes([blk[2 * h], blk[2 * h + 1]]));
                        let s: i64 = (16 * h..16 * h + 16)
                            .map(|e| cb[idx[e] as usize] as i64 * q[e])
                            .sum();
                        want += s as f64 * (d * step) as f64 * (amax / 127.0) as f64;
                    }
                }
                let g = got[c * n + i] as f64;
                assert!(
                    (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "token {c} row {i}: {g} vs {want}"
                );
            }
        }
    }

    /// Against the f32 path (decoded weights × exact activations): the int8 rounding of the
    /// codebook and of the rotated activations moves each output by well under 2 % of the
    /// outputs' RMS.
    #[test]
    fn close_to_f32_decode_path() {
        for ty in [TensorType::TQ4_1S, TensorType::TQ3_1S] {
            let (n, k, rows) = (64, 576, 8);
            let wb = weight(ty, n, k, 21);
            let wf = dequant(ty, &wb, n, k);
            let x = values(rows * k, 23);
            let mut want = vec![0f32; rows * n];
            matmul_t(&x, rows, k, &wf, n, &mut want, n, 1);
            let w = TqInt8::new(ty, &wb, n, k).unwrap();
            let mut got = vec![0f32; rows * n];
            matmul(&w, &ActQ::new(&x, rows, k), &mut got, n, 1);
            let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
            let err = (want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                / want.len() as f32)
                .sqrt();
            assert!(
                err < 0.02 * rms,
                "{}: rms error {err} vs rms {rms}",
                ty.name()
            );
            assert!(err > 0.0, "the int8 path must differ from f32 somewhere");
        }
    }

    /// The inlined rotation is the format's rotation, bit for bit.
    #[test]
    fn rotation_equals_format_rotation() {
        let x = values(32 * 40, 5);
        for blk in x.chunks_exact(QK) {
            let mut a: [f32; QK] = blk.try_into().unwrap();
            let mut b = a;
            forward_rotate(&mut a);
            rotate(&mut b);
            assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
        }
    }

    /// Thread count changes nothing.
    #[test]
    fn same_bits_for_any_thread_count() {
        let (ty, n, k, rows) = (TensorType::TQ4_1S, 50, 192, 70);
        let wb = weight(ty, n, k, 31);
        let w = TqInt8::new(ty, &wb, n, k).unwrap();
        let a = ActQ::new(&values(rows * k, 37), rows, k);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut o = vec![0f32; rows * n];
            pool.install(|| matmul(&w, &a, &mut o, n, threads));
            o.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let one = run(1);
        assert_eq!(one, run(2));
        assert_eq!(one, run(3));
    }

    /// Non-finite inputs poison their outputs; a non-finite scale in the file is an error.
    #[test]
    fn non_finite_inputs() {
        let (ty, n, k) = (TensorType::TQ4_1S, 4, 64);
        let mut wb = weight(ty, n, k, 41);
        let w = TqInt8::new(ty, &wb, n, k).unwrap();
        let mut x = values(2 * k, 43);
        x[3] = f32::NAN;
        let mut o = vec![0f32; 2 * n];
        matmul(&w, &ActQ::new(&x, 2, k), &mut o, n, 1);
        assert!(o[..n].iter().all(|v| v.is_nan()));
        assert!(o[n..].iter().all(|v| v.is_finite()));
        wb[TQ4_BYTES + 1] = 0x7c; // block 1's d0 = +inf
        wb[TQ4_BYTES] = 0;
        let e = TqInt8::new(ty, &wb, n, k).err().unwrap();
        assert!(e.contains("non-finite scale"), "{e}");
    }
}
