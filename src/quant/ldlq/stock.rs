//! LDLQ for the stock types (`TensorType::ldlq_unrotated`: q8_0, q4_0, q4_1, q5_0, q5_1,
//! q2_K … q6_K, iq4_nl, iq4_xs) in the weights' own basis: every block's grid fitted first
//! (`types::grid::fit`), the values rounded onto the fixed grids in act-order
//! (`Factor::perm`), then the block parameters refitted under the full Hessian ([`Refit`]).

use super::normal::{cholesky_solve, normal_equations_values, RefitH};
use super::sweep::sweep;
#[cfg(test)]
use super::sweep::sweep_scalar;
use super::Factor;
use crate::types::{grid, TensorType};
use faer::Mat;

/// Rows of a stock type (a group sharing the GEMM sweep), in the weights' own basis. Every block's
/// parameters are fitted first, to the original values weighted by the damped Hessian diagonal
/// (`types::grid::fit`, the same fit `--imatrix` uses), so every grid is fixed before the sweep;
/// then the values are rounded onto their block's grid in the factor's column order (`f.perm`:
/// decreasing Hessian diagonal, GPTQ's act-order, possible only because the grids are already
/// fixed), each error fed into the next `band` columns of that order. Measured on SmolLM2
/// (docs/bench/stock-ldlq.md): fitting each block when the sweep reaches it, in natural order, was no
/// better than importance-weighted round-to-nearest, and worse with the full band.
///
/// Then up to `refit` times: every row's block parameters are refitted to its rounded codes
/// ([`refit_params`]) and the sweep runs again on the new grids; a row keeps the new parameters
/// and codes only when its sweep loss `Σ e²` (with the full band exactly `(w − q) H (w − q)ᵀ`
/// under the damped Hessian) went down, so a refit never makes a row worse by that measure.
#[allow(clippy::too_many_arguments)]
pub(super) fn quantize_rows_stock(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    rh: Option<RefitH>,
    band: usize,
    refit: Refit,
    out: &mut [u8],
    mode: Mode,
) {
    let n = f.n;
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let row_bytes = n / bs * bb;
    let mut grids: Vec<Vec<grid::BlockGrid>> = rows
        .chunks_exact(n)
        .zip(out.chunks_exact_mut(row_bytes))
        .map(|(row, o)| fit_grids(ty, row, f, o))
        .collect();
    let (mut codes, mut loss) = stock_pass(ty, rows, f, band, &grids, mode);
    if let (Some(h), true) = (rh, refit.passes > 0) {
        let mut trial = out.to_vec();
        for _ in 0..refit.passes {
            let eqs: Vec<(Vec<f64>, Vec<f64>)> = match (refit.full, mode) {
                (true, Mode::Gemm) => normal_equations_rows(ty, rows, h, &codes, n),
                _ => rows
                    .chunks_exact(n)
                    .zip(codes.chunks_exact(n))
                    .map(|(row, c)| normal_equations_row(ty, row, h, c, refit.full))
                    .collect(),
            };
            let new: Vec<Vec<grid::BlockGrid>> = eqs
                .into_iter()
                .zip(trial.chunks_exact_mut(row_bytes))
                .zip(&grids)
                .map(|((eq, o), g)| refit_params(ty, n, eq, g, o))
                .collect();
            let (c2, l2) = stock_pass(ty, rows, f, band, &new, mode);
            let mut any = false;
            for (r, g) in new.into_iter().enumerate() {
                if l2[r] < loss[r] {
                    any = true;
                    loss[r] = l2[r];
                    grids[r] = g;
                    codes[r * n..(r + 1) * n].copy_from_slice(&c2[r * n..(r + 1) * n]);
                    out[r * row_bytes..(r + 1) * row_bytes]
                        .copy_from_slice(&trial[r * row_bytes..(r + 1) * row_bytes]);
                } else {
                    // Refit from the kept row next time (deterministic either way).
                    trial[r * row_bytes..(r + 1) * row_bytes]
                        .copy_from_slice(&out[r * row_bytes..(r + 1) * row_bytes]);
                }
            }
            if !any {
                break;
            }
        }
    }
    for (o, c) in out.chunks_exact_mut(bb).zip(codes.chunks_exact(bs)) {
        grid::pack(ty, c, o);
    }
}

/// How the stock rows are swept: [`sweep`] (GEMM), [`sweep_scalar`] (its reference), or one row
/// at a time by the plain GPTQ loop (the reference for the grouping, tests).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    Gemm,
    #[cfg(test)]
    Scalar,
    #[cfg(test)]
    OneRow,
}

/// Refitting the block parameters after the sweep ([`quantize_rows_stock`]): `passes` rounds,
/// each under the full damped Hessian (`full`) or its diagonal only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Refit {
    pub passes: usize,
    pub full: bool,
}

impl Refit {
    pub const NONE: Refit = Refit {
        passes: 0,
        full: true,
    };
    /// What `tq convert` does: two passes under the full Hessian. On SmolLM2 at llama.cpp's
    /// Q4_K_M types (docs/bench/stock-ldlq.md) the mean KLD went 0.02522 → 0.02513 (4 passes: 0.02496,
    /// the diagonal instead of the full Hessian: 0.02517) for 3.3× the LDLQ CPU time.
    pub const DEFAULT: Refit = Refit {
        passes: 2,
        full: true,
    };
}

/// One sweep of `rows` onto fixed `grids`: every row's codes (natural column order) and its sweep
/// loss `Σ e²`.
fn stock_pass(
    ty: TensorType,
    rows: &[f32],
    f: &Factor,
    band: usize,
    grids: &[Vec<grid::BlockGrid>],
    mode: Mode,
) -> (Vec<i32>, Vec<f64>) {
    let n = f.n;
    let bs = ty.block_size();
    let nr = rows.len() / n;
    let order = |t: usize| f.perm.as_ref().map_or(t, |p| p[t]);
    // x in the sweep's order.
    let mut x: Vec<f64> = rows
        .chunks_exact(n)
        .flat_map(|row| (0..n).map(move |t| row[order(t)] as f64))
        .collect();
    let mut codes = vec![0i32; nr * n];
    let round = |r: usize, t: usize, xr: &[f64]| {
        let j = order(t);
        let (g, i) = (&grids[r][j / bs], j % bs);
        let c = g.nearest(i, xr[t]);
        codes[r * n + j] = c;
        g.value(i, c) as f64
    };
    let loss = match mode {
        Mode::Gemm => sweep(&mut x, n, f, band, round),
        #[cfg(test)]
        Mode::Scalar => sweep_scalar(&mut x, n, f, band, round),
        #[cfg(test)]
        Mode::OneRow => {
            let mut round = round;
            let band = if band == 0 { n } else { band };
            let mut loss = vec![0f64; nr];
            for (r, xr) in x.chunks_exact_mut(n).enumerate() {
                let u = f.u_ref();
                for t in 0..n {
                    let q = round(r, t, xr);
                    let err = (xr[t] - q) / u.get(t * n + t);
                    loss[r] += err * err;
                    for k in t + 1..(t + 1 + band).min(n) {
                        xr[k] -= err * u.get(t * n + k);
                    }
                }
            }
            loss
        }
    };
    (codes, loss)
}

/// Every block of `row` fitted (its parameters written into `out`) under the damped Hessian
/// diagonal, and the grids the sweep rounds onto.
fn fit_grids(ty: TensorType, row: &[f32], f: &Factor, out: &mut [u8]) -> Vec<grid::BlockGrid> {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let mut grids: Vec<grid::BlockGrid> = (0..row.len() / bs)
        .map(|_| grid::BlockGrid::new(ty))
        .collect();
    let mut ws = vec![0f32; bs];
    for (blk, (o, g)) in out.chunks_exact_mut(bb).zip(grids.iter_mut()).enumerate() {
        let j0 = blk * bs;
        // Relative weights: normalized by the block's mean so f32 never over/underflows.
        let mean = f.diag[j0..j0 + bs].iter().sum::<f64>() / bs as f64;
        for i in 0..bs {
            ws[i] = if mean > 0.0 {
                (f.diag[j0 + i] / mean) as f32
            } else {
                1.0
            };
        }
        grid::fit(ty, &row[j0..j0 + bs], &ws, o, g);
    }
    grids
}

/// The block parameters of one row refitted to its codes: with the codes fixed, the decoded row
/// `q = D p` is linear in the group parameters `p` (each group's scale, and its min for the types
/// with one: `grid::has_min`), so `min_p (w − D p) H (w − D p)ᵀ` is the least-squares problem
/// `(Dᵀ H D) p = Dᵀ H w`, whose normal equations ([`normal_equations_row`],
/// [`normal_equations_rows`]) are solved jointly for the whole row (a Cholesky of groups³/3).
/// Then the stock format's own quantization of the parameters (`grid::set_params`) writes them
/// into `out` and gives the new grids. A group whose codes are all zero keeps its parameters; a
/// singular system keeps the old grids.
fn refit_params(
    ty: TensorType,
    n: usize,
    (mut a, mut rhs): (Vec<f64>, Vec<f64>),
    old: &[grid::BlockGrid],
    out: &mut [u8],
) -> Vec<grid::BlockGrid> {
    let (bs, bb, gs) = (ty.block_size(), ty.block_bytes(), grid::group_size(ty));
    let ng = n / gs;
    let hm = grid::has_min(ty);
    let np = rhs.len();
    // The current parameters: kept for groups the codes do not determine.
    let mut p0 = vec![0f64; np];
    for g in 0..ng {
        let (blk, i) = ((g * gs) / bs, (g * gs) % bs);
        p0[g] = old[blk].a[i] as f64;
        if hm {
            p0[ng + g] = old[blk].b[i] as f64;
        }
    }
    let scale = (0..np).map(|p| a[p * np + p]).fold(0f64, f64::max);
    if scale <= 0.0 || !scale.is_finite() {
        return old.to_vec();
    }
    for p in 0..np {
        if a[p * np + p] <= 1e-12 * scale {
            for q in 0..np {
                a[p * np + q] = 0.0;
                a[q * np + p] = 0.0;
            }
            a[p * np + p] = 1.0;
            rhs[p] = p0[p];
        } else {
            a[p * np + p] *= 1.0 + 1e-9;
        }
    }
    let Some(p) = cholesky_solve(&mut a, &rhs, np) else {
        return old.to_vec();
    };
    let mut grids: Vec<grid::BlockGrid> = (0..n / bs).map(|_| grid::BlockGrid::new(ty)).collect();
    let per = bs / gs;
    let (mut sc, mut mn) = (vec![0f32; per], vec![0f32; per]);
    for (blk, (o, g)) in out.chunks_exact_mut(bb).zip(grids.iter_mut()).enumerate() {
        for k in 0..per {
            let gi = blk * per + k;
            let (s, b) = (p[gi], if hm { p[ng + gi] } else { 0.0 });
            // q2_K/q4_K/q5_K store a scale and a min that are both >= 0 (q4_1/q5_1: any sign).
            let nn = grid::nonneg_params(ty);
            sc[k] = if nn { s.max(0.0) as f32 } else { s as f32 };
            mn[k] = if nn { b.max(0.0) as f32 } else { b as f32 };
        }
        grid::set_params(ty, &sc, &mn, o, g);
    }
    grids
}

/// The refit's normal equations `(Dᵀ H D, Dᵀ H w)` for one row with codes `c` (natural order):
/// parameters are every group's scale (`0..ng`), then for the types with a min (`grid::has_min`)
/// every group's min (`ng..2ng`), the decoded value being `scale·c − min`. Under the full Hessian
/// (`full`, n² multiply-adds) or its diagonal. The reference [`normal_equations_rows`] is held to.
fn normal_equations_row(
    ty: TensorType,
    row: &[f32],
    h: RefitH,
    c: &[i32],
    full: bool,
) -> (Vec<f64>, Vec<f64>) {
    let n = row.len();
    let gs = grid::group_size(ty);
    let ng = n / gs;
    let hm = grid::has_min(ty);
    let np = if hm { 2 * ng } else { ng };
    let cf: Vec<f64> = c.iter().map(|&v| grid::code_value(ty, v)).collect();
    let mut a = vec![0f64; np * np];
    let mut rhs = vec![0f64; np];
    let (mut m, mut nn) = (vec![0f64; ng], vec![0f64; ng]);
    for t in 0..n {
        let gt = t / gs;
        let hrow = h.rows(t, t + 1);
        let mut hx = 0f64;
        if full {
            for g in 0..ng {
                let (mut sm, mut sn) = (0f64, 0f64);
                for k in g * gs..(g + 1) * gs {
                    sm += hrow[k] * cf[k];
                    sn += hrow[k];
                }
                m[g] = sm;
                nn[g] = sn;
            }
            for (k, &hv) in hrow.iter().enumerate() {
                hx += hv * row[k] as f64;
            }
        } else {
            m.fill(0.0);
            nn.fill(0.0);
            m[gt] = hrow[t] * cf[t];
            nn[gt] = hrow[t];
            hx = hrow[t] * row[t] as f64;
        }
        let ct = cf[t];
        for g in 0..ng {
            a[gt * np + g] += ct * m[g];
            if hm {
                a[gt * np + ng + g] -= ct * nn[g];
                a[(ng + gt) * np + g] -= m[g];
                a[(ng + gt) * np + ng + g] += nn[g];
            }
        }
        rhs[gt] += ct * hx;
        if hm {
            rhs[ng + gt] -= hx;
        }
    }
    (a, rhs)
}

/// [`normal_equations_row`] (full Hessian) for a group of rows as GEMMs: `H W` once, and for
/// each group `g` the products `H D_g` of every row's group-`g` codes (`(rows × gs)·(gs × n)`),
/// reduced per row. n²·rows multiply-adds like the scalar loops, at GEMM speed.
fn normal_equations_rows(
    ty: TensorType,
    rows: &[f32],
    h: RefitH,
    codes: &[i32],
    n: usize,
) -> Vec<(Vec<f64>, Vec<f64>)> {
    let nr = rows.len() / n;
    let c = Mat::<f64>::from_fn(nr, n, |r, t| grid::code_value(ty, codes[r * n + t]));
    normal_equations_values(rows, h, &c, grid::group_size(ty), grid::has_min(ty))
}

/// The one-row sweep of a stock type (the plain GPTQ loop, refit included), kept as the reference
/// [`quantize_rows_stock`] is held to.
#[cfg(test)]
pub(super) fn quantize_row_stock(
    ty: TensorType,
    row: &[f32],
    f: &Factor,
    band: usize,
    refit: Refit,
    out: &mut [u8],
) {
    quantize_rows_stock(
        ty,
        row,
        f,
        f.refit_hessian(None),
        band,
        refit,
        out,
        Mode::OneRow,
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_sweeps_agree, hessian, lcg, uniform_rows};
    use super::super::{factor_act_order, proxy_loss, quantize_ldlq, quantize_ldlq_refit, ROWS};
    use super::*;

    /// Stock types: LDLQ in the weights' own basis writes ordinary blocks (decoded by the
    /// registry's stock decoders) with a lower Hessian-weighted error than round-to-nearest, and
    /// lower than importance-weighted round-to-nearest (the `--imatrix` path, diagonal only).
    #[test]
    fn stock_ldlq_beats_rtn_on_correlated_inputs() {
        use TensorType::*;
        let n = 256;
        let rows = 24;
        let h = hessian(n, 400, 7);
        let mut s = 11;
        let w: Vec<f32> = (0..rows * n).map(|_| lcg(&mut s) as f32 * 0.05).collect();
        for ty in [Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q5K, Q6K, IQ4NL, IQ4XS] {
            let f = factor_act_order(h.clone(), n, 0.01, Refit::DEFAULT.passes, "w").unwrap();
            let bytes = ty.bytes_for(w.len() as u64).unwrap() as usize;
            let dec = |b: &[u8]| {
                let mut q = vec![0f32; w.len()];
                crate::types::dequantize(ty, b, &mut q, "w").unwrap();
                q
            };
            let mut rtn = vec![0u8; bytes];
            crate::types::quantize(ty, &w, &mut rtn, "w").unwrap();
            let mut wrtn = vec![0u8; bytes];
            let imp: Vec<f32> = (0..w.len()).map(|i| f.diag[i % n] as f32).collect();
            grid::quantize_weighted(ty, &w, &imp, &mut wrtn);
            let q = quantize_ldlq(ty, &w, n, &f, 0);
            assert_eq!(q.len(), bytes);
            let (l_rtn, l_w, l_q) = (
                proxy_loss(&h, n, &w, &dec(&rtn)),
                proxy_loss(&h, n, &w, &dec(&wrtn)),
                proxy_loss(&h, n, &w, &dec(&q)),
            );
            eprintln!("{ty}: proxy loss rtn {l_rtn:.3e} weighted {l_w:.3e} ldlq {l_q:.3e}");
            assert!(
                l_q < 0.8 * l_rtn && l_q < 0.8 * l_w,
                "{ty}: {l_q} vs {l_rtn} / {l_w}"
            );
        }
    }

    #[test]
    fn stock_ldlq_is_deterministic_across_thread_counts() {
        let n = 512;
        let h = hessian(n, 60, 3);
        let mut s = 4;
        let w: Vec<f32> = (0..12 * n).map(|_| lcg(&mut s) as f32).collect();
        let f = factor_act_order(h.clone(), n, 0.01, Refit::DEFAULT.passes, "w").unwrap();
        for ty in [
            TensorType::Q4K,
            TensorType::Q5_0,
            TensorType::Q5_1,
            TensorType::IQ4XS,
        ] {
            let run = |t: usize| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .unwrap()
                    .install(|| quantize_ldlq(ty, &w, n, &f, 64))
            };
            assert_eq!(run(1), run(3), "{ty}");
        }
    }

    /// The stock types' grouped sweep: the scalar group sweep equals one-row sweeps bit for bit,
    /// and the GEMM sweep agrees on nearly all bytes with the same calibration-weighted error.
    #[test]
    fn stock_gemm_sweep_matches_one_row_sweeps() {
        let (n, rows) = (512usize, 37usize);
        let h = hessian(n, 700, 5);
        let w = uniform_rows(rows * n, 9);
        let f = factor_act_order(h.clone(), n, 0.01, Refit::DEFAULT.passes, "w").unwrap();
        for ty in [
            TensorType::Q4_0,
            TensorType::Q8_0,
            TensorType::Q4_1,
            TensorType::Q5_1,
            TensorType::Q2K,
            TensorType::Q3K,
            TensorType::Q4K,
            TensorType::Q6K,
            TensorType::IQ4NL,
            TensorType::IQ4XS,
        ] {
            let rb = n / ty.block_size() * ty.block_bytes();
            let refit2 = Refit {
                passes: 2,
                full: true,
            };
            for (band, refit) in [(0, Refit::NONE), (7, Refit::NONE), (200, Refit::NONE)]
                .into_iter()
                .chain([(0, refit2), (200, refit2)])
            {
                let got = quantize_ldlq_refit(ty, &w, n, &f, band, refit);
                let mut one = vec![0u8; rows * rb];
                for (o, row) in one.chunks_mut(rb).zip(w.chunks(n)) {
                    quantize_row_stock(ty, row, &f, band, refit, o);
                }
                let mut scalar = vec![0u8; rows * rb];
                for (o, rws) in scalar.chunks_mut(rb * ROWS).zip(w.chunks(n * ROWS)) {
                    quantize_rows_stock(
                        ty,
                        rws,
                        &f,
                        f.refit_hessian(None),
                        band,
                        refit,
                        o,
                        Mode::Scalar,
                    );
                }
                assert_sweeps_agree(ty, band, &h, &w, &got, &scalar, &one);
            }
        }
    }

    /// The refit's normal equations as GEMMs equal the scalar loops (to f64 rounding), for a
    /// symmetric type, q6_K's 16-value groups, q4_K's scales and mins, and the iq4 table codes.
    #[test]
    fn refit_normal_equations_gemm_match_the_scalar_loops() {
        let (n, rows) = (512usize, 5usize);
        let h = hessian(n, 700, 8);
        let w = uniform_rows(rows * n, 3);
        for ty in [
            TensorType::Q5_0,
            TensorType::Q6K,
            TensorType::Q4K,
            TensorType::Q5_1,
            TensorType::IQ4NL,
            TensorType::IQ4XS,
        ] {
            let g = grid::BlockGrid::new(ty);
            let mut s = 11u64;
            let codes: Vec<i32> = (0..rows * n)
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(7);
                    g.lo + ((s >> 33) % (g.hi - g.lo + 1) as u64) as i32
                })
                .collect();
            let hr = RefitH::Whole { n, m: &h };
            let fast = normal_equations_rows(ty, &w, hr, &codes, n);
            for (r, (fa, fr)) in fast.iter().enumerate() {
                let (sa, sr) =
                    normal_equations_row(ty, &w[r * n..][..n], hr, &codes[r * n..][..n], true);
                let m = sa.iter().fold(0f64, |a, v| a.max(v.abs()));
                let mr = sr.iter().fold(0f64, |a, v| a.max(v.abs()));
                for (x, y) in fa.iter().zip(&sa) {
                    assert!((x - y).abs() <= 1e-10 * m, "{ty} row {r}: A {x} vs {y}");
                }
                for (x, y) in fr.iter().zip(&sr) {
                    assert!((x - y).abs() <= 1e-10 * mr, "{ty} row {r}: rhs {x} vs {y}");
                }
            }
        }
    }

    /// `--ldlq-refit N` reaches the sweep through the factor: N passes as asked, and with 0 the
    /// factor keeps no Hessian copy and writes the plain sweep's bytes.
    #[test]
    fn factor_carries_the_refit_passes() {
        let (n, rows) = (256usize, 8usize);
        let h = hessian(n, 500, 3);
        let w = uniform_rows(rows * n, 4);
        let ty = TensorType::Q4K;
        let f2 = factor_act_order(h.clone(), n, 0.01, 2, "w").unwrap();
        let f0 = factor_act_order(h.clone(), n, 0.01, 0, "w").unwrap();
        let f1 = factor_act_order(h, n, 0.01, 1, "w").unwrap();
        assert!(f0.h.is_none() && f1.h.is_some() && f2.h.is_some());
        assert_eq!(f0.u, f2.u, "the factor itself does not depend on the refit");
        let plain = quantize_ldlq_refit(ty, &w, n, &f2, 0, Refit::NONE);
        assert_eq!(quantize_ldlq(ty, &w, n, &f0, 0), plain);
        let two = quantize_ldlq(ty, &w, n, &f2, 0);
        assert_eq!(two, quantize_ldlq_refit(ty, &w, n, &f2, 0, Refit::DEFAULT));
        let one = quantize_ldlq(ty, &w, n, &f1, 0);
        let r1 = Refit {
            passes: 1,
            full: true,
        };
        assert_eq!(one, quantize_ldlq_refit(ty, &w, n, &f2, 0, r1));
        assert_ne!(
            two, plain,
            "the refit changed nothing on these rows: the test is vacuous"
        );
    }

    /// Refitting the block parameters to the rounded codes never raises the calibration loss
    /// under the damped Hessian (a row keeps a refit only when its loss falls), lowers it for
    /// every type, keeps the bytes' size, and does not depend on the thread count.
    #[test]
    fn refit_lowers_the_damped_loss_deterministically() {
        let (n, rows) = (512usize, 40usize);
        let h = hessian(n, 900, 12);
        let w = uniform_rows(rows * n, 21);
        let f = factor_act_order(h, n, 0.01, Refit::DEFAULT.passes, "w").unwrap();
        let hd = f.kept_hessian().unwrap().to_vec();
        for ty in [
            TensorType::Q4_0,
            TensorType::Q5_0,
            TensorType::Q8_0,
            TensorType::Q4_1,
            TensorType::Q5_1,
            TensorType::Q2K,
            TensorType::Q3K,
            TensorType::Q4K,
            TensorType::Q5K,
            TensorType::Q6K,
            TensorType::IQ4NL,
            TensorType::IQ4XS,
        ] {
            let loss = |b: &[u8]| {
                let mut q = vec![0f32; w.len()];
                crate::types::dequantize_rows(ty, b, &mut q, n, "w").unwrap();
                proxy_loss(&hd, n, &w, &q)
            };
            let base = quantize_ldlq_refit(ty, &w, n, &f, 0, Refit::NONE);
            let r = Refit {
                passes: 2,
                full: true,
            };
            let re = quantize_ldlq_refit(ty, &w, n, &f, 0, r);
            assert_eq!(re.len(), base.len());
            let (lb, lr) = (loss(&base), loss(&re));
            assert!(lr < lb, "{ty}: refit {lr} vs {lb}");
            let one = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap()
                .install(|| quantize_ldlq_refit(ty, &w, n, &f, 0, r));
            assert!(one == re, "{ty}: bytes depend on the thread count");
        }
    }
}
