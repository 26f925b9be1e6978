//! Hyper-parameters of a llama-family decoder, read from GGUF metadata the way llama.cpp reads
//! them (`{arch}.block_count`, `{arch}.attention.head_count`, ...), and the tensor names of one
//! block. Validation happens here, before any weight is touched: a missing key or a tensor of the
//! wrong shape is a one-line error naming it.

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

pub use crate::arch::Arch;

/// Everything the forward pass needs to know about the shapes and constants of a model.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Per-head dimension of q/k/v (`attention.key_length`, default `n_embd / n_head`).
    pub head_dim: usize,
    pub n_vocab: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Linear RoPE scaling: positions are multiplied by this (`1 / rope.scaling.factor`).
    pub rope_freq_scale: f32,
    /// Per-pair frequency divisors (`rope_freqs.weight`, llama3-style scaling), if present.
    pub rope_freq_factors: Option<Vec<f32>>,
    pub rope_neox: bool,
    /// Scale applied to q·k (`attention.scale`, default `1/sqrt(head_dim)`).
    pub kq_scale: f32,
    /// `output.weight` absent: the output projection reuses `token_embd.weight`.
    pub tied_output: bool,
    /// Training context length, when the file says (informational).
    pub n_ctx_train: Option<usize>,
}

/// Defaults used when an optional key is absent (same as llama.cpp's).
pub const DEFAULT_RMS_EPS: f32 = 1e-5;
pub const DEFAULT_ROPE_BASE: f32 = 10000.0;

impl Config {
    /// The model's shape and hyper-parameters from GGUF metadata, each missing key named.
    // One function on purpose: one key per block, in the order llama.cpp's llm_load_hparams reads them.
    pub fn from_gguf(f: &GgufFile) -> Result<Config> {
        let path = &f.path;
        let arch_name = f
            .architecture()
            .ok_or_else(|| Error::bad_input(path, "missing metadata key general.architecture"))?;
        let arch = Arch::from_name(arch_name).ok_or_else(|| {
            Error::Unsupported(format!(
                "{}: architecture '{}' is not supported by the tq runtime (supported: llama, qwen2, qwen3)",
                path.display(),
                crate::error::one_line(arch_name)
            ))
        })?;
        let a = arch_name;
        let req = |k: &str| -> Result<usize> {
            let key = format!("{a}.{k}");
            let v = f
                .get_u64(&key)
                .ok_or_else(|| Error::bad_input(path, format!("missing metadata key {key}")))?;
            if v == 0 || v > (1 << 24) {
                return Err(Error::bad_input(
                    path,
                    format!("metadata {key} = {v} is out of range"),
                ));
            }
            Ok(v as usize)
        };
        let opt_u = |k: &str| f.get_u64(&format!("{a}.{k}")).map(|v| v as usize);
        let opt_f = |k: &str| f.get_f64(&format!("{a}.{k}"));

        let n_layer = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_ff = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = opt_u("attention.head_count_kv").unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(Error::bad_input(
                path,
                format!("{a}.attention.head_count_kv = {n_head_kv} does not divide head_count = {n_head}"),
            ));
        }
        let head_dim = match opt_u("attention.key_length") {
            Some(d) => d,
            None => {
                if n_embd % n_head != 0 {
                    return Err(Error::bad_input(
                        path,
                        format!("{a}.embedding_length {n_embd} is not a multiple of head_count {n_head}; add {a}.attention.key_length"),
                    ));
                }
                n_embd / n_head
            }
        };
        if let Some(dv) = opt_u("attention.value_length") {
            if dv != head_dim {
                return Err(Error::Unsupported(format!(
                    "{}: {a}.attention.value_length {dv} != key_length {head_dim} is not supported",
                    path.display()
                )));
            }
        }
        if head_dim % 2 != 0 || head_dim == 0 {
            return Err(Error::bad_input(
                path,
                format!("head dimension {head_dim} must be even"),
            ));
        }
        if let Some(n_rot) = opt_u("rope.dimension_count") {
            if n_rot != head_dim {
                return Err(Error::Unsupported(format!(
                    "{}: partial rotary embeddings ({a}.rope.dimension_count {n_rot} != head dim {head_dim}) are not supported",
                    path.display()
                )));
            }
        }
        let rms_eps =
            opt_f("attention.layer_norm_rms_epsilon").unwrap_or(DEFAULT_RMS_EPS as f64) as f32;
        let rope_base = opt_f("rope.freq_base").unwrap_or(DEFAULT_ROPE_BASE as f64) as f32;
        let scaling = f
            .get_str(&format!("{a}.rope.scaling.type"))
            .unwrap_or("none");
        let factor = opt_f("rope.scaling.factor").unwrap_or(1.0);
        let rope_freq_scale = match scaling {
            "none" | "" => 1.0,
            "linear" => {
                if !(factor > 0.0) {
                    return Err(Error::bad_input(path, format!("{a}.rope.scaling.factor = {factor} must be > 0")));
                }
                (1.0 / factor) as f32
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: {a}.rope.scaling.type '{}' is not supported by the tq runtime (none, linear, llama3 rope_freqs)",
                    path.display(),
                    crate::error::one_line(other)
                )))
            }
        };
        let kq_scale = match opt_f("attention.scale") {
            Some(s) if s != 0.0 => s as f32,
            _ => 1.0 / (head_dim as f32).sqrt(),
        };

        let emb = f
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::bad_input(path, "missing tensor token_embd.weight"))?;
        if emb.dims.len() != 2 || emb.dims[0] as usize != n_embd {
            return Err(Error::bad_input(
                path,
                format!(
                    "token_embd.weight has shape {:?}, expected [{n_embd}, n_vocab]",
                    emb.dims
                ),
            ));
        }
        let n_vocab = emb.dims[1] as usize;
        let tied_output = f.tensor("output.weight").is_none();

        let rope_freq_factors = match f.tensor("rope_freqs.weight") {
            Some(t) => {
                if t.dims != [head_dim as u64 / 2] {
                    return Err(Error::bad_input(
                        path,
                        format!(
                            "rope_freqs.weight has shape {:?}, expected [{}]",
                            t.dims,
                            head_dim / 2
                        ),
                    ));
                }
                Some(f.tensor_f32(t)?)
            }
            None => None,
        };

        let cfg = Config {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            rms_eps,
            rope_base,
            rope_freq_scale,
            rope_freq_factors,
            rope_neox: arch.rope_neox(),
            kq_scale,
            tied_output,
            n_ctx_train: opt_u("context_length"),
        };
        cfg.check_tensors(f)?;
        Ok(cfg)
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Every tensor the forward pass reads exists with the shape it expects (optional ones are
    /// checked when present).
    fn check_tensors(&self, f: &GgufFile) -> Result<()> {
        let shapes = crate::arch::Shapes {
            n_layer: self.n_layer as u64,
            n_embd: self.n_embd as u64,
            n_ff: self.n_ff as u64,
            q_dim: self.q_dim() as u64,
            kv_dim: self.kv_dim() as u64,
            head_dim: self.head_dim as u64,
            n_vocab: self.n_vocab as u64,
        };
        let fused = |l: u64| f.tensor(&format!("blk.{l}.attn_qkv.weight")).is_some();
        for x in crate::arch::expected_tensors(self.arch, &shapes, &fused) {
            match f.tensor(&x.name) {
                Some(t) if t.dims == x.dims => {}
                Some(t) => {
                    return Err(Error::bad_input(
                        &f.path,
                        format!(
                            "tensor {} has shape {:?}, expected {:?}",
                            x.name, t.dims, x.dims
                        ),
                    ))
                }
                None if x.required => {
                    return Err(Error::bad_input(
                        &f.path,
                        format!("missing tensor {}", x.name),
                    ))
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// The llama.cpp names of one block's tensors.
#[derive(Clone, Debug)]
pub struct LayerNames {
    pub attn_norm: String,
    pub attn_qkv: String,
    pub attn_qkv_b: String,
    pub attn_q: String,
    pub attn_k: String,
    pub attn_v: String,
    pub attn_q_b: String,
    pub attn_k_b: String,
    pub attn_v_b: String,
    pub attn_q_norm: String,
    pub attn_k_norm: String,
    pub attn_output: String,
    pub attn_output_b: String,
    pub ffn_norm: String,
    pub ffn_gate: String,
    pub ffn_up: String,
    pub ffn_down: String,
    pub ffn_gate_b: String,
    pub ffn_up_b: String,
    pub ffn_down_b: String,
}

impl LayerNames {
    pub fn new(l: usize) -> LayerNames {
        let w = |n: &str| format!("blk.{l}.{n}.weight");
        let b = |n: &str| format!("blk.{l}.{n}.bias");
        LayerNames {
            attn_norm: w("attn_norm"),
            attn_qkv: w("attn_qkv"),
            attn_qkv_b: b("attn_qkv"),
            attn_q: w("attn_q"),
            attn_k: w("attn_k"),
            attn_v: w("attn_v"),
            attn_q_b: b("attn_q"),
            attn_k_b: b("attn_k"),
            attn_v_b: b("attn_v"),
            attn_q_norm: w("attn_q_norm"),
            attn_k_norm: w("attn_k_norm"),
            attn_output: w("attn_output"),
            attn_output_b: b("attn_output"),
            ffn_norm: w("ffn_norm"),
            ffn_gate: w("ffn_gate"),
            ffn_up: w("ffn_up"),
            ffn_down: w("ffn_down"),
            ffn_gate_b: b("ffn_gate"),
            ffn_up_b: b("ffn_up"),
            ffn_down_b: b("ffn_down"),
        }
    }
}
