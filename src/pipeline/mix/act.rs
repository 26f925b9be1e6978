//! The mix's activation-rounding term. ggml's CPU backend multiplies a quantized weight by its
//! input rounded to 8 bits (Q8_0 per 32 values for q4_0…q8_0 and iq4_nl, Q8_K per 256 for the
//! k- and i-quants: `model::matmul::ActRound`), while an f16 weight meets an f16 input. That
//! rounding adds `W δx` to the output, noise the weight error `tr(ΔW H ΔWᵀ)` does not contain;
//! at 5–8 bpw, where the weight error is small, it can be most of a file's KLD, and f16 is the
//! only way to buy it back. Its expected size per token, with the rounding errors of different
//! columns uncorrelated, is `Σ_j ‖W_{:,j}‖² E[δx_j²]`: the per-column mean squared rounding error
//! of the real input (observed once on the KLD text's windows), weighted by the column norms
//! (from the same sampled rows the sensitivity pass reads, scaled to the tensor). Same units as
//! the sensitivity table (squared output error per token), so the KLD fit prices both. An MoE
//! expert stack's input is observed per expert (the rows routed to it) and its term is summed
//! over the experts with the weights the sensitivity gives their errors (each expert's share of
//! the routed rows, `plan::mix::measure`'s `expert_errors`).

use crate::error::Result;
use crate::model::matmul::ActRound;
use crate::model::{Model, Numerics, Observer};
use crate::plan::Plan;
use crate::source::TensorSource;
use crate::types::TensorType;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// Which models the term is measured for (`TQ_MIX_ACT`, a measurement knob; part of
/// `--mix-cache`'s key through [`Mode::label`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Mode {
    /// `TQ_MIX_ACT=0`: never (the weight error alone).
    Off,
    /// The default: models without expert stacks. On the MoE fixtures the per-expert term moved
    /// bytes from a Mixtral expert stack to f16 attention and the file measured 1.84× the KLD
    /// on held-out text (docs/bench/mix.md), so MoE models keep the weight error alone.
    Dense,
    /// `TQ_MIX_ACT=all`: MoE models too, each expert stack priced per expert.
    All,
}

impl Mode {
    pub(super) fn from_env() -> Mode {
        match std::env::var("TQ_MIX_ACT").as_deref() {
            Ok("0") => Mode::Off,
            Ok("all") => Mode::All,
            _ => Mode::Dense,
        }
    }

    /// Whether the term is measured for a model with (`experts`) or without expert stacks.
    pub(super) fn measures(self, experts: bool) -> bool {
        match self {
            Mode::Off => false,
            Mode::Dense => !experts,
            Mode::All => true,
        }
    }

    /// The cache key's word (the default's is what the key held before `all` existed).
    pub(super) fn label(self) -> &'static str {
        match self {
            Mode::Off => "false",
            Mode::Dense => "true",
            Mode::All => "all",
        }
    }
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
        self.add(tensors, x, rows, cols);
    }

    /// An expert's routed rows, kept under the expert's key (`TENSOR#e`, as its Hessian).
    fn expert_input(
        &mut self,
        _layer: usize,
        expert: usize,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    ) {
        let keys = crate::quant::expert_keys(tensors, expert);
        self.add(
            &keys.iter().map(String::as_str).collect::<Vec<_>>(),
            x,
            rows,
            cols,
        );
    }
}

impl ActNoise {
    /// Accumulate the rounding errors of `rows × cols` inputs `x` of `tensors` (one entry for
    /// all of them).
    fn add(&mut self, tensors: &[&str], x: &[f32], rows: usize, cols: usize) {
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

    /// Mean squared rounding error per column of `tensor`'s input under `round` (None: not
    /// observed, or a rounding not measured).
    fn mean(&self, tensor: &str, round: ActRound) -> Option<Vec<f64>> {
        let (sq, rows) = self.sums(tensor, round)?;
        let t = rows.max(1) as f64;
        Some(sq.iter().map(|s| s / t).collect())
    }

    /// The summed squared rounding errors per column of `key`'s input under `round`, and the
    /// rows they sum (None: not observed, or a rounding not measured).
    fn sums(&self, key: &str, round: ActRound) -> Option<(&[f64], u64)> {
        let c = CLASSES.iter().position(|&r| r == round)?;
        let n = &self.sets[*self.of.get(key)?];
        Some((&n.sq[c], n.rows))
    }

    /// The rows routed to expert `x` of stack `tensor` (0 when none was observed).
    fn expert_rows(&self, tensor: &str, x: usize) -> u64 {
        let key = crate::quant::expert_key(tensor, x);
        self.of.get(&key).map_or(0, |&s| self.sets[s].rows)
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
    let (file, win) = super::substitute::input_windows(input, text, windows)?;
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
/// E[δx_j²]`, the column norms from `sample` evenly spaced rows (`sensitivity::rows_for`, scaled
/// to all rows). 0 for types whose input is not rounded to 8 bits, and for tensors whose input was
/// not observed (embeddings). An expert stack (3-D): each expert's term from its own rows
/// (`sample` spread over the experts, at least one each) and its routed inputs, weighted by its
/// share of the routed rows.
pub(super) fn terms(
    noise: &ActNoise,
    src: &dyn TensorSource,
    plan: &Plan,
    i: usize,
    sample: usize,
    types: &[TensorType],
) -> Result<Vec<f64>> {
    use crate::quant::sensitivity::{rows_for, sample_rows};
    let e = &plan.entries[i];
    let rounds: Vec<ActRound> = types.iter().map(|&t| ActRound::for_weight(t)).collect();
    let n = e.dims.first().copied().unwrap_or(0) as usize;
    // Column norms `Σ_r W_rj²` over `picks` of the rows from `first` (the caller scales them
    // to all rows).
    let col_norms = |first: u64, picks: &[u64]| -> Result<Vec<f64>> {
        let mut col = vec![0f64; n];
        let mut buf = vec![0f32; n];
        for &r in picks {
            src.read_rows_f32(i, first + r, &mut buf)?;
            crate::quant::check_finite(&e.name, first + r, &buf)?;
            for (c, &w) in col.iter_mut().zip(&buf) {
                *c += w as f64 * w as f64;
            }
        }
        Ok(col)
    };
    match e.dims.len() {
        2 => {
            let means: Vec<Option<Vec<f64>>> =
                rounds.iter().map(|&r| noise.mean(&e.name, r)).collect();
            let picks = sample_rows(e.dims[1], rows_for(sample, n));
            if means.iter().all(Option::is_none) || picks.is_empty() {
                return Ok(vec![0.0; types.len()]);
            }
            let col = col_norms(0, &picks)?;
            let scale = e.dims[1] as f64 / picks.len() as f64;
            Ok(means
                .iter()
                .map(|m| m.as_ref().map_or(0.0, |m| weighted(&col, m) * scale))
                .collect())
        }
        3 => {
            let (per, n_exp) = (e.dims[1], e.dims[2] as usize);
            let total: u64 = (0..n_exp).map(|x| noise.expert_rows(&e.name, x)).sum();
            if total == 0 {
                return Ok(vec![0.0; types.len()]);
            }
            let picks = sample_rows(per, rows_for(sample, n).div_ceil(n_exp).max(1));
            if picks.is_empty() {
                return Ok(vec![0.0; types.len()]);
            }
            let mut sum = vec![0f64; types.len()];
            for x in 0..n_exp {
                let key = crate::quant::expert_key(&e.name, x);
                let sums: Vec<Option<&[f64]>> = rounds
                    .iter()
                    .map(|&r| noise.sums(&key, r).map(|(sq, _)| sq))
                    .collect();
                if noise.expert_rows(&e.name, x) == 0 || sums.iter().all(Option::is_none) {
                    continue;
                }
                let col = col_norms(x as u64 * per, &picks)?;
                for (t, sq) in sum.iter_mut().zip(&sums) {
                    *t += sq.map_or(0.0, |sq| weighted(&col, sq));
                }
            }
            // Each expert's sum over its routed rows, its sampled rows scaled to its `per`:
            // `Σ_x (rows_x / total) · Σ_j ‖W_x,:j‖² E_x[δx_j²]`.
            let scale = per as f64 / picks.len() as f64 / total as f64;
            Ok(sum.into_iter().map(|t| t * scale).collect())
        }
        _ => Ok(vec![0.0; types.len()]),
    }
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
                    terms(&noise, src, plan, i, sample_rows, tys)
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
    use crate::source::SourceTensor;

    /// Inputs shaped like a block's: Gaussian, with a few outlier columns (what makes a Q8
    /// block's scale, and so its rounding error, large).
    fn inputs(rows: usize, k: usize, seed: u64) -> Vec<f32> {
        let mut g = crate::math::splitmix::SplitMix64::new(seed);
        (0..rows * k)
            .map(|i| g.gauss() as f32 * if i % k % 97 == 5 { 20.0 } else { 1.0 })
            .collect()
    }

    /// `Σ_rows Σ_w-rows (w · (x − round(x)))²`: the rounding noise the inputs `x` add to the
    /// products with the rows of `w` (both `k` wide), summed directly.
    fn rounded_products(x: &[f32], w: &[f32], k: usize, round: ActRound) -> f64 {
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
        direct
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
            let direct = rounded_products(&x, &w, k, round) / rows as f64;
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

    /// One f32 tensor in memory, for [`terms`].
    struct OneTensor(Vec<SourceTensor>, Vec<f32>);

    impl TensorSource for OneTensor {
        fn name(&self) -> String {
            "memory".into()
        }
        fn metadata(&self) -> &[(String, crate::gguf::Value)] {
            &[]
        }
        fn tensors(&self) -> &[SourceTensor] {
            &self.0
        }
        fn raw(&self, _: usize) -> Option<&[u8]> {
            None
        }
        fn read_rows_f32(&self, _: usize, row0: u64, out: &mut [f32]) -> Result<()> {
            let at = row0 as usize * self.0[0].dims[0] as usize;
            out.copy_from_slice(&self.1[at..at + out.len()]);
            Ok(())
        }
    }

    /// An expert stack's term is the routed rows' `‖W_x (x − round(x))‖²` summed over the
    /// experts and divided by all routed rows (each expert weighted by its share, as the
    /// sensitivity weights its error): the estimate from every row equals that direct sum within
    /// the cross terms' noise; experts that saw no rows add nothing; a 2-D tensor of the same
    /// name is not priced from the experts' inputs.
    #[test]
    fn an_expert_stack_sums_its_experts_routed_rows() {
        let (k, n, n_exp) = (256, 24, 3);
        let name = "blk.0.ffn_down_exps.weight";
        let w = inputs(n * n_exp, k, 5);
        let routed = [(0usize, 120usize), (2, 40)];
        let mut obs = ActNoise::default();
        let mut xs = vec![];
        for (i, &(x, rows)) in routed.iter().enumerate() {
            let xe = inputs(rows, k, 20 + i as u64);
            obs.expert_input(0, x, &[name], &xe, rows, k);
            xs.push((x, xe));
        }
        let total: usize = routed.iter().map(|r| r.1).sum();
        let dims = vec![k as u64, n as u64, n_exp as u64];
        let src = OneTensor(
            vec![SourceTensor {
                name: name.into(),
                dims: dims.clone(),
                ty: TensorType::F32,
            }],
            w.clone(),
        );
        let plan = Plan {
            entries: vec![crate::plan::PlanEntry {
                name: name.into(),
                dims,
                src: TensorType::F32,
                dst: TensorType::Q8_0,
                action: crate::plan::Action::Quantize,
                bytes: 0,
                reasons: vec![],
                fallback: false,
                ldlq: false,
                importance: None,
            }],
            file_type: None,
            base_type: TensorType::Q8_0,
            ldlq: Default::default(),
        };
        let types = [TensorType::Q8_0, TensorType::Q4K, TensorType::F16];
        // Every row of every expert sampled (n × n_exp rows asked for).
        let est = terms(&obs, &src, &plan, 0, n * n_exp, &types).unwrap();
        for (t, &ty) in types.iter().enumerate() {
            let round = ActRound::for_weight(ty);
            let direct = xs
                .iter()
                .map(|(x, xe)| rounded_products(xe, &w[x * n * k..(x + 1) * n * k], k, round))
                .sum::<f64>()
                / total as f64;
            if ty == TensorType::F16 {
                assert_eq!(est[t], 0.0, "f16 meets an unrounded input");
                continue;
            }
            assert!(direct > 0.0);
            assert!(
                (est[t] / direct - 1.0).abs() < 0.1,
                "{ty:?}: estimate {} vs direct {direct}",
                est[t]
            );
        }
        // The experts' inputs are not a 2-D tensor's of the same name.
        assert!(obs.mean(name, ActRound::Q8_0).is_none());
        assert_eq!(obs.expert_rows(name, 1), 0);
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
