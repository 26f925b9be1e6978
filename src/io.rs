//! Files: the one place that knows how `tq` reads big inputs and writes outputs.
//!
//! - [`drop_pages`]: keep RSS bounded while streaming through a memory map larger than RAM.
//! - [`hash_file`]: blake3 of an input (file or model directory) without making it resident.
//! - [`TempOutput`]: every output is written under a temporary name in the target directory and
//!   renamed into place only when complete (fsync first), so no partial file ever carries the
//!   output's name; dropping it unfinished removes the temporary file.
//! - [`check_output`]: an output path must not be one of the command's inputs, and its directory
//!   must exist — checked before any work starts.

use crate::error::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Drop the resident pages of bytes `[start, end)` of a read-only file-backed map (only whole
/// pages inside the range, so neighbouring data keeps its pages). The pages are simply re-read if
/// touched again; this keeps RSS bounded while streaming through a model larger than RAM.
/// Best effort: errors are ignored, and it does nothing off unix.
pub fn drop_pages(map: &memmap2::Mmap, start: u64, end: u64) {
    #[cfg(unix)]
    {
        let page = 4096u64;
        let s = start.div_ceil(page) * page;
        let e = (end.min(map.len() as u64) / page) * page;
        if e > s {
            // SAFETY: read-only, file-backed mapping; DONTNEED only discards clean pages.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    s as usize,
                    (e - s) as usize,
                )
            };
        }
    }
    #[cfg(not(unix))]
    let _ = (map, start, end);
}

/// Hash a file's contents 16 MiB at a time through a read-only map, dropping each chunk's pages
/// from the map once hashed: hashing the whole map at once would make every page of a multi-GB
/// input resident (RSS = file size), and `read()` into a buffer costs a copy per byte (measured:
/// 0.4 s of system time for a 259 MB input, as much as converting it to q4_0).
fn hash_contents(h: &mut blake3::Hasher, path: &Path) -> Result<()> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
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
        drop_pages(&map, start, start + c.len() as u64);
    }
    Ok(())
}

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

/// An output being written: a temporary file `.NAME.tq-tmp-PID` beside the final path, renamed
/// into place by [`commit`](TempOutput::commit) and removed if dropped before that.
#[derive(Debug)]
pub struct TempOutput {
    final_path: PathBuf,
    tmp_path: PathBuf,
    committed: bool,
}

impl TempOutput {
    /// Create the temporary file for `final_path`.
    pub fn create(final_path: &Path) -> Result<(TempOutput, File)> {
        let dir = match final_path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let base = final_path.file_name().ok_or_else(|| {
            Error::Usage(format!(
                "{}: output path has no file name",
                final_path.display()
            ))
        })?;
        let tmp_path = dir.join(format!(
            ".{}.tq-tmp-{}",
            base.to_string_lossy(),
            std::process::id()
        ));
        let file = File::create(&tmp_path).map_err(|e| Error::io(&tmp_path, e))?;
        Ok((
            TempOutput {
                final_path: final_path.to_path_buf(),
                tmp_path,
                committed: false,
            },
            file,
        ))
    }

    /// Where the bytes go until [`commit`](TempOutput::commit) (for error messages).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp_path
    }

    /// The name the output will have.
    pub fn final_path(&self) -> &Path {
        &self.final_path
    }

    /// fsync `file` (the temporary file, fully written), rename it into place, and make the rename
    /// durable where the filesystem lets a directory be synced.
    pub fn commit(mut self, file: File) -> Result<()> {
        file.sync_all().map_err(|e| Error::io(&self.tmp_path, e))?;
        drop(file);
        std::fs::rename(&self.tmp_path, &self.final_path)
            .map_err(|e| Error::io(&self.final_path, e))?;
        self.committed = true;
        if let Some(dir) = self.final_path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            // Best effort: not every filesystem allows opening a directory.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}

impl Drop for TempOutput {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp_path);
        }
    }
}

/// Refuse an output path that is one of the command's inputs (the same file after resolving
/// links), and one whose directory does not exist. `flag` names the option in the message.
pub fn check_output(flag: &str, out: &Path, inputs: &[&Path]) -> Result<()> {
    if let Ok(o) = std::fs::canonicalize(out) {
        for input in inputs {
            if std::fs::canonicalize(input).ok().as_deref() == Some(o.as_path()) {
                return Err(Error::Usage(format!(
                    "{}: {flag} output is the input file {}; choose another path",
                    out.display(),
                    input.display()
                )));
            }
        }
    }
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(Error::Usage(format!(
            "{}: output directory {} does not exist",
            out.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// A temporary file removed when dropped (scratch data a command makes for itself).
#[derive(Debug)]
pub struct ScratchFile(pub PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
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

    #[test]
    fn temp_output_is_removed_unless_committed() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.bin");
        let (t, mut f) = TempOutput::create(&out).unwrap();
        f.write_all(b"x").unwrap();
        let tmp = t.tmp_path().to_path_buf();
        assert!(tmp.exists());
        drop((t, f));
        assert!(!tmp.exists() && !out.exists());
        let (t, mut f) = TempOutput::create(&out).unwrap();
        f.write_all(b"y").unwrap();
        t.commit(f).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"y");
    }

    #[test]
    fn output_may_not_be_an_input() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"1").unwrap();
        let err = check_output("-o", &a, &[Path::new("/nonexistent"), &a]).unwrap_err();
        assert!(err.to_string().contains("input"), "{err}");
        assert!(check_output("-o", &dir.path().join("b"), &[&a]).is_ok());
        assert!(check_output("-o", &dir.path().join("no/b"), &[&a]).is_err());
    }
}
