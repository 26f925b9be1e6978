//! IQ2_XXS, IQ2_XS, IQ2_S encoders: what `llama-quantize` writes, byte for byte (ggml's
//! `quantize_row_iq2_{xxs,xs,s}_impl`, learnt from llama.cpp's `ggml-quants.c`; checked live and
//! by recorded hashes in `tests/iquants_llama.rs`).
//!
//! Each 8-value row of a block is stored as a grid point (8 levels from {1, 3, 5} in ggml's odd
//! coordinates, decoded as 8, 25, 43) and 8 signs. The encoder works on the magnitudes `|x|`:
//! - signs: bit i set for `x_i < 0`. IQ2_XXS/IQ2_XS keep 7 sign bits and the 8th is implied by
//!   even parity, so a row with an odd count of negatives flips the value of least
//!   `w·x²` (its magnitude enters the search negated);
//! - weights: `qw_i · sqrt(σ² + x_i²)` with `σ² = Σx²/256` of the super-block (IQ2_S: `2·Σx²/256`),
//!   `qw` the importance matrix; IQ2_S without one uses `σ²/4 + x_i²`. [`quantize_iq2_xxs`] and
//!   [`quantize_iq2_xs`] (the registry's, no imatrix) take `qw = 1`, which is what llama-quantize
//!   does with an importance matrix of ones (llama.cpp itself refuses these two types without one);
//! - scale search per sub-block (32 values for IQ2_XXS, 16 for the others): trial inverse scales
//!   around the largest magnitude (`(5 + 0.1·k)/m`, k = −9..=9; IQ2_XXS: `k = −6..=6` around
//!   `3·s₀` with `s₀` ggml's `make_qp_quants` scale), each row rounded to the lattice
//!   `l = round((x/s − 1)/2)` in `0..=2`, a point not on the grid replaced by the best of its
//!   precomputed neighbours ([`Lattice`]) under the weights `sqrt(w)`; the trial with the largest
//!   `(Σ w x q)² / Σ w q²` wins and its least-squares scale is kept (then rows found off the grid
//!   are re-rounded at that scale and the scale refitted);
//! - block scale `d = max_s / 31` (f16; IQ2_S stores `d · 0.9875`) and 4-bit sub-scales
//!   `round((s/d − 1)/2)`, decoded as `d · (0.5 + l) · 0.25`.
//!
//! f32 arithmetic in ggml's order (`a*b*c` is `(a*b)*c`; no fused multiply-add), `nearest_int`'s
//! ties-to-even, C's integer narrowing where ggml stores an `int` into a `uint8_t`.

use super::iq13_gridmap::{GridMap, Lookup};
use super::{grids, QK_K};
use crate::types::kquants::{make_qp_quants, nearest_int, put_f16};
use std::sync::OnceLock;

use super::iq2::{IQ2_S_BYTES, IQ2_XS_BYTES, IQ2_XXS_BYTES};

/// Lattice levels per value are `0..KMAX_Q` (ggml's `kMaxQ`).
const KMAX_Q: i32 = 3;
/// ggml's `GROUP_MAX_EPS` and `GROUP_MAX_EPS_IQ2_S`: sub-blocks whose largest magnitude is below
/// get scale 0.
const GROUP_MAX_EPS: f32 = 1e-15;
const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;

/// A grid of 8-value points and, for every lattice point `u` (8 levels in `0..=2`, 2 bits each:
/// the key ggml's `kmap_q2xs` uses) not on the grid, its nearest grid points (ggml's
/// `iq2xs_init_impl`: every grid point at one of the `nwant` smallest squared distances in odd
/// coordinates, in order of distance then index): the [`GridMap`] the IQ1 and IQ3 encoders use.
pub(crate) struct Lattice(GridMap<8>);

impl Lattice {
    /// The grid row for lattice key `u` (levels `l`, magnitudes `xval`, weights `waux`, at
    /// `scale`): `u` itself when it is on the grid, else the neighbour of least
    /// `Σ waux·(scale·q − x)²` (first on ties, as ggml's `iq2_find_best_neighbour`), whose
    /// levels replace `l`. Returns (grid index, whether `u` was on the grid).
    #[inline]
    fn snap(&self, u: u16, xval: &[f32], waux: &[f32], scale: f32, l: &mut [i8]) -> (u16, bool) {
        let near = match self.0.find_key(u as usize) {
            Lookup::Row(r) => return (r as u16, true),
            Lookup::Near(near) => near,
        };
        let j = self
            .0
            .best_neighbour(near, xval, waux, scale, |c| c as f32, l);
        (j as u16, false)
    }

    /// The levels of grid row `j`.
    #[inline]
    fn levels(&self, j: u16, l: &mut [i8]) {
        l.copy_from_slice(&self.0.levels(j as usize));
    }

    /// The grid (rows in ggml's odd coordinates, lookups).
    pub(crate) fn grid(&self) -> &GridMap<8> {
        &self.0
    }
}

/// The lattice of IQ2_XXS (0), IQ2_XS (1) or IQ2_S (2), built once.
pub(crate) fn lattice(which: usize) -> &'static Lattice {
    static L: [OnceLock<Lattice>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    L[which].get_or_init(|| {
        let (packed, nwant): (&[u16], usize) = match which {
            0 => (&grids::IQ2XXS_PACKED, 2),
            1 => (&grids::IQ2XS_PACKED, 2),
            _ => (&grids::IQ2S_PACKED, 1),
        };
        Lattice(GridMap::new(packed, 2, (KMAX_Q - 1) as u16, nwant))
    })
}

/// Round 8 magnitudes at inverse scale `id` onto the lattice (`l` in `0..=2`); returns the key.
#[inline]
fn round8(id: f32, xval: &[f32], l: &mut [i8]) -> u16 {
    let mut u = 0u16;
    for i in 0..8 {
        let v = nearest_int(0.5 * (id * xval[i] - 1.0)).clamp(0, KMAX_Q - 1);
        l[i] = v as i8;
        u |= (v as u16) << (2 * i);
    }
    u
}

/// `(Σ w x q, Σ w q²)` with `q = 2l + 1`.
#[inline]
fn sums(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sqx, mut sq2) = (0f32, 0f32);
    for i in 0..l.len() {
        let w = weight[i];
        let q = (2 * l[i] as i32 + 1) as f32;
        sqx += w * xval[i] * q;
        sq2 += w * q * q;
    }
    (sqx, sq2)
}

/// `|x|` of one 8-value row into `xval` and its sign byte (bit i: `x_i < 0`). With `even`, an odd
/// number of negatives flips the value of least `w·x²` (its `xval` turns negative) so that the
/// signs have even parity, and only the 7 stored bits are returned.
#[inline]
fn signs8(xb: &[f32], w: &[f32], xval: &mut [f32], even: bool) -> u8 {
    let (mut s, mut nflip) = (0u8, 0);
    for i in 0..8 {
        if xb[i] >= 0.0 {
            xval[i] = xb[i];
        } else {
            xval[i] = -xb[i];
            nflip += 1;
            s |= 1 << i;
        }
    }
    if !even {
        return s;
    }
    if nflip % 2 == 1 {
        let (mut imin, mut min) = (0, w[0] * xb[0] * xb[0]);
        for i in 1..8 {
            let ax = w[i] * xb[i] * xb[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    s & 127
}

/// C's `MAX(a, b)`: `a > b ? a : b`.
#[inline(always)]
fn cmax(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// One 16-value sub-block of IQ2_XS / IQ2_S (magnitudes `xval`, at least one above the group
/// epsilon, largest `max`): the trial search of the module comment. Returns the scale, the levels
/// in `l` and the grid index of both rows.
fn search16(
    lat: &Lattice,
    xval: &[f32; 16],
    weight: &[f32; 16],
    waux: &[f32; 16],
    max: f32,
    l: &mut [i8; 16],
) -> (f32, [u16; 2]) {
    let mut best = 0f32;
    let mut scale = max / (2 * KMAX_Q - 1) as f32;
    // No trial taken: every level 0, which is grid row 0 of all three grids.
    let (mut on, mut idx) = ([true; 2], [0u16; 2]);
    *l = [0; 16];
    let mut laux = [0i8; 16];
    for is in -9..=9 {
        let id = ((2 * KMAX_Q - 1) as f32 + is as f32 * 0.1) / max;
        let this_scale = 1.0 / id;
        let (mut on_aux, mut idx_aux) = ([true; 2], [0u16; 2]);
        for k in 0..2 {
            let r = 8 * k..8 * k + 8;
            let u = round8(id, &xval[r.clone()], &mut laux[r.clone()]);
            (idx_aux[k], on_aux[k]) = lat.snap(
                u,
                &xval[r.clone()],
                &waux[r.clone()],
                this_scale,
                &mut laux[r],
            );
        }
        let (sqx, sq2) = sums(weight, xval, &laux);
        if sq2 > 0.0 && sqx * sqx > best * sq2 {
            scale = sqx / sq2;
            best = scale * sqx;
            *l = laux;
            on = on_aux;
            idx = idx_aux;
        }
    }
    if on.contains(&false) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..2 {
            if on[k] {
                continue;
            }
            let r = 8 * k..8 * k + 8;
            let u = round8(id, &xval[r.clone()], &mut l[r.clone()]);
            idx[k] = lat
                .snap(u, &xval[r.clone()], &waux[r.clone()], scale, &mut l[r])
                .0;
        }
        let (sqx, sq2) = sums(weight, xval, l);
        if sq2 > 0.0 {
            scale = sqx / sq2;
        }
    }
    (scale, idx)
}

/// `Σ x²` of a super-block, in order.
#[inline]
fn sumx2(x: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// The 4-bit sub-scale of scale `s` under `id = 1/d`.
#[inline]
fn sub_scale(id: f32, s: f32) -> u8 {
    nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15) as u8
}

/// IQ2_XXS super-blocks of `x` with importance `qw` (one per value of `x`, or one per column of
/// a row that `x` repeats: `qw` is read modulo its length, a whole number of super-blocks).
pub(crate) fn quantize_iq2_xxs_with(x: &[f32], qw: &[f32], out: &mut [u8]) {
    let lat = lattice(0);
    let (mut weight, mut waux, mut xval) = ([0f32; 32], [0f32; 32], [0f32; 32]);
    let (mut l, mut laux) = ([0i8; 32], [0i8; 32]);
    for (ibl, (xbl, y)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(IQ2_XXS_BYTES))
        .enumerate()
    {
        let qbl = &qw[(QK_K * ibl) % qw.len()..][..QK_K];
        y.fill(0);
        let mut q2 = [0u32; QK_K / 16];
        let mut scales = [0f32; QK_K / 32];
        let mut max_scale = 0f32;
        let sigma2 = sumx2(xbl) / QK_K as f32;
        for ib in 0..QK_K / 32 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            for i in 0..32 {
                weight[i] = qbl[32 * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt();
                waux[i] = weight[i].sqrt();
            }
            let mut signs = [0u8; 4];
            for k in 0..4 {
                let r = 8 * k..8 * k + 8;
                signs[k] = signs8(&xb[r.clone()], &weight[r.clone()], &mut xval[r], true);
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = cmax(max, v);
            }
            if max < GROUP_MAX_EPS {
                continue;
            }
            let mut scale = make_qp_quants(KMAX_Q + 1, &xval, &weight, &mut [0u8; 32]);
            let eff_max = scale * KMAX_Q as f32;
            if eff_max <= 0.0 {
                continue;
            }
            let mut best = 0f32;
            let mut idx = [0u16; 4];
            for is in -6..=6 {
                let id = ((2 * KMAX_Q - 1) as f32 + is as f32 * 0.1) / eff_max;
                let this_scale = 1.0 / id;
                for k in 0..4 {
                    let r = 8 * k..8 * k + 8;
                    let u = round8(id, &xval[r.clone()], &mut laux[r.clone()]);
                    lat.snap(
                        u,
                        &xval[r.clone()],
                        &waux[r.clone()],
                        this_scale,
                        &mut laux[r],
                    );
                }
                let (sqx, sq2) = sums(&weight, &xval, &laux);
                if sq2 > 0.0 && sqx * sqx > best * sq2 {
                    scale = sqx / sq2;
                    best = scale * sqx;
                    l = laux;
                }
            }
            if scale > 0.0 {
                let id = 1.0 / scale;
                for k in 0..4 {
                    let r = 8 * k..8 * k + 8;
                    let u = round8(id, &xval[r.clone()], &mut laux[r.clone()]);
                    idx[k] = lat
                        .snap(
                            u,
                            &xval[r.clone()],
                            &waux[r.clone()],
                            scale,
                            &mut laux[r.clone()],
                        )
                        .0;
                    lat.levels(idx[k], &mut l[r]);
                }
                let (sqx, sq2) = sums(&weight, &xval, &l);
                if sq2 > 0.0 {
                    scale = sqx / sq2;
                }
            } else {
                // ggml looks the levels up in its map (and aborts should they be off the grid).
                for (k, ix) in idx.iter_mut().enumerate() {
                    let u = (0..8).fold(0u16, |u, i| u | ((l[8 * k + i] as u16 & 3) << (2 * i)));
                    *ix = lat.0.row_of(u as usize).unwrap_or(0) as u16;
                }
            }
            if scale < 0.0 {
                scale = -scale;
                for s in &mut signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..4 {
                q2[2 * ib] |= (idx[k] as u32) << (8 * k);
                q2[2 * ib + 1] |= (signs[k] as u32) << (7 * k);
            }
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        put_f16(y, 0, d);
        let id = 1.0 / d;
        for (ib, &s) in scales.iter().enumerate() {
            q2[2 * ib + 1] |= (sub_scale(id, s) as u32) << 28;
        }
        for (o, q) in y[2..].chunks_exact_mut(4).zip(q2) {
            o.copy_from_slice(&q.to_le_bytes());
        }
    }
}

/// The two 16-value-sub-block types.
#[derive(Clone, Copy, PartialEq)]
enum Sub16 {
    Xs,
    S,
}

fn quantize_sub16(kind: Sub16, x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let (lat, bytes, eps, sigma_mul) = match kind {
        Sub16::Xs => (lattice(1), IQ2_XS_BYTES, GROUP_MAX_EPS, 1.0f32),
        Sub16::S => (lattice(2), IQ2_S_BYTES, GROUP_MAX_EPS_IQ2_S, 2.0),
    };
    let (mut weight, mut waux, mut xval) = ([0f32; 16], [0f32; 16], [0f32; 16]);
    let mut l = [0i8; 16];
    for (ibl, (xbl, y)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(bytes))
        .enumerate()
    {
        let qbl = qw.map(|q| &q[(QK_K * ibl) % q.len()..][..QK_K]);
        y.fill(0);
        let mut scales = [0f32; QK_K / 16];
        let mut max_scale = 0f32;
        let sigma2 = sigma_mul * sumx2(xbl) / QK_K as f32;
        for ib in 0..QK_K / 16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            for i in 0..16 {
                weight[i] = match qbl {
                    Some(q) => q[16 * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt(),
                    None => 0.25 * sigma2 + xb[i] * xb[i],
                };
                waux[i] = weight[i].sqrt();
            }
            let mut signs = [0u8; 2];
            for k in 0..2 {
                let r = 8 * k..8 * k + 8;
                signs[k] = signs8(
                    &xb[r.clone()],
                    &weight[r.clone()],
                    &mut xval[r],
                    kind == Sub16::Xs,
                );
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = cmax(max, v);
            }
            if max < eps {
                continue;
            }
            let (mut scale, idx) = search16(lat, &xval, &weight, &waux, max, &mut l);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut signs {
                    *s = match kind {
                        Sub16::Xs => !*s & 127,
                        Sub16::S => !*s,
                    };
                }
            }
            for k in 0..2 {
                let i8 = 2 * ib + k;
                match kind {
                    Sub16::Xs => {
                        let q = idx[k] | (signs[k] as u16) << 9;
                        y[2 + 2 * i8..4 + 2 * i8].copy_from_slice(&q.to_le_bytes());
                    }
                    Sub16::S => {
                        y[2 + i8] = idx[k] as u8;
                        y[2 + QK_K / 4 + i8 / 4] |= ((idx[k] >> 8) << (2 * (i8 % 4))) as u8;
                        y[2 + QK_K / 8 + i8] = signs[k];
                    }
                }
            }
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            // IQ2_XS zeroes its grid bytes; IQ2_S its whole block (already zero but for qs).
            y.fill(0);
            continue;
        }
        let d = max_scale / 31.0;
        put_f16(
            y,
            0,
            match kind {
                Sub16::Xs => d,
                Sub16::S => d * 0.9875,
            },
        );
        let id = 1.0 / d;
        let so = bytes - QK_K / 32;
        for (ib, &s) in scales.iter().enumerate() {
            y[so + ib / 2] |= sub_scale(id, s) << (4 * (ib % 2));
        }
    }
}

/// IQ2_XS super-blocks with importance `qw` (as [`quantize_iq2_xxs_with`]).
pub(crate) fn quantize_iq2_xs_with(x: &[f32], qw: &[f32], out: &mut [u8]) {
    quantize_sub16(Sub16::Xs, x, Some(qw), out);
}

/// IQ2_S super-blocks with importance `qw` (as [`quantize_iq2_xxs_with`]).
pub(crate) fn quantize_iq2_s_with(x: &[f32], qw: &[f32], out: &mut [u8]) {
    quantize_sub16(Sub16::S, x, Some(qw), out);
}

/// Unit importance for a whole number of super-blocks.
static ONES: [f32; QK_K] = [1.0; QK_K];

/// IQ2_XXS without an imatrix: importance 1 (llama-quantize with an imatrix of ones).
pub fn quantize_iq2_xxs(x: &[f32], out: &mut [u8]) {
    quantize_iq2_xxs_with(x, &ONES, out);
}

/// IQ2_XS without an imatrix: importance 1 (llama-quantize with an imatrix of ones).
pub fn quantize_iq2_xs(x: &[f32], out: &mut [u8]) {
    quantize_iq2_xs_with(x, &ONES, out);
}

/// IQ2_S without an imatrix: ggml's own weights `σ²/4 + x²` (what llama-quantize writes for a
/// tensor it lets through without one, e.g. `output.weight`).
pub fn quantize_iq2_s(x: &[f32], out: &mut [u8]) {
    quantize_sub16(Sub16::S, x, None, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TensorType::{IQ2S, IQ2XS, IQ2XXS};

    /// Every key the encoder can form has a grid row: itself, or neighbours that are all at the
    /// nearest distances (the nearest one or two, `nwant`) and listed by distance then index.
    #[test]
    fn lattice_neighbours_are_the_nearest_grid_points() {
        for (which, packed, nwant) in [
            (0, &grids::IQ2XXS_PACKED[..], 2),
            (1, &grids::IQ2XS_PACKED[..], 2),
            (2, &grids::IQ2S_PACKED[..], 1),
        ] {
            let g = lattice(which).grid();
            let dist = |u: usize, j: usize| -> i32 {
                (0..8)
                    .map(|k| {
                        let t = g.rows[j][k] as i32 - (2 * ((u >> (2 * k)) & 3) as i32 + 1);
                        t * t
                    })
                    .sum()
            };
            // Every key of 8 levels in 0..=2 (the encoder's `round8` range).
            for u in 0..1usize << 16 {
                if (0..8).any(|k| (u >> (2 * k)) & 3 == 3) {
                    continue;
                }
                let list = match g.find_key(u) {
                    Lookup::Row(r) => {
                        assert_eq!(packed[r] as usize, u);
                        assert_eq!(g.row_of(u), Some(r));
                        continue;
                    }
                    Lookup::Near(list) => list,
                };
                assert_eq!(g.row_of(u), None);
                assert!(!list.is_empty());
                let mut all: Vec<i32> = (0..packed.len()).map(|j| dist(u, j)).collect();
                all.sort_unstable();
                all.dedup();
                let limit = all[nwant - 1];
                let want = (0..packed.len()).filter(|&j| dist(u, j) <= limit).count();
                assert_eq!(list.len(), want, "key {u:#x}");
                for w in list.windows(2) {
                    let (a, b) = (w[0] as usize, w[1] as usize);
                    assert!((dist(u, a), a) < (dist(u, b), b), "key {u:#x} order");
                }
                assert!(list.iter().all(|&j| dist(u, j as usize) <= limit));
            }
        }
    }

    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                u * (1.0 + (i % 97) as f32 / 20.0)
            })
            .collect()
    }

    /// Round trip through the registry: the relative error is what a 2-bit code gives (well
    /// below the signal), zeros stay zeros, and more importance on some columns lowers their error.
    #[test]
    fn round_trip_and_importance() {
        let x = noise(64 * QK_K, 7);
        for ty in [IQ2XXS, IQ2XS, IQ2S] {
            let nb = ty.bytes_for(x.len() as u64).unwrap() as usize;
            let mut b = vec![0u8; nb];
            crate::types::quantize(ty, &x, &mut b, "t").unwrap();
            let mut y = vec![0f32; x.len()];
            crate::types::dequantize(ty, &b, &mut y, "t").unwrap();
            let err: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum();
            let sig: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
            assert!(err < 0.35 * sig, "{ty}: relative error {}", err / sig);
            let z = vec![0f32; QK_K];
            let mut bz = vec![0u8; ty.block_bytes()];
            crate::types::quantize(ty, &z, &mut bz, "t").unwrap();
            assert!(bz.iter().all(|&v| v == 0), "{ty}");
            // Importance 100 on the columns 0, 3, 6, ... of every row (inside every group).
            let imp: Vec<f32> = (0..QK_K)
                .map(|i| if i % 3 == 0 { 100.0 } else { 1.0 })
                .collect();
            let f = super::super::weighted_encoder(ty).unwrap();
            let mut bw = vec![0u8; nb];
            f(&x, &imp, &mut bw);
            let mut yw = vec![0f32; x.len()];
            crate::types::dequantize(ty, &bw, &mut yw, "t").unwrap();
            let part = |y: &[f32]| -> f64 {
                x.iter()
                    .zip(y)
                    .enumerate()
                    .filter(|(i, _)| (i % QK_K).is_multiple_of(3))
                    .map(|(_, (a, b))| ((a - b) as f64).powi(2))
                    .sum()
            };
            assert!(part(&yw) < part(&y), "{ty}: importance ignored");
        }
    }

    /// Length not a whole number of super-blocks: the registry's one-line error naming the tensor.
    #[test]
    fn partial_block_is_a_clear_error() {
        for ty in [IQ2XXS, IQ2XS, IQ2S] {
            let x = vec![0.5f32; 300];
            let mut out = vec![0u8; 2 * ty.block_bytes()];
            let e = crate::types::quantize(ty, &x, &mut out, "blk.3.ffn_down.weight").unwrap_err();
            assert!(e.to_string().contains("blk.3.ffn_down.weight"), "{e}");
        }
    }
}
