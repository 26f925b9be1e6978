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

/// Errors of `rows` (`k × n`, sampled from a tensor of `n_rows` rows) for each of `types`.
/// Deterministic: per-row errors are computed in parallel and summed in row order.
pub(crate) fn errors(
    name: &str,
    rows: &[f32],
    n: usize,
    n_rows: u64,
    types: &[TensorType],
    w: &Weighting,
    factors: &mut Factors,
) -> Result<Vec<Estimate>> {
    errors_holding(
        name,
        rows,
        n,
        n_rows,
        types,
        w,
        factors,
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
    hold_one_above: usize,
) -> Result<Vec<Estimate>> {
    let wide = n > hold_one_above;
    let k = rows.len() / n.max(1);
    // Types that share a factor run together, so that a wide Hessian's factor can be dropped
    // before the next is built ([`encode`]) without being built twice; the results go back in
    // `types`' order and do not depend on it (each type's bytes depend only on its factor).
    let mut order: Vec<usize> = (0..types.len()).collect();
    order.sort_by_key(|&i| factor_key(types[i], w));
    let mut decoded = vec![Vec::new(); types.len()];
    for i in order {
        let key = factor_key(types[i], w);
        if wide && key.as_ref().is_some_and(|k| !factors.contains_key(k)) {
            // A 70B FFN-width factor (U and the damped Hessian for the refit) is 13 GB in
            // f64: hold one at a time, not one per key.
            factors.clear();
        }
        decoded[i] = roundtrip(name, rows, n, types[i], w, factors)?;
    }
    // One type per task, each product single-threaded: the sums do not depend on the pool.
    Ok(decoded
        .par_iter()
        .map(|q| estimate(&row_errors(rows, q, n, w), n_rows, k))
        .collect())
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
) -> Result<Vec<f32>> {
    let bytes = encode(name, rows, n, ty, w, factors)?;
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
/// damped Hessian for the i-quants' scale refit (every IQ2/IQ3 type under `--ldlq-refit` > 0,
/// never IQ1_S/IQ1_M: `ldlq::factor_hessian_owned`), so IQ2_XXS never reuses IQ1_S's factor,
/// which has no refit.
fn factor_key(ty: TensorType, w: &Weighting) -> Option<String> {
    let Weighting::Hessian { ldlq, .. } = w else {
        return None;
    };
    if !ty.has_ldlq() {
        return None;
    }
    let refits = ldlq.refit > 0
        && matches!(
            ty.ldlq(),
            Some(crate::types::LdlqKind::Lattice | crate::types::LdlqKind::IqGrid)
        )
        && !matches!(ty, TensorType::IQ1S | TensorType::IQ1M);
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

/// The bytes convert writes for `rows` (the one encoder path, chosen as convert chooses).
pub(crate) fn encode(
    name: &str,
    rows: &[f32],
    n: usize,
    ty: TensorType,
    w: &Weighting,
    factors: &mut Factors,
) -> Result<Vec<u8>> {
    let factor = match (w, factor_key(ty, w)) {
        (Weighting::Hessian { h, ldlq }, Some(key)) => Some(match factors.get(&key) {
            Some(f) => f.clone(),
            None => {
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
    let enc = super::Encoder::choose(ty, factor.as_deref().map(|f| (f, band)), imp);
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
        let shared = errors("t", &rows, n, 6, &tys, &w, &mut kept).unwrap();
        // Interleaved keys (act-order, IQ1, IQ2/IQ3 with the refit) are each factored once and
        // kept below the width limit; above it (forced here) only the last one stays, and every
        // estimate is the same.
        let keys: std::collections::BTreeSet<_> =
            tys.iter().filter_map(|&t| factor_key(t, &w)).collect();
        assert_eq!(kept.len(), keys.len());
        assert!(keys.len() >= 3);
        let mut one = Factors::new();
        let held = errors_holding("t", &rows, n, 6, &tys, &w, &mut one, 0).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(held, shared);
        for (k, &ty) in tys.iter().enumerate() {
            let alone = errors("t", &rows, n, 6, &[ty], &w, &mut Factors::new()).unwrap();
            assert_eq!(
                shared[k].err.to_bits(),
                alone[0].err.to_bits(),
                "{ty}: {} shared vs {} alone",
                shared[k].err,
                alone[0].err
            );
        }
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
        )
        .unwrap();
        for w in e.windows(2) {
            assert!(w[1].err < w[0].err, "{e:?}");
        }
    }
}
