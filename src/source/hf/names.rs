//! Hugging Face tensor names → GGUF names (gguf-py's tensor map for llama / qwen2 / qwen3), and
//! the row permutation llama.cpp applies to attn_q / attn_k of llama-architecture models.

use super::config::Arch;

/// How rows of a GGUF tensor are taken from the Hugging Face tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Perm {
    None,
    /// `LlamaModel.permute(w, n_head, n_head_kv)`: rows within each head are interleaved
    /// (first half, second half) → (even, odd). The value is the head count used.
    Rope(u64),
}

impl Perm {
    /// The source row (or, for 1-D tensors, element) of output row `r` of a tensor of `rows` rows.
    /// `rows` is a multiple of `2 * heads` (checked at open).
    #[inline]
    pub fn src(self, r: u64, rows: u64) -> u64 {
        match self {
            Perm::None => r,
            Perm::Rope(heads) => {
                let hd = rows / heads;
                let (h, rem) = (r / hd, r % hd);
                h * hd + (rem % 2) * (hd / 2) + rem / 2
            }
        }
    }
}

/// Tensors convert_hf_to_gguf drops without a word.
pub fn is_ignored(name: &str) -> bool {
    name.ends_with(".attention.masked_bias")
        || name.ends_with(".attention.bias")
        || name.ends_with(".rotary_emb.inv_freq")
}

/// Map one tensor. `None`: no GGUF name (an error for the caller: convert_hf_to_gguf refuses too).
pub fn map(
    arch: Arch,
    hf_arch: &str,
    name: &str,
    n_head: u64,
    n_head_kv: u64,
) -> Option<(String, Perm)> {
    // Base-model classes (no LM head) name tensors without the "model." prefix.
    let owned;
    let mut name = name;
    if matches!(hf_arch, "LlamaModel" | "Qwen2Model" | "Qwen3Model") && !name.starts_with("model.")
    {
        owned = format!("model.{name}");
        name = &owned;
    }
    let (stem, suffix) = if let Some(s) = name.strip_suffix(".weight") {
        (s, "weight")
    } else if let Some(s) = name.strip_suffix(".bias") {
        (s, "bias")
    } else {
        return None;
    };
    let out = match stem {
        "model.embed_tokens" => "token_embd".to_string(),
        "lm_head" => "output".to_string(),
        "model.norm" => "output_norm".to_string(),
        _ => {
            let rest = stem.strip_prefix("model.layers.")?;
            let (n, part) = rest.split_once('.')?;
            if n.is_empty()
                || n.len() > 6
                || !n.bytes().all(|b| b.is_ascii_digit())
                || (n.len() > 1 && n.starts_with('0'))
            {
                return None;
            }
            let g = match part {
                "input_layernorm" => "attn_norm",
                "post_attention_layernorm" => "ffn_norm",
                "self_attn.q_proj" => "attn_q",
                "self_attn.k_proj" => "attn_k",
                "self_attn.v_proj" => "attn_v",
                "self_attn.o_proj" => "attn_output",
                "self_attn.q_norm" if arch == Arch::Qwen3 => "attn_q_norm",
                "self_attn.k_norm" if arch == Arch::Qwen3 => "attn_k_norm",
                "mlp.gate_proj" => "ffn_gate",
                "mlp.up_proj" => "ffn_up",
                "mlp.down_proj" => "ffn_down",
                _ => return None,
            };
            format!("blk.{n}.{g}")
        }
    };
    let perm = if arch == Arch::Llama {
        if stem.ends_with(".self_attn.q_proj") {
            Perm::Rope(n_head)
        } else if stem.ends_with(".self_attn.k_proj") {
            Perm::Rope(if n_head != n_head_kv {
                n_head_kv
            } else {
                n_head
            })
        } else {
            Perm::None
        }
    } else {
        Perm::None
    };
    Some((format!("{out}.{suffix}"), perm))
}

pub use crate::arch::layer_of;

/// The Hugging Face tensors a model of `arch` with `n_layer` blocks must hold (the ones llama.cpp
/// loads without `TENSOR_NOT_REQUIRED`), in file order: embeddings, final norm, the output
/// projection when `lm_head` is expected, then per block its norms, q/k/v/o (+ q/k/v biases for
/// qwen2, q/k norms for qwen3) and gate/up/down.
pub fn required(arch: Arch, n_layer: u64, lm_head: bool) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "model.embed_tokens.weight".into(),
        "model.norm.weight".into(),
    ];
    if lm_head {
        v.push("lm_head.weight".into());
    }
    for l in 0..n_layer {
        let mut parts = vec![
            "input_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ];
        if arch == Arch::Qwen2 {
            parts.extend([
                "self_attn.q_proj.bias",
                "self_attn.k_proj.bias",
                "self_attn.v_proj.bias",
            ]);
        }
        if arch.qk_norm() {
            parts.extend(["self_attn.q_norm.weight", "self_attn.k_norm.weight"]);
        }
        v.extend(parts.iter().map(|p| format!("model.layers.{l}.{p}")));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let m = |n: &str| map(Arch::Llama, "LlamaForCausalLM", n, 9, 3);
        assert_eq!(
            m("model.embed_tokens.weight").unwrap().0,
            "token_embd.weight"
        );
        assert_eq!(m("lm_head.weight").unwrap().0, "output.weight");
        assert_eq!(m("model.norm.weight").unwrap().0, "output_norm.weight");
        assert_eq!(
            m("model.layers.12.self_attn.q_proj.weight").unwrap(),
            ("blk.12.attn_q.weight".into(), Perm::Rope(9))
        );
        assert_eq!(
            m("model.layers.0.self_attn.k_proj.weight").unwrap(),
            ("blk.0.attn_k.weight".into(), Perm::Rope(3))
        );
        assert_eq!(
            m("model.layers.0.self_attn.v_proj.weight").unwrap().1,
            Perm::None
        );
        assert_eq!(
            m("model.layers.3.mlp.down_proj.weight").unwrap().0,
            "blk.3.ffn_down.weight"
        );
        assert!(m("model.layers.0.self_attn.q_norm.weight").is_none());
        assert!(m("model.layers.x.mlp.up_proj.weight").is_none());
        assert!(m("model.layers.01.mlp.up_proj.weight").is_none());
        assert!(m("vision_tower.weight").is_none());
        let q = |n: &str| map(Arch::Qwen3, "Qwen3ForCausalLM", n, 16, 8);
        assert_eq!(
            q("model.layers.1.self_attn.k_norm.weight").unwrap(),
            ("blk.1.attn_k_norm.weight".into(), Perm::None)
        );
        assert_eq!(
            map(
                Arch::Qwen2,
                "Qwen2ForCausalLM",
                "model.layers.1.self_attn.q_proj.bias",
                4,
                2
            )
            .unwrap(),
            ("blk.1.attn_q.bias".into(), Perm::None)
        );
        assert_eq!(
            map(
                Arch::Llama,
                "LlamaModel",
                "layers.2.mlp.up_proj.weight",
                4,
                4
            )
            .unwrap()
            .0,
            "blk.2.ffn_up.weight"
        );
    }

    /// The permutation is llama.cpp's reshape(n_head, 2, hd/2, ...).swapaxes(1, 2).
    #[test]
    fn permutation_matches_reshape_swapaxes() {
        let (heads, hd) = (3u64, 8u64);
        let rows = heads * hd;
        let mut seen = vec![false; rows as usize];
        for h in 0..heads {
            for i in 0..hd / 2 {
                for j in 0..2 {
                    // output index [h, i, j] of the swapped view = input [h, j, i]
                    let out = h * hd + i * 2 + j;
                    let inp = h * hd + j * (hd / 2) + i;
                    assert_eq!(Perm::Rope(heads).src(out, rows), inp);
                    seen[inp as usize] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
}
