//! The layer-streaming forward pass. A batch of token windows flows through block 0, then block
//! 1, …: only one block's weights are dequantized (to f32 scratch) at a time, so memory is one
//! block + the batch's activations whatever the model size. The output projection is streamed in
//! slices of vocabulary rows the same way.

use super::attention::{causal_attention, AttnShape};
use super::config::Config;
use super::kernels::{placements, Kernels, Placement};
use super::kv::{hadamard_blocks, round_trip, KvCache, KvLayer};
use super::layer::{dequantize_rows, glu_rows, load_f32, rms_norm_rows, LayerWeights, LinearSet};
use super::matmul::{matmul_t, ActRound};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::gpu::{BackendKind, Linear, OpenError};
use crate::numerics::cuda_native::CudaTqPath;
use rayon::prelude::*;
use std::cell::RefCell;

/// How activations meet the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// Exact f32 activations against the dequantized weights.
    F32,
    /// Reproduce ggml's CPU backend: activations rounded to each weight type's `vec_dot_type`
    /// (f16, Q8_0, Q8_K) and the K/V cache in f16. The default: it makes perplexity and KL
    /// divergence comparable with llama.cpp's.
    Ggml,
    /// What the fork's CUDA backend computes: TQ4_1S/TQ3_1S weights through its mat-vec kernels
    /// as [`crate::numerics::cuda_native`] models them (`Native`: `GGML_TQ_NATIVE=1`, int8 centroids ×
    /// q8_1 rotated activations; `LoadQ8_0`: the default conversion to q8_0 at load, q8_0 × q8_1),
    /// every other weight type and the KV cache as [`Numerics::Ggml`].
    Cuda(CudaTqPath),
}

impl Numerics {
    /// `f32`, `ggml`, `cuda` (= `cuda-native`) or `cuda-q8_0`.
    pub fn parse(s: &str) -> Option<Numerics> {
        match s {
            "f32" => Some(Numerics::F32),
            "ggml" => Some(Numerics::Ggml),
            "cuda" | "cuda-native" => Some(Numerics::Cuda(CudaTqPath::Native)),
            "cuda-q8_0" => Some(Numerics::Cuda(CudaTqPath::LoadQ8_0)),
            _ => None,
        }
    }

    /// The canonical name (what `parse` accepts).
    pub fn name(self) -> &'static str {
        match self {
            Numerics::F32 => "f32",
            Numerics::Ggml => "ggml",
            Numerics::Cuda(CudaTqPath::Native) => "cuda-native",
            Numerics::Cuda(CudaTqPath::LoadQ8_0) => "cuda-q8_0",
        }
    }

    /// The CUDA path TQ weights take, if any.
    pub fn cuda_path(self) -> Option<CudaTqPath> {
        match self {
            Numerics::Cuda(p) => Some(p),
            _ => None,
        }
    }

    /// What the numerics mean, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Numerics::F32 => "exact f32 activations against the dequantized weights",
            Numerics::Ggml => {
                "ggml CPU backend (activations rounded to each weight's vec_dot type)"
            }
            Numerics::Cuda(CudaTqPath::Native) => {
                "fork CUDA mat-vec kernels, GGML_TQ_NATIVE=1: tq4_1s int8 centroids x q8_1 rotated \
                 activations, tq3_1s f32 rotated; other types as ggml"
            }
            Numerics::Cuda(CudaTqPath::LoadQ8_0) => {
                "fork CUDA default: tq4_1s converted to q8_0 at load, q8_0 x q8_1; tq3_1s f32 \
                 rotated; other types as ggml"
            }
        }
    }
}

/// Hooks to observe the input of every linear layer (e.g. to accumulate Hessians `XᵀX`).
/// `tensors` are the GGUF names of the weights that multiply this input (q/k/v share one, as do
/// gate/up); `x` is `rows × cols`, row-major, exact f32 (before any ggml-style rounding).
pub trait Observer {
    fn linear_input(
        &mut self,
        layer: Option<usize>,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    );
    /// Called before block `layer` starts (progress reporting).
    fn layer_start(&mut self, _layer: usize) {}
    /// `false` for observers that only want `layer_start`: the runtime then skips
    /// `linear_input` and may prune rows whose outputs are not requested.
    fn wants_inputs(&self) -> bool {
        true
    }
    /// Called right after `linear_input` for one of block `layer`'s linear sets and before the
    /// set multiplies that input: the observer may replace the weights (sequential calibration
    /// quantizes them here, so everything downstream sees the quantized model). Only called when
    /// `wants_inputs`. An error stops the forward pass.
    fn transform_weights(&mut self, _layer: usize, _set: &mut LinearSet) -> Result<()> {
        Ok(())
    }
    /// The input of expert `expert` of MoE block `layer`: the `rows` tokens routed to it
    /// (`x`, `rows × cols`, in token order), about to be multiplied by `tensors`: its gate and up
    /// slices (the normed block input), then its down slice (the SwiGLU output). Only called
    /// when `wants_inputs`; the default ignores it.
    fn expert_input(
        &mut self,
        _layer: usize,
        _expert: usize,
        _tensors: &[&str],
        _x: &[f32],
        _rows: usize,
        _cols: usize,
    ) {
    }
    /// Called when block `layer`'s output is complete (checkpoints).
    fn layer_end(&mut self, _layer: usize) -> Result<()> {
        Ok(())
    }
}

pub struct Model<'a> {
    pub file: &'a GgufFile,
    pub cfg: Config,
    pub numerics: Numerics,
    /// Threads given to each large matrix product: those of the rayon pool the model was made in
    /// (the caller's; the rest of the work runs in that pool too).
    threads: usize,
    /// KV-cache types simulated (default f16, as llama.cpp).
    pub kv: KvCache,
    output_norm: Vec<f32>,
    /// The backend that multiplies the linear weights with a mat-mul kernel (`--backend`), with
    /// those weights resident on it; `None`: everything on the CPU.
    kernels: Option<RefCell<Kernels>>,
}

/// The GPU backend a model runs on: the API, the device and what runs where.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    pub kind: BackendKind,
    pub device: String,
    /// Bytes of weights resident on the device.
    pub resident_bytes: u64,
    /// Every linear weight (2-D block weights, output projection) and where it runs.
    pub placements: Vec<Placement>,
}

/// Vocabulary rows of the output projection dequantized at a time.
const OUTPUT_ROWS_PER_SLICE: usize = 8192;

impl<'a> Model<'a> {
    pub fn new(file: &'a GgufFile, numerics: Numerics) -> Result<Model<'a>> {
        let cfg = Config::from_gguf(file)?;
        let output_norm = load_f32(file, "output_norm.weight")?;
        Ok(Model {
            file,
            cfg,
            numerics,
            threads: rayon::current_num_threads(),
            kv: KvCache::default(),
            output_norm,
            kernels: None,
        })
    }

    /// Run the linear weights whose type has a mat-mul kernel through `backend` (`--backend`;
    /// see `model/kernels.rs`): opens it and uploads those weights once. Absent (not built in, no
    /// device) or failing backends are a one-line error saying what to do.
    pub fn use_backend(&mut self, backend: BackendKind) -> Result<()> {
        let lin = crate::gpu::open_linear(backend).map_err(|e| match e {
            OpenError::Absent(why) => Error::Usage(format!(
                "--backend {}: {}",
                backend.name(),
                crate::error::one_line(&why)
            )),
            OpenError::Failed(e) => Error::Unsupported(format!(
                "--backend {}: the backend failed to open: {}",
                backend.name(),
                crate::error::one_line(&e.to_string())
            )),
        })?;
        self.use_kernels(lin)
    }

    /// [`Model::use_backend`] with an opened backend (any [`Linear`] implementation).
    pub fn use_kernels(&mut self, lin: Box<dyn Linear>) -> Result<()> {
        if self.numerics.cuda_path().is_some() {
            return Err(Error::Usage(format!(
                "--backend {} and --numerics {}: the first runs the TQ weights through tq's                  kernels, the second models the fork's CUDA arithmetic; choose one",
                lin.kind().name(),
                self.numerics.name()
            )));
        }
        let k = Kernels::attach(self.file, self.output_name(), lin)?;
        self.kernels = Some(RefCell::new(k));
        Ok(())
    }

    /// The backend attached by [`Model::use_backend`], and where each linear weight runs.
    pub fn backend(&self) -> Option<BackendInfo> {
        let k = self.kernels.as_ref()?.borrow();
        Some(BackendInfo {
            kind: k.kind(),
            device: k.device_name(),
            resident_bytes: k.resident_bytes(),
            placements: placements(self.file, self.output_name()),
        })
    }

    /// The same model with everything on the CPU (the reference a backend run is compared with).
    pub fn cpu_twin(&self) -> Model<'a> {
        Model {
            file: self.file,
            cfg: self.cfg.clone(),
            numerics: self.numerics,
            threads: self.threads,
            kv: self.kv.clone(),
            output_norm: self.output_norm.clone(),
            kernels: None,
        }
    }

    /// Worker threads the large matrix products use (see `threads`).
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// The final norm's weight.
    pub fn output_norm(&self) -> &[f32] {
        &self.output_norm
    }

    /// The output projection's tensor (`token_embd.weight` when tied).
    pub fn output_tensor(&self) -> &'static str {
        self.output_name()
    }

    /// ggml rounding of activations (also for the non-TQ weights under CUDA numerics).
    pub(crate) fn ggml(&self) -> bool {
        matches!(self.numerics, Numerics::Ggml | Numerics::Cuda(_))
    }

    /// The TQ4_1S / TQ3_1S weights a forward pass runs through the CUDA model (none unless the
    /// numerics are `Cuda`): names of block weights and, if TQ, the output projection.
    pub fn cuda_tensors(&self) -> Vec<String> {
        if self.numerics.cuda_path().is_none() {
            return Vec::new();
        }
        let mut v: Vec<String> = self
            .file
            .tensors
            .iter()
            .filter(|t| {
                t.ty.is_tq_weight()
                    && (t.name.starts_with("blk.") || t.name == self.output_name())
                    && t.dims.len() == 2
            })
            .map(|t| t.name.clone())
            .collect();
        v.sort();
        v
    }

    fn output_name(&self) -> &'static str {
        if self.cfg.tied_output {
            "token_embd.weight"
        } else {
            "output.weight"
        }
    }

    /// Embedding rows for `tokens` (`tokens.len() × n_embd`).
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let f = self.file;
        let t = f.tensor("token_embd.weight").expect("checked by Config");
        let e = self.cfg.n_embd;
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= self.cfg.n_vocab) {
            return Err(Error::Usage(format!(
                "token id {bad} is out of range for {} (vocabulary of {})",
                f.path.display(),
                self.cfg.n_vocab
            )));
        }
        let mut x = vec![0f32; tokens.len() * e];
        x.par_chunks_mut(e)
            .zip(tokens.par_iter())
            .try_for_each(|(row, &id)| dequantize_rows(f, t, id as usize, id as usize + 1, row))?;
        if let Some(sc) = self.cfg.emb_scale {
            x.par_iter_mut().for_each(|v| *v *= sc);
        }
        Ok(x)
    }

    /// Run `n_win` windows of `seq` tokens each (`tokens.len() == n_win * seq`; position 0 at
    /// the start of each window, windows independent) and return the logits of positions
    /// `out_from..seq` of every window: `(n_win * (seq - out_from)) × n_vocab`, window-major.
    pub fn forward(
        &self,
        tokens: &[u32],
        seq: usize,
        out_from: usize,
        observer: Option<&mut dyn Observer>,
    ) -> Result<Vec<f32>> {
        assert!(seq > 0 && tokens.len() % seq == 0 && out_from < seq);
        let x = self.embed(tokens)?;
        self.forward_from(tokens.len() / seq, seq, out_from, 0, x, observer)
    }

    /// [`Model::forward`] from the input `x` of block `from` (the hidden states of `n_win`
    /// windows of `seq` positions, `n_win * seq × n_embd`, as [`Model::blocks`] leaves them):
    /// blocks `from..` and the output head. `from == n_layer`: the head only (then `x` is the
    /// last block's output, already cut to the output rows).
    pub fn forward_from(
        &self,
        n_win: usize,
        seq: usize,
        out_from: usize,
        from: usize,
        x: Vec<f32>,
        mut observer: Option<&mut dyn Observer>,
    ) -> Result<Vec<f32>> {
        let n = self.cfg.n_layer;
        let x = match observer.as_deref_mut() {
            Some(o) => self.blocks(n_win, seq, out_from, from..n, x, Some(o))?,
            None => self.blocks(n_win, seq, out_from, from..n, x, None)?,
        };
        self.head(n_win, seq, out_from, x, observer)
    }

    /// Blocks `layers` on the hidden states `x` (`n_win * seq × n_embd`, block `layers.start`'s
    /// input), returning block `layers.end`'s input. When `layers` ends with the last block,
    /// only the output rows (`out_from..seq` of each window) come back, unless the observer
    /// watches the linear inputs.
    // One function on purpose: the block loop is the streaming contract (one block's weights
    // dequantized at a time, the observer called at each linear input), kept readable in one place.
    pub fn blocks(
        &self,
        n_win: usize,
        seq: usize,
        out_from: usize,
        layers: std::ops::Range<usize>,
        mut x: Vec<f32>,
        mut observer: Option<&mut dyn Observer>,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let watch = observer.as_ref().is_some_and(|o| o.wants_inputs());
        assert!(seq > 0 && out_from < seq && layers.end <= cfg.n_layer);
        let rows = n_win * seq;
        let e = cfg.n_embd;
        if layers.is_empty() {
            return Ok(x);
        }
        if x.len() != rows * e {
            return Err(Error::internal(format!(
                "blocks: {} hidden values for {rows} rows of {e}",
                x.len()
            )));
        }
        let threads = self.threads;
        let ggml = self.ggml();
        let shape0 = AttnShape {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            scale: cfg.kq_scale,
            softcap: cfg.attn_softcap,
            window: None,
        };
        let (qd, kvd, ld, hd) = (shape0.q_dim(), shape0.kv_dim(), shape0.ld(), cfg.head_dim);
        let (rope_global, rope_swa) = super::rope::model_ropes(cfg, seq);
        let n_out = seq - out_from;
        self.kv.check(hd)?;
        let mut kern = self.kernels.as_ref().map(|k| k.borrow_mut());
        if kern.is_some() && watch {
            // No calibrating command has --backend: a caller that asks for both is wrong.
            return Err(Error::internal(
                "--backend is for evaluation; calibration runs on the CPU runtime",
            ));
        }
        let rotate = self.kv.rotate;
        let (table, groups) = (self.kv.turbo4, self.kv.groups);
        // Rows whose outputs are needed after the last block (llama.cpp prunes the same way).
        let keep: Vec<usize> = (0..n_win)
            .flat_map(|w| (out_from..seq).map(move |p| w * seq + p))
            .collect();

        let mut h = vec![0f32; rows * e];
        let mut qkv = vec![0f32; rows * ld];
        let mut att = vec![0f32; rows * qd];
        let mut gu = vec![0f32; rows * 2 * cfg.n_ff];
        let mut act = vec![0f32; rows * cfg.n_ff];
        let mut tmp = vec![0f32; rows * e];

        for l in layers {
            if let Some(o) = observer.as_deref_mut() {
                o.layer_start(l);
            }
            let mut lw = match &kern {
                Some(k) => LayerWeights::load_with(self.file, cfg, l, &|n| k.has(n))?,
                None => LayerWeights::load(self.file, cfg, l)?,
            };
            if let Some(path) = self.numerics.cuda_path() {
                if watch {
                    return Err(Error::internal(format!(
                        "{} numerics are for evaluation; calibration hooks need ggml or f32",
                        self.numerics.name()
                    )));
                }
                lw.prepare_cuda(self.file, path)?;
            }
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
            let rope = match (&rope_swa, window) {
                (Some(r), Some(_)) => r,
                _ => &rope_global,
            };
            let shape = AttnShape { window, ..shape0 };
            let q_scale = cfg.q_scale;

            // Attention.
            rms_norm_rows(&x, &lw.attn_norm, cfg.rms_eps, e, &mut h);
            if let Some(o) = observer.as_deref_mut().filter(|_| watch) {
                o.linear_input(Some(l), &lw.qkv.names(), &h, rows, e);
                o.transform_weights(l, &mut lw.qkv)?;
            }
            lw.qkv
                .forward_on(&h, rows, &mut qkv, ggml, threads, kern.as_deref_mut())?;
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
            causal_attention(&shape, &qkv, n_win, seq, &mut att);
            if let Some(n) = rot_v {
                att.par_chunks_mut(hd).for_each(|h| hadamard_blocks(h, n));
            }

            // Prune to the output rows after the last block's attention.
            let (rows_now, att_in): (usize, std::borrow::Cow<[f32]>) =
                if last && !watch && n_out < seq {
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
            lw.wo.forward_on(
                &att_in,
                rows_now,
                &mut tmp,
                ggml,
                threads,
                kern.as_deref_mut(),
            )?;
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
                self.moe_ffn(l, moe, router, &h[..rows_now * e], rows_now, &mut tmp, obs)?;
                add_into(&mut x[..rows_now * e], &tmp[..rows_now * e]);
                if let Some(o) = observer.as_deref_mut() {
                    o.layer_end(l)?;
                }
                continue;
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
                .forward_on(&h, rows_now, &mut gu, ggml, threads, kern.as_deref_mut())?;
            glu_rows(&gu, &mut act[..rows_now * nff], nff, cfg.gelu, ggml);
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
                .forward_on(&act, rows_now, &mut tmp, ggml, threads, kern.as_deref_mut())?;
            post_norm(&lw.ffn_post_norm, &mut tmp[..rows_now * e], cfg.rms_eps, e);
            add_into(&mut x[..rows_now * e], &tmp[..rows_now * e]);
            if let Some(o) = observer.as_deref_mut() {
                o.layer_end(l)?;
            }
        }
        Ok(x)
    }

    /// The output head on the last block's output `x` (all rows, or only the output rows):
    /// the final norm on the output rows, then the output projection in vocabulary slices.
    fn head(
        &self,
        n_win: usize,
        seq: usize,
        out_from: usize,
        x: Vec<f32>,
        observer: Option<&mut dyn Observer>,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let e = cfg.n_embd;
        let threads = self.threads;
        let watch = observer.as_ref().is_some_and(|o| o.wants_inputs());
        let keep: Vec<usize> = (0..n_win)
            .flat_map(|w| (out_from..seq).map(move |p| w * seq + p))
            .collect();
        let xo: Vec<f32> = if x.len() == keep.len() * e {
            x
        } else {
            let mut xo = vec![0f32; keep.len() * e];
            for (i, &r) in keep.iter().enumerate() {
                xo[i * e..(i + 1) * e].copy_from_slice(&x[r * e..(r + 1) * e]);
            }
            xo
        };
        let no = keep.len();
        let mut hn = vec![0f32; no * e];
        rms_norm_rows(&xo, &self.output_norm, cfg.rms_eps, e, &mut hn);
        if let Some(o) = observer.filter(|_| watch) {
            o.linear_input(None, &[self.output_name()], &hn, no, e);
        }
        self.project(&hn, no, threads)
    }

    /// Logits `rows × n_vocab` for final-normed hidden states `hn` (`rows × n_embd`), soft-capped
    /// when the model caps them (ggml's scale → tanh → scale).
    pub fn project(&self, hn: &[f32], rows: usize, threads: usize) -> Result<Vec<f32>> {
        let mut logits = self.project_raw(hn, rows, threads)?;
        self.softcap_logits(&mut logits);
        Ok(logits)
    }

    /// The final soft-cap, when the model has one (ggml's scale → tanh → scale).
    pub(crate) fn softcap_logits(&self, logits: &mut [f32]) {
        if let Some(c) = self.cfg.final_softcap {
            logits
                .par_iter_mut()
                .for_each(|v| *v = (*v * (1.0 / c)).tanh() * c);
        }
    }

    fn project_raw(&self, hn: &[f32], rows: usize, threads: usize) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let e = cfg.n_embd;
        let nv = cfg.n_vocab;
        let t = self
            .file
            .tensor(self.output_name())
            .expect("checked by Config");
        let round = if self.ggml() {
            ActRound::for_weight(t.ty)
        } else {
            ActRound::None
        };
        let hr;
        let hin: &[f32] = if round != ActRound::None && e % round.block() == 0 {
            let mut v = hn.to_vec();
            round.apply_rows(&mut v, e);
            hr = v;
            &hr
        } else {
            hn
        };
        let mut logits = vec![0f32; rows * nv];
        if let Some(k) = &self.kernels {
            let mut k = k.borrow_mut();
            if k.has(&t.name) {
                // Exact input: a type with a mat-mul kernel has no ggml activation rounding.
                k.matmul(&t.name, hn, rows, e, &mut logits, nv)?;
                return Ok(logits);
            }
        }
        if let Some(path) = self.numerics.cuda_path().filter(|_| t.ty.is_tq_weight()) {
            // A TQ output projection under CUDA numerics (never in the fork's recipes, but
            // possible): through the CUDA model, in the same vocabulary slices.
            let data = self.file.tensor_data(t);
            let row_bytes = e / 32 * t.ty.block_bytes();
            let mut v0 = 0;
            while v0 < nv {
                let v1 = (v0 + OUTPUT_ROWS_PER_SLICE).min(nv);
                let bytes = data.get(v0 * row_bytes..v1 * row_bytes).ok_or_else(|| {
                    Error::bad_input(&self.file.path, format!("{}: data too short", t.name))
                })?;
                crate::numerics::cuda_matmul::CudaWeights::new(path, t.ty, bytes, v1 - v0, e)
                    .map_err(|err| Error::bad_input(&self.file.path, format!("{}: {err}", t.name)))?
                    .matmul(hn, rows, &mut logits[v0..], nv);
                v0 = v1;
            }
            return Ok(logits);
        }
        let mut w = vec![0f32; OUTPUT_ROWS_PER_SLICE.min(nv) * e];
        let mut v0 = 0;
        while v0 < nv {
            let v1 = (v0 + OUTPUT_ROWS_PER_SLICE).min(nv);
            let ws = &mut w[..(v1 - v0) * e];
            dequantize_rows(self.file, t, v0, v1, ws)?;
            matmul_t(hin, rows, e, ws, v1 - v0, &mut logits[v0..], nv, threads);
            v0 = v1;
        }
        Ok(logits)
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
