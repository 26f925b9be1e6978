//! Never harm the user's files (issue 15, items 1, 2, 4, 5): every command that writes refuses an
//! output that is a directory, device or pipe, or that is one of its inputs (through symlinks and
//! hard links), before doing any work; temporary files are unique, removed on error and on
//! SIGINT/SIGTERM/SIGHUP, and stale ones of dead runs are removed by the next run.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use std::path::{Path, PathBuf};

fn model(dir: &Path) -> PathBuf {
    let p = dir.join("m.gguf");
    std::fs::write(&p, fixtures::gguf_gen::tiny_llama(2, 64, 128, 300).bytes).unwrap();
    p
}

/// Names in `dir` that look like tq temporaries.
fn temps(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tq-tmp") || n.contains(".tq-partial"))
        .collect()
}

/// Every writing command, with `out` as its output, reading model `m` (and text `t`).
fn writers<'a>(m: &'a str, t: &'a str, out: &'a str) -> Vec<Vec<&'a str>> {
    vec![
        vec!["convert", m, "--weights", "q8_0", "-o", out],
        vec!["calib", m, "--text", t, "-o", out],
        vec!["eval", m, "--text", t, "--save-logits", out],
        vec!["kv", m, "--write", out],
        vec!["codebook", "--head-dim", "64", "--bits", "2", "--out", out],
    ]
}

#[cfg(unix)]
#[test]
fn pipes_devices_and_directories_are_never_replaced() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let t = dir.path().join("t.txt");
    std::fs::write(&t, "some text ".repeat(100)).unwrap();
    let fifo = dir.path().join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    // A character device. As root, a copy of /dev/null's node (mknod), so that a tq that replaced
    // its output would not touch the real one; otherwise /dev/null itself, once it is checked that
    // its directory is not writable here (so that a faulty tq could not replace it either).
    let copy = dir.path().join("null");
    let dev = if std::process::Command::new("mknod")
        .args([s(&copy), "c", "1", "3"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        Some(copy)
    } else if tempfile::tempfile_in("/dev").is_err() {
        Some(PathBuf::from("/dev/null"))
    } else {
        fixtures::not_run(
            "the device-node case: mknod failed and /dev is writable here \
             (neither a copied node nor a /dev/null that cannot be replaced)",
        );
        None
    };
    let have_dev = dev.is_some();
    let dev = dev.unwrap_or_default();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let mut targets = vec![
        (fifo.clone(), "not a regular file"),
        (sub.clone(), "is a directory"),
    ];
    if have_dev {
        targets.push((dev.clone(), "not a regular file"));
    }
    for (target, want) in &targets {
        for args in writers(s(&m), s(&t), s(target)) {
            let (code, _, err) = tq(&args);
            assert_eq!(code, 2, "{args:?}: {err}");
            assert!(err.contains(want), "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(std::fs::metadata(&sub).unwrap().is_dir());
    if have_dev {
        assert!(std::fs::metadata(&dev)
            .unwrap()
            .file_type()
            .is_char_device());
    }
    assert!(temps(dir.path()).is_empty(), "{:?}", temps(dir.path()));
    assert!(
        std::fs::read_dir(&sub).unwrap().next().is_none(),
        "nothing written into the directory"
    );
}

#[test]
fn an_output_is_never_one_of_the_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let t = dir.path().join("t.txt");
    std::fs::write(&t, "some text ".repeat(100)).unwrap();
    let other = dir.path().join("other.bin");
    std::fs::write(&other, b"not to be touched").unwrap();
    let hard = dir.path().join("hard.gguf");
    std::fs::hard_link(&m, &hard).unwrap();
    let soft = dir.path().join("soft.gguf");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&m, &soft).unwrap();
    let before = |p: &Path| std::fs::read(p).unwrap();
    let (model_bytes, text_bytes, other_bytes) = (before(&m), before(&t), before(&other));
    let (m_, t_, o_) = (s(&m), s(&t), s(&other));
    let mut cases: Vec<Vec<&str>> = vec![
        vec!["calib", m_, "--text", t_, "-o", m_],
        vec!["calib", m_, "--text", t_, "-o", t_],
        vec!["eval", m_, "--text", t_, "--save-logits", m_],
        vec!["eval", m_, "--text", t_, "--save-logits", t_],
        vec!["convert", m_, "--weights", "q8_0", "--calib", o_, "-o", o_],
        vec![
            "convert",
            m_,
            "--weights",
            "q8_0",
            "--tensor-type-file",
            o_,
            "-o",
            o_,
        ],
        vec!["convert", m_, "--weights", "q8_0", "-o", s(&hard)],
        vec!["kv", m_, "--write", s(&hard)],
        vec![
            "calib",
            m_,
            "--text",
            t_,
            "-o",
            "x.safetensors",
            "--save-tokens",
            t_,
        ],
    ];
    #[cfg(unix)]
    cases.push(vec!["convert", m_, "--weights", "q8_0", "-o", s(&soft)]);
    for args in &cases {
        let (code, _, err) = tq(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("is the input file"), "{args:?}: {err}");
    }
    assert_eq!(before(&m), model_bytes);
    assert_eq!(before(&t), text_bytes);
    assert_eq!(before(&other), other_bytes);
    assert!(temps(dir.path()).is_empty());
}

/// A temporary left by a run that no longer exists (its PID is in the name) is removed by the
/// next run writing the same output; one of a live process is left alone.
#[cfg(unix)]
#[test]
fn stale_temporaries_of_dead_runs_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let out = dir.path().join("o.gguf");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = dir.path().join(format!(".o.gguf.tq-tmp-{dead}-0"));
    let live = dir
        .path()
        .join(format!(".o.gguf.tq-tmp-{}-0", std::process::id()));
    std::fs::write(&stale, b"partial").unwrap();
    std::fs::write(&live, b"someone else's").unwrap();
    let (code, _, err) = tq(&["convert", s(&m), "--weights", "q8_0", "-q", "-o", s(&out)]);
    assert_eq!(code, 0, "{err}");
    assert!(!stale.exists(), "stale temporary of pid {dead} not removed");
    assert!(live.exists(), "a live process's temporary was removed");
    assert!(out.exists());
}

/// SIGTERM, SIGINT or SIGHUP in the middle of a conversion leaves neither the output nor the
/// temporary file, and the process reports death by that signal.
#[cfg(unix)]
#[test]
fn signals_remove_the_temporary_file() {
    use std::os::unix::process::ExitStatusExt;
    let Some(smol) = fixtures::smollm2() else {
        return;
    };
    for sig in ["TERM", "INT", "HUP"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.gguf");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
            .args([
                "convert",
                s(&smol),
                "--weights",
                "tq4_1s",
                "-q",
                "--threads",
                "1",
                "-o",
                s(&out),
            ])
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while temps(dir.path()).is_empty() {
            assert!(t0.elapsed().as_secs() < 60, "no temporary file appeared");
            assert!(
                child.try_wait().unwrap().is_none(),
                "finished before the signal"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let pid = child.id().to_string();
        assert!(std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid])
            .status()
            .unwrap()
            .success());
        let status = child.wait().unwrap();
        assert!(
            status.signal().is_some(),
            "SIG{sig}: exit status {status:?}"
        );
        assert!(
            temps(dir.path()).is_empty(),
            "SIG{sig}: {:?}",
            temps(dir.path())
        );
        assert!(!out.exists(), "SIG{sig}: output exists");
    }
}

/// A write that fails part-way (here the file-size limit, as a full disk would) is an I/O error,
/// exit 1, and leaves neither the output nor a temporary: `calib` and `eval --save-logits` used to
/// leave `NAME.tq-tmp` / `NAME.tq-partial` behind.
#[cfg(unix)]
#[test]
fn a_failed_write_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let toks = dir.path().join("toks.txt");
    let ids: Vec<String> = (0..512).map(|i| ((i * 7) % 290 + 5).to_string()).collect();
    std::fs::write(&toks, ids.join(" ")).unwrap();
    let h = dir.path().join("h.safetensors");
    let l = dir.path().join("ref.logits");
    let cases: Vec<(Vec<&str>, &Path)> = vec![
        (
            vec![
                "calib",
                s(&m),
                "--token-file",
                s(&toks),
                "--ctx",
                "64",
                "-o",
                s(&h),
            ],
            &h,
        ),
        (
            vec![
                "eval",
                s(&m),
                "--tokens",
                s(&toks),
                "--ctx",
                "64",
                "--save-logits",
                s(&l),
            ],
            &l,
        ),
    ];
    for (args, out) in &cases {
        // Ignore SIGXFSZ so the oversized write fails with EFBIG instead of killing tq; 8 KiB limit.
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg("trap '' XFSZ; ulimit -f 16; exec \"$@\"")
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_tq"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        // `calib` writes a resumable `.NAME.tq-partial`, `eval` a `.NAME.tq-tmp-…`.
        assert!(
            err.contains("tq-tmp") || err.contains("tq-partial"),
            "the error names the file being written: {err}"
        );
        assert!(!out.exists(), "{args:?}: output exists");
        assert!(
            temps(dir.path()).is_empty(),
            "{args:?}: {:?}",
            temps(dir.path())
        );
    }
    // An output named like an old-style temporary is just a name (it collided with calib's own).
    let odd = dir.path().join("h.tq-tmp");
    let (code, _, err) = fixtures::tq(&[
        "calib",
        s(&m),
        "--token-file",
        s(&toks),
        "--ctx",
        "64",
        "-o",
        s(&odd),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(odd.exists() && temps(dir.path()) == vec!["h.tq-tmp".to_string()]);
}
