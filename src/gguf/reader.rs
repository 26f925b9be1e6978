//! Memory-mapped GGUF v2/v3 reader. Validates before it trusts: every count and size in the
//! header is checked against the bytes actually left in the file before anything is allocated,
//! and every tensor's extent against the data section, so hostile files give errors, not panics.

use super::value::{GString, Value, ValueType};
use super::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::error::{Error, Result};
use crate::types::profile::Profile;
use crate::types::TensorType;
use memmap2::Mmap;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Nested arrays deeper than this are rejected (guards the recursion).
const MAX_ARRAY_DEPTH: u32 = 8;

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (ne0).
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub ty: TensorType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
    /// The writer's description of this tensor, unchanged (a copy keeps id, shape and size).
    pub fn spec(&self) -> super::writer::TensorSpec {
        super::writer::TensorSpec {
            name: self.name.clone(),
            dims: self.dims.clone(),
            type_id: self.type_id,
            size: self.size,
        }
    }
}

pub struct GgufFile {
    pub path: PathBuf,
    /// Shared with the views [`GgufFile::with_tensors`] makes.
    mmap: std::sync::Arc<Mmap>,
    /// Tensors whose data a view holds in memory instead of the file's (by name), shared with
    /// the views made from it and with the caller (one encoding may serve several views).
    overlay: Vec<(String, std::sync::Arc<Vec<u8>>)>,
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    /// Bytes of header (magic .. end of tensor infos, before padding).
    pub header_len: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Open and validate with the default (fork) profile.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::open_with(path, &Profile::default())
    }

    pub fn open_with(path: impl AsRef<Path>, profile: &Profile) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        // mmap of a directory or a device fails with "No such device": say what the path is.
        let meta = file.metadata().map_err(|e| Error::io(&path, e))?;
        if meta.is_dir() {
            return Err(Error::bad_input(
                &path,
                "is a directory; give a GGUF file (only tq convert and tq inspect read a Hugging Face model directory)",
            ));
        }
        if !meta.is_file() {
            return Err(Error::bad_input(
                &path,
                "is not a regular file; give a GGUF file",
            ));
        }
        // SAFETY: the map is read-only; a file truncated underneath us by another process is the
        // usual mmap caveat (documented in docs/gguf.md), not something a header can cause.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let parsed = parse(&mmap, profile).map_err(|msg| Error::bad_input(&path, msg))?;
        Ok(GgufFile {
            path,
            mmap: std::sync::Arc::new(mmap),
            overlay: Vec::new(),
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            header_len: parsed.header_len,
        })
    }

    pub fn file_len(&self) -> u64 {
        self.mmap.len() as u64
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }

    /// `general.architecture`, required by every engine.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A view of this file with some tensors' data replaced in memory: `(name, type, type id,
    /// bytes)` each, the bytes those of `type` for the tensor's shape (what a conversion would
    /// write for it). Nothing is written; the rest is read from the same map. The mix's KLD
    /// probes evaluate a model with one tensor quantized this way.
    pub fn with_tensors(
        &self,
        subs: Vec<(String, TensorType, u32, std::sync::Arc<Vec<u8>>)>,
    ) -> Result<GgufFile> {
        let mut tensors = self.tensors.clone();
        let mut overlay = self.overlay.clone();
        for (name, ty, type_id, data) in subs {
            let t = tensors
                .iter_mut()
                .find(|t| t.name == name)
                .ok_or_else(|| Error::bad_input(&self.path, format!("{name}: no such tensor")))?;
            let want = ty.bytes_for(t.n_elements());
            if want != Some(data.len() as u64) {
                return Err(Error::internal(format!(
                    "{name}: {} bytes given for {ty}, which needs {want:?}",
                    data.len()
                )));
            }
            t.ty = ty;
            t.type_id = type_id;
            t.size = data.len() as u64;
            overlay.retain(|(n, _)| *n != name);
            overlay.push((name, data));
        }
        Ok(GgufFile {
            path: self.path.clone(),
            mmap: self.mmap.clone(),
            overlay,
            version: self.version,
            metadata: self.metadata.clone(),
            tensors,
            alignment: self.alignment,
            data_offset: self.data_offset,
            header_len: self.header_len,
        })
    }

    /// Zero-copy view of a tensor's bytes (bounds were validated at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        if let Some((_, d)) = self.overlay.iter().find(|(n, _)| *n == t.name) {
            return d.as_slice();
        }
        let start = (self.data_offset + t.offset) as usize;
        &self.mmap[start..start + t.size as usize]
    }

    /// Start reading a tensor's bytes into the page cache (readahead in large requests, not
    /// waited for), before it is dequantized. Best effort.
    pub fn prefetch(&self, t: &TensorInfo) {
        if self.overlay.iter().any(|(n, _)| *n == t.name) {
            return;
        }
        let start = self.data_offset + t.offset;
        crate::io::will_need(&self.mmap, start, start + t.size);
    }

    /// Drop the resident pages of a tensor's bytes (after it has been converted), so that
    /// streaming through a model larger than RAM keeps RSS bounded. The map is read-only and
    /// file-backed, so the pages are simply re-read if touched again. Best effort.
    pub fn release(&self, t: &TensorInfo) {
        if self.overlay.iter().any(|(n, _)| *n == t.name) {
            return;
        }
        let start = self.data_offset + t.offset;
        crate::io::drop_pages(&self.mmap, start, start + t.size);
    }

    /// Dequantize a whole tensor to f32.
    pub fn tensor_f32(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let n = usize::try_from(t.n_elements()).map_err(|_| {
            Error::Unsupported(format!("{}: tensor too large for this machine", t.name))
        })?;
        let mut out = vec![0f32; n];
        let row_len = usize::try_from(t.row_len()).unwrap_or(0).max(1);
        crate::types::dequantize_rows(t.ty, self.tensor_data(t), &mut out, row_len, &t.name)?;
        Ok(out)
    }

    /// The raw bytes of the whole file (header included).
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }
}

/// Parse and validate a GGUF image held in memory (the same checks as [`GgufFile::open`]);
/// returns the number of tensors. Entry point for the fuzz target and bulk corruption tests.
pub fn validate(buf: &[u8], profile: &Profile) -> std::result::Result<usize, String> {
    parse(buf, profile)
        .map(|p| p.tensors.len())
        .map_err(|e| crate::error::one_line(&e))
}

#[derive(Debug)]
struct Parsed {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
    header_len: u64,
}

/// A bounds-checked little-endian cursor. Every read says what it was reading when it runs out.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Metadata values still allowed to be decoded (see `MAX_METADATA_VALUES`).
    values_left: u64,
}

/// Every decoded metadata value costs one `Value` (32 bytes) however small its encoding, so a
/// file of N bytes could otherwise ask for 32·N bytes of memory with one long u8 array. Real
/// models stay far below this (a 256k-token vocabulary with scores, types and merges is ~1.2 M).
pub const MAX_METADATA_VALUES: u64 = 1 << 24;

/// Up-front reservation for a count read from the file: the vector grows past this as the
/// values are actually decoded, so a lying count never allocates more than the data backs.
const MAX_RESERVE: u64 = 1 << 12;

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> std::result::Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "truncated file: {what} needs {n} bytes at offset {} but only {} remain",
                self.pos,
                self.remaining()
            ));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> std::result::Result<[u8; N], String> {
        Ok(self
            .take(N as u64, what)?
            .try_into()
            .expect("length checked"))
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn gstring(&mut self, what: &str) -> std::result::Result<GString, String> {
        let len = self.u64(what)?;
        Ok(GString(self.take(len, what)?.to_vec()))
    }

    fn utf8(&mut self, what: &str) -> std::result::Result<String, String> {
        let s = self.gstring(what)?;
        String::from_utf8(s.0).map_err(|_| format!("{what} is not valid UTF-8"))
    }

    fn value(
        &mut self,
        ty: ValueType,
        key: &str,
        depth: u32,
    ) -> std::result::Result<Value, String> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(key)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(key)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            ValueType::U32 => Value::U32(self.u32(key)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            ValueType::U64 => Value::U64(self.u64(key)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            ValueType::Bool => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("metadata '{key}': invalid bool byte {b}")),
            },
            ValueType::String => Value::String(self.gstring(&format!("metadata '{key}' string"))?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "metadata '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    ));
                }
                let et = self.u32(key)?;
                let et = ValueType::from_u32(et)
                    .ok_or_else(|| format!("metadata '{key}': unknown array element type {et}"))?;
                let n = self.u64(key)?;
                // Bound the count by what the file can hold before allocating anything.
                if n.checked_mul(et.min_size())
                    .is_none_or(|b| b > self.remaining())
                {
                    return Err(format!(
                        "metadata '{key}': array claims {n} {} elements but only {} bytes remain",
                        et.name(),
                        self.remaining()
                    ));
                }
                if n > self.values_left {
                    return Err(format!(
                        "metadata '{key}': array of {n} elements exceeds tq's limit of {MAX_METADATA_VALUES} metadata values per file (a corrupt count, or not a model file)"
                    ));
                }
                self.values_left -= n;
                let mut v = Vec::with_capacity(n.min(MAX_RESERVE) as usize);
                for _ in 0..n {
                    v.push(self.value(et, key, depth + 1)?);
                }
                Value::Array(et, v)
            }
        })
    }
}

/// Parse and validate a GGUF header, every count and offset checked before it is trusted.
// One function on purpose: the checks run in file order over one cursor, and each bound uses
// the values read before it (counts, sizes, alignment).
fn parse(buf: &[u8], profile: &Profile) -> std::result::Result<Parsed, String> {
    let mut c = Cursor {
        buf,
        pos: 0,
        values_left: MAX_METADATA_VALUES,
    };
    let magic = c
        .take(4, "magic")
        .map_err(|_| "not a GGUF file: shorter than the 4-byte magic".to_string())?;
    if magic != MAGIC {
        return Err(format!(
            "not a GGUF file: magic is {magic:02x?}, expected \"GGUF\""
        ));
    }
    let version = c.u32("version")?;
    if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
        return Err(
            "big-endian GGUF is not supported; convert it to little-endian with gguf-py first"
                .into(),
        );
    }
    if version == 1 {
        return Err(
            "GGUF v1 is not supported (32-bit counts); re-save it with a current llama.cpp/gguf-py"
                .into(),
        );
    }
    if version != 2 && version != 3 {
        return Err(format!(
            "unsupported GGUF version {version} (tq reads v2 and v3)"
        ));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // Smallest possible KV: 8-byte key length + 4-byte type + 1-byte value.
    if n_kv.checked_mul(13).is_none_or(|b| b > c.remaining()) {
        return Err(format!(
            "header claims {n_kv} metadata entries, more than the file can hold (truncated or corrupt file)"
        ));
    }
    // Smallest possible tensor info: name length 8 + n_dims 4 + type 4 + offset 8.
    if n_tensors.checked_mul(24).is_none_or(|b| b > c.remaining()) {
        return Err(format!(
            "header claims {n_tensors} tensors, more than the file can hold (truncated or corrupt file)"
        ));
    }

    let mut metadata = Vec::with_capacity(n_kv.min(MAX_RESERVE) as usize);
    let mut keys = HashSet::new();
    for i in 0..n_kv {
        let key = c.utf8(&format!("metadata key #{i}"))?;
        let ty = c.u32(&key)?;
        let ty = ValueType::from_u32(ty)
            .ok_or_else(|| format!("metadata '{key}': unknown value type {ty}"))?;
        let v = c.value(ty, &key, 0)?;
        if !keys.insert(key.clone()) {
            return Err(format!("duplicate metadata key '{key}'"));
        }
        metadata.push((key, v));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            return Err(format!(
                "general.alignment must be a non-zero power of two u32, found {v:?}"
            ))
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors.min(MAX_RESERVE) as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let name = c.utf8(&format!("tensor #{i} name"))?;
        let n_dims = c.u32(&format!("tensor '{name}' n_dims"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(format!(
                "tensor '{name}': {n_dims} dimensions (ggml allows at most {MAX_DIMS})"
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&format!("tensor '{name}' dims"))?);
        }
        let type_id = c.u32(&format!("tensor '{name}' type"))?;
        let offset = c.u64(&format!("tensor '{name}' offset"))?;
        let ty = profile.type_of(type_id).ok_or_else(|| {
            format!(
                "tensor '{name}': unknown ggml type id {type_id} for target profile '{}' (another fork? pass --target or --type-map FILE)",
                profile.name
            )
        })?;
        // Zero-element tensors are valid (llama.cpp and gguf-py read them), but the product of
        // the other dimensions must still fit: readers and writers take products of sub-shapes
        // (rows = dims[1..]), and a zero first would otherwise hide an overflow after it.
        dims.iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d.max(1)))
            .filter(|&n| n < (1u64 << 62))
            .ok_or_else(|| format!("tensor '{name}': element count of dims {dims:?} overflows"))?;
        let n_el: u64 = dims.iter().product();
        let row = dims.first().copied().unwrap_or(1);
        if row % ty.block_size() as u64 != 0 {
            return Err(format!(
                "tensor '{name}': row length {row} is not a multiple of the {} block size {}",
                ty.name(),
                ty.block_size()
            ));
        }
        let size = ty.bytes_for(n_el).ok_or_else(|| {
            format!(
                "tensor '{name}': byte size of {n_el} {} elements overflows",
                ty.name()
            )
        })?;
        if offset % alignment != 0 {
            return Err(format!("tensor '{name}': data offset {offset} is not a multiple of the alignment {alignment}"));
        }
        if !names.insert(name.clone()) {
            return Err(format!("duplicate tensor name '{name}'"));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            type_id,
            ty,
            offset,
            size,
        });
    }

    let header_len = c.pos as u64;
    let data_offset = header_len.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    let data_len = file_len.saturating_sub(data_offset);
    if n_tensors > 0 && data_offset > file_len {
        return Err(format!("truncated file: data section starts at {data_offset} beyond the end ({file_len} bytes)"));
    }
    // Every tensor inside the data section, and no two overlapping.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    let mut end_prev = 0u64;
    let mut prev_name = "";
    for &i in &order {
        let t = &tensors[i];
        let end = t
            .offset
            .checked_add(t.size)
            .ok_or_else(|| format!("tensor '{}': offset + size overflows", t.name))?;
        if end > data_len {
            return Err(format!(
                "truncated or corrupt file: tensor '{}' spans data bytes {}..{end} but the data section has {data_len}",
                t.name, t.offset
            ));
        }
        if t.offset < end_prev {
            return Err(format!(
                "tensors '{prev_name}' and '{}' overlap in the data section",
                t.name
            ));
        }
        end_prev = end;
        prev_name = &t.name;
    }
    // Row-rotated tensors decode only with the rotation the file names: refuse a file that names
    // none, or one this tq does not know, before a wrong inverse rotation produces garbage.
    if let Some(t) = tensors.iter().find(|t| t.ty.rotates_rows()) {
        use crate::types::tq2r::{META_ROTATION, ROTATION_ID};
        let got = metadata
            .iter()
            .find(|(k, _)| k == META_ROTATION)
            .map(|(_, v)| v);
        match got {
            Some(v) if v.as_str() == Some(ROTATION_ID) => {}
            Some(v) => {
                return Err(format!(
                    "tensor '{}' is {} but {META_ROTATION} is {}, a rotation this tq does not know (expected \"{ROTATION_ID}\"; reconvert the model or update tq)",
                    t.name,
                    t.ty,
                    crate::error::one_line(&format!("{v:?}"))
                ))
            }
            None => {
                return Err(format!(
                    "tensor '{}' is {} but the file has no {META_ROTATION} key naming its row rotation (reconvert the model with tq convert)",
                    t.name,
                    t.ty
                ))
            }
        }
    }

    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
        header_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        Profile::default()
    }

    #[test]
    fn rejects_short_and_bad_magic() {
        assert!(parse(b"GG", &profile())
            .unwrap_err()
            .contains("not a GGUF file"));
        assert!(parse(b"GGML\x03\0\0\0", &profile())
            .unwrap_err()
            .contains("magic"));
        assert!(parse(b"GGUF\x03\0\0", &profile())
            .unwrap_err()
            .contains("truncated"));
        assert!(parse(b"GGUF\x01\0\0\0", &profile())
            .unwrap_err()
            .contains("v1"));
        assert!(parse(b"GGUF\0\0\0\x03", &profile())
            .unwrap_err()
            .contains("big-endian"));
    }

    #[test]
    fn rejects_absurd_counts_without_allocating() {
        let mut b = b"GGUF\x03\0\0\0".to_vec();
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        assert!(parse(&b, &profile()).unwrap_err().contains("tensors"));
    }
}
