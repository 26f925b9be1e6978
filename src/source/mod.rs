//! `TensorSource`: what the converter reads from — names, ggml-order shapes, source types, and
//! rows as f32 on demand (so a model is never resident). GGUF now; HF safetensors directories
//! implement the same trait.
//!
//! One input room: [`gguf`] (a GGUF file as a source), [`st`] (one validated safetensors file),
//! [`hf`] (a Hugging Face model directory: config, shards, tokenizer → GGUF names and metadata).

pub(crate) mod gguf;
pub mod hf;
pub(crate) mod st;

pub use gguf::GgufSource;

use crate::error::Result;
use crate::gguf::Value;
use crate::types::TensorType;

#[derive(Clone, Debug)]
pub struct SourceTensor {
    pub name: String,
    /// ggml order: dims[0] is the row length.
    pub dims: Vec<u64>,
    pub ty: TensorType,
}

impl SourceTensor {
    /// A GGUF tensor as the planner sees it.
    pub fn of_gguf(t: &crate::gguf::TensorInfo) -> SourceTensor {
        SourceTensor {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        }
    }
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Weights that quantization applies to: named `*.weight` with at least two non-trivial dims.
    pub fn is_matrix(&self) -> bool {
        self.dims.iter().filter(|&&d| d > 1).count() >= 2
    }
}

pub trait TensorSource: Sync {
    /// Input file (or directory) name for messages and provenance.
    fn name(&self) -> String;
    /// GGUF version to write (the input's for GGUF sources, 3 otherwise).
    fn gguf_version(&self) -> u32 {
        3
    }
    fn metadata(&self) -> &[(String, Value)];
    /// A metadata value as an unsigned integer (any integer type), if present.
    fn meta_u64(&self, key: &str) -> Option<u64> {
        self.metadata()
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.as_u64())
    }
    /// A metadata string, if present.
    fn meta_str(&self, key: &str) -> Option<&str> {
        self.metadata()
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.as_str())
    }
    fn tensors(&self) -> &[SourceTensor];
    /// The tensor's stored bytes when they can be copied unchanged into a GGUF of type `ty`.
    fn raw(&self, index: usize) -> Option<&[u8]>;
    /// Rows `[row0, row0 + out.len() / row_len)` of tensor `index` as f32.
    fn read_rows_f32(&self, index: usize, row0: u64, out: &mut [f32]) -> Result<()>;
    /// The converter is done with tensor `index`: drop cached pages (keeps RSS bounded).
    fn release(&self, _index: usize) {}
}

/// Open a model for conversion: a GGUF file (or, later, a Hugging Face model directory).
pub fn open(
    path: &std::path::Path,
    profile: &crate::types::profile::Profile,
) -> Result<Box<dyn TensorSource>> {
    if crate::source::hf::is_model_dir(path) {
        return Ok(Box::new(crate::source::hf::HfSource::open(path)?));
    }
    match crate::gguf::GgufFile::open_with(path, profile) {
        Ok(f) => Ok(Box::new(GgufSource::new(f))),
        Err(e @ crate::error::Error::BadInput { .. }) => {
            // A lone safetensors file holds weights but no config or tokenizer: say what to give.
            let mut head = [0u8; 16];
            let n = std::fs::File::open(path)
                .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
                .unwrap_or(0);
            if st::looks_like_safetensors(&head[..n]) {
                Err(crate::error::Error::bad_input(
                    path,
                    "a single safetensors file is not a model: give the Hugging Face model directory (config.json + *.safetensors + tokenizer files), or a GGUF file",
                ))
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}
