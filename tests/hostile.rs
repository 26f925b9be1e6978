//! Hostile inputs for the newer `tq convert` and `tq kv` flags: `--target-size`, `--types`,
//! `--tensor-type` / `--tensor-type-file`, `--kld-text` (with `--verify` and a mix), Hessian files
//! (`--calib H`) that are truncated, not Hessians, hold NaN/Inf or were made for another model,
//! imatrix files for another model or with NaN, and `tq kv`'s preset flags. Each is one line on
//! stderr naming the value, file or tensor, exit 2 (1 for a file that does not exist: an I/O
//! error), no output file and no temporary left behind (in the output's folder or in `$TMPDIR`).

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::gguf_gen::{pseudo_text, tiny_llama_tok};
use fixtures::{s, tq_env};
use std::path::{Path, PathBuf};

struct Env {
    _d: tempfile::TempDir,
    dir: PathBuf,
    tmp: PathBuf,
    /// A tiny llama with a tokenizer (1 block, hidden 64, ffn 256-wide rows), and a text for it.
    model: PathBuf,
    text: PathBuf,
}

fn env() -> Env {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let model = dir.join("m.gguf");
    std::fs::write(&model, tiny_llama_tok(1, 64, 256).bytes).unwrap();
    let text = dir.join("t.txt");
    std::fs::write(&text, pseudo_text(1500)).unwrap();
    Env {
        _d: d,
        dir,
        tmp,
        model,
        text,
    }
}

impl Env {
    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        tq_env(args, &[("TMPDIR", s(&self.tmp))])
    }

    /// Every file in the output folder and `$TMPDIR` that was not there before: none may be.
    fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = [&self.dir, &self.tmp]
            .iter()
            .flat_map(|d| std::fs::read_dir(d).unwrap().flatten())
            .map(|e| e.path().display().to_string())
            .collect();
        v.sort();
        v
    }

    /// `tq ARGS -o OUT` must fail with `code`, one line containing every `want`, and leave
    /// nothing: no `OUT`, no new file beside it or in `$TMPDIR`.
    fn refuses(&self, args: &[&str], code: i32, want: &[&str]) -> String {
        let out = self.dir.join("out.gguf");
        let before = self.listing();
        let mut a = args.to_vec();
        a.extend(["-q", "-o", s(&out)]);
        let (c, stdout, err) = self.run(&a);
        assert_eq!(c, code, "{args:?}: {err}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        let line = err.trim_end();
        assert_eq!(line.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(line.starts_with("tq: error: "), "{args:?}: {err}");
        for w in want {
            assert!(line.contains(w), "{args:?}: want '{w}' in: {err}");
        }
        assert!(!out.exists(), "{args:?}: output written");
        assert_eq!(self.listing(), before, "{args:?}: files left behind");
        eprintln!("exit {c}: {}", line.replace(s(&self.dir), "DIR"));
        line.to_string()
    }

    fn ok(&self, args: &[&str]) -> String {
        let (c, out, err) = self.run(args);
        assert_eq!(c, 0, "{args:?}: {err}");
        out
    }
}

#[test]
fn target_size_values_are_checked() {
    let e = env();
    let m = s(&e.model);
    for (v, want) in [
        ("garbage", "not a number"),
        ("", "not a number"),
        ("1,000", "not a number"),
        ("nan", "not a number"),
        ("0", "at least 1 byte"),
        ("0.1", "at least 1 byte"),
        ("-5", "cannot be negative"),
        ("-1MB", "cannot be negative"),
        ("5XB", "unknown unit 'XB'"),
        ("1e30", "unknown unit 'e30'"),
        ("99999999999999999999", "larger than any file"),
        ("2000000000GB", "larger than any file"),
    ] {
        let flag = format!("--target-size={v}");
        let line = e.refuses(&["convert", m, &flag], 2, &[want]);
        assert!(line.contains(&format!("--target-size '{v}'")), "{line}");
    }
    // Smaller than the smallest file the candidates give: the minimum is named.
    e.refuses(
        &["convert", m, "--target-size", "1KB"],
        2,
        &["1000 bytes", "below the smallest file", "--types"],
    );
    // Larger than any file: every tensor at its best candidate, within the budget.
    let out = e.dir.join("big.gguf");
    e.ok(&[
        "convert",
        m,
        "--target-size",
        "100GB",
        "--types",
        "q4_0,q8_0",
        "-q",
        "-o",
        s(&out),
    ]);
    let f = tq::gguf::GgufFile::open(&out).unwrap();
    assert!(f
        .tensors
        .iter()
        .filter(|t| t.dims.len() == 2)
        .all(|t| t.ty.name() == "q8_0"));
    std::fs::remove_file(&out).unwrap();
}

#[test]
fn types_and_tensor_type_flags_are_checked() {
    let e = env();
    let m = s(&e.model);
    let mix = |types: &'static str| ["convert", m, "--target-bpw", "6", "--types", types];
    e.refuses(
        &mix("q4_0,q9_9"),
        2,
        &["--types", "unknown tensor type 'q9_9'"],
    );
    e.refuses(&mix(",,"), 2, &["--types", "give at least one type"]);
    e.refuses(&mix("nvfp4"), 2, &["--types", "cannot write type nvfp4"]);
    // Candidates none of which a tensor can take (the token embedding is never TQ): the tensor
    // is named with what to add.
    e.refuses(
        &mix("tq4_1s"),
        2,
        &[
            "token_embd.weight",
            "none of the candidate types (tq4_1s)",
            "--types",
        ],
    );
    let tt = |v: &'static str| ["convert", m, "--tensor-type", v];
    e.refuses(
        &tt("blk.0.attn_q.weight=q9_9"),
        2,
        &[
            "--tensor-type 'blk.0.attn_q.weight=q9_9'",
            "unknown tensor type",
        ],
    );
    e.refuses(
        &tt("blk.7.attn_q.weight=q4_0"),
        2,
        &[
            "'blk.7.attn_q.weight=q4_0'",
            "matches no tensor",
            "tq inspect",
        ],
    );
    e.refuses(&tt("(=q4_0"), 2, &["--tensor-type '(=q4_0'", "bad regex"]);
    e.refuses(&tt("attn_q"), 2, &["'attn_q'", "expected REGEX=TYPE"]);
    // The file form: not UTF-8, a bad line, a name that matches nothing, a missing file.
    let bin = e.file("bin.txt", &[0x80, 0xff, 0x00, b'=', b'q']);
    e.refuses(
        &["convert", m, "--tensor-type-file", s(&bin)],
        2,
        &["bin.txt", "not UTF-8"],
    );
    let bad = e.file("bad.txt", b"# types\nattn_q=q9_9\n");
    e.refuses(
        &["convert", m, "--tensor-type-file", s(&bad)],
        2,
        &["bad.txt", "unknown tensor type 'q9_9'"],
    );
    let none = e.file("none.txt", b"ffn_gate_exps=q4_0\n");
    e.refuses(
        &["convert", m, "--tensor-type-file", s(&none)],
        2,
        &["'ffn_gate_exps=q4_0'", "matches no tensor"],
    );
    e.refuses(
        &[
            "convert",
            m,
            "--tensor-type-file",
            s(&e.dir.join("missing.txt")),
        ],
        1,
        &["missing.txt", "No such file"],
    );
}

#[test]
fn kld_text_is_checked_before_anything_is_written() {
    let e = env();
    let m = s(&e.model);
    let empty = e.file("empty.txt", b"");
    let short = e.file("short.txt", b"the cat sat on the mat");
    let bin = e.file("bin.txt", &[0xff, 0xfe, 0x00, 0x80, 0x81]);
    let missing = e.dir.join("missing.txt");
    for mode in [
        &["--weights", "q4_0", "--verify"][..],
        &["--target-bpw", "6", "--types", "q4_0,q8_0"][..],
    ] {
        let a = |t: &Path| -> Vec<String> {
            let mut v: Vec<String> = ["convert", m].map(String::from).to_vec();
            v.extend(mode.iter().map(|x| x.to_string()));
            v.extend(["--kld-text".into(), s(t).into()]);
            v
        };
        let run = |t: &Path, code: i32, want: &[&str]| {
            let v = a(t);
            let r: Vec<&str> = v.iter().map(String::as_str).collect();
            e.refuses(&r, code, want);
        };
        // The tokenizer adds a BOS: one token.
        run(
            &empty,
            2,
            &["empty.txt", "--kld-text", "only 1 tokens", "longer text"],
        );
        run(
            &short,
            2,
            &["short.txt", "--kld-text", "tokens", "longer text"],
        );
        run(&bin, 2, &["bin.txt", "not UTF-8"]);
        run(&missing, 1, &["missing.txt", "No such file"]);
    }
    // --kld-windows under the evaluator's minimum.
    e.refuses(
        &[
            "convert",
            m,
            "--weights",
            "q4_0",
            "--verify",
            "--kld-text",
            s(&e.text),
            "--kld-windows",
            "1",
        ],
        2,
        &["--kld-windows 1"],
    );
}

/// A Hessian file from `tq calib` on the model, rewritten by `edit(header, data)`.
fn hessians(e: &Env, model: &Path, name: &str, store: &str) -> PathBuf {
    let h = e.dir.join(name);
    e.ok(&[
        "calib",
        s(model),
        "--text",
        s(&e.text),
        "--tokens",
        "256",
        "--ctx",
        "64",
        "--store",
        store,
        "-o",
        s(&h),
    ]);
    h
}

/// Split a safetensors file into its JSON header and data.
fn st_parts(p: &Path) -> (serde_json::Value, Vec<u8>) {
    let b = std::fs::read(p).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h = serde_json::from_slice(&b[8..8 + n]).unwrap();
    (h, b[8 + n..].to_vec())
}

fn st_join(h: &serde_json::Value, data: &[u8]) -> Vec<u8> {
    let mut j = h.to_string().into_bytes();
    while !j.len().is_multiple_of(8) {
        j.push(b' ');
    }
    let mut b = (j.len() as u64).to_le_bytes().to_vec();
    b.extend(j);
    b.extend(data);
    b
}

#[test]
fn hessian_files_that_do_not_fit_are_refused() {
    let e = env();
    let m = s(&e.model);
    let h = hessians(&e, &e.model, "h.safetensors", "f32");
    let conv = |h: &Path| -> Vec<String> {
        ["convert", m, "--weights", "tq4_1s", "--calib", s(h)]
            .map(String::from)
            .to_vec()
    };
    let refuses = |h: &Path, want: &[&str]| {
        let v = conv(h);
        let r: Vec<&str> = v.iter().map(String::as_str).collect();
        e.refuses(&r, 2, want)
    };
    // The good file works.
    let good = e.dir.join("good.gguf");
    let mut a = conv(&h);
    a.extend(["-q".into(), "-o".into(), s(&good).into()]);
    e.ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    std::fs::remove_file(&good).unwrap();

    let bytes = std::fs::read(&h).unwrap();
    let trunc = e.file("trunc.safetensors", &bytes[..bytes.len() - 100]);
    refuses(&trunc, &["trunc.safetensors"]);
    let (hdr, data) = st_parts(&h);
    let keys: Vec<String> = hdr
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    let first = hdr[&keys[0]].clone();
    let n = first["shape"][0].as_u64().unwrap();

    // Not square: the same bytes as [n/2, 2n].
    let mut h2 = hdr.clone();
    h2[&keys[0]]["shape"] = serde_json::json!([n / 2, 2 * n]);
    let p = e.file("rect.safetensors", &st_join(&h2, &data));
    refuses(&p, &["rect.safetensors", &keys[0], "is not a Hessian"]);

    // NaN and Inf entries: the group and the position are named.
    for (name, v) in [
        ("nan.safetensors", f32::NAN),
        ("inf.safetensors", f32::INFINITY),
    ] {
        let mut d = data.clone();
        let off = first["data_offsets"][0].as_u64().unwrap() as usize;
        let at = off + 4 * (n as usize + 1); // row 1, column 1
        d[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let p = e.file(name, &st_join(&hdr, &d));
        refuses(
            &p,
            &[name, &keys[0], "non-finite", "row 1, column 1", "tq calib"],
        );
    }

    // Made for another model: a tensor the input does not have.
    let mut h3 = serde_json::Map::new();
    for (k, v) in hdr.as_object().unwrap() {
        h3.insert(k.replace("blk.0.", "blk.5."), v.clone());
    }
    let p = e.file("other-names.safetensors", &st_join(&h3.into(), &data));
    refuses(
        &p,
        &[
            "other-names.safetensors",
            "blk.5.",
            "does not have",
            "another model",
            "tq calib",
        ],
    );
    // Made for another model of other widths (hidden 128): the columns are named.
    let wide = e.file("wide.gguf", &tiny_llama_tok(1, 128, 256).bytes);
    let hw = hessians(&e, &wide, "h-wide.safetensors", "f32-upper");
    std::fs::remove_file(&wide).unwrap();
    refuses(
        &hw,
        &[
            "h-wide.safetensors",
            "has 128 columns",
            "rows have 64",
            "another model",
        ],
    );
}

#[test]
fn imatrix_files_for_another_model_or_with_nan_are_refused() {
    let e = env();
    let m = s(&e.model);
    let dat = |entries: &[(&str, Vec<f32>)]| {
        let mut d = (entries.len() as i32).to_le_bytes().to_vec();
        for (name, v) in entries {
            d.extend((name.len() as i32).to_le_bytes());
            d.extend(name.as_bytes());
            d.extend(1i32.to_le_bytes());
            d.extend((v.len() as i32).to_le_bytes());
            for x in v {
                d.extend(x.to_le_bytes());
            }
        }
        d
    };
    let conv = |p: &Path| -> Vec<String> {
        ["convert", m, "--weights", "q4_K", "--imatrix", s(p)]
            .map(String::from)
            .to_vec()
    };
    let refuses = |p: &Path, want: &[&str]| {
        let v = conv(p);
        let r: Vec<&str> = v.iter().map(String::as_str).collect();
        e.refuses(&r, 2, want)
    };
    let good = e.file("good.dat", &dat(&[("blk.0.attn_q.weight", vec![1.0; 64])]));
    let o = e.dir.join("o.gguf");
    let mut a = conv(&good);
    a.extend(["-q".into(), "-o".into(), s(&o).into()]);
    e.ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    std::fs::remove_file(&o).unwrap();
    let p = e.file(
        "names.dat",
        &dat(&[("blk.31.attn_q.weight", vec![1.0; 64])]),
    );
    refuses(
        &p,
        &[
            "names.dat",
            "blk.31.attn_q.weight",
            "does not have",
            "llama-imatrix",
        ],
    );
    let p = e.file(
        "cols.dat",
        &dat(&[("blk.0.attn_q.weight", vec![1.0; 4096])]),
    );
    refuses(&p, &["cols.dat", "has 4096 columns", "rows have 64"]);
    for (name, v) in [("nan.dat", f32::NAN), ("neg.dat", -1.0)] {
        let mut col = vec![1.0; 64];
        col[3] = v;
        let p = e.file(name, &dat(&[("blk.0.attn_q.weight", col)]));
        refuses(&p, &[name, "blk.0.attn_q.weight", "column 3", "damaged"]);
    }
    let p = e.file(
        "trunc.dat",
        &dat(&[("blk.0.attn_q.weight", vec![1.0; 64])])[..40],
    );
    refuses(&p, &["trunc.dat", "malformed"]);
    // A GGUF that is not an imatrix (the model itself).
    refuses(&e.model.clone(), &["m.gguf", "not a llama.cpp imatrix"]);
}

#[test]
fn kv_preset_flags_are_checked() {
    let e = env();
    let m = s(&e.model);
    let kv = |extra: &[&str]| {
        let out = e.dir.join("kv.gguf");
        let mut a = vec!["kv", m];
        a.extend(extra);
        a.extend(["--write", s(&out)]);
        let before = e.listing();
        let (c, stdout, err) = e.run(&a);
        assert_eq!(c, 2, "{extra:?}: {err}");
        assert!(stdout.is_empty(), "{extra:?}: {stdout}");
        assert_eq!(err.trim_end().lines().count(), 1, "{extra:?}: {err}");
        assert!(!out.exists());
        assert_eq!(e.listing(), before, "{extra:?}: files left behind");
        eprintln!("exit {c}: {}", err.trim_end().replace(s(&e.dir), "DIR"));
        err
    };
    let err = kv(&["--only", "nonesuch"]);
    assert!(err.contains("nonesuch"), "{err}");
    let err = kv(&["--only", ""]);
    assert!(err.contains("--only"), "{err}");
    for x in ["-1", "nan", "inf"] {
        let flag = format!("--max-kld={x}");
        let err = kv(&[&flag]);
        assert!(err.contains("--max-kld"), "{x}: {err}");
    }
    let err = kv(&["--measure"]);
    assert!(err.contains("--text"), "{err}");
    let short = e.file("short.txt", b"the cat");
    let err = kv(&["--measure", "--text", s(&short), "--ctx", "64"]);
    assert!(err.contains("short.txt"), "{err}");
}
