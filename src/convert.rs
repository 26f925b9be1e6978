//! Execute a [`Plan`]: stream tensors from a [`TensorSource`] through dequantize → quantize into
//! the streaming GGUF writer. Memory is bounded by one chunk of rows (not one tensor, not the
//! model). Rows are independent, so they are processed in parallel and the bytes are the same
//! whatever the thread count.

use crate::error::{Error, Result};
use crate::gguf::{GgufWriter, TensorSpec, Value, ValueType};
use crate::plan::{Action, Plan};
use crate::source::TensorSource;
use crate::types::profile::Profile;
use rayon::prelude::*;
use std::path::Path;

/// Rows are processed in chunks of at most this many f32 values (64 MiB).
pub const CHUNK_VALUES: usize = 16 << 20;

/// Provenance written under `tq.*` (deterministic: no time stamps, no thread counts).
pub struct Provenance {
    pub recipe: String,
    pub flags: String,
    pub input_name: String,
    pub input_blake3: String,
}

/// Output metadata: the input's KV pairs in order (old `tq.*` keys dropped), `general.file_type`
/// and `general.quantization_version` set in place (or appended), then provenance.
pub fn output_metadata(
    input: &[(String, Value)],
    plan: &Plan,
    prov: Option<&Provenance>,
    retype: bool,
) -> Vec<(String, Value)> {
    let mut md: Vec<(String, Value)> = input
        .iter()
        .filter(|(k, _)| !k.starts_with("tq."))
        .cloned()
        .collect();
    let mut set = |k: &str, v: Value| match md.iter_mut().find(|(kk, _)| kk == k) {
        Some(e) => e.1 = v,
        None => md.push((k.to_string(), v)),
    };
    if retype {
        if let Some(ft) = plan.file_type {
            set("general.file_type", Value::U32(ft));
        }
        set("general.quantization_version", Value::U32(2));
    }
    if let Some(p) = prov {
        md.push((
            "tq.version".into(),
            Value::string(env!("CARGO_PKG_VERSION")),
        ));
        md.push(("tq.recipe".into(), Value::string(&p.recipe)));
        md.push(("tq.flags".into(), Value::string(&p.flags)));
        md.push(("tq.input.name".into(), Value::string(&p.input_name)));
        md.push(("tq.input.blake3".into(), Value::string(&p.input_blake3)));
        let methods = plan
            .entries
            .iter()
            .map(|e| Value::string(&format!("{}={}:{}", e.name, e.dst, method(e))));
        md.push((
            "tq.tensor_methods".into(),
            Value::Array(ValueType::String, methods.collect()),
        ));
    }
    md
}

pub fn method(e: &crate::plan::PlanEntry) -> &'static str {
    match (e.action, e.ldlq) {
        (Action::Copy, _) => "copy",
        (Action::Quantize, false) => "rtn",
        (Action::Requantize, false) => "requant-rtn",
        (Action::Quantize, true) => "ldlq",
        (Action::Requantize, true) => "requant-ldlq",
    }
}

/// Calibration data for LDLQ: Hessians, band (0 = full) and damping; factors are computed once
/// per Hessian group and shared by the tensors of the group (q/k/v, gate/up).
pub struct Ldlq {
    pub hessians: crate::calib::Hessians,
    pub band: usize,
    pub damp: f64,
}

pub fn tensor_specs(plan: &Plan, profile: &Profile) -> Vec<TensorSpec> {
    plan.entries
        .iter()
        .map(|e| TensorSpec {
            name: e.name.clone(),
            dims: e.dims.clone(),
            type_id: profile.id_of(e.dst).expect("planner checked the id"),
            size: e.bytes,
        })
        .collect()
}

/// Hash a file's contents 16 MiB at a time through a read-only map, dropping each chunk's pages
/// from the map once hashed: hashing the whole map at once would make every page of a multi-GB
/// input resident (RSS = file size), and `read()` into a buffer costs a copy per byte (measured:
/// 0.4 s of system time for a 259 MB input, as much as converting it to q4_0).
fn hash_contents(h: &mut blake3::Hasher, path: &Path) -> Result<()> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    if len == 0 {
        return Ok(());
    }
    // SAFETY: read-only map of a file we only read; the usual caveat (another process
    // truncating the file) is documented in docs/gguf.md for the reader's map as well.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::io(path, e))?;
    const CHUNK: usize = 16 << 20;
    for (k, c) in map.chunks(CHUNK).enumerate() {
        h.update(c);
        let start = (k * CHUNK) as u64;
        crate::source::drop_pages(&map, start, start + c.len() as u64);
    }
    Ok(())
}

/// Placeholder for `tq.input.blake3` while the hash is computed alongside the conversion.
pub const HASH_PLACEHOLDER: &str =
    "0000000000000000000000000000000000000000000000000000000000000000";

/// blake3 of a file; of a model directory (Hugging Face input): of its regular files in name
/// order, each as name, NUL, length (u64 LE), contents.
pub fn hash_file(path: &Path) -> Result<String> {
    let mut h = blake3::Hasher::new();
    if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| Error::io(path, e))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for f in files {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let len = std::fs::metadata(&f).map_err(|e| Error::io(&f, e))?.len();
            h.update(name.as_bytes())
                .update(&[0])
                .update(&len.to_le_bytes());
            hash_contents(&mut h, &f)?;
        }
    } else {
        hash_contents(&mut h, path)?;
    }
    Ok(h.finalize().to_hex().to_string())
}

pub struct Stats {
    pub bytes_written: u64,
    pub tensors_converted: usize,
    pub tensors_copied: usize,
}

/// Write `out` from `src` following `plan`. `on_progress(bytes_done)` is called after each chunk.
///
/// Two stages joined by a bounded queue (2 chunks): this thread reads and quantizes chunk k+1
/// (rows in parallel) while a writer thread writes chunk k. Peak memory: ~3 chunks of output plus
/// one f32 row per worker.
pub fn execute(
    src: &dyn TensorSource,
    plan: &Plan,
    metadata: &[(String, Value)],
    version: u32,
    profile: &Profile,
    out: &Path,
    ldlq: Option<&Ldlq>,
    hash_input: Option<&Path>,
    on_progress: &(dyn Fn(u64) + Sync),
) -> Result<Stats> {
    let specs = tensor_specs(plan, profile);
    let w = GgufWriter::create(out, version, metadata, &specs)?;
    // The input's blake3 (provenance) is computed on a thread of its own while the tensors are
    // converted and filled into the header's placeholder at the end, instead of a whole pass
    // over the input before anything starts.
    let hasher = hash_input.map(|p| {
        let p = p.to_path_buf();
        std::thread::spawn(move || hash_file(&p))
    });
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
    let mut stats = Stats {
        bytes_written: 0,
        tensors_converted: 0,
        tensors_copied: 0,
    };
    std::thread::scope(|scope| -> Result<()> {
        let writer = scope.spawn(move || -> Result<GgufWriter> {
            let mut w = w;
            let mut done = 0u64;
            for chunk in rx {
                w.write_data(&chunk)?;
                done += chunk.len() as u64;
                on_progress(done);
            }
            Ok(w)
        });
        let produced = produce(src, plan, ldlq, &tx, &mut stats);
        drop(tx);
        // A writer error closes the queue, which stops the producer; report the writer's error first.
        let mut w = writer
            .join()
            .map_err(|_| Error::Usage("writer thread panicked".into()))??;
        produced?;
        if let Some(h) = hasher {
            let hash = h
                .join()
                .map_err(|_| Error::Usage("input hash thread panicked".into()))??;
            w.fill_string("tq.input.blake3", &hash)?;
        }
        w.finish()
    })?;
    stats.bytes_written = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(stats)
}

fn produce(
    src: &dyn TensorSource,
    plan: &Plan,
    ldlq: Option<&Ldlq>,
    tx: &std::sync::mpsc::SyncSender<Vec<u8>>,
    stats: &mut Stats,
) -> Result<()> {
    let mut factors: std::collections::HashMap<String, std::sync::Arc<crate::ldlq::Factor>> =
        Default::default();
    // The writer thread hung up: its error is reported by the caller.
    let closed = || Error::Usage("output writer stopped".into());
    for (i, e) in plan.entries.iter().enumerate() {
        if e.action == Action::Copy {
            if let Some(raw) = src.raw(i) {
                for c in raw.chunks(CHUNK_VALUES * 4) {
                    tx.send(c.to_vec()).map_err(|_| closed())?;
                }
                src.release(i);
                stats.tensors_copied += 1;
                continue;
            }
            // No stored bytes in this encoding (e.g. HF attn_q/attn_k rows permuted on the fly):
            // re-encode the rows below; float → f32 → same float type is exact.
        }
        let row_len = e.dims[0] as usize;
        let n_rows: u64 = e.dims.iter().skip(1).product();
        let row_bytes = e.dst.bytes_for(row_len as u64).expect("planned") as usize;
        let rows_per_chunk = (CHUNK_VALUES / row_len.max(1)).max(1) as u64;
        let factor = match ldlq.filter(|_| e.ldlq) {
            Some(l) => {
                let h = l
                    .hessians
                    .for_tensor(&e.name)
                    .expect("planner checked the Hessian");
                let key = h.tensors.join(",");
                if !factors.contains_key(&key) {
                    let f = crate::ldlq::factor_hessian(h, l.damp, &e.name)?;
                    factors.insert(key.clone(), std::sync::Arc::new(f));
                }
                Some((factors[&key].clone(), l.band))
            }
            None => None,
        };
        let mut row0 = 0u64;
        while row0 < n_rows {
            let rows = rows_per_chunk.min(n_rows - row0) as usize;
            if let Some((f, band)) = &factor {
                let mut x = vec![0f32; rows * row_len];
                x.par_chunks_mut(row_len)
                    .enumerate()
                    .try_for_each(|(r, row)| -> Result<()> {
                        let abs = row0 + r as u64;
                        src.read_rows_f32(i, abs, row)?;
                        check_finite(&e.name, abs, row)
                    })?;
                tx.send(encode_rows(e.dst, &e.name, &x, row_len, Some((f, *band)))?)
                    .map_err(|_| closed())?;
                row0 += rows as u64;
                continue;
            }
            let mut buf = vec![0u8; rows * row_bytes];
            buf.par_chunks_mut(row_bytes)
                .enumerate()
                .try_for_each_init(
                    || vec![0f32; row_len],
                    |row, (r, ob)| -> Result<()> {
                        let abs = row0 + r as u64;
                        src.read_rows_f32(i, abs, row)?;
                        check_finite(&e.name, abs, row)?;
                        crate::types::quantize(e.dst, row, ob, &e.name)
                    },
                )?;
            tx.send(buf).map_err(|_| closed())?;
            row0 += rows as u64;
        }
        src.release(i);
        stats.tensors_converted += 1;
    }
    Ok(())
}

/// Encode whole rows (`x` is `rows × row_len`) as `dst`: banded LDLQ when `ldlq` gives a factor
/// and band, else round-to-nearest row by row. These are the bytes `tq convert` writes for the
/// rows; sequential calibration calls it to simulate the converted model. Rows in parallel: the
/// bytes do not depend on the thread count.
pub fn encode_rows(
    dst: crate::types::TensorType,
    name: &str,
    x: &[f32],
    row_len: usize,
    ldlq: Option<(&crate::ldlq::Factor, usize)>,
) -> Result<Vec<u8>> {
    if let Some((f, band)) = ldlq {
        return Ok(crate::ldlq::quantize_ldlq(dst, x, row_len, f, band));
    }
    let row_bytes = dst.bytes_for(row_len as u64).ok_or_else(|| {
        Error::Unsupported(format!(
            "{name}: row length {row_len} does not fit type {dst}"
        ))
    })? as usize;
    let mut buf = vec![0u8; x.len() / row_len.max(1) * row_bytes];
    buf.par_chunks_mut(row_bytes)
        .zip(x.par_chunks(row_len))
        .try_for_each(|(ob, row)| crate::types::quantize(dst, row, ob, name))?;
    Ok(buf)
}

/// A non-finite weight is an error naming the tensor, row and column.
pub fn check_finite(name: &str, row_index: u64, row: &[f32]) -> Result<()> {
    match row.iter().position(|v| !v.is_finite()) {
        Some(c) => Err(Error::Unsupported(format!(
            "{name}: non-finite weight {} at row {row_index}, column {c}; fix the source model (NaN/Inf cannot be quantized)",
            row[c]
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffered hash equals the one-shot hash, across buffer boundaries.
    #[test]
    fn hash_file_equals_one_shot_blake3() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        let data: Vec<u8> = (0..(16u32 << 20) + 12345)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(&p, &data).unwrap();
        assert_eq!(
            hash_file(&p).unwrap(),
            blake3::hash(&data).to_hex().to_string()
        );
        std::fs::write(&p, b"").unwrap();
        assert_eq!(
            hash_file(&p).unwrap(),
            blake3::hash(b"").to_hex().to_string()
        );
    }
}
