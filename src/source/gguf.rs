//! A GGUF file as a [`TensorSource`]: stored bytes for copies, rows dequantized through the registry.

use super::{SourceTensor, TensorSource};
use crate::error::Result;
use crate::gguf::{GgufFile, Value};

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
        if row_len == 0 {
            return Ok(()); // a zero-element tensor has no rows to read
        }
        let row_bytes = t.ty.bytes_for(row_len).expect("validated at open") as usize;
        let n_rows = out.len() / row_len as usize;
        let data = self.file.tensor_data(t);
        let start = row0 as usize * row_bytes;
        let bytes = &data[start..start + n_rows * row_bytes];
        crate::types::dequantize_rows(t.ty, bytes, out, row_len as usize, &t.name)
    }
}
