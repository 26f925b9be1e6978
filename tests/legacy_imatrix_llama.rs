//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 against llama.cpp's own `llama-quantize`, byte for byte, with
//! an importance matrix (`--imatrix`, written by tq and read by both: ggml's
//! `quantize_row_q4_1_impl` / `quantize_row_q5_1_impl`, the `make_qkx3_quants` search under
//! `imp·sqrt(σ² + x²)`; `quantize_row_q4_0_impl` / `quantize_row_q5_0_impl`, `make_qx_quants`
//! under the same weights; `quantize_q8_0`, which ignores the importance) and without one (ggml's
//! `quantize_row_*_ref`, which llama-quantize runs when no imatrix is given).
//!
//! These are the types llama-quantize's presets fall back to where a row cannot hold a k-quant
//! super-block (SmolLM2's 576-wide matrices under Q5_K_M / Q5_K_S: q5_1), so the tensors are
//! 576 values wide as well as 512, 768 and 64 (edge rows: zeros, constants, one-signed blocks,
//! tiny and subnormal values, spikes).
//!
//! Real weights: SmolLM2's 576-wide matrices (decoded from the Q4_1 GGUF) and all-MiniLM-L6-v2's
//! first layer (F32).
//!
//! * `*_matches_recorded_llama_hashes`: the blake3 of llama-quantize's output per (type, mode,
//!   tensor), recorded in `fixtures/legacy_imatrix_expected.json` by
//!   `scripts/dev/legacy_imatrix_llama_oracle.sh`, must equal the hash of ours. Runs everywhere
//!   (SmolLM2 missing: recorded as not run).
//! * `*_matches_llama_quantize_live`: with `$TQ_CACHE/llama.cpp/build/bin/llama-quantize`
//!   (missing: recorded as not run, a failure under `TQ_REQUIRE_DATA=1`), every byte compared,
//!   the first differing block reported. `TQ_LEGACY_IMX_RECORD=1` (re)writes the recorded hashes.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fixtures::gguf_gen::gaussian;
use fixtures::llama_oracle::{
    self, llama_metadata, ty, write_f32_gguf, Expected, Tensor, SMOLLM2_SHAPE,
};
use serde_json::{json, Value as Json};
use tq::gguf::{GgufFile, Value};
use tq::quant::{encode_rows, Encoder};

/// (type, llama-quantize ftype).
const TYPES: [(&str, &str); 5] = [
    ("q4_0", "Q4_0"),
    ("q4_1", "Q4_1"),
    ("q5_0", "Q5_0"),
    ("q5_1", "Q5_1"),
    ("q8_0", "Q8_0"),
];

const EXPECTED: Expected = Expected {
    path: "fixtures/legacy_imatrix_expected.json",
    about: "Facts from llama.cpp (the copy vendored in the PyPI sdist llama-cpp-python==0.3.36, built by scripts/build-llama.sh): blake3 of each tensor's data bytes as written by llama-quantize --pure from F32 input, per type (q4_0, q4_1, q5_0, q5_1, q8_0) and mode: 'imatrix' with the test's imatrix (written by tq), 'plain' without one. Recorded by scripts/dev/legacy_imatrix_llama_oracle.sh; checked by tests/legacy_imatrix_llama.rs.",
    script: "scripts/dev/legacy_imatrix_llama_oracle.sh",
    record_var: "TQ_LEGACY_IMX_RECORD",
};

/// `general.name` of the F32 input files.
const NAME: &str = "tq legacy imatrix oracle";

fn synthetic() -> Vec<Tensor> {
    let mut ts = Vec::new();
    let mut add = |name: &str, cols: u64, data: Vec<f32>| ts.push(Tensor::rows(name, cols, data));
    add("blk.0.attn_q.weight", 576, gaussian(201, 576 * 40, 0.02));
    add(
        "blk.0.ffn_up.weight",
        512,
        fixtures::llama_oracle::ranged_rows(32),
    );
    add(
        "blk.0.ffn_down.weight",
        768,
        fixtures::llama_oracle::heavy_rows(24),
    );
    add(
        "blk.0.attn_output.weight",
        64,
        fixtures::llama_oracle::imatrix_edge_rows(64, 37, 1e4, 1e3),
    );
    ts
}

/// SmolLM2's 576-wide matrices of blocks 0 and 17 (attention q/k/v/output, FFN gate/up: the
/// tensors llama-quantize's Q5_K presets send to q5_1), decoded from the Q4_1 GGUF to f32; `None`
/// (recorded as not run) without the model. The decoded values sit on a Q4_1 grid already, which
/// both Q4_1 encoders re-find (the search's first trial fits exactly): the Q4_1 imatrix search
/// on real weights is [`minilm_layer0`]'s; Q5_1's differs from round-to-nearest here.
fn smollm2_576() -> Option<Vec<Tensor>> {
    let path = fixtures::smollm2()?;
    let f = GgufFile::open(&path).expect("open SmolLM2");
    let ts: Vec<Tensor> = f
        .tensors
        .iter()
        .filter(|t| {
            (t.name.starts_with("blk.0.") || t.name.starts_with("blk.17."))
                && t.dims.len() == 2
                && t.dims[0] == 576
        })
        .map(|t| {
            let mut data = vec![0f32; t.n_elements() as usize];
            tq::types::dequantize(t.ty, f.tensor_data(t), &mut data, &t.name).unwrap();
            Tensor {
                name: t.name.clone(),
                dims: [t.dims[0], t.dims[1]],
                data,
            }
        })
        .collect();
    assert_eq!(
        ts.len(),
        12,
        "SmolLM2-135M: 6 matrices of 576 columns per block"
    );
    Some(ts)
}

/// all-MiniLM-L6-v2's layer-0 matrices (real F32 weights, 384 and 1536 values wide, not on any
/// quantization grid), under llama tensor names; `None` (recorded as not run) without the file.
fn minilm_layer0() -> Option<Vec<Tensor>> {
    let path = fixtures::minilm()?;
    let bytes = std::fs::read(&path).expect("read MiniLM");
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Json = serde_json::from_slice(&bytes[8..8 + n]).expect("safetensors header");
    let data = &bytes[8 + n..];
    let names = [
        ("attention.self.query", "attn_q"),
        ("attention.self.key", "attn_k"),
        ("attention.self.value", "attn_v"),
        ("attention.output.dense", "attn_output"),
        ("intermediate.dense", "ffn_up"),
        ("output.dense", "ffn_down"),
    ];
    let ts = names
        .iter()
        .map(|(hf, ll)| {
            let e = &header[format!("encoder.layer.0.{hf}.weight")];
            assert_eq!(e["dtype"], "F32", "{hf}");
            let shape: Vec<u64> = e["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            let off: Vec<usize> = e["data_offsets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            Tensor {
                name: format!("blk.0.{ll}.weight"),
                dims: [shape[1], shape[0]],
                data: data[off[0]..off[1]]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            }
        })
        .collect();
    Some(ts)
}

/// Per-column importances with a wide spread (1/100 .. 100), as real imatrices have, written as a
/// GGUF imatrix and read back as llama-quantize reads it (sum / count).
struct Imatrix {
    path: PathBuf,
    imx: tq::calib::imatrix::Imatrix,
}

fn imatrix(ts: &[Tensor], dir: &Path) -> Imatrix {
    let diag: Vec<tq::quant::Diagonal> = ts
        .iter()
        .enumerate()
        .map(|(k, t)| tq::quant::Diagonal {
            tensors: vec![t.name.clone()],
            tokens: 64,
            d: fixtures::gguf_gen::uniform(700 + k as u64, t.dims[0] as usize)
                .iter()
                .map(|u| 64.0 * 10f64.powf(2.0 * *u as f64))
                .collect(),
        })
        .collect();
    let path = dir.join("imatrix.gguf");
    tq::calib::imatrix::write_gguf(&diag, &path, "synthetic", 64).unwrap();
    let imx = tq::calib::imatrix::load(&path).unwrap();
    Imatrix { path, imx }
}

/// The two modes: `imatrix` (tq's `Encoder::Weighted`, what `tq convert --imatrix` writes) and
/// `plain` (round-to-nearest through the registry).
const MODES: [&str; 2] = ["imatrix", "plain"];

fn ours(tn: &str, mode: &str, t: &Tensor, im: &Imatrix) -> Vec<u8> {
    let enc = match mode {
        "imatrix" => Encoder::Weighted(im.imx.for_tensor(&t.name).expect("imatrix entry")),
        _ => Encoder::Nearest,
    };
    encode_rows(ty(tn), &t.name, &t.data, t.dims[0] as usize, &enc).expect("encode")
}

/// Every type and mode of `ts` against llama-quantize live; false when it is missing.
fn compare_live(ts: &[Tensor], md: &dyn Fn() -> Vec<(String, Value)>, key: &str) -> bool {
    let Some(bin) = fixtures::llama_quantize() else {
        return false;
    };
    let dir = tempfile::tempdir().unwrap();
    let im = imatrix(ts, dir.path());
    let inp = dir.path().join("in-f32.gguf");
    write_f32_gguf(&inp, md(), ts);
    let mut section = serde_json::Map::new();
    let mut problems = Vec::new();
    for (tn, ftype) in TYPES {
        let mut per_mode = serde_json::Map::new();
        for mode in MODES {
            let out = dir.path().join(format!("out-{tn}-{mode}.gguf"));
            let imx = (mode == "imatrix").then_some(im.path.as_path());
            let theirs = llama_oracle::bytes_of_type(
                ty(tn),
                llama_oracle::run_llama(&bin, &inp, &out, ftype, imx),
            );
            let label = format!("{key} {tn} {mode}");
            let ours = |t: &Tensor| ours(tn, mode, t, &im);
            let (hashes, bad) = llama_oracle::compare_tensors(ty(tn), ts, &theirs, &ours, &label);
            problems.extend(bad.into_iter().map(|d| format!("[{mode}] {d}")));
            per_mode.insert(mode.to_string(), Json::Object(hashes));
        }
        section.insert(tn.to_string(), Json::Object(per_mode));
    }
    if EXPECTED.recording() {
        EXPECTED.record(key, Json::Object(section));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    true
}

/// Every type and mode of `ts` against the recorded hashes.
fn compare_recorded(ts: &[Tensor], key: &str) {
    let exp = EXPECTED.load();
    let dir = tempfile::tempdir().unwrap();
    let im = imatrix(ts, dir.path());
    let mut bad = Vec::new();
    let mut n = 0;
    // The importance is used: the modes differ on some tensor (for every type on the synthetic
    // and MiniLM tensors; SmolLM2's decoded Q4_1 weights re-find their own Q4_1 grid under
    // either encoder, so there only Q5_1's differ).
    let differ = |tn: &str| {
        ts.iter()
            .filter(|t| exp[key][tn]["imatrix"][&t.name] != exp[key][tn]["plain"][&t.name])
            .count()
    };
    for tn in ["q4_0", "q5_0", "q5_1"] {
        assert!(differ(tn) > 0, "{key} {tn}: the imatrix changed nothing");
    }
    if key != "smollm2_576" {
        assert!(
            differ("q4_1") > 0,
            "{key} q4_1: the imatrix changed nothing"
        );
    }
    // llama-quantize ignores the importance for q8_0: its two outputs are the same bytes.
    assert_eq!(differ("q8_0"), 0, "{key} q8_0: llama used the imatrix");
    for (tn, _) in TYPES {
        for mode in MODES {
            let ours = |t: &Tensor| ours(tn, mode, t, &im);
            let label = format!("{tn} {mode}");
            bad.extend(llama_oracle::recorded_mismatches(
                &exp[key][tn][mode],
                ts,
                &ours,
                &label,
            ));
            n += ts.len();
        }
    }
    assert!(bad.is_empty(), "differ from llama-quantize: {bad:?}");
    eprintln!(
        "{key}: {n} (type, mode, tensor) triples byte-identical to the recorded llama-quantize output"
    );
}

#[test]
fn synthetic_matches_recorded_llama_hashes() {
    compare_recorded(&synthetic(), "synthetic");
}

#[test]
fn synthetic_matches_llama_quantize_live() {
    compare_live(
        &synthetic(),
        &|| llama_metadata(NAME, 1, 576, 9),
        "synthetic",
    );
}

/// Real F32 weights (MiniLM's first layer) against llama-quantize live, and against the recorded
/// hashes (which also run where llama.cpp is missing).
#[test]
fn minilm_matches_llama() {
    let Some(ts) = minilm_layer0() else { return };
    compare_live(&ts, &|| llama_metadata(NAME, 1, 384, 12), "minilm_layer0");
    compare_recorded(&ts, "minilm_layer0");
}

/// SmolLM2 against llama-quantize live, and against the recorded hashes (which also run where
/// llama.cpp is missing).
#[test]
fn smollm2_576_matches_llama() {
    let Some(ts) = smollm2_576() else { return };
    compare_live(
        &ts,
        &|| llama_metadata(NAME, SMOLLM2_SHAPE.0, SMOLLM2_SHAPE.1, SMOLLM2_SHAPE.2),
        "smollm2_576",
    );
    compare_recorded(&ts, "smollm2_576");
}

/// Each tensor of `g` that `keep` selects: name → "type blake3".
fn tensor_hashes(
    g: &GgufFile,
    keep: &dyn Fn(tq::types::TensorType) -> bool,
) -> BTreeMap<String, String> {
    g.tensors
        .iter()
        .filter(|t| keep(t.ty))
        .map(|t| {
            let h = fixtures::blake3_hex(g.tensor_data(t));
            (t.name.clone(), format!("{} {h}", t.ty))
        })
        .collect()
}

/// The route a user takes: `tq convert SmolLM2 --preset PRESET --imatrix IM` writes the tensors
/// `keep` selects byte-identical to `llama-quantize --imatrix IM … PRESET` (live, and against the
/// recorded blake3 of llama-quantize's tensors); at least `min` of them.
fn preset_matches_llama(preset: &str, keep: &dyn Fn(tq::types::TensorType) -> bool, min: usize) {
    let Some(model) = fixtures::smollm2() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let f = GgufFile::open(&model).unwrap();
    let ts: Vec<Tensor> = f
        .tensors
        .iter()
        .filter(|t| t.dims.len() == 2 && t.name.starts_with("blk."))
        .map(|t| Tensor {
            name: t.name.clone(),
            dims: [t.dims[0], t.dims[1]],
            data: vec![],
        })
        .collect();
    let im = imatrix(&ts, dir.path());
    let ours = dir.path().join("tq.gguf");
    let (code, _, err) = fixtures::tq(&[
        "convert",
        fixtures::s(&model),
        "--preset",
        preset,
        "--imatrix",
        fixtures::s(&im.path),
        "-q",
        "-o",
        fixtures::s(&ours),
    ]);
    assert_eq!(code, 0, "{err}");
    let mine = tensor_hashes(&GgufFile::open(&ours).unwrap(), keep);
    assert!(mine.len() >= min, "{preset}: only {} tensors", mine.len());
    let key = format!("smollm2_preset_{preset}_imatrix");
    if let Some(bin) = fixtures::llama_quantize() {
        let theirs = dir.path().join("llama.gguf");
        let o = std::process::Command::new(bin)
            .arg("--allow-requantize")
            .arg("--imatrix")
            .arg(&im.path)
            .args([fixtures::s(&model), fixtures::s(&theirs), preset, "2"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let live = tensor_hashes(&GgufFile::open(&theirs).unwrap(), keep);
        assert_eq!(
            mine, live,
            "{preset}: tensors differ from llama-quantize --imatrix (live)"
        );
        eprintln!(
            "{key}: {} tensors byte-identical to llama-quantize --imatrix",
            mine.len()
        );
        if EXPECTED.recording() {
            EXPECTED.record(&key, json!(live));
        }
    }
    let exp = EXPECTED.load();
    let want: BTreeMap<String, String> = exp[&key]
        .as_object()
        .unwrap_or_else(|| panic!("no recorded {key} (run {})", EXPECTED.script))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        mine, want,
        "{preset}: tensors differ from the recorded llama-quantize output"
    );
}

/// `--preset Q5_K_M --imatrix`: its q5_1 tensors (the fallback of SmolLM2's 576-wide matrices).
/// The other tensors are not compared here (q5_K / q6_K: tests/kquants_imatrix_llama.rs; q8_0:
/// the whole Q8_0 file below).
#[test]
fn smollm2_q5_k_m_imatrix_q5_1_tensors_match_llama() {
    preset_matches_llama("Q5_K_M", &|t| t == ty("q5_1"), 160);
}

/// `--preset Q4_0 --imatrix`: the whole file (every tensor's type and bytes).
#[test]
fn smollm2_q4_0_imatrix_file_matches_llama() {
    preset_matches_llama("Q4_0", &|_| true, 272);
}

/// `--preset Q5_0 --imatrix`: the whole file.
#[test]
fn smollm2_q5_0_imatrix_file_matches_llama() {
    preset_matches_llama("Q5_0", &|_| true, 272);
}

/// `--preset Q8_0 --imatrix`: the whole file (llama-quantize ignores the importance for q8_0).
#[test]
fn smollm2_q8_0_imatrix_file_matches_llama() {
    preset_matches_llama("Q8_0", &|_| true, 272);
}
