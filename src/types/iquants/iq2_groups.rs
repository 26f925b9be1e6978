//! IQ2 blocks (IQ2_XXS, IQ2_XS, IQ2_S) seen as fixed scales and one 8-value vector quantizer per
//! group, for LDLQ (`quant::ldlq::iq_grid`): the scales are those of the importance-weighted
//! encoder (`iq2_quant`, llama.cpp's search), then every group of 8 values is rounded to the grid
//! row and signs of least weighted squared error at its group's fixed scale ([`best_group`]), with
//! the error fed forward by the sweep, and stored ([`put_group`]). The blocks stay ordinary IQ2
//! blocks.
//!
//! The best group is exact: with level values `a_k` (the decoder's `db · grid_k` in f32) the
//! cost of a grid row with the signs of the targets is `Σ w_k (|t_k| − a_k)²`; where the format
//! implies the 8th sign by even parity (IQ2_XXS, IQ2_XS) and the targets have an odd number of
//! negatives, the cheapest flip `min_k 4 w_k |t_k| a_k` is added (and made). Every grid row is
//! tried.

use super::iq2::LEVELS;
use super::iq2_quant::lattice;
use super::{sign, QK_K};
use crate::types::float::f16_at;
use crate::types::TensorType;
use std::sync::OnceLock;

/// Values per group (one grid row, one sign byte).
pub(crate) const GROUP: usize = 8;

/// Level indices (0..=2) of every grid row of `ty` (the encoders' lattice, as a flat table for
/// the exhaustive search).
fn rows(ty: TensorType) -> &'static [[u8; 8]] {
    static R: [OnceLock<Vec<[u8; 8]>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = match ty {
        TensorType::IQ2XXS => 0,
        TensorType::IQ2XS => 1,
        _ => 2,
    };
    R[i].get_or_init(|| {
        let g = lattice(i).grid();
        (0..g.rows.len())
            .map(|r| g.levels(r).map(|l| l as u8))
            .collect()
    })
}

/// The IQ2 types LDLQ rounds group by group.
pub(crate) fn supports(ty: TensorType) -> bool {
    matches!(
        ty,
        TensorType::IQ2XXS | TensorType::IQ2XS | TensorType::IQ2S
    )
}

/// The scale of each of the block's 32 groups as the decoder forms it: `d · (0.5 + s) · 0.25`.
pub(crate) fn group_scales(ty: TensorType, b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let db = |s: u32| d * (0.5 + s as f32) * 0.25;
    for (g, o) in out[..QK_K / GROUP].iter_mut().enumerate() {
        let ib = g / 4;
        *o = match ty {
            TensorType::IQ2XXS => {
                let q = &b[2 + 8 * ib + 4..2 + 8 * ib + 8];
                db(u32::from_le_bytes([q[0], q[1], q[2], q[3]]) >> 28)
            }
            _ => {
                let s = b[ty.block_bytes() - QK_K / 32 + ib];
                db(if g % 4 < 2 { s & 15 } else { s >> 4 } as u32)
            }
        };
    }
}

/// The grid row and sign byte (bit k: value k negative; even parity for IQ2_XXS / IQ2_XS) of
/// least `Σ w_k (t_k − v_k)²` at group scale `db`, and the decoded values `v` (bit-identical with
/// the registry's decoder).
pub(crate) fn best_group(ty: TensorType, db: f32, t: &[f64], w: &[f64]) -> (u16, u8, [f32; 8]) {
    let even = ty != TensorType::IQ2S;
    let a: [f32; 3] = std::array::from_fn(|l| db * LEVELS[l] as f32);
    let mut s = 0u8;
    let (mut cost, mut flip) = ([[0f64; 3]; 8], [[0f64; 3]; 8]);
    for k in 0..8 {
        if t[k] < 0.0 {
            s |= 1 << k;
        }
        let at = t[k].abs();
        for l in 0..3 {
            let d = at - a[l] as f64;
            cost[k][l] = w[k] * d * d;
            flip[k][l] = 4.0 * w[k] * at * a[l] as f64;
        }
    }
    let odd = even && s.count_ones() % 2 == 1;
    let (mut best, mut best_j, mut best_flip) = (f64::INFINITY, 0usize, 0usize);
    for (j, r) in rows(ty).iter().enumerate() {
        let mut c = 0f64;
        for k in 0..8 {
            c += cost[k][r[k] as usize];
        }
        let mut fk = 0;
        if odd {
            let mut m = f64::INFINITY;
            for k in 0..8 {
                if flip[k][r[k] as usize] < m {
                    m = flip[k][r[k] as usize];
                    fk = k;
                }
            }
            c += m;
        }
        if c < best {
            (best, best_j, best_flip) = (c, j, fk);
        }
    }
    if odd {
        s ^= 1 << best_flip;
    }
    let r = &rows(ty)[best_j];
    let v = std::array::from_fn(|k| db * LEVELS[r[k] as usize] as f32 * sign(s, k));
    (best_j as u16, s, v)
}

/// Store group `g`'s grid row `idx` and signs `s` (as [`best_group`] gives them) in block `b`.
pub(crate) fn put_group(ty: TensorType, b: &mut [u8], g: usize, idx: u16, s: u8) {
    let (ib, l) = (g / 4, g % 4);
    match ty {
        TensorType::IQ2XXS => {
            b[2 + 8 * ib + l] = idx as u8;
            let o = 2 + 8 * ib + 4;
            let mut aux = u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
            aux = aux & !(127 << (7 * l)) | ((s & 127) as u32) << (7 * l);
            b[o..o + 4].copy_from_slice(&aux.to_le_bytes());
        }
        TensorType::IQ2XS => {
            let q = idx | ((s & 127) as u16) << 9;
            b[2 + 2 * g..4 + 2 * g].copy_from_slice(&q.to_le_bytes());
        }
        _ => {
            b[2 + g] = idx as u8;
            let qh = &mut b[2 + QK_K / 4 + g / 4];
            *qh = *qh & !(3 << (2 * (g % 4))) | ((idx >> 8) as u8) << (2 * (g % 4));
            b[2 + QK_K / 8 + g] = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TensorType::{IQ2S, IQ2XS, IQ2XXS};

    /// Groups put into encoded blocks decode to exactly the values `best_group` returned, and
    /// the chosen group is no worse than every grid row with every allowed sign pattern
    /// (brute force on a few groups).
    #[test]
    fn best_group_is_exact_and_decodes() {
        let mut seed = 5u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        for ty in [IQ2XXS, IQ2XS, IQ2S] {
            let x: Vec<f32> = (0..QK_K).map(|_| rnd() as f32).collect();
            let mut b = vec![0u8; ty.block_bytes()];
            crate::types::quantize(ty, &x, &mut b, "t").unwrap();
            let mut db = [0f32; 32];
            group_scales(ty, &b, &mut db);
            let mut want = vec![0f32; QK_K];
            for g in 0..32 {
                let t: Vec<f64> = (0..8).map(|_| rnd() * 0.3).collect();
                let w: Vec<f64> = (0..8).map(|_| rnd() + 0.6).collect();
                let (idx, s, v) = best_group(ty, db[g], &t, &w);
                put_group(ty, &mut b, g, idx, s);
                want[8 * g..8 * g + 8].copy_from_slice(&v);
                let cost = |v: &[f32]| -> f64 {
                    (0..8).map(|k| w[k] * (t[k] - v[k] as f64).powi(2)).sum()
                };
                if g < 3 {
                    let c = cost(&v);
                    for r in rows(ty) {
                        for sb in 0..256u32 {
                            if ty != IQ2S && sb.count_ones() % 2 == 1 {
                                continue;
                            }
                            let u: Vec<f32> = (0..8)
                                .map(|k| db[g] * LEVELS[r[k] as usize] as f32 * sign(sb as u8, k))
                                .collect();
                            assert!(c <= cost(&u) + 1e-12, "{ty} group {g}");
                        }
                    }
                }
            }
            let mut y = vec![0f32; QK_K];
            crate::types::dequantize(ty, &b, &mut y, "t").unwrap();
            for (a, c) in y.iter().zip(&want) {
                assert_eq!(a.to_bits(), c.to_bits(), "{ty}");
            }
        }
    }
}
