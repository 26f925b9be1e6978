//! safetensors files, memory-mapped and validated by the `safetensors` crate before use
//! (header size bound, JSON, contiguous in-bounds offsets, sizes matching dtype × shape).

use crate::error::{Error, Result};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    pub dtype: Dtype,
    /// PyTorch order: `shape.last()` is the row length.
    pub shape: Vec<usize>,
    /// Byte range within the data section.
    pub start: usize,
    pub end: usize,
}

pub struct SafetensorsFile {
    pub path: PathBuf,
    mmap: Mmap,
    /// Bytes before the data section (8-byte length + JSON header).
    pub data_offset: usize,
    /// Tensors in file (offset) order.
    pub tensors: Vec<StTensor>,
    /// `__metadata__`, sorted by key.
    pub metadata: Vec<(String, String)>,
}

impl SafetensorsFile {
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref().to_path_buf();
        let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        // SAFETY: read-only map; see gguf::reader for the caveat on concurrent truncation.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let (n, meta) = SafeTensors::read_metadata(&mmap)
            .map_err(|e| Error::bad_input(&path, format!("invalid safetensors file: {e}")))?;
        let infos = meta.tensors();
        let mut tensors: Vec<StTensor> = meta
            .offset_keys()
            .into_iter()
            .map(|name| {
                let i = infos[&name];
                StTensor {
                    dtype: i.dtype,
                    shape: i.shape.clone(),
                    start: i.data_offsets.0,
                    end: i.data_offsets.1,
                    name,
                }
            })
            .collect();
        tensors.sort_by_key(|t| t.start);
        let mut metadata: Vec<(String, String)> = meta
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        metadata.sort();
        Ok(SafetensorsFile {
            path,
            mmap,
            data_offset: 8 + n,
            tensors,
            metadata,
        })
    }

    pub fn file_len(&self) -> u64 {
        self.mmap.len() as u64
    }

    /// Zero-copy bytes of a tensor (bounds validated at open).
    pub fn tensor_data(&self, t: &StTensor) -> &[u8] {
        &self.mmap[self.data_offset + t.start..self.data_offset + t.end]
    }

    /// Drop the resident pages of a tensor's bytes once the converter is done with it (as
    /// [`crate::gguf::GgufFile::release`] does), so that streaming keeps RSS bounded.
    pub fn release(&self, t: &StTensor) {
        let start = (self.data_offset + t.start) as u64;
        crate::io::drop_pages(&self.mmap, start, start + (t.end - t.start) as u64);
    }
}

/// Does the file start like a safetensors file (8-byte LE header length, then `{`)?
pub fn looks_like_safetensors(head: &[u8]) -> bool {
    head.len() >= 9 && head[8] == b'{' && &head[..4] != b"GGUF"
}
