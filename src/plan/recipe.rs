//! Recipes: which type each role of tensor gets, as data. FORMATS.md §2 gives the fork's mixes.

use crate::types::TensorType;

/// Where a slot's type comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The `--weights` type.
    Weights,
    /// The `--weights` type if it is a TurboQuant weight type, else TQ4_1S.
    Tq,
    Fixed(TensorType),
}

/// Tensor roles the recipes distinguish (llama.cpp tensor names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    TokenEmbd,
    Output,
    Attn,
    FfnGateUp,
    FfnDown,
    Other,
}

pub struct Recipe {
    pub name: &'static str,
    pub description: &'static str,
    /// Layers at each end (first, last) that get `boundary` instead of their role's slot.
    pub boundary_layers: (u32, u32),
    pub boundary: Slot,
    pub token_embd: Slot,
    pub output: Slot,
    pub attn: Slot,
    pub ffn_gate_up: Slot,
    pub ffn_down: Slot,
    pub other: Slot,
    /// The type whose llama_ftype goes into `general.file_type`.
    pub base: Slot,
}

use Slot::*;
use TensorType::*;

pub const RECIPES: &[Recipe] = &[
    Recipe {
        name: "pure",
        description: "every eligible 2-D weight gets --weights (token_embd falls back to q8_0 for TQ types)",
        boundary_layers: (0, 0),
        boundary: Weights,
        token_embd: Weights,
        output: Weights,
        attn: Weights,
        ffn_gate_up: Weights,
        ffn_down: Weights,
        other: Weights,
        base: Weights,
    },
    Recipe {
        name: "config-i",
        description: "fork's Config I: layers 2..n-3 attn q/k/v/o + ffn gate/up = TQ, ffn_down = q4_K; first/last 2 layers, token_embd, output = q8_0",
        boundary_layers: (2, 2),
        boundary: Fixed(Q8_0),
        token_embd: Fixed(Q8_0),
        output: Fixed(Q8_0),
        attn: Tq,
        ffn_gate_up: Tq,
        ffn_down: Fixed(Q4K),
        other: Fixed(Q8_0),
        base: Tq,
    },
    Recipe {
        name: "hybrid",
        description: "fork's Hybrid (llama-family): attn = TQ; ffn gate/up/down = q4_K; first/last 2 layers, token_embd, output = q8_0",
        boundary_layers: (2, 2),
        boundary: Fixed(Q8_0),
        token_embd: Fixed(Q8_0),
        output: Fixed(Q8_0),
        attn: Tq,
        ffn_gate_up: Fixed(Q4K),
        ffn_down: Fixed(Q4K),
        other: Fixed(Q8_0),
        base: Tq,
    },
    Recipe {
        name: "premium",
        description: "fork's Premium (llama-family): attn = TQ; ffn gate/up = q5_K, down = q6_K; first/last 4 layers, token_embd, output = q8_0",
        boundary_layers: (4, 4),
        boundary: Fixed(Q8_0),
        token_embd: Fixed(Q8_0),
        output: Fixed(Q8_0),
        attn: Tq,
        ffn_gate_up: Fixed(Q5K),
        ffn_down: Fixed(Q6K),
        other: Fixed(Q8_0),
        base: Tq,
    },
];

pub fn recipe(name: &str) -> Option<&'static Recipe> {
    RECIPES.iter().find(|r| r.name == name)
}

pub fn names() -> Vec<&'static str> {
    RECIPES.iter().map(|r| r.name).collect()
}

impl Slot {
    pub fn resolve(self, weights: TensorType) -> TensorType {
        match self {
            Weights => weights,
            Tq if weights.is_tq_weight() => weights,
            Tq => TQ4_1S,
            Fixed(t) => t,
        }
    }
}

/// Classify a tensor by its llama.cpp name: role and layer index.
pub fn classify(name: &str) -> (Role, Option<u32>) {
    let layer = name
        .strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse::<u32>().ok());
    let base = name.strip_suffix(".weight").unwrap_or(name);
    let last = base.rsplit('.').next().unwrap_or(base);
    let role = match last {
        "token_embd" => Role::TokenEmbd,
        "output" if layer.is_none() => Role::Output,
        "attn_q" | "attn_k" | "attn_v" | "attn_output" | "attn_qkv" => Role::Attn,
        "ffn_gate" | "ffn_up" | "ffn_gate_exps" | "ffn_up_exps" | "ffn_gate_shexp"
        | "ffn_up_shexp" => Role::FfnGateUp,
        "ffn_down" | "ffn_down_exps" | "ffn_down_shexp" => Role::FfnDown,
        _ => Role::Other,
    };
    (role, layer)
}

/// The four attention projections whose types must agree within a layer (FORMATS.md §2: Metal
/// rotates the activation in place).
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
    fn classify_names() {
        assert_eq!(classify("token_embd.weight"), (Role::TokenEmbd, None));
        assert_eq!(classify("output.weight"), (Role::Output, None));
        assert_eq!(classify("blk.12.attn_k.weight"), (Role::Attn, Some(12)));
        assert_eq!(classify("blk.3.ffn_up.weight"), (Role::FfnGateUp, Some(3)));
        assert_eq!(
            classify("blk.3.ffn_down_exps.weight"),
            (Role::FfnDown, Some(3))
        );
        assert_eq!(classify("blk.3.attn_norm.weight"), (Role::Other, Some(3)));
        assert_eq!(attention_group("blk.7.attn_output.weight"), Some(7));
        assert_eq!(attention_group("blk.7.attn_qkv.weight"), None);
    }

    #[test]
    fn slots() {
        assert_eq!(Slot::Tq.resolve(TensorType::TQ3_1S), TensorType::TQ3_1S);
        assert_eq!(Slot::Tq.resolve(TensorType::Q8_0), TensorType::TQ4_1S);
        assert_eq!(Slot::Weights.resolve(TensorType::Q4_0), TensorType::Q4_0);
    }
}
