//! The model architectures tq knows, once for every room: the runtime (`model`) runs them, the
//! Hugging Face reader (`source::hf`) converts them, and both name them alike. Also the tensor
//! roles read off llama.cpp tensor names (`blk.N.attn_q.weight` …), which the planner's recipes
//! and sequential calibration key on.

/// The decoder architectures tq runs (and, for llama/qwen2/qwen3, converts from Hugging Face).
/// They share one pre-norm graph and differ in the features below; a llama-family file with
/// `{arch}.expert_count` (Mixtral) is `Llama` with a mixture-of-experts feed-forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// llama, SmolLM, Mistral-style, Mixtral (no biases; rotary pairs are adjacent values).
    Llama,
    /// Qwen2: q/k/v biases; NEOX rotary layout (pairs half a head apart).
    Qwen2,
    /// Qwen3: per-head RMS norm of q and k before RoPE; NEOX rotary layout.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, a routed mixture of experts (softmax, top-k, renormalized).
    Qwen3Moe,
    /// Gemma 2: embeddings × √d, post-attention/-FFN norms, GELU-gated FFN, sliding-window layers
    /// alternating with global ones, attention and final logit soft-capping, tied output.
    Gemma2,
    /// Gemma 3: Gemma 2 plus q/k norms, 5 sliding-window layers per global one with their own
    /// RoPE base; no soft-capping unless the file says.
    Gemma3,
    /// Phi-3: fused qkv and gate|up tensors, NEOX (optionally partial) rotary, LongRoPE factors.
    Phi3,
}

impl Arch {
    pub const ALL: [Arch; 7] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Phi3,
    ];

    /// The architecture a GGUF `general.architecture` names.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The GGUF `general.architecture` name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
        }
    }

    /// The supported `general.architecture` names, for error messages.
    pub fn names() -> String {
        Arch::ALL.map(|a| a.name()).join(", ")
    }

    /// The Hugging Face `architectures[0]` classes that convert to it (as registered by
    /// llama.cpp's convert_hf_to_gguf for these model classes).
    pub fn hf_classes(self) -> &'static [&'static str] {
        match self {
            Arch::Llama => &[
                "LlamaForCausalLM",
                "LLaMAForCausalLM",
                "MistralForCausalLM",
                "LlamaModel",
            ],
            Arch::Qwen2 => &["Qwen2ForCausalLM", "Qwen2Model"],
            Arch::Qwen3 => &["Qwen3ForCausalLM", "Qwen3Model"],
            // Run from GGUF only: their Hugging Face checkpoints are converted by llama.cpp.
            Arch::Qwen3Moe | Arch::Gemma2 | Arch::Gemma3 | Arch::Phi3 => &[],
        }
    }

    /// The architecture of a Hugging Face `architectures[0]` class.
    pub fn from_hf_class(class: &str) -> Option<Arch> {
        Arch::ALL
            .into_iter()
            .find(|a| a.hf_classes().contains(&class))
    }

    /// ggml's rope mode: adjacent pairs (`LLAMA_ROPE_TYPE_NORM`) or halves (`NEOX`).
    pub fn rope_neox(self) -> bool {
        !matches!(self, Arch::Llama)
    }

    /// Per-head RMS norms of q and k (`attn_q_norm` / `attn_k_norm`).
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3)
    }

    /// Gemma's extra RMS norms on the attention and FFN outputs (`post_attention_norm`,
    /// `post_ffw_norm`), its √d embedding scale and GELU gate.
    pub fn gemma(self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }

    /// Phi-3 keeps gate and up in one `ffn_up` tensor (`[n_embd, 2·n_ff]`, gate first).
    pub fn fused_gate_up(self) -> bool {
        self == Arch::Phi3
    }
}

/// The sizes that fix a decoder's tensor shapes (ggml order: `[ne0, ne1]`).
#[derive(Clone, Copy, Debug)]
pub struct Shapes {
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_ff: u64,
    /// n_head × head_dim.
    pub q_dim: u64,
    /// n_head_kv × head_dim.
    pub kv_dim: u64,
    pub head_dim: u64,
    pub n_vocab: u64,
    /// Experts per MoE block (0: dense feed-forward).
    pub n_expert: u64,
    /// Feed-forward width of one expert.
    pub n_ff_exp: u64,
}

/// Mixture-of-experts sizes from metadata: `{a}.expert_count` (0 or absent: dense) and one
/// expert's width, `{a}.expert_feed_forward_length` or, as llama.cpp reads Mixtral,
/// `{a}.feed_forward_length` (`n_ff`). `get` reads an unsigned key.
pub fn moe_sizes(a: &str, n_ff: u64, get: &dyn Fn(&str) -> Option<u64>) -> (u64, u64) {
    let n_expert = get(&format!("{a}.expert_count")).unwrap_or(0);
    let n_ff_exp = get(&format!("{a}.expert_feed_forward_length")).unwrap_or(n_ff);
    (n_expert, n_ff_exp)
}

/// A tensor the forward pass reads (tq's runtime and llama.cpp's loader alike).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub name: String,
    /// ggml order.
    pub dims: Vec<u64>,
    /// Absent is an error (else: checked only when present).
    pub required: bool,
}

/// Every tensor of a decoder of `arch` with these shapes, in load order: `output_norm`,
/// `output` (optional: tied to `token_embd`), then each block's. `token_embd.weight` is not
/// listed: `n_vocab` is read off it. `fused_qkv(l)`: block `l` stores `attn_qkv` instead of
/// q/k/v.
pub fn expected_tensors(arch: Arch, s: &Shapes, fused_qkv: &dyn Fn(u64) -> bool) -> Vec<Expected> {
    let (e, q, kv, ff, hd) = (s.n_embd, s.q_dim, s.kv_dim, s.n_ff, s.head_dim);
    let mut v = vec![];
    let mut push = |name: String, dims: &[u64], required: bool| {
        v.push(Expected {
            name,
            dims: dims.to_vec(),
            required,
        })
    };
    push("output_norm.weight".into(), &[e], true);
    push("output.weight".into(), &[e, s.n_vocab], false);
    for l in 0..s.n_layer {
        let w = |n: &str| format!("blk.{l}.{n}.weight");
        let b = |n: &str| format!("blk.{l}.{n}.bias");
        push(w("attn_norm"), &[e], true);
        if fused_qkv(l) {
            push(w("attn_qkv"), &[e, q + 2 * kv], true);
            push(b("attn_qkv"), &[q + 2 * kv], false);
        } else {
            push(w("attn_q"), &[e, q], true);
            push(w("attn_k"), &[e, kv], true);
            push(w("attn_v"), &[e, kv], true);
        }
        push(b("attn_q"), &[q], false);
        push(b("attn_k"), &[kv], false);
        push(b("attn_v"), &[kv], false);
        push(w("attn_q_norm"), &[hd], arch.qk_norm());
        push(w("attn_k_norm"), &[hd], arch.qk_norm());
        push(w("attn_output"), &[q, e], true);
        push(b("attn_output"), &[e], false);
        if arch.gemma() {
            push(w("post_attention_norm"), &[e], true);
            push(w("post_ffw_norm"), &[e], true);
        }
        push(w("ffn_norm"), &[e], true);
        if s.n_expert > 0 {
            let (x, fe) = (s.n_expert, s.n_ff_exp);
            push(w("ffn_gate_inp"), &[e, x], true);
            push(w("ffn_gate_exps"), &[e, fe, x], true);
            push(w("ffn_up_exps"), &[e, fe, x], true);
            push(w("ffn_down_exps"), &[fe, e, x], true);
        } else if arch.fused_gate_up() {
            push(w("ffn_up"), &[e, 2 * ff], true);
            push(w("ffn_down"), &[ff, e], true);
        } else {
            push(w("ffn_gate"), &[e, ff], true);
            push(w("ffn_up"), &[e, ff], true);
            push(w("ffn_down"), &[ff, e], true);
            push(b("ffn_gate"), &[ff], false);
            push(b("ffn_up"), &[ff], false);
            push(b("ffn_down"), &[e], false);
        }
    }
    v
}

/// Tensor roles the recipes distinguish (llama.cpp tensor names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    TokenEmbd,
    Output,
    Attn,
    FfnGateUp,
    FfnDown,
    /// An MoE router (`ffn_gate_inp`): kept f32, as llama-quantize keeps it (routing is a
    /// discontinuous top-k; a rounded router sends tokens to other experts).
    Router,
    Other,
}

/// The layer number of a tensor named `blk.N.*`.
pub fn layer_of(name: &str) -> Option<u32> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Classify a tensor by its llama.cpp name: role and layer index.
pub fn classify(name: &str) -> (Role, Option<u32>) {
    let layer = layer_of(name);
    let base = name.strip_suffix(".weight").unwrap_or(name);
    let last = base.rsplit('.').next().unwrap_or(base);
    let role = match last {
        "token_embd" => Role::TokenEmbd,
        "output" if layer.is_none() => Role::Output,
        "attn_q" | "attn_k" | "attn_v" | "attn_output" | "attn_qkv" => Role::Attn,
        "ffn_gate" | "ffn_up" | "ffn_gate_exps" | "ffn_up_exps" | "ffn_gate_shexp"
        | "ffn_up_shexp" => Role::FfnGateUp,
        "ffn_down" | "ffn_down_exps" | "ffn_down_shexp" => Role::FfnDown,
        "ffn_gate_inp" => Role::Router,
        _ => Role::Other,
    };
    (role, layer)
}

/// The layer of one of the four attention projections whose types must agree within a layer
/// (FORMATS.md §2: Metal rotates the activation in place).
pub fn attention_group(name: &str) -> Option<u32> {
    let (role, layer) = classify(name);
    let last = name
        .strip_suffix(".weight")
        .unwrap_or(name)
        .rsplit('.')
        .next()
        .unwrap_or("");
    match (role, layer) {
        (Role::Attn, Some(l)) if matches!(last, "attn_q" | "attn_k" | "attn_v" | "attn_output") => {
            Some(l)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Arch::ALL {
            assert_eq!(Arch::from_name(a.name()), Some(a));
            for c in a.hf_classes() {
                assert_eq!(Arch::from_hf_class(c), Some(a));
            }
        }
        assert_eq!(Arch::from_name("gemma"), None);
        assert_eq!(Arch::from_name("gemma3"), Some(Arch::Gemma3));
        assert_eq!(Arch::from_hf_class("GemmaForCausalLM"), None);
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("output.weight"), None);
    }
}
