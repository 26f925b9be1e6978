//! The mix's KLD probes without copies: the input model with a few tensors replaced in memory by
//! the bytes a conversion would write for them ([`GgufFile::with_tensors`]), evaluated against
//! the input's reference logits. A probe whose tensors all sit in block `l` or later starts from
//! the input's own hidden states at block `l`'s input (bit for bit what its whole pass would
//! compute there, since blocks `0..l` are unchanged), so it computes blocks `l..L` and the head
//! only; a probe of the output projection computes the head only; one of the token embeddings
//! runs whole.
//!
//! Probes are run in the order of their first block. The hidden states of one block boundary
//! are kept (`windows × 512 × n_embd × 4` bytes: 2.4 MB for SmolLM2 at 2 windows, 16.8 MB for
//! a 7B shape) and advanced through the input's blocks as the probes move down the model, so the
//! states cost one extra forward pass of the input over all probes together.

use crate::error::Result;
use crate::eval::logits_file::Reader;
use crate::eval::{evaluate, evaluate_from, session, Reference, Resume, Windows};
use crate::gguf::GgufFile;
use crate::model::{Batches, Model, Numerics};
use crate::types::TensorType;
use std::path::Path;

/// A tensor's replacement: name, type, the type's id in the output profile, the bytes.
/// The bytes are shared: one encoding of a (tensor, type) serves every plan that holds it.
pub(crate) type Substitute = (String, TensorType, u32, std::sync::Arc<Vec<u8>>);

/// Runs blocks `0..n_layer` in order through the function it is given ([`Probes::kld_streamed`]).
pub(crate) type Driver<'d> = &'d mut dyn FnMut(&mut dyn FnMut(usize) -> Result<()>) -> Result<()>;

/// Where a forward pass reads a tensor: the embedding lookup, one block, or the output head.
/// Ordered as the pass runs.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Stage {
    Embed,
    Block(usize),
    Head,
}

/// The input model, its windows and reference, and the hidden states at one block boundary.
pub(crate) struct Probes<'a> {
    file: &'a GgufFile,
    reference: Model<'a>,
    win: Windows,
    batch: usize,
    ref_logits: &'a Path,
    /// `states[b]`: batch `b`'s hidden states at block `at`'s input (empty: not computed yet).
    at: usize,
    states: Vec<Vec<f32>>,
    /// Blocks run per probe, summed (the compute the probes cost, in block passes).
    pub(crate) blocks_run: usize,
}

impl<'a> Probes<'a> {
    /// Probes of `file` (the input) on the `windows` windows of `ref_logits` (its own logits).
    pub(crate) fn new(file: &'a GgufFile, ref_logits: &'a Path, windows: usize) -> Result<Self> {
        let reference = Model::new(file, Numerics::Ggml)?;
        let (win, _) =
            session::windows_and_reference(file, None, 512, Some(windows), Some(ref_logits), None)?;
        let batch = session::default_batch(&win, reference.cfg.n_vocab, false);
        Ok(Probes {
            file,
            reference,
            win,
            batch,
            ref_logits,
            at: 0,
            states: vec![],
            blocks_run: 0,
        })
    }

    /// The first block a change to `names` affects: 0 for the token embeddings, the block of a
    /// block tensor, `n_layer` (the head only) for the output projection and final norm.
    pub(crate) fn start_of(&self, names: &[&str]) -> usize {
        let n = self.reference.cfg.n_layer;
        names
            .iter()
            .map(|name| match crate::arch::layer_of(name) {
                Some(l) => (l as usize).min(n),
                None if *name == "token_embd.weight" => 0,
                None => n,
            })
            .min()
            .unwrap_or(n)
    }

    /// The stages that read tensor `name`: its block; the embeddings (and the head too when the
    /// output projection is tied to them); the head for the other tensors outside the blocks.
    pub(crate) fn stages_of(&self, name: &str) -> Vec<Stage> {
        let cfg = &self.reference.cfg;
        match crate::arch::layer_of(name) {
            Some(l) if (l as usize) < cfg.n_layer => vec![Stage::Block(l as usize)],
            None if name == "token_embd.weight" && cfg.tied_output => {
                vec![Stage::Embed, Stage::Head]
            }
            None if name == "token_embd.weight" => vec![Stage::Embed],
            _ => vec![Stage::Head],
        }
    }

    /// The rows of `name` the probes' passes read, when that is not every row: the token
    /// embeddings' rows of the windows' tokens (sorted, distinct), unless the output projection
    /// is tied to them (the head reads every row). None for every other tensor.
    pub(crate) fn rows_read(&self, name: &str) -> Option<Vec<u64>> {
        if name != "token_embd.weight" || self.reference.cfg.tied_output {
            return None;
        }
        let mut rows: Vec<u64> = self
            .win
            .input(0, self.win.n_chunk)
            .into_iter()
            .map(u64::from)
            .collect();
        rows.sort_unstable();
        rows.dedup();
        Some(rows)
    }

    /// The input's block count.
    pub(crate) fn n_layer(&self) -> usize {
        self.reference.cfg.n_layer
    }

    /// The windows of each batch, in order.
    fn batch_ranges(&self) -> Vec<(usize, usize)> {
        (0..self.win.n_chunk)
            .step_by(self.batch)
            .map(|w0| (w0, (w0 + self.batch).min(self.win.n_chunk)))
            .collect()
    }

    /// The mean KLD of each of `n` variants of the input (models with tensors replaced), run
    /// together stage by stage: `subs(stage, k)` gives variant `k`'s replacements for `stage`
    /// (called for `k = 0..n` in turn, just before that variant runs the stage, stages in pass
    /// order: [`Stage::Embed`], every block, [`Stage::Head`]); each is dropped once its variant
    /// has run the stage; `ran()` after each variant's stage. So the caller need hold only one stage's encoded tensors (a block's, shared by the
    /// variants that hold the same (tensor, type)) and each variant its hidden states
    /// (`windows × ctx × n_embd` f32), never a whole quantized model; each block of the input is
    /// read once for all variants. Each KLD is bit for bit what [`Probes::kld`] gives for the
    /// variant's replacements all at once: every block and the head run on the same batches with
    /// the same weights, and the KLD accumulates in the same order.
    ///
    /// `drive`, when given, runs the blocks: it calls its argument with each block `0..n_layer`
    /// in order (a streamed calibration pass does, from inside the pass, so that `subs` of a
    /// block can encode under that block's Hessians while they are alive); without it the
    /// blocks run in a plain loop.
    pub(crate) fn kld_streamed(
        &mut self,
        n: usize,
        subs: &mut dyn FnMut(Stage, usize) -> Result<Vec<Substitute>>,
        ran: &dyn Fn(),
        drive: Option<Driver>,
    ) -> Result<Vec<f64>> {
        let (ctx, first, batch) = (self.win.n_ctx, self.win.first(), self.batch);
        let n_layer = self.reference.cfg.n_layer;
        let ranges = self.batch_ranges();
        // Embeddings: the input's own for every variant that keeps token_embd.
        let mut plain: Option<Vec<Vec<f32>>> = None;
        let mut states: Vec<Vec<Vec<f32>>> = Vec::with_capacity(n);
        for k in 0..n {
            let sk = subs(Stage::Embed, k)?;
            let x = if sk.is_empty() {
                if plain.is_none() {
                    let e: Result<Vec<_>> = ranges
                        .iter()
                        .map(|&(w0, w1)| self.reference.embed(&self.win.input(w0, w1)))
                        .collect();
                    plain = Some(e?);
                }
                plain.clone().unwrap_or_default()
            } else {
                let view = self.file.with_tensors(sk)?;
                let m = Model::new(&view, Numerics::Ggml)?;
                let e: Result<Vec<_>> = ranges
                    .iter()
                    .map(|&(w0, w1)| m.embed(&self.win.input(w0, w1)))
                    .collect();
                e?
            };
            states.push(x);
            ran();
        }
        drop(plain);
        // Blocks: each variant's states through block l with its replacements, then the next.
        let mut next = 0usize;
        {
            let file = self.file;
            let mut block = |l: usize| -> Result<()> {
                if l != next {
                    return Err(crate::error::Error::internal(format!(
                        "measured plans: block {l} run where block {next} was due"
                    )));
                }
                next += 1;
                for k in 0..n {
                    let sk = subs(Stage::Block(l), k)?;
                    let view = file.with_tensors(sk)?;
                    let m = Model::new(&view, Numerics::Ggml)?;
                    let mut b = Batches {
                        seq: ctx,
                        out_from: first,
                        batches: ranges
                            .iter()
                            .zip(std::mem::take(&mut states[k]))
                            .map(|(&(w0, w1), x)| (w1 - w0, x))
                            .collect(),
                    };
                    m.blocks_major(&mut b, l..l + 1, &mut |_, _| {})?;
                    states[k] = b.batches.into_iter().map(|(_, x)| x).collect();
                    ran();
                }
                Ok(())
            };
            match drive {
                Some(d) => d(&mut block)?,
                None => (0..n_layer).try_for_each(&mut block)?,
            }
        }
        if next != n_layer {
            return Err(crate::error::Error::internal(format!(
                "measured plans: {next} of {n_layer} blocks run"
            )));
        }
        self.blocks_run += n * n_layer;
        // The head, resumed from each variant's last block's output rows.
        let mut out = Vec::with_capacity(n);
        for k in 0..n {
            let sk = subs(Stage::Head, k)?;
            let view = self.file.with_tensors(sk)?;
            let m = Model::new(&view, Numerics::Ggml)?;
            let reference = Reference::File(Reader::open(self.ref_logits)?);
            let held = std::cell::RefCell::new(std::mem::take(&mut states[k]));
            let get = |w0: usize, _: usize| Ok(std::mem::take(&mut held.borrow_mut()[w0 / batch]));
            let r = Resume {
                layer: n_layer,
                states: &get,
            };
            let res = evaluate_from(&m, &self.win, reference, batch, &r)?;
            out.push(res.kld.map(|k| k.kld.value).ok_or_else(|| {
                crate::error::Error::internal("no KLD was computed against the reference")
            })?);
            ran();
        }
        Ok(out)
    }

    /// Advance the kept hidden states to block `to`'s input (from the embeddings when `to` is
    /// behind them).
    fn advance(&mut self, to: usize) -> Result<()> {
        let (ctx, first) = (self.win.n_ctx, self.win.first());
        if self.states.is_empty() || to < self.at {
            self.states.clear();
            let mut w0 = 0;
            while w0 < self.win.n_chunk {
                let w1 = (w0 + self.batch).min(self.win.n_chunk);
                self.states
                    .push(self.reference.embed(&self.win.input(w0, w1))?);
                w0 = w1;
            }
            self.at = 0;
        }
        if to == self.at {
            return Ok(());
        }
        // Block-major: each block of the input is loaded once for all batches.
        let mut b = Batches {
            seq: ctx,
            out_from: first,
            batches: Vec::with_capacity(self.states.len()),
        };
        for (i, s) in self.states.iter_mut().enumerate() {
            let n_win = (self.win.n_chunk - i * self.batch).min(self.batch);
            b.batches.push((n_win, std::mem::take(s)));
        }
        self.reference
            .blocks_major(&mut b, self.at..to, &mut |_, _| {})?;
        self.states = b.batches.into_iter().map(|(_, x)| x).collect();
        self.at = to;
        Ok(())
    }

    /// The mean KLD of the input with `subs` in place of its tensors, against the reference.
    pub(crate) fn kld(&mut self, subs: Vec<Substitute>) -> Result<f64> {
        let names: Vec<&str> = subs.iter().map(|s| s.0.as_str()).collect();
        let start = self.start_of(&names);
        let view = self.file.with_tensors(subs)?;
        let m = Model::new(&view, Numerics::Ggml)?;
        let reference = Reference::File(Reader::open(self.ref_logits)?);
        let n = m.cfg.n_layer;
        self.blocks_run += n - start;
        let res = if start == 0 {
            evaluate(&m, &self.win, reference, None, self.batch, &|_, _| {})?
        } else {
            self.advance(start)?;
            let (states, batch) = (&self.states, self.batch);
            let get = |w0: usize, _: usize| Ok(states[w0 / batch].clone());
            let r = Resume {
                layer: start,
                states: &get,
            };
            evaluate_from(&m, &self.win, reference, self.batch, &r)?
        };
        res.kld.map(|k| k.kld.value).ok_or_else(|| {
            crate::error::Error::internal("no KLD was computed against the reference")
        })
    }
}

/// Elements above which a KLD probe quantizes a sample of the tensor's rows rather than the whole
/// tensor ([`row_probe`]). Every tensor of SmolLM2 (at most 576 × 1536) is at or below it, so its
/// probes are whole tensors, as before; a 7B `attn_q` (4096 × 4096) is probed on 256 rows, a 7B
/// `ffn_down` (11008 wide) on 96.
pub(crate) const PROBE_ELEMENTS: u64 = 1 << 20;

/// [`PROBE_ELEMENTS`], or `TQ_PROBE_ELEMENTS` when set to a positive integer (a measurement knob:
/// how the fit moves when smaller tensors are sampled too, docs/bench/scale.md).
pub(crate) fn probe_elements() -> u64 {
    env_count("TQ_PROBE_ELEMENTS", PROBE_ELEMENTS)
}

/// The positive integer in environment variable `var` (a measurement knob), else `default`.
pub(crate) fn env_count(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// What a row sample's rows hold: the quantized values (a probe), or their error amplified to
/// stand for the whole tensor's (a measured plan, [`row_probe`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Sample {
    Plain,
    Amplified,
}

/// A probe on a sample of a tensor's rows (`cap / n` rounded up, evenly spaced): the sampled rows'
/// quantized values in the input's float type, and their summed weighted error
/// `Σ Δw H Δwᵀ / tokens` (the sensitivity's units). It holds only the sample until it runs
/// ([`RowProbe::substitute`]), so probes encoded ahead (in a calibration pass) cost their rows,
/// not a tensor copy each (a 70B `ffn_down` in f16 is 470 MB).
pub(crate) struct RowProbe {
    name: String,
    /// The sampled rows, and their bytes in the input's type (one row after another).
    pub(super) picks: Vec<u64>,
    pub(super) rows: Vec<u8>,
    pub(crate) err: f64,
}

impl RowProbe {
    /// The sample of rows `picks` of tensor `name` holding values `q` (`n` per row), stored in
    /// the input's own float type `input`, with weighted error `err`.
    pub(super) fn from_values(
        name: &str,
        input: TensorType,
        picks: Vec<u64>,
        q: &[f32],
        n: usize,
        err: f64,
    ) -> Result<RowProbe> {
        let near = crate::quant::Encoder::Nearest;
        Ok(RowProbe {
            name: name.to_string(),
            picks,
            rows: crate::quant::encode_rows(input, name, q, n, &near)?,
            err,
        })
    }

    /// The replacement: the input's bytes with the sampled rows' quantized values.
    pub(crate) fn substitute(&self, file: &GgufFile) -> Result<Substitute> {
        let t = file.tensor(&self.name).ok_or_else(|| {
            crate::error::Error::internal(format!("{}: no such tensor", self.name))
        })?;
        let rb = self.rows.len() / self.picks.len().max(1);
        let mut data = file.tensor_data(t).to_vec();
        for (k, &r) in self.picks.iter().enumerate() {
            let at = r as usize * rb;
            data[at..at + rb].copy_from_slice(&self.rows[k * rb..(k + 1) * rb]);
        }
        Ok((
            self.name.clone(),
            t.ty,
            t.type_id,
            std::sync::Arc::new(data),
        ))
    }
}

/// Probe entry `i` (a 2-D tensor stored as f32, f16 or bf16 in `file`, with Hessian `hs[0]`) at
/// `ty` on `rows_for(elements)` evenly spaced rows when it has more than `cap` elements: the rows
/// are quantized as convert would (the sensitivity's encoder: LDLQ with the Hessian's factor,
/// `ldlq`'s settings; `factors` caches factors across calls, the caller clears it when the
/// Hessian changes) and decoded; the other rows keep the input's bytes, so the runtime computes
/// them exactly as in the reference. LDLQ quantizes rows independently, so the sampled rows'
/// values are those of the whole tensor's encoding (tested), at `rows / n_rows` of its sweep cost.
/// Under a first-order model both the KLD and the weighted error add over rows, so
/// `KLD(sample) / err(sample)` estimates the whole tensor's `KLD / err` — all the fit uses.
/// A 3-D expert stack (`hs[x]`: expert `x`'s Hessian) is sampled across its experts
/// ([`expert_picks`]), each expert's rows quantized as convert quantizes that expert, and its
/// error weighted by the expert's share of the routed tokens (the sensitivity's units).
/// None: at or below `cap` elements, not 2-D or 3-D, a quantized source or no matching Hessian
/// (the whole tensor is probed).
///
/// With [`Sample::Amplified`] (the measured plans) each sampled row holds `w + s·(q − w)` instead
/// of `q`, with `s = √(n_rows / sampled rows)`: its quantization error scaled so that the
/// sample's expected weighted error (`s²` times the sampled rows' sum) is the whole tensor's, and
/// a plan of many sampled tensors is measured in one pass as an unbiased estimate, to second
/// order, of the whole plan's KLD (the cross terms between rows average to zero). `err` stays
/// the sampled rows' unscaled error.
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_probe(
    file: &GgufFile,
    src: &dyn crate::source::TensorSource,
    e: &crate::plan::PlanEntry,
    i: usize,
    ty: TensorType,
    hs: &[Option<&crate::quant::Hessian>],
    ldlq: crate::quant::LdlqSettings,
    factors: &mut crate::quant::sensitivity::Factors,
    cap: u64,
    sample: Sample,
) -> Result<Option<RowProbe>> {
    use crate::quant::sensitivity::{encode, row_errors, Weighting};
    let (n, n_rows, per) = match e.dims[..] {
        [n, r] => (n, r, r),
        [n, per, x] => (n, per * x, per),
        _ => return Ok(None),
    };
    let Some(t) = file.tensor(&e.name) else {
        return Ok(None);
    };
    let float = matches!(t.ty, TensorType::F32 | TensorType::F16 | TensorType::BF16);
    let hs: Vec<Option<&crate::quant::Hessian>> =
        hs.iter().map(|h| h.filter(|h| h.n as u64 == n)).collect();
    // The routed tokens of an expert stack (a dense tensor: its Hessian's own).
    let total: u64 = hs.iter().flatten().map(|h| h.tokens).sum();
    // (An expert outside the sample may come without its matrix: only its tokens count.)
    let shaped = if e.dims.len() == 2 {
        hs.len() == 1 && hs[0].is_some()
    } else {
        hs.len() as u64 == n_rows / per && total > 0
    };
    if n * n_rows <= cap || !float || t.n_elements() != n * n_rows || !shaped {
        return Ok(None);
    }
    let n = n as usize;
    let picks = sample_picks(&e.dims, cap);
    let mut rows = vec![0f32; picks.len() * n];
    for (r, buf) in picks.iter().zip(rows.chunks_mut(n)) {
        src.read_rows_f32(i, *r, buf)?;
        crate::quant::check_finite(&e.name, *r, buf)?;
    }
    let mut q = vec![0f32; rows.len()];
    let mut err = 0f64;
    // The picks of one expert (all of them for a dense tensor) are consecutive: each run is
    // quantized under its Hessian as convert quantizes it.
    let mut at = 0;
    while at < picks.len() {
        let x = (picks[at] / per) as usize;
        let end = at
            + picks[at..]
                .iter()
                .take_while(|&&r| r / per == x as u64)
                .count();
        let (a, b) = (at * n, end * n);
        let mut own = crate::quant::sensitivity::Factors::new();
        let (w, share, factors) = match (e.dims.len(), hs[x]) {
            (2, Some(h)) => (Weighting::Hessian { h, ldlq }, 1.0, &mut *factors),
            // An expert as convert encodes it: LDLQ from MIN_EXPERT_TOKENS routed tokens,
            // round-to-nearest below (its error still under its Hessian), round-to-nearest
            // and no error where no token was routed.
            (_, Some(h)) if h.tokens > 0 && h.h.len() == h.n * h.n => {
                let share = h.tokens as f64 / total as f64;
                match h.tokens >= crate::quant::hessian::MIN_EXPERT_TOKENS {
                    true => (Weighting::Hessian { h, ldlq }, share, &mut own),
                    false => (Weighting::HessianRtn(h), share, &mut own),
                }
            }
            _ => (Weighting::Identity, 0.0, &mut own),
        };
        let bytes = encode(&e.name, &rows[a..b], n, ty, &w, factors)?;
        crate::quant::decode_rows(ty, &bytes, &mut q[a..b], n, &e.name)?;
        if share > 0.0 {
            err += share * row_errors(&rows[a..b], &q[a..b], n, &w).iter().sum::<f64>();
        }
        at = end;
    }
    if sample == Sample::Amplified {
        amplify(
            &mut q,
            &rows,
            (n_rows as f64 / picks.len() as f64).sqrt() as f32,
        );
    }
    RowProbe::from_values(&e.name, t.ty, picks, &q, n, err).map(Some)
}

/// Each quantized value `q` of the weights `w` replaced by `w + s·(q − w)`: its quantization
/// error scaled by `s`, so that a sample's error stands for more rows than it holds.
pub(super) fn amplify(q: &mut [f32], w: &[f32], s: f32) {
    for (y, x) in q.iter_mut().zip(w) {
        *y = *x + s * (*y - *x);
    }
}

/// The rows [`row_probe`] samples from a tensor of shape `dims` under `cap`: `⌈cap / n⌉` evenly
/// spaced rows of a 2-D tensor, or of a 3-D expert stack spread by [`expert_picks`].
pub(crate) fn sample_picks(dims: &[u64], cap: u64) -> Vec<u64> {
    use crate::quant::sensitivity::sample_rows;
    let k = cap.div_ceil(dims[0].max(1)) as usize;
    match dims[..] {
        [_, per, n_exp] => expert_picks(per, n_exp as usize, k),
        _ => sample_rows(dims.get(1).copied().unwrap_or(1), k),
    }
}

/// Rows a row probe samples in each expert it samples: an expert's rows cost its LDLQ factor
/// (a 2048-wide Cholesky and inverse) before its first row, so a stack's sample spreads over
/// fewer experts with several rows each rather than one row of every expert.
pub(crate) const ROWS_PER_EXPERT: usize = 16;

/// The rows (global: `expert × per + row`) of a `per × n_exp` expert stack's `k`-row sample:
/// `⌈k / ROWS_PER_EXPERT⌉` evenly spaced experts (all when that is more), each with its share
/// of `k` evenly spaced rows; in order, one expert's rows after another.
pub(crate) fn expert_picks(per: u64, n_exp: usize, k: usize) -> Vec<u64> {
    use crate::quant::sensitivity::sample_rows;
    let each = env_count("TQ_PROBE_EXPERT_ROWS", ROWS_PER_EXPERT as u64) as usize;
    let experts = sample_rows(n_exp as u64, k.div_ceil(each).max(1));
    let each = k.div_ceil(experts.len());
    experts
        .iter()
        .flat_map(|&x| sample_rows(per, each).into_iter().map(move |r| x * per + r))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack's sample: a few experts, evenly spaced, each with its evenly spaced rows.
    #[test]
    fn expert_picks_spread_whole_experts() {
        let p = expert_picks(32, 4, 64);
        assert_eq!(p.len(), 64);
        for x in 0..4 {
            assert_eq!(p.iter().filter(|&&r| r / 32 == x).count(), 16, "{x}");
        }
        // Qwen3-30B-A3B's ffn_gate_exps (128 experts of 768 rows) at the 2^20 cap: 512 rows.
        let p = expert_picks(768, 128, 512);
        assert_eq!(p.len(), 512);
        let experts: std::collections::BTreeSet<u64> = p.iter().map(|r| r / 768).collect();
        assert_eq!(experts.len(), 512 / ROWS_PER_EXPERT);
        assert!(p.windows(2).all(|w| w[0] < w[1]));
    }
}
