//! One block's weights, dequantized to f32 scratch for the duration of a batch, and the linear
//! "sets" (weights that share an input: q/k/v, gate/up) multiplied in one pass.

use super::config::{Config, LayerNames};
use super::kernels::Kernels;
use super::matmul::{matmul_t, ActRound};
use super::q8dot::{ActQ8, Q8Int8};
use super::tqdot::{ActQ, TqInt8};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::numerics::cuda_matmul::CudaWeights;
use crate::numerics::cuda_native::CudaTqPath;
use crate::types::TensorType;
use rayon::prelude::*;
use std::sync::Arc;

/// Dequantize rows `r0..r1` of a 2-D tensor into `out` (`(r1 - r0) * row_len` values), in
/// parallel over chunks of rows.
pub fn dequantize_rows(
    f: &GgufFile,
    t: &TensorInfo,
    r0: usize,
    r1: usize,
    out: &mut [f32],
) -> Result<()> {
    let k = t.row_len() as usize;
    let ty = t.ty;
    let bs = ty.block_size();
    if !k.is_multiple_of(bs) {
        return Err(Error::bad_input(
            &f.path,
            format!(
                "{}: row length {k} is not a multiple of the {} block size {bs}",
                t.name,
                ty.name()
            ),
        ));
    }
    let row_bytes = k / bs * ty.block_bytes();
    let data = f.tensor_data(t);
    assert_eq!(out.len(), (r1 - r0) * k);
    if (r1 as u64) > t.n_rows() {
        return Err(Error::bad_input(
            &f.path,
            format!("{}: row {r1} out of range", t.name),
        ));
    }
    let rows_per_chunk = (65536 / k.max(1)).max(1);
    out.par_chunks_mut(rows_per_chunk * k)
        .enumerate()
        .try_for_each(|(ci, o)| {
            let a = r0 + ci * rows_per_chunk;
            let b = a + o.len() / k;
            crate::types::dequantize_rows(ty, &data[a * row_bytes..b * row_bytes], o, k, &t.name)?;
            // NaN/Inf weights would turn every result into NaN: name the first one instead.
            // One pass over values the dequantizer just wrote (still in cache).
            match o.iter().position(|v| !v.is_finite()) {
                None => Ok(()),
                Some(i) => Err(Error::bad_input(
                    &f.path,
                    format!(
                        "{}: non-finite weight {} at row {}, column {}; the model file is corrupt (fix or reconvert the source model)",
                        crate::error::one_line(&t.name),
                        o[i],
                        a + i / k,
                        i % k
                    ),
                )),
            }
        })
}

/// A whole 1-D or 2-D tensor as f32.
pub fn load_f32(f: &GgufFile, name: &str) -> Result<Vec<f32>> {
    let t = f
        .tensor(name)
        .ok_or_else(|| Error::bad_input(&f.path, format!("missing tensor {name}")))?;
    let n = t.n_rows() as usize;
    let mut out = vec![0f32; t.n_elements() as usize];
    dequantize_rows(f, t, 0, n, &mut out)?;
    // The f32 copy is what the runtime uses: drop the mapped pages so a model larger than RAM
    // streams through (they stay in the page cache; the next pass refaults them cheaply).
    f.release(t);
    Ok(out)
}

fn load_opt(f: &GgufFile, name: &str) -> Result<Option<Vec<f32>>> {
    match f.tensor(name) {
        Some(_) => load_f32(f, name).map(Some),
        None => Ok(None),
    }
}

/// One weight inside a [`LinearSet`]: output features `off..off + n` of the set.
#[derive(Clone, Debug)]
pub struct Segment {
    pub name: String,
    pub off: usize,
    pub n: usize,
    /// First row of the tensor this segment holds (an expert's slice of a 3-D tensor; else 0).
    pub row0: usize,
    pub ty: TensorType,
    /// Set by [`LinearSet::prepare_cuda`]: this weight is multiplied the way the fork's CUDA
    /// kernels do it instead of through the f32 weights.
    pub cuda: Option<Arc<CudaWeights>>,
    /// Set by [`LinearSet::prepare_int8`]: this TQ weight is multiplied by the int8 path
    /// ([`super::tqdot`]) instead of through the f32 weights.
    pub int8: Option<Arc<TqInt8>>,
    /// Set by [`LinearSet::prepare_q8`]: this q8_0 weight is multiplied by the int8 path
    /// ([`super::q8dot`]) instead of through the f32 weights.
    pub q8: Option<Arc<Q8Int8>>,
}

/// Weights sharing one input of width `k`, stacked row-wise (`n_total × k`), with optional biases.
pub struct LinearSet {
    pub k: usize,
    pub n_total: usize,
    pub w: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub segments: Vec<Segment>,
}

impl LinearSet {
    /// Load the named weights (each `[k, n_i]` in ggml order) and their optional biases.
    pub fn load(f: &GgufFile, parts: &[(&str, &str)]) -> Result<LinearSet> {
        Self::load_with(f, parts, &|_| false)
    }

    /// [`LinearSet::load`], leaving the f32 weights of the tensors `skip` names at zero (they are
    /// multiplied elsewhere: a backend's kernels).
    pub(crate) fn load_with(
        f: &GgufFile,
        parts: &[(&str, &str)],
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<LinearSet> {
        let mut infos = Vec::new();
        for (w, _) in parts {
            let t = f
                .tensor(w)
                .ok_or_else(|| Error::bad_input(&f.path, format!("missing tensor {w}")))?;
            infos.push(t);
        }
        let k = infos[0].row_len() as usize;
        let n_total: usize = infos.iter().map(|t| t.n_rows() as usize).sum();
        let mut w = vec![0f32; n_total * k];
        let mut segments = Vec::new();
        let mut off = 0;
        let any_bias = parts.iter().any(|(_, b)| f.tensor(b).is_some());
        let mut bias = if any_bias {
            Some(vec![0f32; n_total])
        } else {
            None
        };
        for (t, (_, bname)) in infos.iter().zip(parts) {
            let n = t.n_rows() as usize;
            if t.row_len() as usize != k {
                return Err(Error::bad_input(
                    &f.path,
                    format!("{}: input width differs within its set", t.name),
                ));
            }
            if !skip(&t.name) {
                dequantize_rows(f, t, 0, n, &mut w[off * k..(off + n) * k])?;
                f.release(t);
            }
            if let (Some(b), Some(v)) = (bias.as_mut(), load_opt(f, bname)?) {
                if v.len() != n {
                    return Err(Error::bad_input(
                        &f.path,
                        format!("{bname}: length {} != {n}", v.len()),
                    ));
                }
                b[off..off + n].copy_from_slice(&v);
            }
            segments.push(Segment {
                name: t.name.clone(),
                off,
                n,
                row0: 0,
                ty: t.ty,
                cuda: None,
                int8: None,
                q8: None,
            });
            off += n;
        }
        Ok(LinearSet {
            k,
            n_total,
            w,
            bias,
            segments,
        })
    }

    /// Rows `r0..r1` of each named tensor, stacked (one expert's slice of 3-D expert tensors:
    /// rows `e·n .. (e+1)·n`). No biases.
    pub(crate) fn load_rows(
        f: &GgufFile,
        parts: &[&str],
        r0: usize,
        r1: usize,
    ) -> Result<LinearSet> {
        let n = r1 - r0;
        let mut segments = Vec::with_capacity(parts.len());
        let mut k = 0;
        for (i, name) in parts.iter().enumerate() {
            let t = f
                .tensor(name)
                .ok_or_else(|| Error::bad_input(&f.path, format!("missing tensor {name}")))?;
            if i > 0 && t.row_len() as usize != k {
                return Err(Error::bad_input(
                    &f.path,
                    format!("{name}: input width differs within its set"),
                ));
            }
            k = t.row_len() as usize;
            segments.push(Segment {
                name: t.name.clone(),
                off: i * n,
                n,
                row0: r0,
                ty: t.ty,
                cuda: None,
                int8: None,
                q8: None,
            });
        }
        let mut w = vec![0f32; parts.len() * n * k];
        for (seg, out) in segments.iter().zip(w.chunks_mut(n * k)) {
            let t = f.tensor(&seg.name).expect("looked up above");
            dequantize_rows(f, t, r0, r1, out)?;
        }
        Ok(LinearSet {
            k,
            n_total: parts.len() * n,
            w,
            bias: None,
            segments,
        })
    }

    /// A set with no weights (the dense FFN slots of a mixture-of-experts block).
    pub(crate) fn empty() -> LinearSet {
        LinearSet {
            k: 0,
            n_total: 0,
            w: vec![],
            bias: None,
            segments: vec![],
        }
    }

    /// Route this set's TQ4_1S / TQ3_1S weights through the CUDA model (`path`), from their
    /// bytes in `f`. Returns how many segments it prepared.
    pub fn prepare_cuda(&mut self, f: &GgufFile, path: CudaTqPath) -> Result<usize> {
        let mut count = 0;
        for seg in &mut self.segments {
            if !seg.ty.is_tq_weight() {
                continue;
            }
            let t = f
                .tensor(&seg.name)
                .ok_or_else(|| Error::bad_input(&f.path, format!("missing tensor {}", seg.name)))?;
            let cw = CudaWeights::new(path, seg.ty, f.tensor_data(t), seg.n, self.k)
                .map_err(|e| Error::bad_input(&f.path, format!("{}: {e}", seg.name)))?;
            seg.cuda = Some(Arc::new(cw));
            count += 1;
        }
        Ok(count)
    }

    /// Route this set's TQ4_1S / TQ3_1S weights (those `skip` does not name) through the int8
    /// path, from their bytes in `f` (their f32 weights are not needed: load the set with them
    /// skipped). Returns how many segments it prepared.
    pub(crate) fn prepare_int8(
        &mut self,
        f: &GgufFile,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<usize> {
        self.prepare_from_bytes(
            f,
            skip,
            |ty, _| ty.is_tq_weight(),
            |seg, bytes, k| {
                seg.int8 = Some(Arc::new(TqInt8::new(seg.ty, bytes, seg.n, k)?));
                Ok(())
            },
        )
    }

    /// Route this set's q8_0 weights (those `skip` does not name) through the int8 path
    /// ([`super::q8dot`]), from their bytes in `f` (their f32 weights are not needed: load the
    /// set with them skipped). Returns how many segments it prepared.
    pub(crate) fn prepare_q8(
        &mut self,
        f: &GgufFile,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<usize> {
        self.prepare_from_bytes(f, skip, Self::q8_eligible, |seg, bytes, k| {
            seg.q8 = Some(Arc::new(Q8Int8::new(bytes, seg.n, k)?));
            Ok(())
        })
    }

    /// Hands each segment that `eligible` (type, row length) takes, that has no CUDA weights and
    /// that `skip` does not name, its rows' bytes in `f`; `attach` builds and stores its int8
    /// weights, and the tensor's mapping is released after. A refusal is the file's corruption.
    fn prepare_from_bytes(
        &mut self,
        f: &GgufFile,
        skip: &dyn Fn(&str) -> bool,
        eligible: impl Fn(TensorType, usize) -> bool,
        attach: impl Fn(&mut Segment, &[u8], usize) -> std::result::Result<(), String>,
    ) -> Result<usize> {
        let k = self.k;
        let mut count = 0;
        for seg in &mut self.segments {
            if !eligible(seg.ty, k) || seg.cuda.is_some() || skip(&seg.name) {
                continue;
            }
            let t = f
                .tensor(&seg.name)
                .ok_or_else(|| Error::bad_input(&f.path, format!("missing tensor {}", seg.name)))?;
            let row_bytes = k / seg.ty.block_size() * seg.ty.block_bytes();
            let bytes = f
                .tensor_data(t)
                .get(seg.row0 * row_bytes..(seg.row0 + seg.n) * row_bytes)
                .ok_or_else(|| {
                    Error::bad_input(&f.path, format!("{}: tensor data too short", seg.name))
                })?;
            attach(seg, bytes, k).map_err(|e| {
                Error::bad_input(
                    &f.path,
                    format!(
                        "{}: {e}; the model file is corrupt (fix or reconvert the source model)",
                        crate::error::one_line(&seg.name)
                    ),
                )
            })?;
            f.release(t);
            count += 1;
        }
        Ok(count)
    }

    /// Whether a weight of type `ty` with rows `k` long can take the q8_0 int8 path.
    pub(crate) fn q8_eligible(ty: TensorType, k: usize) -> bool {
        ty == TensorType::Q8_0 && k.is_multiple_of(32) && k > 0
    }

    /// `out (rows × n_total) = x (rows × k) · Wᵀ + b`. With `ggml_numerics`, the input is first
    /// rounded the way ggml converts activations for each weight's type; segments with the same
    /// rounding are multiplied together. Segments prepared by [`LinearSet::prepare_cuda`] go
    /// through [`CudaWeights::matmul`] (which quantizes the exact input its own way).
    pub fn forward(
        &self,
        x: &[f32],
        rows: usize,
        out: &mut [f32],
        ggml_numerics: bool,
        threads: usize,
    ) {
        self.forward_on(x, rows, out, ggml_numerics, threads, None)
            .expect("without a backend the forward pass cannot fail");
    }

    /// [`LinearSet::forward`], with the segments that `kernels` holds multiplied by its mat-mul
    /// kernels (exact f32 input: their types have no ggml activation rounding).
    pub(crate) fn forward_on(
        &self,
        x: &[f32],
        rows: usize,
        out: &mut [f32],
        ggml_numerics: bool,
        threads: usize,
        mut kernels: Option<&mut Kernels>,
    ) -> Result<()> {
        let k = self.k;
        let on_backend =
            |s: &Segment, kn: &Option<&mut Kernels>| kn.as_ref().is_some_and(|kn| kn.has(&s.name));
        // The int8 paths' quantized inputs: each made once for all its segments.
        let mut xq: Option<ActQ> = None;
        let mut x8: Option<ActQ8> = None;
        let mut i = 0;
        while i < self.segments.len() {
            if let Some(w8) = self.segments[i].q8.as_deref() {
                if !on_backend(&self.segments[i], &kernels) {
                    let a = x8.get_or_insert_with(|| ActQ8::new(x, rows, k));
                    let off = self.segments[i].off;
                    super::q8dot::matmul(w8, a, &mut out[off..], self.n_total, threads);
                    i += 1;
                    continue;
                }
            }
            if let Some(w8) = self.segments[i].int8.as_deref() {
                if !on_backend(&self.segments[i], &kernels) {
                    let a = xq.get_or_insert_with(|| ActQ::new(x, rows, k));
                    let off = self.segments[i].off;
                    super::tqdot::matmul(w8, a, &mut out[off..], self.n_total, threads);
                    i += 1;
                    continue;
                }
            }
            if on_backend(&self.segments[i], &kernels) {
                let seg = &self.segments[i];
                let kn = kernels.as_deref_mut().expect("checked above");
                kn.matmul(&seg.name, x, rows, k, &mut out[seg.off..], self.n_total)?;
                i += 1;
                continue;
            }
            if let Some(cw) = &self.segments[i].cuda {
                let off = self.segments[i].off;
                cw.matmul(x, rows, &mut out[off..], self.n_total);
                i += 1;
                continue;
            }
            let round = if ggml_numerics {
                ActRound::for_weight(self.segments[i].ty)
            } else {
                ActRound::None
            };
            let mut j = i + 1;
            while j < self.segments.len()
                && self.segments[j].cuda.is_none()
                && self.segments[j].int8.is_none()
                && self.segments[j].q8.is_none()
                && !on_backend(&self.segments[j], &kernels)
                && (!ggml_numerics || ActRound::for_weight(self.segments[j].ty) == round)
            {
                j += 1;
            }
            let off = self.segments[i].off;
            let n = self.segments[j - 1].off + self.segments[j - 1].n - off;
            let w = &self.w[off * k..(off + n) * k];
            if round == ActRound::None || !k.is_multiple_of(round.block()) {
                matmul_t(x, rows, k, w, n, &mut out[off..], self.n_total, threads);
            } else {
                let mut xr = x[..rows * k].to_vec();
                round.apply_rows(&mut xr, k);
                matmul_t(&xr, rows, k, w, n, &mut out[off..], self.n_total, threads);
            }
            i = j;
        }
        if let Some(b) = &self.bias {
            out[..rows * self.n_total]
                .par_chunks_mut(self.n_total)
                .for_each(|r| r.iter_mut().zip(b).for_each(|(o, b)| *o += b));
        }
        Ok(())
    }

    pub fn names(&self) -> Vec<&str> {
        self.segments.iter().map(|s| s.name.as_str()).collect()
    }
}

/// A block's weights as f32.
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// q | k | v stacked (one fused tensor or three).
    pub qkv: LinearSet,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: LinearSet,
    pub ffn_norm: Vec<f32>,
    /// Gemma's norms of the attention and FFN outputs.
    pub attn_post_norm: Option<Vec<f32>>,
    pub ffn_post_norm: Option<Vec<f32>>,
    /// gate | up stacked (two tensors, or Phi-3's one fused `ffn_up`); empty in an MoE block.
    pub gate_up: LinearSet,
    pub down: LinearSet,
    /// The router of an MoE block (its experts are loaded by the forward pass as rows are
    /// routed to them, into `experts`).
    pub router: Option<LinearSet>,
    /// An MoE block's experts loaded so far: kept with the block, so a block-major pass loads
    /// each once (see [`Experts`]).
    pub(crate) experts: Experts,
}

/// A block's expert slices loaded so far (gate | up, down per expert), kept while the block runs
/// on every batch of a block-major pass, so each expert is dequantized once per block per pass
/// rather than once per batch. At most the block's whole expert tensors in f32 (Qwen3-30B-A3B:
/// 128 experts × 3 × 768 × 2048 × 4 B = 2.4 GB), dropped with the block's other weights.
#[derive(Default)]
pub(crate) struct Experts {
    pub(super) loaded: Vec<Option<(LinearSet, LinearSet)>>,
}

impl LayerWeights {
    /// [`LinearSet::prepare_cuda`] for every set of the block; returns the number of weights.
    pub fn prepare_cuda(&mut self, f: &GgufFile, path: CudaTqPath) -> Result<usize> {
        Ok(self.qkv.prepare_cuda(f, path)?
            + self.wo.prepare_cuda(f, path)?
            + self.gate_up.prepare_cuda(f, path)?
            + self.down.prepare_cuda(f, path)?)
    }

    /// [`LinearSet::prepare_int8`] for every set of the block; returns the number of weights.
    pub(crate) fn prepare_int8(
        &mut self,
        f: &GgufFile,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<usize> {
        Ok(self.qkv.prepare_int8(f, skip)?
            + self.wo.prepare_int8(f, skip)?
            + self.gate_up.prepare_int8(f, skip)?
            + self.down.prepare_int8(f, skip)?
            + match self.router.as_mut() {
                Some(r) => r.prepare_int8(f, skip)?,
                None => 0,
            })
    }

    /// [`LinearSet::prepare_q8`] for every set of the block; returns the number of weights.
    pub(crate) fn prepare_q8(
        &mut self,
        f: &GgufFile,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<usize> {
        Ok(self.qkv.prepare_q8(f, skip)?
            + self.wo.prepare_q8(f, skip)?
            + self.gate_up.prepare_q8(f, skip)?
            + self.down.prepare_q8(f, skip)?
            + match self.router.as_mut() {
                Some(r) => r.prepare_q8(f, skip)?,
                None => 0,
            })
    }

    /// The linear sets of block `l` as [`LayerWeights::load`] builds them, without loading
    /// anything: for each set, the GGUF names of its weights (in the order the runtime's
    /// observer reports them) and its input width. Calibration uses it to know in advance which
    /// Hessians a pass will produce.
    pub fn linear_groups(f: &GgufFile, l: usize) -> Result<Vec<(Vec<String>, usize)>> {
        let n = LayerNames::new(l);
        let mut sets: Vec<Vec<&String>> = vec![
            if f.tensor(&n.attn_qkv).is_some() {
                vec![&n.attn_qkv]
            } else {
                vec![&n.attn_q, &n.attn_k, &n.attn_v]
            },
            vec![&n.attn_output],
        ];
        if f.tensor(&n.ffn_gate_inp).is_some() {
            // Experts are observed per expert (`Observer::expert_input`), not here.
            sets.push(vec![&n.ffn_gate_inp]);
        } else {
            sets.push(if f.tensor(&n.ffn_gate).is_some() {
                vec![&n.ffn_gate, &n.ffn_up]
            } else {
                vec![&n.ffn_up]
            });
            sets.push(vec![&n.ffn_down]);
        }
        sets.into_iter()
            .map(|names| {
                let t = f.tensor(names[0]).ok_or_else(|| {
                    Error::bad_input(&f.path, format!("missing tensor {}", names[0]))
                })?;
                Ok((names.into_iter().cloned().collect(), t.row_len() as usize))
            })
            .collect()
    }

    pub fn load(f: &GgufFile, cfg: &Config, l: usize) -> Result<LayerWeights> {
        Self::load_with(f, cfg, l, &|_| false)
    }

    /// [`LayerWeights::load`] without dequantizing the linear weights `skip` names (a backend
    /// multiplies them).
    pub(crate) fn load_with(
        f: &GgufFile,
        _cfg: &Config,
        l: usize,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<LayerWeights> {
        let n = LayerNames::new(l);
        let qkv = if f.tensor(&n.attn_qkv).is_some() {
            LinearSet::load_with(f, &[(&n.attn_qkv, &n.attn_qkv_b)], skip)?
        } else {
            LinearSet::load_with(
                f,
                &[
                    (&n.attn_q, &n.attn_q_b),
                    (&n.attn_k, &n.attn_k_b),
                    (&n.attn_v, &n.attn_v_b),
                ],
                skip,
            )?
        };
        let (gate_up, down, router) = if f.tensor(&n.ffn_gate_inp).is_some() {
            let router = LinearSet::load_with(f, &[(&n.ffn_gate_inp, "")], skip)?;
            (LinearSet::empty(), LinearSet::empty(), Some(router))
        } else {
            let gate_up = if f.tensor(&n.ffn_gate).is_some() {
                LinearSet::load_with(
                    f,
                    &[(&n.ffn_gate, &n.ffn_gate_b), (&n.ffn_up, &n.ffn_up_b)],
                    skip,
                )?
            } else {
                // Phi-3: one ffn_up of 2·n_ff rows, gate first — the same stacking.
                LinearSet::load_with(f, &[(&n.ffn_up, &n.ffn_up_b)], skip)?
            };
            let down = LinearSet::load_with(f, &[(&n.ffn_down, &n.ffn_down_b)], skip)?;
            (gate_up, down, None)
        };
        Ok(LayerWeights {
            attn_norm: load_f32(f, &n.attn_norm)?,
            qkv,
            q_norm: load_opt(f, &n.attn_q_norm)?,
            k_norm: load_opt(f, &n.attn_k_norm)?,
            wo: LinearSet::load_with(f, &[(&n.attn_output, &n.attn_output_b)], skip)?,
            ffn_norm: load_f32(f, &n.ffn_norm)?,
            attn_post_norm: load_opt(f, &n.attn_post_norm)?,
            ffn_post_norm: load_opt(f, &n.ffn_post_norm)?,
            gate_up,
            down,
            router,
            experts: Default::default(),
        })
    }
}

/// ggml's RMS norm: mean of squares summed in f64, `1/sqrt(mean + eps)` in f32, then the weight.
#[inline]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (ss / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// Row-wise RMS norm of a `rows × cols` matrix, in parallel.
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, cols: usize, out: &mut [f32]) {
    out.par_chunks_mut(cols)
        .zip(x.par_chunks(cols))
        .for_each(|(o, r)| rms_norm(r, w, eps, o));
}

/// SiLU(gate) · up, as ggml's swiglu.
#[inline]
pub fn swiglu(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// The gated activation of stacked gate|up rows (`gu`: rows × 2·`nff`, gate first) into `act`
/// (rows × `nff`): SwiGLU, or with `gelu` GELU(gate)·up ([`geglu`], ggml's table when `ggml`).
pub fn glu_rows(gu: &[f32], act: &mut [f32], nff: usize, gelu: bool, ggml: bool) {
    act.par_chunks_mut(nff)
        .zip(gu.par_chunks(2 * nff))
        .for_each(|(a, g)| {
            let (gate, up) = g.split_at(nff);
            for i in 0..nff {
                a[i] = if gelu {
                    geglu(gate[i], up[i], ggml)
                } else {
                    swiglu(gate[i], up[i])
                };
            }
        });
}

/// GELU, tanh form, in f32 as ggml's `ggml_gelu_f32`.
#[inline]
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU(gate) · up. With `ggml`, as ggml's CPU backend computes it: the gate rounded to f16,
/// looked up in a table of f16 GELU values (`GGML_GELU_FP16`), 0 below -10 and identity above 10.
#[inline]
pub fn geglu(g: f32, u: f32, ggml: bool) -> f32 {
    if !ggml {
        return gelu(g) * u;
    }
    if g <= -10.0 {
        0.0
    } else if g >= 10.0 {
        g * u
    } else {
        let h = half::f16::from_f32(g).to_f32();
        half::f16::from_f32(gelu(h)).to_f32() * u
    }
}
