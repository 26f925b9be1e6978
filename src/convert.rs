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
            .map(|e| Value::string(&format!("{}={}:{}", e.name, e.dst, method(e.action))));
        md.push((
            "tq.tensor_methods".into(),
            Value::Array(ValueType::String, methods.collect()),
        ));
    }
    md
}

pub fn method(a: Action) -> &'static str {
    match a {
        Action::Copy => "copy",
        Action::Quantize => "rtn",
        Action::Requantize => "requant-rtn",
    }
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

/// blake3 of a file (memory-mapped, multi-threaded).
pub fn hash_file(path: &Path) -> Result<String> {
    let mut h = blake3::Hasher::new();
    h.update_mmap_rayon(path).map_err(|e| Error::io(path, e))?;
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
    on_progress: &(dyn Fn(u64) + Sync),
) -> Result<Stats> {
    let specs = tensor_specs(plan, profile);
    let w = GgufWriter::create(out, version, metadata, &specs)?;
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
        let produced = produce(src, plan, &tx, &mut stats);
        drop(tx);
        // A writer error closes the queue, which stops the producer; report the writer's error first.
        let w = writer
            .join()
            .map_err(|_| Error::Usage("writer thread panicked".into()))??;
        produced?;
        w.finish()
    })?;
    stats.bytes_written = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(stats)
}

fn produce(
    src: &dyn TensorSource,
    plan: &Plan,
    tx: &std::sync::mpsc::SyncSender<Vec<u8>>,
    stats: &mut Stats,
) -> Result<()> {
    // The writer thread hung up: its error is reported by the caller.
    let closed = || Error::Usage("output writer stopped".into());
    for (i, e) in plan.entries.iter().enumerate() {
        if e.action == Action::Copy {
            let raw = src.raw(i).ok_or_else(|| {
                Error::Unsupported(format!("{}: source cannot provide raw bytes", e.name))
            })?;
            for c in raw.chunks(CHUNK_VALUES * 4) {
                tx.send(c.to_vec()).map_err(|_| closed())?;
            }
            src.release(i);
            stats.tensors_copied += 1;
            continue;
        }
        let row_len = e.dims[0] as usize;
        let n_rows: u64 = e.dims.iter().skip(1).product();
        let row_bytes = e.dst.bytes_for(row_len as u64).expect("planned") as usize;
        let rows_per_chunk = (CHUNK_VALUES / row_len.max(1)).max(1) as u64;
        let mut row0 = 0u64;
        while row0 < n_rows {
            let rows = rows_per_chunk.min(n_rows - row0) as usize;
            let mut buf = vec![0u8; rows * row_bytes];
            buf.par_chunks_mut(row_bytes).enumerate().try_for_each_init(
                || vec![0f32; row_len],
                |row, (r, ob)| -> Result<()> {
                    let abs = row0 + r as u64;
                    src.read_rows_f32(i, abs, row)?;
                    if let Some(c) = row.iter().position(|v| !v.is_finite()) {
                        return Err(Error::Unsupported(format!(
                            "{}: non-finite weight {} at row {abs}, column {c}; fix the source model (NaN/Inf cannot be quantized)",
                            e.name, row[c]
                        )));
                    }
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
