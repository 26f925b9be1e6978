//! `tq`: an offline quantizer for large language models that writes GGUF files.
//!
//! Data flows one way: sources (GGUF, safetensors) → plan → quantize (via the type registry)
//! → streaming GGUF writer. See `docs/design.md`.

pub mod calib;
pub mod cli;
pub mod convert;
pub mod error;
pub mod eval;
pub mod gguf;
pub mod gpu;
pub mod hf;
pub mod inspect;
pub mod ldlq;
pub mod math;
pub mod model;
pub mod st;
pub mod tokenizer;
pub mod types;

pub use error::{Error, Result};
pub mod plan;
pub mod source;
