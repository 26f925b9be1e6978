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
pub(crate) type Substitute = (String, TensorType, u32, Vec<u8>);

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
