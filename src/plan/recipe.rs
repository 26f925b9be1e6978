//! Recipes: which type each role of tensor gets, as data. FORMATS.md §2 gives the fork's mixes.

pub use crate::arch::{attention_group, classify, Role};
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

/// A recipe by name, or a usage error listing the recipes (`--recipe`).
pub fn parse(name: &str) -> crate::error::Result<&'static Recipe> {
    recipe(name).ok_or_else(|| {
        crate::error::Error::Usage(format!(
            "unknown recipe '{name}'; recipes: {}",
            names().join(", ")
        ))
    })
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
