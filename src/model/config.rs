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
    /// Rotary dimensions of a head (`rope.dimension_count`; the rest pass unrotated).
    pub n_rot: usize,
    /// cos/sin multiplier (`rope.scaling.attn_factor`, LongRoPE models), 1 when absent.
    pub rope_attn_factor: f32,
    /// LongRoPE's per-pair divisors (Phi-3 128k): short and long, and the context above which the
    /// long ones apply.
    pub longrope: Option<LongRope>,
    /// Multiplier of the token embeddings (Gemma: √n_embd, computed in f32 as llama.cpp does).
    pub emb_scale: Option<f32>,
    /// Multiplier of q after RoPE, applied before q·k (Gemma's query scaling, Phi-3's 1/√d);
    /// `kq_scale` is then 1.
    pub q_scale: Option<f32>,
    /// Attention logits soft-capped to ±cap by `cap·tanh(x/cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Output logits soft-capped the same way (Gemma 2; Gemma 3 when the file says).
    pub final_softcap: Option<f32>,
    /// Sliding-window attention on some layers (Gemma 2/3).
    pub swa: Option<Swa>,
    /// RMS norms on the attention and FFN outputs before the residual add (Gemma).
    pub post_norms: bool,
    /// FFN gate activation: GELU (tanh form; Gemma) instead of SiLU.
    pub gelu: bool,
    /// Mixture-of-experts feed-forward (Mixtral, Qwen3-MoE).
    pub moe: Option<Moe>,
}

/// Sliding-window attention: a query at position `i` sees keys `j` with `i - j < window`, on the
/// layers `layers` marks; those layers rotate with their own base and scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Swa {
    pub window: usize,
    pub layers: Vec<bool>,
    pub rope_base: f32,
    pub rope_freq_scale: f32,
}

/// LongRoPE frequency divisors (`rope_factors_short.weight`, `rope_factors_long.weight`).
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    pub short: Option<Vec<f32>>,
    pub long: Option<Vec<f32>>,
    /// `rope.scaling.original_context_length` (else the training context): a window longer
    /// than this uses the long factors, as llama.cpp picks them by its context size.
    pub n_ctx_orig: usize,
}

/// Routed experts: softmax over the router's logits, the `n_used` largest (ties: the lower
/// expert index first), their probabilities renormalized to sum 1 when `norm`, times `scale`.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    pub norm: bool,
    pub scale: Option<f32>,
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
                "{}: architecture '{}' is not supported by the tq runtime (supported: {}); tq convert without --calib still converts it tensor by tensor",
                path.display(),
                crate::error::one_line(arch_name),
                Arch::names()
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
        let n_rot = opt_u("rope.dimension_count").unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(Error::bad_input(
                path,
                format!("{a}.rope.dimension_count = {n_rot} must be even and at most the head dimension {head_dim}"),
            ));
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
            // LongRoPE: llama.cpp scales like linear (1/factor when the file has a factor) and
            // adds the per-pair factors read below.
            "linear" | "longrope" => {
                if !(factor > 0.0) {
                    return Err(Error::bad_input(path, format!("{a}.rope.scaling.factor = {factor} must be > 0")));
                }
                (1.0 / factor) as f32
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: {a}.rope.scaling.type '{}' is not supported by the tq runtime (none, linear, longrope, llama3 rope_freqs)",
                    path.display(),
                    crate::error::one_line(other)
                )))
            }
        };
        let kq_scale = match opt_f("attention.scale") {
            _ if matches!(arch, Arch::Gemma2 | Arch::Gemma3 | Arch::Phi3) => 1.0,
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
            Some(_) => Some(rope_factors(f, "rope_freqs.weight", n_rot)?.expect("present")),
            None => None,
        };
        let longrope = {
            let short = rope_factors(f, "rope_factors_short.weight", n_rot)?;
            let long = rope_factors(f, "rope_factors_long.weight", n_rot)?;
            (short.is_some() || long.is_some()).then(|| LongRope {
                short,
                long,
                n_ctx_orig: opt_u("rope.scaling.original_context_length")
                    .or(opt_u("context_length"))
                    .unwrap_or(usize::MAX),
            })
        };
        let rope_attn_factor = opt_f("rope.scaling.attn_factor").unwrap_or(1.0) as f32;

        // Gemma's query scale: llama.cpp keys the 27B's 1/√(n_embd/n_head) on the layer count
        // (query_pre_attn_scalar is not in the GGUF); every other size uses 1/√head_dim.
        let gemma_27b = matches!((arch, n_layer), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));
        let q_scale = match arch {
            Arch::Gemma2 | Arch::Gemma3 if gemma_27b => {
                Some(1.0 / ((n_embd / n_head) as f32).sqrt())
            }
            Arch::Gemma2 | Arch::Gemma3 | Arch::Phi3 => Some(1.0 / (head_dim as f32).sqrt()),
            _ => None,
        };
        let positive = |k: &str| opt_f(k).filter(|v| *v > 0.0).map(|v| v as f32);
        let (attn_softcap, final_softcap) = match arch {
            // llama.cpp's Gemma 2 caps always, with 50 / 30 when the file has no key.
            Arch::Gemma2 => (
                Some(positive("attn_logit_softcapping").unwrap_or(50.0)),
                Some(positive("final_logit_softcapping").unwrap_or(30.0)),
            ),
            Arch::Gemma3 => (None, positive("final_logit_softcapping")),
            _ => (None, None),
        };
        let swa = swa_layers(f, arch, n_layer, rope_base, rope_freq_scale)?;
        let (n_expert, n_ff_exp) = crate::arch::moe_sizes(a, n_ff as u64, &|k| f.get_u64(k));
        let moe = if n_expert > 0 {
            if !matches!(arch, Arch::Llama | Arch::Qwen3Moe) {
                return Err(Error::Unsupported(format!(
                    "{}: {a}.expert_count = {n_expert}: experts are supported for llama (Mixtral) and qwen3moe",
                    path.display()
                )));
            }
            let n_used = req("expert_used_count")?;
            if n_used as u64 > n_expert || n_expert > 512 {
                return Err(Error::bad_input(
                    path,
                    format!("{a}.expert_used_count = {n_used} with {a}.expert_count = {n_expert} is out of range"),
                ));
            }
            Some(Moe {
                n_expert: n_expert as usize,
                n_used,
                n_ff_exp: n_ff_exp as usize,
                norm: true,
                scale: positive("expert_weights_scale").filter(|&w| w != 1.0),
            })
        } else if arch == Arch::Qwen3Moe {
            return Err(Error::bad_input(
                path,
                format!("missing metadata key {a}.expert_count"),
            ));
        } else {
            None
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
            n_rot,
            rope_attn_factor,
            longrope,
            emb_scale: arch.gemma().then(|| (n_embd as f32).sqrt()),
            q_scale,
            attn_softcap,
            final_softcap,
            swa,
            post_norms: arch.gemma(),
            gelu: arch.gemma(),
            moe,
        };
        cfg.check_tensors(f)?;
        Ok(cfg)
    }

    /// RoPE (base, linear scale) of layer `l`: sliding-window layers have their own.
    pub fn rope_of(&self, l: usize) -> (f32, f32) {
        match &self.swa {
            Some(s) if s.layers[l] => (s.rope_base, s.rope_freq_scale),
            _ => (self.rope_base, self.rope_freq_scale),
        }
    }

    /// The sliding window of layer `l`, if it has one.
    pub fn window_of(&self, l: usize) -> Option<usize> {
        self.swa.as_ref().filter(|s| s.layers[l]).map(|s| s.window)
    }

    /// Per-pair RoPE divisors for windows of `seq` tokens: `rope_freqs.weight`, else LongRoPE's
    /// short or long factors as llama.cpp picks them for a context of `seq`.
    pub fn rope_factors(&self, seq: usize) -> Option<&[f32]> {
        if let Some(f) = &self.rope_freq_factors {
            return Some(f);
        }
        let lr = self.longrope.as_ref()?;
        if seq > lr.n_ctx_orig {
            lr.long.as_deref()
        } else {
            lr.short.as_deref()
        }
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
            n_expert: self.moe.as_ref().map_or(0, |m| m.n_expert as u64),
            n_ff_exp: self.moe.as_ref().map_or(0, |m| m.n_ff_exp as u64),
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

/// A `[n_rot / 2]` per-pair RoPE factor tensor, if the file has it.
fn rope_factors(f: &GgufFile, name: &str, n_rot: usize) -> Result<Option<Vec<f32>>> {
    let Some(t) = f.tensor(name) else {
        return Ok(None);
    };
    if t.dims != [n_rot as u64 / 2] {
        return Err(Error::bad_input(
            &f.path,
            format!("{name} has shape {:?}, expected [{}]", t.dims, n_rot / 2),
        ));
    }
    let v = f.tensor_f32(t)?;
    if v.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return Err(Error::bad_input(
            &f.path,
            format!("{name}: RoPE factors must be finite and positive"),
        ));
    }
    Ok(Some(v))
}

/// Which layers use a sliding window, as llama.cpp reads it: Gemma 2 alternates (pattern 2,
/// window 4096 by default) and shares the global RoPE unless `rope.freq_base_swa` is set;
/// Gemma 3 (when `attention.sliding_window` > 0) has 5 local layers per global one, rotating
/// with base 10000 (or `rope.freq_base_swa`) and no scaling. `attention.sliding_window_pattern`
/// overrides the period (an integer) or lists the layers (an array of bools). Phi-3's window is
/// ignored, as llama.cpp ignores it.
fn swa_layers(
    f: &GgufFile,
    arch: Arch,
    n_layer: usize,
    rope_base: f32,
    rope_freq_scale: f32,
) -> Result<Option<Swa>> {
    let a = arch.name();
    let key = |k: &str| format!("{a}.{k}");
    let window = f.get_u64(&key("attention.sliding_window"));
    let (window, period, base, scale) = match arch {
        Arch::Gemma2 => (window.unwrap_or(4096), 2, rope_base, rope_freq_scale),
        Arch::Gemma3 => match window {
            Some(w) if w > 0 => (w, 6, 10000.0, 1.0),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    if window == 0 || window > (1 << 24) {
        return Err(Error::bad_input(
            &f.path,
            format!(
                "{} = {window} is out of range",
                key("attention.sliding_window")
            ),
        ));
    }
    let base = f
        .get_f64(&key("rope.freq_base_swa"))
        .map_or(base, |v| v as f32);
    let pkey = key("attention.sliding_window_pattern");
    let layers = match f.get(&pkey) {
        Some(crate::gguf::Value::Array(_, items)) => {
            let v: Option<Vec<bool>> = items
                .iter()
                .map(|x| match x {
                    crate::gguf::Value::Bool(b) => Some(*b),
                    other => other.as_u64().map(|n| n != 0),
                })
                .collect();
            match v {
                Some(v) if v.len() >= n_layer => v[..n_layer].to_vec(),
                _ => {
                    return Err(Error::bad_input(
                        &f.path,
                        format!("{pkey} must list a bool for each of the {n_layer} layers"),
                    ))
                }
            }
        }
        other => {
            let p = other.and_then(|v| v.as_u64()).unwrap_or(period) as usize;
            // llama.cpp's set_swa_pattern: period 0 = all layers; else the last layer of each
            // period is global.
            (0..n_layer).map(|l| p == 0 || l % p < p - 1).collect()
        }
    };
    Ok(Some(Swa {
        window: window as usize,
        layers,
        rope_base: base,
        rope_freq_scale: scale,
    }))
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
    pub attn_post_norm: String,
    pub ffn_post_norm: String,
    pub ffn_gate_inp: String,
    pub ffn_gate_exps: String,
    pub ffn_up_exps: String,
    pub ffn_down_exps: String,
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
            attn_post_norm: w("post_attention_norm"),
            ffn_post_norm: w("post_ffw_norm"),
            ffn_gate_inp: w("ffn_gate_inp"),
            ffn_gate_exps: w("ffn_gate_exps"),
            ffn_up_exps: w("ffn_up_exps"),
            ffn_down_exps: w("ffn_down_exps"),
        }
    }
}
