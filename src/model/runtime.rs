//! The layer-streaming forward pass. A batch of token windows flows through block 0, then block
//! 1, …: only one block's weights are dequantized (to f32 scratch) at a time, so memory is one
//! block + the batch's activations whatever the model size. The output projection is streamed in
//! slices of vocabulary rows the same way.

use super::config::Config;
use super::kernels::{placements, Kernels, Placement};
use super::kv::KvCache;
use super::layer::{dequantize_rows, load_f32, rms_norm_rows, LinearSet};
use super::matmul::{matmul_t, ActRound};
use super::q8dot::{self, ActQ8, Q8Int8};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo};
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
    /// TQ4_1S / TQ3_1S block weights through the int8 path ([`Model::use_tq_int8`]).
    tq_int8: bool,
    /// q8_0 weights through the int8 path ([`Model::use_q8_int8`]).
    q8_int8: bool,
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
            tq_int8: false,
            q8_int8: false,
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

    /// Multiply the blocks' TQ4_1S / TQ3_1S weights by the int8 path (`model/tqdot.rs`: the
    /// activation rotated and quantized to int8 per 32 values, an int8 codebook, integer dot
    /// products) instead of f32 decoded weights. Only under [`Numerics::Ggml`] and when no
    /// observer watches the linear inputs (calibration keeps f32); other weights are unchanged.
    /// It changes the numerics slightly (docs/bench/eval.md records by how much).
    pub fn use_tq_int8(&mut self, on: bool) {
        self.tq_int8 = on;
    }

    /// Whether [`Model::use_tq_int8`] is on.
    pub fn tq_int8(&self) -> bool {
        self.tq_int8
    }

    /// Multiply q8_0 weights (block weights and the output projection) by the int8 path
    /// (`model/q8dot.rs`: the Q8_0-rounded activation's int8 quants against the weight's, integer
    /// dot products per 32-block scaled by both scales, as ggml's CPU backend does) instead of
    /// f32 dequantized weights. Only under [`Numerics::Ggml`] and when no observer watches the
    /// linear inputs; the results move by float rounding only (docs/bench/speed.md).
    pub fn use_q8_int8(&mut self, on: bool) {
        self.q8_int8 = on;
    }

    /// Whether [`Model::use_q8_int8`] is on.
    pub fn q8_int8(&self) -> bool {
        self.q8_int8
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
            tq_int8: self.tq_int8,
            q8_int8: self.q8_int8,
        }
    }

    /// The backend's kernels, when one is attached.
    pub(crate) fn kernels(&self) -> Option<&RefCell<Kernels>> {
        self.kernels.as_ref()
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
        f.release(t);
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
        assert!(seq > 0 && tokens.len().is_multiple_of(seq) && out_from < seq);
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

    /// The output head on the last block's output `x` (all rows, or only the output rows):
    /// the final norm on the output rows, then the output projection in vocabulary slices.
    pub(crate) fn head(
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
        let hin: &[f32] = if round != ActRound::None && e.is_multiple_of(round.block()) {
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
            self.for_output_slices(t, e, nv, |v0, v1, bytes| {
                crate::numerics::cuda_matmul::CudaWeights::new(path, t.ty, bytes, v1 - v0, e)
                    .map_err(|err| Error::bad_input(&self.file.path, format!("{}: {err}", t.name)))?
                    .matmul(hn, rows, &mut logits[v0..], nv);
                Ok(())
            })?;
            return Ok(logits);
        }
        self.file.prefetch(t);
        if self.q8_int8 && self.numerics == Numerics::Ggml && LinearSet::q8_eligible(t.ty, e) {
            // ggml's q8_0 arithmetic: the input quantized once, the weight slice by slice.
            let a = ActQ8::new(hn, rows, e);
            self.for_output_slices(t, e, nv, |v0, v1, bytes| {
                let w = Q8Int8::new(bytes, v1 - v0, e).map_err(|err| {
                    Error::bad_input(&self.file.path, format!("{}: {err}", t.name))
                })?;
                q8dot::matmul(&w, &a, &mut logits[v0..], nv, threads);
                Ok(())
            })?;
            self.file.release(t);
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
        // Its mapped pages are read again by the next batch's head (from the page cache): not
        // kept in this process's memory in between.
        self.file.release(t);
        Ok(logits)
    }

    /// Runs `run(v0, v1, bytes)` over the output tensor `t`'s vocabulary rows in slices of
    /// [`OUTPUT_ROWS_PER_SLICE`], with the slice's bytes (rows `e` wide, 32-blocks), so no more
    /// than one slice's weights are unpacked at a time.
    fn for_output_slices(
        &self,
        t: &TensorInfo,
        e: usize,
        nv: usize,
        mut run: impl FnMut(usize, usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let data = self.file.tensor_data(t);
        let row_bytes = e / 32 * t.ty.block_bytes();
        let mut v0 = 0;
        while v0 < nv {
            let v1 = (v0 + OUTPUT_ROWS_PER_SLICE).min(nv);
            let bytes = data.get(v0 * row_bytes..v1 * row_bytes).ok_or_else(|| {
                Error::bad_input(&self.file.path, format!("{}: data too short", t.name))
            })?;
            run(v0, v1, bytes)?;
            v0 = v1;
        }
        Ok(())
    }
}
