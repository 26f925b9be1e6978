//! One block of the forward pass on one batch of windows ([`Model::run_block`]), and the two
//! orders the runtime runs blocks in: batch-major ([`Model::blocks`]: one batch through every
//! block, each block's weights loaded per batch) and block-major ([`Model::blocks_major`]: every
//! batch of a pass through block 0, then block 1, …, each block's weights loaded once per pass).
//! Both call [`Model::run_block`] with the same batch and weights, so a window's hidden states
//! are bit for bit the same in either order.

use super::attention::{causal_attention, AttnShape};
use super::kernels::Kernels;
use super::kv::{hadamard_blocks, round_trip, KvLayer};
use super::layer::{glu_rows, rms_norm_rows, LayerWeights, LinearSet};
use super::matmul::ActRound;
use super::rope::{model_ropes, Rope};
use super::runtime::{Model, Numerics, Observer};
use crate::error::{Error, Result};
use rayon::prelude::*;

/// What every block of a pass over batches of `n_win` windows of `seq` positions shares.
pub(crate) struct BlockPass {
    n_win: usize,
    seq: usize,
    out_from: usize,
    shape0: AttnShape,
    rope_global: Rope,
    rope_swa: Option<Rope>,
    /// Rows whose outputs are needed after the last block (llama.cpp prunes the same way).
    keep: Vec<usize>,
    /// Keep an MoE block's experts loaded from batch to batch (a block-major pass of several
    /// batches); otherwise each is dropped after use (one expert's f32 weights at a time).
    keep_experts: bool,
}

/// A block's activations for one batch, reused from block to block (and batch to batch).
#[derive(Default)]
pub(crate) struct Scratch {
    h: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    gu: Vec<f32>,
    act: Vec<f32>,
    tmp: Vec<f32>,
}

impl Scratch {
    /// Size every buffer for `rows` rows (each is fully written before it is read).
    fn fit(&mut self, m: &Model, rows: usize, p: &BlockPass) {
        let (e, nff) = (m.cfg.n_embd, m.cfg.n_ff);
        let (ld, qd) = (p.shape0.ld(), p.shape0.q_dim());
        self.h.resize(rows * e, 0.0);
        self.qkv.resize(rows * ld, 0.0);
        self.att.resize(rows * qd, 0.0);
        self.gu.resize(rows * 2 * nff, 0.0);
        self.act.resize(rows * nff, 0.0);
        self.tmp.resize(rows * e, 0.0);
    }
}

impl BlockPass {
    pub(crate) fn new(m: &Model, n_win: usize, seq: usize, out_from: usize) -> Result<BlockPass> {
        let cfg = &m.cfg;
        assert!(seq > 0 && out_from < seq);
        let shape0 = AttnShape {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            scale: cfg.kq_scale,
            softcap: cfg.attn_softcap,
            window: None,
        };
        m.kv.check(cfg.head_dim)?;
        let (rope_global, rope_swa) = model_ropes(cfg, seq);
        let keep = (0..n_win)
            .flat_map(|w| (out_from..seq).map(move |p| w * seq + p))
            .collect();
        Ok(BlockPass {
            n_win,
            seq,
            out_from,
            shape0,
            rope_global,
            rope_swa,
            keep,
            keep_experts: false,
        })
    }

    /// The same pass for batches of `n_win` windows (the last batch of a pass may be smaller).
    fn with_windows(&mut self, n_win: usize) {
        if n_win != self.n_win {
            let (seq, out_from) = (self.seq, self.out_from);
            self.keep = (0..n_win)
                .flat_map(|w| (out_from..seq).map(move |p| w * seq + p))
                .collect();
            self.n_win = n_win;
        }
    }
}

/// Batches of windows advancing together through the blocks: each batch's windows and its
/// hidden states (`n_win * seq × n_embd`, or after the last block only its output rows).
pub struct Batches {
    pub seq: usize,
    pub out_from: usize,
    /// `(n_win, states)` per batch, in window order.
    pub batches: Vec<(usize, Vec<f32>)>,
}

impl Model<'_> {
    /// Blocks `layers` on the hidden states `x` (`n_win * seq × n_embd`, block `layers.start`'s
    /// input), returning block `layers.end`'s input, batch-major: one block's weights loaded at a
    /// time for this batch. When `layers` ends with the last block, only the output rows
    /// (`out_from..seq` of each window) come back, unless the observer watches the linear
    /// inputs. ([`Model::blocks_major`] runs several batches block by block.)
    pub fn blocks(
        &self,
        n_win: usize,
        seq: usize,
        out_from: usize,
        layers: std::ops::Range<usize>,
        mut x: Vec<f32>,
        mut observer: Option<&mut dyn Observer>,
    ) -> Result<Vec<f32>> {
        let watch = observer.as_ref().is_some_and(|o| o.wants_inputs());
        assert!(seq > 0 && out_from < seq && layers.end <= self.cfg.n_layer);
        if layers.is_empty() {
            return Ok(x);
        }
        let pass = BlockPass::new(self, n_win, seq, out_from)?;
        let mut scratch = Scratch::default();
        let mut kern = self.kernels().map(|k| k.borrow_mut());
        if kern.is_some() && watch {
            // No calibrating command has --backend: a caller that asks for both is wrong.
            return Err(Error::internal(
                "--backend is for evaluation; calibration runs on the CPU runtime",
            ));
        }
        for l in layers {
            if let Some(o) = observer.as_deref_mut() {
                o.layer_start(l);
            }
            let mut lw = self.load_block(l, kern.as_deref(), watch)?;
            x = match observer.as_deref_mut() {
                Some(o) => self.run_block(
                    l,
                    &mut lw,
                    &pass,
                    &mut scratch,
                    x,
                    Some(o),
                    kern.as_deref_mut(),
                )?,
                None => self.run_block(
                    l,
                    &mut lw,
                    &pass,
                    &mut scratch,
                    x,
                    None,
                    kern.as_deref_mut(),
                )?,
            };
        }
        Ok(x)
    }

    /// Block `l`'s weights as the forward pass uses them: dequantized to f32 (those a backend
    /// multiplies left out), prepared for the CUDA model under CUDA numerics.
    pub(crate) fn load_block(
        &self,
        l: usize,
        kern: Option<&Kernels>,
        watch: bool,
    ) -> Result<LayerWeights> {
        // Read this block's bytes in large requests (a cold map faulted page by page is slow),
        // and the next block's while this one runs.
        self.prefetch_block(l);
        if l + 1 < self.cfg.n_layer {
            self.prefetch_block(l + 1);
        }
        let int8 = self.tq_int8() && self.numerics == Numerics::Ggml && !watch;
        let q8 = self.q8_int8() && self.numerics == Numerics::Ggml && !watch;
        let on_kern = |n: &str| kern.is_some_and(|k| k.has(n));
        let is_tq = |n: &str| self.file.tensor(n).is_some_and(|t| t.ty.is_tq_weight());
        let is_q8 = |n: &str| {
            self.file
                .tensor(n)
                .is_some_and(|t| LinearSet::q8_eligible(t.ty, t.row_len() as usize))
        };
        let skip = |n: &str| on_kern(n) || (int8 && is_tq(n)) || (q8 && is_q8(n));
        let mut lw = LayerWeights::load_with(self.file, &self.cfg, l, &skip)?;
        if int8 {
            lw.prepare_int8(self.file, &on_kern)?;
        }
        if q8 {
            lw.prepare_q8(self.file, &on_kern)?;
        }
        if let Some(path) = self.numerics.cuda_path() {
            if watch {
                return Err(Error::internal(format!(
                    "{} numerics are for evaluation; calibration hooks need ggml or f32",
                    self.numerics.name()
                )));
            }
            lw.prepare_cuda(self.file, path)?;
        }
        Ok(lw)
    }

    /// Start reading block `l`'s tensors into the page cache ([`crate::gguf::GgufFile::prefetch`]).
    fn prefetch_block(&self, l: usize) {
        let prefix = format!("blk.{l}.");
        for t in self
            .file
            .tensors
            .iter()
            .filter(|t| t.name.starts_with(&prefix))
        {
            self.file.prefetch(t);
        }
    }

    /// Blocks `layers` on every batch of `b`, block-major: block `l`'s weights are loaded once,
    /// run on each batch in turn and dropped (their mapped pages already released) before block
    /// `l + 1` is loaded, so a pass reads the model once and holds one block's weights plus the
    /// batches' hidden states. An MoE block's experts are loaded as the first batch routed to each
    /// needs them and kept for the other batches: once per block per pass too. `done(l, i)` is called after block `l` has run on batch `i`.
    /// Each batch's states end bit for bit as [`Model::blocks`] leaves them.
    pub fn blocks_major(
        &self,
        b: &mut Batches,
        layers: std::ops::Range<usize>,
        done: &mut dyn FnMut(usize, usize),
    ) -> Result<()> {
        let Some(&(n0, _)) = b.batches.first() else {
            return Ok(());
        };
        assert!(layers.end <= self.cfg.n_layer);
        let mut pass = BlockPass::new(self, n0, b.seq, b.out_from)?;
        pass.keep_experts = b.batches.len() > 1;
        let mut scratch = Scratch::default();
        let mut kern = self.kernels().map(|k| k.borrow_mut());
        for l in layers {
            let mut lw = self.load_block(l, kern.as_deref(), false)?;
            for (i, (n_win, x)) in b.batches.iter_mut().enumerate() {
                pass.with_windows(*n_win);
                let xi = std::mem::take(x);
                *x = self.run_block(
                    l,
                    &mut lw,
                    &pass,
                    &mut scratch,
                    xi,
                    None,
                    kern.as_deref_mut(),
                )?;
                done(l, i);
            }
        }
        Ok(())
    }

    /// Block `l` with weights `lw` on one batch's hidden states `x` (`n_win * seq × n_embd`):
    /// its output (only the output rows after the last block, unless the observer watches the
    /// linear inputs).
    // One function on purpose: the block is the streaming contract (the observer called at each
    // linear input, the output rows pruned after the last block's attention), kept in one place.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_block(
        &self,
        l: usize,
        lw: &mut LayerWeights,
        p: &BlockPass,
        s: &mut Scratch,
        mut x: Vec<f32>,
        mut observer: Option<&mut dyn Observer>,
        mut kern: Option<&mut Kernels>,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let watch = observer.as_ref().is_some_and(|o| o.wants_inputs());
        let (n_win, seq) = (p.n_win, p.seq);
        let rows = n_win * seq;
        let e = cfg.n_embd;
        if x.len() != rows * e {
            return Err(Error::internal(format!(
                "blocks: {} hidden values for {rows} rows of {e}",
                x.len()
            )));
        }
        s.fit(self, rows, p);
        let threads = self.threads();
        let ggml = self.ggml();
        let shape0 = p.shape0;
        let (qd, kvd, ld, hd) = (shape0.q_dim(), shape0.kv_dim(), shape0.ld(), cfg.head_dim);
        let n_out = seq - p.out_from;
        let rotate = self.kv.rotate;
        let (table, groups) = (self.kv.turbo4, self.kv.groups);
        let Scratch {
            h,
            qkv,
            att,
            gu,
            act,
            tmp,
        } = s;

        let kv = self.kv.layer(l);
        // The cache is simulated with ggml numerics (f16 by default) or whenever a type was
        // chosen.
        let store = ggml || kv != KvLayer::F16;
        let (rot_k, rot_v) = (kv.k_rotation(rotate, hd), kv.v_rotation(rotate, hd));
        // Queries meet a quantized K through its vec_dot type (ggml's non-tiled flash
        // attention, used whenever the cache is not all f16/f32).
        let q_round = if ggml && kv != KvLayer::F16 {
            ActRound::for_weight(kv.k)
        } else {
            ActRound::None
        };
        let last = l + 1 == cfg.n_layer;
        let window = cfg.window_of(l);
        let rope = match (&p.rope_swa, window) {
            (Some(r), Some(_)) => r,
            _ => &p.rope_global,
        };
        let shape = AttnShape { window, ..shape0 };
        let q_scale = cfg.q_scale;

        // Attention.
        rms_norm_rows(&x, &lw.attn_norm, cfg.rms_eps, e, h);
        if let Some(o) = observer.as_deref_mut().filter(|_| watch) {
            o.linear_input(Some(l), &lw.qkv.names(), h, rows, e);
            o.transform_weights(l, &mut lw.qkv)?;
        }
        lw.qkv
            .forward_on(h, rows, qkv, ggml, threads, kern.as_deref_mut())?;
        qkv.par_chunks_mut(ld).enumerate().for_each(|(r, row)| {
            let pos = r % seq;
            let (q, kvr) = row.split_at_mut(qd);
            for qh in q.chunks_mut(hd) {
                if let Some(nw) = &lw.q_norm {
                    let c = qh.to_vec();
                    super::layer::rms_norm(&c, nw, cfg.rms_eps, qh);
                }
                rope.apply(qh, pos);
                if let Some(sc) = q_scale {
                    qh.iter_mut().for_each(|v| *v *= sc);
                }
                if let Some(n) = rot_k {
                    hadamard_blocks(qh, n);
                }
                q_round.apply(qh);
            }
            let (k, v) = kvr.split_at_mut(kvd);
            for kh in k.chunks_mut(hd) {
                if let Some(nw) = &lw.k_norm {
                    let c = kh.to_vec();
                    super::layer::rms_norm(&c, nw, cfg.rms_eps, kh);
                }
                rope.apply(kh, pos);
                if let Some(n) = rot_k {
                    hadamard_blocks(kh, n);
                }
                if store {
                    round_trip(kv.k, table, groups, kh);
                }
            }
            for vh in v.chunks_mut(hd) {
                if let Some(n) = rot_v {
                    hadamard_blocks(vh, n);
                }
                if store {
                    round_trip(kv.v, table, groups, vh);
                }
            }
        });
        causal_attention(&shape, qkv, n_win, seq, att);
        if let Some(n) = rot_v {
            att.par_chunks_mut(hd).for_each(|h| hadamard_blocks(h, n));
        }

        // Prune to the output rows after the last block's attention.
        let (rows_now, att_in): (usize, std::borrow::Cow<[f32]>) = if last && !watch && n_out < seq
        {
            let keep = &p.keep;
            let mut a = vec![0f32; keep.len() * qd];
            let mut xr = vec![0f32; keep.len() * e];
            for (i, &r) in keep.iter().enumerate() {
                a[i * qd..(i + 1) * qd].copy_from_slice(&att[r * qd..(r + 1) * qd]);
                xr[i * e..(i + 1) * e].copy_from_slice(&x[r * e..(r + 1) * e]);
            }
            x = xr;
            (keep.len(), std::borrow::Cow::Owned(a))
        } else {
            (rows, std::borrow::Cow::Borrowed(&att[..]))
        };
        if let Some(o) = observer.as_deref_mut().filter(|_| watch) {
            o.linear_input(Some(l), &lw.wo.names(), &att_in, rows_now, qd);
            o.transform_weights(l, &mut lw.wo)?;
        }
        lw.wo
            .forward_on(&att_in, rows_now, tmp, ggml, threads, kern.as_deref_mut())?;
        post_norm(&lw.attn_post_norm, &mut tmp[..rows_now * e], cfg.rms_eps, e);
        add_into(&mut x[..rows_now * e], &tmp[..rows_now * e]);

        // Feed-forward.
        rms_norm_rows(
            &x[..rows_now * e],
            &lw.ffn_norm,
            cfg.rms_eps,
            e,
            &mut h[..rows_now * e],
        );
        if let (Some(router), Some(moe)) = (&mut lw.router, &cfg.moe) {
            if let Some(o) = observer.as_deref_mut().filter(|_| watch) {
                o.linear_input(Some(l), &router.names(), &h[..rows_now * e], rows_now, e);
                o.transform_weights(l, router)?;
            }
            let obs = observer.as_deref_mut().filter(|_| watch);
            let ex = p.keep_experts.then_some(&mut lw.experts);
            self.moe_ffn(l, moe, router, ex, &h[..rows_now * e], rows_now, tmp, obs)?;
            add_into(&mut x[..rows_now * e], &tmp[..rows_now * e]);
            if let Some(o) = observer.as_deref_mut() {
                o.layer_end(l)?;
            }
            return Ok(x);
        }
        let nff = lw.gate_up.n_total / 2;
        if let Some(o) = observer.as_deref_mut().filter(|_| watch) {
            o.linear_input(
                Some(l),
                &lw.gate_up.names(),
                &h[..rows_now * e],
                rows_now,
                e,
            );
            o.transform_weights(l, &mut lw.gate_up)?;
        }
        lw.gate_up
            .forward_on(h, rows_now, gu, ggml, threads, kern.as_deref_mut())?;
        glu_rows(gu, &mut act[..rows_now * nff], nff, cfg.gelu, ggml);
        if let Some(o) = observer.as_deref_mut().filter(|_| watch) {
            o.linear_input(
                Some(l),
                &lw.down.names(),
                &act[..rows_now * nff],
                rows_now,
                nff,
            );
            o.transform_weights(l, &mut lw.down)?;
        }
        lw.down
            .forward_on(act, rows_now, tmp, ggml, threads, kern)?;
        post_norm(&lw.ffn_post_norm, &mut tmp[..rows_now * e], cfg.rms_eps, e);
        add_into(&mut x[..rows_now * e], &tmp[..rows_now * e]);
        if let Some(o) = observer {
            o.layer_end(l)?;
        }
        Ok(x)
    }
}

/// Gemma's post-norm of a block output (rows of width `cols`), in place.
pub(crate) fn post_norm(w: &Option<Vec<f32>>, y: &mut [f32], eps: f32, cols: usize) {
    if let Some(w) = w {
        let src = y.to_vec();
        rms_norm_rows(&src, w, eps, cols, y);
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(y.par_chunks(4096))
        .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a += b));
}
