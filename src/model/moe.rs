//! The mixture-of-experts feed-forward of a block (llama.cpp's `build_moe_ffn` with softmax
//! gating): routing and the per-expert SwiGLU, one expert's weights dequantized at a time.

use super::config::{LayerNames, Moe};
use super::layer::{glu_rows, Experts, LinearSet};
use super::runtime::{Model, Observer};
use crate::error::Result;
use rayon::prelude::*;

/// Expert `x`'s slices of block `names`' expert tensors: gate | up (`nff` rows each), down.
fn load_expert(
    f: &crate::gguf::GgufFile,
    names: &LayerNames,
    x: usize,
    nff: usize,
    e: usize,
) -> Result<(LinearSet, LinearSet)> {
    let gate_up = [names.ffn_gate_exps.as_str(), names.ffn_up_exps.as_str()];
    let gu = LinearSet::load_rows(f, &gate_up, x * nff, (x + 1) * nff)?;
    let down = LinearSet::load_rows(f, &[&names.ffn_down_exps], x * e, (x + 1) * e)?;
    Ok((gu, down))
}

impl Model<'_> {
    /// The mixture-of-experts feed-forward of block `l` on normed rows `h` (`rows × n_embd`)
    /// (the caller reports the router's input to an observer),
    /// into `out` (llama.cpp's `build_moe_ffn` for softmax gating): router logits → softmax →
    /// the `n_used` most probable experts (ties: lower index, as ggml's argsort keeps them for
    /// up to 16 experts) → weights renormalized → each expert's SwiGLU on its rows, scaled by
    /// its weight → the slots summed in rank order. With `experts` (a block-major pass), each
    /// expert's weights are dequantized on first use and kept there for the pass's next batches;
    /// without, one expert's weights are dequantized at a time and dropped.
    // One function on purpose: routing, the per-expert loop and the ordered sum are the contract.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_ffn<'o, 'p>(
        &self,
        l: usize,
        moe: &Moe,
        router: &LinearSet,
        mut experts: Option<&mut Experts>,
        h: &[f32],
        rows: usize,
        out: &mut [f32],
        mut observer: Option<&'o mut (dyn Observer + 'p)>,
    ) -> Result<()> {
        let e = self.cfg.n_embd;
        let (nx, k, nff) = (moe.n_expert, moe.n_used, moe.n_ff_exp);
        let (ggml, threads) = (self.ggml(), self.threads());
        let mut logits = vec![0f32; rows * nx];
        router.forward_on(h, rows, &mut logits, ggml, threads, None)?;
        let (sel, wts) = route(&logits, rows, moe);
        // Rows routed to each expert, with their (row, rank) slots, in token order.
        let mut routed: Vec<Vec<(usize, usize)>> = vec![vec![]; nx];
        for r in 0..rows {
            for j in 0..k {
                routed[sel[r * k + j]].push((r, j));
            }
        }
        let names = LayerNames::new(l);
        let gate_up = [names.ffn_gate_exps.as_str(), names.ffn_up_exps.as_str()];
        let mut slots = vec![0f32; rows * k * e];
        for (x, list) in routed.iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let n = list.len();
            let mut xe = vec![0f32; n * e];
            for (i, &(r, _)) in list.iter().enumerate() {
                xe[i * e..(i + 1) * e].copy_from_slice(&h[r * e..(r + 1) * e]);
            }
            if let Some(o) = observer.as_deref_mut() {
                o.expert_input(l, x, &gate_up, &xe, n, e);
            }
            let once: Option<(LinearSet, LinearSet)>;
            let (gu_set, down) = match experts.as_deref_mut() {
                Some(c) => {
                    if c.loaded.len() < nx {
                        c.loaded.resize_with(nx, || None);
                    }
                    if c.loaded[x].is_none() {
                        c.loaded[x] = Some(load_expert(self.file, &names, x, nff, e)?);
                    }
                    c.loaded[x].as_ref()
                }
                None => {
                    once = Some(load_expert(self.file, &names, x, nff, e)?);
                    once.as_ref()
                }
            }
            .map(|(a, b)| (a, b))
            .ok_or_else(|| crate::error::Error::internal("an expert's weights were not loaded"))?;
            let mut gu = vec![0f32; n * 2 * nff];
            gu_set.forward(&xe, n, &mut gu, ggml, threads);
            let mut act = vec![0f32; n * nff];
            glu_rows(&gu, &mut act, nff, false, ggml);
            if let Some(o) = observer.as_deref_mut() {
                o.expert_input(l, x, &[&names.ffn_down_exps], &act, n, nff);
            }
            let mut ye = vec![0f32; n * e];
            down.forward(&act, n, &mut ye, ggml, threads);
            for (i, &(r, j)) in list.iter().enumerate() {
                let w = wts[r * k + j];
                let dst = &mut slots[(r * k + j) * e..(r * k + j + 1) * e];
                for (d, v) in dst.iter_mut().zip(&ye[i * e..(i + 1) * e]) {
                    *d = v * w;
                }
            }
        }
        out[..rows * e]
            .par_chunks_mut(e)
            .zip(slots.par_chunks(k * e))
            .for_each(|(o, s)| {
                o.copy_from_slice(&s[..e]);
                for j in 1..k {
                    o.iter_mut()
                        .zip(&s[j * e..(j + 1) * e])
                        .for_each(|(a, b)| *a += b);
                }
            });
        Ok(())
    }
}

/// Top-k routing of router logits (`rows × n_expert`): per row the chosen experts in rank order
/// and their weights (`rows × n_used` each). Softmax as ggml's (max-shifted `exp`, the sum in
/// f64, one f32 reciprocal), a stable descending sort (ties: lower index first), then the
/// weights renormalized by their f32 sum (clamped below at 2⁻¹⁴, as llama.cpp) and scaled.
pub(crate) fn route(logits: &[f32], rows: usize, moe: &Moe) -> (Vec<usize>, Vec<f32>) {
    let (nx, k) = (moe.n_expert, moe.n_used);
    let mut sel = vec![0usize; rows * k];
    let mut wts = vec![0f32; rows * k];
    for r in 0..rows {
        let z = &logits[r * nx..(r + 1) * nx];
        let mx = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut p: Vec<f32> = z.iter().map(|v| (v - mx).exp()).collect();
        let sum: f64 = p.iter().map(|&v| v as f64).sum();
        let inv = (1.0 / sum) as f32;
        p.iter_mut().for_each(|v| *v *= inv);
        let mut idx: Vec<usize> = (0..nx).collect();
        idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let w = &mut wts[r * k..(r + 1) * k];
        for j in 0..k {
            sel[r * k + j] = idx[j];
            w[j] = p[idx[j]];
        }
        if moe.norm {
            let s: f32 = w.iter().sum::<f32>().max(6.103_515_6e-5);
            w.iter_mut().for_each(|v| *v /= s);
        }
        if let Some(sc) = moe.scale {
            w.iter_mut().for_each(|v| *v *= sc);
        }
    }
    (sel, wts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moe(n_expert: usize, n_used: usize, norm: bool) -> Moe {
        Moe {
            n_expert,
            n_used,
            n_ff_exp: 1,
            norm,
            scale: None,
        }
    }

    #[test]
    fn routing_picks_the_most_probable_and_breaks_ties_by_lower_index() {
        // Row 0: distinct logits. Row 1: all equal (every expert tied): experts 0 and 1, as
        // ggml's argsort (an insertion sort for up to 16 values) keeps equal values in order.
        // Row 2: a tie at the k boundary between experts 1 and 3.
        let logits = [
            0.1f32, 2.0, -1.0, 1.5, //
            0.5, 0.5, 0.5, 0.5, //
            3.0, 1.0, -2.0, 1.0,
        ];
        let (sel, w) = route(&logits, 3, &moe(4, 2, true));
        assert_eq!(sel, vec![1, 3, 0, 1, 0, 1]);
        for r in 0..3 {
            assert!((w[2 * r] + w[2 * r + 1] - 1.0).abs() < 1e-6, "renormalized");
        }
        assert_eq!(w[2], w[3]);
        // Softmax ratio kept: p1/p3 = e^(2.0-1.5).
        assert!((w[0] / w[1] - (0.5f32).exp()).abs() < 1e-5);
        // Without renormalization the weights are the softmax probabilities.
        let (_, w) = route(&logits[..4], 1, &moe(4, 2, false));
        let z: f32 = logits[..4].iter().map(|v| v.exp()).sum();
        assert!((w[0] - 2f32.exp() / z).abs() < 1e-6);
    }
}
