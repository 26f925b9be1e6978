//! The scale refit of the i-quant LDLQ kinds (IQ2_XXS / IQ2_XS / IQ2_S and IQ3_XXS / IQ3_S): the
//! sweeps (`iq_grid`, `iq_lattice`) round onto scales fixed before them by the
//! importance-weighted encoder; after a sweep the scales are refitted to the chosen grid points
//! under the full Hessian and the sweep runs again (the k-quants' `--ldlq-refit`, `stock.rs`).
//!
//! Every scale group `g` (32 values; 16 for IQ2_XS / IQ2_S) decodes as `step_g · c_t` with `c_t`
//! the grid value times its sign. With the codes fixed the decoded row is linear in the steps, so
//! `min (w − q) H (w − q)ᵀ` over the steps is the least-squares problem `(Cᵀ H C) a = Cᵀ H w`
//! (`normal::normal_equations_values`), solved for the whole row. The steps are then written in the
//! format's own form, `d · (α + β s)` with `d` the super-block's f16 scale and `s` a 4-bit
//! sub-scale ([`Form`]): for each super-block the `d` (from a few candidates for the largest
//! sub-scale, then refined) of least `Σ A_gg (a_g − â_g)²` under the normal matrix's diagonal.
//! A row keeps the new scales and codes only when its error `(w − q) H (w − q)ᵀ` under the damped
//! Hessian went down, so a refit never makes a row worse by the objective the sweep minimises.

use super::normal::{cholesky_solve, normal_equations_values, RefitH};
use super::Factor;
use crate::types::float::{f16_at, f16_bits_to_f32, f32_to_f16_bits};
use crate::types::TensorType;
use faer::Mat;

/// How a type forms each scale group's step: `d · (alpha + beta · s)`, `s` in 0..=15, over `gs`
/// values (llama.cpp's decoders: IQ3_XXS `d·(0.5+s)·0.5`, IQ3_S `d·(1+2s)`, IQ2 `d·(0.5+s)·0.25`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Form {
    pub gs: usize,
    pub alpha: f32,
    pub beta: f32,
}

pub(super) fn form(ty: TensorType) -> Option<Form> {
    let f = |gs, alpha, beta| Some(Form { gs, alpha, beta });
    match ty {
        TensorType::IQ3XXS => f(32, 0.25, 0.5),
        TensorType::IQ3S => f(32, 1.0, 2.0),
        TensorType::IQ2XXS => f(32, 0.125, 0.25),
        TensorType::IQ2XS | TensorType::IQ2S => f(16, 0.125, 0.25),
        _ => None,
    }
}

/// Byte and shift of scale group `k`'s 4-bit sub-scale in a block of `ty`.
fn sub_scale_at(ty: TensorType, k: usize) -> (usize, u32) {
    match ty {
        // The top nibble of each 32-group's u32 of signs (after the 64 grid bytes).
        TensorType::IQ3XXS => (66 + 4 * k + 3, 4),
        TensorType::IQ3S => (106 + k / 2, 4 * (k as u32 % 2)),
        // The top nibble of the second u32 of each 32-group's 8 bytes.
        TensorType::IQ2XXS => (2 + 8 * k + 7, 4),
        // The last 8 bytes: one per 32 values, low nibble first.
        _ => (ty.block_bytes() - 8 + k / 2, 4 * (k as u32 % 2)),
    }
}

fn sub_scale(ty: TensorType, b: &[u8], k: usize) -> u8 {
    let (i, sh) = sub_scale_at(ty, k);
    (b[i] >> sh) & 15
}

fn set_sub_scale(ty: TensorType, b: &mut [u8], k: usize, s: u8) {
    let (i, sh) = sub_scale_at(ty, k);
    b[i] = b[i] & !(15 << sh) | (s & 15) << sh;
}

/// Every scale group's step of `row` (encoded) as `d · (alpha + beta · s)`.
fn steps(ty: TensorType, fm: Form, row: &[u8], out: &mut Vec<f64>) {
    out.clear();
    let per = ty.block_size() / fm.gs;
    for b in row.chunks_exact(ty.block_bytes()) {
        let d = f16_at(b, 0) as f64;
        for k in 0..per {
            out.push(d * (fm.alpha as f64 + fm.beta as f64 * sub_scale(ty, b, k) as f64));
        }
    }
}

/// Per row, `(w − q) H (w − q)ᵀ` with `q` the decoded rows of `bytes` (one GEMM).
fn row_errors(ty: TensorType, rows: &[f32], bytes: &[u8], h: RefitH, n: usize) -> Vec<f64> {
    let nr = rows.len() / n;
    let mut q = vec![0f32; rows.len()];
    crate::types::dequantize_rows(ty, bytes, &mut q, n, "w").expect("the sweep's own blocks");
    let e = Mat::<f64>::from_fn(nr, n, |r, t| (rows[r * n + t] - q[r * n + t]) as f64);
    let mut eh = Mat::<f64>::zeros(nr, n);
    h.times(e.as_ref(), eh.as_mut());
    (0..nr)
        .map(|r| (0..n).map(|t| e[(r, t)] * eh[(r, t)]).sum())
        .collect()
}

/// Up to `f.refit` passes (none when the factor has no refit Hessian `rh`): refit the scales of
/// every row of `out` (encoded by `pass`, the kind's sweep at the scales the blocks hold), sweep
/// again, and keep a row's new blocks where its Hessian-weighted error went down (module comment).
pub(super) fn refit(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    rh: Option<RefitH>,
    band: usize,
    out: &mut [u8],
    pass: fn(TensorType, &[f32], &Factor, usize, &mut [u8]),
) {
    let (Some(h), Some(fm)) = (rh, form(ty)) else {
        return;
    };
    let n = f.n;
    let row_bytes = n / ty.block_size() * ty.block_bytes();
    let nr = rows.len() / n;
    let mut err = row_errors(ty, rows, out, h, n);
    let mut trial = out.to_vec();
    let mut q = vec![0f32; rows.len()];
    let mut st = Vec::new();
    for _ in 0..f.refit {
        // The codes as values: the decoded rows over their group's step.
        crate::types::dequantize_rows(ty, out, &mut q, n, "w").expect("the sweep's own blocks");
        let mut c = Mat::<f64>::zeros(nr, n);
        for r in 0..nr {
            steps(ty, fm, &out[r * row_bytes..(r + 1) * row_bytes], &mut st);
            for t in 0..n {
                let s = st[t / fm.gs];
                c[(r, t)] = if s > 0.0 {
                    q[r * n + t] as f64 / s
                } else {
                    0.0
                };
            }
        }
        let eqs = normal_equations_values(rows, h, &c, fm.gs, false);
        for (r, (a, b)) in eqs.into_iter().enumerate() {
            let o = &mut trial[r * row_bytes..(r + 1) * row_bytes];
            steps(ty, fm, o, &mut st);
            if let Some(p) = solve_steps(a, b, &st) {
                write_scales(ty, fm, &p, o);
            }
        }
        pass(ty, rows, f, band, &mut trial);
        let e2 = row_errors(ty, rows, &trial, h, n);
        let mut any = false;
        for r in 0..nr {
            let span = r * row_bytes..(r + 1) * row_bytes;
            if e2[r] < err[r] {
                any = true;
                err[r] = e2[r];
                out[span.clone()].copy_from_slice(&trial[span]);
            } else {
                trial[span.clone()].copy_from_slice(&out[span]);
            }
        }
        if !any {
            break;
        }
    }
}

/// The refitted steps of one row and the normal matrix's diagonal (each step's weight when the
/// steps are rounded to the format).
struct Steps {
    step: Vec<f64>,
    weight: Vec<f64>,
}

/// Solve the row's normal equations for its steps; a group the codes do not determine (all zero)
/// keeps its old step. `None` when the system is singular.
fn solve_steps(mut a: Vec<f64>, mut b: Vec<f64>, old: &[f64]) -> Option<Steps> {
    let np = b.len();
    let weight: Vec<f64> = (0..np).map(|p| a[p * np + p]).collect();
    let scale = weight.iter().copied().fold(0f64, f64::max);
    if scale <= 0.0 || !scale.is_finite() {
        return None;
    }
    for p in 0..np {
        if a[p * np + p] <= 1e-12 * scale {
            for k in 0..np {
                a[p * np + k] = 0.0;
                a[k * np + p] = 0.0;
            }
            a[p * np + p] = 1.0;
            b[p] = old[p];
        } else {
            a[p * np + p] *= 1.0 + 1e-9;
        }
    }
    let step = cholesky_solve(&mut a, &b, np)?;
    Some(Steps { step, weight })
}

/// Write steps `p.step` into the row's blocks `o` in the format's form (module comment), each
/// super-block choosing its `d` (f16) and 4-bit sub-scales of least `Σ w_g (a_g − â_g)²`.
fn write_scales(ty: TensorType, fm: Form, p: &Steps, o: &mut [u8]) {
    let per = ty.block_size() / fm.gs;
    let w = &p.weight;
    let (al, be) = (fm.alpha as f64, fm.beta as f64);
    for (blk, b) in o.chunks_exact_mut(ty.block_bytes()).enumerate() {
        let a = &p.step[blk * per..(blk + 1) * per];
        let wg = &w[blk * per..(blk + 1) * per];
        let amax = a.iter().copied().fold(0f64, f64::max);
        if amax <= 0.0 || !amax.is_finite() {
            continue;
        }
        // The sub-scales for a given d, and their cost.
        let fit = |d: f64| -> (f64, [u8; 16]) {
            let mut s = [0u8; 16];
            let mut cost = 0f64;
            for g in 0..per {
                let k = ((a[g] / d - al) / be).round().clamp(0.0, 15.0);
                s[g] = k as u8;
                let e = a[g] - d * (al + be * k);
                cost += wg[g] * e * e;
            }
            (cost, s)
        };
        let to_f16 = |d: f64| f16_bits_to_f32(f32_to_f16_bits(d as f32)) as f64;
        let mut best = (f64::INFINITY, 0f64, [0u8; 16]);
        for top in 8..=15 {
            let mut d = to_f16(amax / (al + be * top as f64));
            for _ in 0..2 {
                if d <= 0.0 {
                    break;
                }
                let (cost, s) = fit(d);
                if cost < best.0 {
                    best = (cost, d, s);
                }
                // The least-squares d for these sub-scales.
                let (mut num, mut den) = (0f64, 0f64);
                for g in 0..per {
                    let m = al + be * s[g] as f64;
                    num += wg[g] * a[g] * m;
                    den += wg[g] * m * m;
                }
                if den <= 0.0 {
                    break;
                }
                d = to_f16(num / den);
            }
        }
        if best.1 <= 0.0 {
            continue;
        }
        b[..2].copy_from_slice(&f32_to_f16_bits(best.1 as f32).to_le_bytes());
        for g in 0..per {
            set_sub_scale(ty, b, g, best.2[g]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{hessian, uniform_rows};
    use super::super::{factor_hessian_owned, proxy_loss, quantize_ldlq};
    use super::*;

    /// `--ldlq-refit 2` against no refit on correlated inputs, for every IQ2/IQ3 type, full band
    /// and band 64: other bytes (the scales moved), a lower calibration-weighted error, and the
    /// same bytes for 1 thread as for the pool.
    #[test]
    fn refit_lowers_the_hessian_error() {
        let (n, rows) = (512usize, 40usize);
        let h = hessian(n, 600, 5);
        let w: Vec<f32> = uniform_rows(rows * n, 9).iter().map(|v| v * 0.05).collect();
        for ty in [
            TensorType::IQ3XXS,
            TensorType::IQ3S,
            TensorType::IQ2XXS,
            TensorType::IQ2XS,
            TensorType::IQ2S,
        ] {
            let f0 = factor_hessian_owned(ty, h.clone(), n, 0.01, 0.0, 0, "w").unwrap();
            let f2 = factor_hessian_owned(ty, h.clone(), n, 0.01, 0.0, 2, "w").unwrap();
            assert!(
                f0.h.is_none() && f2.h.is_some(),
                "{ty}: Hessian kept for the refit only"
            );
            let loss = |b: &[u8]| {
                let mut q = vec![0f32; w.len()];
                crate::types::dequantize_rows(ty, b, &mut q, n, "w").unwrap();
                proxy_loss(&h, n, &w, &q)
            };
            for band in [0, 64] {
                let q0 = quantize_ldlq(ty, &w, n, &f0, band);
                let q2 = quantize_ldlq(ty, &w, n, &f2, band);
                assert_ne!(q0, q2, "{ty} band {band}: the refit changed nothing");
                let (l0, l2) = (loss(&q0), loss(&q2));
                eprintln!("{ty} band {band}: no refit {l0:.4e}, refit 2 {l2:.4e}");
                assert!(l2 < l0, "{ty} band {band}: refit {l2} vs {l0}");
                let one = rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .build()
                    .unwrap()
                    .install(|| quantize_ldlq(ty, &w, n, &f2, band));
                assert!(
                    one == q2,
                    "{ty} band {band}: bytes depend on the thread count"
                );
            }
        }
    }

    /// The sub-scale positions read back what the registry's decoder uses: setting scale group
    /// `k`'s sub-scale to `s` changes exactly the decoded values of that group, by the ratio
    /// `(alpha + beta s) / (alpha + beta s_old)`.
    #[test]
    fn sub_scales_are_where_the_decoder_reads_them() {
        use crate::types::iquants::QK_K;
        for ty in [
            TensorType::IQ3XXS,
            TensorType::IQ3S,
            TensorType::IQ2XXS,
            TensorType::IQ2XS,
            TensorType::IQ2S,
        ] {
            let fm = form(ty).unwrap();
            let x: Vec<f32> = (0..QK_K)
                .map(|i| ((i * 7919 % 251) as f32 / 125.0 - 1.0) * 0.1)
                .collect();
            let mut b = vec![0u8; ty.block_bytes()];
            crate::types::quantize(ty, &x, &mut b, "t").unwrap();
            let mut y0 = vec![0f32; QK_K];
            crate::types::dequantize(ty, &b, &mut y0, "t").unwrap();
            for k in 0..QK_K / fm.gs {
                let mut c = b.clone();
                let s0 = sub_scale(ty, &c, k);
                let s1 = (s0 + 5) % 16;
                set_sub_scale(ty, &mut c, k, s1);
                assert_eq!(sub_scale(ty, &c, k), s1);
                let mut y1 = vec![0f32; QK_K];
                crate::types::dequantize(ty, &c, &mut y1, "t").unwrap();
                let ratio = (fm.alpha + fm.beta * s1 as f32) / (fm.alpha + fm.beta * s0 as f32);
                for t in 0..QK_K {
                    if t / fm.gs == k {
                        assert!(
                            (y1[t] - y0[t] * ratio).abs() <= 1e-5 * y0[t].abs().max(1e-6),
                            "{ty} group {k} value {t}: {} vs {} · {ratio}",
                            y1[t],
                            y0[t]
                        );
                    } else {
                        assert_eq!(y1[t].to_bits(), y0[t].to_bits(), "{ty} group {k}: {t}");
                    }
                }
            }
        }
    }
}
