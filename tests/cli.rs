//! The `tq` binary end to end: inspect output (text and JSON) on real and generated files, and
//! bad input → one-line error naming the file, exit code 2, no panic.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::tq;
use std::process::Command;

/// `tq inspect … | head -1`: the reader goes away early; tq must end quietly, not panic.
#[test]
fn closed_stdout_pipe_is_not_a_panic() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fx.gguf");
    std::fs::write(&p, fixtures::gguf_gen::standard(3, None).bytes).unwrap();
    for json in [false, true] {
        let mut args = vec!["inspect", p.to_str().unwrap(), "--full"];
        if json {
            args.push("--json");
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_tq"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // close the read end before tq writes
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert_ne!(o.status.code(), Some(101), "{err}");
    }
}

#[test]
fn inspect_smollm2_json() {
    let Some(p) = fixtures::smollm2() else { return };
    let (code, out, err) = tq(&["inspect", p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["format"], "gguf");
    assert_eq!(j["tensors"].as_array().unwrap().len(), 272);
    assert_eq!(j["parameters"], 134_515_008u64);
    let totals = j["totals"].as_array().unwrap();
    let q41 = totals.iter().find(|t| t["type"] == "q4_1").unwrap();
    assert_eq!(q41["tensors"], 210);
    assert_eq!(
        totals.iter().find(|t| t["type"] == "f32").unwrap()["tensors"],
        61
    );
    assert_eq!(
        totals.iter().find(|t| t["type"] == "q8_0").unwrap()["tensors"],
        1
    );
    // Long arrays are summarized, not dumped.
    let toks = j["metadata"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"] == "tokenizer.ggml.tokens")
        .unwrap();
    assert_eq!(toks["value"]["len"], 49152);
    assert_eq!(toks["type"], "array[string]");
    // Sum of tensor bytes ≈ q4_1 5 bpw + q8_0 8.5 bpw + f32.
    let bpw = j["bpw"].as_f64().unwrap();
    assert!((bpw - 5.7437).abs() < 1e-3, "{bpw}");
}

#[test]
fn inspect_text_has_table_and_totals() {
    let fx = fixtures::gguf_gen::standard(3, None);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fx.gguf");
    std::fs::write(&p, &fx.bytes).unwrap();
    let (code, out, err) = tq(&["inspect", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("blk.0.attn_v.weight") && out.contains("tq4_1s"),
        "{out}"
    );
    assert!(out.contains("totals per type"));
    assert!(
        out.contains("[i32; 100] -300, -293"),
        "long arrays summarized: {out}"
    );
    // With the upstream profile the fork's id 46 is unknown: a clear error.
    let (code, _, err) = tq(&["inspect", p.to_str().unwrap(), "--target", "upstream"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown ggml type id 46"), "{err}");
    // A type map from another fork that places TQ4_1S at 46 works again.
    let m = dir.path().join("map.json");
    std::fs::write(&m, r#"{"name":"x","types":{"tq4_1s":46}}"#).unwrap();
    let (code, out, _) = tq(&[
        "inspect",
        p.to_str().unwrap(),
        "--type-map",
        m.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("\"profile\": \"x\""));
    // Both at once is ambiguous: a usage error, not a silent choice.
    let (code, _, err) = tq(&[
        "inspect",
        p.to_str().unwrap(),
        "--target",
        "upstream",
        "--type-map",
        m.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn inspect_minilm_safetensors() {
    let Some(p) = fixtures::minilm() else { return };
    let (code, out, err) = tq(&["inspect", p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["format"], "safetensors");
    // The header has 105 entries: 104 tensors and `__metadata__` ({"format": "pt"}).
    let bytes = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let keys = header.as_object().unwrap();
    assert_eq!(keys.len(), 105);
    let tensors = j["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 104);
    for t in tensors {
        let h = &keys[t["name"].as_str().unwrap()];
        assert_eq!(h["shape"], t["shape"]);
        assert_eq!(
            h["dtype"].as_str().unwrap().to_lowercase(),
            t["type"].as_str().unwrap()
        );
    }
    assert_eq!(j["metadata"][0]["key"], "format");
    assert_eq!(j["metadata"][0]["value"], "pt");
}

#[test]
fn bad_inputs_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let fx = fixtures::gguf_gen::standard(3, None);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.gguf", vec![], "neither a GGUF file"),
        (
            "text.gguf",
            b"hello world, not a model".to_vec(),
            "neither a GGUF file",
        ),
        (
            "trunc.gguf",
            fx.bytes[..fx.bytes.len() / 2].to_vec(),
            "truncated",
        ),
        (
            "st.safetensors",
            {
                let mut b = 1000u64.to_le_bytes().to_vec();
                b.extend_from_slice(b"{\"a\":1}");
                b.extend_from_slice(&[b' '; 12]);
                b
            },
            "invalid safetensors file",
        ),
    ];
    for (name, bytes, expect) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let (code, out, err) = tq(&["inspect", p.to_str().unwrap()]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(out.is_empty());
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: one line: {err}");
        assert!(err.contains(name) && err.contains(expect), "{name}: {err}");
        assert!(!err.contains("panicked"));
    }
    let (code, _, err) = tq(&["inspect", dir.path().join("missing.gguf").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("missing.gguf") && err.contains("No such file"),
        "{err}"
    );
    let (code, _, err) = tq(&["inspect", "x", "--target", "nonesuch"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown target profile 'nonesuch'"), "{err}");
}

/// A sparse 8 GiB GGUF: inspect reads only the header pages.
#[test]
fn inspect_large_sparse_file() {
    let dims = vec![65536u64, 65536];
    let mut fx = fixtures::gguf_gen::build(
        3,
        None,
        fixtures::gguf_gen::all_value_types(),
        &[("big", vec![32], 1, 1, 2)],
    );
    // Patch the single tensor's dims to 65536 x 65536 f16 (8 GiB) and extend the file sparsely.
    let pos = fx.bytes.windows(3).position(|w| w == b"big").unwrap() + 3;
    fx.bytes[pos..pos + 4].copy_from_slice(&2u32.to_le_bytes());
    let mut b = fx.bytes[..pos + 4].to_vec();
    for d in &dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&fx.bytes[pos + 12..pos + 24]); // type + offset
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.gguf");
    std::fs::write(&p, &b).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(b.len() as u64 + 65536 * 65536 * 2).unwrap();
    let (code, out, err) = tq(&["inspect", p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["parameters"], 65536u64 * 65536);
}

/// Issue 15's smaller findings: names from a file are escaped by `inspect`; `--threads` is
/// capped; the messages for a lone safetensors file, a directory, a device, `--calib-tokens 0`,
/// `--tokens 0` and `--damp nan` say what is wrong; `--help` states the tq4_1s default of
/// overrides and what `--no-provenance` leaves.
#[test]
fn small_findings_have_clear_messages() {
    use tq::gguf::{GString, Value};
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).to_str().unwrap().to_string();

    // inspect: control characters in a key and a tensor name are escaped.
    let fx = fixtures::gguf_gen::build_with_data(
        3,
        None,
        vec![(
            "general.name\u{7}".into(),
            Value::String(GString::from("x")),
        )],
        vec![("evil\u{1b}[31m.weight".into(), vec![4], 0, vec![0u8; 16])],
    );
    std::fs::write(d("ctl.gguf"), &fx.bytes).unwrap();
    let (code, out, err) = tq(&["inspect", &d("ctl.gguf")]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert!(
        out.contains("evil\\u{1b}[31m.weight") && out.contains("general.name\\u{7}"),
        "{out}"
    );

    let model = d("tiny.gguf");
    std::fs::write(&model, fixtures::gguf_gen::tiny_llama(1, 64, 64, 32).bytes).unwrap();
    std::fs::write(d("text.txt"), "some calibration text ".repeat(50)).unwrap();
    std::fs::write(d("toks.txt"), "1 2 3 4 5 6 7 8").unwrap();
    let st = {
        let v = vec![(
            "w".to_string(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &[0u8; 8])
                .unwrap(),
        )];
        safetensors::serialize(v, None).unwrap()
    };
    std::fs::write(d("x.safetensors"), st).unwrap();
    let out_gguf = d("out.gguf");
    let (toks, text, stf, hfile) = (
        d("toks.txt"),
        d("text.txt"),
        d("x.safetensors"),
        d("h.safetensors"),
    );
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["convert", &model, "--threads", "100000", "--dry-run"],
            "--threads 100000 is more than 4 x the",
        ),
        (
            vec!["eval", &model, "--tokens", &toks, "--threads", "100000"],
            "--threads 100000 is more than 4 x the",
        ),
        (
            vec!["convert", &stf, "--dry-run"],
            "a single safetensors file is not a model: give the Hugging Face model directory",
        ),
        (
            vec!["eval", dir.path().to_str().unwrap(), "--tokens", &toks],
            "is a directory; give a GGUF file",
        ),
        (
            vec!["convert", "/dev/null", "-o", &out_gguf],
            "/dev/null: is not a regular file",
        ),
        (
            vec![
                "convert",
                &model,
                "--weights",
                "tq4_1s",
                "--calib",
                &text,
                "--calib-tokens",
                "0",
                "-o",
                &out_gguf,
            ],
            "--calib-tokens 0 is less than one window: it must be at least --calib-ctx 512",
        ),
        (
            vec![
                "calib",
                &model,
                "--token-file",
                &toks,
                "--tokens",
                "0",
                "-o",
                &hfile,
            ],
            "--tokens 0 is less than one window: it must be at least --ctx 512",
        ),
        (
            vec![
                "convert",
                &model,
                "--weights",
                "tq4_1s",
                "--damp",
                "nan",
                "-o",
                &out_gguf,
            ],
            "--damp NaN must be a finite number >= 0",
        ),
        (
            vec![
                "convert",
                &model,
                "--weights",
                "tq4_1s",
                "--shrink",
                "1.5",
                "-o",
                &out_gguf,
            ],
            "--shrink 1.5 must be between 0 and 1",
        ),
    ];
    for (args, want) in cases {
        let (code, _, err) = tq(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: want '{want}' in {err}");
    }
    assert!(!std::path::Path::new(&out_gguf).exists());

    let (code, help, _) = tq(&["convert", "--help"]);
    assert_eq!(code, 0);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("Without --weights, every other 2-D weight is quantized to tq4_1s"),
        "{help}"
    );
    assert!(
        help.contains("general.file_type is still set from the plan"),
        "{help}"
    );
}

/// A tensor name or metadata key longer than 65535 bytes (a valid GGUF string) used to panic the
/// text report ("Formatting argument out of range": the column width came from the data). Text
/// cuts it to `inspect::NAME_CELL` characters with `…`; JSON keeps it whole; `convert
/// --dry-run` prints its plan table the same way.
#[test]
fn inspect_and_dry_run_render_very_long_names() {
    use tq::gguf::{GString, Value};
    let long = "n".repeat(70_000);
    let key = format!("general.{}", "k".repeat(70_000));
    let md = vec![
        (
            "general.architecture".to_string(),
            Value::String(GString::from("llama")),
        ),
        (key.clone(), Value::U32(1)),
    ];
    let fx = fixtures::gguf_gen::build(3, None, md, &[(long.as_str(), vec![32, 2], 0, 1, 4)]);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("long.gguf");
    std::fs::write(&p, &fx.bytes).unwrap();
    let p = p.to_str().unwrap();
    let (code, out, err) = tq(&["inspect", p]);
    assert_eq!(code, 0, "{err}");
    let cut = format!("{}…", &long[..tq::inspect::NAME_CELL - 1]);
    assert!(
        out.contains(&cut) && !out.contains(&long),
        "{}",
        &out[..200]
    );
    assert!(
        out.lines().all(|l| l.chars().count() < 400),
        "no line padded to the long name"
    );
    let (code, out, err) = tq(&["inspect", p, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&long) && out.contains(&key));
    let (code, out, err) = tq(&["convert", p, "--weights", "q8_0", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&cut), "{}", &out[..200]);
}
