//! turbo2 / turbo3 / turbo4 KV-cache blocks (FORMATS.md §3), 2026-05-04 snapshot of the fork:
//! 128 values per group, L2 norm, randomized 128-point Hadamard rotation, nearest centroid of a
//! b-bit codebook for N(0, 1/128), corrected norm `f16(g / ||c||)`.
//!
//! Layouts: turbo2 = f16 norm | qs[32] (34 B); turbo3 = f16 norm | qs[32] | signs[16] (50 B);
//! turbo4 = f16 norm | f16 rnorm (always 0) | qs[64] (68 B, the May-2026 layout).
//! Dequantized values stay in the rotated domain: `norm * C[idx]`.

use crate::error::{Error, Result};
use crate::math::hadamard::fwht_scalar;
use crate::math::lloyd_max::{lloyd_max_bits, Dist};
use crate::math::signs::{TURBO_S1, TURBO_S2};
use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};
use crate::types::TensorType;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Values per group.
pub const QK_TURBO: usize = 128;
pub const TURBO2_BYTES: usize = 34;
pub const TURBO3_BYTES: usize = 50;
pub const TURBO4_BYTES: usize = 68;

// The registry's sizes are the May-2026 layouts' arithmetic.
const _: () = {
    let may = TurboLayout::MAY;
    assert!(may[0].block_bytes() == TURBO2_BYTES && may[0].group == QK_TURBO);
    assert!(may[1].block_bytes() == TURBO3_BYTES && may[1].group == QK_TURBO);
    assert!(may[2].block_bytes() == TURBO4_BYTES && may[2].group == QK_TURBO);
};

/// 2-bit codebook (values for N(0, 1/128)).
pub const CB2: [f32; 4] = [-0.133462, -0.039994, 0.039994, 0.133462];
/// 3-bit codebook.
pub const CB3: [f32; 8] = [
    -0.190685, -0.117832, -0.065717, -0.021460, 0.021460, 0.065717, 0.117832, 0.190685,
];
/// 4-bit codebook of the May-2026 snapshot (mis-scaled, see FORMATS.md §3; kept for
/// byte-exactness with that snapshot).
pub const CB4: [f32; 16] = [
    -0.173926, -0.117195, -0.089527, -0.068756, -0.051262, -0.035597, -0.020989, -0.006938,
    0.006938, 0.020989, 0.035597, 0.051262, 0.068756, 0.089527, 0.117195, 0.173926,
];

const fn signs_f32(s: &[i8; 128]) -> [f32; 128] {
    let mut o = [0f32; 128];
    let mut i = 0;
    while i < 128 {
        o[i] = s[i] as f32;
        i += 1;
    }
    o
}
/// The sign vectors as f32 (FORMATS.md §3).
pub const S1: [f32; 128] = signs_f32(&TURBO_S1);
pub const S2: [f32; 128] = signs_f32(&TURBO_S2);

/// Midpoints between neighbouring centroids, `(c[i] + c[i+1]) / 2` in f32 (at most 16 levels).
fn midpoints(c: &[f32]) -> [f32; 16] {
    debug_assert!(c.len() <= 16);
    let mut m = [f32::INFINITY; 16];
    for (o, w) in m.iter_mut().zip(c.windows(2)) {
        *o = (w[0] + w[1]) * 0.5;
    }
    m
}

/// Index of the nearest centroid: the first `i` with `y < mid[i]`, else the last.
#[inline]
fn nearest(y: f32, mid: &[f32]) -> usize {
    for (i, &m) in mid.iter().enumerate() {
        if y < m {
            return i;
        }
    }
    mid.len()
}

/// Forward rotation of one normalized group: `y = s2 * ((1/sqrt(128)) * H * (s1 * u))`.
pub fn rotate_forward(y: &mut [f32; QK_TURBO]) {
    rotate_forward_n(y);
}

/// The same rotation for a group of 64 or 128 values (a 64-value group uses the first 64 signs
/// and `1/8`, FORMATS.md §3).
pub fn rotate_forward_n(y: &mut [f32]) {
    let k = crate::math::hadamard::inv_sqrt_len(y.len());
    for (v, s) in y.iter_mut().zip(S1.iter()) {
        *v *= *s;
    }
    fwht_scalar(y);
    for (v, s) in y.iter_mut().zip(S2.iter()) {
        *v = *v * k * *s;
    }
}

/// Quantize one group of 64 or 128 values against the ascending codebook `c`: returns the f32
/// corrected norm `g / ||c[idx]||` and the indices (`idx[..x.len()]`). The engines' encoder, and
/// the KV simulator's with any codebook (`model::kv`).
pub fn quantize_group(x: &[f32], c: &[f32]) -> (f32, [u8; QK_TURBO]) {
    let n = x.len();
    debug_assert!(n == 64 || n == QK_TURBO);
    let mut s = 0f32;
    for v in x {
        s += v * v;
    }
    let g = s.sqrt();
    let mut buf = [0f32; QK_TURBO];
    let y = &mut buf[..n];
    if g > 1e-10 {
        let inv = 1.0 / g;
        for (o, v) in y.iter_mut().zip(x) {
            *o = v * inv;
        }
    }
    rotate_forward_n(y);
    let mid = midpoints(c);
    let mid = &mid[..c.len() - 1];
    let mut idx = [0u8; QK_TURBO];
    let mut rs = 0f32;
    for (j, &v) in y.iter().enumerate() {
        let i = nearest(v, mid);
        idx[j] = i as u8;
        rs += c[i] * c[i];
    }
    let rn = rs.sqrt();
    let norm = if rn > 1e-10 { g / rn } else { g };
    (norm, idx)
}

fn put_norm(out: &mut [u8], v: f32) {
    out[0..2].copy_from_slice(&f32_to_f16_bits(v).to_le_bytes());
}

fn get_norm(b: &[u8]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

pub fn quantize_turbo2(src: &[f32], out: &mut [u8]) {
    for (x, o) in src
        .chunks_exact(QK_TURBO)
        .zip(out.chunks_exact_mut(TURBO2_BYTES))
    {
        let (norm, idx) = quantize_group(x, &CB2);
        put_norm(o, norm);
        for k in 0..32 {
            let i = &idx[4 * k..4 * k + 4];
            o[2 + k] = i[0] | i[1] << 2 | i[2] << 4 | i[3] << 6;
        }
    }
}

pub fn dequantize_turbo2(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks
        .chunks_exact(TURBO2_BYTES)
        .zip(out.chunks_exact_mut(QK_TURBO))
    {
        let norm = get_norm(b);
        for (j, v) in o.iter_mut().enumerate() {
            let i = (b[2 + j / 4] >> (2 * (j % 4))) & 3;
            *v = CB2[i as usize] * norm;
        }
    }
}

pub fn quantize_turbo3(src: &[f32], out: &mut [u8]) {
    for (x, o) in src
        .chunks_exact(QK_TURBO)
        .zip(out.chunks_exact_mut(TURBO3_BYTES))
    {
        let (norm, idx) = quantize_group(x, &CB3);
        put_norm(o, norm);
        o[2..].fill(0);
        for (j, &i) in idx.iter().enumerate() {
            o[2 + j / 4] |= (i & 3) << (2 * (j % 4));
            o[34 + j / 8] |= ((i >> 2) & 1) << (j % 8);
        }
    }
}

pub fn dequantize_turbo3(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks
        .chunks_exact(TURBO3_BYTES)
        .zip(out.chunks_exact_mut(QK_TURBO))
    {
        let norm = get_norm(b);
        for (j, v) in o.iter_mut().enumerate() {
            let lo = (b[2 + j / 4] >> (2 * (j % 4))) & 3;
            let hi = (b[34 + j / 8] >> (j % 8)) & 1;
            *v = CB3[(lo | hi << 2) as usize] * norm;
        }
    }
}

pub fn quantize_turbo4(src: &[f32], out: &mut [u8]) {
    for (x, o) in src
        .chunks_exact(QK_TURBO)
        .zip(out.chunks_exact_mut(TURBO4_BYTES))
    {
        let (norm, idx) = quantize_group(x, &CB4);
        put_norm(o, norm);
        o[2] = 0;
        o[3] = 0;
        for k in 0..64 {
            o[4 + k] = (idx[2 * k] & 15) | (idx[2 * k + 1] & 15) << 4;
        }
    }
}

pub fn dequantize_turbo4(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks
        .chunks_exact(TURBO4_BYTES)
        .zip(out.chunks_exact_mut(QK_TURBO))
    {
        let norm = get_norm(b);
        for (j, v) in o.iter_mut().enumerate() {
            let i = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
            *v = CB4[i as usize] * norm;
        }
    }
}

/// A turbo block layout: the index width, the group size (128, or 64 for 64-wide heads) and the
/// header bytes before the packed indices (2: f16 norm; 4: the May-2026 turbo4 f16 norm + unused
/// f16). The registry's types are [`TurboLayout::MAY`] layouts; `tq eval`/`tq kv` also simulate
/// the June-2026 turbo4 layout (`f16 norm | qs[g/2]`) and 64-value groups (FORMATS.md §3).
/// Packing is the same at every size: 2-bit/4-bit indices low bits first in `qs[g/4]`/`qs[g/2]`,
/// turbo3's third bit in `signs[g/8]` after `qs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurboLayout {
    /// Index bits: 2, 3 or 4.
    pub bits: u32,
    /// Values per group: 64 or 128.
    pub group: usize,
    /// Bytes before `qs`: 2, or 4 for the May-2026 turbo4 block.
    pub header: usize,
}

impl TurboLayout {
    /// The May-2026 layouts of the registry's turbo2/3/4 (34 / 50 / 68 bytes per 128 values).
    pub const MAY: [TurboLayout; 3] = [
        TurboLayout::new(2, 128, 2),
        TurboLayout::new(3, 128, 2),
        TurboLayout::new(4, 128, 4),
    ];

    pub const fn new(bits: u32, group: usize, header: usize) -> TurboLayout {
        TurboLayout {
            bits,
            group,
            header,
        }
    }

    /// Whether the layout is one the kernels and [`quantize_blocks`] handle.
    pub fn is_valid(&self) -> bool {
        matches!(self.bits, 2..=4)
            && matches!(self.group, 64 | 128)
            && (self.header == 2 || (self.header == 4 && self.bits == 4))
    }

    /// Offset of turbo3's `signs` (the byte after `qs`).
    pub fn signs_offset(&self) -> usize {
        self.header + self.group / 4
    }

    pub const fn block_bytes(&self) -> usize {
        self.header + self.group * self.bits as usize / 8
    }

    /// Index `j` of a block.
    #[inline]
    pub fn index(&self, b: &[u8], j: usize) -> usize {
        let h = self.header;
        (match self.bits {
            2 => (b[h + j / 4] >> (2 * (j % 4))) & 3,
            3 => {
                ((b[h + j / 4] >> (2 * (j % 4))) & 3)
                    | (((b[self.signs_offset() + j / 8] >> (j % 8)) & 1) << 2)
            }
            _ => (b[h + j / 2] >> (4 * (j % 2))) & 15,
        }) as usize
    }
}

/// Quantize whole groups of `src` into blocks of `layout` with the ascending codebook `cb`
/// (`2^bits` entries): [`quantize_group`], the f16 corrected norm, the layout's packing (header
/// padding zero). For the [`TurboLayout::MAY`] layouts and CB2/CB3/CB4 this writes the registry's
/// bytes. Trailing values short of a group, and groups beyond `out`, are left alone.
pub fn quantize_blocks(layout: &TurboLayout, cb: &[f32], src: &[f32], out: &mut [u8]) {
    let g = layout.group;
    let h = layout.header;
    for (x, o) in src
        .chunks_exact(g)
        .zip(out.chunks_exact_mut(layout.block_bytes()))
    {
        let (norm, idx) = quantize_group(x, cb);
        o.fill(0);
        put_norm(o, norm);
        for (j, &i) in idx[..g].iter().enumerate() {
            match layout.bits {
                2 => o[h + j / 4] |= (i & 3) << (2 * (j % 4)),
                3 => {
                    o[h + j / 4] |= (i & 3) << (2 * (j % 4));
                    o[layout.signs_offset() + j / 8] |= ((i >> 2) & 1) << (j % 8);
                }
                _ => o[h + j / 2] |= (i & 15) << (4 * (j % 2)),
            }
        }
    }
}

/// Dequantize whole blocks of `layout` (rotated domain): `cb[idx] * f16(norm)`, the CPU
/// reference of the GPU turbo kernels for every layout and codebook. An index beyond `cb` (a
/// codebook shorter than `2^bits`) decodes to NaN.
pub fn dequantize_blocks(layout: &TurboLayout, cb: &[f32], blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks
        .chunks_exact(layout.block_bytes())
        .zip(out.chunks_exact_mut(layout.group))
    {
        let norm = get_norm(b);
        for (j, v) in o.iter_mut().enumerate() {
            *v = cb.get(layout.index(b, j)).map_or(f32::NAN, |c| c * norm);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64 + Box–Muller (test inputs only).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn uniform(&mut self) -> f64 {
            ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
        }
        fn gauss(&mut self) -> f32 {
            let (u1, u2) = (self.uniform(), self.uniform());
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        }
    }

    type Q = fn(&[f32], &mut [u8]);
    type D = fn(&[u8], &mut [f32]);
    const KINDS: [(Q, D, usize, &[f32]); 3] = [
        (quantize_turbo2, dequantize_turbo2, TURBO2_BYTES, &CB2),
        (quantize_turbo3, dequantize_turbo3, TURBO3_BYTES, &CB3),
        (quantize_turbo4, dequantize_turbo4, TURBO4_BYTES, &CB4),
    ];

    #[test]
    fn codebooks_sorted_symmetric() {
        for c in [&CB2[..], &CB3, &CB4] {
            assert!(c.windows(2).all(|w| w[0] < w[1]));
            assert!(c.iter().zip(c.iter().rev()).all(|(a, b)| *a == -*b));
        }
    }

    #[test]
    fn signs_are_plus_minus_one() {
        assert!(S1.iter().chain(S2.iter()).all(|&s| s == 1.0 || s == -1.0));
    }

    /// A value on a midpoint goes to the upper centroid; in particular ±0 (the centre midpoint)
    /// picks the smallest *positive* centroid.
    #[test]
    fn midpoint_ties_go_up() {
        let mid = midpoints(&CB3);
        for (i, &m) in mid[..7].iter().enumerate() {
            assert_eq!(nearest(m, &mid[..7]), i + 1);
        }
        assert_eq!(nearest(0.0, &midpoints(&CB2)[..3]), 2);
        assert_eq!(nearest(-0.0, &midpoints(&CB2)[..3]), 2);
        assert_eq!(nearest(-0.0, &midpoints(&CB4)[..15]), 8);
    }

    /// All-zero group: norm +0, centre indices, dequantizes to +0 everywhere.
    #[test]
    fn zero_group() {
        for (q, d, bytes, _) in KINDS {
            let x = [0f32; QK_TURBO];
            let mut b = vec![0u8; bytes];
            q(&x, &mut b);
            assert_eq!(b[..2], [0, 0]);
            let mut o = [1f32; QK_TURBO];
            d(&b, &mut o);
            assert!(o.iter().all(|v| v.to_bits() == 0), "{o:?}");
        }
    }

    /// Dequantized values are `CB[idx] * f16(norm)`, and the corrected norm makes the group's
    /// L2 norm equal to the input's (up to f16 rounding).
    #[test]
    fn dequant_is_centroid_times_norm_and_norm_is_corrected() {
        let mut r = Rng(1);
        for (q, d, bytes, cb) in KINDS {
            for _ in 0..200 {
                let sigma = 10f32.powf((r.uniform() * 6.0 - 3.0) as f32);
                let x: Vec<f32> = (0..QK_TURBO).map(|_| r.gauss() * sigma).collect();
                let mut b = vec![0u8; bytes];
                q(&x, &mut b);
                let norm = get_norm(&b);
                let mut o = [0f32; QK_TURBO];
                d(&b, &mut o);
                for v in o {
                    assert!(cb.iter().any(|c| (c * norm).to_bits() == v.to_bits()));
                }
                let g: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
                let h: f64 = o.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
                assert!((g - h).abs() <= 2e-3 * g, "{g} vs {h}");
            }
        }
    }

    /// turbo4 (May 2026 layout) writes rnorm = 0.
    #[test]
    fn turbo4_rnorm_zero() {
        let mut r = Rng(2);
        let x: Vec<f32> = (0..QK_TURBO).map(|_| r.gauss()).collect();
        let mut b = [0xffu8; TURBO4_BYTES];
        quantize_turbo4(&x, &mut b);
        assert_eq!(b[2..4], [0, 0]);
    }

    /// A row of several groups is quantized group by group (128-wide), independently.
    #[test]
    fn rows_are_independent_groups() {
        let mut r = Rng(3);
        let x: Vec<f32> = (0..3 * QK_TURBO).map(|_| r.gauss()).collect();
        for (q, _, bytes, _) in KINDS {
            let mut whole = vec![0u8; 3 * bytes];
            q(&x, &mut whole);
            for g in 0..3 {
                let mut one = vec![0u8; bytes];
                q(&x[g * QK_TURBO..(g + 1) * QK_TURBO], &mut one);
                assert_eq!(one, whole[g * bytes..(g + 1) * bytes]);
            }
        }
    }

    /// The rotation is orthonormal up to rounding: ||rotate(u)|| ≈ ||u||.
    #[test]
    fn rotation_preserves_norm() {
        let mut r = Rng(4);
        let mut y: [f32; QK_TURBO] = std::array::from_fn(|_| r.gauss());
        let n0: f32 = y.iter().map(|v| v * v).sum();
        rotate_forward(&mut y);
        let n1: f32 = y.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4 * n0);
    }

    /// The generalized layouts reproduce the registry's May-2026 bytes and values exactly.
    #[test]
    fn layouts_match_the_may_functions() {
        let mut r = Rng(5);
        for ((q, d, bytes, cb), l) in KINDS.into_iter().zip(TurboLayout::MAY) {
            assert_eq!(l.block_bytes(), bytes);
            let x: Vec<f32> = (0..4 * QK_TURBO).map(|_| r.gauss()).collect();
            let (mut a, mut b) = (vec![0u8; 4 * bytes], vec![0u8; 4 * bytes]);
            q(&x, &mut a);
            quantize_blocks(&l, cb, &x, &mut b);
            assert_eq!(a, b);
            let raw: Vec<u8> = (0..64 * bytes).map(|_| r.next() as u8).collect();
            let (mut u, mut v) = (vec![0f32; 64 * QK_TURBO], vec![0f32; 64 * QK_TURBO]);
            d(&raw, &mut u);
            dequantize_blocks(&l, cb, &raw, &mut v);
            assert!(u
                .iter()
                .zip(&v)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())));
        }
        for bits in 2..=4 {
            for g in [64, 128] {
                assert!(TurboLayout::new(bits, g, 2).is_valid());
            }
        }
        assert_eq!(TurboLayout::new(4, 128, 2).block_bytes(), 66);
        assert_eq!(TurboLayout::new(3, 64, 2).block_bytes(), 26);
        assert!(!TurboLayout::new(3, 128, 4).is_valid());
        assert!(!TurboLayout::new(4, 96, 2).is_valid());
    }
}

/// The turbo codebooks used by the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turbo4Table {
    /// The fork's May-2026 tables (`types::turbo::CB2/CB3/CB4`; the 4-bit one mis-scaled),
    /// 68-byte turbo4 blocks.
    May,
    /// The fork's 2/3-bit tables and Lloyd-Max for a coordinate of a random unit vector in R^128
    /// at 4 bits (the June-2026 table up to rounding), 66-byte turbo4 blocks.
    LloydMax,
    /// Lloyd-Max for the group's own dimension at every width (what `tq codebook --head-dim G`
    /// emits): differs from the fork's tables on 64-value groups, where the d = 128 tables are
    /// √2 too narrow.
    HeadDim,
}

impl Turbo4Table {
    pub fn parse(s: &str) -> Result<Turbo4Table> {
        match s {
            "may" | "may-2026" => Ok(Turbo4Table::May),
            // "fork": the name before target profiles carried the table (the fork since June).
            "june" | "fork" | "lloyd-max" => Ok(Turbo4Table::LloydMax),
            "head-dim" => Ok(Turbo4Table::HeadDim),
            o => Err(Error::Usage(format!(
                "--turbo-codebook {}: expected june, may or head-dim",
                crate::error::one_line(o)
            ))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Turbo4Table::May => "may",
            Turbo4Table::LloydMax => "june",
            Turbo4Table::HeadDim => "head-dim",
        }
    }
}

/// Lloyd-Max centroids (ascending, f32) for a coordinate of a random unit vector in R^d.
fn lloyd_max_f32(d: usize, bits: u32) -> &'static [f32] {
    type Tables = HashMap<(usize, u32), &'static [f32]>;
    static CACHE: OnceLock<Mutex<Tables>> = OnceLock::new();
    let mut m = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    m.entry((d, bits)).or_insert_with(|| {
        let c: Vec<f32> = lloyd_max_bits(&Dist::Beta { d }, bits)
            .centroids
            .iter()
            .map(|&c| c as f32)
            .collect();
        Box::leak(c.into_boxed_slice())
    })
}

/// The centroids (ascending) of a turbo type for `g`-value groups with the chosen tables.
pub fn turbo_codebook(t: TensorType, table: Turbo4Table, g: usize) -> &'static [f32] {
    let bits = match t {
        TensorType::Turbo2 => 2,
        TensorType::Turbo3 => 3,
        _ => 4,
    };
    match (bits, table) {
        (_, Turbo4Table::HeadDim) => lloyd_max_f32(g, bits),
        (2, _) => &CB2,
        (3, _) => &CB3,
        (_, Turbo4Table::May) => &CB4,
        (_, Turbo4Table::LloydMax) => lloyd_max_f32(128, 4),
    }
}
