//! `--backend`: what an evaluation whose linear weights ran through a GPU backend's kernels
//! reports about that backend — which weights ran where, and how far its distributions are from
//! the CPU runtime's on the same windows (the CPU run is made beside it, in the same batches).
//!
//! The comparison is exact, not through llama.cpp's 16-bit reference rows: per scored token,
//! `KLD(p_cpu ‖ p_kernel) = Σ_i p_cpu(i)·(log p_cpu(i) − log p_kernel(i))` in f64 from both f32
//! logit rows. It must be tiny: the kernels compute the same products as the CPU (they are held
//! per output to `|err| ≤ 2⁻¹⁶·Σ|w·x|`, and measure ~1e-7 of it), so the logits differ only by
//! f32 summation order and the roundings those differences flip downstream. The bound it is held
//! to depends on the numerics ([`KldBound::for_numerics`]; `docs/eval.md`).

use super::kld::{mean_and_err, nll, Est};
use crate::model::{BackendInfo, Numerics, Placement};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The limits the CPU-vs-kernel comparison is held to, in nats.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KldBound {
    /// Mean over scored tokens of `KLD(p_cpu ‖ p_kernel)`.
    pub mean: f64,
    /// Largest single token's KLD.
    pub max: f64,
}

impl KldBound {
    /// Exact f32 activations (`--numerics f32`): the two runs differ only in the order of f32
    /// sums (the kernels measure ~1e-7 of `Σ|w·x|` per output), so logits differ by ~1e-4 at
    /// most and `KLD ≈ ½·Var_p(Δlogit)` stays below ~1e-8.
    pub const F32: KldBound = KldBound {
        mean: 1e-8,
        max: 1e-6,
    };
    /// ggml numerics (the default): the same ~1e-7 differences also flip some of the engine's
    /// own roundings downstream (activations rounded to 8 bits for q8_0/k-quant weights, the f16
    /// KV cache), each flip one rounding step, so a few tokens move by up to ~1e-3 nats. The mean
    /// is held to the KLD resolution the quality checks are built for (1e-4).
    pub const GGML: KldBound = KldBound {
        mean: 5e-4,
        max: 2e-2,
    };

    /// The bound for runs made with `numerics`.
    pub fn for_numerics(numerics: Numerics) -> KldBound {
        match numerics {
            Numerics::F32 => KldBound::F32,
            _ => KldBound::GGML,
        }
    }
}

/// One scored token: the CPU run's row `cpu` and the kernel run's row `kern`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TokenCmp {
    pub kld: f64,
    pub max_abs_diff: f64,
    pub same_top: bool,
    /// The CPU run's NLL of the target.
    pub nll_cpu: f64,
}

/// `log Σ exp(v)` in f64.
fn lse(v: &[f32]) -> f64 {
    let mx = v.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    mx + v.iter().map(|&x| (x as f64 - mx).exp()).sum::<f64>().ln()
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Compare one token's rows exactly (see the module note); `tok` is the target.
pub(crate) fn compare(cpu: &[f32], kern: &[f32], tok: usize) -> TokenCmp {
    let (la, lb) = (lse(cpu), lse(kern));
    let mut kld = 0f64;
    let mut max_abs_diff = 0f64;
    for (&a, &b) in cpu.iter().zip(kern) {
        let (a, b) = (a as f64, b as f64);
        let lpa = a - la;
        kld += lpa.exp() * (lpa - (b - lb));
        max_abs_diff = max_abs_diff.max((a - b).abs());
    }
    TokenCmp {
        // Rounding can leave an identical-to-the-last-ulp pair a hair below zero.
        kld: kld.max(0.0),
        max_abs_diff,
        same_top: argmax(cpu) == argmax(kern),
        // As the evaluation computes it (llama-perplexity's accumulation), so that the CPU run's
        // PPL here is the PPL `--backend cpu` reports.
        nll_cpu: nll(cpu, tok),
    }
}

/// Running sums of the comparison.
#[derive(Clone, Debug, Default)]
pub(crate) struct BackendAccum {
    sum_kld: f64,
    sum_kld2: f64,
    max_kld: f64,
    max_abs_diff: f64,
    same_top: usize,
    sum_nll: f64,
    sum_nll2: f64,
    count: usize,
    pub seconds_backend: f64,
    pub seconds_cpu: f64,
}

impl BackendAccum {
    /// The comparisons of a batch, computed in parallel, accumulated in order.
    /// `rows`: (row of the logits, target token) per scored token.
    pub fn add_rows(&mut self, rows: &[(usize, usize)], cpu: &[f32], kern: &[f32], nv: usize) {
        let v: Vec<TokenCmp> = rows
            .par_iter()
            .map(|&(i, tok)| compare(&cpu[i * nv..(i + 1) * nv], &kern[i * nv..(i + 1) * nv], tok))
            .collect();
        for t in &v {
            self.sum_kld += t.kld;
            self.sum_kld2 += t.kld * t.kld;
            self.max_kld = self.max_kld.max(t.kld);
            self.max_abs_diff = self.max_abs_diff.max(t.max_abs_diff);
            self.same_top += t.same_top as usize;
            self.sum_nll += t.nll_cpu;
            self.sum_nll2 += t.nll_cpu * t.nll_cpu;
            self.count += 1;
        }
    }
}

/// How the kernel run compares with the CPU run on the same windows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub tokens: usize,
    /// PPL of the CPU run (the evaluation's own PPL is the kernel run's).
    pub ppl_cpu: Est,
    /// Mean `KLD(p_cpu ‖ p_kernel)` over the scored tokens, with its standard error.
    pub kld: Est,
    pub kld_max: f64,
    /// Largest |logit_cpu − logit_kernel| over every scored row and vocabulary entry.
    pub max_abs_logit_diff: f64,
    /// Fraction of scored tokens whose most likely next token is the same in both runs.
    pub same_top: f64,
    pub bound: KldBound,
    /// `kld.value ≤ bound.mean` and `kld_max ≤ bound.max`.
    pub within_bound: bool,
    /// Seconds in the kernel run's and the CPU run's forward passes.
    pub seconds_backend: f64,
    pub seconds_cpu: f64,
}

impl Comparison {
    pub(crate) fn of(a: &BackendAccum, bound: KldBound) -> Comparison {
        let kld = mean_and_err(a.sum_kld, a.sum_kld2, a.count);
        let nll = mean_and_err(a.sum_nll, a.sum_nll2, a.count);
        let ppl = nll.value.exp();
        Comparison {
            tokens: a.count,
            ppl_cpu: Est {
                value: ppl,
                err: ppl * nll.err,
            },
            kld,
            kld_max: a.max_kld,
            max_abs_logit_diff: a.max_abs_diff,
            same_top: if a.count > 0 {
                a.same_top as f64 / a.count as f64
            } else {
                1.0
            },
            bound,
            within_bound: kld.value <= bound.mean && a.max_kld <= bound.max,
            seconds_backend: a.seconds_backend,
            seconds_cpu: a.seconds_cpu,
        }
    }
}

/// The backend part of an evaluation's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendReport {
    /// `wgpu`, `cuda`, `metal` or `cpu-emulation`.
    pub backend: String,
    pub device: String,
    /// Bytes of weights resident on the device for the run.
    pub resident_bytes: u64,
    /// Linear weights that ran through the backend's mat-mul kernels, and those that ran on the
    /// CPU, by type (`{"tq4_1s": 210}`), then by name.
    pub on_backend: BTreeMap<String, usize>,
    pub on_cpu: BTreeMap<String, usize>,
    pub backend_tensors: Vec<String>,
    pub cpu_tensors: Vec<String>,
    /// `None` when no weight ran on the backend (the two runs would be the same computation).
    pub comparison: Option<Comparison>,
}

impl BackendReport {
    pub(crate) fn new(info: &BackendInfo, comparison: Option<Comparison>) -> BackendReport {
        let by_type = |on: bool| {
            let mut m = BTreeMap::new();
            for p in info.placements.iter().filter(|p| p.on_backend == on) {
                *m.entry(p.ty.clone()).or_insert(0) += 1;
            }
            m
        };
        let names = |on: bool| -> Vec<String> {
            info.placements
                .iter()
                .filter(|p: &&Placement| p.on_backend == on)
                .map(|p| p.tensor.clone())
                .collect()
        };
        BackendReport {
            backend: info.kind.name().to_string(),
            device: info.device.clone(),
            resident_bytes: info.resident_bytes,
            on_backend: by_type(true),
            on_cpu: by_type(false),
            backend_tensors: names(true),
            cpu_tensors: names(false),
            comparison,
        }
    }

    /// One line per fact, for the text reports of `tq eval` and `tq validate`.
    pub fn render(&self) -> String {
        let counts = |m: &BTreeMap<String, usize>| {
            if m.is_empty() {
                "none".to_string()
            } else {
                m.iter()
                    .map(|(t, n)| format!("{n} {t}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let mut s = format!(
            "Backend: {} on {}: linear weights through its mat-mul kernels: {} ({:.1} MiB resident); on the CPU: {}\n",
            self.backend,
            self.device,
            counts(&self.on_backend),
            self.resident_bytes as f64 / (1 << 20) as f64,
            counts(&self.on_cpu)
        );
        match &self.comparison {
            None => s +=
                "  no weight has a mat-mul kernel: the run is the CPU run (nothing to compare)\n",
            Some(c) => {
                s += &format!(
                    "  vs the CPU run on the same windows: KLD mean {:.3e} +/- {:.1e}, max {:.3e} (bound: mean <= {:.0e}, max <= {:.0e}: {}); max |dlogit| {:.3e}; same top-1 {:.3} %; PPL(cpu) {:.4}; {:.1} s kernels, {:.1} s CPU\n",
                    c.kld.value,
                    c.kld.err,
                    c.kld_max,
                    c.bound.mean,
                    c.bound.max,
                    if c.within_bound { "within" } else { "EXCEEDED" },
                    c.max_abs_logit_diff,
                    100.0 * c.same_top,
                    c.ppl_cpu.value,
                    c.seconds_backend,
                    c.seconds_cpu
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_rows_have_zero_kld_and_a_shift_is_measured() {
        let a: Vec<f32> = (0..100)
            .map(|i| ((i * 37) % 17) as f32 * 0.3 - 2.0)
            .collect();
        let c = compare(&a, &a, 3);
        assert_eq!((c.kld, c.max_abs_diff, c.same_top), (0.0, 0.0, true));
        // A constant shift changes no probability.
        let b: Vec<f32> = a.iter().map(|v| v + 0.5).collect();
        assert!(compare(&a, &b, 3).kld < 1e-12);
        // A perturbation δ: KLD ≈ ½ Var_p(δ).
        let d: Vec<f32> = (0..100)
            .map(|i| if i % 2 == 0 { 1e-3 } else { -1e-3 })
            .collect();
        let b: Vec<f32> = a.iter().zip(&d).map(|(v, d)| v + d).collect();
        let k = compare(&a, &b, 3).kld;
        assert!(k > 1e-8 && k < 1e-6, "{k}");
    }
}
