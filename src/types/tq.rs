//! TQ4_1S / TQ3_1S weight blocks (FORMATS.md §2): 32 values per block, rotated by a fixed
//! randomized 32-point Hadamard transform, two f16 half-block scales, and 4- or 3-bit indices
//! into a Lloyd-Max codebook for N(0, 1).
//!
//! The scalar reference (`*_ref`) reproduces the fork's `quantize_row_tq*_1s_ref` /
//! `dequantize_row_tq*_1s` f32 arithmetic operation by operation (every op rounded on its own,
//! same order), so that its output is byte-exact with the conformance vectors.
//!
//! The registry paths (`quantize_tq4_1s`, `quantize_tq3_1s`, `dequantize_*`) are optimized
//! versions that are bit-equal to the references: the quantizers process 8 blocks at once, one
//! block per SIMD lane (AVX2 when the CPU has it, else portable lane loops); see "Cross-block
//! kernels" below. `quantize_tq4_1s_scalar` is the earlier per-block optimized TQ4 path.

use crate::math::hadamard::fwht_scalar;
use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};

/// Values per block.
pub const QK: usize = 32;
/// Bytes per TQ4_1S block.
pub const TQ4_BYTES: usize = 20;
/// Bytes per TQ3_1S block.
pub const TQ3_BYTES: usize = 16;

/// `1/sqrt(32)` as the f32 constant the engine uses.
const INV_SQRT32: f32 = 0.176_776_695_296_636_88;

/// 4-bit codebook (Lloyd-Max for N(0, 1)).
pub const C4: [f32; 16] = [
    -2.732590, -2.069017, -1.618046, -1.256231, -0.942340, -0.656759, -0.388048, -0.128395,
    0.128395, 0.388048, 0.656759, 0.942340, 1.256231, 1.618046, 2.069017, 2.732590,
];
/// Hard-coded 4-bit decision thresholds: index = first `i` with `v < T4[i]`, else 15.
pub const T4: [f32; 15] = [
    -2.400804, -1.843532, -1.437139, -1.099286, -0.799550, -0.522404, -0.258222, 0.000000,
    0.258222, 0.522404, 0.799550, 1.099286, 1.437139, 1.843532, 2.400804,
];
/// 3-bit codebook (deliberately asymmetric).
pub const C3: [f32; 8] = [
    -1.996684, -1.291398, -0.740341, -0.247508, 0.230106, 0.725222, 1.277503, 1.988943,
];
/// Hard-coded 3-bit decision thresholds: index = first `i` with `v < T3[i]`, else 7.
pub const T3: [f32; 7] = [
    -1.644041, -1.015870, -0.493925, -0.008701, 0.477664, 1.001363, 1.633223,
];

/// The scale multipliers tried by the scale search, in order.
const MULTS: [f32; 9] = [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5];
/// Refinement rounds of the reference quantizer.
pub const REFINE_ROUNDS: usize = 6;

/// Block signs (`golden_ratio_sign(i)` for i < 32), computed at compile time.
const SIGNS: [f32; 32] = {
    let mut s = [1.0f32; 32];
    let mut i = 0;
    while i < 32 {
        if (i as u32).wrapping_mul(0x9E37_79B9) & 0x8000_0000 != 0 {
            s[i] = -1.0;
        }
        i += 1;
    }
    s
};

/// Index of `v` under a threshold table: the first `i` with `v < t[i]`, else `t.len()`.
/// NaN compares false everywhere and maps to the top index.
#[inline]
pub fn tq_index(v: f32, t: &[f32]) -> usize {
    for (i, &th) in t.iter().enumerate() {
        if v < th {
            return i;
        }
    }
    t.len()
}

/// Forward block rotation: `b *= s`, butterfly, `b *= 1/sqrt(32)`.
pub fn forward_rotate(b: &mut [f32; QK]) {
    for (v, s) in b.iter_mut().zip(SIGNS.iter()) {
        *v *= *s;
    }
    fwht_scalar(b);
    for v in b.iter_mut() {
        *v *= INV_SQRT32;
    }
}

/// Inverse block rotation: butterfly, then `b *= (1/sqrt(32)) * s` (one f32 product).
pub fn inverse_rotate(b: &mut [f32; QK]) {
    fwht_scalar(b);
    for (v, s) in b.iter_mut().zip(SIGNS.iter()) {
        *v *= INV_SQRT32 * *s;
    }
}

/// Result of quantizing one block: f32 half scales (before f16 rounding) and indices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ {
    pub d: [f32; 2],
    pub idx: [u8; QK],
}

#[inline]
fn inv_of(d: f32) -> f32 {
    if d > 1e-10 {
        1.0 / d
    } else {
        0.0
    }
}

/// The scalar reference quantizer for one block (`x.len() >= 32`; `c`, `t`: codebook and its
/// hard-coded thresholds). Operation order follows the fork's `quantize_row_tq*_1s_ref`.
pub fn quantize_block_ref(x: &[f32], c: &[f32], t: &[f32]) -> BlockQ {
    let mut buf = [0f32; QK];
    buf.copy_from_slice(&x[..QK]);
    forward_rotate(&mut buf);

    // Per-half RMS.
    let mut rms = [0f32; 2];
    for h in 0..2 {
        let mut s = 0f32;
        for v in &buf[h * 16..h * 16 + 16] {
            s += v * v;
        }
        rms[h] = (s / 16.0).sqrt();
    }

    // Scale search: one multiplier for both halves, error over all 32 values.
    let mut best = rms;
    let mut best_err = 1e30f32;
    for &m in MULTS.iter() {
        let d = [rms[0] * m, rms[1] * m];
        let inv = [inv_of(d[0]), inv_of(d[1])];
        let mut err = 0f32;
        for j in 0..QK {
            let h = j / 16;
            let i = tq_index(buf[j] * inv[h], t);
            let diff = buf[j] - c[i] * d[h];
            err += diff * diff;
        }
        if err < best_err {
            best_err = err;
            best = d;
        }
    }

    // Refinement: least-squares scale for the current indices, per half.
    let mut d = best;
    for _ in 0..REFINE_ROUNDS {
        for h in 0..2 {
            let inv = inv_of(d[h]);
            let mut sxc = 0f32;
            let mut scc = 0f32;
            for v in &buf[h * 16..h * 16 + 16] {
                let cv = c[tq_index(v * inv, t)];
                sxc += v * cv;
                scc += cv * cv;
            }
            if scc > 1e-10 {
                d[h] = sxc / scc;
            }
        }
    }

    // Final indices from the f32 scales.
    let mut idx = [0u8; QK];
    for j in 0..QK {
        let h = j / 16;
        idx[j] = tq_index(buf[j] * inv_of(d[h]), t) as u8;
    }
    BlockQ { d, idx }
}

fn put_scales(out: &mut [u8], d: [f32; 2]) {
    out[0..2].copy_from_slice(&f32_to_f16_bits(d[0]).to_le_bytes());
    out[2..4].copy_from_slice(&f32_to_f16_bits(d[1]).to_le_bytes());
}

fn get_scales(b: &[u8]) -> [f32; 2] {
    [
        f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])),
        f16_bits_to_f32(u16::from_le_bytes([b[2], b[3]])),
    ]
}

/// Pack a TQ4_1S block.
pub fn pack_tq4(q: &BlockQ, out: &mut [u8]) {
    put_scales(out, q.d);
    for j in 0..16 {
        out[4 + j] = (q.idx[2 * j] & 15) | ((q.idx[2 * j + 1] & 15) << 4);
    }
}

/// Pack a TQ3_1S block.
pub fn pack_tq3(q: &BlockQ, out: &mut [u8]) {
    put_scales(out, q.d);
    for g in 0..4 {
        let mut w = 0u32;
        for i in 0..8 {
            w |= ((q.idx[8 * g + i] & 7) as u32) << (3 * i);
        }
        out[4 + 3 * g..4 + 3 * g + 3].copy_from_slice(&w.to_le_bytes()[..3]);
    }
}

/// Unpack the indices of a TQ4_1S block.
pub fn unpack_tq4(b: &[u8]) -> [u8; QK] {
    let mut idx = [0u8; QK];
    for j in 0..16 {
        idx[2 * j] = b[4 + j] & 15;
        idx[2 * j + 1] = b[4 + j] >> 4;
    }
    idx
}

/// Unpack the indices of a TQ3_1S block.
pub fn unpack_tq3(b: &[u8]) -> [u8; QK] {
    let mut idx = [0u8; QK];
    for g in 0..4 {
        let o = 4 + 3 * g;
        let w = b[o] as u32 | (b[o + 1] as u32) << 8 | (b[o + 2] as u32) << 16;
        for i in 0..8 {
            idx[8 * g + i] = ((w >> (3 * i)) & 7) as u8;
        }
    }
    idx
}

fn dequantize_block(b: &[u8], idx: &[u8; QK], c: &[f32], out: &mut [f32]) {
    let d = get_scales(b);
    let mut buf = [0f32; QK];
    for j in 0..QK {
        buf[j] = c[idx[j] as usize] * d[j / 16];
    }
    inverse_rotate(&mut buf);
    out[..QK].copy_from_slice(&buf);
}

/// Scalar reference TQ4_1S quantizer (whole blocks).
pub fn quantize_tq4_1s_ref(src: &[f32], out: &mut [u8]) {
    for (x, o) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ4_BYTES)) {
        pack_tq4(&quantize_block_ref(x, &C4, &T4), o);
    }
}

/// Scalar reference TQ4_1S dequantizer (whole blocks).
pub fn dequantize_tq4_1s_ref(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ4_BYTES).zip(out.chunks_exact_mut(QK)) {
        dequantize_block(b, &unpack_tq4(b), &C4, o);
    }
}

/// Scalar reference TQ3_1S quantizer (whole blocks).
pub fn quantize_tq3_1s_ref(src: &[f32], out: &mut [u8]) {
    for (x, o) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ3_BYTES)) {
        pack_tq3(&quantize_block_ref(x, &C3, &T3), o);
    }
}

/// Scalar reference TQ3_1S dequantizer (whole blocks).
pub fn dequantize_tq3_1s_ref(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ3_BYTES).zip(out.chunks_exact_mut(QK)) {
        dequantize_block(b, &unpack_tq3(b), &C3, o);
    }
}

// ---------------------------------------------------------------------------------------------
// Optimized TQ4_1S. Bit-equal to the reference (held by `fast_tq4_matches_ref_*` tests): the same
// f32 operations on the same operands in the same order for every value that reaches the output;
// what changes is how the work is organized:
// - branchless 4-step binary search over the sorted thresholds instead of a linear scan (the
//   predicate `!(v < T[k])` is monotone in k, NaN maps to 15 in both);
// - fixed-size, fully unrollable butterfly;
// - the scale search remembers the indices of the winning multiplier, which are exactly the
//   indices of refinement round 0 (same `d`, same `inv`);
// - refinement stops at a fixed point: when a round's indices equal the previous round's, every
//   later round reproduces the same `d` (same sums), so the remaining rounds are no-ops.
// ---------------------------------------------------------------------------------------------

/// Index under [`T4`] by branchless binary search; equal to `tq_index(v, &T4)` for every f32.
#[inline(always)]
fn idx4(v: f32) -> usize {
    let mut i = 0usize;
    i += ((!(v < T4[i + 7])) as usize) << 3;
    i += ((!(v < T4[i + 3])) as usize) << 2;
    i += ((!(v < T4[i + 1])) as usize) << 1;
    i += (!(v < T4[i])) as usize;
    i
}

/// Unnormalized 32-point butterfly (`step = 1, 2, 4, 8, 16`), fixed size.
#[inline(always)]
fn fwht32(b: &mut [f32; QK]) {
    let mut step = 1;
    while step < QK {
        for i in (0..QK).step_by(2 * step) {
            for j in i..i + step {
                let a = b[j];
                let c = b[j + step];
                b[j] = a + c;
                b[j + step] = a - c;
            }
        }
        step *= 2;
    }
}

/// Signs times `1/sqrt(32)`, one f32 product each (the inverse rotation's factors).
const SIGNS_SCALED: [f32; QK] = {
    let mut o = [0f32; QK];
    let mut i = 0;
    while i < QK {
        o[i] = INV_SQRT32 * SIGNS[i];
        i += 1;
    }
    o
};

#[inline(always)]
fn half_indices(buf: &[f32], inv: f32, idx: &mut [u8; 16]) {
    for (o, v) in idx.iter_mut().zip(buf) {
        *o = idx4(v * inv) as u8;
    }
}

/// Optimized TQ4_1S block quantizer; returns the same [`BlockQ`] as [`quantize_block_ref`].
pub fn quantize_block_tq4_fast(x: &[f32]) -> BlockQ {
    let mut buf = [0f32; QK];
    for ((b, v), s) in buf.iter_mut().zip(&x[..QK]).zip(SIGNS.iter()) {
        *b = v * s;
    }
    fwht32(&mut buf);
    for v in buf.iter_mut() {
        *v *= INV_SQRT32;
    }

    let mut rms = [0f32; 2];
    for h in 0..2 {
        let mut s = 0f32;
        for v in &buf[h * 16..h * 16 + 16] {
            s += v * v;
        }
        rms[h] = (s / 16.0).sqrt();
    }

    // Scale search; the diffs are independent, only the sum is serial (index order).
    let mut best = rms;
    let mut best_err = 1e30f32;
    let mut best_idx: Option<[u8; QK]> = None;
    for &m in MULTS.iter() {
        let d = [rms[0] * m, rms[1] * m];
        let inv = [inv_of(d[0]), inv_of(d[1])];
        let mut idx = [0u8; QK];
        let mut sq = [0f32; QK];
        for j in 0..QK {
            let h = j >> 4;
            let i = idx4(buf[j] * inv[h]);
            idx[j] = i as u8;
            let diff = buf[j] - C4[i] * d[h];
            sq[j] = diff * diff;
        }
        let mut err = 0f32;
        for v in sq {
            err += v;
        }
        if err < best_err {
            best_err = err;
            best = d;
            best_idx = Some(idx);
        }
    }

    let mut out = BlockQ {
        d: best,
        idx: [0u8; QK],
    };
    for h in 0..2 {
        let hb = &buf[h * 16..h * 16 + 16];
        let mut d = best[h];
        // Round-0 indices: those of the winning multiplier, or computed (no winner: d = rms).
        let mut cur = [0u8; 16];
        match &best_idx {
            Some(bi) => cur.copy_from_slice(&bi[h * 16..h * 16 + 16]),
            None => half_indices(hb, inv_of(d), &mut cur),
        }
        let mut prev: Option<[u8; 16]> = None;
        let mut rounds = 0;
        while rounds < REFINE_ROUNDS {
            if prev == Some(cur) {
                break; // fixed point: d (and so the indices) can no longer change
            }
            let mut sxc = 0f32;
            let mut scc = 0f32;
            for (v, &i) in hb.iter().zip(&cur) {
                let cv = C4[i as usize];
                sxc += v * cv;
                scc += cv * cv;
            }
            if scc > 1e-10 {
                d = sxc / scc;
            }
            rounds += 1;
            prev = Some(cur);
            half_indices(hb, inv_of(d), &mut cur);
        }
        // `cur` now holds the indices under the final d.
        out.d[h] = d;
        out.idx[h * 16..h * 16 + 16].copy_from_slice(&cur);
    }
    out
}

/// Scalar optimized TQ4_1S quantizer (whole blocks), bit-equal to [`quantize_tq4_1s_ref`].
pub fn quantize_tq4_1s_scalar(src: &[f32], out: &mut [u8]) {
    for (x, o) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ4_BYTES)) {
        pack_tq4(&quantize_block_tq4_fast(x), o);
    }
}

/// Optimized TQ4_1S dequantizer (whole blocks), bit-equal to [`dequantize_tq4_1s_ref`].
pub fn dequantize_tq4_1s(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ4_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = get_scales(b);
        let mut buf = [0f32; QK];
        for k in 0..16 {
            let q = b[4 + k];
            let h = k >> 3;
            buf[2 * k] = C4[(q & 15) as usize] * d[h];
            buf[2 * k + 1] = C4[(q >> 4) as usize] * d[h];
        }
        fwht32(&mut buf);
        for ((o, v), s) in o.iter_mut().zip(buf).zip(SIGNS_SCALED.iter()) {
            *o = v * s;
        }
    }
}

/// Optimized TQ3_1S dequantizer (whole blocks), bit-equal to [`dequantize_tq3_1s_ref`].
pub fn dequantize_tq3_1s(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ3_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = get_scales(b);
        let idx = unpack_tq3(b);
        let mut buf = [0f32; QK];
        for j in 0..QK {
            buf[j] = C3[idx[j] as usize] * d[j >> 4];
        }
        fwht32(&mut buf);
        for ((o, v), s) in o.iter_mut().zip(buf).zip(SIGNS_SCALED.iter()) {
            *o = v * s;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cross-block kernels: `LANES` blocks at once in structure-of-arrays form (element `j` of block
// `l` is lane `l` of vector `j`). Every lane runs exactly the f32 operations of the scalar
// reference for its block, in the same order, with the same operands, so the output is
// bit-equal (held by the `lanes_*` tests):
// - the index is the branchless binary search of `idx4` done lane-wise (threshold and centroid
//   lookups by in-register permutes on AVX2, a compare/select chain in the portable backend);
// - the multiplier search keeps the first strict minimum by a lane-wise `err < best_err` select;
// - refinement runs per half until every lane of the group is at a fixed point (its indices
//   repeat those of the previous round, so every later round reproduces the same d), at most
//   `REFINE_ROUNDS` rounds: lanes that converged earlier just repeat their fixed point.
// Two backends implement the lane operations: AVX2 intrinsics (x86-64, chosen at run time; no
// FMA, which would fuse and change the rounding) and portable `[f32; LANES]` loops that the
// compiler vectorizes for the baseline target.
// ---------------------------------------------------------------------------------------------

/// Blocks per cross-block group.
const LANES: usize = 8;

/// Lane-wise f32 operations; each is one IEEE f32 operation per lane (or an exact select).
trait Lanes: Copy {
    type Idx: Copy;
    unsafe fn splat(v: f32) -> Self;
    unsafe fn load(p: &[f32; LANES]) -> Self;
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn sub(self, o: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    unsafe fn div(self, o: Self) -> Self;
    unsafe fn sqrt(self) -> Self;
    /// `if self > 1e-10 { 1.0 / self } else { 0.0 }` (the reference's `inv_of`).
    unsafe fn inv_guarded(self) -> Self;
    /// `if a < b { x } else { y }`.
    unsafe fn select_lt(a: Self, b: Self, x: Self, y: Self) -> Self;
    /// `if a > b { x } else { y }`.
    unsafe fn select_gt(a: Self, b: Self, x: Self, y: Self) -> Self;
    /// Centroid and index of `v` under ([`C4`], [`T4`]): `tq_index(v, &T4)` per lane.
    unsafe fn lookup4(self) -> (Self, Self::Idx);
    /// Centroid and index of `v` under ([`C3`], [`T3`]).
    unsafe fn lookup3(self) -> (Self, Self::Idx);
    /// `lookup4(v).0`, possibly cheaper.
    unsafe fn centroid4(self) -> Self {
        self.lookup4().0
    }
    /// `lookup3(v).0`, possibly cheaper.
    unsafe fn centroid3(self) -> Self {
        self.lookup3().0
    }
    /// Load `LANES` consecutive blocks transposed: vector `j` holds element `j` of each block.
    unsafe fn load_transposed(x: &[f32; LANES * QK]) -> [Self; QK] {
        let mut t = [[0f32; LANES]; QK];
        for (l, blk) in x.chunks_exact(QK).enumerate() {
            for (j, &v) in blk.iter().enumerate() {
                t[j][l] = v;
            }
        }
        let mut out = [Self::splat(0.0); QK];
        for (o, r) in out.iter_mut().zip(&t) {
            *o = Self::load(r);
        }
        out
    }
    /// Whether `a[k] == b[k]` in every lane for every k (operands are never NaN).
    unsafe fn all_eq(a: &[Self], b: &[Self]) -> bool;
    unsafe fn store_idx(i: Self::Idx, out: &mut [i32; LANES]);
    unsafe fn store(self, out: &mut [f32; LANES]);
}

/// Result of a group: f32 half scales and indices, lane-major within each row.
struct GroupQ {
    d: [[f32; LANES]; 2],
    idx: [[i32; LANES]; QK],
}

#[inline(always)]
unsafe fn lookup<S: Lanes, const FOUR: bool>(v: S) -> (S, S::Idx) {
    if FOUR {
        v.lookup4()
    } else {
        v.lookup3()
    }
}

#[inline(always)]
unsafe fn centroid<S: Lanes, const FOUR: bool>(v: S) -> S {
    if FOUR {
        v.centroid4()
    } else {
        v.centroid3()
    }
}

/// Quantize one group of `LANES` blocks, given transposed (`x[j]` holds element j of each block).
#[inline(always)]
unsafe fn quantize_group<S: Lanes, const FOUR: bool>(x: &[S; QK]) -> GroupQ {
    let mut b = [S::splat(0.0); QK];
    for j in 0..QK {
        b[j] = x[j].mul(S::splat(SIGNS[j]));
    }
    let mut step = 1;
    while step < QK {
        let mut i = 0;
        while i < QK {
            for j in i..i + step {
                let (a, c) = (b[j], b[j + step]);
                b[j] = a.add(c);
                b[j + step] = a.sub(c);
            }
            i += 2 * step;
        }
        step *= 2;
    }
    let isq = S::splat(INV_SQRT32);
    for v in b.iter_mut() {
        *v = v.mul(isq);
    }

    let mut rms = [S::splat(0.0); 2];
    for h in 0..2 {
        let mut s = S::splat(0.0);
        for v in &b[h * 16..h * 16 + 16] {
            s = s.add(v.mul(*v));
        }
        rms[h] = s.div(S::splat(16.0)).sqrt();
    }

    // Multiplier search: first strict minimum of the error over all 32 values. Three
    // multipliers per pass over the values (independent error chains); each error still sums
    // its 32 terms in index order.
    let mut ds = [[S::splat(0.0); 9]; 2];
    let mut invs = [[S::splat(0.0); 9]; 2];
    for (k, &m) in MULTS.iter().enumerate() {
        for h in 0..2 {
            ds[h][k] = rms[h].mul(S::splat(m));
            invs[h][k] = ds[h][k].inv_guarded();
        }
    }
    let mut err = [S::splat(0.0); 9];
    for h in 0..2 {
        for t in 0..3 {
            let (d3, inv3) = (&ds[h][3 * t..3 * t + 3], &invs[h][3 * t..3 * t + 3]);
            let mut e3 = [err[3 * t], err[3 * t + 1], err[3 * t + 2]];
            for &v in &b[h * 16..h * 16 + 16] {
                for u in 0..3 {
                    let c = centroid::<S, FOUR>(v.mul(inv3[u]));
                    let diff = v.sub(c.mul(d3[u]));
                    e3[u] = e3[u].add(diff.mul(diff));
                }
            }
            err[3 * t..3 * t + 3].copy_from_slice(&e3);
        }
    }
    let mut best = rms;
    let mut best_err = S::splat(1e30);
    for k in 0..9 {
        best[0] = S::select_lt(err[k], best_err, ds[0][k], best[0]);
        best[1] = S::select_lt(err[k], best_err, ds[1][k], best[1]);
        best_err = S::select_lt(err[k], best_err, err[k], best_err);
    }

    // Refinement per half (the halves are independent), stopping when every lane has reached
    // a fixed point; then the last indices are the final ones.
    let mut out = GroupQ {
        d: [[0.0; LANES]; 2],
        idx: [[0; LANES]; QK],
    };
    for h in 0..2 {
        let hb = &b[h * 16..h * 16 + 16];
        let mut d = best[h];
        let mut prev = [S::splat(0.0); 16];
        let mut cur = [S::splat(0.0); 16];
        let mut cur_i = [[0i32; LANES]; 16];
        let mut fixed = false;
        for round in 0..REFINE_ROUNDS {
            let inv = d.inv_guarded();
            for k in 0..16 {
                let (c, i) = lookup::<S, FOUR>(hb[k].mul(inv));
                cur[k] = c;
                S::store_idx(i, &mut cur_i[k]);
            }
            // Indices equal to the previous round's give the same sums, so the next d equals
            // this one and every later round repeats this one: d is final, and so are `cur`.
            if round > 0 && S::all_eq(&cur, &prev) {
                fixed = true;
                break;
            }
            let mut sxc = S::splat(0.0);
            let mut scc = S::splat(0.0);
            for k in 0..16 {
                sxc = sxc.add(hb[k].mul(cur[k]));
                scc = scc.add(cur[k].mul(cur[k]));
            }
            d = S::select_gt(scc, S::splat(1e-10), sxc.div(scc), d);
            prev = cur;
        }
        d.store(&mut out.d[h]);
        if fixed {
            out.idx[h * 16..h * 16 + 16].copy_from_slice(&cur_i);
        } else {
            let inv = d.inv_guarded();
            for (k, &v) in hb.iter().enumerate() {
                S::store_idx(lookup::<S, FOUR>(v.mul(inv)).1, &mut out.idx[h * 16 + k]);
            }
        }
    }
    out
}

/// Quantize whole blocks (`min(src.len() / 32, out.len() / bytes)` of them) group by group;
/// a last partial group is padded with zero blocks whose output is discarded.
#[inline(always)]
unsafe fn quantize_lanes<S: Lanes, const FOUR: bool>(src: &[f32], out: &mut [u8]) {
    let bytes = if FOUR { TQ4_BYTES } else { TQ3_BYTES };
    let nb = (src.len() / QK).min(out.len() / bytes);
    let mut g = 0;
    while g < nb {
        let n = LANES.min(nb - g);
        let x = if n == LANES {
            S::load_transposed(src[g * QK..(g + LANES) * QK].try_into().unwrap())
        } else {
            let mut pad = [0f32; LANES * QK];
            pad[..n * QK].copy_from_slice(&src[g * QK..(g + n) * QK]);
            S::load_transposed(&pad)
        };
        let q = quantize_group::<S, FOUR>(&x);
        // Packed index words, lane-wise: word `w` holds indices 8w..8w+8 at `bits` bits each
        // (TQ4: the 4 LE bytes of qs[4w..4w+4], low nibble first; TQ3: the 24-bit group w).
        let bits = if FOUR { 4 } else { 3 };
        let mut words = [[0u32; LANES]; 4];
        for (w, row) in words.iter_mut().enumerate() {
            for e in 0..8 {
                let ix = &q.idx[8 * w + e];
                for l in 0..LANES {
                    row[l] |= (ix[l] as u32) << (bits * e);
                }
            }
        }
        for l in 0..n {
            let o = &mut out[(g + l) * bytes..(g + l + 1) * bytes];
            o[0..2].copy_from_slice(&f32_to_f16_bits(q.d[0][l]).to_le_bytes());
            o[2..4].copy_from_slice(&f32_to_f16_bits(q.d[1][l]).to_le_bytes());
            let wb = if FOUR { 4 } else { 3 };
            for (w, row) in words.iter().enumerate() {
                o[4 + wb * w..4 + wb * (w + 1)].copy_from_slice(&row[l].to_le_bytes()[..wb]);
            }
        }
        g += LANES;
    }
}

/// Portable backend: plain lane loops.
#[derive(Clone, Copy)]
struct Portable([f32; LANES]);

impl Portable {
    #[inline(always)]
    fn map2(self, o: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        Portable(std::array::from_fn(|l| f(self.0[l], o.0[l])))
    }

    /// Linear compare/select chain; for sorted `t` equal to the binary search and to
    /// `tq_index`: the index is the number of `k` with `!(v < t[k])` (all of them for NaN).
    /// Written with masks and bit selects so that it vectorizes (no branches).
    #[inline(always)]
    fn lookup_chain(self, c: &[f32], t: &[f32]) -> (Self, [i32; LANES]) {
        let mut cv = [c[0].to_bits(); LANES];
        let mut iv = [0i32; LANES];
        for k in 0..t.len() {
            let (tk, ck) = (t[k], c[k + 1].to_bits());
            for l in 0..LANES {
                // All ones where `!(v < t[k])`.
                let up = ((self.0[l] < tk) as u32).wrapping_sub(1);
                cv[l] = (ck & up) | (cv[l] & !up);
                iv[l] -= up as i32;
            }
        }
        (Portable(cv.map(f32::from_bits)), iv)
    }
}

impl Lanes for Portable {
    type Idx = [i32; LANES];
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Portable([v; LANES])
    }
    #[inline(always)]
    unsafe fn load(p: &[f32; LANES]) -> Self {
        Portable(*p)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        self.map2(o, |a, b| a + b)
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        self.map2(o, |a, b| a - b)
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        self.map2(o, |a, b| a * b)
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        self.map2(o, |a, b| a / b)
    }
    #[inline(always)]
    unsafe fn sqrt(self) -> Self {
        Portable(self.0.map(f32::sqrt))
    }
    #[inline(always)]
    unsafe fn inv_guarded(self) -> Self {
        Portable(self.0.map(inv_of))
    }
    #[inline(always)]
    unsafe fn select_lt(a: Self, b: Self, x: Self, y: Self) -> Self {
        Portable(std::array::from_fn(|l| {
            if a.0[l] < b.0[l] {
                x.0[l]
            } else {
                y.0[l]
            }
        }))
    }
    #[inline(always)]
    unsafe fn select_gt(a: Self, b: Self, x: Self, y: Self) -> Self {
        Portable(std::array::from_fn(|l| {
            if a.0[l] > b.0[l] {
                x.0[l]
            } else {
                y.0[l]
            }
        }))
    }
    #[inline(always)]
    unsafe fn lookup4(self) -> (Self, Self::Idx) {
        self.lookup_chain(&C4, &T4)
    }
    #[inline(always)]
    unsafe fn lookup3(self) -> (Self, Self::Idx) {
        self.lookup_chain(&C3, &T3)
    }
    #[inline(always)]
    unsafe fn all_eq(a: &[Self], b: &[Self]) -> bool {
        let mut same = true;
        for (x, y) in a.iter().zip(b) {
            for l in 0..LANES {
                same &= x.0[l] == y.0[l];
            }
        }
        same
    }
    #[inline(always)]
    unsafe fn store_idx(i: Self::Idx, out: &mut [i32; LANES]) {
        *out = i;
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; LANES]) {
        *out = self.0;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// AVX2 backend (8 f32 lanes). Only constructed inside `#[target_feature(enable = "avx2")]`
    /// functions, after run-time detection.
    #[derive(Clone, Copy)]
    pub(super) struct Avx2(__m256);

    #[inline(always)]
    unsafe fn nlt(v: __m256, t: __m256) -> __m256 {
        // !(v < t), true for unordered: the "step up" predicate of the index search.
        _mm256_cmp_ps::<_CMP_NLT_UQ>(v, t)
    }

    impl Lanes for Avx2 {
        type Idx = __m256i;
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            Avx2(_mm256_set1_ps(v))
        }
        #[inline(always)]
        unsafe fn load(p: &[f32; LANES]) -> Self {
            Avx2(_mm256_loadu_ps(p.as_ptr()))
        }
        #[inline(always)]
        unsafe fn add(self, o: Self) -> Self {
            Avx2(_mm256_add_ps(self.0, o.0))
        }
        #[inline(always)]
        unsafe fn sub(self, o: Self) -> Self {
            Avx2(_mm256_sub_ps(self.0, o.0))
        }
        #[inline(always)]
        unsafe fn mul(self, o: Self) -> Self {
            Avx2(_mm256_mul_ps(self.0, o.0))
        }
        #[inline(always)]
        unsafe fn div(self, o: Self) -> Self {
            Avx2(_mm256_div_ps(self.0, o.0))
        }
        #[inline(always)]
        unsafe fn sqrt(self) -> Self {
            Avx2(_mm256_sqrt_ps(self.0))
        }
        #[inline(always)]
        unsafe fn inv_guarded(self) -> Self {
            let ok = _mm256_cmp_ps::<_CMP_GT_OQ>(self.0, _mm256_set1_ps(1e-10));
            Avx2(_mm256_and_ps(
                ok,
                _mm256_div_ps(_mm256_set1_ps(1.0), self.0),
            ))
        }
        #[inline(always)]
        unsafe fn select_lt(a: Self, b: Self, x: Self, y: Self) -> Self {
            let m = _mm256_cmp_ps::<_CMP_LT_OQ>(a.0, b.0);
            Avx2(_mm256_blendv_ps(y.0, x.0, m))
        }
        #[inline(always)]
        unsafe fn select_gt(a: Self, b: Self, x: Self, y: Self) -> Self {
            let m = _mm256_cmp_ps::<_CMP_GT_OQ>(a.0, b.0);
            Avx2(_mm256_blendv_ps(y.0, x.0, m))
        }
        #[inline(always)]
        unsafe fn lookup4(self) -> (Self, Self::Idx) {
            // Binary search as in `idx4`; the masks are -1/0, so `k - mask` adds the bit.
            let v = self.0;
            let m3 = nlt(v, _mm256_set1_ps(T4[7]));
            let t2 = _mm256_blendv_ps(_mm256_set1_ps(T4[3]), _mm256_set1_ps(T4[11]), m3);
            let m2 = nlt(v, t2);
            let (b3, b2) = (_mm256_castps_si256(m3), _mm256_castps_si256(m2));
            // k1 = 2*bit3 + bit2 selects T4[1 + 4*k1].
            let k1 = _mm256_sub_epi32(_mm256_and_si256(b3, _mm256_set1_epi32(2)), b2);
            let tab1 = _mm256_setr_ps(T4[1], T4[5], T4[9], T4[13], 0.0, 0.0, 0.0, 0.0);
            let m1 = nlt(v, _mm256_permutevar8x32_ps(tab1, k1));
            // k0 = 4*bit3 + 2*bit2 + bit1 selects T4[2*k0].
            let k0 = _mm256_sub_epi32(_mm256_slli_epi32::<1>(k1), _mm256_castps_si256(m1));
            let tab0 = _mm256_setr_ps(T4[0], T4[2], T4[4], T4[6], T4[8], T4[10], T4[12], T4[14]);
            let m0 = nlt(v, _mm256_permutevar8x32_ps(tab0, k0));
            let i = _mm256_sub_epi32(_mm256_slli_epi32::<1>(k0), _mm256_castps_si256(m0));
            let lo = _mm256_setr_ps(C4[0], C4[1], C4[2], C4[3], C4[4], C4[5], C4[6], C4[7]);
            let hi = _mm256_setr_ps(C4[8], C4[9], C4[10], C4[11], C4[12], C4[13], C4[14], C4[15]);
            let c = _mm256_blendv_ps(
                _mm256_permutevar8x32_ps(lo, i),
                _mm256_permutevar8x32_ps(hi, i),
                m3,
            );
            (Avx2(c), i)
        }
        #[inline(always)]
        unsafe fn lookup3(self) -> (Self, Self::Idx) {
            let v = self.0;
            let m2 = nlt(v, _mm256_set1_ps(T3[3]));
            let t1 = _mm256_blendv_ps(_mm256_set1_ps(T3[1]), _mm256_set1_ps(T3[5]), m2);
            let m1 = nlt(v, t1);
            // k0 = 2*bit2 + bit1 selects T3[2*k0].
            let k0 = _mm256_sub_epi32(
                _mm256_and_si256(_mm256_castps_si256(m2), _mm256_set1_epi32(2)),
                _mm256_castps_si256(m1),
            );
            let tab0 = _mm256_setr_ps(T3[0], T3[2], T3[4], T3[6], 0.0, 0.0, 0.0, 0.0);
            let m0 = nlt(v, _mm256_permutevar8x32_ps(tab0, k0));
            let i = _mm256_sub_epi32(_mm256_slli_epi32::<1>(k0), _mm256_castps_si256(m0));
            let cb = _mm256_setr_ps(C3[0], C3[1], C3[2], C3[3], C3[4], C3[5], C3[6], C3[7]);
            (Avx2(_mm256_permutevar8x32_ps(cb, i)), i)
        }
        #[inline(always)]
        unsafe fn centroid4(self) -> Self {
            // As `lookup4`, but the centroid straight from the last level: C4[2*k0 + bit0].
            let v = self.0;
            let m3 = nlt(v, _mm256_set1_ps(T4[7]));
            let t2 = _mm256_blendv_ps(_mm256_set1_ps(T4[3]), _mm256_set1_ps(T4[11]), m3);
            let m2 = nlt(v, t2);
            let (b3, b2) = (_mm256_castps_si256(m3), _mm256_castps_si256(m2));
            let k1 = _mm256_sub_epi32(_mm256_and_si256(b3, _mm256_set1_epi32(2)), b2);
            let tab1 = _mm256_setr_ps(T4[1], T4[5], T4[9], T4[13], 0.0, 0.0, 0.0, 0.0);
            let m1 = nlt(v, _mm256_permutevar8x32_ps(tab1, k1));
            let k0 = _mm256_sub_epi32(_mm256_slli_epi32::<1>(k1), _mm256_castps_si256(m1));
            let tab0 = _mm256_setr_ps(T4[0], T4[2], T4[4], T4[6], T4[8], T4[10], T4[12], T4[14]);
            let m0 = nlt(v, _mm256_permutevar8x32_ps(tab0, k0));
            let ev = _mm256_setr_ps(C4[0], C4[2], C4[4], C4[6], C4[8], C4[10], C4[12], C4[14]);
            let od = _mm256_setr_ps(C4[1], C4[3], C4[5], C4[7], C4[9], C4[11], C4[13], C4[15]);
            Avx2(_mm256_blendv_ps(
                _mm256_permutevar8x32_ps(ev, k0),
                _mm256_permutevar8x32_ps(od, k0),
                m0,
            ))
        }
        #[inline(always)]
        unsafe fn load_transposed(x: &[f32; LANES * QK]) -> [Self; QK] {
            // Four 8x8 transposes (unpack, shuffle, swap 128-bit halves): data movement only.
            let mut out = [Avx2(_mm256_setzero_ps()); QK];
            let p = x.as_ptr();
            for c in 0..QK / 8 {
                let r: [__m256; 8] =
                    std::array::from_fn(|l| _mm256_loadu_ps(p.add(l * QK + 8 * c)));
                let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                let o = &mut out[8 * c..8 * c + 8];
                o[0] = Avx2(_mm256_permute2f128_ps::<0x20>(s0, s4));
                o[1] = Avx2(_mm256_permute2f128_ps::<0x20>(s1, s5));
                o[2] = Avx2(_mm256_permute2f128_ps::<0x20>(s2, s6));
                o[3] = Avx2(_mm256_permute2f128_ps::<0x20>(s3, s7));
                o[4] = Avx2(_mm256_permute2f128_ps::<0x31>(s0, s4));
                o[5] = Avx2(_mm256_permute2f128_ps::<0x31>(s1, s5));
                o[6] = Avx2(_mm256_permute2f128_ps::<0x31>(s2, s6));
                o[7] = Avx2(_mm256_permute2f128_ps::<0x31>(s3, s7));
            }
            out
        }
        #[inline(always)]
        unsafe fn all_eq(a: &[Self], b: &[Self]) -> bool {
            let mut m = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
            for (x, y) in a.iter().zip(b) {
                m = _mm256_and_ps(m, _mm256_cmp_ps::<_CMP_EQ_OQ>(x.0, y.0));
            }
            _mm256_movemask_ps(m) == 0xff
        }
        #[inline(always)]
        unsafe fn store_idx(i: Self::Idx, out: &mut [i32; LANES]) {
            _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, i);
        }
        #[inline(always)]
        unsafe fn store(self, out: &mut [f32; LANES]) {
            _mm256_storeu_ps(out.as_mut_ptr(), self.0);
        }
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_tq4(src: &[f32], out: &mut [u8]) {
        quantize_lanes::<Avx2, true>(src, out)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_tq3(src: &[f32], out: &mut [u8]) {
        quantize_lanes::<Avx2, false>(src, out)
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// TQ4_1S quantizer, portable cross-block backend (bit-equal to [`quantize_tq4_1s_ref`]).
pub fn quantize_tq4_1s_portable(src: &[f32], out: &mut [u8]) {
    // SAFETY: the portable backend uses no target features.
    unsafe { quantize_lanes::<Portable, true>(src, out) }
}

/// TQ3_1S quantizer, portable cross-block backend (bit-equal to [`quantize_tq3_1s_ref`]).
pub fn quantize_tq3_1s_portable(src: &[f32], out: &mut [u8]) {
    // SAFETY: as above.
    unsafe { quantize_lanes::<Portable, false>(src, out) }
}

/// TQ4_1S quantizer, AVX2 cross-block backend; `None` when the CPU lacks AVX2 (or is not x86-64).
pub fn quantize_tq4_1s_avx2(src: &[f32], out: &mut [u8]) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 was detected at run time.
        unsafe { avx2::quantize_tq4(src, out) };
        return Some(());
    }
    let _ = (src, out);
    None
}

/// TQ3_1S quantizer, AVX2 cross-block backend; `None` without AVX2.
pub fn quantize_tq3_1s_avx2(src: &[f32], out: &mut [u8]) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 was detected at run time.
        unsafe { avx2::quantize_tq3(src, out) };
        return Some(());
    }
    let _ = (src, out);
    None
}

// ---------------------------------------------------------------------------------------------
// Registry entry points: the fastest bit-exact path for the CPU.
// ---------------------------------------------------------------------------------------------

/// TQ4_1S quantizer (whole blocks), bit-equal to [`quantize_tq4_1s_ref`]: the AVX2 cross-block
/// kernel where the CPU has AVX2, else the portable one.
pub fn quantize_tq4_1s(src: &[f32], out: &mut [u8]) {
    if quantize_tq4_1s_avx2(src, out).is_none() {
        quantize_tq4_1s_portable(src, out)
    }
}

/// TQ3_1S quantizer (whole blocks), bit-equal to [`quantize_tq3_1s_ref`].
pub fn quantize_tq3_1s(src: &[f32], out: &mut [u8]) {
    if quantize_tq3_1s_avx2(src, out).is_none() {
        quantize_tq3_1s_portable(src, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::signs::tq_block_signs;

    /// SplitMix64 with Box–Muller Gaussians (test inputs only).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        /// Uniform on (0, 1].
        fn uniform(&mut self) -> f64 {
            ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
        }
        fn gauss(&mut self) -> f64 {
            let (u1, u2) = (self.uniform(), self.uniform());
            (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        }
        fn block(&mut self, sigma: f64) -> [f32; QK] {
            std::array::from_fn(|_| (self.gauss() * sigma) as f32)
        }
    }

    /// A varied random block: Gaussian with a log-uniform sigma, sometimes heavy-tailed, with
    /// zeroed or repeated values, a zero half, or denormal-scale values.
    fn varied_block(r: &mut Rng) -> [f32; QK] {
        let sigma = 10f64.powf(-12.0 + 18.0 * r.uniform());
        let mut x = r.block(sigma);
        match r.next() % 8 {
            0 => {
                for v in x.iter_mut() {
                    if r.uniform() < 0.05 {
                        *v *= 30.0;
                    }
                }
            }
            1 => x[..16].fill(0.0),
            2 => {
                let k = (r.next() % 32) as usize;
                x[k] = 0.0;
                x[(k + 7) % 32] = x[(k + 3) % 32];
            }
            3 => x = std::array::from_fn(|i| ((i as f32) - 15.5) * sigma as f32),
            4 => x = [0.0; QK],
            5 => {
                let c = (r.gauss() * sigma) as f32;
                x = [c; QK];
            }
            _ => {}
        }
        x
    }

    #[derive(Clone, Copy)]
    enum Cmp {
        Lt,
        Le,
    }

    /// A parameterized copy of the reference quantizer: refinement rounds, the threshold
    /// table and the comparison are knobs. With (6, hard-coded table, `<`) it must equal the
    /// reference (checked by `model_equals_reference`).
    fn model(x: &[f32], c: &[f32], t: &[f32], rounds: usize, cmp: Cmp) -> BlockQ {
        let index = |v: f32| -> usize {
            for (i, &th) in t.iter().enumerate() {
                let below = match cmp {
                    Cmp::Lt => v < th,
                    Cmp::Le => v <= th,
                };
                if below {
                    return i;
                }
            }
            t.len()
        };
        let mut buf = [0f32; QK];
        buf.copy_from_slice(&x[..QK]);
        forward_rotate(&mut buf);
        let mut rms = [0f32; 2];
        for h in 0..2 {
            let mut s = 0f32;
            for v in &buf[h * 16..h * 16 + 16] {
                s += v * v;
            }
            rms[h] = (s / 16.0).sqrt();
        }
        let mut best = rms;
        let mut best_err = 1e30f32;
        for &m in MULTS.iter() {
            let d = [rms[0] * m, rms[1] * m];
            let inv = [inv_of(d[0]), inv_of(d[1])];
            let mut err = 0f32;
            for j in 0..QK {
                let h = j / 16;
                let diff = buf[j] - c[index(buf[j] * inv[h])] * d[h];
                err += diff * diff;
            }
            if err < best_err {
                best_err = err;
                best = d;
            }
        }
        let mut d = best;
        for _ in 0..rounds {
            for h in 0..2 {
                let inv = inv_of(d[h]);
                let (mut sxc, mut scc) = (0f32, 0f32);
                for v in &buf[h * 16..h * 16 + 16] {
                    let cv = c[index(v * inv)];
                    sxc += v * cv;
                    scc += cv * cv;
                }
                if scc > 1e-10 {
                    d[h] = sxc / scc;
                }
            }
        }
        let mut idx = [0u8; QK];
        for j in 0..QK {
            idx[j] = index(buf[j] * inv_of(d[j / 16])) as u8;
        }
        BlockQ { d, idx }
    }

    fn pack4(q: &BlockQ) -> [u8; TQ4_BYTES] {
        let mut o = [0u8; TQ4_BYTES];
        pack_tq4(q, &mut o);
        o
    }

    fn pack3(q: &BlockQ) -> [u8; TQ3_BYTES] {
        let mut o = [0u8; TQ3_BYTES];
        pack_tq3(q, &mut o);
        o
    }

    fn q4(x: &[f32; QK]) -> [u8; TQ4_BYTES] {
        let mut o = [0u8; TQ4_BYTES];
        quantize_tq4_1s(x, &mut o);
        o
    }

    fn q3(x: &[f32; QK]) -> [u8; TQ3_BYTES] {
        let mut o = [0u8; TQ3_BYTES];
        quantize_tq3_1s(x, &mut o);
        o
    }

    /// Computed midpoints `(c[i] + c[i+1]) * 0.5` (what the hard-coded tables are *not*).
    fn midpoints(c: &[f32]) -> Vec<f32> {
        c.windows(2).map(|w| (w[0] + w[1]) * 0.5).collect()
    }

    fn next_up(v: f32) -> f32 {
        assert!(v.is_finite());
        if v == 0.0 {
            return f32::from_bits(1);
        }
        f32::from_bits(if v > 0.0 {
            v.to_bits() + 1
        } else {
            v.to_bits() - 1
        })
    }

    fn next_down(v: f32) -> f32 {
        -next_up(-v)
    }

    /// Rotated-domain value the quantizer compares for element `j` under its final scale.
    fn final_ratio(x: &[f32; QK], q: &BlockQ, j: usize) -> f32 {
        let mut buf = *x;
        forward_rotate(&mut buf);
        buf[j] * inv_of(q.d[j / 16])
    }

    #[test]
    fn signs_match_math_module() {
        assert_eq!(SIGNS, tq_block_signs());
        let expect: [f32; QK] = std::array::from_fn(|i| INV_SQRT32 * tq_block_signs()[i]);
        assert_eq!(SIGNS_SCALED, expect);
    }

    #[test]
    fn model_equals_reference() {
        let mut r = Rng(1);
        for _ in 0..3000 {
            let x = varied_block(&mut r);
            assert_eq!(
                model(&x, &C4, &T4, 6, Cmp::Lt),
                quantize_block_ref(&x, &C4, &T4)
            );
            assert_eq!(
                model(&x, &C3, &T3, 6, Cmp::Lt),
                quantize_block_ref(&x, &C3, &T3)
            );
        }
    }

    #[test]
    fn idx4_equals_linear_scan() {
        for &t in T4.iter() {
            for v in [t, next_up(t), next_down(t), -t, 0.0, -0.0] {
                assert_eq!(idx4(v), tq_index(v, &T4), "v = {v:e}");
            }
        }
        for v in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
        ] {
            assert_eq!(idx4(v), tq_index(v, &T4), "v = {v:e}");
        }
        let mut r = Rng(2);
        for _ in 0..200_000 {
            let v = (r.gauss() * 1.5) as f32;
            assert_eq!(idx4(v), tq_index(v, &T4));
        }
    }

    #[test]
    fn fast_tq4_matches_ref_random_blocks() {
        let mut r = Rng(3);
        let n_blocks = 50_000;
        let mut src = Vec::with_capacity(n_blocks * QK);
        for _ in 0..n_blocks {
            src.extend_from_slice(&varied_block(&mut r));
        }
        // Extremes: f16 overflow, f32 overflow of the sum of squares, subnormals.
        for s in [6e4f32, 65504.0, 1e6, 1e20, 1e-40, 1e-45] {
            src.extend((0..QK).map(|i| if i % 3 == 0 { -s } else { s }));
        }
        let nb = src.len() / QK;
        let (mut a, mut b) = (vec![0u8; nb * TQ4_BYTES], vec![0u8; nb * TQ4_BYTES]);
        quantize_tq4_1s(&src, &mut a);
        quantize_tq4_1s_ref(&src, &mut b);
        for k in 0..nb {
            let s = k * TQ4_BYTES..(k + 1) * TQ4_BYTES;
            assert_eq!(a[s.clone()], b[s], "block {k}");
        }
        let (mut da, mut db) = (vec![0f32; nb * QK], vec![0f32; nb * QK]);
        dequantize_tq4_1s(&a, &mut da);
        dequantize_tq4_1s_ref(&a, &mut db);
        for (j, (x, y)) in da.iter().zip(&db).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "value {j}"
            );
        }
    }

    #[test]
    fn fast_tq4_dequant_matches_ref_on_random_bytes() {
        let mut r = Rng(4);
        let mut bytes = vec![0u8; 20_000 * TQ4_BYTES];
        for b in bytes.iter_mut() {
            *b = r.next() as u8;
        }
        let (mut da, mut db) = (vec![0f32; 20_000 * QK], vec![0f32; 20_000 * QK]);
        dequantize_tq4_1s(&bytes, &mut da);
        dequantize_tq4_1s_ref(&bytes, &mut db);
        for (j, (x, y)) in da.iter().zip(&db).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "value {j}"
            );
        }
    }

    /// `index = first i with v < T[i]`: a value exactly on a threshold goes to the upper index.
    #[test]
    fn value_on_threshold_goes_up() {
        for (i, &t) in T4.iter().enumerate() {
            assert_eq!(tq_index(t, &T4), i + 1);
            assert_eq!(idx4(t), i + 1);
            assert_eq!(tq_index(next_down(t), &T4), i);
        }
        for (i, &t) in T3.iter().enumerate() {
            assert_eq!(tq_index(t, &T3), i + 1);
            assert_eq!(tq_index(next_down(t), &T3), i);
        }
        // End to end: 0 lies on T4[7], so an all-zero block is all index 8 (0x88), both ±0;
        // a `<=` quantizer would write 0x77.
        for z in [0.0f32, -0.0] {
            let x = [z; QK];
            let got = q4(&x);
            assert_eq!(got[..4], [0, 0, 0, 0]);
            assert!(got[4..].iter().all(|&b| b == 0x88), "{got:02x?}");
            assert_ne!(pack4(&model(&x, &C4, &T4, 6, Cmp::Le)), got);
            // TQ3: index 4 everywhere -> each 3-byte group is 24 49 92.
            assert_eq!(
                q3(&x)[4..],
                [0x24, 0x49, 0x92, 0x24, 0x49, 0x92, 0x24, 0x49, 0x92, 0x24, 0x49, 0x92]
            );
        }
    }

    /// End to end for TQ3, where 0 is not a threshold: find a block in which some element's final
    /// ratio lies exactly on a threshold and check it took the upper index (and that `<=` differs).
    #[test]
    fn tq3_value_exactly_on_threshold_end_to_end() {
        let (x, j, i) = scan_for_ratio(&C3, &T3, |v, t| v == t, 11).expect("no block found");
        let q = quantize_block_ref(&x, &C3, &T3);
        assert_eq!(final_ratio(&x, &q, j), T3[i]);
        assert_eq!(q.idx[j] as usize, i + 1);
        assert_ne!(pack3(&model(&x, &C3, &T3, 6, Cmp::Le)), q3(&x));
    }

    /// TQ3's threshold -0.008701 is asymmetric: values in [-0.008701, 0) pick the *positive*
    /// centroid (index 4, +0.230106).
    #[test]
    fn tq3_asymmetric_threshold() {
        let t = T3[3];
        assert_eq!(t, -0.008701f32);
        for v in [t, next_up(t), -0.005, -1e-6, -f32::from_bits(1), -0.0, 0.0] {
            assert_eq!(tq_index(v, &T3), 4, "v = {v:e}");
        }
        assert_eq!(tq_index(next_down(t), &T3), 3);
        assert!(C3[4] > 0.0 && C3[3] < 0.0);
        // End to end: a random block with an element whose final ratio is in [T3[3], 0).
        let mut r = Rng(5);
        let mut found = 0;
        for _ in 0..2000 {
            let x = r.block(1.0);
            let q = quantize_block_ref(&x, &C3, &T3);
            for j in 0..QK {
                let v = final_ratio(&x, &q, j);
                if v >= t && v < 0.0 {
                    assert_eq!(q.idx[j], 4, "element {j}, ratio {v:e}");
                    assert_eq!(unpack_tq3(&q3(&x))[j], 4);
                    found += 1;
                }
            }
        }
        assert!(found > 10, "only {found} elements in [-0.008701, 0)");
    }

    /// Build a block whose final rotated ratio for some element is placed where `pred(v, T[i])`
    /// holds, by scanning that element's rotated value ulp by ulp around `T[i] * d`.
    fn scan_for_ratio(
        c: &[f32],
        t: &[f32],
        pred: impl Fn(f32, f32) -> bool,
        seed: u64,
    ) -> Option<([f32; QK], usize, usize)> {
        let mut r = Rng(seed);
        for attempt in 0..200 {
            let i = attempt % t.len();
            let j = (attempt * 7) % QK;
            let mut rot = r.block(1.0);
            let mut base = rot[j];
            for _ in 0..4 {
                let mut x = rot;
                inverse_rotate(&mut x);
                let q = quantize_block_ref(&x, c, t);
                base = t[i] * q.d[j / 16];
                rot[j] = base;
            }
            let mut v = base;
            for _ in 0..64 {
                v = next_down(v);
            }
            for _ in 0..128 {
                rot[j] = v;
                let mut x = rot;
                inverse_rotate(&mut x);
                let q = quantize_block_ref(&x, c, t);
                if pred(final_ratio(&x, &q, j), t[i]) {
                    return Some((x, j, i));
                }
                v = next_up(v);
            }
        }
        None
    }

    /// The comparison points are the hard-coded tables, which differ from the f32 midpoints of
    /// the codebooks by 1 to 17 ulps (except T4[7] = 0 and T3[4], T3[6]).
    #[test]
    fn thresholds_are_hardcoded_not_midpoints() {
        for (c, t) in [(&C4[..], &T4[..]), (&C3[..], &T3[..])] {
            let mid = midpoints(c);
            let mut differ = 0;
            for i in 0..t.len() {
                if t[i] == mid[i] {
                    continue;
                }
                differ += 1;
                // A value between the two (inclusive where the rules disagree).
                let v = if t[i] < mid[i] { t[i] } else { mid[i] };
                assert_ne!(tq_index(v, t), tq_index(v, &mid), "i = {i}");
                assert_eq!(tq_index(v, t), if t[i] < mid[i] { i + 1 } else { i });
            }
            assert!(differ >= 5);
        }
        // End to end: a TQ4 block with a final ratio in the gap between T4[i] and the midpoint.
        let mid = midpoints(&C4);
        let in_gap = |v: f32, ti: f32| {
            let i = T4.iter().position(|&x| x == ti).unwrap();
            let (lo, hi) = if T4[i] < mid[i] {
                (T4[i], mid[i])
            } else {
                (mid[i], T4[i])
            };
            lo != hi && v >= lo && v < hi
        };
        let (x, j, i) = scan_for_ratio(&C4, &T4, in_gap, 12).expect("no block found");
        let q = quantize_block_ref(&x, &C4, &T4);
        let expect = if T4[i] < mid[i] { i + 1 } else { i };
        assert_eq!(q.idx[j] as usize, expect);
        assert_eq!(q4(&x), pack4(&q));
        assert_ne!(pack4(&model(&x, &C4, &mid, 6, Cmp::Lt)), q4(&x));
    }

    /// Search random blocks until one where 5, 6 and 7 refinement rounds give different bytes
    /// from 6 (the fork's count); return it.
    fn find_rounds_block(c: &[f32], t: &[f32], seed: u64) -> Option<[f32; QK]> {
        let mut r = Rng(seed);
        for _ in 0..200_000 {
            let x = varied_block(&mut r);
            let q6 = model(&x, c, t, 6, Cmp::Lt);
            let q5 = model(&x, c, t, 5, Cmp::Lt);
            let q7 = model(&x, c, t, 7, Cmp::Lt);
            let bytes = |q: &BlockQ| {
                let mut o = [0u8; TQ4_BYTES];
                if c.len() == 16 {
                    pack_tq4(q, &mut o)
                } else {
                    pack_tq3(q, &mut o[..TQ3_BYTES])
                }
                o
            };
            if bytes(&q6) != bytes(&q5) && bytes(&q6) != bytes(&q7) {
                return Some(x);
            }
        }
        None
    }

    #[test]
    fn six_refinement_rounds_tq4() {
        let x = find_rounds_block(&C4, &T4, 6).expect("no block where 5/6/7 rounds differ");
        let got = q4(&x);
        assert_eq!(got, pack4(&model(&x, &C4, &T4, 6, Cmp::Lt)));
        assert_ne!(got, pack4(&model(&x, &C4, &T4, 5, Cmp::Lt)));
        assert_ne!(got, pack4(&model(&x, &C4, &T4, 7, Cmp::Lt)));
        let mut b = [0u8; TQ4_BYTES];
        quantize_tq4_1s_ref(&x, &mut b);
        assert_eq!(got, b);
    }

    #[test]
    fn six_refinement_rounds_tq3() {
        let x = find_rounds_block(&C3, &T3, 7).expect("no block where 5/6/7 rounds differ");
        let got = q3(&x);
        assert_eq!(got, pack3(&model(&x, &C3, &T3, 6, Cmp::Lt)));
        assert_ne!(got, pack3(&model(&x, &C3, &T3, 5, Cmp::Lt)));
        assert_ne!(got, pack3(&model(&x, &C3, &T3, 7, Cmp::Lt)));
    }

    /// Negative scales stick, and the f16 rounding happens after the final indices.
    #[test]
    fn scale_edge_behaviour() {
        // Sum of squares overflows f32 -> inv = 0 -> all index 8 -> refined scale may be negative.
        let x: [f32; QK] = std::array::from_fn(|i| if i % 2 == 0 { 1e20 } else { -3e19 });
        let q = quantize_block_ref(&x, &C4, &T4);
        assert_eq!(q4(&x), pack4(&q));
        // f16 overflow to inf.
        let x = [6e4f32; QK];
        let b = q4(&x);
        let d0 = u16::from_le_bytes([b[0], b[1]]);
        assert_eq!(d0 & 0x7fff, 0x7c00);
    }

    /// A block for the cross-block equivalence tests: one of many shapes, at a per-block scale
    /// log-uniform in 1e-30..1e30 (so some sums of squares overflow and some underflow).
    fn mixed_block(r: &mut Rng) -> [f32; QK] {
        let scale = 10f64.powf(-30.0 + 60.0 * r.uniform());
        let mut x = r.block(scale);
        match r.next() % 12 {
            0 => {
                // Heavy-tailed (Student-t-like: Gaussian over sqrt of a uniform).
                for v in x.iter_mut() {
                    *v = (r.gauss() * scale / r.uniform().sqrt()) as f32;
                }
            }
            1 => x = [0.0; QK],
            2 => {
                // Subnormals and the smallest normals.
                for v in x.iter_mut() {
                    *v = (r.gauss() * 1e-39 * (r.next() % 300) as f64) as f32;
                }
            }
            3 => x[(r.next() % 2) as usize * 16..][..16].fill(0.0),
            4 => x = [(r.gauss() * scale) as f32; QK],
            5 => {
                // Sparse: a few large values in zeros.
                let mut y = [0f32; QK];
                for _ in 0..(1 + r.next() % 4) {
                    y[(r.next() % 32) as usize] = (r.gauss() * scale) as f32;
                }
                x = y;
            }
            6 => {
                // Per-element scales over 60 decades.
                for v in x.iter_mut() {
                    *v = (r.gauss() * 10f64.powf(-30.0 + 60.0 * r.uniform())) as f32;
                }
            }
            7 => x = std::array::from_fn(|i| ((i as f32) - 15.5) * scale as f32),
            8 => {
                for v in x.iter_mut() {
                    *v = *v * 0.0 + (-0.0f32).copysign(*v);
                }
            }
            9 => x = varied_block(r),
            10 => {
                // Repeated values and sign flips.
                for i in 0..QK {
                    if r.next() % 3 == 0 {
                        x[i] = -x[(i * 7) % QK];
                    }
                }
            }
            _ => {}
        }
        x
    }

    type QFn = fn(&[f32], &mut [u8]);

    /// The quantizers checked against the references: (name, tq4, tq3).
    fn fast_paths() -> Vec<(&'static str, QFn, QFn)> {
        fn a4(s: &[f32], o: &mut [u8]) {
            quantize_tq4_1s_avx2(s, o).unwrap()
        }
        fn a3(s: &[f32], o: &mut [u8]) {
            quantize_tq3_1s_avx2(s, o).unwrap()
        }
        let mut v: Vec<(&'static str, QFn, QFn)> = vec![
            ("registry", quantize_tq4_1s, quantize_tq3_1s),
            (
                "portable",
                quantize_tq4_1s_portable,
                quantize_tq3_1s_portable,
            ),
        ];
        if quantize_tq4_1s_avx2(&[], &mut []).is_some() {
            v.push(("avx2", a4, a3));
        } else {
            eprintln!("no AVX2 on this CPU: the AVX2 kernel is not tested");
        }
        v
    }

    fn assert_same_blocks(name: &str, got: &[u8], want: &[u8], bytes: usize, src: &[f32]) {
        assert_eq!(got.len(), want.len());
        for k in 0..want.len() / bytes {
            let s = k * bytes..(k + 1) * bytes;
            assert_eq!(
                got[s.clone()],
                want[s],
                "{name}: block {k}, input {:?}",
                &src[k * QK..(k + 1) * QK]
            );
        }
    }

    /// Every fast quantizer equals the reference on 200 000 mixed blocks per type (25 000 groups
    /// of 8 with unrelated blocks side by side, so lanes converge at different rounds).
    #[test]
    fn lanes_match_ref_mixed_blocks() {
        let mut r = Rng(21);
        let nb = 200_000;
        let mut src = Vec::with_capacity(nb * QK);
        for _ in 0..nb {
            src.extend_from_slice(&mixed_block(&mut r));
        }
        let mut want4 = vec![0u8; nb * TQ4_BYTES];
        quantize_tq4_1s_ref(&src, &mut want4);
        let mut want3 = vec![0u8; nb * TQ3_BYTES];
        quantize_tq3_1s_ref(&src, &mut want3);
        for (name, f4, f3) in fast_paths() {
            let mut got = vec![0u8; nb * TQ4_BYTES];
            f4(&src, &mut got);
            assert_same_blocks(name, &got, &want4, TQ4_BYTES, &src);
            let mut got = vec![0u8; nb * TQ3_BYTES];
            f3(&src, &mut got);
            assert_same_blocks(name, &got, &want3, TQ3_BYTES, &src);
        }
        let mut got = vec![0u8; nb * TQ4_BYTES];
        quantize_tq4_1s_scalar(&src, &mut got);
        assert_same_blocks("scalar", &got, &want4, TQ4_BYTES, &src);
    }

    /// Blocks with non-finite values (inf, -inf, NaN, f32::MAX): bytes equal the reference's,
    /// up to the sign and payload of NaN scales.
    #[test]
    fn lanes_match_ref_non_finite() {
        let mut r = Rng(22);
        let specials = [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN,
        ];
        let nb = 4000;
        let mut src = Vec::with_capacity(nb * QK);
        for _ in 0..nb {
            let mut x = mixed_block(&mut r);
            for _ in 0..(1 + r.next() % 3) {
                x[(r.next() % 32) as usize] = specials[(r.next() % 5) as usize];
            }
            src.extend_from_slice(&x);
        }
        let mut want4 = vec![0u8; nb * TQ4_BYTES];
        quantize_tq4_1s_ref(&src, &mut want4);
        let mut want3 = vec![0u8; nb * TQ3_BYTES];
        quantize_tq3_1s_ref(&src, &mut want3);
        // A NaN scale's sign and payload are not defined by the reference (LLVM may rewrite
        // `x * -1.0` as a negation in one path and not in another; x86 makes the default NaN
        // negative): canonicalize NaN f16 scales, compare everything else exactly.
        let canon = |v: &mut [u8], bytes: usize| {
            let mut nan = 0;
            for b in v.chunks_exact_mut(bytes) {
                for h in 0..2 {
                    let s = u16::from_le_bytes([b[2 * h], b[2 * h + 1]]);
                    if s & 0x7c00 == 0x7c00 && s & 0x03ff != 0 {
                        b[2 * h..2 * h + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
                        nan += 1;
                    }
                }
            }
            nan
        };
        assert!(canon(&mut want4, TQ4_BYTES) > 100);
        assert!(canon(&mut want3, TQ3_BYTES) > 100);
        for (name, f4, f3) in fast_paths() {
            let mut got = vec![0u8; nb * TQ4_BYTES];
            f4(&src, &mut got);
            canon(&mut got, TQ4_BYTES);
            assert_same_blocks(name, &got, &want4, TQ4_BYTES, &src);
            let mut got = vec![0u8; nb * TQ3_BYTES];
            f3(&src, &mut got);
            canon(&mut got, TQ3_BYTES);
            assert_same_blocks(name, &got, &want3, TQ3_BYTES, &src);
        }
    }

    /// Rows of 1..=25 blocks (partial last groups), and outputs shorter than the input: the
    /// block count is `min(src / 32, out / bytes)` and nothing past it is written.
    #[test]
    fn lanes_tails_and_short_outputs() {
        let mut r = Rng(23);
        for nb in 1..=25usize {
            let src: Vec<f32> = (0..nb).flat_map(|_| mixed_block(&mut r)).collect();
            for (bytes, reff) in [
                (TQ4_BYTES, quantize_tq4_1s_ref as QFn),
                (TQ3_BYTES, quantize_tq3_1s_ref),
            ] {
                let mut want = vec![0u8; nb * bytes];
                reff(&src, &mut want);
                for (name, f4, f3) in fast_paths() {
                    let f = if bytes == TQ4_BYTES { f4 } else { f3 };
                    // Exact size, with 7 extra input values (not a whole block).
                    let mut src7 = src.clone();
                    src7.extend([1.0; 7]);
                    let mut got = vec![0xAAu8; nb * bytes];
                    f(&src7, &mut got);
                    assert_eq!(got, want, "{name}: {nb} blocks");
                    // Output room for fewer blocks (plus a partial block of slack).
                    let keep = nb / 2;
                    let mut got = vec![0xAAu8; keep * bytes + bytes - 1];
                    f(&src, &mut got);
                    assert_eq!(
                        got[..keep * bytes],
                        want[..keep * bytes],
                        "{name}: {nb}/{keep}"
                    );
                    assert!(got[keep * bytes..].iter().all(|&b| b == 0xAA), "{name}");
                    // Output room for more blocks than the input has.
                    let mut got = vec![0xAAu8; (nb + 3) * bytes];
                    f(&src, &mut got);
                    assert_eq!(got[..nb * bytes], want[..], "{name}: {nb} + 3");
                    assert!(got[nb * bytes..].iter().all(|&b| b == 0xAA), "{name}");
                }
            }
        }
    }

    /// The lane-wise index search equals `tq_index` around every threshold and on specials.
    #[test]
    fn lane_lookup_equals_linear_scan() {
        let mut vals = vec![
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            0.0,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(1),
        ];
        for &t in T4.iter().chain(T3.iter()) {
            vals.extend([t, next_up(t), next_down(t), -t]);
        }
        let mut r = Rng(24);
        vals.extend((0..4000).map(|_| (r.gauss() * 1.5) as f32));
        while vals.len() % LANES != 0 {
            vals.push(0.5);
        }
        for ch in vals.chunks_exact(LANES) {
            let v: [f32; LANES] = ch.try_into().unwrap();
            let check = |c4: [f32; LANES], i4: [i32; LANES], c3: [f32; LANES], i3: [i32; LANES]| {
                for l in 0..LANES {
                    let (k4, k3) = (tq_index(v[l], &T4), tq_index(v[l], &T3));
                    assert_eq!(i4[l] as usize, k4, "v = {:e}", v[l]);
                    assert_eq!(c4[l], C4[k4], "v = {:e}", v[l]);
                    assert_eq!(i3[l] as usize, k3, "v = {:e}", v[l]);
                    assert_eq!(c3[l], C3[k3], "v = {:e}", v[l]);
                }
            };
            unsafe {
                let p = Portable(v);
                let ((c4, i4), (c3, i3)) = (p.lookup4(), p.lookup3());
                check(c4.0, i4, c3.0, i3);
            }
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                #[target_feature(enable = "avx2")]
                unsafe fn run(
                    v: &[f32; LANES],
                ) -> ([f32; LANES], [i32; LANES], [f32; LANES], [i32; LANES]) {
                    let a = avx2::Avx2::load(v);
                    let ((c4, i4), (c3, i3)) = (a.lookup4(), a.lookup3());
                    let mut o = ([0f32; LANES], [0i32; LANES], [0f32; LANES], [0i32; LANES]);
                    c4.store(&mut o.0);
                    avx2::Avx2::store_idx(i4, &mut o.1);
                    c3.store(&mut o.2);
                    avx2::Avx2::store_idx(i3, &mut o.3);
                    o
                }
                let (c4, i4, c3, i3) = unsafe { run(&v) };
                check(c4, i4, c3, i3);
            }
        }
    }

    #[test]
    fn fast_tq3_dequant_matches_ref_on_random_bytes() {
        let mut r = Rng(25);
        let n = 20_000;
        let mut bytes = vec![0u8; n * TQ3_BYTES];
        for b in bytes.iter_mut() {
            *b = r.next() as u8;
        }
        let (mut da, mut db) = (vec![0f32; n * QK], vec![0f32; n * QK]);
        dequantize_tq3_1s(&bytes, &mut da);
        dequantize_tq3_1s_ref(&bytes, &mut db);
        for (j, (x, y)) in da.iter().zip(&db).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "value {j}"
            );
        }
    }

    /// Ad-hoc throughput, best of 5 runs (run:
    /// `cargo test --release --lib types::tq::tests::throughput -- --ignored --nocapture`;
    /// `cargo bench --bench tq` is the fuller benchmark).
    #[test]
    #[ignore]
    fn throughput() {
        use std::time::Instant;
        let mut r = Rng(9);
        let nb = 50_000;
        let n = (nb * QK) as f64;
        let src: Vec<f32> = (0..nb * QK).map(|_| r.gauss() as f32).collect();
        let mut q = vec![0u8; nb * TQ4_BYTES];
        let mut o = vec![0f32; nb * QK];
        let best = |f: &mut dyn FnMut()| {
            (0..5)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let s = best(&mut || quantize_tq4_1s_ref(&src, &mut q));
        eprintln!("tq4_1s quantize ref:    {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || quantize_tq4_1s(&src, &mut q));
        eprintln!("tq4_1s quantize fast:   {:.1} M elements/s", n / s / 1e6);
        let mut q3b = vec![0u8; nb * TQ3_BYTES];
        let s = best(&mut || quantize_tq3_1s_ref(&src, &mut q3b));
        eprintln!("tq3_1s quantize ref:    {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || quantize_tq3_1s(&src, &mut q3b));
        eprintln!("tq3_1s quantize fast:   {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || dequantize_tq4_1s_ref(&q, &mut o));
        eprintln!("tq4_1s dequantize ref:  {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || dequantize_tq4_1s(&q, &mut o));
        eprintln!("tq4_1s dequantize fast: {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || dequantize_tq3_1s_ref(&q3b, &mut o));
        eprintln!("tq3_1s dequantize ref:  {:.1} M elements/s", n / s / 1e6);
        let s = best(&mut || dequantize_tq3_1s(&q3b, &mut o));
        eprintln!("tq3_1s dequantize fast: {:.1} M elements/s", n / s / 1e6);
    }
}
