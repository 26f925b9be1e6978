//! Sensitivity of one tensor to each candidate type: the weighted error `Σ_rows Δw H Δwᵀ` of the
//! tensor alone (`Δw` = decoded − original row), on a fixed subsample of rows, quantized exactly
//! as `tq convert` would (LDLQ with the Hessian's factor for types that have it, the imatrix's
//! weighted block fit, or round-to-nearest). `tq convert --target-bpw` maps these to a predicted
//! KLD and solves the knapsack (`plan::mix`).

use super::ldlq::Factor;
use super::Hessian;
use crate::error::Result;
use crate::types::TensorType;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

/// How errors are weighted, and with it how the convert path quantizes.
pub(crate) enum Weighting<'a> {
    /// The calibration Hessian `Σ x xᵀ`: full `Δ H Δᵀ` (per token), LDLQ where the type has it.
    Hessian {
        h: &'a Hessian,
        /// As convert: the plan's settings.
        ldlq: super::LdlqSettings,
    },
    /// An imatrix's per-column importance: `Σ_j imp_j Δ_j²`, weighted block fit for grid types.
    Diagonal(&'a [f32]),
    /// No calibration: plain squared error, round-to-nearest.
    Identity,
    /// `Δ H Δᵀ` (per token) of round-to-nearest: what convert does with an expert whose Hessian
    /// saw too few tokens for LDLQ.
    HessianRtn(&'a Hessian),
}

/// One candidate's estimate for the whole tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// Estimated `Σ` over all rows (the sample's mean × rows).
    pub err: f64,
    /// Standard error of `err` from the row sample (0 when every row was used).
    pub se: f64,
}

/// Row length up to which `--mix-rows N` samples N rows of a tensor ([`rows_for`]).
pub(crate) const ROW_ELEMENTS: usize = 4096;

/// The fewest rows sampled from a tensor with rows longer than [`ROW_ELEMENTS`].
pub(crate) const MIN_ROWS: usize = 16;

/// Rows to sample from a tensor whose rows have `n` elements, for `--mix-rows sample`: `sample`
/// rows of up to [`ROW_ELEMENTS`] elements; longer rows fewer, in proportion (the same
/// elements, `sample × 4096`), at least [`MIN_ROWS`] and never more than `sample`. A row's
/// error sums its elements' errors, so a longer row's error varies less from row to row
/// and the estimate's relative standard error stays about the same with fewer rows, while each
/// sampled row costs LDLQ `n²` per candidate type (a 7B `ffn_down`, 11,008 wide: 24 rows, not 64,
/// 2.7× less of the sensitivity pass's largest item). Models up to 4096 wide sample as before.
pub(crate) fn rows_for(sample: usize, n: usize) -> usize {
    if n <= ROW_ELEMENTS {
        return sample;
    }
    (sample * ROW_ELEMENTS)
        .div_ceil(n)
        .max(MIN_ROWS)
        .min(sample)
}

/// The rows sampled from a tensor of `n_rows` rows: `k` evenly spaced (all when `k ≥ n_rows`).
pub(crate) fn sample_rows(n_rows: u64, k: usize) -> Vec<u64> {
    let k = (k as u64).min(n_rows);
    (0..k).map(|j| (2 * j + 1) * n_rows / (2 * k)).collect()
}

/// LDLQ factors by type family for the Hessian being measured (the caller clears it when the
/// Hessian changes).
pub(crate) type Factors = HashMap<String, Arc<Factor>>;

/// Rows of a tensor's sample (at most) that the sensitivity quantizes with the type's LDLQ
/// encoder, as convert would, for the ratio estimate of [`errors`] (`--mix-exact-rows`).
pub const EXACT_ROWS: usize = 8;

/// How a tensor's rows are sampled: `rows` per tensor (`--mix-rows`, [`rows_for`]), of which
/// `exact` (`--mix-exact-rows`, [`rows_for`] too) are quantized with LDLQ; `exact ≥ rows`: every
/// sampled row is (the estimate before the ratio estimate existed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub rows: usize,
    pub exact: usize,
}

impl Sample {
    /// Every sampled row quantized with LDLQ.
    pub fn all(rows: usize) -> Sample {
        Sample { rows, exact: rows }
    }
}

/// Errors of `rows` (`k × n`, sampled from a tensor of `n_rows` rows) for each of `types`.
/// Deterministic: per-row errors are computed in parallel and summed in row order.
///
/// A type quantized with LDLQ in the weights' own basis (stock, i-quants) is measured with LDLQ
/// on `exact` evenly spaced rows of the `k` only, when `exact < k`, and estimated by the ratio
/// estimator `Σ_k proxy × Σ_exact err / Σ_exact proxy`. The proxy is LDLQ's error to first order
/// (OPTQ): `Σ_j D_jj e_j²`, `D` the LDL diagonal of the damped Hessian in the sweep's order
/// (`1 / U_jj²` of the type's own factor) and `e` the error of the importance-weighted
/// round-to-nearest encoder (the damped diagonal as importance): no sweep, no refit. The ratio
/// corrects the proxy's bias per (tensor, type) — LDLQ's gain over rounding depends on the grid
/// and the Hessian — and the proxy carries the row-to-row spread, so few exact rows suffice.
#[allow(clippy::too_many_arguments)]
pub(crate) fn errors(
    name: &str,
    rows: &[f32],
    n: usize,
    n_rows: u64,
    types: &[TensorType],
    w: &Weighting,
    factors: &mut Factors,
    exact: usize,
) -> Result<Vec<Estimate>> {
    errors_holding(
        name,
        rows,
        n,
        n_rows,
        types,
        w,
        factors,
        exact,
        HOLD_ONE_FACTOR_ABOVE,
    )
}

/// [`errors`], holding one factor at a time in `factors` when the Hessian is wider than
/// `hold_one_above`.
#[allow(clippy::too_many_arguments)]
fn errors_holding(
    name: &str,
    rows: &[f32],
    n: usize,
    n_rows: u64,
    types: &[TensorType],
    w: &Weighting,
    factors: &mut Factors,
    exact: usize,
    hold_one_above: usize,
) -> Result<Vec<Estimate>> {
    let k = rows.len() / n.max(1);
    // The rows measured exactly for the ratio estimate (indices into the sample).
    let sub: Vec<usize> = sample_rows(k as u64, exact)
        .into_iter()
        .map(|r| r as usize)
        .collect();
    let sub_rows: Vec<f32> = sub
        .iter()
        .flat_map(|&r| rows[r * n..(r + 1) * n].iter().copied())
        .collect();
    // Types that share a factor run together, so that a wide Hessian's factor can be dropped
    // before the next is built ([`encode`]) without being built twice; the results go back in
    // `types`' order and do not depend on it (each type's bytes depend only on its factor).
    let mut order: Vec<usize> = (0..types.len()).collect();
    order.sort_by_key(|&i| factor_key(types[i], w));
    let mut decoded = vec![Vec::new(); types.len()];
    // The proxy's decoded rows and the factor's `D` per type measured by the ratio estimate.
    let mut ratio: Vec<Option<(Vec<f32>, Vec<f64>)>> = vec![None; types.len()];
    for i in order {
        let key = factor_key(types[i], w);
        let proxied = sub.len() < k && key.is_some() && proxy_basis(types[i]);
        if !proxied {
            decoded[i] = roundtrip(name, rows, n, types[i], w, factors, hold_one_above)?;
            continue;
        }
        decoded[i] = roundtrip(name, &sub_rows, n, types[i], w, factors, hold_one_above)?;
        let f = key
            .and_then(|k| factors.get(&k).cloned())
            .ok_or_else(|| crate::error::Error::internal("sensitivity: a factor went missing"))?;
        let d = ldl_diagonal(&f)
            .ok_or_else(|| crate::error::Error::internal("sensitivity: a factor without U"))?;
        let imp: Vec<f32> = f.diag.iter().map(|&d| d as f32).collect();
        let enc = super::Encoder::choose(types[i], None, Some(&imp));
        let bytes = super::encode_rows(types[i], name, rows, n, &enc)?;
        let mut q = vec![0f32; rows.len()];
        super::decode_rows(types[i], &bytes, &mut q, n, name)?;
        ratio[i] = Some((q, d));
    }
    // One type per task, each product single-threaded: the sums do not depend on the pool.
    let tokens = match w {
        Weighting::Hessian { h, .. } => h.tokens.max(1) as f64,
        _ => 1.0,
    };
    Ok((0..types.len())
        .into_par_iter()
        .map(|i| match &ratio[i] {
            Some((q, d)) => {
                let proxy: Vec<f64> = rows
                    .chunks(n)
                    .zip(q.chunks(n))
                    .map(|(a, b)| proxy_error(a, b, d) / tokens)
                    .collect();
                let exact_err = row_errors(&sub_rows, &decoded[i], n, w);
                let sub_proxy: Vec<f64> = sub.iter().map(|&r| proxy[r]).collect();
                ratio_estimate(&proxy, &exact_err, &sub_proxy, n_rows)
            }
            None => estimate(&row_errors(rows, &decoded[i], n, w), n_rows, k),
        })
        .collect::<Vec<_>>())
}

/// The sweep's LDL diagonal `D_jj = 1 / U_jj²` by natural column: what rounding column `j` by
/// `e` costs LDLQ (`Σ_j D_jj e_j²` is its loss). None for a factor without `U`.
fn ldl_diagonal(f: &super::ldlq::Factor) -> Option<Vec<f64>> {
    let n = f.n;
    let uf = f.u_ref();
    if uf.len() != n * n {
        return None;
    }
    let mut d = vec![0f64; n];
    for i in 0..n {
        let u = uf.get(i * n + i);
        let col = f.perm.as_ref().map_or(i, |p| p[i]);
        d[col] = 1.0 / (u * u);
    }
    Some(d)
}

/// `Σ_j d_j (b_j − a_j)²` for one row.
fn proxy_error(a: &[f32], b: &[f32], d: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .zip(d)
        .map(|((x, y), dj)| {
            let e = (*y - *x) as f64;
            dj * e * e
        })
        .sum()
}

/// Types whose LDLQ runs in the weights' own basis, so that a rounding error per weight and the
/// factor's `D` line up column by column (stock act-order, the i-quants' natural order).
fn proxy_basis(ty: TensorType) -> bool {
    matches!(
        ty.ldlq(),
        Some(
            crate::types::LdlqKind::Stock
                | crate::types::LdlqKind::Lattice
                | crate::types::LdlqKind::IqGrid
        )
    )
}

/// The ratio estimate of a tensor's error: the `k` sampled rows' proxies `proxy` scaled to the
/// tensor (`n_rows / k`) times `Σ exact / Σ sub_proxy` over the rows measured exactly, with the
/// ratio estimator's standard error (residuals `exact − R · proxy`, finite-population
/// corrected). A proxy of 0 on every exact row falls back to the exact rows' mean.
pub(crate) fn ratio_estimate(
    proxy: &[f64],
    exact: &[f64],
    sub_proxy: &[f64],
    n_rows: u64,
) -> Estimate {
    let (k, m) = (proxy.len(), exact.len());
    let sp: f64 = sub_proxy.iter().sum();
    let se_: f64 = exact.iter().sum();
    if k == 0 || m == 0 || sp <= 0.0 || !sp.is_finite() {
        return estimate(exact, n_rows, m);
    }
    let r = se_ / sp;
    let nf = n_rows as f64;
    let err = r * proxy.iter().sum::<f64>() / k as f64 * nf;
    let var = if m > 1 {
        exact
            .iter()
            .zip(sub_proxy)
            .map(|(e, p)| (e - r * p).powi(2))
            .sum::<f64>()
            / (m as f64 - 1.0)
    } else {
        0.0
    };
    let fpc = (1.0 - m as f64 / nf).max(0.0);
    Estimate {
        err,
        se: nf * (var / m as f64 * fpc).sqrt(),
    }
}

/// Per-row errors of `q` against `a` (`k × n`): `Δ H Δᵀ` as one product `(Δ H) ∘ Δ` summed by
/// row (faer, sequential), the diagonal forms directly. Same values as [`row_error`] (tested).
pub(crate) fn row_errors(a: &[f32], q: &[f32], n: usize, w: &Weighting) -> Vec<f64> {
    let (Weighting::Hessian { h, .. } | Weighting::HessianRtn(h)) = w else {
        return a
            .chunks(n)
            .zip(q.chunks(n))
            .map(|(x, y)| row_error(x, y, w))
            .collect();
    };
    use faer::{Accum, Mat, MatRef, Par};
    let k = a.len() / n.max(1);
    let d: Vec<f64> = a.iter().zip(q).map(|(x, y)| (*y - *x) as f64).collect();
    let dm = MatRef::from_row_major_slice(&d, k, n);
    let hm = MatRef::from_row_major_slice(&h.h, n, n);
    let mut m = Mat::<f64>::zeros(k, n);
    faer::linalg::matmul::matmul(m.as_mut(), Accum::Replace, dm, hm, 1.0, Par::Seq);
    let t = h.tokens.max(1) as f64;
    (0..k)
        .map(|r| (0..n).map(|j| m[(r, j)] * d[r * n + j]).sum::<f64>() / t)
        .collect()
}

/// Scale a sample's per-row errors to the tensor, with the standard error of that estimate
/// (finite-population corrected).
pub(crate) fn estimate(per_row: &[f64], n_rows: u64, k: usize) -> Estimate {
    if k == 0 {
        return Estimate { err: 0.0, se: 0.0 };
    }
    let kf = k as f64;
    let mean = per_row.iter().sum::<f64>() / kf;
    let var = if k > 1 {
        per_row.iter().map(|e| (e - mean) * (e - mean)).sum::<f64>() / (kf - 1.0)
    } else {
        0.0
    };
    let nf = n_rows as f64;
    let fpc = (1.0 - kf / nf).max(0.0);
    Estimate {
        err: mean * nf,
        se: nf * (var / kf * fpc).sqrt(),
    }
}

/// Quantize and decode `rows` as convert would write them.
fn roundtrip(
    name: &str,
    rows: &[f32],
    n: usize,
    ty: TensorType,
    w: &Weighting,
    factors: &mut Factors,
    hold_one_above: usize,
) -> Result<Vec<f32>> {
    let bytes = encode_holding(name, rows, n, ty, w, factors, hold_one_above)?;
    let mut q = vec![0f32; rows.len()];
    super::decode_rows(ty, &bytes, &mut q, n, name)?;
    Ok(q)
}

/// Above this Hessian width the factor cache holds one factor at a time (a 28,672-wide factor
/// is 6.6 GB per f64 matrix); below it, every key's factor stays while the Hessian is live, for
/// the other tensors of its group.
const HOLD_ONE_FACTOR_ABOVE: usize = 16_384;

/// The factor `ty` is quantized with under `w`, as a cache key: `None` where no factor is used.
/// Act-order for the stock grids; per family otherwise (IQ2: natural order). What else makes a
/// factor differ by type is in the key: its damping and shrinkage, and whether it carries the
/// damped Hessian for the scale refit (`ldlq::keeps_refit_hessian`: every IQ2/IQ3 type under
/// `--ldlq-refit` > 0, never IQ1_S/IQ1_M), so IQ2_XXS never reuses IQ1_S's factor, which has no
/// refit.
fn factor_key(ty: TensorType, w: &Weighting) -> Option<String> {
    let Weighting::Hessian { ldlq, .. } = w else {
        return None;
    };
    ldlq_factor_key(ty, ldlq)
}

/// [`factor_key`] under a Hessian with LDLQ settings `ldlq`: types with the same key share a
/// factor (callers order their encodings by it, so that a wide factor is built once).
pub(crate) fn ldlq_factor_key(ty: TensorType, ldlq: &super::LdlqSettings) -> Option<String> {
    if !ty.has_ldlq() {
        return None;
    }
    let refits = super::ldlq::keeps_refit_hessian(ty, ldlq.refit);
    Some(format!(
        "{} damp {} shrink {} refit {refits}",
        if ty.ldlq_unrotated() {
            "act-order".to_string()
        } else {
            format!("{:?}", ty.family())
        },
        ldlq.damp_for(ty),
        ldlq.shrink_for(ty)
    ))
}

/// Whether `ty` is measured with an LDLQ factor under `w`: the measurements whose cost grows with
/// the Hessian's width cubed (the factor) and its square per row (the sweep).
pub(crate) fn uses_factor(ty: TensorType, w: &Weighting) -> bool {
    factor_key(ty, w).is_some()
}

/// The column width of [`chunked_ldlq`]'s diagonal blocks for rows of `n` under `types`: the
/// widest divisor of `n` up to `target` that is a multiple of every type's block (a k-quant's
/// 256, a legacy type's 32); `n` itself when none is.
pub(crate) fn chunk_width(n: usize, types: &[TensorType], target: usize) -> usize {
    let unit = types
        .iter()
        .map(|t| t.block_size())
        .max()
        .unwrap_or(1)
        .max(1);
    (1..=target.min(n) / unit)
        .rev()
        .map(|m| m * unit)
        .find(|b| n.is_multiple_of(*b))
        .unwrap_or(n)
}

/// A cheap stand-in for [`errors`] of the types measured with a factor, for the blocks the
/// sensitivity does not measure with LDLQ (`plan::mix::ExactBlocks`): the Hessian cut to its
/// diagonal blocks of `b` columns ([`chunk_width`]), each block of the sampled rows quantized
/// with LDLQ under its own block (every factor key, refits and act order as convert has them;
/// `exact` rows of them, the rest by [`errors`]' ratio estimate) and scored under it. The
/// cross-block part of LDLQ's feedback and of the error is dropped, so it is biased against the
/// whole-Hessian measurement; the caller corrects the bias with the ratio of the two on the same
/// tensor kind where both are measured. Cost per type:
/// factors of `n/b` blocks of `b²` and a sweep of `k·n·b`, where [`errors`] costs one
/// factorization of `n²` per factor key and `k·n²` per type. Deterministic (as [`errors`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunked_ldlq(
    name: &str,
    rows: &[f32],
    n: usize,
    n_rows: u64,
    types: &[TensorType],
    h: &Hessian,
    ldlq: super::LdlqSettings,
    b: usize,
    exact: usize,
) -> Result<Vec<f64>> {
    let k = rows.len() / n.max(1);
    let mut sum = vec![0f64; types.len()];
    if k == 0 || h.n != n || !n.is_multiple_of(b) {
        return Ok(sum);
    }
    for c in (0..n).step_by(b) {
        let mut sub = Hessian {
            tensors: h.tensors.clone(),
            n: b,
            h: vec![0f64; b * b],
            tokens: h.tokens,
        };
        for i in 0..b {
            sub.h[i * b..(i + 1) * b].copy_from_slice(&h.h[(c + i) * n + c..(c + i) * n + c + b]);
        }
        let part: Vec<f32> = rows
            .chunks(n)
            .flat_map(|r| r[c..c + b].iter().copied())
            .collect();
        let w = Weighting::Hessian { h: &sub, ldlq };
        let est = errors(
            name,
            &part,
            b,
            n_rows,
            types,
            &w,
            &mut Factors::new(),
            exact,
        )?;
        for (s, e) in sum.iter_mut().zip(est) {
            *s += e.err;
        }
    }
    Ok(sum)
}

/// The bytes convert writes for `rows` (the one encoder path, chosen as convert chooses).
/// `factors` caches the LDLQ factors by key; above [`HOLD_ONE_FACTOR_ABOVE`] columns it holds
/// one at a time.
pub(crate) fn encode(
    name: &str,
    rows: &[f32],
    n: usize,
    ty: TensorType,
    w: &Weighting,
    factors: &mut Factors,
) -> Result<Vec<u8>> {
    encode_holding(name, rows, n, ty, w, factors, HOLD_ONE_FACTOR_ABOVE)
}

/// [`encode`] with the width above which the cache holds one factor given (tests force it).
fn encode_holding(
    name: &str,
    rows: &[f32],
    n: usize,
    ty: TensorType,
    w: &Weighting,
    factors: &mut Factors,
    hold_one_above: usize,
) -> Result<Vec<u8>> {
    let factor = match (w, factor_key(ty, w)) {
        (Weighting::Hessian { h, ldlq }, Some(key)) => Some(match factors.get(&key) {
            Some(f) => f.clone(),
            None => {
                // A 70B FFN-width factor (U and the refit's Hessian) is 13 GB in f64: one at a
                // time, whoever calls.
                if n > hold_one_above {
                    factors.clear();
                }
                let f = Arc::new(super::ldlq::factor_hessian(
                    ty,
                    h,
                    ldlq.damp_for(ty),
                    ldlq.shrink_for(ty),
                    ldlq.refit,
                    name,
                )?);
                factors.insert(key, f.clone());
                f
            }
        }),
        _ => None,
    };
    let (band, imp) = match w {
        Weighting::Hessian { ldlq, .. } => (ldlq.band_for(ty), None),
        Weighting::Diagonal(imp) => (0, Some(*imp)),
        Weighting::Identity | Weighting::HessianRtn(_) => (0, None),
    };
    let mut enc = super::Encoder::choose(ty, factor.as_deref().map(|f| (f, band)), imp);
    if let Weighting::Hessian { h, .. } = w {
        // A wide factor's refit reads this Hessian rather than a copy (`ldlq::RefitHessian`).
        enc = enc.with_hessian(&h.h);
    }
    super::encode_rows(ty, name, rows, n, &enc)
}

/// `Δ H Δᵀ / tokens`, `Σ imp Δ²` or `Σ Δ²` for one row (the scalar reference).
fn row_error(a: &[f32], b: &[f32], w: &Weighting) -> f64 {
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| (*y - *x) as f64).collect();
    match w {
        Weighting::Hessian { h, .. } | Weighting::HessianRtn(h) => {
            let n = d.len();
            let mut s = 0f64;
            for (i, hi) in h.h.chunks(n).enumerate() {
                if d[i] == 0.0 {
                    continue;
                }
                let hd: f64 = hi.iter().zip(&d).map(|(x, y)| x * y).sum();
                s += d[i] * hd;
            }
            s / h.tokens.max(1) as f64
        }
        Weighting::Diagonal(imp) => d
            .iter()
            .zip(imp.iter())
            .map(|(x, &i)| x * x * i as f64)
            .sum(),
        Weighting::Identity => d.iter().map(|x| x * x).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next value in [−0.5, 0.5) of a 64-bit LCG.
    fn lcg(s: &mut u64) -> f64 {
        *s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*s >> 40) as f64 / (1u64 << 24) as f64) - 0.5
    }

    /// `Σ x xᵀ` over `tokens` rows of [`lcg`] values (`n × n`).
    fn gram(n: usize, tokens: usize, s: &mut u64) -> Vec<f64> {
        let x: Vec<f64> = (0..n * tokens).map(|_| lcg(s)).collect();
        let mut hm = vec![0f64; n * n];
        for row in x.chunks(n) {
            for i in 0..n {
                for j in 0..n {
                    hm[i * n + j] += row[i] * row[j];
                }
            }
        }
        hm
    }

    /// The factors shared between candidate types (one per key) give each type the errors of its
    /// own factor, as convert computes it for that type alone: IQ2/IQ3 (refit) after IQ1_S (none)
    /// in the default candidates' order, and the stock types sharing act-order.
    #[test]
    fn shared_factors_equal_each_type_factored_alone() {
        let n = 256;
        let mut s = 9u64;
        let hm = gram(n, 300, &mut s);
        let mut r = || lcg(&mut s);
        let h = Hessian {
            tensors: vec!["t".into()],
            n,
            h: hm,
            tokens: 300,
        };
        let w = Weighting::Hessian {
            h: &h,
            ldlq: crate::quant::LdlqSettings::default(),
        };
        assert!(crate::quant::LdlqSettings::default().refit > 0);
        let rows: Vec<f32> = (0..6 * n).map(|_| r() as f32).collect();
        use TensorType::*;
        let tys = [IQ1S, IQ2XXS, IQ2XS, IQ3XXS, IQ3S, Q2K, Q4K, IQ4XS];
        let mut kept = Factors::new();
        let shared = errors("t", &rows, n, 6, &tys, &w, &mut kept, 6).unwrap();
        // Interleaved keys (act-order, IQ1, IQ2/IQ3 with the refit) are each factored once and
        // kept below the width limit; above it (forced here) only the last one stays, and every
        // estimate is the same.
        let keys: std::collections::BTreeSet<_> =
            tys.iter().filter_map(|&t| factor_key(t, &w)).collect();
        assert_eq!(kept.len(), keys.len());
        assert!(keys.len() >= 3);
        let mut one = Factors::new();
        let held = errors_holding("t", &rows, n, 6, &tys, &w, &mut one, 6, 0).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(held, shared);
        for (k, &ty) in tys.iter().enumerate() {
            let alone = errors("t", &rows, n, 6, &[ty], &w, &mut Factors::new(), 6).unwrap();
            assert_eq!(
                shared[k].err.to_bits(),
                alone[0].err.to_bits(),
                "{ty}: {} shared vs {} alone",
                shared[k].err,
                alone[0].err
            );
        }
    }

    /// The ratio estimate from 8 of 64 rows against LDLQ on all 64 (rows of scales 0.25–2.5 and
    /// a correlated Hessian, so rows differ and LDLQ's gain is far from 1): every type within 8 %,
    /// the same order of the types, and closer to the exact value than the 8 rows' plain mean,
    /// which misses the row-to-row spread the proxy carries.
    #[test]
    fn ratio_estimate_tracks_ldlq_on_every_row() {
        let n = 256;
        let mut s = 5u64;
        let mut hm = gram(n, 400, &mut s);
        // Correlated inputs: a shared component on every column.
        for i in 0..n {
            for j in 0..n {
                hm[i * n + j] += 20.0 * (1.0 + (i % 7) as f64) * (1.0 + (j % 7) as f64) / 49.0;
            }
        }
        let h = Hessian {
            tensors: vec!["t".into()],
            n,
            h: hm,
            tokens: 400,
        };
        let w = Weighting::Hessian {
            h: &h,
            ldlq: crate::quant::LdlqSettings::default(),
        };
        let k = 64;
        let mut rows = vec![0f32; k * n];
        for (r, row) in rows.chunks_mut(n).enumerate() {
            let scale = 0.25 + 2.25 * ((r * 37) % k) as f64 / k as f64;
            for x in row.iter_mut() {
                *x = (scale * lcg(&mut s)) as f32;
            }
        }
        use TensorType::*;
        let tys = [IQ2XXS, IQ3S, Q2K, Q3K, Q4K, IQ4XS, Q5K, Q6K];
        let all = errors("t", &rows, n, 1000, &tys, &w, &mut Factors::new(), k).unwrap();
        let ratio = errors("t", &rows, n, 1000, &tys, &w, &mut Factors::new(), 8).unwrap();
        // The plain mean of the same 8 rows' LDLQ errors.
        let sub: Vec<f32> = sample_rows(k as u64, 8)
            .iter()
            .flat_map(|&r| rows[r as usize * n..(r as usize + 1) * n].to_vec())
            .collect();
        let plain = errors("t", &sub, n, 1000, &tys, &w, &mut Factors::new(), 8).unwrap();
        let (mut d_ratio, mut d_plain) = (0f64, 0f64);
        for (t, ((a, r), p)) in tys.iter().zip(all.iter().zip(&ratio).zip(&plain)) {
            let (qr, qp) = ((r.err / a.err).ln().abs(), (p.err / a.err).ln().abs());
            assert!(qr < 0.08, "{t}: ratio {} vs all rows {}", r.err, a.err);
            assert!(r.se > 0.0 && r.se < r.err, "{t}: {r:?}");
            d_ratio += qr;
            d_plain += qp;
        }
        assert!(d_ratio < d_plain, "ratio {d_ratio} vs plain mean {d_plain}");
        for (i, j) in (0..tys.len()).flat_map(|i| (0..tys.len()).map(move |j| (i, j))) {
            assert_eq!(
                all[i].err < all[j].err,
                ratio[i].err < ratio[j].err,
                "{} vs {}",
                tys[i],
                tys[j]
            );
        }
        // No LDLQ (the identity weighting): every row is measured, whatever `exact` says.
        let id = |x| {
            errors(
                "t",
                &rows,
                n,
                1000,
                &tys,
                &Weighting::Identity,
                &mut Factors::new(),
                x,
            )
        };
        assert_eq!(id(8).unwrap(), id(k).unwrap());
    }

    #[test]
    fn long_rows_sample_the_same_elements_in_fewer_rows() {
        assert_eq!(rows_for(64, 576), 64);
        assert_eq!(rows_for(64, 4096), 64);
        assert_eq!(rows_for(64, 8192), 32);
        assert_eq!(rows_for(64, 11008), 24);
        assert_eq!(rows_for(64, 28672), MIN_ROWS);
        assert_eq!(rows_for(8, 28672), 8, "never more than asked");
        assert_eq!(rows_for(1000, 11008), 373);
    }

    #[test]
    fn sampling_is_even_and_estimate_exact_on_full_sample() {
        assert_eq!(sample_rows(10, 5), vec![1, 3, 5, 7, 9]);
        assert_eq!(sample_rows(3, 8), vec![0, 1, 2]);
        let e = estimate(&[1.0, 2.0, 3.0], 3, 3);
        assert_eq!(e, Estimate { err: 6.0, se: 0.0 });
        let e = estimate(&[1.0, 3.0], 100, 2);
        assert_eq!(e.err, 200.0);
        assert!(e.se > 0.0);
    }

    #[test]
    fn hessian_error_matches_a_direct_quadratic_form() {
        // H = diag(1, 4) plus an off-diagonal 1: Δ = (1, −1) → 1 + 4 − 2 = 3, per 1 token.
        let h = Hessian {
            tensors: vec!["t".into()],
            n: 2,
            h: vec![1.0, 1.0, 1.0, 4.0],
            tokens: 1,
        };
        let w = Weighting::Hessian {
            h: &h,
            ldlq: crate::quant::LdlqSettings {
                band: Some(0),
                damp: Some(0.01),
                refit: 0,
                shrink: None,
            },
        };
        assert_eq!(row_error(&[0.0, 0.0], &[1.0, -1.0], &w), 3.0);
        assert_eq!(
            row_error(&[0.0, 0.0], &[1.0, -1.0], &Weighting::Identity),
            2.0
        );
        assert_eq!(
            row_error(&[0.0, 0.0], &[1.0, -1.0], &Weighting::Diagonal(&[2.0, 3.0])),
            5.0
        );
    }

    #[test]
    fn product_form_matches_the_scalar_reference() {
        let n = 40;
        let mut s = 3u64;
        let hm = gram(n, 60, &mut s);
        let mut r = || lcg(&mut s);
        let h = Hessian {
            tensors: vec![],
            n,
            h: hm,
            tokens: 60,
        };
        let w = Weighting::Hessian {
            h: &h,
            ldlq: crate::quant::LdlqSettings {
                band: Some(0),
                damp: Some(0.01),
                refit: 0,
                shrink: None,
            },
        };
        let a: Vec<f32> = (0..5 * n).map(|_| r() as f32).collect();
        let q: Vec<f32> = a.iter().map(|v| v + 0.01 * r() as f32).collect();
        let fast = row_errors(&a, &q, n, &w);
        for (i, f) in fast.iter().enumerate() {
            let slow = row_error(&a[i * n..(i + 1) * n], &q[i * n..(i + 1) * n], &w);
            assert!(
                (f - slow).abs() <= 1e-12 * slow.abs().max(1e-30),
                "{f} vs {slow}"
            );
            assert!(slow > 0.0);
        }
    }

    #[test]
    fn more_bits_less_error() {
        let n = 256;
        let mut s = 1u64;
        let rows: Vec<f32> = (0..8 * n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        use TensorType::*;
        let e = errors(
            "t",
            &rows,
            n,
            8,
            &[Q2K, Q4K, Q6K, Q8_0],
            &Weighting::Identity,
            &mut Factors::new(),
            2,
        )
        .unwrap();
        for w in e.windows(2) {
            assert!(w[1].err < w[0].err, "{e:?}");
        }
    }

    /// The estimate's diagonal blocks: the widest divisor of the row up to the target that holds
    /// whole blocks of every type; the row itself when none does.
    #[test]
    fn chunk_widths() {
        use TensorType::*;
        let k = [Q4K, Q8_0];
        assert_eq!(chunk_width(4096, &k, 512), 512);
        assert_eq!(chunk_width(11008, &k, 512), 256);
        assert_eq!(chunk_width(28672, &k, 512), 512);
        assert_eq!(chunk_width(1536, &k, 512), 512);
        assert_eq!(chunk_width(576, &[Q8_0, Q4_0], 512), 288);
        assert_eq!(chunk_width(256, &[Q8_0], 64), 64);
        assert_eq!(chunk_width(256, &k, 64), 256);
        assert_eq!(chunk_width(172, &[F16], 512), 172);
    }
}
