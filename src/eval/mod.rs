//! Perplexity and KL-divergence evaluation compatible with `llama-perplexity` (see `docs/eval.md`),
//! and the KV-cache presets `tq kv` recommends or measures with it ([`kv`], [`kv_presets`]).

pub mod backend;
pub(crate) mod kld;
pub mod kv;
pub mod kv_presets;
pub mod logits_file;
pub(crate) mod perplexity;
pub mod session;

pub use perplexity::{evaluate, evaluate_until, EvalResult, Reference, Windows};
