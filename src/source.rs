//! `TensorSource`: what the converter reads from — names, ggml-order shapes, source types, and
//! rows as f32 on demand (so a model is never resident). GGUF now; HF safetensors directories
//! implement the same trait.

use crate::error::Result;
use crate::gguf::{GgufFile, Value};
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
    fn tensors(&self) -> &[SourceTensor];
    /// The tensor's stored bytes when they can be copied unchanged into a GGUF of type `ty`.
    fn raw(&self, index: usize) -> Option<&[u8]>;
    /// Rows `[row0, row0 + out.len() / row_len)` of tensor `index` as f32.
    fn read_rows_f32(&self, index: usize, row0: u64, out: &mut [f32]) -> Result<()>;
    /// The converter is done with tensor `index`: drop cached pages (keeps RSS bounded).
    fn release(&self, _index: usize) {}
}

/// Drop the resident pages of bytes `[start, end)` of a read-only file-backed map (only whole
/// pages inside the range, so neighbouring data keeps its pages). The pages are simply re-read if
/// touched again; this keeps RSS bounded while streaming through a model larger than RAM.
/// Best effort: errors are ignored, and it does nothing off unix.
pub fn drop_pages(map: &memmap2::Mmap, start: u64, end: u64) {
    #[cfg(unix)]
    {
        let page = 4096u64;
        let s = start.div_ceil(page) * page;
        let e = (end.min(map.len() as u64) / page) * page;
        if e > s {
            // SAFETY: read-only, file-backed mapping; DONTNEED only discards clean pages.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    s as usize,
                    (e - s) as usize,
                )
            };
        }
    }
    #[cfg(not(unix))]
    let _ = (map, start, end);
}

/// Open a model for conversion: a GGUF file (or, later, a Hugging Face model directory).
pub fn open(
    path: &std::path::Path,
    profile: &crate::types::profile::Profile,
) -> Result<Box<dyn TensorSource>> {
    if crate::hf::is_model_dir(path) {
        return Ok(Box::new(crate::hf::HfSource::open(path)?));
    }
    Ok(Box::new(GgufSource::new(GgufFile::open_with(
        path, profile,
    )?)))
}

/// A GGUF file as a source.
pub struct GgufSource {
    pub file: GgufFile,
    tensors: Vec<SourceTensor>,
}

impl GgufSource {
    pub fn new(file: GgufFile) -> GgufSource {
        let tensors = file.tensors.iter().map(SourceTensor::of_gguf).collect();
        GgufSource { file, tensors }
    }
}

impl TensorSource for GgufSource {
    fn name(&self) -> String {
        self.file.path.display().to_string()
    }
    fn gguf_version(&self) -> u32 {
        self.file.version
    }
    fn metadata(&self) -> &[(String, Value)] {
        &self.file.metadata
    }
    fn tensors(&self) -> &[SourceTensor] {
        &self.tensors
    }
    fn raw(&self, index: usize) -> Option<&[u8]> {
        Some(self.file.tensor_data(&self.file.tensors[index]))
    }
    fn release(&self, index: usize) {
        self.file.release(&self.file.tensors[index]);
    }
    fn read_rows_f32(&self, index: usize, row0: u64, out: &mut [f32]) -> Result<()> {
        let t = &self.file.tensors[index];
        let row_len = t.row_len();
        let row_bytes = t.ty.bytes_for(row_len).expect("validated at open") as usize;
        let n_rows = out.len() / row_len as usize;
        let data = self.file.tensor_data(t);
        let start = row0 as usize * row_bytes;
        let bytes = &data[start..start + n_rows * row_bytes];
        crate::types::dequantize(t.ty, bytes, out, &t.name)
    }
}
