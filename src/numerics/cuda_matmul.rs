//! The TQ4_1S / TQ3_1S mat-muls of `tq eval --numerics cuda*`: every output is computed with the
//! arithmetic of the fork's CUDA mat-vec kernels as [`crate::numerics::cuda_native`] models them (that
//! module's `matvec` is the oracle; the kernel here is a faster, batched evaluation of it that
//! gives the same bits).
//!
//! The per-block integer dot products (`int8 × int8`, at most 32 terms of magnitude ≤ 127·127)
//! are formed in f32: every product and every partial sum is an integer below 2²⁴, so f32 holds
//! them exactly whatever the order, and the result equals the kernels' `dp4a` sums. Everything
//! after that — the block scales, the 32 lane accumulators, the `2.733/127` rescale, the xor-tree —
//! follows `cuda_native` operation by operation (fused multiply-adds where it fuses), so the
//! output does not depend on tiling, thread count or the SIMD width the compiler picks.
//!
//! Layout: weights are re-laid out per tile of [`RT`] output rows as `[block][j][row]`, so the
//! inner loops run across rows (one vector lane per row) and a tile of [`TT`] tokens × [`RT`] rows
//! stays in registers; tokens are split into chunks of [`TCHUNK`] for the thread pool.

use crate::error::{Error, Result};
use crate::numerics::cuda_native::{self as cn, CudaTqPath};
use crate::types::float::f16_bits_to_f32;
use crate::types::tq as tqs;
use crate::types::TensorType;
use rayon::prelude::*;

/// Output rows per tile (one f32 lane each).
pub const RT: usize = 16;
/// Tokens per register tile.
const TT: usize = 4;
/// Tokens per parallel task.
const TCHUNK: usize = 32;

/// Which kernel of the fork a weight goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// TQ4_1S, `GGML_TQ_NATIVE=1`: int8 centroids × rotated q8_1 activations, 32 block lanes.
    Native4,
    /// TQ4_1S, default: converted to q8_0 at load, q8_0 × q8_1 block dots in block order.
    Q8_0,
    /// TQ3_1S (either mode): rotated f32 activations, `C3[idx]·d`, one fma per element per lane.
    Float3,
}

impl Kind {
    pub fn of(path: CudaTqPath, ty: TensorType) -> Option<Kind> {
        match (path, ty) {
            (CudaTqPath::Native, TensorType::TQ4_1S) => Some(Kind::Native4),
            (CudaTqPath::LoadQ8_0, TensorType::TQ4_1S) => Some(Kind::Q8_0),
            (_, TensorType::TQ3_1S) => Some(Kind::Float3),
            _ => None,
        }
    }
}

/// A TQ weight (`n × k`) prepared for [`CudaWeights::matmul`].
#[derive(Clone, Debug)]
pub struct CudaWeights {
    pub kind: Kind,
    pub n: usize,
    pub k: usize,
    /// `[tile][block][j][row]`, rows padded to a multiple of [`RT`] with zeros: int8 values
    /// (Native4: the int8 centroid table; Q8_0: the q8_0 quants) or `C3[idx]·d` (Float3).
    w: Vec<f32>,
    /// `[tile][block][row]`: the half scales `d0`, `d1` (Q8_0: `d` in `d0`; Float3: unused).
    d0: Vec<f32>,
    d1: Vec<f32>,
}

fn half_scales(b: &[u8]) -> (f32, f32) {
    (
        f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])),
        f16_bits_to_f32(u16::from_le_bytes([b[2], b[3]])),
    )
}

impl CudaWeights {
    /// Prepare the raw GGUF bytes of a TQ weight with `n` rows of `k` values for `path`.
    pub fn new(path: CudaTqPath, ty: TensorType, bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        let kind = Kind::of(path, ty).ok_or_else(|| {
            Error::Unsupported(format!(
                "{ty}: the CUDA model covers tq4_1s and tq3_1s weights only"
            ))
        })?;
        let bb = ty.block_bytes();
        if k == 0 || !k.is_multiple_of(32) || Some(bytes.len()) != (n * k / 32).checked_mul(bb) {
            return Err(Error::Unsupported(format!(
                "{ty}: a {n}x{k} weight with {} bytes does not fit the CUDA model",
                bytes.len()
            )));
        }
        let nb = k / 32;
        let tiles = n.div_ceil(RT);
        let mut w = vec![0f32; tiles * RT * k];
        let mut d0 = vec![0f32; tiles * RT * nb];
        let mut d1 = vec![0f32; tiles * RT * nb];
        let q8 = if kind == Kind::Q8_0 {
            cn::load_q8_0(ty, bytes)?
        } else {
            Vec::new()
        };
        let r8 = cn::TQ4_CENTROIDS_I8;
        w.par_chunks_mut(RT * k)
            .zip(d0.par_chunks_mut(RT * nb))
            .zip(d1.par_chunks_mut(RT * nb))
            .enumerate()
            .for_each(|(tile, ((wt, d0t), d1t))| {
                for rr in 0..RT.min(n - tile * RT) {
                    let r = tile * RT + rr;
                    for ib in 0..nb {
                        let (vals, s0, s1): ([f32; 32], f32, f32) = match kind {
                            Kind::Native4 => {
                                let b = &bytes[(r * nb + ib) * bb..][..bb];
                                let (a, c) = half_scales(b);
                                let idx = tqs::unpack_tq4(b);
                                (std::array::from_fn(|j| r8[idx[j] as usize] as f32), a, c)
                            }
                            Kind::Q8_0 => {
                                let b = &q8[(r * nb + ib) * 34..][..34];
                                let d = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
                                (std::array::from_fn(|j| b[2 + j] as i8 as f32), d, d)
                            }
                            Kind::Float3 => {
                                let b = &bytes[(r * nb + ib) * bb..][..bb];
                                let (a, c) = half_scales(b);
                                let idx = tqs::unpack_tq3(b);
                                let v = std::array::from_fn(|j| {
                                    tqs::C3[idx[j] as usize] * if j < 16 { a } else { c }
                                });
                                (v, 0.0, 0.0)
                            }
                        };
                        for (j, v) in vals.iter().enumerate() {
                            wt[(ib * 32 + j) * RT + rr] = *v;
                        }
                        d0t[ib * RT + rr] = s0;
                        d1t[ib * RT + rr] = s1;
                    }
                }
            });
        Ok(CudaWeights {
            kind,
            n,
            k,
            w,
            d0,
            d1,
        })
    }

    /// `out[t * out_stride + c] = (W · x_t)[c]` for `t < rows`, `c < n`, as the fork's CUDA
    /// mat-vec kernel computes each token. `x` is `rows × k` row-major.
    pub fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32], out_stride: usize) {
        self.matmul_with(x, rows, out, out_stride, simd_available())
    }

    fn matmul_with(&self, x: &[f32], rows: usize, out: &mut [f32], out_stride: usize, simd: bool) {
        let (n, k) = (self.n, self.k);
        assert!(
            x.len() >= rows * k && out_stride >= n,
            "cuda matmul: shapes"
        );
        if rows == 0 || n == 0 {
            return;
        }
        assert!(
            out.len() >= (rows - 1) * out_stride + n,
            "cuda matmul: output too short"
        );
        let nb = k / 32;
        // Activations as the kernels see them, tokens padded to a multiple of TT with zeros.
        let padded = rows.div_ceil(TT) * TT;
        let mut act = vec![0f32; padded * k];
        let mut ad = vec![0f32; padded * nb];
        act.par_chunks_mut(k)
            .zip(ad.par_chunks_mut(nb))
            .zip(x[..rows * k].par_chunks(k))
            .for_each(|((a, d), xr)| match self.kind {
                Kind::Float3 => a.copy_from_slice(&cn::prerotate_f32(xr)),
                Kind::Native4 | Kind::Q8_0 => {
                    let q = if self.kind == Kind::Native4 {
                        cn::prerotate_q8_1(xr)
                    } else {
                        cn::q8_1_plain(xr)
                    };
                    for ((ab, db), b) in a.chunks_exact_mut(32).zip(d.iter_mut()).zip(&q) {
                        for (v, qv) in ab.iter_mut().zip(b.qs) {
                            *v = qv as f32;
                        }
                        *db = b.d;
                    }
                }
            });
        let tiles = n.div_ceil(RT);
        out[..(rows - 1) * out_stride + n]
            .par_chunks_mut(TCHUNK * out_stride)
            .enumerate()
            .for_each(|(ci, o)| {
                let t0 = ci * TCHUNK;
                let t1 = (t0 + TCHUNK).min(rows);
                let mut res = [[0f32; RT]; TT];
                for tile in 0..tiles {
                    let w = &self.w[tile * RT * k..(tile + 1) * RT * k];
                    let d0 = &self.d0[tile * RT * nb..(tile + 1) * RT * nb];
                    let d1 = &self.d1[tile * RT * nb..(tile + 1) * RT * nb];
                    let nr = RT.min(n - tile * RT);
                    let mut t = t0;
                    while t < t1 {
                        let a: [&[f32]; TT] = std::array::from_fn(|i| &act[(t + i) * k..][..k]);
                        let d: [&[f32]; TT] = std::array::from_fn(|i| &ad[(t + i) * nb..][..nb]);
                        tile_dispatch(self.kind, simd, w, d0, d1, &a, &d, &mut res);
                        for (i, rr) in res.iter().enumerate().take(t1 - t) {
                            let base = (t + i - t0) * out_stride + tile * RT;
                            o[base..base + nr].copy_from_slice(&rr[..nr]);
                        }
                        t += TT;
                    }
                }
            });
    }
}

/// Whether the AVX2+FMA build of the tile kernel can run (same results either way).
fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[allow(clippy::too_many_arguments)]
fn tile_dispatch(
    kind: Kind,
    simd: bool,
    w: &[f32],
    d0: &[f32],
    d1: &[f32],
    a: &[&[f32]; TT],
    ad: &[&[f32]; TT],
    out: &mut [[f32; RT]; TT],
) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is only true when the CPU reports AVX2 and FMA.
        unsafe { tile_avx2(kind, w, d0, d1, a, ad, out) };
        return;
    }
    let _ = simd;
    tile(kind, w, d0, d1, a, ad, out)
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(
    kind: Kind,
    w: &[f32],
    d0: &[f32],
    d1: &[f32],
    a: &[&[f32]; TT],
    ad: &[&[f32]; TT],
    out: &mut [[f32; RT]; TT],
) {
    tile(kind, w, d0, d1, a, ad, out)
}

/// One tile: `TT` tokens × `RT` rows of one weight tile.
#[inline(always)]
fn tile(
    kind: Kind,
    w: &[f32],
    d0: &[f32],
    d1: &[f32],
    a: &[&[f32]; TT],
    ad: &[&[f32]; TT],
    out: &mut [[f32; RT]; TT],
) {
    let nb = d0.len() / RT;
    match kind {
        Kind::Native4 => {
            let mut lanes = [[[0f32; RT]; TT]; 32];
            for ib in 0..nb {
                let wb = &w[ib * 32 * RT..(ib + 1) * 32 * RT];
                let s0 = int_dot(wb, a, ib * 32, 0..16);
                let s1 = int_dot(wb, a, ib * 32, 16..32);
                let (e0, e1) = (&d0[ib * RT..][..RT], &d1[ib * RT..][..RT]);
                let lane = &mut lanes[ib % 32];
                for t in 0..TT {
                    let dt = ad[t][ib];
                    for r in 0..RT {
                        let inner = e0[r].mul_add(s0[t][r], e1[r] * s1[t][r]);
                        lane[t][r] = dt.mul_add(inner, lane[t][r]);
                    }
                }
            }
            let rs = cn::tq4_i8_rescale();
            for lane in lanes.iter_mut() {
                for row in lane.iter_mut() {
                    for v in row.iter_mut() {
                        *v *= rs;
                    }
                }
            }
            *out = xor_tree(&mut lanes);
        }
        Kind::Q8_0 => {
            let mut sum = [[0f32; RT]; TT];
            for ib in 0..nb {
                let wb = &w[ib * 32 * RT..(ib + 1) * 32 * RT];
                let s = int_dot(wb, a, ib * 32, 0..32);
                let dw = &d0[ib * RT..][..RT];
                for t in 0..TT {
                    let dt = ad[t][ib];
                    for r in 0..RT {
                        sum[t][r] += dw[r] * dt * s[t][r];
                    }
                }
            }
            *out = sum;
        }
        Kind::Float3 => {
            let mut lanes = [[[0f32; RT]; TT]; 32];
            for (l, lane) in lanes.iter_mut().enumerate() {
                let mut acc = [[0f32; RT]; TT];
                for ib in 0..nb {
                    let wv = &w[(ib * 32 + l) * RT..][..RT];
                    for t in 0..TT {
                        let x = a[t][ib * 32 + l];
                        for r in 0..RT {
                            acc[t][r] = x.mul_add(wv[r], acc[t][r]);
                        }
                    }
                }
                *lane = acc;
            }
            *out = xor_tree(&mut lanes);
        }
    }
}

/// `Σ_{j ∈ js} a[t][at + j] · wb[j][r]` for every token and row: integer-valued, exact in f32.
#[inline(always)]
fn int_dot(wb: &[f32], a: &[&[f32]; TT], at: usize, js: std::ops::Range<usize>) -> [[f32; RT]; TT] {
    let mut s = [[0f32; RT]; TT];
    for j in js {
        let wr = &wb[j * RT..][..RT];
        for t in 0..TT {
            let x = a[t][at + j];
            for r in 0..RT {
                // Exact either way (integers below 2^24); fused, it is one instruction.
                s[t][r] = x.mul_add(wr[r], s[t][r]);
            }
        }
    }
    s
}

/// The CUDA xor-tree (`v[l] += v[l ^ off]`, off = 16 … 1, lane 0) for every token and row. For
/// `l < off`, `l ^ off = l + off`, and only those lanes feed lane 0.
#[inline(always)]
fn xor_tree(lanes: &mut [[[f32; RT]; TT]; 32]) -> [[f32; RT]; TT] {
    let mut off = 16;
    while off > 0 {
        for l in 0..off {
            let hi = lanes[l + off];
            for (row, h) in lanes[l].iter_mut().zip(hi.iter()) {
                for (v, x) in row.iter_mut().zip(h) {
                    *v += x;
                }
            }
        }
        off /= 2;
    }
    lanes[0]
}

/// The scalar reference: every row through [`cn::matvec`], token by token.
pub fn matmul_ref(
    path: CudaTqPath,
    ty: TensorType,
    bytes: &[u8],
    n: usize,
    k: usize,
    x: &[f32],
    rows: usize,
) -> Result<Vec<f32>> {
    let mut out = vec![0f32; rows * n];
    for (t, o) in out.chunks_exact_mut(n.max(1)).enumerate().take(rows) {
        o.copy_from_slice(&cn::matvec(path, ty, bytes, n, k, &x[t * k..(t + 1) * k])?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::splitmix::SplitMix64 as Rng;
    use crate::numerics::sample::{random_activation, random_weights};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Odd shapes: rows not a multiple of the tile, tokens not a multiple of TT or TCHUNK, 70
    /// blocks per row (lanes wrap twice), a strided output.
    #[test]
    fn batched_kernel_equals_cuda_native_matvec_bit_for_bit() {
        let mut rng = Rng(11);
        for ty in [TensorType::TQ4_1S, TensorType::TQ3_1S] {
            for path in [CudaTqPath::Native, CudaTqPath::LoadQ8_0] {
                for (n, k, rows) in [(37, 32 * 70, 37), (16, 64, 1), (50, 576, 6)] {
                    let w = random_weights(ty, n, k, &mut rng).unwrap();
                    let x: Vec<f32> = (0..rows)
                        .flat_map(|_| random_activation(k, &mut rng))
                        .collect();
                    let want = matmul_ref(path, ty, &w, n, k, &x, rows).unwrap();
                    let cw = CudaWeights::new(path, ty, &w, n, k).unwrap();
                    let stride = n + 3;
                    for simd in [false, simd_available()] {
                        let mut out = vec![f32::NAN; rows * stride];
                        cw.matmul_with(&x, rows, &mut out, stride, simd);
                        let got: Vec<f32> =
                            out.chunks(stride).flat_map(|r| r[..n].to_vec()).collect();
                        assert_eq!(bits(&got), bits(&want), "{ty} {path:?} {n}x{k} simd {simd}");
                    }
                }
            }
        }
    }

    #[test]
    fn thread_count_does_not_change_results() {
        let mut rng = Rng(12);
        let (n, k, rows) = (96, 1536, 70);
        let ty = TensorType::TQ4_1S;
        let w = random_weights(ty, n, k, &mut rng).unwrap();
        let x: Vec<f32> = (0..rows)
            .flat_map(|_| random_activation(k, &mut rng))
            .collect();
        let cw = CudaWeights::new(CudaTqPath::Native, ty, &w, n, k).unwrap();
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut out = vec![0f32; rows * n];
            pool.install(|| cw.matmul(&x, rows, &mut out, n));
            bits(&out)
        };
        assert_eq!(run(1), run(3));
    }

    #[test]
    fn rejects_other_types_and_bad_shapes() {
        let e = CudaWeights::new(CudaTqPath::Native, TensorType::Q8_0, &[0; 34], 1, 32);
        assert!(e.unwrap_err().to_string().contains("tq4_1s and tq3_1s"));
        let e = CudaWeights::new(CudaTqPath::Native, TensorType::TQ4_1S, &[0; 19], 1, 32);
        assert!(e.unwrap_err().to_string().contains("does not fit"));
        let e = CudaWeights::new(CudaTqPath::Native, TensorType::TQ4_1S, &[0; 20], 1, 30);
        assert!(e.is_err());
    }
}
