//! `tq`: an offline quantizer for large language models that writes GGUF files.
//!
//! Data flows one way: sources (GGUF, safetensors) → plan → quantize (via the type registry)
//! → streaming GGUF writer. See `docs/design.md`.

pub mod arch;
pub mod calib;
pub mod codebook;
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
pub mod plan;
pub mod quant;
pub mod source;
pub mod tokenizer;
pub mod types;

pub use error::{Error, Result};
