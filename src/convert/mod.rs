//! Execute a [`Plan`]: stream tensors from a [`TensorSource`] through dequantize → quantize into
//! the streaming GGUF writer. Memory is bounded by one chunk of rows (not one tensor, not the
//! model). Rows are independent, so they are processed in parallel and the bytes are the same
//! whatever the thread count.

use crate::error::{Error, Result};
use crate::gguf::{GgufWriter, TensorSpec, Value, ValueType};
use crate::plan::{Action, Plan, PlanEntry};
mod producer;

use crate::quant::Hessians;
use crate::source::TensorSource;
use crate::types::profile::Profile;
pub use producer::Prepared;
use producer::Producer;

use std::path::Path;

/// Rows are processed in chunks of at most this many f32 values (64 MiB).
pub const CHUNK_VALUES: usize = 16 << 20;

/// Provenance written under `tq.*` (deterministic: no time stamps, no thread counts).
pub struct Provenance {
    pub recipe: String,
    pub flags: String,
    pub input_name: String,
    pub input_blake3: String,
    /// More `tq.*` keys (string values), e.g. a `--target-bpw` mix's choice and prediction.
    pub extra: Vec<(String, String)>,
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
        for (k, v) in &p.extra {
            md.push((k.clone(), Value::string(v)));
        }
    }
    md
}

pub fn method(e: &crate::plan::PlanEntry) -> &'static str {
    match (e.action, e.ldlq) {
        (Action::Copy, _) => "copy",
        (Action::Quantize, false) if e.importance.is_some() => "imatrix",
        (Action::Requantize, false) if e.importance.is_some() => "requant-imatrix",
        (Action::Quantize, false) => "rtn",
        (Action::Requantize, false) => "requant-rtn",
        (Action::Quantize, true) => "ldlq",
        (Action::Requantize, true) => "requant-ldlq",
    }
}

/// Where LDLQ's Hessians come from while writing (the band, damping and refit passes are the
/// plan's, [`Plan::ldlq`]); factors are computed once per Hessian group and type family and
/// shared by the tensors of the group (q/k/v, gate/up).
pub enum Calib<'a> {
    /// Round-to-nearest (or imatrix-weighted) only.
    None,
    /// Hessians in memory (a mix calibrated on the text first).
    Hessians(Hessians),
    /// A Hessian file from `tq calib`, read group by group while writing.
    File(&'a crate::quant::HessianFile),
    /// `--calib TEXT`: calibrated block by block while writing.
    Stream(StreamCalib<'a>),
}

/// Checkpoints and `--resume` ([`execute`] and its variants). Every conversion writes its output
/// as `.NAME.tq-partial` with a checkpoint (`.json` beside it) after each tensor; a run killed at
/// any point is continued by the same command with `resume` set, and the result is byte-identical
/// to an uninterrupted run.
pub struct Checkpoints {
    /// Continue from the checkpoint (a missing one starts afresh, with a notice).
    pub resume: bool,
    /// What the output bytes depend on beyond the header (input files' identity, LDLQ settings):
    /// a checkpoint made under another key is refused.
    pub key: String,
    pub quiet: bool,
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

/// Write `out` from `src` following `plan`, with LDLQ's Hessians from `calib`: the one entry
/// point of a conversion. `on_progress(bytes_done)` is called after each chunk.
///
/// Two stages joined by a bounded queue (2 chunks): this thread reads and quantizes chunk k+1
/// (rows in parallel) while a writer thread writes chunk k. Peak memory: ~3 chunks of output and
/// one chunk of f32 rows, plus the LDLQ factor of the Hessian group being written (a factor is
/// dropped after the last tensor that uses it). A Hessian file costs one group in memory; a
/// streamed calibration one block's Hessians.
pub fn execute(target: &Target, calib: Calib, on_progress: &(dyn Fn(u64) + Sync)) -> Result<Stats> {
    match calib {
        Calib::None => execute_with(target, on_progress, &mut |p| {
            p.produce(&mut Hessians::default(), &|_, _| true)?;
            p.finish()
        }),
        Calib::Hessians(mut hs) => execute_with(target, on_progress, &mut |p| {
            p.produce(&mut hs, &|_, _| true)?;
            p.finish()
        }),
        Calib::File(file) => execute_with(target, on_progress, &mut |p| produce_from_file(p, file)),
        Calib::Stream(c) => execute_calibrating(target, on_progress, &c),
    }
}

/// What a streamed calibration runs on: the model file (the runtime reads GGUF) and the windows.
pub struct StreamCalib<'a> {
    pub model: &'a Path,
    pub file: &'a crate::gguf::GgufFile,
    /// `n × ctx` tokens, BOS in place.
    pub windows: &'a [u32],
    pub ctx: usize,
    /// Windows per `XᵀX` chunk (the batched mode's `--batch`: same Hessians, bit for bit).
    pub batch: usize,
    pub quiet: bool,
    /// `--calib-sequential`: GPTQ order, simulating exactly this conversion's plan.
    pub sequential: Option<&'a crate::calib::sequential::SeqQuant>,
}

/// `tq convert --calib TEXT`, streaming: calibrate block by block ([`crate::calib::stream`],
/// batched or sequential) and write each block's tensors as soon as its Hessians are complete,
/// then drop them. The plan must have been marked with [`crate::calib::stream::expected`].
/// Output bytes are those of [`Calib::Hessians`] with the batched Hessians of the same windows;
/// peak memory no longer grows with the number of blocks.
fn execute_calibrating(
    target: &Target,
    on_progress: &(dyn Fn(u64) + Sync),
    c: &StreamCalib,
) -> Result<Stats> {
    let plan = target.plan;
    let ready = |e: &PlanEntry, hs: &Hessians| {
        !e.ldlq || hs.for_tensor(&e.name).is_some() || hs.has_experts(&e.name)
    };
    execute_with(target, on_progress, &mut |p| {
        // Everything before the first calibrated tensor (token_embd, …) goes out first.
        p.produce(&mut Hessians::default(), &ready)?;
        // Resumed: blocks whose tensors are all written still run forward, but their Hessians
        // are not accumulated.
        let pending: std::collections::HashSet<String> = plan.entries[p.next..]
            .iter()
            .filter(|e| e.ldlq)
            .map(|e| e.name.clone())
            .collect();
        let mut on_block = |_: usize, hs: &mut Hessians| -> Result<()> {
            p.produce(hs, &ready)?;
            // A block's Hessians are dropped once its tensors are written.
            hs.groups
                .retain(|_, g| g.tensors.iter().any(|t| p.pending_ldlq(t)));
            Ok(())
        };
        let run = crate::calib::stream::Run {
            model: c.model,
            file: c.file,
            windows: c.windows,
            ctx: c.ctx,
            batch: c.batch,
            quiet: c.quiet,
        };
        match c.sequential {
            // Sequential: every block is accumulated, also on a resumed run (the blocks
            // written before must be quantized again to rebuild the residual stream).
            Some(q) => crate::calib::stream::run_blocks_sequential(&run, q, None, &mut on_block)?,
            None => {
                crate::calib::stream::run_blocks(&run, &|t| pending.contains(t), &mut on_block)?
            }
        };
        p.produce(&mut Hessians::default(), &ready)?;
        p.finish()
    })
}

/// One shard's share of a conversion (`tq convert --shard`): the plan entries in `range`,
/// quantized exactly as [`execute`] / [`execute_from_file`] would (same rows, same factors),
/// their bytes handed to `sink` in order (tensor data only, no padding; any chunking). The
/// caller frames them (`shard::fragment`); no GGUF header is written here.
pub fn execute_range(
    src: &dyn TensorSource,
    plan: &Plan,
    range: std::ops::Range<usize>,
    hessians: Option<&crate::quant::HessianFile>,
    sink: &mut (dyn FnMut(&[u8]) -> Result<()> + Send),
    on_progress: &(dyn Fn(u64) + Sync),
) -> Result<Stats> {
    run_range(
        src,
        plan,
        range,
        &mut |p| match hessians {
            None => p
                .produce(&mut Hessians::default(), &|_, _| true)
                .and_then(|()| p.finish()),
            Some(file) => produce_from_file(p, file),
        },
        sink,
        on_progress,
    )
}

/// The bytes the plan's entry `i` has in the converted file (tensor data, no padding), from
/// `calib` (a Hessian file, or the entry's Hessian groups in memory): what [`execute`] writes
/// for it, without writing anything (the mix's KLD probes substitute them into the model).
pub fn entry_bytes(src: &dyn TensorSource, plan: &Plan, i: usize, calib: Calib) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(plan.entries.get(i).map_or(0, |e| e.bytes as usize));
    let mut sink = |b: &[u8]| -> Result<()> {
        out.extend_from_slice(b);
        Ok(())
    };
    let (file, mut hs) = match calib {
        Calib::File(f) => (Some(f), None),
        Calib::Hessians(h) => (None, Some(h)),
        _ => (None, None),
    };
    run_range(
        src,
        plan,
        i..i + 1,
        &mut |p| match (file, hs.as_mut()) {
            (Some(f), _) => produce_from_file(p, f),
            (None, Some(h)) => p.produce(h, &|_, _| true).and_then(|()| p.finish()),
            (None, None) => p
                .produce(&mut Hessians::default(), &|_, _| true)
                .and_then(|()| p.finish()),
        },
        &mut sink,
        &|_| {},
    )?;
    Ok(out)
}

/// The producer over `range` (`produce` drives it), its bytes handed to `sink` in order.
fn run_range(
    src: &dyn TensorSource,
    plan: &Plan,
    range: std::ops::Range<usize>,
    produce: &mut dyn FnMut(&mut Producer) -> Result<()>,
    sink: &mut (dyn FnMut(&[u8]) -> Result<()> + Send),
    on_progress: &(dyn Fn(u64) + Sync),
) -> Result<Stats> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(2);
    let mut stats = Stats {
        bytes_written: 0,
        tensors_converted: 0,
        tensors_copied: 0,
    };
    std::thread::scope(|scope| -> Result<()> {
        let writer = scope.spawn(move || -> Result<u64> {
            let mut done = 0u64;
            for m in rx {
                // A fragment is not resumable on its own: rerun the shard.
                if let Msg::Data(chunk) = m {
                    sink(&chunk)?;
                    done += chunk.len() as u64;
                    on_progress(done);
                }
            }
            Ok(done)
        });
        let mut p = Producer::new(src, plan, tx, range.start.min(plan.entries.len()));
        p.end = range.end.min(plan.entries.len());
        let produced = produce(&mut p);
        stats.tensors_converted = p.converted;
        stats.tensors_copied = p.copied;
        drop(p);
        stats.bytes_written = writer
            .join()
            .map_err(|_| Error::internal("writer thread panicked"))??;
        produced
    })?;
    Ok(stats)
}

/// [`execute_from_file`]'s loop within the producer's range: each Hessian group is read when
/// its first tensor in the range is due and dropped after its last.
fn produce_from_file(p: &mut Producer, file: &crate::quant::HessianFile) -> Result<()> {
    let mut live = Hessians::default();
    loop {
        p.produce(&mut live, &|e, hs| {
            !e.ldlq || hs.for_tensor(&e.name).is_some() || hs.has_experts(&e.name)
        })?;
        live.groups
            .retain(|_, g| g.tensors.iter().any(|t| p.pending_ldlq(t)));
        if p.next >= p.end {
            return Ok(());
        }
        let e = &p.plan.entries[p.next];
        if e.dims.len() == 3 {
            // An expert tensor: every expert's group.
            for x in 0..e.dims[2] as usize {
                if let Some(g) = file.index.for_expert(&e.name, x) {
                    let key = g.tensors.join(",");
                    let g = file.load_group(&key)?;
                    live.groups.insert(key, g);
                }
            }
            continue;
        }
        let key = file
            .index
            .for_tensor(&e.name)
            .map(|g| g.tensors.join(","))
            .expect("planner marked LDLQ from this file's index");
        let g = file.load_group(&key)?;
        live.groups.insert(key, g);
    }
}

/// What a conversion writes and from what: the source, its plan, the output's metadata (GGUF
/// `version`, ids from `profile`), the output path, the input to hash for provenance (`None`:
/// no provenance) and the checkpoint settings. Resolved once by the caller and shared by
/// [`execute`], [`execute_calibrating`] and [`execute_from_file`].
pub struct Target<'a> {
    pub src: &'a dyn TensorSource,
    pub plan: &'a Plan,
    pub metadata: &'a [(String, Value)],
    pub version: u32,
    pub profile: &'a Profile,
    pub out: &'a Path,
    pub hash_input: Option<&'a Path>,
    pub cp: &'a Checkpoints,
    /// Entries whose bytes were made before (the mix's kept encodings), by plan index.
    pub prepared: Option<&'a Prepared<'a>>,
}

/// What the writer thread receives: tensor bytes, or "plan entries before this index are
/// complete" (a checkpoint).
enum Msg {
    Data(Vec<u8>),
    Done(usize),
}

/// The checkpoint of a resumable conversion (JSON beside the partial output).
#[derive(Debug, PartialEq)]
struct Checkpoint {
    key: String,
    /// Plan entries (= output tensors) complete.
    next: usize,
    /// Bytes of the partial file they fill (header included).
    pos: u64,
}

impl Checkpoint {
    fn to_json(&self) -> Vec<u8> {
        serde_json::json!({"tq_checkpoint": 1, "key": self.key, "next": self.next, "pos": self.pos})
            .to_string()
            .into_bytes()
    }

    fn read(path: &Path) -> Result<Option<Checkpoint>> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(path, e)),
        };
        let bad = || {
            Error::bad_input(
                path,
                "not a tq convert checkpoint; delete it, or run without --resume to start over",
            )
        };
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        if v["tq_checkpoint"] != 1 {
            return Err(bad());
        }
        Ok(Some(Checkpoint {
            key: v["key"].as_str().ok_or_else(bad)?.to_string(),
            next: v["next"].as_u64().ok_or_else(bad)? as usize,
            pos: v["pos"].as_u64().ok_or_else(bad)?,
        }))
    }
}

/// Where a run starts: `(entry, file position)` from a matching checkpoint under `--resume`.
fn resume_point(t: &Target, checkpoint: &Path) -> Result<Option<(usize, u64)>> {
    if !t.cp.resume {
        return Ok(None);
    }
    let Some(c) = Checkpoint::read(checkpoint)? else {
        if !t.cp.quiet {
            eprintln!(
                "tq: --resume: no checkpoint {} (the run stopped before its first tensor, or finished); starting from the beginning",
                checkpoint.display()
            );
        }
        return Ok(None);
    };
    if !crate::io::partial_path(t.out)?.exists() {
        if !t.cp.quiet {
            eprintln!(
                "tq: --resume: the partial output of {} is gone; starting from the beginning",
                checkpoint.display()
            );
        }
        return Ok(None);
    }
    if c.key != t.cp.key || c.next > t.plan.entries.len() {
        return Err(Error::Usage(format!(
            "{}: checkpoint of another conversion (input file, calibration, LDLQ settings or tq version differ); rerun the same command, or run without --resume to start over",
            checkpoint.display()
        )));
    }
    if !t.cp.quiet {
        eprintln!(
            "tq: resuming at tensor {}/{} ({} bytes already written)",
            c.next,
            t.plan.entries.len(),
            c.pos
        );
    }
    Ok(Some((c.next, c.pos)))
}

/// A run killed while finishing — after its last checkpoint, once the input's hash was filled
/// into the header in place of [`HASH_PLACEHOLDER`], before the rename — left a complete partial
/// output whose header holds the hash: resuming it, that header (the metadata with the hash
/// found there) is the one to continue, and the fill then writes the same bytes again.
fn filled_metadata(t: &Target, start: Option<(usize, u64)>) -> Option<Vec<(String, Value)>> {
    const KEY: &str = "tq.input.blake3";
    let (next, _) = start?;
    if t.hash_input.is_none() || next < t.plan.entries.len() {
        return None;
    }
    let partial = crate::io::partial_path(t.out).ok()?;
    let f = crate::gguf::GgufFile::open_with(&partial, t.profile).ok()?;
    let hash = f.get_str(KEY)?;
    if hash == HASH_PLACEHOLDER || hash.len() != HASH_PLACEHOLDER.len() {
        return None;
    }
    let mut md = t.metadata.to_vec();
    md.iter_mut()
        .filter(|(k, _)| k == KEY)
        .for_each(|(_, v)| *v = Value::string(hash));
    Some(md)
}

fn execute_with(
    t: &Target,
    on_progress: &(dyn Fn(u64) + Sync),
    drive: &mut dyn FnMut(&mut Producer) -> Result<()>,
) -> Result<Stats> {
    let specs = tensor_specs(t.plan, t.profile);
    let checkpoint = crate::io::checkpoint_path(&crate::io::partial_path(t.out)?);
    let start = resume_point(t, &checkpoint)?;
    let filled = filled_metadata(t, start);
    let metadata = filled.as_deref().unwrap_or(t.metadata);
    let w = GgufWriter::create_resumable(t.out, t.version, metadata, &specs, start)?;
    // The input's blake3 (provenance) is computed on a thread of its own while the tensors are
    // converted and filled into the header's placeholder at the end, instead of a whole pass
    // over the input before anything starts.
    let hasher = t.hash_input.map(|p| {
        let p = p.to_path_buf();
        std::thread::spawn(move || crate::io::hash_file(&p))
    });
    let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(2);
    let mut stats = Stats {
        bytes_written: 0,
        tensors_converted: 0,
        tensors_copied: 0,
    };
    std::thread::scope(|scope| -> Result<()> {
        let checkpoint = &checkpoint;
        let key = &t.cp.key;
        let writer = scope.spawn(move || -> Result<GgufWriter> {
            let mut w = w;
            let mut done = start.map_or(0, |(_, pos)| pos);
            for m in rx {
                match m {
                    Msg::Data(chunk) => {
                        w.write_data(&chunk)?;
                        done += chunk.len() as u64;
                        on_progress(done);
                        // Test hook (TQ_TEST_DATA_DELAY_MS): widen the window inside a tensor.
                        crate::io::hooks::pause(crate::io::hooks::Pause::Data);
                    }
                    Msg::Done(next) => {
                        let (tensor, pos) = w.sync()?;
                        debug_assert!(tensor >= next);
                        let c = Checkpoint {
                            key: key.clone(),
                            next,
                            pos,
                        };
                        crate::io::write_file(checkpoint, &c.to_json())?;
                        // Test hook (TQ_CONVERT_ABORT_AFTER): stop here as kill -9 would.
                        crate::io::hooks::kill_point(
                            crate::io::hooks::KillPoint::ConvertCheckpoint,
                        );
                    }
                }
            }
            Ok(w)
        });
        let mut p = Producer::new(t.src, t.plan, tx, start.map_or(0, |(next, _)| next));
        p.prepared = t.prepared;
        let produced = drive(&mut p);
        stats.tensors_converted = p.converted;
        stats.tensors_copied = p.copied;
        drop(p);
        // A writer error closes the queue, which stops the producer; report the writer's error first.
        let mut w = writer
            .join()
            .map_err(|_| Error::internal("writer thread panicked"))??;
        produced?;
        if let Some(h) = hasher {
            let hash = h
                .join()
                .map_err(|_| Error::internal("input hash thread panicked"))??;
            w.fill_string("tq.input.blake3", &hash)?;
        }
        w.finish()
    })?;
    stats.bytes_written = std::fs::metadata(t.out).map(|m| m.len()).unwrap_or(0);
    Ok(stats)
}

/// Measurement tests that read real models (the `quant` room may not open GGUF files).
#[cfg(test)]
mod proxies {
    /// The proxy of issue 19's follow-up (not CI: it needs the benchmark's cached SmolLM2 F16 and
    /// Botchan Hessians, `scripts/bench-2bit.sh`): the Hessian-weighted relative error
    /// `tr(ΔW H ΔWᵀ) / tr(W H Wᵀ)` of the first `TQ_PROXY_ROWS` (default 64) rows of real tensors,
    /// tq2_r LDLQ against tq2_t block-LDLQ with each inner quantizer.
    /// `cargo test --release --lib trellis_proxy -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn trellis_proxy_on_smollm2() {
        use crate::gguf::GgufFile;
        use crate::quant::ldlq::trellis::{quantize_trellis, TrellisInner};
        use crate::quant::ldlq::{factor_hessian, proxy_loss, quantize_ldlq};
        use crate::types::TensorType;
        let cache = std::env::var("TQ_CACHE")
            .unwrap_or_else(|_| format!("{}/.cache/tq", std::env::var("HOME").unwrap()));
        let b = std::path::Path::new(&cache).join("bench2bit");
        let (hs, _) = crate::quant::Hessians::load(&b.join("H.safetensors")).unwrap();
        let f = GgufFile::open(b.join("smollm2-f16.gguf")).unwrap();
        let rows: usize = std::env::var("TQ_PROXY_ROWS")
            .map(|v| v.parse().unwrap())
            .unwrap_or(64);
        // TQ_PROXY_SHRINK: the Hessians' shrinkage (default 0; the conversions' default is
        // `TQ2_SHRINK`).
        let shrink: f64 = std::env::var("TQ_PROXY_SHRINK")
            .map(|v| v.parse().unwrap())
            .unwrap_or(0.0);
        let names = std::env::var("TQ_PROXY_TENSORS").unwrap_or_else(|_| {
            "blk.7.ffn_down.weight,blk.7.attn_q.weight,blk.7.ffn_gate.weight".into()
        });
        let quad = |weighted, passes, feedback, psp| TrellisInner::Quad {
            weighted,
            passes,
            feedback,
            psp,
            fast: 0,
            gate: 0,
            fb_gate: 0,
            seam: 0,
            fixed: false,
        };
        let quadw = |fast, feedback, psp| TrellisInner::Quad {
            weighted: false,
            passes: 4,
            feedback,
            psp,
            fast,
            gate: 0,
            fb_gate: 0,
            seam: 0,
            fixed: false,
        };
        let all = [
            ("plain (old)", TrellisInner::Plain),
            ("plain+fb2+CD (previous format)", quad(false, 4, 2, (0, 0))),
            ("plain+fb2+CD, psp+CD", quad(false, 4, 2, (1, 0))),
            ("plain+fb2+CD, beam64+CD", quad(false, 4, 2, (1, 64))),
            (
                "beam128 (format until the gate)",
                quad(false, 4, 2, (1, 128)),
            ),
            ("plain+fb2+CD, beam256+CD", quad(false, 4, 2, (1, 256))),
            ("plain+fb2+CD, beam256x2+CD", quad(false, 4, 2, (2, 256))),
            ("plain+CD, beam256+CD", quad(false, 4, 0, (1, 256))),
            ("plain+fb1+CD, beam256+CD", quad(false, 4, 1, (1, 256))),
            ("plain+fb2w+CD, beam128+CD", quadw(1, 2, (1, 128))),
            ("plain+fb2w+CD, beam256+CD", quadw(1, 2, (1, 256))),
            ("plain+fb1w+CD, beam128+CD", quadw(1, 1, (1, 128))),
            ("plain+fb2w+CD (no beam)", quadw(1, 2, (0, 0))),
            ("plain1+fb2w+CD, beam128+CD", quadw(2, 2, (1, 128))),
            ("plain1+fb3w+CD, beam128+CD", quadw(2, 3, (1, 128))),
            ("plain1+fb2w+CD, beam64+CD", quadw(2, 2, (1, 64))),
            ("plain1+fb2w+CD, beam192+CD", quadw(2, 2, (1, 192))),
            (
                "format (4 searches, beam128 where coupled)",
                TrellisInner::FORMAT,
            ),
        ];
        // TQ_PROXY_VARIANTS: comma-separated indices into `all` (default: every one).
        let pick = std::env::var("TQ_PROXY_VARIANTS").ok();
        let mut variants: Vec<(String, TrellisInner)> = all
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                pick.as_deref()
                    .is_none_or(|p| p.split(',').any(|v| v.parse() == Ok(*i)))
            })
            .map(|(_, (l, v))| (l.to_string(), *v))
            .collect();
        // TQ_PROXY_CUSTOM: `fast:feedback:passes:beam[:gate[:fb_gate[:seam[:fixed]]]]` variants
        // separated by commas.
        if let Ok(c) = std::env::var("TQ_PROXY_CUSTOM") {
            for v in c.split(',').filter(|v| !v.is_empty()) {
                let p: Vec<usize> = v.split(':').map(|x| x.parse().unwrap()).collect();
                let mut inner = quadw(p[0] as u8, p[1], (usize::from(p[3] > 0), p[3]));
                if let TrellisInner::Quad {
                    passes,
                    gate,
                    fb_gate,
                    seam,
                    fixed,
                    ..
                } = &mut inner
                {
                    *fixed = p.get(7).is_some_and(|&g| g != 0);
                    *passes = p[2];
                    *gate = p.get(4).map_or(0, |&g| g as u16);
                    *fb_gate = p.get(5).map_or(0, |&g| g as u16);
                    *seam = p.get(6).map_or(0, |&g| g as u8);
                }
                variants.push((format!("custom {v}"), inner));
            }
        }
        for name in names.split(',') {
            let t = f.tensors.iter().find(|t| t.name == name).unwrap();
            let n = t.dims[0] as usize;
            let mut w = vec![0f32; t.n_elements() as usize];
            crate::types::dequantize(t.ty, f.tensor_data(t), &mut w, name).unwrap();
            w.truncate(rows * n);
            let h = hs.for_tensor(name).unwrap();
            let dec = |ty: TensorType, b: &[u8]| {
                let mut y = vec![0f32; w.len()];
                crate::types::dequantize_rows(ty, b, &mut y, n, name).unwrap();
                y
            };
            let fr = factor_hessian(TensorType::TQ2R, h, 0.01, shrink, 0, name).unwrap();
            let t0 = std::time::Instant::now();
            let qr = quantize_ldlq(TensorType::TQ2R, &w, n, &fr, 0);
            let lr = proxy_loss(&h.h, n, &w, &dec(TensorType::TQ2R, &qr));
            eprintln!(
                "{name} rows {rows}: tq2_r LDLQ {lr:.5} ({:.1} s)",
                t0.elapsed().as_secs_f64()
            );
            let ft = factor_hessian(TensorType::TQ2T, h, 0.01, shrink, 0, name).unwrap();
            for (label, inner) in &variants {
                let inner = *inner;
                let t0 = std::time::Instant::now();
                let c0 = crate::io::progress::process_cpu_seconds();
                let q = quantize_trellis(&w, n, &ft, 0, inner);
                let cpu = crate::io::progress::process_cpu_seconds() - c0;
                let l = proxy_loss(&h.h, n, &w, &dec(TensorType::TQ2T, &q));
                eprintln!(
                    "{name}: tq2_t {label}: {l:.5} ({:.3}x tq2_r, {:.1} s, {cpu:.2} CPU-s)",
                    l / lr,
                    t0.elapsed().as_secs_f64()
                );
            }
        }
        crate::quant::ldlq::prof::report();
    }
}
