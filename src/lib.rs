//! `tq`: an offline quantizer for large language models that writes GGUF files.
//!
//! Data flows one way (see `docs/design.md`, whose layering table `tests/architecture.rs`
//! enforces):
//!
//! ```text
//! source → plan → [calib] → quant → convert (→ gguf writer) → eval
//! ```
//!
//! The API is the rooms below; what a room does not need to show is `pub(crate)`. The `tq`
//! binary is a thin shell over exactly this API.
//!
//! - Foundations: [`error`] (one-line errors, exit codes), [`math`] (Hadamard/RHT, sign
//!   generators, Lloyd-Max), [`io`] (atomic outputs, page dropping, hashing).
//! - Formats: [`types`] (the registry: every tensor type's geometry and reference kernels, and the
//!   engine profiles that give them ids), [`gguf`] (reader and streaming writer), [`arch`].
//! - Inputs: [`source`] (GGUF, safetensors, Hugging Face directories), [`tokenizer`].
//! - Runtime: [`model`] (layer-streaming CPU runtime), [`numerics`] (CPU models of engine
//!   arithmetic).
//! - Pipeline: [`plan`], [`calib`], [`quant`], [`convert`], [`eval`]; [`shard`] (work split
//!   across machines: `--shard`, fragments, `tq assemble`, `tq calib merge`); [`pipeline`] (one
//!   conversion job resolved from the flags and run end to end, the mix included).
//! - Products: [`codebook`] (tables for engines), [`gpu`] (decode kernels and their parity
//!   harness), [`inspect`], [`validate`] (the CI gate), [`conformance`] (vector files through the
//!   CPU references).

// Unit tests include the integration tests' fixture generator, which names the crate `tq`.
#[cfg(test)]
extern crate self as tq;
#[cfg(test)]
#[path = "../fixtures/gguf_gen.rs"]
#[allow(dead_code)] // the integration tests' generator: unit tests use a few of its models
mod gguf_gen;

pub mod arch;
pub mod calib;
pub mod codebook;
pub mod conformance;
pub mod convert;
pub mod error;
pub mod eval;
pub mod gguf;
pub mod gpu;
pub mod inspect;
pub mod io;
pub mod math;
pub mod model;
pub mod numerics;
pub mod pipeline;
pub mod plan;
pub mod quant;
pub mod shard;
pub mod source;
pub mod tokenizer;
pub mod types;
pub mod validate;

pub use error::{Error, Result};
