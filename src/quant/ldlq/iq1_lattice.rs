//! LDLQ into IQ1_S / IQ1_M ([`LdlqKind::Lattice`], like `iq_lattice.rs` for the IQ3 types): the
//! rows are first encoded by llama.cpp's importance-weighted encoder under the damped Hessian
//! diagonal, which fixes every 8 values' step `dl` and shift `δ = ±1/8` (the decoder's
//! `dl · (g + δ)`, `g ∈ {−1, 0, 1}`); then GPTQ's sweep visits the columns in order and, at the
//! first column of every 8, rounds the current (error-fed) values to their nearest levels, takes
//! that 8-tuple when it is a row of `iq1s_grid`, and otherwise its neighbour (the three distance
//! shells llama.cpp's encoder searches) of least `Σ (x − q)² / U_jj²`. IQ1_M stores a shift per
//! 8 values, so both signs of `δ` are tried there; IQ1_S's shift (one per 32) is kept, and so are
//! all scales. The grid indices (and IQ1_M's shifts) are rewritten.
//!
//! [`LdlqKind::Lattice`]: crate::types::LdlqKind::Lattice

use super::iq::{col_weights, diag_over_mean, sweep_groups};
use super::Factor;
use crate::types::iquants::iq13_gridmap::Lookup;
use crate::types::iquants::iq1_quant::grid;
use crate::types::TensorType;

const DELTA: f32 = 0.125;

/// Every 8-tuple's (step, shift) of one encoded row, in the decoders' arithmetic.
fn steps(m: bool, b: &[u8], out: &mut Vec<(f32, f32)>) {
    out.clear();
    let bb = if m { 56 } else { 50 };
    for blk in b.chunks_exact(bb) {
        if m {
            let sc: [u16; 4] =
                std::array::from_fn(|w| u16::from_le_bytes([blk[48 + 2 * w], blk[49 + 2 * w]]));
            let d = crate::types::float::f16_bits_to_f32(
                (sc[0] >> 12)
                    | ((sc[1] >> 8) & 0x00f0)
                    | ((sc[2] >> 4) & 0x0f00)
                    | (sc[3] & 0xf000),
            );
            for ib in 0..8 {
                let s = sc[ib / 2] >> (6 * (ib % 2));
                let dl = [
                    d * (2 * (s & 7) + 1) as f32,
                    d * (2 * ((s >> 3) & 7) + 1) as f32,
                ];
                for l in 0..4 {
                    let h = blk[32 + 2 * ib + l / 2];
                    let neg = h & if l % 2 == 0 { 0x08 } else { 0x80 } != 0;
                    out.push((dl[l / 2], if neg { -DELTA } else { DELTA }));
                }
            }
        } else {
            let d = crate::types::float::f16_at(blk, 0);
            for ib in 0..8 {
                let qh = u16::from_le_bytes([blk[34 + 2 * ib], blk[35 + 2 * ib]]);
                let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
                let dt = if qh & 0x8000 != 0 { -DELTA } else { DELTA };
                for _ in 0..4 {
                    out.push((dl, dt));
                }
            }
        }
    }
}

/// LDLQ rows of IQ1_S / IQ1_M (module comment; the scales fixed by `iq`) into `out`.
pub(super) fn quantize_rows(ty: TensorType, rows: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    let imp = diag_over_mean(f);
    super::iq::quantize_rows(ty, rows, f, None, band, &imp, sweep_pass, out);
}

/// The sweep at the steps and shifts `out` holds: every 8 values' grid row (and IQ1_M's shift)
/// written into `out`.
fn sweep_pass(ty: TensorType, rows: &[f32], f: &Factor, band: usize, out: &mut [u8]) {
    let m = match ty {
        TensorType::IQ1S => false,
        TensorType::IQ1M => true,
        _ => panic!("{ty}: no IQ1 LDLQ"),
    };
    let g = grid();
    let n = f.n;
    let nr = rows.len() / n;
    let row_bytes = ty.bytes_for(n as u64).unwrap() as usize;
    let mut st = Vec::with_capacity(nr * n / 8);
    let mut tmp = Vec::new();
    for o in out.chunks_exact(row_bytes) {
        steps(m, o, &mut tmp);
        st.extend_from_slice(&tmp);
    }
    let wcol = col_weights(f);
    let mut x: Vec<f64> = rows.iter().map(|&v| v as f64).collect();
    let mut sel = vec![0u16; nr * n / 8];
    let mut neg = vec![false; nr * n / 8];
    sweep_groups::<8>(&mut x, n, f, band, |r, j, xr| {
        let at = r * n + j;
        let (dl, dt0) = st[at / 8];
        // IQ1_M stores a shift per 8 values: both are tried. IQ1_S shares one per 32: kept.
        let shifts: &[f32] = if m { &[DELTA, -DELTA] } else { &[dt0] };
        let mut best = (f64::MAX, 0usize, dt0);
        for &dt in shifts {
            let v = |l: i8| dl * ((l - 1) as f32 + dt);
            let err = |row: &[i8; 8]| -> f64 {
                (0..8)
                    .map(|i| {
                        let e = xr[j + i] - v(row[i]) as f64;
                        wcol[j + i] * e * e
                    })
                    .sum()
            };
            let mut l = [0i8; 8];
            for (i, li) in l.iter_mut().enumerate() {
                let x = xr[j + i];
                *li = (0..3i8)
                    .min_by(|&a, &b| {
                        let (ea, eb) = ((x - v(a) as f64).abs(), (x - v(b) as f64).abs());
                        ea.total_cmp(&eb)
                    })
                    .unwrap();
            }
            let cands: &[u16] = match g.find(&l) {
                Lookup::Row(r) => &[r as u16][..],
                Lookup::Near(nb) => nb,
            };
            for &c in cands {
                let e = err(&g.levels(c as usize));
                if e < best.0 {
                    best = (e, c as usize, dt);
                }
            }
        }
        let (_, row, dt) = best;
        sel[at / 8] = row as u16;
        neg[at / 8] = dt < 0.0;
        g.levels(row).map(|li| dl * ((li - 1) as f32 + dt))
    });
    for (r, o) in out.chunks_exact_mut(row_bytes).enumerate() {
        let bb = if m { 56 } else { 50 };
        for (blk, b) in o.chunks_exact_mut(bb).enumerate() {
            let t0 = (r * n + blk * 256) / 8;
            for tt in 0..32 {
                let s = sel[t0 + tt];
                if m {
                    b[tt] = (s & 255) as u8;
                    let h = &mut b[32 + tt / 2];
                    let sh = if tt % 2 == 0 { 0 } else { 4 };
                    *h = (*h & !(15 << sh)) | (((s >> 8) as u8) << sh);
                    if neg[t0 + tt] {
                        *h |= 8 << sh; // the shift's sign bit (0x08 / 0x80)
                    }
                } else {
                    b[2 + tt] = (s & 255) as u8;
                    let o2 = 34 + 2 * (tt / 4);
                    let mut qh = u16::from_le_bytes([b[o2], b[o2 + 1]]);
                    let sh = 3 * (tt % 4);
                    qh = (qh & !(7 << sh)) | ((s >> 8) << sh);
                    b[o2..o2 + 2].copy_from_slice(&qh.to_le_bytes());
                }
            }
        }
    }
}
