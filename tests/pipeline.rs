//! The pipeline end to end through the binary: every `--weights` type tq writes × every
//! calibration mode (none, `--imatrix`, `--calib H`, `--calib TEXT`, `--calib-sequential`)
//! converts a small model whose rows hold every type's superblock, and the calibrated modes change
//! the bytes where the type has a calibrated encoder.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use std::path::Path;
use tq::types::{TensorType, TYPES};

/// The bytes of `name` in the GGUF at `p`.
fn tensor(p: &Path, name: &str) -> (TensorType, Vec<u8>) {
    let f = tq::gguf::GgufFile::open(p).unwrap();
    let t = f.tensor(name).unwrap();
    (t.ty, f.tensor_data(t).to_vec())
}

/// The weight types tq writes (not KV-cache types) that the default (fork) profile loads.
fn weight_types() -> Vec<TensorType> {
    let fork = tq::types::profile::Profile::default();
    TYPES
        .iter()
        .map(|i| i.ty)
        .filter(|t| {
            !t.is_turbo()
                && (t.info().quantize.is_some() || t.rotates_rows())
                && fork.id_of(*t).is_some()
        })
        .collect()
}

#[test]
fn every_weight_type_converts_in_every_calibration_mode() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let model = p("tiny256.gguf");
    std::fs::write(
        &model,
        fixtures::gguf_gen::tiny_llama_tok(1, 256, 256).bytes,
    )
    .unwrap();
    let text = p("calib.txt");
    std::fs::write(&text, fixtures::gguf_gen::pseudo_text(600)).unwrap();
    let calib_text = ["--calib-tokens", "256", "--calib-ctx", "32"];
    // Hessians and an imatrix from the same text.
    let (code, _, err) = tq(&[
        "calib",
        s(&model),
        "--text",
        s(&text),
        "--tokens",
        "256",
        "--ctx",
        "32",
        "-o",
        s(&p("h.safetensors")),
        "--imatrix-out",
        s(&p("imatrix.gguf")),
    ]);
    assert_eq!(code, 0, "{err}");
    let h = p("h.safetensors");
    let im = p("imatrix.gguf");
    let modes: Vec<(&str, Vec<&str>)> = vec![
        ("none", vec![]),
        ("imatrix", vec!["--imatrix", s(&im)]),
        ("calib-h", vec!["--calib", s(&h)]),
        (
            "calib-text",
            [&["--calib", s(&text)][..], &calib_text].concat(),
        ),
        (
            "calib-sequential",
            [
                &["--calib", s(&text), "--calib-sequential"][..],
                &calib_text,
            ]
            .concat(),
        ),
    ];
    let types = weight_types();
    assert!(types.len() >= 19, "{types:?}");
    let probe = "blk.0.ffn_down.weight";
    let mut failures = vec![];
    for ty in &types {
        let mut bytes: Vec<(&str, Vec<u8>)> = vec![];
        for (mode, extra) in &modes {
            let out = p(&format!("{}-{mode}.gguf", ty.name()));
            let mut a = vec![
                "convert",
                s(&model),
                "--weights",
                ty.name(),
                "-q",
                "-o",
                s(&out),
            ];
            a.extend(extra.iter().copied());
            let (code, _, err) = tq(&a);
            if code != 0 {
                failures.push(format!(
                    "--weights {} ({mode}): exit {code}: {}",
                    ty.name(),
                    err.trim()
                ));
                continue;
            }
            let (got, b) = tensor(&out, probe);
            assert_eq!(got, *ty, "{mode}: {probe} was written as {got}, not {ty}");
            bytes.push((mode, b));
            let _ = std::fs::remove_file(&out);
        }
        if bytes.len() != modes.len() {
            continue;
        }
        // Calibration reaches the encoder: LDLQ changes the bytes of a type that has it, the
        // imatrix those of a grid type; the text modes agree with the Hessian file only in the
        // batched mode (sequential Hessians see the quantized first sub-blocks).
        let get = |m: &str| &bytes.iter().find(|(x, _)| *x == m).unwrap().1;
        if ty.has_ldlq() {
            assert_ne!(get("none"), get("calib-h"), "{ty}: --calib H had no effect");
            assert_eq!(
                get("calib-h"),
                get("calib-text"),
                "{ty}: --calib TEXT differs from --calib H"
            );
        } else {
            assert_eq!(
                get("none"),
                get("calib-h"),
                "{ty}: no LDLQ, yet --calib changed the bytes"
            );
        }
        // The imatrix reaches the stock grid types and the i-quants with llama.cpp's own weighted
        // encoders (iq2_*, iq3_xxs, iq3_s, iq1_s, iq1_m); q8_0's, like llama.cpp's, ignores it.
        if *ty == TensorType::Q8_0 {
            assert_eq!(
                get("none"),
                get("imatrix"),
                "q8_0: llama.cpp's encoder ignores the imatrix, tq's changed the bytes"
            );
        } else if ty.imatrix_weighted() {
            assert_ne!(get("none"), get("imatrix"), "{ty}: --imatrix had no effect");
        } else {
            assert_eq!(
                get("none"),
                get("imatrix"),
                "{ty}: not a grid type, yet --imatrix changed the bytes"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} conversions failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
