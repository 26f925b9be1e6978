//! Perplexity and KL-divergence evaluation compatible with `llama-perplexity` (see `docs/eval.md`),
//! and the KV-cache presets `tq kv` recommends or measures with it ([`kv`], [`kv_presets`]).
//! `tq eval` is a thin shell over [`job`], `tq kv` over [`kv_job`].

pub mod backend;
pub mod job;
pub(crate) mod kld;
pub mod kv;
pub mod kv_job;
pub mod kv_presets;
pub mod logits_file;
pub(crate) mod perplexity;
pub mod session;

pub use perplexity::{
    evaluate, evaluate_from, evaluate_passes, evaluate_until, pass_windows, EvalResult, Reference,
    Resume, Windows,
};
