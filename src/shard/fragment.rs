//! Conversion fragments: `tq convert --shard I/N` writes one, `tq assemble` joins a complete set
//! into the GGUF a one-process `tq convert` with the same flags writes, byte for byte.
//!
//! A fragment (all integers little-endian):
//!
//! ```text
//! 0        8 bytes   magic "TQFRAG01"
//! 8        u64       H: length of the GGUF header
//! 16       H bytes   the final file's GGUF header (magic … tensor infos), as the one-process run
//!                    writes it, with tq.input.blake3 still the all-zero placeholder
//! 16+H     D bytes   the data of this shard's tensors exactly as they sit in the final file
//!                    (each tensor followed by its padding to general.alignment)
//! 16+H+D   J bytes   manifest: JSON (see [`Manifest`])
//! end-16   u64       J
//! end-8    8 bytes   magic "TQFRAG01"
//! ```
//!
//! The manifest's `plan` is the blake3 of the GGUF header and the input's length: fragments
//! with equal `plan` and `shards` come from the same input, flags, plan and provenance, and
//! `assemble` refuses anything else. Shard 0 also carries the input's blake3 (provenance) when
//! the header has the placeholder, so only one shard reads the whole input to hash it.

use super::Shard;
use crate::error::{Error, Result};
use crate::gguf::{TensorSpec, Value, ValueType};
use crate::io::TempOutput;
use crate::plan::Plan;
use crate::quant::HessianFile;
use crate::source::TensorSource;
use crate::types::profile::Profile;
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"TQFRAG01";
const FORMAT: &str = "tq-fragment";
const VERSION: u32 = 1;

/// The JSON manifest at the end of a fragment.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Manifest {
    /// "tq-fragment".
    pub format: String,
    /// 1.
    pub version: u32,
    /// blake3 (hex) of the GGUF header bytes followed by the input's length (u64 LE).
    pub plan: String,
    pub shard: usize,
    pub shards: usize,
    /// Plan entries `[first, end)` of this shard, and their names.
    pub first: usize,
    pub end: usize,
    pub tensors: Vec<String>,
    /// Tensors in the whole plan.
    pub n_tensors: usize,
    pub alignment: u64,
    /// Where this shard's data starts in the final file's data section, its length, and the
    /// data section's total length.
    pub data_offset: u64,
    pub data_len: u64,
    pub total_data_len: u64,
    /// blake3 (hex) of this shard's data bytes.
    pub data_blake3: String,
    pub input_name: String,
    pub input_len: u64,
    /// The input's blake3, for the provenance key (shard 0 only, when provenance is on).
    pub input_blake3: Option<String>,
}

/// One shard of a conversion, as `tq convert` resolved it.
pub struct Job<'a> {
    pub src: &'a dyn TensorSource,
    pub plan: &'a Plan,
    /// The output metadata (with the provenance placeholder when provenance is on).
    pub metadata: &'a [(String, Value)],
    pub version: u32,
    pub profile: &'a Profile,
    /// The input (file or directory): its length identifies it; shard 0 hashes it.
    pub input: &'a Path,
    pub hash_input: bool,
    /// `--calib H.safetensors` (LDLQ's settings are the plan's).
    pub hessians: Option<&'a HessianFile>,
    pub shard: Shard,
    pub out: &'a Path,
}

pub struct Written {
    pub manifest: Manifest,
    pub bytes: u64,
    pub tensors_converted: usize,
    pub tensors_copied: usize,
}

fn input_len(p: &Path) -> u64 {
    if p.is_dir() {
        // A Hugging Face directory: the sum of its files' lengths.
        std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    } else {
        std::fs::metadata(p).map_or(0, |m| m.len())
    }
}

fn plan_id(header: &[u8], input_len: u64) -> String {
    let mut h = blake3::Hasher::new();
    h.update(header);
    h.update(&input_len.to_le_bytes());
    h.finalize().to_hex().to_string()
}

/// An LDLQ tensor's weight per element against a copied or rounded one's, a rough estimate: on
/// SmolLM2 (full band, one thread) shards of LDLQ tensors took ≈1.5 s per million elements, the
/// shard holding `token_embd` ≈0.35 s (docs/bench/sharding.md).
const LDLQ_COST: u64 = 8;

/// The plan entries of `shard`: balanced by element count, LDLQ tensors weighted
/// [`LDLQ_COST`] times (a fixed function of the plan, whatever the machine or threads).
pub fn tensor_range(plan: &Plan, shard: Shard) -> std::ops::Range<usize> {
    let w: Vec<u64> = plan
        .entries
        .iter()
        .map(|e| e.dims.iter().product::<u64>() * if e.ldlq { LDLQ_COST } else { 1 })
        .collect();
    shard.range_by_weight(&w)
}

/// Frames the producer's tensor bytes as they sit in the final file: padding after each tensor.
struct Framer<'w> {
    out: &'w mut std::io::BufWriter<std::fs::File>,
    tmp: PathBuf,
    sizes: Vec<u64>,
    alignment: u64,
    current: usize,
    written: u64,
    len: u64,
    hash: blake3::Hasher,
}

impl Framer<'_> {
    fn raw(&mut self, b: &[u8]) -> Result<()> {
        self.out.write_all(b).map_err(|e| Error::io(&self.tmp, e))?;
        self.hash.update(b);
        self.len += b.len() as u64;
        Ok(())
    }

    fn skip_empty(&mut self) {
        while self.current < self.sizes.len() && self.sizes[self.current] == 0 {
            self.current += 1;
        }
    }

    fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let Some(&size) = self.sizes.get(self.current) else {
                return Err(Error::internal(format!(
                    "{}: more tensor data than the shard's layout holds",
                    self.tmp.display()
                )));
            };
            let k = ((size - self.written) as usize).min(data.len());
            self.raw(&data[..k])?;
            self.written += k as u64;
            data = &data[k..];
            if self.written == size {
                self.current += 1;
                self.written = 0;
                let pad = size.div_ceil(self.alignment) * self.alignment - size;
                self.raw(&vec![0u8; pad as usize])?;
                self.skip_empty();
            }
        }
        Ok(())
    }
}

/// Convert shard `job.shard` of the plan into a fragment at `job.out` (atomically).
pub fn write(job: &Job, on_progress: &(dyn Fn(u64) + Sync)) -> Result<Written> {
    let specs = crate::convert::tensor_specs(job.plan, job.profile);
    let (header, offsets, alignment) =
        crate::gguf::writer::encode_header(job.version, job.metadata, &specs)?;
    let aligned = |s: &TensorSpec| s.size.div_ceil(alignment) * alignment;
    let total_data_len = offsets
        .last()
        .zip(specs.last())
        .map_or(0, |(o, s)| o + aligned(s));
    let range = tensor_range(job.plan, job.shard);
    let data_at = |j: usize| offsets.get(j).copied().unwrap_or(total_data_len);
    let input_len = input_len(job.input);
    let has_placeholder = job.metadata.iter().any(|(k, _)| k == "tq.input.blake3");
    // Only shard 0 reads the whole input to hash it, on a thread of its own as convert does.
    let hasher = (job.hash_input && has_placeholder && job.shard.index == 0).then(|| {
        let p = job.input.to_path_buf();
        std::thread::spawn(move || crate::io::hash_file(&p))
    });
    let (target, file) = TempOutput::create(job.out)?;
    let tmp = target.tmp_path().to_path_buf();
    let io = |e| Error::io(&tmp, e);
    let mut out = std::io::BufWriter::with_capacity(1 << 22, file);
    out.write_all(MAGIC).map_err(io)?;
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&header).map_err(io)?;
    let mut framer = Framer {
        out: &mut out,
        tmp: tmp.clone(),
        sizes: specs[range.clone()].iter().map(|s| s.size).collect(),
        alignment,
        current: 0,
        written: 0,
        len: 0,
        hash: blake3::Hasher::new(),
    };
    framer.skip_empty();
    let stats = crate::convert::execute_range(
        job.src,
        job.plan,
        range.clone(),
        job.hessians,
        &mut |b| framer.write(b),
        on_progress,
    )?;
    let want = data_at(range.end) - data_at(range.start);
    if framer.len != want || framer.current != framer.sizes.len() {
        return Err(Error::internal(format!(
            "{}: shard {} wrote {} data bytes, its layout holds {want}",
            job.out.display(),
            job.shard,
            framer.len
        )));
    }
    let data_blake3 = framer.hash.finalize().to_hex().to_string();
    let input_blake3 = match hasher {
        Some(h) => Some(
            h.join()
                .map_err(|_| Error::internal("input hash thread panicked"))??,
        ),
        None => None,
    };
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        plan: plan_id(&header, input_len),
        shard: job.shard.index,
        shards: job.shard.count,
        first: range.start,
        end: range.end,
        tensors: job.plan.entries[range.clone()]
            .iter()
            .map(|e| e.name.clone())
            .collect(),
        n_tensors: specs.len(),
        alignment,
        data_offset: data_at(range.start),
        data_len: want,
        total_data_len,
        data_blake3,
        input_name: job
            .input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        input_len,
        input_blake3,
    };
    let js = serde_json::to_vec(&manifest).map_err(|e| {
        Error::internal(format!(
            "JSON encoding of the fragment manifest failed: {e}"
        ))
    })?;
    out.write_all(&js).map_err(io)?;
    out.write_all(&(js.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(MAGIC).map_err(io)?;
    let f = out.into_inner().map_err(|e| io(e.into_error()))?;
    target.commit(f)?;
    Ok(Written {
        bytes: std::fs::metadata(job.out).map_or(0, |m| m.len()),
        manifest,
        tensors_converted: stats.tensors_converted,
        tensors_copied: stats.tensors_copied,
    })
}

/// A fragment file opened: its manifest, its GGUF header, and where its data starts.
pub struct Fragment {
    pub path: PathBuf,
    pub manifest: Manifest,
    pub header: Vec<u8>,
    data_start: u64,
}

impl Fragment {
    /// Read and check a fragment's framing (magic at both ends, lengths that add up to the
    /// file's length); the data is checked against its blake3 when it is copied.
    pub fn open(path: &Path) -> Result<Fragment> {
        let bad = |m: String| Error::bad_input(path, m);
        let not = || {
            bad("not a tq fragment (written by tq convert --shard I/N), or truncated; rerun that shard".into())
        };
        let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        if len < 32 {
            return Err(not());
        }
        let mut head = [0u8; 16];
        f.read_exact(&mut head).map_err(|e| Error::io(path, e))?;
        let mut tail = [0u8; 16];
        f.seek(SeekFrom::End(-16)).map_err(|e| Error::io(path, e))?;
        f.read_exact(&mut tail).map_err(|e| Error::io(path, e))?;
        if &head[..8] != MAGIC || &tail[8..] != MAGIC {
            return Err(not());
        }
        let h = u64::from_le_bytes(head[8..].try_into().expect("8 bytes"));
        let j = u64::from_le_bytes(tail[..8].try_into().expect("8 bytes"));
        if h.checked_add(j).is_none_or(|x| x > len - 32) {
            return Err(not());
        }
        let mut js = vec![0u8; j as usize];
        f.seek(SeekFrom::Start(len - 16 - j))
            .map_err(|e| Error::io(path, e))?;
        f.read_exact(&mut js).map_err(|e| Error::io(path, e))?;
        let manifest: Manifest = serde_json::from_slice(&js)
            .map_err(|e| bad(format!("fragment manifest is not valid: {e}")))?;
        if manifest.format != FORMAT || manifest.version != VERSION {
            return Err(bad(format!(
                "fragment format {} version {}; this tq reads {FORMAT} version {VERSION} (convert the shard again with this tq)",
                manifest.format, manifest.version
            )));
        }
        if 16 + h + manifest.data_len + j + 16 != len {
            return Err(bad(format!(
                "fragment holds {} bytes, its manifest says {} (truncated or damaged; rerun shard {}/{})",
                len,
                16 + h + manifest.data_len + j + 16,
                manifest.shard,
                manifest.shards
            )));
        }
        let mut header = vec![0u8; h as usize];
        f.seek(SeekFrom::Start(16))
            .map_err(|e| Error::io(path, e))?;
        f.read_exact(&mut header).map_err(|e| Error::io(path, e))?;
        if plan_id(&header, manifest.input_len) != manifest.plan {
            return Err(bad(
                "fragment header does not match its plan hash (damaged); rerun that shard".into(),
            ));
        }
        Ok(Fragment {
            path: path.to_path_buf(),
            manifest,
            header,
            data_start: 16 + h,
        })
    }
}

/// The fragments in shard order, checked to be exactly one complete set of one conversion.
pub fn check_set(paths: &[PathBuf]) -> Result<Vec<Fragment>> {
    if paths.is_empty() {
        return Err(Error::Usage("tq assemble: give the fragments".into()));
    }
    let frags = paths
        .iter()
        .map(|p| Fragment::open(p))
        .collect::<Result<Vec<_>>>()?;
    let m0 = &frags[0].manifest;
    for f in &frags[1..] {
        let m = &f.manifest;
        if m.plan != m0.plan || m.shards != m0.shards {
            return Err(Error::bad_input(
                &f.path,
                format!(
                    "fragment of another conversion than {} (plan {}…, {} shards vs plan {}…, {} shards): every shard needs the same input, flags and tq version",
                    frags[0].path.display(),
                    &m.plan[..16],
                    m.shards,
                    &m0.plan[..16],
                    m0.shards
                ),
            ));
        }
    }
    let n = m0.shards;
    let mut slots: Vec<Option<Fragment>> = (0..n).map(|_| None).collect();
    for f in frags {
        let i = f.manifest.shard;
        if i >= n {
            return Err(Error::bad_input(
                &f.path,
                format!("shard index {i} of {n} is out of range (damaged manifest)"),
            ));
        }
        if let Some(prev) = &slots[i] {
            return Err(Error::Usage(format!(
                "tq assemble: shard {i}/{n} given twice: {} and {}",
                prev.path.display(),
                f.path.display()
            )));
        }
        slots[i] = Some(f);
    }
    let missing: Vec<String> = (0..n)
        .filter(|&i| slots[i].is_none())
        .map(|i| format!("{i}/{n}"))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Usage(format!(
            "tq assemble: missing shard(s) {}: run tq convert with the same flags and --shard for each",
            missing.join(", ")
        )));
    }
    let set: Vec<Fragment> = slots.into_iter().map(|f| f.expect("checked")).collect();
    // The ranges tile the plan and the data section (a consequence of equal plans, checked
    // because a bug here would write a wrong file silently).
    let (mut next, mut at) = (0usize, 0u64);
    for f in &set {
        let m = &f.manifest;
        if m.first != next || m.data_offset != at || m.end < m.first {
            return Err(Error::bad_input(
                &f.path,
                format!(
                    "shard {}/{} covers tensors {}..{} at data offset {}, expected to start at tensor {next}, offset {at}",
                    m.shard, m.shards, m.first, m.end, m.data_offset
                ),
            ));
        }
        next = m.end;
        at += m.data_len;
    }
    let m0 = &set[0].manifest;
    if next != m0.n_tensors || at != m0.total_data_len {
        return Err(Error::Usage(format!(
            "tq assemble: the fragments cover {next} of {} tensors ({at} of {} data bytes)",
            m0.n_tensors, m0.total_data_len
        )));
    }
    Ok(set)
}

/// Replace string metadata `key`'s value in an encoded GGUF header by `value` of equal length.
fn fill_string(header: &mut [u8], key: &str, value: &str) -> Option<()> {
    let mut pat = Vec::new();
    pat.extend_from_slice(&(key.len() as u64).to_le_bytes());
    pat.extend_from_slice(key.as_bytes());
    pat.extend_from_slice(&(ValueType::String as u32).to_le_bytes());
    pat.extend_from_slice(&(value.len() as u64).to_le_bytes());
    let at = header.windows(pat.len()).position(|w| w == pat)? + pat.len();
    header
        .get_mut(at..at + value.len())?
        .copy_from_slice(value.as_bytes());
    Some(())
}

/// `tq assemble`: check the set, then write header, padding and every fragment's data into
/// `out` (atomically), checking each fragment's data against its blake3 on the way.
pub fn assemble(paths: &[PathBuf], out: &Path, on_progress: &dyn Fn(u64)) -> Result<u64> {
    let set = check_set(paths)?;
    let m0 = &set[0].manifest;
    let mut header = set[0].header.clone();
    let placeholder = crate::convert::HASH_PLACEHOLDER;
    let key = "tq.input.blake3";
    let mut probe = header.clone();
    if fill_string(&mut probe, key, placeholder).is_some() {
        // Provenance on: the header must still hold the placeholder, filled from shard 0.
        let Some(hash) = &m0.input_blake3 else {
            return Err(Error::bad_input(
                &set[0].path,
                "shard 0 carries no input hash for the provenance key tq.input.blake3 (damaged manifest); rerun shard 0",
            ));
        };
        if hash.len() != placeholder.len() || fill_string(&mut header, key, hash).is_none() {
            return Err(Error::bad_input(&set[0].path, "bad input hash in manifest"));
        }
    }
    let (target, file) = TempOutput::create(out)?;
    let tmp = target.tmp_path().to_path_buf();
    let io = |e| Error::io(&tmp, e);
    let mut w = std::io::BufWriter::with_capacity(1 << 22, file);
    w.write_all(&header).map_err(io)?;
    let hl = header.len() as u64;
    let pad = hl.div_ceil(m0.alignment) * m0.alignment - hl;
    w.write_all(&vec![0u8; pad as usize]).map_err(io)?;
    let mut done = hl + pad;
    let mut buf = vec![0u8; 1 << 22];
    for f in &set {
        let m = &f.manifest;
        let mut r = std::fs::File::open(&f.path).map_err(|e| Error::io(&f.path, e))?;
        r.seek(SeekFrom::Start(f.data_start))
            .map_err(|e| Error::io(&f.path, e))?;
        let mut left = m.data_len;
        let mut h = blake3::Hasher::new();
        while left > 0 {
            let k = (buf.len() as u64).min(left) as usize;
            r.read_exact(&mut buf[..k])
                .map_err(|e| Error::io(&f.path, e))?;
            h.update(&buf[..k]);
            w.write_all(&buf[..k]).map_err(io)?;
            left -= k as u64;
            done += k as u64;
            on_progress(done);
        }
        if h.finalize().to_hex().as_str() != m.data_blake3 {
            return Err(Error::bad_input(
                &f.path,
                format!(
                    "tensor data of shard {}/{} does not match its blake3 (damaged); rerun that shard",
                    m.shard, m.shards
                ),
            ));
        }
    }
    let f = w.into_inner().map_err(|e| io(e.into_error()))?;
    target.commit(f)?;
    Ok(done)
}
