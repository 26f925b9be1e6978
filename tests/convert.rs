//! `tq convert` end to end on generated llama-shaped models: plans, recipes, constraints,
//! fallbacks, determinism across thread counts, and bad input leaving no output behind.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use std::path::{Path, PathBuf};
use tq::gguf::GgufFile;
use tq::types::TensorType;

fn write(dir: &Path, name: &str, fx: &fixtures::gguf_gen::Fixture) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, &fx.bytes).unwrap();
    p
}

#[test]
fn pure_q8_0_matches_registry_quantizer_and_keeps_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let fx = fixtures::gguf_gen::tiny_llama(2, 64, 128, 96);
    let inp = write(dir.path(), "in.gguf", &fx);
    let out = dir.path().join("out.gguf");
    let (code, _, err) = tq(&["convert", s(&inp), "--weights", "q8_0", "-o", s(&out)]);
    assert_eq!(code, 0, "{err}");
    let src = GgufFile::open(&inp).unwrap();
    let f = GgufFile::open(&out).unwrap();
    // Input metadata kept in order; file_type set in place; provenance appended.
    let keys: Vec<&str> = f.metadata.iter().map(|(k, _)| k.as_str()).collect();
    let in_keys: Vec<&str> = src.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(&keys[..in_keys.len()], &in_keys[..]);
    assert_eq!(f.get_u64("general.file_type"), Some(7));
    assert_eq!(f.get_u64("general.quantization_version"), Some(2));
    assert_eq!(f.get_str("tq.recipe"), Some("pure"));
    assert_eq!(f.get_str("tq.input.name"), Some("in.gguf"));
    // The hash is computed alongside the conversion and filled in at the end.
    let want = blake3::hash(&std::fs::read(&inp).unwrap())
        .to_hex()
        .to_string();
    assert_eq!(f.get_str("tq.input.blake3"), Some(want.as_str()));
    for (t, st) in f.tensors.iter().zip(&src.tensors) {
        assert_eq!(t.name, st.name);
        if t.dims.len() == 1 {
            assert_eq!(t.ty, TensorType::F32);
            assert_eq!(f.tensor_data(t), src.tensor_data(st));
        } else {
            assert_eq!(t.ty, TensorType::Q8_0, "{}", t.name);
            let x = src.tensor_f32(st).unwrap();
            let mut want = vec![0u8; t.size as usize];
            tq::types::quantize(TensorType::Q8_0, &x, &mut want, &t.name).unwrap();
            assert!(f.tensor_data(t) == &want[..], "{}", t.name);
        }
    }
}

#[test]
fn output_is_identical_for_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let fx = fixtures::gguf_gen::tiny_llama(2, 64, 128, 96);
    let inp = write(dir.path(), "in.gguf", &fx);
    let mut outs = vec![];
    for th in ["1", "2", "3"] {
        let out = dir.path().join(format!("out{th}.gguf"));
        let (code, _, err) = tq(&[
            "convert",
            s(&inp),
            "--weights",
            "q4_0",
            "--threads",
            th,
            "-o",
            s(&out),
        ]);
        assert_eq!(code, 0, "{err}");
        outs.push(std::fs::read(out).unwrap());
    }
    assert!(outs[0] == outs[1] && outs[1] == outs[2]);
}

#[test]
fn dry_run_predicts_the_written_size_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fx = fixtures::gguf_gen::tiny_llama(2, 64, 128, 96);
    let inp = write(dir.path(), "in.gguf", &fx);
    let out = dir.path().join("out.gguf");
    let (code, plan, err) = tq(&[
        "convert",
        s(&inp),
        "--weights",
        "q4_1",
        "--dry-run",
        "--json",
        "-o",
        s(&out),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.exists());
    let j: serde_json::Value = serde_json::from_str(&plan).unwrap();
    assert_eq!(j["tensors"].as_array().unwrap().len(), fx.tensors.len());
    assert_eq!(j["file_type"], 3);
    let (code, _, err) = tq(&["convert", s(&inp), "--weights", "q4_1", "-o", s(&out)]);
    assert_eq!(code, 0, "{err}");
    // Provenance holds the input hash only in the real run; its length is fixed (64 hex digits).
    let real = std::fs::metadata(&out).unwrap().len();
    let predicted = j["file_bytes"].as_u64().unwrap();
    assert!(
        real >= predicted && real - predicted <= 64,
        "{real} vs {predicted}"
    );
}

#[test]
fn tq_constraints_token_embd_attention_group_and_row_fallbacks() {
    let dir = tempfile::tempdir().unwrap();
    // n_embd 48: attn_k/v rows are 48 (fit 32? no: 48 % 32 = 16) -> every TQ weight with row 48 falls back.
    let fx = fixtures::gguf_gen::tiny_llama(1, 64, 80, 40);
    let inp = write(dir.path(), "in.gguf", &fx);
    let (code, plan, err) = tq(&[
        "convert",
        s(&inp),
        "--weights",
        "q8_0",
        "--tensor-type",
        "attn_v=f16",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&plan).unwrap();
    let get = |n: &str| {
        j["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .unwrap()
            .clone()
    };
    // attn_v asked f16 alone among stock types: kept (only TQ types make a layer's attention
    // share one type, since only their fork kernels rotate the shared activation in place).
    let v = get("blk.0.attn_v.weight");
    assert_eq!(v["type"], "f16");
    assert_eq!(v["fallback"], false);
    // With tq4_1s beside it, the layer's four attention tensors are unified to the majority.
    let (code, tqplan, err) = tq(&[
        "convert",
        s(&inp),
        "--weights",
        "tq4_1s",
        "--tensor-type",
        "attn_v=q8_0",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let tj: serde_json::Value = serde_json::from_str(&tqplan).unwrap();
    let tv = tj["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "blk.0.attn_v.weight")
        .unwrap();
    assert_eq!(tv["type"], "tq4_1s", "{tv}");
    assert_eq!(tv["fallback"], true);
    assert!(tv["reasons"].to_string().contains("share one type"), "{tv}");
    // ffn_down rows are 80 long: q8_0 (block 32) cannot hold them -> f16.
    let d = get("blk.0.ffn_down.weight");
    assert_eq!(d["type"], "f16");
    assert!(d["reasons"].to_string().contains("row length 80"), "{d}");
    // --strict turns that fallback into an error before writing.
    let out = dir.path().join("strict.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&inp),
        "--weights",
        "q8_0",
        "--strict",
        "-o",
        s(&out),
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--strict") && err.contains("blk.0.ffn_down.weight"),
        "{err}"
    );
    assert!(!out.exists());
    // TQ: token_embd falls back to q8_0; the profile without TQ ids refuses TQ outright.
    let (code, plan, err) = tq(&[
        "convert",
        s(&inp),
        "--weights",
        "tq4_1s",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&plan).unwrap();
    let te = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "token_embd.weight")
        .unwrap()
        .clone();
    assert_eq!(te["type"], "q8_0");
    assert_eq!(j["file_type"], 44);
    let (code, _, err) = tq(&[
        "convert",
        s(&inp),
        "--weights",
        "tq4_1s",
        "--target",
        "upstream",
        "--dry-run",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("no id in target profile 'upstream'"), "{err}");
}

#[test]
fn recipes_assign_roles_and_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let fx = fixtures::gguf_gen::tiny_llama(6, 64, 256, 64);
    let inp = write(dir.path(), "in.gguf", &fx);
    let (code, plan, err) = tq(&[
        "convert",
        s(&inp),
        "--recipe",
        "config-i",
        "--tensor-type",
        "ffn_down=q8_0",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&plan).unwrap();
    let ty = |n: &str| {
        j["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .unwrap()["type"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(ty("blk.0.attn_q.weight"), "q8_0"); // boundary (first 2)
    assert_eq!(ty("blk.1.ffn_up.weight"), "q8_0");
    assert_eq!(ty("blk.2.attn_q.weight"), "tq4_1s");
    assert_eq!(ty("blk.3.ffn_gate.weight"), "tq4_1s");
    assert_eq!(ty("blk.3.ffn_down.weight"), "q8_0"); // --tensor-type override
    assert_eq!(ty("blk.4.attn_k.weight"), "q8_0"); // boundary (last 2)
    assert_eq!(ty("token_embd.weight"), "q8_0");
    assert_eq!(ty("output.weight"), "q8_0");
    assert_eq!(ty("blk.3.attn_norm.weight"), "f32");
    assert_eq!(j["file_type"], 44);
    // tq3_1s as --weights makes config-i's TQ slots TQ3_1S; overrides can come from a file.
    let tf = dir.path().join("types.txt");
    std::fs::write(&tf, "# comment\n\nffn_down=q8_0\n").unwrap();
    let (_, plan, _) = tq(&[
        "convert",
        s(&inp),
        "--recipe",
        "config-i",
        "--weights",
        "tq3_1s",
        "--tensor-type-file",
        s(&tf),
        "--dry-run",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&plan).unwrap();
    assert_eq!(j["file_type"], 43);
    assert_eq!(ty2(&j, "blk.3.ffn_down.weight"), "q8_0");
    assert_eq!(ty2(&j, "blk.3.ffn_up.weight"), "tq3_1s");
}

/// One rule for non-finite values: every tensor convert writes is checked, copies included — a
/// NaN in an F16 weight copied as f16, an Inf in an F32 norm copied as f32, a NaN in a pure copy.
#[test]
fn non_finite_values_are_refused_in_copies_too() {
    let dir = tempfile::tempdir().unwrap();
    let fx = fixtures::gguf_gen::tiny_llama(1, 64, 64, 32);
    // name, bad value, element, F16 (type 1) for 2-D tensors or F32, flags, expected message
    for (name, bad, at, f16, flags, want) in [
        (
            "blk.0.ffn_up.weight",
            f32::NAN,
            64 * 3 + 5,
            true,
            vec!["--weights", "f16"],
            "row 3, column 5",
        ),
        (
            "blk.0.ffn_norm.weight",
            f32::INFINITY,
            9,
            false,
            vec!["--weights", "q8_0"],
            "inf at row 0, column 9",
        ),
        (
            "blk.0.attn_v.weight",
            f32::NAN,
            64 + 1,
            false,
            vec![],
            "NaN at row 1, column 1",
        ),
    ] {
        let tensors = fx
            .tensors
            .iter()
            .map(|(n, d, _, data)| {
                let mut v: Vec<f32> = data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                if n == name {
                    v[at] = bad;
                }
                if f16 && d.len() == 2 {
                    let b = v
                        .iter()
                        .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
                        .collect();
                    (n.clone(), d.clone(), 1u32, b)
                } else {
                    let b = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    (n.clone(), d.clone(), 0u32, b)
                }
            })
            .collect();
        let bad_fx = fixtures::gguf_gen::build_with_data(3, None, fx.metadata.clone(), tensors);
        let inp = write(dir.path(), "nan.gguf", &bad_fx);
        let out = dir.path().join("out.gguf");
        let mut a = vec!["convert", s(&inp), "-o", s(&out)];
        a.extend(flags);
        let (code, _, err) = tq(&a);
        assert_eq!(code, 2, "{name}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(name) && err.contains(want), "{err}");
        assert!(!out.exists());
    }
}

#[test]
fn bad_inputs_fail_cleanly_with_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let mut fx = fixtures::gguf_gen::tiny_llama(1, 64, 64, 32);
    // Poison one weight with NaN.
    let (name, _, _, data) = fx
        .tensors
        .iter()
        .find(|t| t.0 == "blk.0.ffn_up.weight")
        .unwrap()
        .clone();
    let pos = fx
        .bytes
        .windows(data.len())
        .position(|w| w == &data[..])
        .unwrap();
    let nan_at = pos + 4 * (64 * 3 + 5);
    fx.bytes[nan_at..nan_at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let inp = write(dir.path(), "nan.gguf", &fx);
    let out = dir.path().join("out.gguf");
    let (code, _, err) = tq(&["convert", s(&inp), "--weights", "q8_0", "-o", s(&out)]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&name) && err.contains("row 3, column 5") && err.contains("NaN"),
        "{err}"
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file left"
    );
    // Output = input, unknown type, unknown recipe, bad regex, missing -o.
    for (args, expect) in [
        (
            vec!["--weights", "q8_0", "-o", s(&inp)],
            "output is the input",
        ),
        (
            vec!["--weights", "q9_9", "-o", s(&out)],
            "unknown tensor type 'q9_9'",
        ),
        (
            vec!["--recipe", "fancy", "-o", s(&out)],
            "unknown recipe 'fancy'",
        ),
        (vec!["--tensor-type", "(=q8_0", "-o", s(&out)], "bad regex"),
        (vec!["--weights", "q8_0"], "give -o"),
        (
            vec!["--weights", "q8_0", "-o", "/nonexistent-dir/x.gguf"],
            "does not exist",
        ),
    ] {
        let mut a = vec!["convert", s(&inp)];
        a.extend(args);
        let (code, _, err) = tq(&a);
        assert_eq!(code, 2, "{a:?}: {err}");
        assert!(err.contains(expect), "{a:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}

#[test]
fn requantizing_and_copying_are_reported() {
    let Some(smol) = fixtures::smollm2() else {
        return;
    };
    let (code, plan, err) = tq(&[
        "convert",
        s(&smol),
        "--weights",
        "q4_1",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&plan).unwrap();
    let ts = j["tensors"].as_array().unwrap();
    // Same type as the source: copied byte for byte; token_embd q8_0 -> q4_1 is a requantization.
    assert!(ts
        .iter()
        .filter(|t| t["source_type"] == "q4_1")
        .all(|t| t["action"] == "copy"));
    let te = ts
        .iter()
        .find(|t| t["name"] == "token_embd.weight")
        .unwrap();
    assert_eq!(te["action"], "requantize");
    assert!(te["reasons"].to_string().contains("requantized from q8_0"));
}

fn ty2(j: &serde_json::Value, n: &str) -> String {
    j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == n)
        .unwrap()["type"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Zero-element tensors (ne0 = 0, e.g. dims [0, 576]) are valid GGUF: llama.cpp's gguf reader
/// skips its overflow check for them and gguf-py reads them. They convert as empty tensors (of
/// the planned type), whatever the request; a 0-dim tensor is one value. Used to panic
/// ("chunk_size must not be zero").
#[test]
fn zero_element_tensors_convert_as_empty_tensors() {
    use tq::gguf::{GString, Value};
    let dir = tempfile::tempdir().unwrap();
    let md = vec![(
        "general.architecture".to_string(),
        Value::String(GString::from("llama")),
    )];
    let q: Vec<u8> = fixtures::gguf_gen::gaussian(1, 64 * 64, 0.02)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let t = |n: &str, dims: Vec<u64>, id: u32, data: Vec<u8>| (n.to_string(), dims, id, data);
    let fx = fixtures::gguf_gen::build_with_data(
        3,
        None,
        md,
        vec![
            t("blk.0.attn_q.weight", vec![64, 64], 0, q),
            t("blk.0.attn_k.weight", vec![0, 576], 1, vec![]),
            t("blk.0.attn_v.weight", vec![64, 0], 1, vec![]),
            t("blk.0.ffn_up.weight", vec![0, 576], 8, vec![]),
            t("scalar", vec![], 1, vec![0, 0x3c]),
        ],
    );
    let inp = write(dir.path(), "in.gguf", &fx);
    for args in [
        vec!["--weights", "q8_0"],
        vec!["--weights", "tq4_1s", "--recipe", "hybrid"],
        vec![],
    ] {
        let out = dir.path().join("out.gguf");
        let mut a = vec!["convert", s(&inp), "-o", s(&out), "-q"];
        a.extend(&args);
        let (code, _, err) = tq(&a);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        let f = GgufFile::open(&out).unwrap();
        for (name, dims) in [
            ("blk.0.attn_k.weight", vec![0u64, 576]),
            ("blk.0.attn_v.weight", vec![64, 0]),
            ("blk.0.ffn_up.weight", vec![0, 576]),
        ] {
            let t = f.tensor(name).unwrap();
            assert_eq!((t.dims.clone(), t.size), (dims, 0), "{args:?} {name}");
        }
        let t = f.tensor("scalar").unwrap();
        assert!(t.dims.is_empty(), "{args:?}");
        let want = if args.is_empty() {
            TensorType::F16
        } else {
            TensorType::F32
        };
        assert_eq!(t.ty, want, "{args:?}");
        std::fs::remove_file(&out).unwrap();
    }
}

/// Files no engine can load (llama.cpp's loader and `tq eval` refuse them) used to convert with
/// exit 0 and no word: now one warning line each, naming the tensor or key, and `--strict`
/// refuses them before writing (exit 2, no output).
#[test]
fn files_engines_refuse_warn_and_fail_under_strict() {
    use tq::gguf::Value;
    let dir = tempfile::tempdir().unwrap();
    let base = fixtures::gguf_gen::tiny_llama(2, 64, 128, 96);
    let rebuild = |md: Vec<(String, Value)>, t: Vec<(String, Vec<u64>, u32, Vec<u8>)>| {
        fixtures::gguf_gen::build_with_data(3, None, md, t)
    };
    let long = format!("{}.weight", "x".repeat(60));
    let cases: Vec<(&str, fixtures::gguf_gen::Fixture, Vec<&str>)> = vec![
        (
            "name over 63 bytes",
            {
                let mut t = base.tensors.clone();
                t.push((long.clone(), vec![64], 0, vec![0; 256]));
                rebuild(base.metadata.clone(), t)
            },
            vec![long.as_str(), "67 bytes", "63"],
        ),
        (
            "head_count 0",
            {
                let mut md = base.metadata.clone();
                for (k, v) in &mut md {
                    if k == "llama.attention.head_count" {
                        *v = Value::U32(0);
                    }
                }
                rebuild(md, base.tensors.clone())
            },
            vec!["llama.attention.head_count = 0"],
        ),
        (
            "missing tensor",
            {
                let t = base
                    .tensors
                    .iter()
                    .filter(|t| t.0 != "blk.1.ffn_down.weight")
                    .cloned()
                    .collect();
                rebuild(base.metadata.clone(), t)
            },
            vec!["blk.1.ffn_down.weight is missing"],
        ),
        (
            "swapped shape",
            {
                let mut t = base.tensors.clone();
                for x in &mut t {
                    if x.0 == "blk.0.ffn_down.weight" {
                        x.1.reverse();
                    }
                }
                rebuild(base.metadata.clone(), t)
            },
            vec![
                "blk.0.ffn_down.weight has shape [64, 128]",
                "[128, 64]",
                "swapped",
            ],
        ),
        (
            "fewer blocks than block_count",
            {
                let t = base
                    .tensors
                    .iter()
                    .filter(|t| !t.0.starts_with("blk.1."))
                    .cloned()
                    .collect();
                rebuild(base.metadata.clone(), t)
            },
            vec!["llama.block_count = 2", "1 blocks"],
        ),
    ];
    for (what, fx, want) in cases {
        let inp = write(dir.path(), "in.gguf", &fx);
        let out = dir.path().join("out.gguf");
        let (code, _, err) = tq(&["convert", s(&inp), "--weights", "q8_0", "-q", "-o", s(&out)]);
        assert_eq!(code, 0, "{what}: {err}");
        let warns: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
        let line = warns
            .iter()
            .find(|l| want.iter().all(|w| l.contains(w)))
            .unwrap_or_else(|| panic!("{what}: no warning line with {want:?} in: {err}"));
        assert!(line.contains("in.gguf"), "{what}: names the input: {line}");
        assert!(out.exists(), "{what}");
        std::fs::remove_file(&out).unwrap();

        let (code, _, err) = tq(&[
            "convert",
            s(&inp),
            "--weights",
            "q8_0",
            "--strict",
            "-o",
            s(&out),
        ]);
        assert_eq!(code, 2, "{what}: {err}");
        let first = err.lines().find(|l| l.contains("error")).unwrap_or("");
        assert!(
            first.contains("--strict") && want.iter().all(|w| first.contains(w)),
            "{what}: {err}"
        );
        assert!(!out.exists(), "{what}: --strict wrote {}", out.display());
    }
    // The well-formed model: no warning.
    let inp = write(dir.path(), "in.gguf", &base);
    let out = dir.path().join("out.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&inp),
        "--weights",
        "q8_0",
        "--strict",
        "-o",
        s(&out),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

/// `--weights iq4_xs` / `--tensor-type X=iq4_nl` write the registry's (llama-quantize's) IQ4 bytes;
/// rows that do not hold iq4_xs's 256-value super-blocks fall back to iq4_nl, as llama-quantize
/// does; the file is the same for any thread count.
#[test]
fn iq4_weights_and_overrides_write_registry_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // n_embd 64: attention/ffn_gate/up rows of 64 hold iq4_nl but not iq4_xs; ffn_down rows 256.
    let fx = fixtures::gguf_gen::tiny_llama(1, 64, 256, 96);
    let inp = write(dir.path(), "in.gguf", &fx);
    let src = GgufFile::open(&inp).unwrap();
    let check = |f: &GgufFile, name: &str, ty: TensorType| {
        let t = f.tensor(name).unwrap();
        assert_eq!(t.ty, ty, "{name}");
        let x = src.tensor_f32(src.tensor(name).unwrap()).unwrap();
        let mut want = vec![0u8; t.size as usize];
        tq::types::quantize(ty, &x, &mut want, name).unwrap();
        assert!(f.tensor_data(t) == &want[..], "{name}");
    };
    let mut outs = vec![];
    for th in ["1", "3"] {
        let out = dir.path().join(format!("xs{th}.gguf"));
        let (code, _, err) = tq(&[
            "convert",
            s(&inp),
            "--weights",
            "iq4_xs",
            "--target",
            "upstream",
            "--threads",
            th,
            "-q",
            "-o",
            s(&out),
        ]);
        assert_eq!(code, 0, "{err}");
        let f = GgufFile::open(&out).unwrap();
        check(&f, "blk.0.ffn_down.weight", TensorType::IQ4XS);
        check(&f, "blk.0.attn_q.weight", TensorType::IQ4NL);
        check(&f, "blk.0.ffn_up.weight", TensorType::IQ4NL);
        outs.push(std::fs::read(out).unwrap());
    }
    assert!(outs[0] == outs[1], "bytes depend on the thread count");
    let out = dir.path().join("nl.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&inp),
        "--weights",
        "q8_0",
        "--tensor-type",
        "ffn_down=iq4_nl",
        "-q",
        "-o",
        s(&out),
    ]);
    assert_eq!(code, 0, "{err}");
    let f = GgufFile::open(&out).unwrap();
    check(&f, "blk.0.ffn_down.weight", TensorType::IQ4NL);
    check(&f, "blk.0.attn_q.weight", TensorType::Q8_0);
}
