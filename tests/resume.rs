//! `tq convert --resume`: a conversion stopped abruptly after any tensor (the
//! `TQ_CONVERT_ABORT_AFTER` hook exits as `kill -9` would: no cleanup, buffered bytes lost) and
//! then rerun with `--resume` writes exactly the bytes of an uninterrupted run — without
//! calibration, with a Hessian file, and calibrating block by block on text (batched and
//! sequential).

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::s;
use std::path::{Path, PathBuf};

fn tq(args: &[&str], abort_after: Option<&str>) -> (i32, String) {
    let env: Vec<(&str, &str)> = abort_after
        .map(|v| ("TQ_CONVERT_ABORT_AFTER", v))
        .into_iter()
        .collect();
    let (code, _, err) = fixtures::tq_env(
        &args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        &env,
    );
    (code, err)
}

fn partial(out: &Path) -> PathBuf {
    out.with_file_name(format!(
        ".{}.tq-partial",
        out.file_name().unwrap().to_string_lossy()
    ))
}

struct Setup {
    _dir: tempfile::TempDir,
    model: PathBuf,
    text: PathBuf,
    hessians: PathBuf,
    dir: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    std::fs::write(
        &model,
        fixtures::gguf_gen::tiny_llama_with_tokenizer().bytes,
    )
    .unwrap();
    let text = dir.path().join("calib.txt");
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "rained.",
    ];
    let t: Vec<&str> = (0..600usize)
        .map(|i| words[(i * i + i / 3) % words.len()])
        .collect();
    std::fs::write(&text, t.join(" ")).unwrap();
    let hessians = dir.path().join("h.safetensors");
    let (code, err) = tq(
        &[
            "calib",
            s(&model),
            "--text",
            s(&text),
            "--tokens",
            "256",
            "--ctx",
            "32",
            "-o",
            s(&hessians),
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    Setup {
        dir: dir.path().to_path_buf(),
        _dir: dir,
        model,
        text,
        hessians,
    }
}

/// Every mode, stopped after the first tensor, mid-way, and before the last one.
#[test]
fn killed_then_resumed_is_byte_identical() {
    let st = setup();
    let modes: [(&str, Vec<&str>); 4] = [
        ("rtn", vec![]),
        ("file", vec!["--calib", s(&st.hessians)]),
        (
            "text",
            vec![
                "--calib",
                s(&st.text),
                "--calib-tokens",
                "256",
                "--calib-ctx",
                "32",
            ],
        ),
        // Sequential: a resumed run quantizes the written blocks again to rebuild the stream.
        (
            "sequential",
            vec![
                "--calib",
                s(&st.text),
                "--calib-tokens",
                "256",
                "--calib-ctx",
                "32",
                "--calib-sequential",
            ],
        ),
    ];
    for (mode, extra) in modes {
        let args = |out: &Path| {
            let mut a = vec!["convert", s(&st.model), "--weights", "tq4_1s", "-o", s(out)];
            a.extend(extra.iter().copied());
            a.iter().map(|x| x.to_string()).collect::<Vec<_>>()
        };
        let run = |out: &Path, more: &[&str], abort: Option<&str>| {
            let mut a = args(out);
            a.extend(more.iter().map(|x| x.to_string()));
            tq(&a.iter().map(String::as_str).collect::<Vec<_>>(), abort)
        };
        let full = st.dir.join(format!("{mode}-full.gguf"));
        let (code, err) = run(&full, &["-q"], None);
        assert_eq!(code, 0, "{mode}: {err}");
        assert!(
            !partial(&full).exists(),
            "{mode}: partial left after success"
        );
        let want = std::fs::read(&full).unwrap();
        let n = tq::gguf::GgufFile::open(&full).unwrap().tensors.len();
        for stop in [1, n / 2, n - 1] {
            let out = st.dir.join(format!("{mode}-{stop}.gguf"));
            let (code, err) = run(&out, &["-q"], Some(&stop.to_string()));
            assert_eq!(code, 137, "{mode} stop {stop}: {err}");
            assert!(err.contains("--resume"), "{err}");
            assert!(!out.exists(), "{mode}: no output before the run finishes");
            assert!(partial(&out).exists(), "{mode}: the partial output is kept");
            let (code, err) = run(&out, &["--resume"], None);
            assert_eq!(code, 0, "{mode} stop {stop}: {err}");
            assert!(
                err.contains(&format!("resuming at tensor {stop}/{n}")),
                "{mode}: {err}"
            );
            assert!(
                std::fs::read(&out).unwrap() == want,
                "{mode}: resumed after {stop} differs"
            );
            assert!(!partial(&out).exists());
        }
    }
}

/// A checkpoint is only continued by the command that made it; without one, --resume starts
/// afresh; a run without --resume replaces a stale partial.
#[test]
fn resume_refuses_another_command() {
    let st = setup();
    let out = st.dir.join("o.gguf");
    let conv = |w: &str, band: &str, more: &[&str], abort: Option<&str>| {
        let mut a = vec![
            "convert",
            s(&st.model),
            "--weights",
            w,
            "--calib",
            s(&st.hessians),
            "--ldlq-band",
            band,
            "-o",
            s(&out),
        ];
        a.extend(more);
        tq(&a, abort)
    };
    let (code, err) = conv("tq4_1s", "0", &["-q"], Some("3"));
    assert_eq!(code, 137, "{err}");
    // Another band: same header, other bytes — refused by the checkpoint's key.
    let (code, err) = conv("tq4_1s", "8", &["--resume"], None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("checkpoint of another conversion"), "{err}");
    assert_eq!(err.matches("error").count(), 1, "one line: {err}");
    // Another type: another plan, refused.
    let (code, err) = conv("tq3_1s", "0", &["--resume"], None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("another"), "{err}");
    // Without --resume the stale partial is replaced and the run completes.
    let (code, err) = conv("tq3_1s", "0", &["-q"], None);
    assert_eq!(code, 0, "{err}");
    let want = std::fs::read(&out).unwrap();
    // Nothing to resume: a notice, then a full run.
    let (code, err) = conv("tq3_1s", "0", &["--resume"], None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("starting from the beginning"), "{err}");
    assert!(std::fs::read(&out).unwrap() == want);
}
