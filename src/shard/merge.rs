//! `tq calib merge`: Hessian shards from `tq calib --shard I/N` → one Hessian file; and
//! [`shard_windows`], which windows such a shard calibrates on and the metadata it records.
//!
//! Each shard holds `Σ XᵀX` over its windows (whole `--batch` chunks, so every f32 tile product
//! is the one-process run's, bit for bit), accumulated in f64 from zero. The merge adds the
//! shards' matrices element by element in shard order, `((H₀ + H₁) + H₂) + …`, whatever the
//! order of the files on the command line. f64 addition is not associative, so this differs
//! from the one-process sum `(((0 + T₀) + T₁) + …)` over the batch tiles `Tₖ` at the level of
//! rounding (measured: docs/bench/sharding.md); one shard (`0/1`) gives the one-process file's
//! values exactly. The output is written group by group, in shard 0's order and store: memory
//! is two groups, not the file.

use super::Shard;
use crate::error::{Error, Result};
use crate::quant::HessianFile;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Metadata keys a shard carries besides a one-process file's.
pub const META_SHARD: &str = "tq.shard";
pub const META_FINGERPRINT: &str = "tq.shard.fingerprint";
pub const META_WINDOWS: &str = "tq.shard.windows";
pub const META_WINDOWS_TOTAL: &str = "tq.shard.windows_total";

/// What identifies a whole calibration (`tq calib`'s own checkpoint fingerprint): the model's
/// file name and length, the blake3 of all windows' tokens, and the window length.
pub fn fingerprint(model_name: &str, model_len: u64, windows: &[u32], ctx: usize) -> String {
    let bytes: Vec<u8> = windows.iter().flat_map(|t| t.to_le_bytes()).collect();
    format!(
        "{model_name}:{model_len}:{}:{ctx}",
        blake3::hash(&bytes).to_hex()
    )
}

/// The metadata a shard adds: which shard, which windows, and the whole run's fingerprint.
pub fn shard_meta(
    shard: Shard,
    windows: std::ops::Range<usize>,
    n_win: usize,
    fingerprint: &str,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (META_SHARD.to_string(), shard.to_string()),
        (META_FINGERPRINT.to_string(), fingerprint.to_string()),
        (
            META_WINDOWS.to_string(),
            format!("{}..{}", windows.start, windows.end),
        ),
        (META_WINDOWS_TOTAL.to_string(), n_win.to_string()),
    ])
}

/// `tq calib --shard I/N` (`s`): this shard's windows of all `windows` (whole batches of
/// `batch` windows of `ctx` tokens) of the model at `model` (opened as `f`), with the whole run's
/// fingerprint and the window range recorded in `meta` for `tq calib merge`. This is the
/// calibration's `calib::job::ShardWindows`.
pub fn shard_windows(
    s: &str,
    model: &Path,
    f: &crate::gguf::GgufFile,
    ctx: usize,
    batch: usize,
    windows: Vec<u32>,
    meta: &mut BTreeMap<String, String>,
) -> Result<Vec<u32>> {
    let shard = Shard::parse(s)?;
    let n_win = windows.len() / ctx;
    let r = shard.window_range(n_win, batch).ok_or_else(|| {
        Error::Usage(format!(
            "tq calib --shard {shard}: {n_win} windows make {} batches of --batch {}; use at most that many shards",
            n_win.div_ceil(batch),
            batch
        ))
    })?;
    let name = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let fp = fingerprint(&name, f.file_len(), &windows, ctx);
    meta.extend(shard_meta(shard, r.clone(), n_win, &fp));
    Ok(windows[r.start * ctx..r.end * ctx].to_vec())
}

#[derive(Debug)]
pub struct Merged {
    pub shards: usize,
    pub groups: usize,
    pub windows: usize,
}

/// Merge `paths` (a complete set of shards of one calibration, any order) into `out`.
pub fn merge(paths: &[PathBuf], out: &Path) -> Result<Merged> {
    if paths.is_empty() {
        return Err(Error::Usage("tq calib merge: give the shard files".into()));
    }
    let mut opened = Vec::new();
    for p in paths {
        let (f, meta) = HessianFile::open(p)?;
        let get = |k: &str| meta.get(k).cloned();
        let shard = get(META_SHARD).ok_or_else(|| {
            Error::bad_input(
                p,
                "not a calibration shard (no tq.shard key): give the files of tq calib --shard I/N",
            )
        })?;
        let shard = Shard::parse(&shard)
            .map_err(|_| Error::bad_input(p, format!("bad tq.shard value '{shard}'")))?;
        if get("tq.complete").as_deref() != Some("true") {
            return Err(Error::bad_input(
                p,
                format!(
                    "shard {shard} is an interrupted checkpoint; finish it with the same tq calib command plus --resume"
                ),
            ));
        }
        opened.push((p.clone(), shard, f, meta));
    }
    // Same calibration: model, tokens, --ctx (the fingerprint), --batch, options, shard count.
    let same = |m: &BTreeMap<String, String>| {
        [
            META_FINGERPRINT,
            META_WINDOWS_TOTAL,
            "tq.batch",
            "tq.ctx",
            "tq.sequential",
            "tq.source",
            "tq.model",
        ]
        .map(|k| m.get(k).cloned())
    };
    let (p0, s0, _, m0) = &opened[0];
    for (p, s, _, m) in &opened[1..] {
        if s.count != s0.count || same(m) != same(m0) {
            return Err(Error::bad_input(
                p,
                format!(
                    "shard {s} is of another calibration than {} (shard {s0}): model, text, --tokens, --ctx, --batch and the shard count must be the same",
                    p0.display()
                ),
            ));
        }
    }
    let n = s0.count;
    let mut slots: Vec<Option<usize>> = vec![None; n];
    for (k, (p, s, _, _)) in opened.iter().enumerate() {
        if let Some(j) = slots[s.index] {
            return Err(Error::Usage(format!(
                "tq calib merge: shard {s} given twice: {} and {}",
                opened[j].0.display(),
                p.display()
            )));
        }
        slots[s.index] = Some(k);
    }
    let missing: Vec<String> = (0..n)
        .filter(|&i| slots[i].is_none())
        .map(|i| format!("{i}/{n}"))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Usage(format!(
            "tq calib merge: missing shard(s) {}: run tq calib with the same flags and --shard for each",
            missing.join(", ")
        )));
    }
    let order: Vec<usize> = slots.into_iter().map(|s| s.expect("checked")).collect();
    // The windows of the shards tile 0..total in order.
    let total: usize = m0[META_WINDOWS_TOTAL]
        .parse()
        .map_err(|_| Error::bad_input(p0, "bad tq.shard.windows_total"))?;
    let mut next = 0usize;
    for &k in &order {
        let (p, s, _, m) = &opened[k];
        let want = format!("{next}..");
        let w = m.get(META_WINDOWS).cloned().unwrap_or_default();
        let end = w
            .strip_prefix(&want)
            .and_then(|e| e.parse::<usize>().ok())
            .ok_or_else(|| {
                Error::bad_input(
                    p,
                    format!("shard {s} holds windows {w}, expected to start at window {next}"),
                )
            })?;
        next = end;
    }
    if next != total {
        return Err(Error::Usage(format!(
            "tq calib merge: the shards hold windows 0..{next} of {total}"
        )));
    }
    // The same groups with the same dimensions in every shard.
    let first = &opened[order[0]].2.index;
    for &k in &order[1..] {
        let (p, s, f, _) = &opened[k];
        let a: Vec<_> = first.groups.iter().map(|(k, g)| (k, g.n)).collect();
        let b: Vec<_> = f.index.groups.iter().map(|(k, g)| (k, g.n)).collect();
        if a != b {
            return Err(Error::bad_input(
                p,
                format!("shard {s} holds other Hessian groups than shard 0/{n} (another model?)"),
            ));
        }
    }

    // The merged file's metadata: the one-process run's keys (fingerprint of the whole run,
    // all windows done), plus how many shards were merged.
    let mut meta: BTreeMap<String, String> = m0
        .iter()
        .filter(|(k, _)| !k.starts_with("tq.shard") && !k.starts_with("tokens:"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    meta.insert("tq.fingerprint".into(), m0[META_FINGERPRINT].clone());
    meta.insert("tq.windows_total".into(), total.to_string());
    meta.insert("tq.windows_done".into(), total.to_string());
    meta.insert("tq.complete".into(), "true".into());
    meta.insert("tq.merged_shards".into(), n.to_string());
    let mut tokens = BTreeMap::new();
    for key in first.groups.keys() {
        let t: u64 = order
            .iter()
            .map(|&k| opened[k].2.index.groups[key].tokens)
            .sum();
        tokens.insert(key.clone(), t);
    }
    // Written in shard 0's group order and store, one group's matrix at a time.
    let f0 = &opened[order[0]].2;
    let store = f0
        .order
        .first()
        .and_then(|k| f0.store(k))
        .unwrap_or_default();
    let index: Vec<crate::quant::Hessian> = f0
        .order
        .iter()
        .map(|k| crate::quant::Hessian {
            tokens: tokens[k],
            ..first.groups[k].clone()
        })
        .collect();
    let refs: Vec<&crate::quant::Hessian> = index.iter().collect();
    let mut w = crate::quant::HessianWriter::create(
        out,
        &refs,
        &meta,
        store,
        crate::quant::WriteMode::Once,
    )?;
    for g in &index {
        let key = g.tensors.join(",");
        let mut acc = f0.load_group(&key)?.h;
        for &k in &order[1..] {
            let h = opened[k].2.load_group(&key)?;
            for (a, b) in acc.iter_mut().zip(&h.h) {
                *a += *b;
            }
        }
        w.write(&crate::quant::Hessian {
            h: acc,
            ..g.clone()
        })?;
    }
    w.finish()?;
    Ok(Merged {
        shards: n,
        groups: first.groups.len(),
        windows: total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Hessians;

    /// Shards of synthetic activations merge to the sum of their matrices in shard order, with
    /// token counts added, and the merged file reads back as a Hessian file.
    #[test]
    fn merge_sums_in_shard_order_and_checks_the_set() {
        let dir = tempfile::tempdir().unwrap();
        let (rows, cols) = (16, 40);
        let mut paths = Vec::new();
        let mut parts = Vec::new();
        for i in 0..3usize {
            let x: Vec<f32> = (0..rows * cols)
                .map(|j| (((j + 31 * i) * 7919) % 211) as f32 / 37.0 - 2.5)
                .collect();
            let mut hs = Hessians::default();
            hs.accumulate(&["a.weight", "b.weight"], &x, rows, cols);
            let mut meta = shard_meta(Shard { index: i, count: 3 }, i * 2..i * 2 + 2, 6, "fp");
            meta.insert("tq.complete".into(), "true".into());
            meta.insert("tq.batch".into(), "2".into());
            let p = dir.path().join(format!("s{i}.safetensors"));
            hs.save(&p, &meta, crate::quant::Store::F64).unwrap();
            parts.push(hs.groups["a.weight,b.weight"].h.clone());
            paths.push(p);
        }
        let out = dir.path().join("h.safetensors");
        // Any order on the command line: the sum is taken in shard order.
        let shuffled = vec![paths[2].clone(), paths[0].clone(), paths[1].clone()];
        let m = merge(&shuffled, &out).unwrap();
        assert_eq!((m.shards, m.groups, m.windows), (3, 1, 6));
        let (back, meta) = Hessians::load(&out).unwrap();
        let g = back.for_tensor("a.weight").unwrap();
        let want: Vec<f64> = (0..cols * cols)
            .map(|j| (parts[0][j] + parts[1][j]) + parts[2][j])
            .collect();
        assert_eq!(g.h, want);
        assert_eq!(g.tokens, 3 * rows as u64);
        assert_eq!(meta["tq.fingerprint"], "fp");
        assert_eq!(meta["tq.windows_done"], "6");
        assert!(!meta.contains_key(META_SHARD));

        let err = |ps: &[PathBuf]| merge(ps, &out).unwrap_err().to_string();
        let e = err(&paths[..2]);
        assert!(e.contains("missing shard(s) 2/3"), "{e}");
        let e = err(&[paths[0].clone(), paths[1].clone(), paths[1].clone()]);
        assert!(e.contains("shard 1/3 given twice"), "{e}");
        // A shard of another calibration (another fingerprint) is refused, naming it.
        let (hs, mut meta) = Hessians::load(&paths[1]).unwrap();
        meta.insert(META_FINGERPRINT.into(), "other".into());
        let other = dir.path().join("other.safetensors");
        hs.save(&other, &meta, crate::quant::Store::F64).unwrap();
        let e = err(&[paths[0].clone(), other.clone(), paths[2].clone()]);
        assert!(
            e.contains("other.safetensors") && e.contains("another calibration"),
            "{e}"
        );
    }
}
