//! Perplexity and KL-divergence evaluation compatible with `llama-perplexity` (see `docs/eval.md`).

pub mod kld;
pub mod logits_file;
pub mod perplexity;

pub use perplexity::{evaluate, EvalResult, Reference, Windows};
