//! Library code never ends the process on its own: only the binary's `main` (with the CLI's exit
//! code) and the test hooks (`src/io/hooks.rs`, kill points that stop a run as `kill -9` would)
//! may. Everywhere else an error is returned, so the caller decides, temporary files are cleaned
//! up and the user sees one line. The hooks' environment variables are read in that module only.

use std::path::{Path, PathBuf};

/// The files that may end the process.
const MAY_EXIT: &[&str] = &["main.rs", "io/hooks.rs"];

/// Ways to end the process from Rust.
const EXITS: &[&str] = &["process::exit", "libc::exit", "libc::_exit"];

/// Files whose own kill-point code is still being moved onto `io::hooks` by another branch
/// (the test fails while an entry is listed but no longer needed, so this list cannot go stale).
const PENDING: &[&str] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// (path under src/ with `/` separators, line number, line) of every code line (not a `//`
/// comment) that contains one of `needles`.
fn code_lines_with(needles: &[&str]) -> Vec<(String, usize, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    rust_files(&src, &mut files);
    assert!(files.len() > 50, "src/ has {} .rs files", files.len());
    let mut hits = vec![];
    for f in files {
        let rel = f
            .strip_prefix(&src)
            .unwrap()
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            if needles.iter().any(|n| line.contains(n)) {
                hits.push((rel.clone(), i + 1, line.trim().to_string()));
            }
        }
    }
    hits
}

/// Hits outside `allowed`, and the PENDING entries that no longer have a hit.
fn check(needles: &[&str], allowed: &[&str]) {
    let hits = code_lines_with(needles);
    let bad: Vec<String> = hits
        .iter()
        .filter(|(f, ..)| !allowed.contains(&f.as_str()) && !PENDING.contains(&f.as_str()))
        .map(|(f, n, l)| format!("src/{f}:{n}: {l}"))
        .collect();
    assert!(
        bad.is_empty(),
        "only src/{} may contain {needles:?}; use crate::io::hooks::kill_point for a test \
         hook, or return an Error:\n{}",
        allowed.join(", src/"),
        bad.join("\n")
    );
    let stale: Vec<&&str> = PENDING
        .iter()
        .filter(|p| !hits.iter().any(|(f, ..)| f == *p))
        .collect();
    assert!(
        stale.is_empty(),
        "{stale:?} no longer contain {needles:?}: remove them from PENDING in tests/hooks.rs"
    );
}

#[test]
fn only_main_and_the_hooks_end_the_process() {
    check(EXITS, MAY_EXIT);
}

/// Every test hook is read in `io::hooks`, so one module lists them all.
#[test]
fn hook_variables_are_read_in_the_hooks_module_only() {
    check(
        &[
            "TQ_CONVERT_ABORT_AFTER",
            "TQ_CALIB_ABORT_AFTER",
            "_ABORT_AFTER\"",
            "\"TQ_TEST_",
        ],
        &["io/hooks.rs"],
    );
}

/// The scan itself: it sees the hooks module's exit and its variables.
#[test]
fn the_scan_finds_the_hooks() {
    let hits = code_lines_with(EXITS);
    assert!(hits.iter().any(|(f, ..)| f == "io/hooks.rs"), "{hits:?}");
    assert!(hits.iter().any(|(f, ..)| f == "main.rs"), "{hits:?}");
}
