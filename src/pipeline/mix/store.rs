//! The encodings a mix made, kept beside `--mix-cache FILE` in the folder `FILE.enc/`, so that
//! the measured plans of another size (or a rerun) read a (tensor, type)'s bytes instead of
//! encoding it again: LDLQ of a tensor is the mix's most expensive step, and plans of different
//! sizes share most of their (tensor, type) pairs.
//!
//! A stored encoding is the tensor's bytes exactly as convert writes them, then the blake3 of
//! its descriptor and bytes. Its file name is the blake3 of the cache's key (the model's and the
//! calibration's contents, the KLD text, the LDLQ settings and the tq version) and the
//! descriptor (name, shape, source and destination type, action, LDLQ or not, importance or
//! not, the plan's LDLQ settings), and the executable's own hash (another build's encoders may
//! differ): whatever the bytes depend on. A file that is short, long or
//! whose checksum differs is not used (the tensor is encoded again and the file replaced); files
//! are written beside and renamed, so a reader never sees half of one. The folder holds one
//! key's encodings: opening it for another key (the cache was replaced) removes the others.
//!
//! Disk: at most one file per (tensor, type) the measured plans used — on a 7B model at the
//! default candidates a few times the size of one quantized file.

use super::cache::Key;
use crate::error::{Error, Result};
use crate::plan::Plan;
use std::path::{Path, PathBuf};

const CHECK: usize = 32;

/// Encodings kept for one cache key.
pub(crate) struct Store {
    dir: PathBuf,
    salt: String,
    /// Encodings read back so far.
    hits: std::sync::atomic::AtomicUsize,
}

/// What entry `i`'s bytes under `p` depend on besides the cache key.
fn descriptor(p: &Plan, i: usize) -> String {
    let e = &p.entries[i];
    format!(
        "{}\n{:?}\n{}\n{}\n{:?}\nldlq {}\nimportance {}\n{:?}",
        e.name,
        e.dims,
        e.src.name(),
        e.dst.name(),
        e.action,
        e.ldlq,
        e.importance.is_some(),
        p.ldlq
    )
}

fn check(desc: &str, bytes: &[u8]) -> [u8; CHECK] {
    let mut h = blake3::Hasher::new();
    h.update(desc.as_bytes());
    h.update(&[0]);
    h.update(bytes);
    *h.finalize().as_bytes()
}

impl Store {
    /// The store beside the cache at `cache` for `key` (created if missing); the encodings of any
    /// other key are removed.
    pub(crate) fn open(cache: &Path, key: &Key) -> Result<Store> {
        let mut h = blake3::Hasher::new();
        h.update(super::cache::build_id().as_bytes());
        for (k, v) in &key.0 {
            h.update(k.as_bytes());
            h.update(&[0]);
            h.update(v.as_bytes());
            h.update(&[0]);
        }
        let salt = h.finalize().to_hex().to_string();
        let mut root = cache.as_os_str().to_owned();
        root.push(".enc");
        let root = PathBuf::from(root);
        let dir = root.join(&salt[..32]);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        if let Ok(rd) = std::fs::read_dir(&root) {
            for d in rd.flatten() {
                if d.file_name() != dir.file_name().unwrap_or_default() {
                    let _ = std::fs::remove_dir_all(d.path());
                }
            }
        }
        Ok(Store {
            dir,
            salt,
            hits: Default::default(),
        })
    }

    /// How many encodings [`Store::get`] has returned.
    pub(crate) fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The folder the encodings are in.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, desc: &str) -> PathBuf {
        let mut h = blake3::Hasher::new();
        h.update(self.salt.as_bytes());
        h.update(&[0]);
        h.update(desc.as_bytes());
        self.dir.join(&h.finalize().to_hex()[..40])
    }

    /// Entry `i`'s bytes under `p` when stored and intact.
    pub(crate) fn get(&self, p: &Plan, i: usize) -> Option<Vec<u8>> {
        let desc = descriptor(p, i);
        let mut b = std::fs::read(self.file(&desc)).ok()?;
        let n = b.len().checked_sub(CHECK)?;
        if n as u64 != p.entries[i].bytes || b[n..] != check(&desc, &b[..n]) {
            return None;
        }
        b.truncate(n);
        self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(b)
    }

    /// Keep entry `i`'s bytes under `p` (written beside, then renamed).
    pub(crate) fn put(&self, p: &Plan, i: usize, bytes: &[u8]) -> Result<()> {
        let desc = descriptor(p, i);
        let path = self.file(&desc);
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let mut b = Vec::with_capacity(bytes.len() + CHECK);
        b.extend_from_slice(bytes);
        b.extend_from_slice(&check(&desc, bytes));
        let r = std::fs::write(&tmp, &b).and_then(|()| std::fs::rename(&tmp, &path));
        r.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(&path, e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{self, Request};
    use crate::types::profile::Profile;
    use crate::types::TensorType;

    fn tiny_plan(dir: &Path) -> Plan {
        let model = dir.join("m.gguf");
        std::fs::write(&model, crate::gguf_gen::tiny_llama_tok(1, 256, 256).bytes).unwrap();
        let profile = Profile::default();
        let src = crate::source::open(&model, &profile).unwrap();
        let req = Request::new(TensorType::Q4K, &plan::recipe::RECIPES[0]);
        plan::plan(src.tensors(), &req, &profile).unwrap()
    }

    /// Bytes come back as stored, for their own descriptor and key only; a damaged or
    /// mis-sized file is a miss; another key's folder is removed when a store opens.
    #[test]
    fn stored_bytes_come_back_only_for_their_key_and_intact() {
        let dir = tempfile::tempdir().unwrap();
        let p = tiny_plan(dir.path());
        let i = p
            .entries
            .iter()
            .position(|e| e.name == "blk.0.attn_q.weight")
            .unwrap();
        let n = p.entries[i].bytes as usize;
        let bytes: Vec<u8> = (0..n).map(|k| (k * 31 % 251) as u8).collect();
        let cache = dir.path().join("c.json");
        let key = Key(vec![("model", "a".into())]);
        let s = Store::open(&cache, &key).unwrap();
        assert!(s.get(&p, i).is_none());
        s.put(&p, i, &bytes).unwrap();
        assert_eq!(s.get(&p, i).as_deref(), Some(&bytes[..]));
        assert_eq!(s.hits(), 1);
        // Another type of the same tensor, another tensor: not found.
        let mut q = p.clone();
        q.entries[i].dst = TensorType::Q5K;
        let elems: u64 = q.entries[i].dims.iter().product();
        q.entries[i].bytes = TensorType::Q5K.bytes_for(elems).unwrap();
        assert!(s.get(&q, i).is_none());
        assert!(s.get(&p, i + 1).is_none());
        // Reopened with the same key: still there; the plan's other fields (reasons) do not matter.
        let mut r = p.clone();
        r.entries[i].reasons = vec!["another rule".into()];
        let s2 = Store::open(&cache, &key).unwrap();
        assert_eq!(s2.get(&r, i).as_deref(), Some(&bytes[..]));
        // A flipped byte or a truncated file is a miss.
        let f = s.file(&descriptor(&p, i));
        let mut raw = std::fs::read(&f).unwrap();
        raw[7] ^= 1;
        std::fs::write(&f, &raw).unwrap();
        assert!(s.get(&p, i).is_none());
        std::fs::write(&f, &raw[..raw.len() - 1]).unwrap();
        assert!(s.get(&p, i).is_none());
        s.put(&p, i, &bytes).unwrap();
        assert!(s.get(&p, i).is_some());
        // Another key: its own folder, the old one removed.
        let other = Store::open(&cache, &Key(vec![("model", "b".into())])).unwrap();
        assert!(other.get(&p, i).is_none());
        assert!(!f.exists());
        let folders = std::fs::read_dir(dir.path().join("c.json.enc"))
            .unwrap()
            .count();
        assert_eq!(folders, 1);
    }
}
