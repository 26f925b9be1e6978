//! Input Hessians `H = Σ x xᵀ` of linear layers: accumulation (deterministic f32 tiles into f64),
//! and the safetensors file format they are saved in and loaded from.
//!
//! Numerics: `XᵀX` is computed in f32 by faer on fixed 64-column tiles (each tile single-threaded,
//! so the reduction order never depends on the thread count) and added into f64 accumulators.
//! Hessians are persisted as safetensors (F64 `[n, n]` tensors named by the weights they serve,
//! joined by `,`). The calibration that fills them lives in the `calib` room.

use crate::error::{Error, Result};
use faer::{Accum, MatRef, Par};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// One Hessian: the weights it serves, its dimension, `Σ x xᵀ` (row-major, full), token count.
#[derive(Clone, Debug)]
pub struct Hessian {
    pub tensors: Vec<String>,
    pub n: usize,
    pub h: Vec<f64>,
    pub tokens: u64,
}

#[derive(Default, Debug)]
pub struct Hessians {
    /// Keyed by the joined tensor names (stable order for files).
    pub groups: BTreeMap<String, Hessian>,
    /// First non-finite activation seen: (layer, row, tensors).
    pub non_finite: Option<String>,
    /// Window length, for naming the window of a bad row.
    pub seq: usize,
    /// Index of the first window of the current batch.
    pub window0: usize,
    /// Accumulate `XᵀX` over chunks of at most this many rows (0: the whole input at once). The
    /// f32 tile products depend on the chunking, so sequential calibration (one forward pass
    /// over all windows) uses `--batch` windows per chunk, as the batched mode does.
    pub rows_per_accum: usize,
    /// Time spent in, and floating-point operations done by, `XᵀX` (the FLOP/s report).
    pub accum_secs: f64,
    pub accum_flops: f64,
}

const TILE: usize = 64;

/// Experts that saw fewer calibration tokens than this are rounded to nearest instead of LDLQ
/// (a Hessian from a handful of tokens has too low a rank to say which directions matter).
pub const MIN_EXPERT_TOKENS: u64 = 32;

/// The Hessian-group member name of expert `e`'s slice of a 3-D expert tensor: `NAME#e`.
pub fn expert_key(name: &str, e: usize) -> String {
    format!("{name}#{e}")
}

/// The tensor a group member names (`NAME#e` → `NAME`; a plain name is itself).
pub fn tensor_of(member: &str) -> &str {
    member.split_once('#').map_or(member, |(t, _)| t)
}

impl Hessians {
    /// Expert `e`'s Hessian for a 3-D expert tensor, if that expert saw calibration tokens.
    pub fn for_expert(&self, name: &str, e: usize) -> Option<&Hessian> {
        self.for_tensor(&expert_key(name, e))
    }

    /// Some expert of this 3-D tensor has a Hessian (the block's experts come together).
    pub fn has_experts(&self, name: &str) -> bool {
        self.groups.values().any(|g| {
            g.tensors
                .iter()
                .any(|t| t.contains('#') && tensor_of(t) == name)
        })
    }

    /// The Hessian for a weight tensor, if calibrated.
    pub fn for_tensor(&self, name: &str) -> Option<&Hessian> {
        self.groups
            .values()
            .find(|g| g.tensors.iter().any(|t| t == name))
    }

    /// [`for_tensor`](Self::for_tensor), mutable (the converter moves a matrix into its factor).
    pub fn for_tensor_mut(&mut self, name: &str) -> Option<&mut Hessian> {
        self.groups
            .values_mut()
            .find(|g| g.tensors.iter().any(|t| t == name))
    }

    pub(crate) fn accumulate(&mut self, tensors: &[&str], x: &[f32], rows: usize, cols: usize) {
        let key = tensors.join(",");
        let g = self.groups.entry(key).or_insert_with(|| Hessian {
            tensors: tensors.iter().map(|s| s.to_string()).collect(),
            n: cols,
            h: vec![0f64; cols * cols],
            tokens: 0,
        });
        let t_start = std::time::Instant::now();
        let xm = MatRef::from_row_major_slice(x, rows, cols);
        // Column tiles of H = XᵀX, each computed single-threaded: deterministic for any pool size.
        // H is symmetric, so tile t (columns c0..c0+w) computes only rows c0.. (the diagonal
        // block and what lies below it): a symmetric rank-k update, half the flops of XᵀX; the
        // lower values are mirrored above the diagonal. Tiles are computed a few per thread at a
        // time and added before the next ones, so the transient f32 products are
        // `2 · threads · 64 · cols` values, not a whole `cols²` matrix (3.3 GB for a 70B
        // model's FFN input). Each element of H is added to once per call, so the batching does
        // not change a bit.
        let n_tiles = cols.div_ceil(TILE);
        let batch = 2 * rayon::current_num_threads().max(1);
        let mut t0 = 0;
        while t0 < n_tiles {
            let t1 = (t0 + batch).min(n_tiles);
            let tiles: Vec<(usize, Vec<f32>)> = (t0..t1)
                .into_par_iter()
                .map(|t| {
                    let c0 = t * TILE;
                    let w = TILE.min(cols - c0);
                    let m = cols - c0;
                    let mut out = faer::Mat::<f32>::zeros(m, w);
                    faer::linalg::matmul::matmul(
                        out.as_mut(),
                        Accum::Replace,
                        xm.subcols(c0, m).transpose(),
                        xm.subcols(c0, w),
                        1.0f32,
                        Par::Seq,
                    );
                    let mut v = vec![0f32; m * w];
                    for i in 0..m {
                        for j in 0..w {
                            v[i * w + j] = out[(i, j)];
                        }
                    }
                    (c0, v)
                })
                .collect();
            for (c0, v) in tiles {
                let w = TILE.min(cols - c0);
                let m = cols - c0;
                for i in 0..m {
                    // Row c0 + i, columns c0..c0+w: on or below the diagonal when j <= i.
                    for j in 0..w.min(i + 1) {
                        let d = v[i * w + j] as f64;
                        let (r, c) = (c0 + i, c0 + j);
                        g.h[r * cols + c] += d;
                        if r != c {
                            g.h[c * cols + r] += d;
                        }
                    }
                }
            }
            t0 = t1;
        }
        self.accum_secs += t_start.elapsed().as_secs_f64();
        self.accum_flops += (0..n_tiles)
            .map(|t| {
                let c0 = t * TILE;
                2.0 * rows as f64 * (cols - c0) as f64 * TILE.min(cols - c0) as f64
            })
            .sum::<f64>();
        g.tokens += rows as u64;
    }

    /// Write all Hessians (temp file + rename) with `meta` as safetensors `__metadata__`, in key
    /// order, as `store`.
    pub fn save(&self, path: &Path, meta: &BTreeMap<String, String>, store: Store) -> Result<()> {
        let index: Vec<&Hessian> = self.groups.values().collect();
        let mut w = HessianWriter::create(path, &index, meta, store, WriteMode::Once)?;
        for g in self.groups.values() {
            w.write(g)?;
        }
        w.finish()
    }

    /// Read a Hessian file written by [`save`](Self::save) whole; returns it and its metadata.
    pub fn load(path: &Path) -> Result<(Hessians, BTreeMap<String, String>)> {
        let (file, meta) = HessianFile::open(path)?;
        let mut hs = Hessians::default();
        for k in file.index.groups.keys() {
            hs.groups.insert(k.clone(), file.load_group(k)?);
        }
        Ok((hs, meta))
    }

    /// Each group's diagonal (what an importance matrix keeps).
    pub fn diagonals(&self) -> Vec<Diagonal> {
        self.groups
            .values()
            .map(|g| Diagonal {
                tensors: g.tensors.clone(),
                tokens: g.tokens,
                d: (0..g.n).map(|i| g.h[i * g.n + i]).collect(),
            })
            .collect()
    }
}

/// A Hessian's diagonal `Σ x_i²` (llama.cpp's importance matrix is this, per input column).
#[derive(Clone, Debug, PartialEq)]
pub struct Diagonal {
    pub tensors: Vec<String>,
    pub tokens: u64,
    pub d: Vec<f64>,
}

/// How a Hessian file stores each matrix (`tq calib --store`). The accumulators are f64 in
/// every case; the store is what reaches the disk and comes back as f64 for LDLQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Store {
    /// F64 `[n, n]`: the accumulators exactly (8n² bytes).
    #[default]
    F64,
    /// F32 `[n, n]`: half the bytes; any safetensors reader sees the square matrix.
    F32,
    /// F32, the upper triangle row by row (`j ≥ i`) as one `[n(n+1)/2]` tensor: a quarter of
    /// F64 (a Llama-2-7B file: 11 GB instead of 44 GB). `H` is symmetric, so nothing is lost
    /// beyond the f32 rounding.
    F32Upper,
}

impl Store {
    /// The metadata key naming the store (informative: readers go by dtype and shape).
    pub const META: &'static str = "tq.hessian_store";

    pub fn name(self) -> &'static str {
        match self {
            Store::F64 => "f64",
            Store::F32 => "f32",
            Store::F32Upper => "f32-upper",
        }
    }

    pub fn parse(s: &str) -> Result<Store> {
        match s {
            "f64" => Ok(Store::F64),
            "f32" => Ok(Store::F32),
            "f32-upper" => Ok(Store::F32Upper),
            _ => Err(Error::Usage(format!(
                "unknown Hessian store '{s}': use f64, f32 or f32-upper"
            ))),
        }
    }

    /// `v` as the store keeps it.
    fn round(self, v: f64) -> f64 {
        match self {
            Store::F64 => v,
            Store::F32 | Store::F32Upper => v as f32 as f64,
        }
    }

    /// Bytes of one `n × n` matrix.
    pub fn bytes(self, n: usize) -> usize {
        match self {
            Store::F64 => n * n * 8,
            Store::F32 => n * n * 4,
            Store::F32Upper => n * (n + 1) / 2 * 4,
        }
    }

    fn tensor_json(self, n: usize, off: usize) -> serde_json::Value {
        let (dtype, shape) = match self {
            Store::F64 => ("F64", vec![n, n]),
            Store::F32 => ("F32", vec![n, n]),
            Store::F32Upper => ("F32", vec![n * (n + 1) / 2]),
        };
        serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + self.bytes(n)]})
    }

    /// Row `i` of `h` (`n × n`, row-major) as stored.
    fn encode_row(self, h: &[f64], n: usize, i: usize, out: &mut Vec<u8>) {
        let row = &h[i * n..(i + 1) * n];
        match self {
            Store::F64 => row.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Store::F32 => row
                .iter()
                .for_each(|&v| out.extend((v as f32).to_le_bytes())),
            Store::F32Upper => row[i..]
                .iter()
                .for_each(|&v| out.extend((v as f32).to_le_bytes())),
        }
    }

    /// The store of a file's tensor (dtype and shape), and the matrix dimension.
    fn of_tensor(dtype: safetensors::Dtype, shape: &[usize]) -> Option<(Store, usize)> {
        use safetensors::Dtype;
        match (dtype, shape) {
            (Dtype::F64, &[a, b]) if a == b => Some((Store::F64, a)),
            (Dtype::F32, &[a, b]) if a == b => Some((Store::F32, a)),
            (Dtype::F32, &[m]) => {
                // n(n+1)/2 = m
                let n = (((8 * m + 1) as f64).sqrt() as usize).saturating_sub(1) / 2;
                (n..n + 2)
                    .find(|&n| n * (n + 1) / 2 == m && n > 0)
                    .map(|n| (Store::F32Upper, n))
            }
            _ => None,
        }
    }

    /// The full f64 matrix from a tensor's bytes (upper triangles are mirrored).
    fn decode(self, b: &[u8], n: usize) -> Vec<f64> {
        let f32s = || {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
        };
        match self {
            Store::F64 => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            Store::F32 => f32s().collect(),
            Store::F32Upper => {
                let mut h = vec![0f64; n * n];
                let mut it = f32s();
                for i in 0..n {
                    for j in i..n {
                        let v = it.next().expect("n(n+1)/2 values");
                        h[i * n + j] = v;
                        h[j * n + i] = v;
                    }
                }
                h
            }
        }
    }

    /// Byte offset of element `(i, i)` within a stored matrix, and its width.
    fn diag_offset(self, n: usize, i: usize) -> (usize, usize) {
        match self {
            Store::F64 => ((i * n + i) * 8, 8),
            Store::F32 => ((i * n + i) * 4, 4),
            // Rows 0..i hold n, n − 1, …, n − i + 1 values; (i, i) starts row i.
            Store::F32Upper => ((i * n - (i * i - i) / 2) * 4, 4),
        }
    }
}

/// How a [`HessianWriter`] keeps its partial file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// A temporary file, removed unless finished (a file written in one go).
    Once,
    /// `.NAME.tq-partial` with a checkpoint beside it after each [`HessianWriter::checkpoint`];
    /// `resume` continues a matching one (`quiet`: no notice when there is none to continue).
    Resumable { resume: bool, quiet: bool },
}

/// A Hessian file written group by group as calibration finishes each block, so a run holds one
/// block's Hessians, not the file. The layout (every group's offset) is known before the first
/// matrix is ready, so the safetensors header goes first and the data is appended in the order
/// given at creation. Resumable: after [`checkpoint`](Self::checkpoint) the partial file and a
/// JSON checkpoint beside it survive `kill -9`; [`create`](Self::create) with a resume key
/// continues there (the header must be the same bytes: same model, text, flags, store).
pub struct HessianWriter {
    out: crate::io::TempOutput,
    file: std::fs::File,
    /// Groups in file order: key, dimension, tokens, data offset (from the data section).
    order: Vec<(String, usize, u64, u64)>,
    store: Store,
    /// Groups written (a prefix of `order`), and the file length they fill.
    next: usize,
    pos: u64,
    data_start: u64,
    /// The header's hash: what a checkpoint must match.
    key: String,
    checkpoint: std::path::PathBuf,
    /// Diagonals of the groups written (for an imatrix), in file order.
    diagonals: Vec<Diagonal>,
    /// File offsets of the expert groups' token-count placeholders, by group index.
    slots: std::collections::HashMap<usize, u64>,
}

/// Digits of an expert group's token count in the header (a `u64` fits).
const TOKEN_SLOT: usize = 20;

impl HessianWriter {
    /// Start (or continue, see [`WriteMode`]) the file `path` holding `groups` (their `tensors`,
    /// `n`, `tokens`; `h` unused) in this order, with `meta` (token counts and the store are
    /// added).
    pub fn create(
        path: &Path,
        groups: &[&Hessian],
        meta: &BTreeMap<String, String>,
        store: Store,
        mode: WriteMode,
    ) -> Result<HessianWriter> {
        let mut header = serde_json::Map::new();
        let mut m: serde_json::Map<String, serde_json::Value> = meta
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        m.insert(Store::META.into(), store.name().into());
        let (mut off, mut order) = (0usize, Vec::with_capacity(groups.len()));
        for g in groups {
            let k = g.tensors.join(",");
            // Expert groups (`TENSOR#e`): their token counts are known only when their block
            // ends, after the header is written, so the header holds a fixed-width placeholder
            // that `write` overwrites in place.
            let tokens = if k.contains('#') {
                format!("{:0w$}", 0, w = TOKEN_SLOT)
            } else {
                g.tokens.to_string()
            };
            m.insert(format!("tokens:{k}"), tokens.into());
            header.insert(k.clone(), store.tensor_json(g.n, off));
            order.push((k, g.n, g.tokens, off as u64));
            off += store.bytes(g.n);
        }
        header.insert("__metadata__".into(), serde_json::Value::Object(m));
        let mut js = serde_json::to_vec(&serde_json::Value::Object(header)).map_err(|e| {
            Error::internal(format!("JSON encoding of the Hessian header failed: {e}"))
        })?;
        while js.len() % 8 != 0 {
            js.push(b' ');
        }
        let data_start = 8 + js.len() as u64;
        let mut slots = std::collections::HashMap::new();
        for (i, (k, ..)) in order.iter().enumerate() {
            if k.contains('#') {
                let pat = serde_json::to_string(&format!("tokens:{k}")).expect("a string") + ":\"";
                let at = js.windows(pat.len()).position(|w| w == pat.as_bytes());
                let at = at
                    .ok_or_else(|| Error::internal(format!("{k}: token slot not in the header")))?;
                slots.insert(i, 8 + (at + pat.len()) as u64);
            }
        }
        let key = format!(
            "{}:{}",
            env!("CARGO_PKG_VERSION"),
            blake3::hash(&js).to_hex()
        );
        let partial = crate::io::partial_path(path)?;
        let checkpoint = crate::io::checkpoint_path(&partial);
        let start = match mode {
            WriteMode::Resumable {
                resume: true,
                quiet,
            } => resume_point(path, &partial, &checkpoint, &key, &order, quiet)?,
            _ => None,
        };
        let (out, mut file) = match mode {
            WriteMode::Resumable { .. } => {
                crate::io::TempOutput::create_resumable(path, start.map(|(_, pos)| pos))?
            }
            WriteMode::Once => crate::io::TempOutput::create(path)?,
        };
        let (next, pos) = match start {
            Some(s) => s,
            None => {
                use std::io::Write;
                let io = |e| Error::io(out.tmp_path(), e);
                file.write_all(&(js.len() as u64).to_le_bytes())
                    .map_err(io)?;
                file.write_all(&js).map_err(io)?;
                (0, data_start)
            }
        };
        let mut w = HessianWriter {
            out,
            file,
            order,
            store,
            next,
            pos,
            data_start,
            key,
            checkpoint,
            diagonals: Vec::new(),
            slots,
        };
        // A resumed file: the expert groups already written have their counts in its header.
        for i in 0..next {
            if let Some(&at) = w.slots.get(&i) {
                let mut b = [0u8; TOKEN_SLOT];
                read_at(w.out.tmp_path(), at, &mut b)?;
                w.order[i].2 = std::str::from_utf8(&b)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| {
                        Error::bad_input(
                            w.out.tmp_path(),
                            "corrupt token count in the partial Hessian file; run without --resume",
                        )
                    })?;
            }
        }
        for i in 0..next {
            let d = w.read_diagonal(i)?;
            w.diagonals.push(d);
        }
        Ok(w)
    }

    /// Groups already in the file (a resumed run skips them).
    pub fn written(&self) -> usize {
        self.next
    }

    /// Is the group `key` in the file already?
    pub fn is_written(&self, key: &str) -> bool {
        self.order[..self.next].iter().any(|(k, ..)| k == key)
    }

    /// Append the next group (it must be the next in the creation order).
    pub fn write(&mut self, g: &Hessian) -> Result<()> {
        use std::io::Write;
        let key = g.tensors.join(",");
        let Some((k, n, tokens, off)) = self.order.get(self.next) else {
            return Err(Error::internal(format!(
                "{}: Hessian {key} written past the file's last group",
                self.out.final_path().display()
            )));
        };
        let slot = self.slots.get(&self.next).copied();
        if *k != key
            || *n != g.n
            || (slot.is_none() && *tokens != g.tokens)
            || g.h.len() != g.n * g.n
        {
            return Err(Error::internal(format!(
                "{}: Hessian {key} ({} × {}, {} tokens) is not the expected next group {k} ({n} × {n}, {tokens} tokens)",
                self.out.final_path().display(),
                g.n,
                g.n,
                g.tokens
            )));
        }
        debug_assert_eq!(self.pos, self.data_start + off);
        let tmp = self.out.tmp_path().to_path_buf();
        let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut self.file);
        let mut row = Vec::with_capacity(g.n * 8);
        for i in 0..g.n {
            row.clear();
            self.store.encode_row(&g.h, g.n, i, &mut row);
            w.write_all(&row).map_err(|e| Error::io(&tmp, e))?;
        }
        w.flush().map_err(|e| Error::io(&tmp, e))?;
        drop(w);
        // Test hook (TQ_TEST_DATA_DELAY_MS): widen the window before the checkpoint.
        crate::io::hooks::pause(crate::io::hooks::Pause::Data);
        if let Some(at) = slot {
            use std::os::unix::fs::FileExt;
            let digits = format!("{:0w$}", g.tokens, w = TOKEN_SLOT);
            self.file
                .write_all_at(digits.as_bytes(), at)
                .map_err(|e| Error::io(&tmp, e))?;
            self.order[self.next].2 = g.tokens;
        }
        self.pos += self.store.bytes(g.n) as u64;
        self.next += 1;
        self.diagonals.push(Diagonal {
            tensors: g.tensors.clone(),
            tokens: g.tokens,
            d: (0..g.n)
                .map(|i| self.store.round(g.h[i * g.n + i]))
                .collect(),
        });
        Ok(())
    }

    /// Make what is written durable and record it: a run killed after this resumes here.
    pub fn checkpoint(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(self.out.tmp_path(), e))?;
        let c = serde_json::json!({"tq_hessian_checkpoint": 1, "key": self.key, "next": self.next, "pos": self.pos});
        crate::io::write_file(&self.checkpoint, c.to_string().as_bytes())?;
        if self.next < self.order.len() {
            // Test hook (TQ_CALIB_ABORT_AFTER): stop here, with blocks left, as kill -9 would.
            crate::io::hooks::kill_point(crate::io::hooks::KillPoint::CalibCheckpoint);
        }
        Ok(())
    }

    /// A reader of the groups written so far.
    pub fn reader(&self) -> HessianReader {
        HessianReader {
            path: self.out.tmp_path().to_path_buf(),
            order: self.order[..self.next].to_vec(),
            store: self.store,
            data_start: self.data_start,
        }
    }

    fn read_diagonal(&self, i: usize) -> Result<Diagonal> {
        let (key, n, tokens, off) = &self.order[i];
        let mut d = Vec::with_capacity(*n);
        for j in 0..*n {
            let (o, w) = self.store.diag_offset(*n, j);
            let mut b = [0u8; 8];
            read_at(
                self.out.tmp_path(),
                self.data_start + off + o as u64,
                &mut b[..w],
            )?;
            d.push(if w == 8 {
                f64::from_le_bytes(b)
            } else {
                f32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as f64
            });
        }
        Ok(Diagonal {
            tensors: key.split(',').map(str::to_string).collect(),
            tokens: *tokens,
            d,
        })
    }

    /// The diagonals of every group written, as stored (for `--imatrix-out`).
    pub fn diagonals(&self) -> &[Diagonal] {
        &self.diagonals
    }

    /// Every group written: fsync, rename into place, remove the checkpoint.
    pub fn finish(self) -> Result<()> {
        if let Some((k, ..)) = self.order.get(self.next) {
            return Err(Error::internal(format!(
                "{}: the calibration produced no Hessian for {k} (the runtime does not read it)",
                self.out.final_path().display()
            )));
        }
        self.out.commit(self.file)
    }
}

fn read_at(path: &Path, pos: u64, buf: &mut [u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    std::fs::File::open(path)
        .and_then(|f| f.read_exact_at(buf, pos))
        .map_err(|e| Error::io(path, e))
}

/// The groups a [`HessianWriter`] had written when [`HessianWriter::reader`] was called, read
/// back from its (partial) file: sequential calibration replays the quantization of the blocks
/// a resumed run skips.
pub struct HessianReader {
    path: std::path::PathBuf,
    order: Vec<(String, usize, u64, u64)>,
    store: Store,
    data_start: u64,
}

impl HessianReader {
    /// The group `key` in full, or `None` if it was not written.
    pub fn read_back(&self, key: &str) -> Result<Option<Hessian>> {
        let Some((_, n, tokens, off)) = self.order.iter().find(|(k, ..)| k == key) else {
            return Ok(None);
        };
        let mut b = vec![0u8; self.store.bytes(*n)];
        read_at(&self.path, self.data_start + off, &mut b)?;
        Ok(Some(Hessian {
            tensors: key.split(',').map(str::to_string).collect(),
            n: *n,
            h: self.store.decode(&b, *n),
            tokens: *tokens,
        }))
    }
}

/// Where a resumed writer continues: `(groups written, file length)` from a matching
/// checkpoint, or `None` (start afresh, with a notice) when there is none.
fn resume_point(
    path: &Path,
    partial: &Path,
    checkpoint: &Path,
    key: &str,
    order: &[(String, usize, u64, u64)],
    quiet: bool,
) -> Result<Option<(usize, u64)>> {
    let say = |s: String| {
        if !quiet {
            eprintln!("{s}");
        }
    };
    let bytes = match std::fs::read(checkpoint) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            say(format!(
                "tq calib: --resume: no checkpoint {} (the run stopped before its first block, or finished); starting from the beginning",
                checkpoint.display()
            ));
            return Ok(None);
        }
        Err(e) => return Err(Error::io(checkpoint, e)),
    };
    if !partial.exists() {
        say(format!(
            "tq calib: --resume: the partial output of {} is gone; starting from the beginning",
            path.display()
        ));
        return Ok(None);
    }
    let bad = || {
        Error::bad_input(
            checkpoint,
            "not a tq calib checkpoint; delete it, or run without --resume to start over",
        )
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if v["tq_hessian_checkpoint"] != 1 {
        return Err(bad());
    }
    let next = v["next"].as_u64().ok_or_else(bad)? as usize;
    let pos = v["pos"].as_u64().ok_or_else(bad)?;
    if v["key"].as_str() != Some(key) || next > order.len() {
        return Err(Error::Usage(format!(
            "{}: checkpoint is for another model, text, --ctx, --batch, --store or quantization (--sequential, --weights, --recipe, --ldlq-band, --damp), or another tq version; rerun the same command, or drop --resume to start over",
            checkpoint.display()
        )));
    }
    Ok(Some((next, pos)))
}

/// A Hessian file opened lazily: the groups' names, dimensions and token counts are read from
/// the header ([`HessianFile::index`], `h` empty); each group's matrix is read when asked for
/// and its pages dropped after, so using a file costs one group in memory, not the file.
pub struct HessianFile {
    file: crate::source::st::SafetensorsFile,
    /// Every group with `h` empty.
    pub index: Hessians,
    /// The groups' keys in file order.
    pub order: Vec<String>,
    stores: BTreeMap<String, Store>,
}

impl HessianFile {
    pub fn open(path: &Path) -> Result<(HessianFile, BTreeMap<String, String>)> {
        let file = crate::source::st::SafetensorsFile::open(path)?;
        let meta: BTreeMap<String, String> = file.metadata.iter().cloned().collect();
        let mut index = Hessians::default();
        let (mut order, mut stores) = (Vec::new(), BTreeMap::new());
        for t in &file.tensors {
            let Some((store, n)) = Store::of_tensor(t.dtype, &t.shape) else {
                return Err(Error::bad_input(
                    path,
                    format!(
                        "tensor '{}' is not a Hessian (a square F64/F32 matrix or an F32 upper triangle)",
                        t.name
                    ),
                ));
            };
            let tokens = meta
                .get(&format!("tokens:{}", t.name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            index.groups.insert(
                t.name.clone(),
                Hessian {
                    tensors: t.name.split(',').map(str::to_string).collect(),
                    n,
                    h: Vec::new(),
                    tokens,
                },
            );
            order.push(t.name.clone());
            stores.insert(t.name.clone(), store);
        }
        Ok((
            HessianFile {
                file,
                index,
                order,
                stores,
            },
            meta,
        ))
    }

    /// How the group `key` is stored.
    pub fn store(&self, key: &str) -> Option<Store> {
        self.stores.get(key).copied()
    }

    /// The group stored under `key` (its tensor names joined by `,`), read in full.
    pub fn load_group(&self, key: &str) -> Result<Hessian> {
        let g = self.index.groups.get(key).ok_or_else(|| {
            Error::bad_input(&self.file.path, format!("no Hessian group '{key}'"))
        })?;
        let t = self
            .file
            .tensors
            .iter()
            .find(|t| t.name == key)
            .expect("indexed from the file");
        let h = self.stores[key].decode(self.file.tensor_data(t), g.n);
        self.file.release(t);
        if let Some(i) = h.iter().position(|v| !v.is_finite()) {
            return Err(Error::bad_input(
                &self.file.path,
                format!(
                    "Hessian '{key}' holds a non-finite value ({}) at row {}, column {}: the file is damaged; make it again with tq calib",
                    h[i],
                    i / g.n,
                    i % g.n
                ),
            ));
        }
        Ok(Hessian { h, ..g.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulate_matches_naive_and_round_trips() {
        let (rows, cols) = (37, 70);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 211) as f32 / 50.0 - 2.0)
            .collect();
        let mut hs = Hessians::default();
        hs.accumulate(&["a.weight", "b.weight"], &x, rows, cols);
        hs.accumulate(&["a.weight", "b.weight"], &x, rows, cols);
        let g = hs.for_tensor("b.weight").unwrap();
        for i in 0..cols {
            for j in 0..cols {
                let naive: f64 = (0..rows)
                    .map(|r| x[r * cols + i] as f64 * x[r * cols + j] as f64)
                    .sum::<f64>()
                    * 2.0;
                assert!(
                    (g.h[i * cols + j] - naive).abs() < 1e-3 * naive.abs().max(1.0),
                    "{i},{j}"
                );
            }
        }
        assert_eq!(g.tokens, 2 * rows as u64);
        // Symmetric by construction (the upper triangle mirrors the lower).
        for i in 0..cols {
            for j in 0..i {
                assert_eq!(g.h[i * cols + j].to_bits(), g.h[j * cols + i].to_bits());
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.safetensors");
        let meta = BTreeMap::from([("tq.ctx".to_string(), "8".to_string())]);
        hs.save(&p, &meta, Store::F64).unwrap();
        let (back, m) = Hessians::load(&p).unwrap();
        assert_eq!(m["tq.ctx"], "8");
        let b = back.for_tensor("a.weight").unwrap();
        assert_eq!(b.h, g.h);
        assert_eq!(b.tokens, g.tokens);
        // Same result under another thread count.
        let mut h2 = Hessians::default();
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| {
                h2.accumulate(&["a.weight", "b.weight"], &x, rows, cols);
                h2.accumulate(&["a.weight", "b.weight"], &x, rows, cols);
            });
        assert_eq!(h2.for_tensor("a.weight").unwrap().h, g.h);
    }
}
