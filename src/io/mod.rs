//! Files: the one place that knows how `tq` reads big inputs and writes outputs.
//!
//! - [`drop_pages`]: keep RSS bounded while streaming through a memory map larger than RAM.
//! - [`hash_file`]: blake3 of an input (file or model directory) without making it resident.
//! - [`TempOutput`]: every output is written under a temporary name in the target directory and
//!   renamed into place only when complete (fsync first), so no partial file ever carries the
//!   output's name; dropping it unfinished removes the temporary file.
//! - [`check_output`]: an output path must not be one of the command's inputs, and its directory
//!   must exist — checked before any work starts.
//! - [`progress`]: progress of a long phase on stderr: a bar on a terminal, else a line with
//!   the ETA every `TQ_PROGRESS_SECS` (10 s).
//! - [`hooks`]: the test hooks (kill points that stop a run as `kill -9` would), the one place
//!   library code may end the process.

pub mod hooks;
pub(crate) mod progress;

use crate::error::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Ask the kernel to read bytes `[start, end)` of a read-only file-backed map into the page
/// cache now, in large requests, without waiting (`MADV_WILLNEED`). Faulting a map in page by
/// page from a cold disk is many times slower than this readahead (12 MB/s against the disk's
/// 877 MB/s on the 13.5 GB 7B-shaped model, docs/bench/scale.md). Best effort, unix only.
pub fn will_need(map: &memmap2::Mmap, start: u64, end: u64) {
    #[cfg(unix)]
    {
        let page = 4096u64;
        let s = start / page * page;
        let e = end.min(map.len() as u64);
        if e > s {
            let _ = map.advise_range(memmap2::Advice::WillNeed, s as usize, (e - s) as usize);
        }
    }
    #[cfg(not(unix))]
    let _ = (map, start, end);
}

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

/// Prefix of the temporary names of `final_name`: `.NAME.tq-tmp-` (then `PID-N`). Hidden, beside
/// the target (so the final rename stays on one filesystem), and recognizable by a later run.
fn temp_prefix(final_name: &str) -> String {
    format!(".{final_name}.tq-tmp-")
}

/// The checkpoint of a resumable run's partial output `partial`.
pub fn checkpoint_path(partial: &Path) -> PathBuf {
    let mut s = partial.as_os_str().to_owned();
    s.push(".json");
    PathBuf::from(s)
}

/// The partial output of a resumable run (`.NAME.tq-partial` beside `final_path`); its checkpoint
/// is this path with `.json` appended.
pub fn partial_path(final_path: &Path) -> Result<PathBuf> {
    let base = final_path.file_name().ok_or_else(|| {
        Error::Usage(format!(
            "{}: output path has no file name",
            final_path.display()
        ))
    })?;
    Ok(final_path.with_file_name(format!(".{}.tq-partial", base.to_string_lossy())))
}

/// Is process `pid` gone? (Only a clear "no such process" counts; anything else keeps the file.)
#[cfg(unix)]
fn process_is_gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists; it delivers nothing.
    let r = unsafe { libc::kill(pid, 0) };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Remove temporary files of `final_name` in `dir` left by runs that no longer exist (killed by
/// SIGKILL, a power cut, …): their names carry the PID that made them.
fn remove_stale_temps(dir: &Path, final_name: &str) {
    #[cfg(unix)]
    {
        let prefix = temp_prefix(final_name);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
            if pid.is_some_and(|p| p > 0 && process_is_gone(p)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (dir, final_name);
}

/// Temporary files of this process, removed by the signal handler on SIGINT/SIGTERM/SIGHUP. A
/// handler may only do async-signal-safe work, so the paths are kept as leaked C strings behind
/// atomic pointers (no lock, no allocation in the handler); a slot is cleared on commit or drop.
#[cfg(unix)]
mod on_signal {
    use std::ffi::CString;
    use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
    use std::sync::Once;

    const SLOTS: usize = 64;
    static PATHS: [AtomicPtr<libc::c_char>; SLOTS] =
        [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];
    static INSTALL: Once = Once::new();

    /// Threads between registering a path and creating its file (see [`creating`]).
    static CREATING: AtomicUsize = AtomicUsize::new(0);
    /// Set first thing in the handler: no file is created after it.
    static DYING: AtomicBool = AtomicBool::new(false);

    fn unlink_all() {
        for slot in PATHS.iter().rev() {
            let p = slot.load(Ordering::SeqCst);
            if !p.is_null() {
                // SAFETY: `p` is a leaked, NUL-terminated path that is never freed; unlink
                // is async-signal-safe.
                unsafe { libc::unlink(p) };
            }
        }
    }

    extern "C" fn cleanup(sig: libc::c_int) {
        // Other threads run on while this one unlinks. A file being created is registered
        // before it exists, inside a `creating` section the handler waits out (bounded: the
        // section may be this very thread's, interrupted), and no section starts once DYING is
        // set, so no file appears after the last pass. A checkpoint being written (its temp
        // renamed onto the checkpoint) could reappear after its unlink: later slots first (a
        // checkpoint's temp is registered after the checkpoint itself), so the rename either
        // fails on the unlinked temp or lands before the checkpoint is unlinked; the second
        // pass catches a rename that landed during the first.
        DYING.store(true, Ordering::SeqCst);
        unlink_all();
        let nap = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        for _ in 0..500 {
            if CREATING.load(Ordering::SeqCst) == 0 {
                break;
            }
            // SAFETY: nanosleep is async-signal-safe.
            unsafe { libc::nanosleep(&nap, std::ptr::null_mut()) };
        }
        for _ in 0..2 {
            unlink_all();
        }
        // SAFETY: restore the default action and re-raise, so the exit status says "killed by sig".
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    /// Remember `path` for the handler (installed on first use); returns its slot.
    fn register(path: &std::path::Path) -> Option<usize> {
        INSTALL.call_once(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                // SAFETY: installs a handler that only calls async-signal-safe functions.
                unsafe {
                    libc::signal(
                        sig,
                        cleanup as extern "C" fn(libc::c_int) as libc::sighandler_t,
                    )
                };
            }
        });
        use std::os::unix::ffi::OsStrExt;
        let c = CString::new(path.as_os_str().as_bytes()).ok()?;
        let raw = c.into_raw(); // leaked: the handler may read it at any moment
        for (i, slot) in PATHS.iter().enumerate() {
            if slot
                .compare_exchange(
                    std::ptr::null_mut(),
                    raw,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
            {
                return Some(i);
            }
        }
        None // more than SLOTS outputs at once: this one is cleaned up on drop only
    }

    pub(super) fn unregister(slot: Option<usize>) {
        if let Some(i) = slot {
            PATHS[i].store(std::ptr::null_mut(), Ordering::SeqCst);
        }
    }

    /// Register `paths`, then run `create` (which makes their files): a signal at any point
    /// leaves none of them behind. Once a signal has arrived no file is created: the thread
    /// waits for the handler to end the process. The slots are released if `create` fails.
    pub(super) fn creating<T, E>(
        paths: &[&std::path::Path],
        create: impl FnOnce() -> Result<T, E>,
    ) -> Result<(Vec<Option<usize>>, T), E> {
        // Entered, then DYING checked (the handler sets DYING, then waits for CREATING): either
        // the handler waits for this section or this thread sees DYING. A dying process's thread
        // leaves the section, so the handler does not wait for it, and waits to be ended.
        CREATING.fetch_add(1, Ordering::SeqCst);
        if DYING.load(Ordering::SeqCst) {
            CREATING.fetch_sub(1, Ordering::SeqCst);
            loop {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        let slots: Vec<_> = paths.iter().map(|p| register(p)).collect();
        let r = create();
        CREATING.fetch_sub(1, Ordering::SeqCst);
        match r {
            Ok(v) => Ok((slots, v)),
            Err(e) => {
                slots.into_iter().for_each(unregister);
                Err(e)
            }
        }
    }
}

/// Run `create` (which makes the files at `paths`) so that SIGINT/SIGTERM/SIGHUP at any point
/// leaves none of them behind; returns their signal slots.
#[cfg(unix)]
fn creating<T, E>(
    paths: &[&Path],
    create: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<(Vec<Option<usize>>, T), E> {
    on_signal::creating(paths, create)
}

#[cfg(not(unix))]
fn creating<T, E>(
    paths: &[&Path],
    create: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<(Vec<Option<usize>>, T), E> {
    create().map(|v| (vec![None; paths.len()], v))
}

/// An output being written: a temporary file `.NAME.tq-tmp-PID-N` beside the final path, created
/// exclusively (two runs, or two outputs of one run, never share one), renamed into place by
/// [`commit`](TempOutput::commit), removed if dropped before that or if the process gets
/// SIGINT/SIGTERM/SIGHUP. Stale temporaries of the same output from dead processes are removed.
#[derive(Debug)]
pub struct TempOutput {
    final_path: PathBuf,
    tmp_path: PathBuf,
    committed: bool,
    #[cfg(unix)]
    slot: Option<usize>,
    /// A resumable output's checkpoint file (and its signal slot), removed with it.
    checkpoint: Option<(PathBuf, Option<usize>)>,
}

impl TempOutput {
    /// Create the temporary file for `final_path` (refused if `final_path` exists and is not a
    /// regular file: a directory, device, pipe or socket is never replaced).
    pub fn create(final_path: &Path) -> Result<(TempOutput, File)> {
        refuse_non_regular("output", final_path)?;
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
        let base = base.to_string_lossy();
        remove_stale_temps(&dir, &base);
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        loop {
            let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp_path = dir.join(format!("{}{}-{n}", temp_prefix(&base), std::process::id()));
            match creating(&[&tmp_path], || {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp_path)
            }) {
                Ok((_slots, file)) => {
                    return Ok((
                        TempOutput {
                            final_path: final_path.to_path_buf(),
                            tmp_path,
                            committed: false,
                            #[cfg(unix)]
                            slot: _slots[0],
                            checkpoint: None,
                        },
                        file,
                    ));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(&tmp_path, e)),
            }
        }
    }

    /// A resumable output: the fixed name `.NAME.tq-partial` beside `final_path` (a checkpoint
    /// names it, so it must survive the process), opened for appending at `resume_at` bytes (the file
    /// is cut there: bytes after the last checkpoint are discarded) or created afresh when `None`.
    /// Removed (with its checkpoint) on drop unless committed, and on SIGINT/SIGTERM/SIGHUP, as
    /// every output is: what `--resume` continues is a run that could not clean up — `kill -9`,
    /// the OOM killer, a crash, a lost machine. Returns the file positioned at its end.
    pub fn create_resumable(
        final_path: &Path,
        resume_at: Option<u64>,
    ) -> Result<(TempOutput, File)> {
        use std::io::{Seek, SeekFrom};
        refuse_non_regular("output", final_path)?;
        let tmp_path = partial_path(final_path)?;
        let checkpoint = checkpoint_path(&tmp_path);
        if let (Some(dir), Some(base)) = (tmp_path.parent(), final_path.file_name()) {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            remove_stale_temps(dir, &base.to_string_lossy());
        }
        let (_slots, file) = creating(&[&tmp_path, &checkpoint], || match resume_at {
            None => {
                let _ = std::fs::remove_file(&tmp_path);
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp_path)
            }
            Some(pos) => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&tmp_path)
                .and_then(|mut f| {
                    let len = f.metadata()?.len();
                    if len < pos {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("holds {len} bytes, its checkpoint {pos}; run without --resume to start over"),
                        ));
                    }
                    f.set_len(pos)?;
                    f.seek(SeekFrom::Start(pos))?;
                    Ok(f)
                }),
        })
        .map_err(|e| Error::io(&tmp_path, e))?;
        Ok((
            TempOutput {
                final_path: final_path.to_path_buf(),
                #[cfg(unix)]
                slot: _slots[0],
                checkpoint: Some((checkpoint, _slots[1])),
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
        // The target may have become a directory/device/pipe while we worked: still never replace it.
        refuse_non_regular("output", &self.final_path)?;
        // Test hook (TQ_TEST_RENAME_DELAY_MS): widen the window before the rename.
        hooks::pause(hooks::Pause::Rename);
        std::fs::rename(&self.tmp_path, &self.final_path)
            .map_err(|e| Error::io(&self.final_path, e))?;
        self.committed = true;
        #[cfg(unix)]
        on_signal::unregister(self.slot.take());
        if let Some((c, _slot)) = self.checkpoint.take() {
            let _ = std::fs::remove_file(c);
            #[cfg(unix)]
            on_signal::unregister(_slot);
        }
        if let Some(dir) = self.final_path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            if let Some(w) = sync_dir(dir, &self.final_path) {
                eprintln!("{w}");
            }
        }
        Ok(())
    }
}

/// Make a rename in `dir` durable (fsync the directory). A filesystem that cannot sync a
/// directory says so (EINVAL, ENOTSUP) and is left alone; any other failure is a warning naming
/// the output: it is complete, but a power loss now could undo the rename.
pub(crate) fn sync_dir(dir: &Path, output: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        let r = File::open(dir).and_then(|d| d.sync_all());
        match r {
            Ok(()) => None,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOTSUP)) => None,
            Err(e) => Some(format!(
                "tq: warning: {}: written, but syncing its directory {} failed ({e}); a power loss now could undo the rename",
                output.display(),
                dir.display()
            )),
        }
    }
    #[cfg(not(unix))]
    {
        // Windows cannot open a directory as a file; NTFS journals the rename itself.
        let _ = (dir, output);
        None
    }
}

impl Drop for TempOutput {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp_path);
            if let Some((c, _slot)) = self.checkpoint.take() {
                let _ = std::fs::remove_file(c);
                #[cfg(unix)]
                on_signal::unregister(_slot);
            }
            #[cfg(unix)]
            on_signal::unregister(self.slot.take());
        }
    }
}

/// An existing `path` that is not a regular file (directory, device, pipe, socket) is refused:
/// outputs are written by renaming a finished temporary file over the target, which would replace
/// such a node instead of writing to it.
fn refuse_non_regular(flag: &str, path: &Path) -> Result<()> {
    let Ok(m) = std::fs::metadata(path) else {
        return Ok(()); // absent (or unreadable: the write will name the error)
    };
    if m.is_dir() {
        return Err(Error::Usage(format!(
            "{}: {flag} is a directory; give a file name",
            path.display()
        )));
    }
    if !m.is_file() {
        return Err(Error::Usage(format!(
            "{}: {flag} is not a regular file (a device, pipe or socket); tq writes a temporary file and renames it into place, so give a regular file path",
            path.display()
        )));
    }
    Ok(())
}

/// (device, inode) of a file, following links; None when it cannot be read.
#[cfg(unix)]
fn identity(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(p: &Path) -> Option<std::path::PathBuf> {
    std::fs::canonicalize(p).ok()
}

/// Check an output path before any work: it must not be a directory, device, pipe or socket, not
/// be one of the command's `inputs` (the same file through symlinks and hard links: compared by
/// device and inode; for a directory input, any regular file directly in it), and its directory
/// must exist. `flag` names the option in the message; inputs not given are `None`.
pub fn check_output(flag: &str, out: &Path, inputs: &[Option<&Path>]) -> Result<()> {
    refuse_non_regular(flag, out)?;
    if let Some(o) = identity(out) {
        for input in inputs.iter().flatten() {
            let mut same = identity(input).as_ref() == Some(&o);
            if !same && input.is_dir() {
                same = std::fs::read_dir(input)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|e| e.path().is_file() && identity(&e.path()).as_ref() == Some(&o));
            }
            if same {
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

/// [`check_output`] for each given `(flag, path)` of a command's outputs, which must also differ
/// from each other.
pub fn check_outputs(outputs: &[(&str, Option<&Path>)], inputs: &[Option<&Path>]) -> Result<()> {
    let given: Vec<(&str, &Path)> = outputs
        .iter()
        .filter_map(|&(flag, out)| out.map(|o| (flag, o)))
        .collect();
    for (i, &(flag, out)) in given.iter().enumerate() {
        check_output(flag, out, inputs)?;
        let id = identity(out);
        for &(flag2, out2) in &given[..i] {
            if out == out2 || id.is_some() && id == identity(out2) {
                return Err(Error::Usage(format!(
                    "{}: {flag} and {flag2} name the same file; give two paths",
                    out.display()
                )));
            }
        }
    }
    Ok(())
}

/// Write `bytes` to `path` the way every output is written (temporary file, fsync, rename).
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let (t, mut f) = TempOutput::create(path)?;
    f.write_all(bytes).map_err(|e| Error::io(t.tmp_path(), e))?;
    t.commit(f)
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
    fn a_failed_directory_sync_is_a_warning_naming_the_output() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.gguf");
        assert_eq!(sync_dir(dir.path(), &out), None);
        #[cfg(unix)]
        {
            let gone = dir.path().join("gone");
            let w = sync_dir(&gone, &out).expect("a warning");
            assert!(
                w.starts_with("tq: warning: ") && w.contains("o.gguf"),
                "{w}"
            );
            assert_eq!(w.lines().count(), 1);
        }
    }

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
    fn temporaries_are_unique_and_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.bin");
        let (a, _fa) = TempOutput::create(&out).unwrap();
        let (b, _fb) = TempOutput::create(&out).unwrap();
        assert_ne!(a.tmp_path(), b.tmp_path());
        let name = a
            .tmp_path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(name.starts_with(".o.bin.tq-tmp-"), "{name}");
    }

    #[test]
    fn output_may_not_be_an_input() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"1").unwrap();
        let err =
            check_output("-o", &a, &[Some(Path::new("/nonexistent")), None, Some(&a)]).unwrap_err();
        assert!(err.to_string().contains("input"), "{err}");
        assert!(check_output("-o", &dir.path().join("b"), &[Some(&a)]).is_ok());
        assert!(check_output("-o", &dir.path().join("no/b"), &[Some(&a)]).is_err());
    }
}
