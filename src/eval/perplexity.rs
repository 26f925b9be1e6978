//! Perplexity over windows of a token stream, the way `llama-perplexity` computes it: the text is
//! tokenized once, cut into `tokens / n_ctx` windows (capped by `--chunks`), the first token of
//! each window is replaced by BOS when the vocabulary adds one, and only positions
//! `n_ctx/2 .. n_ctx-2` are scored (each predicting the next token), `n_ctx - 1 - n_ctx/2` per
//! window. PPL = exp(mean NLL); its error is `PPL · sqrt(var(NLL) / (N-1))`.

use super::backend::{BackendAccum, BackendReport, Comparison, KldBound};
use super::kld::{mean_and_err, nll, token_kld, Est, KldAccum, KldReport, RefRow};
use super::logits_file::{Reader, Writer};
use crate::error::{Error, Result};
use crate::model::{Batches, Model};
use rayon::prelude::*;
use serde::Serialize;

/// The windows of a token stream.
#[derive(Clone, Debug)]
pub struct Windows {
    pub n_ctx: usize,
    pub n_chunk: usize,
    /// `n_chunk * n_ctx` tokens as in the stream.
    pub tokens: Vec<u32>,
    /// Token that replaces the first of every window (the BOS, when the vocabulary adds one).
    pub bos: Option<u32>,
}

impl Windows {
    /// Cut `all` into windows like llama-perplexity (needs at least `2 * n_ctx` tokens).
    pub fn new(
        all: &[u32],
        n_ctx: usize,
        chunks: Option<usize>,
        bos: Option<u32>,
    ) -> Result<Windows> {
        if n_ctx < 4 {
            return Err(Error::Usage(format!(
                "--ctx {n_ctx} is too small (at least 4)"
            )));
        }
        if all.len() < 2 * n_ctx {
            return Err(Error::Usage(format!(
                "the text tokenizes to only {} tokens; at least {} (2 × --ctx {n_ctx}) are needed",
                all.len(),
                2 * n_ctx
            )));
        }
        let max = all.len() / n_ctx;
        let n_chunk = chunks.map_or(max, |c| c.min(max));
        if n_chunk == 0 {
            return Err(Error::Usage("--chunks 0: nothing to evaluate".into()));
        }
        Ok(Windows {
            n_ctx,
            n_chunk,
            tokens: all[..n_chunk * n_ctx].to_vec(),
            bos,
        })
    }

    /// First scored position.
    pub fn first(&self) -> usize {
        self.n_ctx / 2
    }

    /// Scored tokens per window.
    pub fn scored_per_window(&self) -> usize {
        self.n_ctx - 1 - self.first()
    }

    /// Model input for windows `w0..w1` (BOS substituted).
    pub fn input(&self, w0: usize, w1: usize) -> Vec<u32> {
        let mut v = self.tokens[w0 * self.n_ctx..w1 * self.n_ctx].to_vec();
        if let Some(b) = self.bos {
            for c in v.chunks_mut(self.n_ctx) {
                c[0] = b;
            }
        }
        v
    }

    /// Token predicted at position `p` of window `w`.
    pub fn target(&self, w: usize, p: usize) -> u32 {
        self.tokens[w * self.n_ctx + p + 1]
    }
}

/// Where reference distributions come from (for KL divergence).
pub enum Reference<'a> {
    None,
    Model(&'a Model<'a>),
    File(Reader),
}

/// The result of an evaluation.
#[derive(Clone, Debug, Serialize)]
pub struct EvalResult {
    pub n_ctx: usize,
    pub n_chunk: usize,
    pub tokens_scored: usize,
    pub ppl: Est,
    pub mean_nll: Est,
    /// Cumulative PPL after each window (llama-perplexity's `[i]value` list).
    pub chunk_ppl: Vec<f64>,
    pub kld: Option<KldReport>,
    /// With a GPU backend attached to the model (`--backend`): what ran where, and the KL
    /// divergence of this run from the CPU run on the same windows. Absent on the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendReport>,
    pub seconds: f64,
    /// Tokens run through the model per second (`n_chunk * n_ctx / seconds`).
    pub tokens_per_second: f64,
}

/// Progress of an evaluation: `done` of `total` units (one unit = one block, or the output head,
/// of one batch).
pub type Progress<'p> = &'p (dyn Fn(u64, u64) + Sync);

/// Hidden states a pass may hold per model when its windows are not given: 1 GiB (128 windows
/// of 512 tokens at a 4096-wide model).
const PASS_STATE_BYTES: usize = 1 << 30;

/// Windows per block-major pass when not given: as many whole batches as keep every model's
/// hidden states (`windows × n_ctx × n_embd` f32 each, `models` models) within
/// [`PASS_STATE_BYTES`], at least one batch, at most every window.
pub fn pass_windows(win: &Windows, model: &Model, batch: usize, models: usize) -> usize {
    let batch = batch.max(1);
    let per_window = win.n_ctx * model.cfg.n_embd * 4 * models.max(1);
    let fit = PASS_STATE_BYTES / per_window.max(1) / batch * batch;
    fit.max(batch).min(win.n_chunk.div_ceil(batch) * batch)
}

/// Evaluate `model` on `win`, block-major: the windows go in passes of whole batches (as many as
/// [`pass_windows`] allows); in a pass every batch's hidden states advance through block 0, then
/// block 1, …, so each block's weights are read and dequantized once per pass (a model larger
/// than RAM is read once per pass) and memory holds one block, the pass's hidden states and one
/// batch's logits. Then the output head runs batch by batch. `batch` windows go through each
/// block together; a window's logits are bit for bit those of a batch-major run with the same
/// `batch` (each block runs on the same batch with the same weights). With a reference, per-token KL divergence is accumulated; with
/// `save`, the model's own distributions are written as a reference file. When the model has a
/// GPU backend attached ([`Model::use_backend`]) and some weight runs on it, the same model runs
/// on the CPU beside it and the result's `backend` holds the comparison (held to
/// [`KldBound::for_numerics`]); every other number is the backend run's.
pub fn evaluate(
    model: &Model,
    win: &Windows,
    reference: Reference,
    save: Option<&mut Writer>,
    batch: usize,
    progress: Progress,
) -> Result<EvalResult> {
    evaluate_until(model, win, reference, save, batch, progress, None)
}

/// [`evaluate`], asking `stop` (if given) after every batch with the result so far (its `n_chunk` is the
/// windows done): `true` ends the run there (`tq validate --chunks auto`). The windows are the
/// same prefix a fixed `--chunks` would take, so a stopped run equals that run.
pub fn evaluate_until(
    model: &Model,
    win: &Windows,
    reference: Reference,
    save: Option<&mut Writer>,
    batch: usize,
    progress: Progress,
    stop: Option<&dyn Fn(&EvalResult) -> bool>,
) -> Result<EvalResult> {
    run(
        model, win, reference, save, batch, None, progress, stop, None,
    )
}

/// [`evaluate`] in passes of `pass` windows (rounded up to whole batches; `None`: as many as
/// [`pass_windows`] allows). `pass == batch` is the batch-major order: every block loaded once
/// per batch.
pub fn evaluate_passes(
    model: &Model,
    win: &Windows,
    reference: Reference,
    save: Option<&mut Writer>,
    batch: usize,
    pass: Option<usize>,
    progress: Progress,
) -> Result<EvalResult> {
    run(
        model, win, reference, save, batch, pass, progress, None, None,
    )
}

/// Where each batch's forward pass starts: at block `layer`, from the hidden states that
/// `states(w0, w1)` gives for windows `w0..w1` (block `layer`'s input, as
/// [`Model::blocks`] leaves it; `layer == n_layer`: the last block's output rows). A model that
/// differs from another only in blocks `layer..` and its head gives, from the other's states,
/// the logits its whole forward pass would (the mix's KLD probes).
pub struct Resume<'s> {
    pub layer: usize,
    pub states: &'s dyn Fn(usize, usize) -> Result<Vec<f32>>,
}

/// [`evaluate`] with every batch resumed at a block (see [`Resume`]): the same result as
/// [`evaluate`] on the whole model when the states are the model's own.
pub fn evaluate_from(
    model: &Model,
    win: &Windows,
    reference: Reference,
    batch: usize,
    resume: &Resume,
) -> Result<EvalResult> {
    run(
        model,
        win,
        reference,
        None,
        batch,
        None,
        &|_, _| {},
        None,
        Some(resume),
    )
}

// One function on purpose: the batch loop carries the running PPL/KLD sums, the logits file
// writer and the progress callback; its order is llama-perplexity's, which tests compare to.
#[allow(clippy::too_many_arguments)]
fn run(
    model: &Model,
    win: &Windows,
    mut reference: Reference,
    mut save: Option<&mut Writer>,
    batch: usize,
    pass: Option<usize>,
    progress: Progress,
    stop: Option<&dyn Fn(&EvalResult) -> bool>,
    resume: Option<&Resume>,
) -> Result<EvalResult> {
    let t0 = std::time::Instant::now();
    let nv = model.cfg.n_vocab;
    if let Reference::Model(r) = &reference {
        if r.cfg.n_vocab != nv {
            return Err(Error::Usage(format!(
                "the reference model has a vocabulary of {}, the model {nv}: they cannot be compared",
                r.cfg.n_vocab
            )));
        }
    }
    if let Reference::File(r) = &reference {
        let h = &r.header;
        if h.n_vocab != nv {
            return Err(Error::Usage(format!(
                "the reference logits have a vocabulary of {}, the model {nv}",
                h.n_vocab
            )));
        }
        if h.n_ctx != win.n_ctx || h.first != win.first() || h.n_chunk < win.n_chunk {
            return Err(Error::Usage(format!(
                "the reference logits were computed with ctx {} over {} windows; this run has ctx {} over {}",
                h.n_ctx, h.n_chunk, win.n_ctx, win.n_chunk
            )));
        }
    }
    let batch = batch.max(1);
    let first = win.first();
    let per = win.scored_per_window();
    let n_out = win.n_ctx - first;
    let n_batches = win.n_chunk.div_ceil(batch) as u64;
    let ref_models = usize::from(matches!(reference, Reference::Model(_)));
    let ref_layers = match &reference {
        Reference::Model(r) => r.cfg.n_layer as u64 + 1,
        _ => 0,
    };
    let backend = model.backend();
    let twin = backend
        .as_ref()
        .filter(|b| b.placements.iter().any(|p| p.on_backend))
        .map(|_| model.cpu_twin());
    let twin_models = usize::from(twin.is_some());
    let twin_layers = twin.as_ref().map_or(0, |t| t.cfg.n_layer as u64 + 1);
    let from = resume.map_or(0, |r| r.layer) as u64;
    let units_per_batch = model.cfg.n_layer as u64 - from + 1 + ref_layers + twin_layers;
    let total = n_batches * units_per_batch;

    let (mut s, mut s2, mut count) = (0f64, 0f64, 0usize);
    let mut chunk_ppl = Vec::new();
    let mut kacc = KldAccum::default();
    let mut bacc = BackendAccum::default();
    let with_ref = !matches!(reference, Reference::None);
    let backend_report = |bacc: &BackendAccum| {
        backend.as_ref().map(|b| {
            BackendReport::new(
                b,
                twin.as_ref()
                    .map(|_| Comparison::of(bacc, KldBound::for_numerics(model.numerics))),
            )
        })
    };

    // Passes of whole batches, block-major inside a pass (see `pass_windows`). A run that may
    // stop after any batch goes one batch per pass, so that stopping wastes no block.
    let per_pass = match (pass, stop) {
        (Some(p), _) => p.max(1).div_ceil(batch) * batch,
        (None, Some(_)) => batch,
        (None, None) => pass_windows(win, model, batch, 1 + ref_models + twin_models),
    };
    let done = std::cell::Cell::new(0u64);
    let tick = || {
        done.set(done.get() + 1);
        (progress)(done.get(), total);
    };
    // The hidden states of each batch of windows `p0..p1` at block `from`'s input, run through
    // the rest of `m`'s blocks block by block.
    let states = |m: &Model, p0: usize, p1: usize, resumed: bool| -> Result<Batches> {
        let mut b = Batches {
            seq: win.n_ctx,
            out_from: first,
            batches: Vec::new(),
        };
        let mut w0 = p0;
        while w0 < p1 {
            let w1 = (w0 + batch).min(p1);
            let x = match resume.filter(|_| resumed) {
                None => m.embed(&win.input(w0, w1))?,
                Some(r) => (r.states)(w0, w1)?,
            };
            b.batches.push((w1 - w0, x));
            w0 = w1;
        }
        let from = resume.filter(|_| resumed).map_or(0, |r| r.layer);
        m.blocks_major(&mut b, from..m.cfg.n_layer, &mut |_, _| tick())?;
        Ok(b)
    };

    let mut p0 = 0;
    while p0 < win.n_chunk {
        let p1 = (p0 + per_pass).min(win.n_chunk);
        let tf = std::time::Instant::now();
        let mut mine = states(model, p0, p1, true)?;
        bacc.seconds_backend += tf.elapsed().as_secs_f64();
        let mut twin_states = match &twin {
            Some(t) => {
                let tc = std::time::Instant::now();
                let b = states(t, p0, p1, false)?;
                bacc.seconds_cpu += tc.elapsed().as_secs_f64();
                Some(b)
            }
            None => None,
        };
        let mut ref_states = match &reference {
            Reference::Model(r) => Some(states(r, p0, p1, false)?),
            _ => None,
        };
        let mut w0 = p0;
        for i in 0..mine.batches.len() {
            let (n_win, x) = std::mem::take(&mut mine.batches[i]);
            let w1 = w0 + n_win;
            let tf = std::time::Instant::now();
            let logits = model.head(n_win, win.n_ctx, first, x, None)?;
            bacc.seconds_backend += tf.elapsed().as_secs_f64();
            tick();
            if let (Some(t), Some(tb)) = (&twin, twin_states.as_mut()) {
                let tc = std::time::Instant::now();
                let x = std::mem::take(&mut tb.batches[i].1);
                let cl = t.head(n_win, win.n_ctx, first, x, None)?;
                bacc.seconds_cpu += tc.elapsed().as_secs_f64();
                tick();
                let rows: Vec<(usize, usize)> = (0..w1 - w0)
                    .flat_map(|j| {
                        (0..per)
                            .map(move |p| (j * n_out + p, win.target(w0 + j, first + p) as usize))
                    })
                    .collect();
                bacc.add_rows(&rows, &cl, &logits, nv);
            }
            let ref_rows: Option<Vec<RefRow>> = match &mut reference {
                Reference::None => None,
                Reference::Model(r) => {
                    let rb = ref_states.as_mut().expect("states of the reference model");
                    let x = std::mem::take(&mut rb.batches[i].1);
                    let rl = r.head(n_win, win.n_ctx, first, x, None)?;
                    tick();
                    let rows: Vec<usize> = (0..w1 - w0)
                        .flat_map(|j| (0..per).map(move |p| j * n_out + p))
                        .collect();
                    Some(
                        rows.par_iter()
                            .map(|&i| RefRow::from_logits(&rl[i * nv..(i + 1) * nv]))
                            .collect(),
                    )
                }
                Reference::File(rd) => {
                    let mut v = Vec::with_capacity((w1 - w0) * per);
                    for _ in 0..(w1 - w0) * per {
                        v.push(rd.next_row()?);
                    }
                    Some(v)
                }
            };
            // Per-token statistics in parallel, accumulated in order (deterministic).
            let idx: Vec<(usize, usize)> = (0..w1 - w0)
                .flat_map(|j| (0..per).map(move |p| (j, p)))
                .collect();
            let nlls: Vec<f64> = idx
                .par_iter()
                .map(|&(j, p)| {
                    let row = &logits[(j * n_out + p) * nv..(j * n_out + p + 1) * nv];
                    nll(row, win.target(w0 + j, first + p) as usize)
                })
                .collect();
            if let Some(rr) = &ref_rows {
                let ks: Vec<_> = idx
                    .par_iter()
                    .enumerate()
                    .map(|(k, &(j, p))| {
                        let row = &logits[(j * n_out + p) * nv..(j * n_out + p + 1) * nv];
                        token_kld(row, &rr[k], win.target(w0 + j, first + p) as usize)
                    })
                    .collect();
                for t in &ks {
                    kacc.add(t);
                }
            }
            if let Some(w) = save.as_deref_mut() {
                let rows: Vec<RefRow> = idx
                    .par_iter()
                    .map(|&(j, p)| {
                        RefRow::from_logits(&logits[(j * n_out + p) * nv..(j * n_out + p + 1) * nv])
                    })
                    .collect();
                for r in &rows {
                    w.write_row(r)?;
                }
            }
            for (k, v) in nlls.iter().enumerate() {
                s += v;
                s2 += v * v;
                count += 1;
                if (k + 1) % per == 0 {
                    chunk_ppl.push((s / count as f64).exp());
                }
            }
            w0 = w1;
            if let Some(stop) = stop.filter(|_| w0 < win.n_chunk) {
                let so_far = Sums {
                    s,
                    s2,
                    count,
                    kld: with_ref.then_some(&kacc),
                }
                .result(win.n_ctx, w0, &chunk_ppl, t0);
                let so_far = EvalResult {
                    backend: backend_report(&bacc),
                    ..so_far
                };
                if stop(&so_far) {
                    (progress)(total, total);
                    return Ok(so_far);
                }
            }
        }
        p0 = p1;
    }
    (progress)(total, total);
    let r = Sums {
        s,
        s2,
        count,
        kld: with_ref.then_some(&kacc),
    }
    .result(win.n_ctx, win.n_chunk, &chunk_ppl, t0);
    Ok(EvalResult {
        backend: backend_report(&bacc),
        ..r
    })
}

/// The running sums of an evaluation.
struct Sums<'k> {
    s: f64,
    s2: f64,
    count: usize,
    kld: Option<&'k KldAccum>,
}

impl Sums<'_> {
    fn result(
        &self,
        n_ctx: usize,
        n_chunk: usize,
        chunk_ppl: &[f64],
        t0: std::time::Instant,
    ) -> EvalResult {
        let seconds = t0.elapsed().as_secs_f64();
        let mean = mean_and_err(self.s, self.s2, self.count);
        let ppl = mean.value.exp();
        EvalResult {
            n_ctx,
            n_chunk,
            tokens_scored: self.count,
            ppl: Est {
                value: ppl,
                err: ppl * mean.err,
            },
            mean_nll: mean,
            chunk_ppl: chunk_ppl.to_vec(),
            kld: self.kld.map(KldAccum::report),
            backend: None,
            seconds,
            tokens_per_second: (n_chunk * n_ctx) as f64 / seconds.max(1e-9),
        }
    }
}
