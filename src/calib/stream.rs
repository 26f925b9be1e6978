//! Block-streaming calibration: one forward pass over *all* calibration windows, block by block,
//! handing each block's finished Hessians to the caller before the next block starts. The caller
//! (`tq convert --calib TEXT`) quantizes and writes that block's tensors and drops its Hessians,
//! so peak memory is one block's weights in f32, its Hessians and the activations at one block
//! boundary (tokens × hidden × 4 bytes per buffer) — independent of the model's depth.
//!
//! The Hessians are the batched mode's, bit for bit: every block sees the original model's
//! activations, and `XᵀX` is accumulated over chunks of `batch` windows, as
//! [`super::run::calibrate`] does per forward pass (each window's activations do not depend on
//! which other windows share the pass).

use super::Hessians;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::layer::LayerWeights;
use crate::model::runtime::{Model, Numerics, Observer};
use crate::quant::Hessian;
use std::path::Path;

/// The Hessian groups a calibration of `f` will produce, block by block in the order the
/// runtime completes them, with their dimensions and the token count but no data (`h` empty):
/// the layout of a Hessian file written as calibration goes. An MoE block's dense groups (attention,
/// router) are followed by each expert's (gate|up, then down, named `TENSOR#e`); their token
/// counts are not known before the block runs (0 here; the writer fills them in).
pub fn layout(f: &GgufFile, tokens: u64) -> Result<Vec<Vec<Hessian>>> {
    let cfg = crate::model::Config::from_gguf(f)?;
    (0..cfg.n_layer)
        .map(|l| {
            let mut v: Vec<Hessian> = LayerWeights::linear_groups(f, l)?
                .into_iter()
                .map(|(names, n)| Hessian {
                    tensors: names,
                    n,
                    h: Vec::new(),
                    tokens,
                })
                .collect();
            if let Some(m) = cfg.moe.as_ref().filter(|_| {
                f.tensor(&crate::model::config::LayerNames::new(l).ffn_gate_inp)
                    .is_some()
            }) {
                let n = crate::model::config::LayerNames::new(l);
                for e in 0..m.n_expert {
                    let key = |t: &str| crate::quant::expert_key(t, e);
                    for (tensors, dim) in [
                        (vec![key(&n.ffn_gate_exps), key(&n.ffn_up_exps)], cfg.n_embd),
                        (vec![key(&n.ffn_down_exps)], m.n_ff_exp),
                    ] {
                        v.push(Hessian {
                            tensors,
                            n: dim,
                            h: Vec::new(),
                            tokens: 0,
                        });
                    }
                }
            }
            Ok(v)
        })
        .collect()
}

/// [`layout`] as one index: the planner marks LDLQ tensors from it before any block runs.
pub fn expected(f: &GgufFile, tokens: u64) -> Result<Hessians> {
    let mut hs = Hessians::default();
    for g in layout(f, tokens)?.into_iter().flatten() {
        hs.groups.insert(g.tensors.join(","), g);
    }
    Ok(hs)
}

struct Blocks<'a> {
    hs: Hessians,
    path: &'a Path,
    n_layer: usize,
    n_win: usize,
    t0: std::time::Instant,
    quiet: bool,
    needed: &'a dyn Fn(&str) -> bool,
    on_block: &'a mut dyn FnMut(usize, &mut Hessians) -> Result<()>,
    /// Tokens routed to each expert of the current block (MoE models), for the routing report.
    routed: Vec<u64>,
    /// Off a terminal, a line every 10 s while a block runs (the per-block lines come only when
    /// a block ends, minutes apart at 7B and up); on a terminal or under `-q`, nothing more.
    bar: crate::io::progress::Bar,
}

/// One line of routing statistics for an MoE block: tokens per expert (each token counts once
/// per expert it is routed to) and the experts under [`crate::quant::hessian::MIN_EXPERT_TOKENS`],
/// which conversion rounds to nearest.
pub fn routing_report(layer: usize, routed: &[u64]) -> String {
    let mut sorted = routed.to_vec();
    sorted.sort_unstable();
    let min_tok = crate::quant::hessian::MIN_EXPERT_TOKENS;
    let few: Vec<String> = routed
        .iter()
        .enumerate()
        .filter(|(_, &t)| t < min_tok)
        .map(|(e, t)| format!("{e} ({t})"))
        .collect();
    format!(
        "tq calib: block {layer} routing: {} experts, tokens per expert min {} / median {} / max {}; {} under {min_tok} tokens (round-to-nearest){}{}",
        routed.len(),
        sorted.first().copied().unwrap_or(0),
        sorted.get(sorted.len() / 2).copied().unwrap_or(0),
        sorted.last().copied().unwrap_or(0),
        few.len(),
        if few.is_empty() { "" } else { ": experts " },
        few.join(", ")
    )
}

impl Observer for Blocks<'_> {
    fn linear_input(
        &mut self,
        layer: Option<usize>,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    ) {
        // A resumed conversion has written these tensors already.
        if layer.is_some() && !tensors.iter().any(|t| (self.needed)(t)) {
            return;
        }
        self.hs.linear_input(layer, tensors, x, rows, cols);
    }

    fn expert_input(
        &mut self,
        layer: usize,
        expert: usize,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    ) {
        // Gate/up and down report the same tokens: count them once.
        if tensors.iter().any(|t| t.contains("ffn_gate_exps")) {
            if self.routed.len() <= expert {
                self.routed.resize(expert + 1, 0);
            }
            self.routed[expert] += rows as u64;
        }
        if !tensors.iter().any(|t| (self.needed)(t)) {
            return;
        }
        self.hs.expert_input(layer, expert, tensors, x, rows, cols);
    }

    fn layer_end(&mut self, layer: usize) -> Result<()> {
        if let Some(e) = self.hs.non_finite.take() {
            return Err(Error::Unsupported(format!("{}: {e}", self.path.display())));
        }
        if !self.routed.is_empty() {
            if !self.quiet {
                eprintln!("{}", routing_report(layer, &self.routed));
            }
            self.routed.clear();
        }
        (self.on_block)(layer, &mut self.hs)?;
        self.bar.set_position(layer as u64 + 1);
        if !self.quiet {
            let t = self.t0.elapsed().as_secs_f64();
            // ETA from the blocks this process has run (a resumed run skips XᵀX before it).
            let eta = t / (layer + 1) as f64 * (self.n_layer - layer - 1) as f64;
            eprintln!(
                "tq calib: block {}/{} ({} windows) in {t:.1} s, ETA {eta:.0} s",
                layer + 1,
                self.n_layer,
                self.n_win,
            );
        }
        Ok(())
    }
}

/// A block-by-block calibration's plain inputs: the model (at `model`, opened as `file`), the
/// windows (`n × ctx` tokens, BOS in place), windows per `XᵀX` chunk, and whether to report.
pub struct Run<'a> {
    pub model: &'a Path,
    pub file: &'a GgufFile,
    pub windows: &'a [u32],
    pub ctx: usize,
    pub batch: usize,
    pub quiet: bool,
}

/// [`run_blocks`] in GPTQ order (`--sequential`, [`super::sequential`]): block `l`'s Hessians come
/// from the model whose earlier blocks and sub-blocks are already quantized as `q` says;
/// `on_block(l, hs)` gets them when block `l` ends and may remove them. Blocks below
/// `replay_until` only replay their quantization from the Hessians `load` reads back (a resumed
/// run); without `load`, every block is accumulated (a resumed conversion recomputes them).
pub fn run_blocks_sequential(
    r: &Run,
    q: &super::sequential::SeqQuant,
    resumed: Option<(usize, &crate::quant::HessianReader)>,
    on_block: &mut dyn FnMut(usize, &mut Hessians) -> Result<()>,
) -> Result<Hessians> {
    let (path, f, windows, ctx, batch, quiet) =
        (r.model, r.file, r.windows, r.ctx, r.batch, r.quiet);
    check_windows(windows, ctx, batch)?;
    let model = Model::new(f, Numerics::F32)?;
    let n_layer = model.cfg.n_layer;
    let done = resumed.map_or(0, |(d, _)| d);
    let t0 = std::time::Instant::now();
    let n_win = windows.len() / ctx;
    let mut on_layer = |hs: &mut Hessians, layers_done: usize| -> Result<()> {
        on_block(layers_done - 1, hs)?;
        if !quiet {
            let t = t0.elapsed().as_secs_f64();
            let eta = t / (layers_done - done) as f64 * (n_layer - layers_done) as f64;
            eprintln!(
                "tq calib: block {layers_done}/{n_layer} ({n_win} windows, {} tokens) in {t:.1} s, ETA {eta:.0} s",
                windows.len(),
            );
        }
        Ok(())
    };
    let hs = Hessians {
        seq: ctx,
        rows_per_accum: batch * ctx,
        ..Default::default()
    };
    let mut obs =
        super::sequential::Sequential::new(hs, q, done, path.display().to_string(), &mut on_layer);
    obs.load = resumed.map(|(_, r)| r);
    model.forward(windows, ctx, ctx - 1, Some(&mut obs))?;
    let [n_ldlq, n_rtn, n_kept] = obs.counts;
    let quant_secs = obs.quant_secs;
    let mut hs = obs.hs;
    if let Some(e) = hs.non_finite.take() {
        return Err(Error::Unsupported(format!("{}: {e}", path.display())));
    }
    if !quiet {
        let total = t0.elapsed().as_secs_f64() - quant_secs;
        let fwd = forward_flops(f, &model.cfg, windows.len(), ctx)?;
        eprintln!(
            "{}",
            flops_report(fwd, total, hs.accum_flops, hs.accum_secs)
        );
        eprintln!(
            "tq calib: sequential: {n_ldlq} tensors quantized with LDLQ, {n_rtn} round-to-nearest, {n_kept} kept as stored ({quant_secs:.1} s quantizing); {:.1} s in all",
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(hs)
}

/// Whole windows of at least 2 tokens, and at least one, in chunks of `batch >= 1`.
pub(crate) fn check_windows(windows: &[u32], ctx: usize, batch: usize) -> Result<()> {
    if ctx < 2 || batch == 0 || windows.is_empty() || !windows.len().is_multiple_of(ctx) {
        return Err(Error::Usage(
            "calibration: --ctx must be >= 2, --batch >= 1, and the input at least one window"
                .into(),
        ));
    }
    Ok(())
}

/// Floating-point operations of the calibration forward pass over `tokens` (windows of `ctx`):
/// every block's linear layers (`2 · tokens · rows · cols`) and causal attention
/// (`QKᵀ` and `PV`: `2 · ctx² · n_head · head_dim` per window and block, half of the square).
/// Norms, RoPE and activations are left out (a few per cent).
pub fn forward_flops(
    f: &GgufFile,
    cfg: &crate::model::Config,
    tokens: usize,
    ctx: usize,
) -> Result<f64> {
    let mut fl = 0.0;
    for l in 0..cfg.n_layer {
        for (names, _) in LayerWeights::linear_groups(f, l)? {
            for n in names {
                let t = f
                    .tensor(&n)
                    .ok_or_else(|| Error::bad_input(&f.path, format!("missing tensor {n}")))?;
                fl += 2.0 * tokens as f64 * t.n_elements() as f64;
            }
        }
        if let Some(m) = &cfg.moe {
            // Each token runs n_used experts: gate, up and down.
            fl += 2.0 * (tokens * m.n_used * 3 * cfg.n_embd * m.n_ff_exp) as f64;
        }
        let windows = (tokens / ctx.max(1)) as f64;
        fl += windows * 2.0 * (ctx * ctx) as f64 * (cfg.n_head * cfg.head_dim) as f64;
    }
    Ok(fl)
}

/// One line: where a calibration pass's time went and the rates it reached.
pub fn flops_report(fwd_flops: f64, total_secs: f64, xtx_flops: f64, xtx_secs: f64) -> String {
    let fwd_secs = (total_secs - xtx_secs).max(1e-9);
    format!(
        "tq calib: forward {:.2} TFLOP in {fwd_secs:.1} s ({:.1} GFLOP/s); XᵀX (symmetric, half) {:.2} TFLOP in {xtx_secs:.1} s ({:.1} GFLOP/s)",
        fwd_flops / 1e12,
        fwd_flops / fwd_secs / 1e9,
        xtx_flops / 1e12,
        xtx_flops / xtx_secs.max(1e-9) / 1e9,
    )
}

/// Calibrate `f` (at `path`) on `windows` (`n × ctx` tokens, BOS in place) block by block:
/// `on_block(l, hs)` is called when block `l`'s Hessians are complete; it may remove groups from
/// `hs` (they are not touched again). Only inputs of linear sets with a tensor `needed` are
/// accumulated (a resumed run skips what it has written). Returns the groups left in `hs`.
pub fn run_blocks(
    r: &Run,
    needed: &dyn Fn(&str) -> bool,
    on_block: &mut dyn FnMut(usize, &mut Hessians) -> Result<()>,
) -> Result<Hessians> {
    let (path, f, windows, ctx, batch, quiet) =
        (r.model, r.file, r.windows, r.ctx, r.batch, r.quiet);
    check_windows(windows, ctx, batch)?;
    let model = Model::new(f, Numerics::F32)?;
    let mut obs = Blocks {
        hs: Hessians {
            seq: ctx,
            rows_per_accum: batch * ctx,
            ..Default::default()
        },
        path,
        n_layer: model.cfg.n_layer,
        n_win: windows.len() / ctx,
        t0: std::time::Instant::now(),
        quiet,
        needed,
        on_block,
        routed: vec![],
        bar: crate::io::progress::steps(
            quiet || std::io::IsTerminal::is_terminal(&std::io::stderr()),
            model.cfg.n_layer as u64,
            "calibration blocks",
        ),
    };
    // The logits of the last position only: the output projection is not calibrated.
    let t0 = std::time::Instant::now();
    model.forward(windows, ctx, ctx - 1, Some(&mut obs))?;
    obs.bar.finish_and_clear();
    if let Some(e) = obs.hs.non_finite.take() {
        return Err(Error::Unsupported(format!("{}: {e}", path.display())));
    }
    if !quiet {
        let total = t0.elapsed().as_secs_f64();
        let fwd = forward_flops(f, &model.cfg, windows.len(), ctx)?;
        eprintln!(
            "{}",
            flops_report(fwd, total, obs.hs.accum_flops, obs.hs.accum_secs)
        );
    }
    Ok(obs.hs)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::gguf_gen;

    /// The streaming pipeline plans LDLQ from the Hessians a pass *will* produce
    /// (`calib::stream::expected`): they must be exactly the groups a calibration fills, with the same
    /// dimensions and token counts; and the block-by-block pass must fill them bit for bit as the
    /// batched pass does, for any `--batch`.
    #[test]
    fn streamed_hessians_are_the_batched_ones() {
        let dir = tempfile::tempdir().unwrap();
        let fx = gguf_gen::tiny_llama(2, 64, 128, 96);
        let model = dir.path().join("tiny.gguf");
        std::fs::write(&model, &fx.bytes).unwrap();
        let f = crate::gguf::GgufFile::open(&model).unwrap();
        let ctx = 16;
        let windows: Vec<u32> = (0..6 * ctx as u32)
            .map(|i| (i * i + 7 * (i / 5)) % 96)
            .collect();
        for batch in [1, 4] {
            // The window-major oracle: one forward pass of all blocks per batch of windows, each
            // adding its XᵀX tiles (what `tq calib` did before it streamed block by block).
            let model_rt = Model::new(&f, Numerics::F32).unwrap();
            let mut batched = crate::quant::Hessians::default();
            for (i, chunk) in windows.chunks(batch * ctx).enumerate() {
                batched.seq = ctx;
                batched.window0 = i * batch;
                model_rt
                    .forward(chunk, ctx, ctx - 1, Some(&mut batched))
                    .unwrap();
            }
            let expected = super::expected(&f, windows.len() as u64).unwrap();
            let shape = |h: &crate::quant::Hessians| -> Vec<(String, usize, u64)> {
                h.groups
                    .iter()
                    .map(|(k, g)| (k.clone(), g.n, g.tokens))
                    .collect()
            };
            assert_eq!(shape(&batched), shape(&expected));
            let mut streamed = crate::quant::Hessians::default();
            let mut blocks = Vec::new();
            let run = super::Run {
                model: &model,
                file: &f,
                windows: &windows,
                ctx,
                batch,
                quiet: true,
            };
            super::run_blocks(&run, &|_| true, &mut |l, hs| {
                blocks.push(l);
                // Each block's groups are complete when it ends: move them out (as convert drops them).
                let done: Vec<String> = hs.groups.keys().cloned().collect();
                for k in done {
                    let g = hs.groups.remove(&k).unwrap();
                    assert!(
                        g.tensors[0].starts_with(&format!("blk.{l}.")),
                        "{k} at block {l}"
                    );
                    streamed.groups.insert(k, g);
                }
                Ok(())
            })
            .unwrap();
            assert_eq!(blocks, vec![0, 1]);
            assert_eq!(shape(&streamed), shape(&batched));
            for (k, g) in &batched.groups {
                let s = &streamed.groups[k];
                assert!(
                    g.h.iter()
                        .zip(&s.h)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "batch {batch}: {k} differs"
                );
            }
        }
    }
}
