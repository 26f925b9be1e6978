//! The mix's activation-rounding term. ggml's CPU backend multiplies a quantized weight by its
//! input rounded to 8 bits (Q8_0 per 32 values for q4_0…q8_0 and iq4_nl, Q8_K per 256 for the
//! k- and i-quants: `model::matmul::ActRound`), while an f16 weight meets an f16 input. That
//! rounding adds `W δx` to the output, noise the weight error `tr(ΔW H ΔWᵀ)` does not contain;
//! at 5–8 bpw, where the weight error is small, it can be most of a file's KLD, and f16 is the
//! only way to buy it back. Its expected size per token, with the rounding errors of different
//! columns uncorrelated, is `Σ_j ‖W_{:,j}‖² E[δx_j²]`: the per-column mean squared rounding error
//! of the real input (observed once on the KLD text's windows), weighted by the column norms
//! (from the same sampled rows the sensitivity pass reads, scaled to the tensor). Same units as
//! the sensitivity table (squared output error per token), so the KLD fit prices both.

use crate::error::Result;
use crate::model::matmul::ActRound;
use crate::model::{Model, Numerics, Observer};
use crate::plan::Plan;
use crate::source::TensorSource;
use crate::types::TensorType;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// Whether the term is measured: on, unless `TQ_MIX_ACT=0` (a measurement knob for comparing
/// the mix with and without it; it is part of `--mix-cache`'s key).
pub(super) fn enabled() -> bool {
    std::env::var("TQ_MIX_ACT").map_or(true, |v| v != "0")
}

/// Whether a mixed tensor is an MoE expert stack (3-D).
pub(super) fn has_experts(plan: &Plan, items: &[(Vec<usize>, Vec<TensorType>)]) -> bool {
    items
        .iter()
        .flat_map(|(idx, _)| idx)
        .any(|&i| plan.entries[i].dims.len() == 3)
}

/// The roundings measured (those whose error is not negligible against f16's).
const CLASSES: [ActRound; 2] = [ActRound::Q8_0, ActRound::Q8K];

/// Rows per parallel chunk: fixed, so the sums do not depend on the thread count.
const CHUNK: usize = 64;

/// Per linear input: the summed squared rounding error per column for each of [`CLASSES`], and
/// the rows (tokens) seen.
#[derive(Default)]
struct Noise {
    sq: [Vec<f64>; 2],
    rows: u64,
}

/// Observes every linear input of a forward pass (the output head's too) and accumulates
/// [`Noise`] per weight tensor name (the tensors of one input share one entry).
#[derive(Default)]
pub(super) struct ActNoise {
    sets: Vec<Noise>,
    of: HashMap<String, usize>,
}

impl Observer for ActNoise {
    fn linear_input(
        &mut self,
        _layer: Option<usize>,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    ) {
        let Some(first) = tensors.first() else {
            return;
        };
        let at = match self.of.get(*first) {
            Some(&s) => s,
            None => {
                self.sets.push(Noise {
                    sq: [vec![0.0; cols], vec![0.0; cols]],
                    rows: 0,
                });
                let s = self.sets.len() - 1;
                for t in tensors {
                    self.of.insert(t.to_string(), s);
                }
                s
            }
        };
        let n = &mut self.sets[at];
        if n.sq[0].len() != cols {
            return;
        }
        let x = &x[..rows * cols];
        for (c, class) in CLASSES.iter().enumerate() {
            // Partial sums per fixed chunk of rows, added in chunk order.
            let parts: Vec<Vec<f64>> = x
                .par_chunks(CHUNK * cols)
                .map(|chunk| {
                    let mut acc = vec![0f64; cols];
                    let mut r = vec![0f32; cols];
                    for row in chunk.chunks(cols) {
                        r.copy_from_slice(row);
                        class.apply(&mut r);
                        for ((a, &v), &q) in acc.iter_mut().zip(row).zip(&r) {
                            let d = (v - q) as f64;
                            *a += d * d;
                        }
                    }
                    acc
                })
                .collect();
            for p in parts {
                for (s, v) in n.sq[c].iter_mut().zip(p) {
                    *s += v;
                }
            }
        }
        n.rows += rows as u64;
    }
}

impl ActNoise {
    /// Mean squared rounding error per column of `tensor`'s input under `round` (None: not
    /// observed, or a rounding not measured).
    fn mean(&self, tensor: &str, round: ActRound) -> Option<Vec<f64>> {
        let c = CLASSES.iter().position(|&r| r == round)?;
        let n = &self.sets[*self.of.get(tensor)?];
        let t = n.rows.max(1) as f64;
        Some(n.sq[c].iter().map(|s| s / t).collect())
    }
}

/// Observe the inputs of `input`'s forward pass on the first `windows` windows (ctx 512) of
/// `text`, under ggml's numerics as the fit's reference.
pub(super) fn observe(
    input: &Path,
    text: &Path,
    windows: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ActNoise> {
    let (file, win) = super::fit::input_windows(input, text, windows)?;
    let model = Model::new(&file, Numerics::Ggml)?;
    let mut obs = ActNoise::default();
    for w in 0..win.n_chunk {
        progress(w, win.n_chunk);
        model.forward(&win.input(w, w + 1), win.n_ctx, win.first(), Some(&mut obs))?;
    }
    progress(win.n_chunk, win.n_chunk);
    Ok(obs)
}

/// The activation-rounding term of entry `i` of `plan` under each of `types`: `Σ_j ‖W_{:,j}‖²
/// E[δx_j²]`, the column norms from the rows `picks` (scaled to all rows). 0 for types whose
/// input is not rounded to 8 bits, and for tensors whose input was not observed (embeddings).
pub(super) fn terms(
    noise: &ActNoise,
    src: &dyn TensorSource,
    plan: &Plan,
    i: usize,
    picks: &[u64],
    types: &[TensorType],
) -> Result<Vec<f64>> {
    let e = &plan.entries[i];
    let rounds: Vec<ActRound> = types.iter().map(|&t| ActRound::for_weight(t)).collect();
    let means: Vec<Option<Vec<f64>>> = rounds.iter().map(|&r| noise.mean(&e.name, r)).collect();
    if e.dims.len() != 2 || means.iter().all(Option::is_none) || picks.is_empty() {
        return Ok(vec![0.0; types.len()]);
    }
    let n = e.dims[0] as usize;
    let n_rows = e.dims[1];
    let mut col = vec![0f64; n];
    let mut buf = vec![0f32; n];
    for &r in picks {
        src.read_rows_f32(i, r, &mut buf)?;
        crate::quant::check_finite(&e.name, r, &buf)?;
        for (c, &w) in col.iter_mut().zip(&buf) {
            *c += w as f64 * w as f64;
        }
    }
    let scale = n_rows as f64 / picks.len() as f64;
    Ok(means
        .iter()
        .map(|m| m.as_ref().map_or(0.0, |m| weighted(&col, m) * scale))
        .collect())
}

/// `Σ_j col_j · mean_j` (0 when the widths differ: an input the tensor does not take).
fn weighted(col: &[f64], mean: &[f64]) -> f64 {
    if col.len() != mean.len() {
        return 0.0;
    }
    col.iter().zip(mean).map(|(c, d)| c * d).sum()
}

/// Per item, member and candidate: the activation-rounding term ([`terms`]), 0 for items without
/// calibration data (`uncal`: their KLDs are measured directly, rounding included). One forward
/// pass of the input on the KLD text's first `windows` windows, then the sampled rows.
#[allow(clippy::too_many_arguments)]
pub(super) fn table(
    input: &Path,
    src: &dyn TensorSource,
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    uncal: &[bool],
    text: &Path,
    windows: usize,
    sample_rows: usize,
    quiet: bool,
) -> Result<Vec<Vec<Vec<f64>>>> {
    use crate::quant::sensitivity::{rows_for, sample_rows as pick};
    let mut pb = crate::pipeline::progress::steps(quiet, 1, "activation rounding");
    let noise = observe(input, text, windows, &mut |d, t| {
        pb.set_length(t as u64);
        pb.set_position(d as u64)
    })?;
    pb.finish_and_clear();
    items
        .iter()
        .zip(uncal)
        .map(|((idx, tys), &unc)| {
            idx.iter()
                .map(|&i| {
                    if unc {
                        return Ok(vec![0.0; tys.len()]);
                    }
                    let e = &plan.entries[i];
                    let n = e.dims.first().copied().unwrap_or(0) as usize;
                    let n_rows: u64 = e.dims.iter().skip(1).product();
                    let picks = pick(n_rows, rows_for(sample_rows, n));
                    terms(&noise, src, plan, i, &picks, tys)
                })
                .collect()
        })
        .collect()
}

/// The activation-rounding part of `plan`'s summed error: each calibrated member's term at the
/// type the plan gives it (None when a type is not one of its item's candidates).
pub(super) fn of_plan(
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    direct: &[Option<Vec<f64>>],
    act: &[Vec<Vec<f64>>],
) -> Option<f64> {
    let mut sum = 0.0;
    for (((idx, tys), d), a) in items.iter().zip(direct).zip(act) {
        if d.is_some() {
            continue;
        }
        for (&i, am) in idx.iter().zip(a) {
            let k = tys.iter().position(|t| *t == plan.entries[i].dst)?;
            sum += am.get(k)?;
        }
    }
    Some(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs shaped like a block's: Gaussian, with a few outlier columns (what makes a Q8
    /// block's scale, and so its rounding error, large).
    fn inputs(rows: usize, k: usize, seed: u64) -> Vec<f32> {
        let mut g = crate::math::splitmix::SplitMix64::new(seed);
        (0..rows * k)
            .map(|i| g.gauss() as f32 * if i % k % 97 == 5 { 20.0 } else { 1.0 })
            .collect()
    }

    /// The column-statistics estimate `Σ_j ‖W_{:,j}‖² E[δx_j²]` equals the directly computed mean
    /// `‖W (x − round(x))‖²` over the tokens (within the cross terms' noise), for both roundings;
    /// rows whose length is not a multiple of the block are not rounded (0).
    #[test]
    fn the_estimate_matches_the_rounded_products() {
        let (rows, k, n) = (300, 512, 48);
        let x = inputs(rows, k, 7);
        let w = inputs(n, k, 11);
        let mut obs = ActNoise::default();
        obs.linear_input(Some(0), &["a.weight", "b.weight"], &x, rows, k);
        let mut col = vec![0f64; k];
        for r in w.chunks(k) {
            for (c, &v) in col.iter_mut().zip(r) {
                *c += (v as f64).powi(2);
            }
        }
        for round in CLASSES {
            let mut direct = 0f64;
            for xr in x.chunks(k) {
                let mut q = xr.to_vec();
                round.apply(&mut q);
                for wr in w.chunks(k) {
                    let y: f64 = wr
                        .iter()
                        .zip(xr.iter().zip(&q))
                        .map(|(&a, (&b, &c))| a as f64 * (b - c) as f64)
                        .sum();
                    direct += y * y;
                }
            }
            direct /= rows as f64;
            let est = weighted(&col, &obs.mean("b.weight", round).unwrap());
            assert!(direct > 0.0);
            assert!(
                (est / direct - 1.0).abs() < 0.1,
                "{round:?}: estimate {est} vs direct {direct}"
            );
        }
        // Q8_K's 256-blocks round more coarsely than Q8_0's 32-blocks.
        let m0 = weighted(&col, &obs.mean("a.weight", ActRound::Q8_0).unwrap());
        let mk = weighted(&col, &obs.mean("a.weight", ActRound::Q8K).unwrap());
        assert!(mk > m0, "{mk} {m0}");
        assert!(obs.mean("a.weight", ActRound::F16).is_none());
        assert!(obs.mean("c.weight", ActRound::Q8_0).is_none());
        // 100 columns: no whole Q8_K block, so no rounding.
        let mut o2 = ActNoise::default();
        o2.linear_input(None, &["o.weight"], &inputs(10, 100, 3), 10, 100);
        assert!(o2
            .mean("o.weight", ActRound::Q8K)
            .unwrap()
            .iter()
            .all(|&d| d == 0.0));
    }

    /// The sums do not depend on the thread count (fixed row chunks added in order).
    #[test]
    fn the_noise_is_the_same_for_any_thread_count() {
        let (rows, k) = (200, 256);
        let x = inputs(rows, k, 3);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut o = ActNoise::default();
                o.linear_input(Some(0), &["t"], &x, rows, k);
                o.mean("t", ActRound::Q8_0).unwrap()
            })
        };
        let a = run(1);
        let b = run(3);
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
    }
}
