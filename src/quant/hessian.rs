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
}

const TILE: usize = 64;

impl Hessians {
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
        let xm = MatRef::from_row_major_slice(x, rows, cols);
        // Column tiles of H = XᵀX, each computed single-threaded: deterministic for any pool size.
        // Tiles are computed a few per thread at a time and added before the next ones, so the
        // transient f32 products are `2 · threads · 64 · cols` values, not a whole `cols²` matrix
        // (3.3 GB for a 70B model's FFN input). Each element of H is added to once per call, so
        // the batching does not change a bit.
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
                    let mut out = faer::Mat::<f32>::zeros(cols, w);
                    faer::linalg::matmul::matmul(
                        out.as_mut(),
                        Accum::Replace,
                        xm.transpose(),
                        xm.subcols(c0, w),
                        1.0f32,
                        Par::Seq,
                    );
                    let mut v = vec![0f32; cols * w];
                    for i in 0..cols {
                        for j in 0..w {
                            v[i * w + j] = out[(i, j)];
                        }
                    }
                    (c0, v)
                })
                .collect();
            for (c0, v) in tiles {
                let w = v.len() / cols;
                for i in 0..cols {
                    for j in 0..w {
                        g.h[i * cols + c0 + j] += v[i * w + j] as f64;
                    }
                }
            }
            t0 = t1;
        }
        g.tokens += rows as u64;
    }

    /// Write all Hessians (temp file + rename) with `meta` as safetensors `__metadata__`.
    pub fn save(&self, path: &Path, meta: &BTreeMap<String, String>) -> Result<()> {
        let mut header = serde_json::Map::new();
        let mut m: serde_json::Map<String, serde_json::Value> = meta
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        let mut off = 0usize;
        for (k, g) in &self.groups {
            m.insert(format!("tokens:{k}"), g.tokens.to_string().into());
            let len = g.n * g.n * 8;
            header.insert(k.clone(), serde_json::json!({"dtype": "F64", "shape": [g.n, g.n], "data_offsets": [off, off + len]}));
            off += len;
        }
        header.insert("__metadata__".into(), serde_json::Value::Object(m));
        let mut js = serde_json::to_vec(&serde_json::Value::Object(header))
            .map_err(|e| Error::Usage(e.to_string()))?;
        while js.len() % 8 != 0 {
            js.push(b' ');
        }
        let (target, f) = crate::io::TempOutput::create(path)?;
        let tmp = target.tmp_path().to_path_buf();
        use std::io::Write;
        let mut w = std::io::BufWriter::new(f);
        let io = |e| Error::io(&tmp, e);
        w.write_all(&(js.len() as u64).to_le_bytes()).map_err(io)?;
        w.write_all(&js).map_err(io)?;
        for g in self.groups.values() {
            for v in &g.h {
                w.write_all(&v.to_le_bytes()).map_err(io)?;
            }
        }
        let f = w
            .into_inner()
            .map_err(|e| Error::io(&tmp, e.into_error()))?;
        target.commit(f)
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
}

/// A Hessian file opened lazily: the groups' names, dimensions and token counts are read from
/// the header ([`HessianFile::index`], `h` empty); each group's matrix is read when asked for
/// and its pages dropped after, so using a file costs one group in memory, not the file.
pub struct HessianFile {
    file: crate::source::st::SafetensorsFile,
    /// Every group with `h` empty.
    pub index: Hessians,
}

impl HessianFile {
    pub fn open(path: &Path) -> Result<(HessianFile, BTreeMap<String, String>)> {
        let file = crate::source::st::SafetensorsFile::open(path)?;
        let meta: BTreeMap<String, String> = file.metadata.iter().cloned().collect();
        let mut index = Hessians::default();
        for t in &file.tensors {
            if t.dtype != safetensors::Dtype::F64 || t.shape.len() != 2 || t.shape[0] != t.shape[1]
            {
                return Err(Error::bad_input(
                    path,
                    format!("tensor '{}' is not a square F64 Hessian", t.name),
                ));
            }
            let tokens = meta
                .get(&format!("tokens:{}", t.name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            index.groups.insert(
                t.name.clone(),
                Hessian {
                    tensors: t.name.split(',').map(str::to_string).collect(),
                    n: t.shape[0],
                    h: Vec::new(),
                    tokens,
                },
            );
        }
        Ok((HessianFile { file, index }, meta))
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
        let h = self
            .file
            .tensor_data(t)
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        self.file.release(t);
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
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.safetensors");
        let meta = BTreeMap::from([("tq.ctx".to_string(), "8".to_string())]);
        hs.save(&p, &meta).unwrap();
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
