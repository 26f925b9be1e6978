//! Streaming GGUF writer. The layout is computed from the tensor list up front (every tensor's
//! size is known from its type and shape), so the header and tensor infos are written first and
//! tensor data follows in order with padding — no seeking back, no whole model in memory.
//!
//! Output goes to a temporary file in the target directory; `finish` flushes, fsyncs and renames
//! it over the final name, so a failed or interrupted run never leaves a partial file there.

use super::value::{GString, Value, ValueType};
use super::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::error::{Error, Result};
use crate::io::TempOutput;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// What the writer needs to know about a tensor before any data is written.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    /// GGUF type id (resolved through the target profile by the caller).
    pub type_id: u32,
    /// Bytes of data this tensor will receive.
    pub size: u64,
}

pub struct GgufWriter {
    /// The temporary file's names; removed on drop unless committed by `finish`.
    target: TempOutput,
    out: Option<BufWriter<File>>,
    sizes: Vec<(String, u64)>,
    alignment: u64,
    /// Index of the tensor currently receiving data and bytes it has received.
    current: usize,
    written: u64,
    pos: u64,
    /// The encoded header, kept so a fixed-size metadata string can be filled in before finish.
    header: Vec<u8>,
}

/// Serialize the header (magic .. tensor infos) for this layout and return it with the tensors'
/// relative offsets. Pure function, so `--dry-run` and tests can compute sizes without writing.
pub fn encode_header(
    version: u32,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
) -> Result<(Vec<u8>, Vec<u64>, u64)> {
    let alignment = alignment_of(metadata)?;
    let mut h = Vec::with_capacity(1 << 16);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    h.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_str(&mut h, k.as_bytes());
        h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
        put_value(&mut h, v, k)?;
    }
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut off = 0u64;
    for t in tensors {
        if t.dims.len() > MAX_DIMS {
            return Err(Error::Unsupported(format!(
                "tensor '{}': more than {MAX_DIMS} dimensions",
                t.name
            )));
        }
        put_str(&mut h, t.name.as_bytes());
        h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            h.extend_from_slice(&d.to_le_bytes());
        }
        h.extend_from_slice(&t.type_id.to_le_bytes());
        h.extend_from_slice(&off.to_le_bytes());
        offsets.push(off);
        off = (off + t.size).div_ceil(alignment) * alignment;
    }
    Ok((h, offsets, alignment))
}

/// Total file size for this layout (header, padding, data with padding between tensors).
pub fn file_size(
    version: u32,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
) -> Result<u64> {
    let (h, offsets, alignment) = encode_header(version, metadata, tensors)?;
    let data_start = (h.len() as u64).div_ceil(alignment) * alignment;
    Ok(match (offsets.last(), tensors.last()) {
        (Some(o), Some(t)) => data_start + (o + t.size).div_ceil(alignment) * alignment,
        _ => data_start,
    })
}

fn alignment_of(metadata: &[(String, Value)]) -> Result<u64> {
    match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => Ok(*a as u64),
        // The reader refuses such a file, so only tq's own metadata could carry it.
        Some((_, v)) => Err(Error::internal(format!(
            "general.alignment must be a non-zero power-of-two u32, got {v:?}"
        ))),
    }
}

fn put_str(h: &mut Vec<u8>, s: &[u8]) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s);
}

fn put_value(h: &mut Vec<u8>, v: &Value, key: &str) -> Result<()> {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.push(*x as u8),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(b) => h.push(*b as u8),
        Value::String(GString(s)) => put_str(h, s),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Array(et, items) => {
            h.extend_from_slice(&(*et as u32).to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                if it.value_type() != *et {
                    return Err(Error::internal(format!(
                        "metadata '{key}': array of {} holds a {}",
                        et.name(),
                        it.value_type().name()
                    )));
                }
                put_value(h, it, key)?;
            }
        }
    }
    Ok(())
}

impl GgufWriter {
    /// Start writing `path`: header and tensor infos are written now, data follows via
    /// [`write_data`](Self::write_data) in tensor order.
    pub fn create(
        path: impl AsRef<Path>,
        version: u32,
        metadata: &[(String, Value)],
        tensors: &[TensorSpec],
    ) -> Result<GgufWriter> {
        let mut seen = std::collections::HashSet::new();
        for t in tensors {
            if !seen.insert(&t.name) {
                // Every source refuses duplicate names, so the plan cannot hold two.
                return Err(Error::internal(format!(
                    "duplicate tensor name '{}' in output",
                    t.name
                )));
            }
        }
        let (header, _, alignment) = encode_header(version, metadata, tensors)?;
        let (target, file) = TempOutput::create(path.as_ref())?;
        let mut w = GgufWriter {
            target,
            out: Some(BufWriter::with_capacity(1 << 22, file)),
            sizes: tensors.iter().map(|t| (t.name.clone(), t.size)).collect(),
            alignment,
            current: 0,
            written: 0,
            pos: 0,
            header: Vec::new(),
        };
        w.raw(&header)?;
        w.header = header;
        w.pad()?;
        w.skip_empty();
        Ok(w)
    }

    /// [`create`](Self::create) for a resumable run (`TempOutput::create_resumable`). With
    /// `resume = Some((tensor, pos))` the partial file must start with exactly this header (the
    /// same plan, metadata and provenance); it is cut at `pos`, where tensor `tensor` begins, and
    /// writing continues there.
    pub fn create_resumable(
        path: &Path,
        version: u32,
        metadata: &[(String, Value)],
        tensors: &[TensorSpec],
        resume: Option<(usize, u64)>,
    ) -> Result<GgufWriter> {
        let (header, _, alignment) = encode_header(version, metadata, tensors)?;
        let (target, mut file) =
            crate::io::TempOutput::create_resumable(path, resume.map(|(_, pos)| pos))?;
        let sizes: Vec<(String, u64)> = tensors.iter().map(|t| (t.name.clone(), t.size)).collect();
        let Some((tensor, pos)) = resume else {
            let mut w = GgufWriter {
                target,
                out: Some(BufWriter::with_capacity(1 << 22, file)),
                sizes,
                alignment,
                current: 0,
                written: 0,
                pos: 0,
                header: Vec::new(),
            };
            w.raw(&header)?;
            w.header = header;
            w.pad()?;
            w.skip_empty();
            return Ok(w);
        };
        use std::io::{Read, Seek, SeekFrom};
        let mut head = vec![0u8; header.len()];
        let same = (pos as usize) >= header.len()
            && file
                .seek(SeekFrom::Start(0))
                .and_then(|_| file.read_exact(&mut head))
                .and_then(|_| file.seek(SeekFrom::Start(pos)))
                .is_ok()
            && head == header;
        if !same {
            return Err(Error::Usage(format!(
                "{}: the partial output was written for another plan or metadata; run without --resume to start over",
                target.tmp_path().display()
            )));
        }
        let mut w = GgufWriter {
            target,
            out: Some(BufWriter::with_capacity(1 << 22, file)),
            sizes,
            alignment,
            current: tensor,
            written: 0,
            pos,
            header,
        };
        w.skip_empty();
        Ok(w)
    }

    /// Flush and sync what was written (the state a checkpoint may name): the index of the tensor
    /// that receives the next bytes and the file position, at a tensor boundary.
    pub fn sync(&mut self) -> Result<(usize, u64)> {
        let out = self.out.as_mut().expect("writer open");
        out.flush()
            .and_then(|_| out.get_ref().sync_data())
            .map_err(|e| Error::io(self.target.tmp_path(), e))?;
        debug_assert_eq!(self.written, 0, "checkpoints fall between tensors");
        Ok((self.current, self.pos))
    }

    /// The partial file's path (for checkpoints and messages).
    pub fn tmp_path(&self) -> &Path {
        self.target.tmp_path()
    }

    fn raw(&mut self, b: &[u8]) -> Result<()> {
        let out = self.out.as_mut().expect("writer open");
        out.write_all(b)
            .map_err(|e| Error::io(self.target.tmp_path(), e))?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> Result<()> {
        let n = (self.pos.div_ceil(self.alignment) * self.alignment - self.pos) as usize;
        const ZEROS: [u8; 256] = [0; 256];
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len());
            self.raw(&ZEROS[..k])?;
            left -= k;
        }
        Ok(())
    }

    /// Zero-byte tensors complete immediately.
    fn skip_empty(&mut self) {
        while self.current < self.sizes.len() && self.sizes[self.current].1 == 0 {
            self.current += 1;
        }
    }

    /// Name of the tensor that the next bytes belong to, if any.
    pub fn current_tensor(&self) -> Option<&str> {
        self.sizes.get(self.current).map(|(n, _)| n.as_str())
    }

    /// Append bytes to the current tensor (any chunking). When a tensor is complete, padding is
    /// written and the next tensor begins.
    pub fn write_data(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let Some(&(_, size)) = self.sizes.get(self.current) else {
                return Err(Error::internal(format!(
                    "{}: more tensor data written than the layout holds",
                    self.target.final_path().display()
                )));
            };
            let k = ((size - self.written) as usize).min(data.len());
            self.raw(&data[..k])?;
            self.written += k as u64;
            data = &data[k..];
            if self.written == size {
                self.current += 1;
                self.written = 0;
                // Padding follows every tensor, the last included (gguf.cpp and gguf-py do this).
                self.pad()?;
                self.skip_empty();
            }
        }
        Ok(())
    }

    /// Replace the value of string metadata `key` in the already-written header by `value` of
    /// the same length (a value only known after the data, e.g. a hash of the input computed
    /// while converting). The one in-place write of the writer; the file is still the temporary.
    pub fn fill_string(&mut self, key: &str, value: &str) -> Result<()> {
        use std::io::{Seek, SeekFrom};
        let mut pat = Vec::new();
        pat.extend_from_slice(&(key.len() as u64).to_le_bytes());
        pat.extend_from_slice(key.as_bytes());
        pat.extend_from_slice(&(ValueType::String as u32).to_le_bytes());
        pat.extend_from_slice(&(value.len() as u64).to_le_bytes());
        let at = self
            .header
            .windows(pat.len())
            .position(|w| w == pat.as_slice())
            .ok_or_else(|| {
                Error::internal(format!(
                    "{}: no string '{key}' of {} bytes in the header to fill",
                    self.target.final_path().display(),
                    value.len()
                ))
            })?
            + pat.len();
        let out = self.out.as_mut().expect("writer open");
        out.flush()
            .map_err(|e| Error::io(self.target.tmp_path(), e))?;
        let f = out.get_mut();
        f.seek(SeekFrom::Start(at as u64))
            .and_then(|_| f.write_all(value.as_bytes()))
            .and_then(|_| f.seek(SeekFrom::Start(self.pos)))
            .map_err(|e| Error::io(self.target.tmp_path(), e))?;
        self.header[at..at + value.len()].copy_from_slice(value.as_bytes());
        Ok(())
    }

    /// Check every tensor was written, flush, fsync, and rename into place.
    pub fn finish(mut self) -> Result<()> {
        if let Some((name, size)) = self.sizes.get(self.current) {
            return Err(Error::internal(format!(
                "{}: tensor '{name}' received {} of {size} bytes; output not written",
                self.target.final_path().display(),
                self.written
            )));
        }
        let out = self.out.take().expect("writer open");
        let file = out
            .into_inner()
            .map_err(|e| Error::io(self.target.tmp_path(), e.into_error()))?;
        self.target.commit(file)
    }
}

/// Convenience: the metadata value type of an array of strings.
pub fn string_array(items: impl IntoIterator<Item = String>) -> Value {
    Value::Array(
        ValueType::String,
        items.into_iter().map(|s| Value::String(s.into())).collect(),
    )
}
