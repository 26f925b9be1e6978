//! A CPU model of what the fork's CUDA backend computes for TQ weights (FORMATS.md §2), so that
//! `tq eval` can report the quality a CUDA user actually gets, not only the CPU reference's.
//!
//! Two paths exist in the fork (2026 snapshot):
//! - [`CudaTqPath::LoadQ8_0`], the default: TQ4_1S weights are converted to q8_0 when the model
//!   is loaded; mat-muls then run ggml's q8_0 × q8_1 kernels. Modelled as CPU dequantize →
//!   ggml's `quantize_row_q8_0_ref` → q8_0 · q8_1 block dot.
//! - [`CudaTqPath::Native`] (`GGML_TQ_NATIVE=1`): TQ4_1S through an int8 centroid table
//!   ([`TQ4_CENTROIDS_I8`], rescaled by 2.733/127) against q8_1 activations that were rotated
//!   forward per 32-block first; per block `d_act·(d0·s0 + d1·s1)` with integer half sums
//!   `s0, s1`, 32 lane partial sums (block `ib` on lane `ib % 32`), × 2.733/127, xor-tree sum.
//!   TQ3_1S has no int8 path: rotated f32 activation, `w = C3[idx]·d`, one fused multiply-add per
//!   element on lane `j % 32`, xor-tree sum.
//!
//! TQ3_1S is not converted at load in either mode (the fork's load-time conversion is for
//! TQ4_1S), so both paths give the native TQ3_1S numbers. Where the fork's compiler would fuse a
//! multiply and an add (nvcc's default `--fmad=true`) the model uses `mul_add`; the exact
//! contraction nvcc picks is not guaranteed, which moves results by ~1 ulp per block term — far
//! below the q8 rounding this model exists to show.

use crate::error::{Error, Result};
use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};
use crate::types::legacy;
use crate::types::tq as tqs;
use crate::types::{dequantize, TensorType};

/// The fork's CUDA int8 TQ4 centroid table: `round(C4[i] · 127 / 2.733)`.
pub const TQ4_CENTROIDS_I8: [i8; 16] = [
    -127, -96, -75, -58, -44, -31, -18, -6, 6, 18, 31, 44, 58, 75, 96, 127,
];

/// `2.733f / 127.0f`, the factor that turns [`TQ4_CENTROIDS_I8`] back into N(0,1) units.
pub fn tq4_i8_rescale() -> f32 {
    2.733f32 / 127.0f32
}

/// Which CUDA code path runs a TQ weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaTqPath {
    /// Default: TQ4_1S converted to q8_0 at load, q8_0 × q8_1 mat-vec.
    LoadQ8_0,
    /// `GGML_TQ_NATIVE=1`: int8 centroids × q8_1 rotated activations (TQ4_1S).
    Native,
}

impl CudaTqPath {
    pub fn name(self) -> &'static str {
        match self {
            CudaTqPath::LoadQ8_0 => "cuda-q8_0 (default)",
            CudaTqPath::Native => "cuda-native (GGML_TQ_NATIVE=1)",
        }
    }
}

/// One q8_1 activation block as the CUDA kernels see it: `d` already rounded through f16.
#[derive(Clone, Copy, Debug)]
pub struct Q8_1 {
    pub d: f32,
    pub qs: [i8; 32],
}

/// Quantize 32 values to q8_1 the way the fork's `tq_prerotate_q8_1` does: `d = amax/127`,
/// `q = roundf(v · (127/amax))` (0 when amax is 0), `d` stored as f16.
pub fn q8_1_block(v: &[f32; 32]) -> Q8_1 {
    let mut amax = 0f32;
    for x in v {
        amax = amax.max(x.abs());
    }
    let d = amax / 127.0;
    let id = if d > 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, x) in qs.iter_mut().zip(v) {
        *q = (x * id).round().clamp(-128.0, 127.0) as i8;
    }
    Q8_1 {
        d: f16_bits_to_f32(f32_to_f16_bits(d)),
        qs,
    }
}

/// Rotate each 32-block of `x` forward (the fork's activation pre-rotation, bit-identical to the
/// CPU reference's forward rotation) and quantize it to q8_1.
pub fn prerotate_q8_1(x: &[f32]) -> Vec<Q8_1> {
    x.chunks_exact(tqs::QK)
        .map(|c| {
            let mut b = [0f32; tqs::QK];
            b.copy_from_slice(c);
            tqs::forward_rotate(&mut b);
            q8_1_block(&b)
        })
        .collect()
}

/// Rotate each 32-block of `x` forward, in f32.
pub fn prerotate_f32(x: &[f32]) -> Vec<f32> {
    let mut out = x.to_vec();
    for c in out.chunks_exact_mut(tqs::QK) {
        let mut b = [0f32; tqs::QK];
        b.copy_from_slice(c);
        tqs::forward_rotate(&mut b);
        c.copy_from_slice(&b);
    }
    out
}

/// The xor-tree sum of 32 lane values (`v[l] += v[l ^ off]` for off = 16, 8, 4, 2, 1), lane 0.
fn xor_tree(mut v: [f32; 32]) -> f32 {
    let mut off = 16;
    while off > 0 {
        let prev = v;
        for l in 0..32 {
            v[l] = prev[l] + prev[l ^ off];
        }
        off /= 2;
    }
    v[0]
}

fn scales(b: &[u8]) -> (f32, f32) {
    (
        f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])),
        f16_bits_to_f32(u16::from_le_bytes([b[2], b[3]])),
    )
}

/// One TQ4_1S row · activation on the native dp4a path.
pub fn dot_tq4_native(row: &[u8], act: &[Q8_1]) -> f32 {
    let mut lanes = [0f32; 32];
    for (ib, (b, a)) in row.chunks_exact(tqs::TQ4_BYTES).zip(act).enumerate() {
        let (d0, d1) = scales(b);
        let idx = tqs::unpack_tq4(b);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..32 {
            let p = TQ4_CENTROIDS_I8[idx[j] as usize] as i32 * a.qs[j] as i32;
            if j < 16 {
                s0 += p;
            } else {
                s1 += p;
            }
        }
        let inner = d0.mul_add(s0 as f32, d1 * s1 as f32);
        let l = ib % 32;
        lanes[l] = a.d.mul_add(inner, lanes[l]);
    }
    let r = tq4_i8_rescale();
    for v in lanes.iter_mut() {
        *v *= r;
    }
    xor_tree(lanes)
}

/// One TQ3_1S (or TQ4_1S on the float path) row · rotated f32 activation: lane `j % 32` fuses
/// `act · (C[idx]·d)` into its sum, block after block.
pub fn dot_tq_float(ty: TensorType, row: &[u8], xr: &[f32]) -> f32 {
    let bb = ty.block_bytes();
    let mut lanes = [0f32; 32];
    for (ib, b) in row.chunks_exact(bb).enumerate() {
        let (d0, d1) = scales(b);
        let (idx, c): ([u8; 32], &[f32]) = match ty {
            TensorType::TQ4_1S => (tqs::unpack_tq4(b), &tqs::C4),
            _ => (tqs::unpack_tq3(b), &tqs::C3),
        };
        for (l, lane) in lanes.iter_mut().enumerate() {
            let w = c[idx[l] as usize] * if l < 16 { d0 } else { d1 };
            *lane = xr[ib * 32 + l].mul_add(w, *lane);
        }
    }
    xor_tree(lanes)
}

/// q8_0 (weights) · q8_1 (activation) for one row, ggml's block order: `Σ_b d_w·d_x·sumi`.
fn dot_q8_0_q8_1(row: &[u8], act: &[Q8_1]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in row.chunks_exact(34).zip(act) {
        let dw = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
        let mut sumi = 0i32;
        for j in 0..32 {
            sumi += (b[2 + j] as i8) as i32 * a.qs[j] as i32;
        }
        sum += dw * a.d * sumi as f32;
    }
    sum
}

/// q8_1 of the activation in the original domain (ggml's CUDA `quantize_q8_1`, d through f16).
pub fn q8_1_plain(x: &[f32]) -> Vec<Q8_1> {
    x.chunks_exact(32)
        .map(|c| {
            let mut b = [0f32; 32];
            b.copy_from_slice(c);
            q8_1_block(&b)
        })
        .collect()
}

/// The q8_0 blocks the default CUDA path holds for a TQ4_1S tensor: CPU dequantize, then ggml's
/// `quantize_row_q8_0_ref`.
pub fn load_q8_0(ty: TensorType, w: &[u8]) -> Result<Vec<u8>> {
    let n = w.len() / ty.block_bytes() * ty.block_size();
    let mut f = vec![0f32; n];
    dequantize(ty, w, &mut f, "cuda q8_0 load")?;
    let mut q = vec![0u8; n / 32 * 34];
    legacy::quantize_q8_0(&f, &mut q);
    Ok(q)
}

/// `y = W·x` as the fork's CUDA backend computes it for a TQ weight of `rows × cols`.
pub fn matvec(
    path: CudaTqPath,
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
) -> Result<Vec<f32>> {
    if !ty.is_tq_weight() {
        return Err(Error::Unsupported(format!(
            "{ty}: the CUDA model covers tq4_1s and tq3_1s weights only"
        )));
    }
    if !cols.is_multiple_of(32) || x.len() != cols || w.len() != rows * cols / 32 * ty.block_bytes()
    {
        return Err(Error::Unsupported(format!(
            "{ty}: {rows}x{cols} mat-vec with {} weight bytes and {} inputs does not fit",
            w.len(),
            x.len()
        )));
    }
    let row_bytes = cols / 32 * ty.block_bytes();
    let out = match (path, ty) {
        (CudaTqPath::LoadQ8_0, TensorType::TQ4_1S) => {
            let q = load_q8_0(ty, w)?;
            let act = q8_1_plain(x);
            q.chunks_exact(cols / 32 * 34)
                .map(|r| dot_q8_0_q8_1(r, &act))
                .collect()
        }
        (_, TensorType::TQ4_1S) => {
            let act = prerotate_q8_1(x);
            w.chunks_exact(row_bytes)
                .map(|r| dot_tq4_native(r, &act))
                .collect()
        }
        _ => {
            let xr = prerotate_f32(x);
            w.chunks_exact(row_bytes)
                .map(|r| dot_tq_float(ty, r, &xr))
                .collect()
        }
    };
    Ok(out)
}

/// The rotated-domain weights the native TQ4_1S path effectively multiplies by:
/// `TQ4_CENTROIDS_I8[idx] · (2.733/127) · d_half` (TQ3_1S: `C3[idx] · d_half`). Together with
/// [`rotated_q8_1_values`] this lets a dense evaluator reproduce the native path with ordinary
/// f32 mat-muls (up to summation order).
pub fn native_rotated_weights(ty: TensorType, w: &[u8], out: &mut [f32]) {
    let r = tq4_i8_rescale();
    for (b, o) in w
        .chunks_exact(ty.block_bytes())
        .zip(out.chunks_exact_mut(32))
    {
        let (d0, d1) = scales(b);
        for j in 0..32 {
            let d = if j < 16 { d0 } else { d1 };
            o[j] = match ty {
                TensorType::TQ4_1S => {
                    TQ4_CENTROIDS_I8[tqs::unpack_tq4(b)[j] as usize] as f32 * r * d
                }
                _ => tqs::C3[tqs::unpack_tq3(b)[j] as usize] * d,
            };
        }
    }
}

/// The activation the native TQ4_1S path effectively sees: rotated per 32-block, rounded to q8_1
/// (`q · f16(d)`), in the rotated domain.
pub fn rotated_q8_1_values(x: &[f32]) -> Vec<f32> {
    prerotate_q8_1(x)
        .iter()
        .flat_map(|b| b.qs.map(|q| q as f32 * b.d))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::splitmix::SplitMix64 as Rng;
    use crate::numerics::sample::{random_activation, random_weights, reference_dots};

    #[test]
    fn int8_table_is_rounded_codebook() {
        for (c, i) in tqs::C4.iter().zip(TQ4_CENTROIDS_I8) {
            assert_eq!((*c as f64 * 127.0 / 2.733).round() as i8, i, "{c}");
        }
    }

    #[test]
    fn xor_tree_sums() {
        let v: [f32; 32] = std::array::from_fn(|i| i as f32);
        assert_eq!(xor_tree(v), 496.0);
    }

    /// The models are close to the CPU reference (q8 rounding: ~1e-2 relative to Σ|w·x| at
    /// most), the native and q8_0 paths differ from each other, TQ3's float path is f32-accurate.
    #[test]
    fn models_track_the_reference() {
        let mut rng = Rng(5);
        let (rows, cols) = (64, 576);
        for ty in [TensorType::TQ4_1S, TensorType::TQ3_1S] {
            let w = random_weights(ty, rows, cols, &mut rng).unwrap();
            let x = random_activation(cols, &mut rng);
            let (dots, sums) = reference_dots(ty, &w, rows, cols, &x).unwrap();
            for path in [CudaTqPath::LoadQ8_0, CudaTqPath::Native] {
                let y = matvec(path, ty, &w, rows, cols, &x).unwrap();
                let worst = y
                    .iter()
                    .zip(&dots)
                    .zip(&sums)
                    .map(|((a, b), s)| (*a as f64 - b).abs() / s)
                    .fold(0f64, f64::max);
                if ty == TensorType::TQ3_1S {
                    assert!(worst < 1e-5, "{ty} {path:?}: {worst:e}");
                } else {
                    assert!(worst < 3e-2 && worst > 1e-6, "{ty} {path:?}: {worst:e}");
                }
            }
        }
    }

    /// The dense form (effective rotated weights · effective rotated activation) equals the
    /// kernel model up to summation order.
    #[test]
    fn dense_form_matches_kernel_model() {
        let mut rng = Rng(6);
        let (rows, cols) = (16, 1536);
        let ty = TensorType::TQ4_1S;
        let w = random_weights(ty, rows, cols, &mut rng).unwrap();
        let x = random_activation(cols, &mut rng);
        let y = matvec(CudaTqPath::Native, ty, &w, rows, cols, &x).unwrap();
        let mut wr = vec![0f32; rows * cols];
        native_rotated_weights(ty, &w, &mut wr);
        let xr = rotated_q8_1_values(&x);
        for r in 0..rows {
            let (mut d, mut s) = (0f64, 0f64);
            for j in 0..cols {
                let p = wr[r * cols + j] as f64 * xr[j] as f64;
                d += p;
                s += p.abs();
            }
            assert!(
                (y[r] as f64 - d).abs() <= 1e-5 * s,
                "row {r}: {} vs {d}",
                y[r]
            );
        }
    }
}
