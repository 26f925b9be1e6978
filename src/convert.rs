//! Execute a [`Plan`]: stream tensors from a [`TensorSource`] through dequantize → quantize into
//! the streaming GGUF writer. Memory is bounded by one chunk of rows (not one tensor, not the
//! model). Rows are independent, so they are processed in parallel and the bytes are the same
//! whatever the thread count.

use crate::error::{Error, Result};
use crate::gguf::{GgufWriter, TensorSpec, Value, ValueType};
use crate::plan::{Action, Plan, PlanEntry};
use crate::quant::ldlq::Factor;
use crate::quant::Hessians;
use crate::source::TensorSource;
use crate::types::profile::Profile;
use rayon::prelude::*;
use std::path::Path;
use std::sync::Arc;

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
    // A decoder of row-rotated tensors must know the rotation: recorded whatever --no-provenance.
    if plan.entries.iter().any(|e| e.dst.rotates_rows()) {
        set(
            crate::types::tq2r::META_ROTATION,
            Value::string(crate::types::tq2r::ROTATION_ID),
        );
    }
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
    pub hessians: crate::quant::Hessians,
    pub band: usize,
    pub damp: f64,
}

/// [`Ldlq`] by reference: what the producer reads (the streaming pipeline's Hessians live in
/// the calibration pass and are lent block by block).
#[derive(Clone, Copy)]
pub struct LdlqRef<'a> {
    pub hessians: &'a crate::quant::Hessians,
    pub band: usize,
    pub damp: f64,
}

impl Ldlq {
    pub fn as_ref(&self) -> LdlqRef<'_> {
        LdlqRef {
            hessians: &self.hessians,
            band: self.band,
            damp: self.damp,
        }
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

/// Placeholder for `tq.input.blake3` while the hash is computed alongside the conversion.
pub const HASH_PLACEHOLDER: &str =
    "0000000000000000000000000000000000000000000000000000000000000000";

pub struct Stats {
    pub bytes_written: u64,
    pub tensors_converted: usize,
    pub tensors_copied: usize,
}

/// Write `out` from `src` following `plan`. `on_progress(bytes_done)` is called after each chunk.
///
/// Two stages joined by a bounded queue (2 chunks): this thread reads and quantizes chunk k+1
/// (rows in parallel) while a writer thread writes chunk k. Peak memory: ~3 chunks of output plus
/// one f32 row per worker, plus the LDLQ factor of the Hessian group being written (a factor is
/// dropped after the last tensor that uses it).
#[allow(clippy::too_many_arguments)] // the plan's inputs, each a plain value resolved by the caller
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
    let target = Target {
        src,
        plan,
        metadata,
        version,
        profile,
        out,
        hash_input,
    };
    execute_with(&target, on_progress, &mut |p| {
        p.produce(ldlq.map(Ldlq::as_ref), &|_| true)?;
        p.finish()
    })
}

/// What [`execute_calibrating`] calibrates on: the model file (the runtime reads GGUF), the
/// windows, and the LDLQ settings.
pub struct StreamCalib<'a> {
    pub model: &'a Path,
    pub file: &'a crate::gguf::GgufFile,
    /// `n × ctx` tokens, BOS in place.
    pub windows: &'a [u32],
    pub ctx: usize,
    /// Windows per `XᵀX` chunk (the batched mode's `--batch`: same Hessians, bit for bit).
    pub batch: usize,
    pub band: usize,
    pub damp: f64,
    pub quiet: bool,
}

/// `tq convert --calib TEXT`, streaming: calibrate block by block ([`crate::calib::stream`])
/// and write each block's tensors as soon as its Hessians are complete, then drop them. The plan
/// must have been marked with [`crate::calib::stream::expected`]. Output bytes are those of
/// [`execute`] with the batched Hessians of the same windows; peak memory no longer grows with
/// the number of blocks.
#[allow(clippy::too_many_arguments)] // as execute, plus the calibration
pub fn execute_calibrating(
    src: &dyn TensorSource,
    plan: &Plan,
    metadata: &[(String, Value)],
    version: u32,
    profile: &Profile,
    out: &Path,
    hash_input: Option<&Path>,
    on_progress: &(dyn Fn(u64) + Sync),
    c: &StreamCalib,
) -> Result<Stats> {
    let target = Target {
        src,
        plan,
        metadata,
        version,
        profile,
        out,
        hash_input,
    };
    let ready = |e: &PlanEntry, hs: &Hessians| !e.ldlq || hs.for_tensor(&e.name).is_some();
    execute_with(&target, on_progress, &mut |p| {
        // Everything before the first calibrated tensor (token_embd, …) goes out first.
        let none = Hessians::default();
        fn lend<'h>(hessians: &'h Hessians, c: &StreamCalib) -> LdlqRef<'h> {
            LdlqRef {
                hessians,
                band: c.band,
                damp: c.damp,
            }
        }
        p.produce(Some(lend(&none, c)), &|e| ready(e, &none))?;
        crate::calib::stream::run_blocks(
            c.model,
            c.file,
            c.windows,
            c.ctx,
            c.batch,
            c.quiet,
            &mut |_, hs| {
                p.produce(Some(lend(hs, c)), &|e| ready(e, hs))?;
                // A block's Hessians are dropped once its tensors are written.
                hs.groups
                    .retain(|_, g| g.tensors.iter().any(|t| p.pending_ldlq(t)));
                Ok(())
            },
        )?;
        p.produce(Some(lend(&none, c)), &|e| ready(e, &none))?;
        p.finish()
    })
}

/// `tq convert --calib H.safetensors`: as [`execute`], reading each Hessian group from the file
/// when its first tensor is due and dropping it after its last, so a file of any size costs one
/// group (and its factor) in memory. The plan must have been marked with the file's index.
#[allow(clippy::too_many_arguments)] // as execute, with the file in place of in-memory Hessians
pub fn execute_from_file(
    src: &dyn TensorSource,
    plan: &Plan,
    metadata: &[(String, Value)],
    version: u32,
    profile: &Profile,
    out: &Path,
    hash_input: Option<&Path>,
    on_progress: &(dyn Fn(u64) + Sync),
    file: &crate::quant::HessianFile,
    band: usize,
    damp: f64,
) -> Result<Stats> {
    let target = Target {
        src,
        plan,
        metadata,
        version,
        profile,
        out,
        hash_input,
    };
    execute_with(&target, on_progress, &mut |p| {
        let mut live = Hessians::default();
        loop {
            let l = LdlqRef {
                hessians: &live,
                band,
                damp,
            };
            p.produce(Some(l), &|e| !e.ldlq || live.for_tensor(&e.name).is_some())?;
            live.groups
                .retain(|_, g| g.tensors.iter().any(|t| p.pending_ldlq(t)));
            let Some(e) = plan.entries.get(p.next) else {
                return Ok(());
            };
            let key = file
                .index
                .for_tensor(&e.name)
                .map(|g| g.tensors.join(","))
                .expect("planner marked LDLQ from this file's index");
            let g = file.load_group(&key)?;
            live.groups.insert(key, g);
        }
    })
}

struct Target<'a> {
    src: &'a dyn TensorSource,
    plan: &'a Plan,
    metadata: &'a [(String, Value)],
    version: u32,
    profile: &'a Profile,
    out: &'a Path,
    hash_input: Option<&'a Path>,
}

fn execute_with(
    t: &Target,
    on_progress: &(dyn Fn(u64) + Sync),
    drive: &mut dyn FnMut(&mut Producer) -> Result<()>,
) -> Result<Stats> {
    let specs = tensor_specs(t.plan, t.profile);
    let w = GgufWriter::create(t.out, t.version, t.metadata, &specs)?;
    // The input's blake3 (provenance) is computed on a thread of its own while the tensors are
    // converted and filled into the header's placeholder at the end, instead of a whole pass
    // over the input before anything starts.
    let hasher = t.hash_input.map(|p| {
        let p = p.to_path_buf();
        std::thread::spawn(move || crate::io::hash_file(&p))
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
        let mut p = Producer::new(t.src, t.plan, tx);
        let produced = drive(&mut p);
        stats.tensors_converted = p.converted;
        stats.tensors_copied = p.copied;
        drop(p);
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
    stats.bytes_written = std::fs::metadata(t.out).map(|m| m.len()).unwrap_or(0);
    Ok(stats)
}

/// The one rule for every tensor written: a non-finite value is an error naming the tensor, row and
/// column ([`crate::quant::check_finite`]), for copied bytes as for converted ones. Copies of a
/// type tq decodes are decoded chunk by chunk to check (integer and f64 tensors have nothing to
/// check, and types tq cannot decode are copied as they are).
fn check_copy_finite(
    src: &dyn TensorSource,
    i: usize,
    name: &str,
    dims: &[u64],
    ty: crate::types::TensorType,
) -> Result<()> {
    if ty.info().dequantize.is_none() || !(ty.is_float() || ty.is_quantized()) {
        return Ok(());
    }
    let row_len = dims.first().copied().unwrap_or(1).max(1) as usize;
    let n_rows: u64 = dims.iter().skip(1).product();
    let rows_per_chunk = (CHUNK_VALUES / row_len).max(1) as u64;
    let mut row0 = 0u64;
    while row0 < n_rows {
        let rows = rows_per_chunk.min(n_rows - row0) as usize;
        read_finite_rows(src, i, name, row0, rows, row_len)?;
        row0 += rows as u64;
    }
    Ok(())
}

/// Produces the plan's tensors in order, as far as their Hessians allow, into the writer's
/// queue. Resumable: [`Producer::produce`] stops at the first entry that is not ready and the
/// next call continues there.
struct Producer<'a> {
    src: &'a dyn TensorSource,
    plan: &'a Plan,
    tx: std::sync::mpsc::SyncSender<Vec<u8>>,
    /// The next plan entry to write.
    next: usize,
    /// Plan index of each LDLQ tensor, by name.
    ldlq_index: std::collections::HashMap<&'a str, usize>,
    /// LDLQ factors by (family, group), with the plan index of the last entry that uses each.
    factors: std::collections::HashMap<String, (Arc<Factor>, usize)>,
    converted: usize,
    copied: usize,
}

impl<'a> Producer<'a> {
    fn new(
        src: &'a dyn TensorSource,
        plan: &'a Plan,
        tx: std::sync::mpsc::SyncSender<Vec<u8>>,
    ) -> Self {
        Producer {
            src,
            plan,
            tx,
            next: 0,
            ldlq_index: plan
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.ldlq)
                .map(|(i, e)| (e.name.as_str(), i))
                .collect(),
            factors: Default::default(),
            converted: 0,
            copied: 0,
        }
    }

    /// `name` is an LDLQ tensor not written yet.
    fn pending_ldlq(&self, name: &str) -> bool {
        self.ldlq_index.get(name).is_some_and(|&i| i >= self.next)
    }

    /// Every entry was written; an LDLQ tensor whose Hessian never came is an error.
    fn finish(&self) -> Result<()> {
        match self.plan.entries.get(self.next) {
            None => Ok(()),
            Some(e) => Err(Error::Unsupported(format!(
                "{}: the calibration pass produced no Hessian for this tensor (the runtime does not read it); convert with a Hessian file from tq calib, or without --calib",
                e.name
            ))),
        }
    }

    /// Write entries from `next` on while `ready(entry)` holds.
    fn produce(&mut self, ldlq: Option<LdlqRef>, ready: &dyn Fn(&PlanEntry) -> bool) -> Result<()> {
        while let Some(e) = self.plan.entries.get(self.next) {
            if !ready(e) {
                break;
            }
            self.entry(self.next, e, ldlq)?;
            self.next += 1;
            let done = self.next;
            self.factors.retain(|_, (_, last)| *last >= done);
        }
        Ok(())
    }

    fn entry(&mut self, i: usize, e: &PlanEntry, ldlq: Option<LdlqRef>) -> Result<()> {
        let src = self.src;
        // The writer thread hung up: its error is reported by the caller.
        let closed = || Error::Usage("output writer stopped".into());
        if e.action == Action::Copy {
            if let Some(raw) = src.raw(i) {
                check_copy_finite(src, i, &e.name, &e.dims, e.src)?;
                for c in raw.chunks(CHUNK_VALUES * 4) {
                    self.tx.send(c.to_vec()).map_err(|_| closed())?;
                }
                src.release(i);
                self.copied += 1;
                return Ok(());
            }
            // No stored bytes in this encoding (e.g. HF attn_q/attn_k rows permuted on the fly):
            // re-encode the rows below; float → f32 → same float type is exact.
        }
        let row_len = e.dims.first().copied().unwrap_or(1) as usize;
        let n_rows: u64 = e.dims.iter().skip(1).product();
        if row_len == 0 || n_rows == 0 {
            // A zero-element tensor (e.g. dims [0, 576]): valid GGUF (llama.cpp's gguf reader
            // and gguf-py accept it), written as an empty tensor of the planned type.
            src.release(i);
            self.converted += 1;
            return Ok(());
        }
        let row_bytes = e.dst.bytes_for(row_len as u64).expect("planned") as usize;
        let rows_per_chunk = (CHUNK_VALUES / row_len.max(1)).max(1) as u64;
        let factor = match ldlq.filter(|_| e.ldlq) {
            Some(l) => Some((self.factor(i, e, l)?, l.band)),
            None => None,
        };
        let tx = &self.tx;
        let mut row0 = 0u64;
        while row0 < n_rows {
            let rows = rows_per_chunk.min(n_rows - row0) as usize;
            if let Some((f, band)) = &factor {
                let x = read_finite_rows(src, i, &e.name, row0, rows, row_len)?;
                tx.send(crate::quant::encode_rows(
                    e.dst,
                    &e.name,
                    &x,
                    row_len,
                    Some((f, *band)),
                )?)
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
                        crate::quant::check_finite(&e.name, abs, row)?;
                        crate::types::quantize_rows(e.dst, row, ob, row_len, &e.name)
                    },
                )?;
            tx.send(buf).map_err(|_| closed())?;
            row0 += rows as u64;
        }
        src.release(i);
        self.converted += 1;
        Ok(())
    }

    /// The LDLQ factor for entry `i`, computed once per Hessian group and type family (q/k/v
    /// and gate/up share theirs) and kept until the group's last tensor is written.
    fn factor(&mut self, i: usize, e: &PlanEntry, l: LdlqRef) -> Result<Arc<Factor>> {
        let h = l
            .hessians
            .for_tensor(&e.name)
            .expect("planner checked the Hessian");
        // The factor is of the Hessian rotated for the type's family: key on both.
        let key = format!("{:?}:{}", e.dst.family(), h.tensors.join(","));
        if let Some((f, _)) = self.factors.get(&key) {
            return Ok(f.clone());
        }
        let f = Arc::new(crate::quant::ldlq::factor_hessian(
            e.dst, h, l.damp, &e.name,
        )?);
        let last = self
            .plan
            .entries
            .iter()
            .enumerate()
            .skip(i)
            .rev()
            .find(|(_, x)| {
                x.ldlq && x.dst.family() == e.dst.family() && h.tensors.contains(&x.name)
            })
            .map_or(i, |(j, _)| j);
        self.factors.insert(key, (f.clone(), last));
        Ok(f)
    }
}

/// Rows `[row0, row0 + rows)` of tensor `i` as f32, read in parallel; a NaN/Inf is an error
/// naming the tensor, row and column.
fn read_finite_rows(
    src: &dyn TensorSource,
    i: usize,
    name: &str,
    row0: u64,
    rows: usize,
    row_len: usize,
) -> Result<Vec<f32>> {
    let mut x = vec![0f32; rows * row_len];
    x.par_chunks_mut(row_len)
        .enumerate()
        .try_for_each(|(r, row)| -> Result<()> {
            let abs = row0 + r as u64;
            src.read_rows_f32(i, abs, row)?;
            crate::quant::check_finite(name, abs, row)
        })?;
    Ok(x)
}
