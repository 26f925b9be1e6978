//! LDLQ into the IQ3 grid types (IQ3_XXS, IQ3_S: [`LdlqKind::Lattice`]) in the weights' own
//! basis and natural column order: a value is not rounded alone but as part of a 4-value grid
//! row, so the sweep's rounding step is a small vector quantizer.
//!
//! 1. Every row is encoded first with llama.cpp's importance-weighted encoder
//!    (`types::iquants::iq3_quant`), the importance being the damped Hessian diagonal; this fixes
//!    the super-block scale `d` and every 32-value group's 4-bit scale, hence each group's step
//!    `db` (the decoder's `d·(0.5 + s)·0.5` or `d·(1 + 2s)`).
//! 2. GPTQ's sweep ([`sweep_groups`]) then visits the columns in order, feeding each column's error into
//!    the next `band` columns. At the first column of every 4 it picks, from the current
//!    (error-fed) values, the grid row and signs of least `Σ (x − q)² / U_jj²` over the four
//!    (every row of the grid is tried: 256 or 512); the other three columns take the values
//!    chosen with it. IQ3_XXS's signs carry even parity per 8 values: at the first of every 8 the
//!    signs follow the values, and an odd count flips the value of least `x² / U_jj²` (llama.cpp's
//!    rule with the sweep's weights).
//! 3. The blocks keep step 1's scales; the grid indices and signs are rewritten.
//! 4. With `--ldlq-refit N` (the factor keeps the Hessian): the scales are refitted to the codes
//!    under the full Hessian and the sweep runs again, up to N times (`iq_refit`).
//!
//! [`LdlqKind::Lattice`]: crate::types::LdlqKind::Lattice

use super::iq::{col_weights, diag_over_mean, sweep_groups};
use super::normal::RefitH;
use super::Factor;
use crate::types::iquants::iq13_gridmap::GridMap;
use crate::types::iquants::iq3_quant::{grid_s, grid_xxs};
use crate::types::TensorType;

/// The decoder's value of each level (IQ3_XXS's `iq3xxs_grid` bytes; IQ3_S's `iq3s_grid`).
const LEVELS_XXS: [f32; 8] = [4.0, 12.0, 20.0, 28.0, 36.0, 44.0, 52.0, 62.0];
const LEVELS_S: [f32; 8] = [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0];

struct Kind {
    xxs: bool,
    /// Decoded rows: `levels[l]` per value of every grid row.
    rows: Vec<[f32; 4]>,
}

fn kind(ty: TensorType) -> Kind {
    let xxs = match ty {
        TensorType::IQ3XXS => true,
        TensorType::IQ3S => false,
        _ => panic!("{ty}: no lattice LDLQ"),
    };
    let (grid, levels): (&GridMap<4>, _) = if xxs {
        (grid_xxs(), &LEVELS_XXS)
    } else {
        (grid_s(), &LEVELS_S)
    };
    let rows = (0..grid.rows.len())
        .map(|r| grid.levels(r).map(|l| levels[l as usize]))
        .collect();
    Kind { xxs, rows }
}

/// Each 32-value group's step `db` of an encoded row (decoder arithmetic, f32).
fn steps(k: &Kind, b: &[u8], out: &mut Vec<f32>) {
    out.clear();
    let bb = if k.xxs { 98 } else { 110 };
    for blk in b.chunks_exact(bb) {
        let d = crate::types::float::f16_at(blk, 0);
        for ib in 0..8 {
            out.push(if k.xxs {
                let s = blk[66 + 4 * ib + 3] >> 4;
                d * (0.5 + s as f32) * 0.5
            } else {
                let s = (blk[106 + ib / 2] >> (4 * (ib % 2))) & 15;
                d * (1 + 2 * s as i32) as f32
            });
        }
    }
}

/// LDLQ rows of IQ3_XXS / IQ3_S (module comment; steps 1 and 4 are `iq`'s) into `out`.
pub(super) fn quantize_rows(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    rh: Option<RefitH>,
    band: usize,
    out: &mut [u8],
) {
    let imp = diag_over_mean(f);
    super::iq::quantize_rows(ty, rows, f, rh, band, &imp, sweep_pass, out);
}

/// Steps 2 and 3 of the module comment: the sweep at the scales `out` holds, its grid indices
/// and signs written into `out` (scales kept).
pub(super) fn sweep_pass(ty: TensorType, rows: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    let k = kind(ty);
    let n = f.n;
    let nr = rows.len() / n;
    let row_bytes = ty.bytes_for(n as u64).unwrap() as usize;
    let mut db = Vec::with_capacity(nr * n / 32);
    let mut tmp = Vec::new();
    for o in out.chunks_exact(row_bytes) {
        steps(&k, o, &mut tmp);
        db.extend_from_slice(&tmp);
    }
    // 2. The sweep.
    let wcol = col_weights(f);
    let mut x: Vec<f64> = rows.iter().map(|&v| v as f64).collect();
    let mut sel = vec![0u16; nr * n / 4];
    let mut neg = vec![false; nr * n];
    sweep_groups::<4>(&mut x, n, f, band, |r, j, xr| {
        let at = r * n + j;
        if j % 8 == 0 {
            // Signs of the next 8 values (IQ3_XXS: even parity).
            let mut odd = false;
            for i in 0..8 {
                neg[at + i] = xr[j + i] < 0.0;
                odd ^= neg[at + i];
            }
            if k.xxs && odd {
                let mut imin = 0;
                let mut min = f64::MAX;
                for i in 0..8 {
                    let e = wcol[j + i] * xr[j + i] * xr[j + i];
                    if e < min {
                        min = e;
                        imin = i;
                    }
                }
                neg[at + imin] = !neg[at + imin];
            }
        }
        let step = db[r * n / 32 + j / 32];
        let sgn = |i: usize| if neg[at + i] { -1f32 } else { 1f32 };
        // Targets in the sign-stripped domain, and the best grid row for them.
        let t: [f64; 4] = std::array::from_fn(|i| xr[j + i] * sgn(i) as f64);
        let mut best = (f64::MAX, 0usize);
        for (ri, row) in k.rows.iter().enumerate() {
            let mut e = 0f64;
            for i in 0..4 {
                let q = (step * row[i]) as f64;
                e += wcol[j + i] * (t[i] - q) * (t[i] - q);
            }
            if e < best.0 {
                best = (e, ri);
            }
        }
        sel[at / 4] = best.1 as u16;
        // The decoder's f32 product: db · grid · sign.
        std::array::from_fn(|i| step * k.rows[best.1][i] * sgn(i))
    });
    // 3. Grid indices and signs into the blocks; scales kept.
    for (r, o) in out.chunks_exact_mut(row_bytes).enumerate() {
        let (bb, per) = if k.xxs { (98, 8) } else { (110, 8) };
        for (blk, b) in o.chunks_exact_mut(bb).enumerate() {
            for ib in 0..8 {
                let g0 = (r * n + blk * 256 + ib * 32) / 4; // first tuple of the group
                let v0 = r * n + blk * 256 + ib * 32;
                let sbits: [u8; 4] = std::array::from_fn(|l| {
                    (0..8).fold(0u8, |s, i| s | (neg[v0 + 8 * l + i] as u8) << i)
                });
                if k.xxs {
                    for t in 0..per {
                        b[2 + 8 * ib + t] = sel[g0 + t] as u8;
                    }
                    let o4 = 66 + 4 * ib;
                    let old = u32::from_le_bytes([b[o4], b[o4 + 1], b[o4 + 2], b[o4 + 3]]);
                    let mut w = old & 0xF000_0000;
                    for (l, s) in sbits.iter().enumerate() {
                        w |= ((s & 127) as u32) << (7 * l);
                    }
                    b[o4..o4 + 4].copy_from_slice(&w.to_le_bytes());
                } else {
                    let mut qh = 0u8;
                    for t in 0..per {
                        b[2 + 8 * ib + t] = (sel[g0 + t] & 255) as u8;
                        qh |= ((sel[g0 + t] >> 8) as u8) << t;
                    }
                    b[66 + ib] = qh;
                    b[74 + 4 * ib..74 + 4 * ib + 4].copy_from_slice(&sbits);
                }
            }
        }
    }
}
