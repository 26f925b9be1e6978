//! The output projection's candidates on a row sample.
//!
//! The output projection has no Hessian, so the mix measures each of its candidate types by a
//! pass (the head only) rather than predicting it. The pass is cheap; encoding the candidate is
//! not: a 151,936 × 2048 vocabulary is 311 M values per candidate (an i-quant 100–390 CPU-s).
//! A row of the projection is one token's logit, and the KLD weighs each token's logit error by
//! the reference probability of that token, so the sample is stratified by that probability:
//! the rows holding most of the reference mass over the windows are encoded exactly, and the
//! rest of the budget is spread evenly over the other rows, their error amplified by
//! `s = √(other rows / sampled others)` (as a measured plan's sample is, `probe::Sample`) so that
//! their expected contribution to the KLD, to second order, is the whole tail's.

use super::probe::{Probes, RowProbe, Stage, Substitute};
use crate::error::{Error, Result};
use crate::eval::logits_file::Reader;
use crate::gguf::GgufFile;
use crate::plan::PlanEntry;
use crate::source::TensorSource;
use crate::types::TensorType;
use std::path::Path;

/// Elements above which an output-projection candidate is encoded on a row sample
/// ([`Heads`]): 16 × the probes' cap, a 2048-wide head on 8,192 rows, a 8192-wide one on 2,048.
pub(crate) const HEAD_ELEMENTS: u64 = 1 << 24;

/// [`HEAD_ELEMENTS`], or `TQ_HEAD_ELEMENTS` when set to a positive integer (a measurement knob).
pub(crate) fn head_elements() -> u64 {
    super::probe::env_count("TQ_HEAD_ELEMENTS", HEAD_ELEMENTS)
}

/// The share of the reference probability mass whose rows are encoded exactly (when the budget
/// allows: at most half of it goes to them).
const EXACT_MASS: f64 = 0.99;

/// A head tensor's row sample: `picks` sorted, `amplified[k]` for the tail rows, and their `s`.
#[derive(Debug, Clone)]
pub(super) struct HeadSample {
    pub(super) picks: Vec<u64>,
    pub(super) amplified: Vec<bool>,
    pub(super) s: f32,
}

/// The row samples of the head's tensors, from the reference logits' probability mass.
pub(super) struct Heads<'p> {
    ref_logits: &'p Path,
    cap: u64,
    /// Σ over the reference rows of p(token), per token (read once).
    mass: Option<Vec<f64>>,
}

impl<'p> Heads<'p> {
    pub(super) fn new(ref_logits: &'p Path, cap: u64) -> Heads<'p> {
        Heads {
            ref_logits,
            cap,
            mass: None,
        }
    }

    /// The sample of entry `e`'s candidates when they are sampled: a 2-D float tensor only the
    /// head reads (not an embedding tied to it), its rows the vocabulary, over the cap.
    pub(super) fn sample(
        &mut self,
        probes: &Probes,
        file: &GgufFile,
        e: &PlanEntry,
    ) -> Result<Option<HeadSample>> {
        let float = file
            .tensor(&e.name)
            .is_some_and(|t| matches!(t.ty, TensorType::F32 | TensorType::F16 | TensorType::BF16));
        let [n, n_rows] = e.dims[..] else {
            return Ok(None);
        };
        if !float || probes.stages_of(&e.name) != [Stage::Head] || n * n_rows <= self.cap {
            return Ok(None);
        }
        if self.mass.is_none() {
            self.mass = Some(token_mass(self.ref_logits)?);
        }
        let mass = self.mass.as_deref().unwrap_or_default();
        if mass.len() as u64 != n_rows {
            return Ok(None);
        }
        Ok(pick(mass, self.cap.div_ceil(n) as usize))
    }
}

/// Per token, its reference probability summed over the rows of `ref_logits`.
fn token_mass(ref_logits: &Path) -> Result<Vec<f64>> {
    let mut r = Reader::open(ref_logits)?;
    let rows = r.header.n_chunk * r.header.rows_per_chunk();
    let mut mass = vec![0f64; r.header.n_vocab];
    for _ in 0..rows {
        let row = r.next_row()?;
        for (m, i) in mass.iter_mut().zip(0..) {
            *m += (row.log_prob(i) as f64).exp();
        }
    }
    Ok(mass)
}

/// The sample of a `mass.len()`-row head in `budget` rows: the heaviest rows up to
/// [`EXACT_MASS`] of the mass (at most half the budget), then the rest of the budget evenly
/// spaced over the other rows, amplified. None when the budget is half the rows or more.
fn pick(mass: &[f64], budget: usize) -> Option<HeadSample> {
    use crate::quant::sensitivity::sample_rows;
    let n_rows = mass.len();
    if budget.saturating_mul(2) >= n_rows || budget < 2 {
        return None;
    }
    let mut order: Vec<usize> = (0..n_rows).collect();
    // Ties by row, so the sample is a function of the mass alone.
    order.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]).then(a.cmp(&b)));
    let total: f64 = mass.iter().sum();
    let mut exact = vec![false; n_rows];
    let (mut acc, mut k) = (0f64, 0usize);
    for &r in &order {
        if acc >= EXACT_MASS * total || k >= budget / 2 {
            break;
        }
        exact[r] = true;
        acc += mass[r];
        k += 1;
    }
    let others: Vec<u64> = (0..n_rows as u64).filter(|&r| !exact[r as usize]).collect();
    let tail: Vec<u64> = sample_rows(others.len() as u64, budget - k)
        .into_iter()
        .map(|j| others[j as usize])
        .collect();
    let s = (others.len() as f64 / tail.len().max(1) as f64).sqrt() as f32;
    let mut picks: Vec<(u64, bool)> = (0..n_rows as u64)
        .filter(|&r| exact[r as usize])
        .map(|r| (r, false))
        .chain(tail.into_iter().map(|r| (r, true)))
        .collect();
    picks.sort_unstable();
    Some(HeadSample {
        picks: picks.iter().map(|p| p.0).collect(),
        amplified: picks.iter().map(|p| p.1).collect(),
        s,
    })
}

impl HeadSample {
    /// The candidate as a row probe: `enc`, the candidate's encoding in the sample's rows (the
    /// whole tensor's shape in its type, [`super::fit`]'s `rows_encoding`), decoded in those
    /// rows, the tail's error amplified, in the input's float type; every other row keeps the
    /// input's bytes.
    pub(super) fn probe(
        &self,
        src: &dyn TensorSource,
        file: &GgufFile,
        e: &PlanEntry,
        i: usize,
        enc: &Substitute,
    ) -> Result<RowProbe> {
        let (name, ty) = (&e.name, enc.1);
        let n = e.dims[0] as usize;
        let t = file
            .tensor(name)
            .ok_or_else(|| Error::internal(format!("{name}: no such tensor")))?;
        let rb = ty
            .bytes_for(n as u64)
            .ok_or_else(|| Error::internal(format!("{name}: {ty} cannot hold its rows")))?
            as usize;
        let mut w = vec![0f32; n];
        let mut q = vec![0f32; self.picks.len() * n];
        for ((&r, &amp), out) in self.picks.iter().zip(&self.amplified).zip(q.chunks_mut(n)) {
            let at = r as usize * rb;
            crate::quant::decode_rows(ty, &enc.3[at..at + rb], out, n, name)?;
            if amp {
                src.read_rows_f32(i, r, &mut w)?;
                super::probe::amplify(out, &w, self.s);
            }
        }
        RowProbe::from_values(name, t.ty, self.picks.clone(), &q, n, 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The heaviest rows are exact up to the mass share or half the budget, the rest of the
    /// budget spread over the others with `s² = others / sampled`; no sample at half the rows.
    #[test]
    fn the_sample_takes_the_heavy_rows_exactly_and_spreads_the_rest() {
        // 1000 rows: rows 7, 300, 301 hold most of the mass.
        let mut mass = vec![1e-4; 1000];
        mass[7] = 5.0;
        mass[300] = 3.0;
        mass[301] = 1.9;
        let h = pick(&mass, 100).unwrap();
        assert_eq!(h.picks.len(), 100);
        assert!(h.picks.windows(2).all(|w| w[0] < w[1]));
        let exact: Vec<u64> = h
            .picks
            .iter()
            .zip(&h.amplified)
            .filter(|p| !*p.1)
            .map(|p| *p.0)
            .collect();
        // 5 + 3 + 1.9 = 9.9 of 9.9997: 99.0 % with the three (the next rows are ties: none).
        assert_eq!(exact, vec![7, 300, 301]);
        assert!((h.s * h.s - 997.0 / 97.0).abs() < 1e-3, "{}", h.s);
        // Half the budget at most goes to exact rows.
        let flat = vec![1.0; 1000];
        let h = pick(&flat, 100).unwrap();
        assert_eq!(h.amplified.iter().filter(|a| !**a).count(), 50);
        assert!(pick(&flat, 500).is_none());
    }
}
