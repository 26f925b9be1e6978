//! The seed design's 2-bit packer (FORMATS.md §6) against every case of
//! `../shared/conformance/seed2bit.json`, and `tq conformance` over all six shared vector files.
//! The vectors are the arbiter; flipping one code of one case must fail, naming that case.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use serde_json::Value;
use std::path::Path;

fn counts(rep: &tq::conformance::Report) -> Vec<(String, usize, usize)> {
    rep.ops
        .iter()
        .map(|o| (o.op.clone(), o.pass, o.total))
        .collect()
}

#[test]
fn every_seed2bit_case_is_bit_exact() {
    let rep = tq::conformance::run_file(&fixtures::conformance("seed2bit.json")).unwrap();
    assert!(rep.pass(), "{:#?}", rep.failures);
    let want = [
        ("signsFor", 6),
        ("pack2bit", 42),
        ("reconstruct", 42),
        ("requant2bit", 5),
        ("ldlqRound2bit", 9),
        ("ldlqRound2bit(no L)", 9),
    ];
    let got = counts(&rep);
    assert_eq!(got.len(), want.len(), "{got:?}");
    for ((op, pass, total), (wop, wn)) in got.iter().zip(want) {
        assert_eq!((op.as_str(), *pass, *total), (wop, wn, wn));
    }
}

/// Write `doc` with one change to a temporary file and run it.
fn run_changed(doc: &Value, dir: &Path, name: &str) -> tq::conformance::Report {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string(doc).unwrap()).unwrap();
    tq::conformance::run_file(&p).unwrap()
}

fn seed_doc() -> Value {
    let text = std::fs::read_to_string(fixtures::conformance("seed2bit.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// One flipped 2-bit code (XOR 1 at one element) in each op's expected words fails exactly that
/// case of that op.
#[test]
fn one_flipped_code_fails_its_case() {
    let dir = tempfile::tempdir().unwrap();
    for (op, key, fails) in [
        ("pack2bit", "qw", "pack2bit"),
        ("pack2bit", "qw", "reconstruct"),
        ("requant2bit", "qw", "requant2bit"),
        ("ldlqRound2bit", "qw", "ldlqRound2bit"),
        ("ldlqRound2bit", "qw_no_L", "ldlqRound2bit(no L)"),
    ] {
        let mut doc = seed_doc();
        let cases = doc["cases"].as_array_mut().unwrap();
        // The last case of the op, and a code in the middle of its words.
        let c = cases.iter_mut().rev().find(|c| c["op"] == op).unwrap();
        let id = c["id"].as_str().unwrap().to_string();
        let words = c[key].as_array_mut().unwrap();
        let w = words.len() / 2;
        let flipped = words[w].as_u64().unwrap() ^ (1 << 6);
        words[w] = flipped.into();
        let rep = run_changed(&doc, dir.path(), "flipped.json");
        assert!(!rep.pass(), "{op}/{key}: a flipped code passed");
        let op_count = rep.ops.iter().find(|o| o.op == fails).unwrap();
        assert_eq!(op_count.pass + 1, op_count.total, "{fails}: {:?}", rep.ops);
        assert!(
            rep.failures
                .iter()
                .any(|f| f.starts_with(&format!("{fails} {id}:"))),
            "{fails} {id} not named: {:?}",
            rep.failures
        );
    }
}

/// A changed sign bit and a changed scale fail too (the generator and the f32 scale rounding).
#[test]
fn changed_sign_bit_and_scale_fail() {
    let dir = tempfile::tempdir().unwrap();
    let mut doc = seed_doc();
    let bits = doc["signs"]["128"].as_str().unwrap().to_string();
    let flipped: String = bits
        .chars()
        .enumerate()
        .map(|(i, ch)| match (i, ch) {
            (77, '1') => '0',
            (77, _) => '1',
            _ => ch,
        })
        .collect();
    doc["signs"]["128"] = flipped.into();
    let rep = run_changed(&doc, dir.path(), "signs.json");
    assert!(rep
        .failures
        .iter()
        .any(|f| f.contains("signsFor K=128") && f.contains("element 77")));

    let mut doc = seed_doc();
    let c = &mut doc["cases"][3];
    let id = c["id"].as_str().unwrap().to_string();
    let sc = c["sc"].as_array_mut().unwrap();
    sc[0] = (sc[0].as_u64().unwrap() + 1).into();
    let rep = run_changed(&doc, dir.path(), "scale.json");
    assert!(rep
        .failures
        .iter()
        .any(|f| f.starts_with(&format!("pack2bit {id}: scales"))));
}

const SHARED: [&str; 6] = [
    "tq4_1s.json",
    "tq3_1s.json",
    "turbo2_0.json",
    "turbo3_0.json",
    "turbo4_0.json",
    "seed2bit.json",
];

#[test]
fn cli_passes_all_six_shared_files() {
    let paths: Vec<String> = SHARED
        .iter()
        .map(|f| s(&fixtures::conformance(f)).to_string())
        .collect();
    let mut args = vec!["conformance".to_string()];
    args.extend(paths);
    let (code, out, err) = tq(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    for line in [
        "tq4_1s.quantize            220/220   ok",
        "tq3_1s.dequantize          220/220   ok",
        "turbo2.quantize            203/203   ok",
        "turbo3.dequantize          203/203   ok",
        "turbo4.quantize            203/203   ok",
        "pack2bit                    42/42    ok",
        "ldlqRound2bit(no L)          9/9     ok",
    ] {
        assert!(out.contains(line), "missing `{line}` in\n{out}");
    }
    assert!(!out.contains("FAIL"), "{out}");
}

/// A corrupted copy of a fork file: one byte of one case changed → exit 2, the case named.
#[test]
fn cli_fails_on_a_corrupted_fork_file_naming_the_case() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixtures::conformance("tq3_1s.json")).unwrap();
    let mut doc: Value = serde_json::from_str(&text).unwrap();
    let c = &mut doc["cases"][17];
    let id = c["id"].as_str().unwrap().to_string();
    let mut bytes = c["expected_bytes"].as_str().unwrap().to_string();
    // Change a code byte (offset 10) of the first block: the quantize op must fail.
    let old = &bytes[20..22];
    let new = if old == "00" { "01" } else { "00" };
    bytes.replace_range(20..22, new);
    c["expected_bytes"] = bytes.into();
    let p = dir.path().join("tq3_1s.json");
    std::fs::write(&p, serde_json::to_string(&doc).unwrap()).unwrap();
    let (code, out, err) = tq(&["conformance", s(&p)]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        out.contains("tq3_1s.quantize            219/220   FAIL"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "mismatch: tq3_1s.quantize {id}: bytes differ from byte 10"
        )),
        "{out}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("conformance mismatches in"), "{err}");
}

#[test]
fn cli_bad_files_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("notjson.json", "{\"cases\": [", "not valid JSON"),
        ("unknown.json", "{\"schema\": \"other/v9\", \"cases\": []}", "unknown schema"),
        (
            "type.json",
            "{\"schema\": \"turboquant-conformance/v1\", \"type\": \"q9_9\", \"cases\": []}",
            "type `q9_9` has no quantizer",
        ),
        (
            "op.json",
            "{\"signs\": {}, \"cases\": [{\"id\": \"x\", \"op\": \"unpack\", \"N\": 1, \"K\": 32}]}",
            "case x: unknown op `unpack`",
        ),
        (
            "shape.json",
            "{\"signs\": {}, \"cases\": [{\"id\": \"y\", \"op\": \"pack2bit\", \"N\": 1, \"K\": 48, \"w\": [], \"incoherent\": true}]}",
            "case y: pack2bit: row length 48",
        ),
        (
            "missing.json",
            "{\"signs\": {}, \"cases\": [{\"id\": \"z\", \"op\": \"pack2bit\", \"N\": 1, \"K\": 32}]}",
            "case z: missing `w`",
        ),
    ];
    for (name, body, want) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        let (code, out, err) = tq(&["conformance", s(&p)]);
        assert_eq!(code, 2, "{name}: {out}\n{err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.contains(name) && err.contains(want), "{name}: {err}");
    }
    let (code, _, err) = tq(&["conformance", s(&dir.path().join("absent.json"))]);
    assert_eq!(code, 1, "{err}");
    let (code, _, err) = tq(&[
        "conformance",
        "--backend",
        "tpu",
        s(&fixtures::conformance("seed2bit.json")),
    ]);
    assert_eq!(code, 2, "{err}");
}
