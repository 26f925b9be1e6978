//! The k-quants with an importance matrix against llama.cpp's own `llama-quantize --imatrix`,
//! byte for byte, imatrix written by tq and read by both: q2_K / q4_K / q5_K (ggml's
//! `quantize_row_q{2,4,5}_K_impl`: `make_qkx3_quants` per sub-block under `imp·sqrt(σ² + x²)`,
//! the sub-block scales and mins by weighted `make_qp_quants`), q3_K (`make_qx_quants` under the
//! same weights, the scales by weighted `make_qx_quants`) and q6_K (`make_qx_quants` under the
//! raw importances).
//!
//! Tensors: synthetic rows 256, 512, 768 and 1536 values wide (Gaussian, rows scaled over 2⁻²⁴ ..
//! 2⁸, heavy-tailed, and edge rows: zeros, constants, one-signed blocks, tiny and subnormal
//! values, spikes) and SmolLM2's `ffn_down` tensors (1536 wide, decoded from the Q4_1 GGUF).
//!
//! * `*_matches_recorded_llama_hashes`: the blake3 of llama-quantize's output per (type, tensor),
//!   recorded in `fixtures/kquants_imatrix_expected.json` by
//!   `scripts/dev/kquants_imatrix_llama_oracle.sh`, must equal the hash of ours. Runs everywhere
//!   (SmolLM2 missing: recorded as not run).
//! * `*_matches_llama_quantize_live`: with `$TQ_CACHE/llama.cpp/build/bin/llama-quantize`
//!   (missing: recorded as not run, a failure under `TQ_REQUIRE_DATA=1`), every byte compared,
//!   the first differing block reported. `TQ_KQ_IMX_RECORD=1` (re)writes the recorded hashes.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fixtures::gguf_gen::gaussian;
use fixtures::llama_oracle::{
    self, llama_metadata, smollm2_ffn_down, ty, write_f32_gguf, Expected, Tensor, SMOLLM2_SHAPE,
};
use serde_json::{json, Value as Json};
use tq::gguf::{GgufFile, Value};
use tq::quant::{encode_rows, Encoder};
use tq::types::TensorType;

/// (type, llama-quantize ftype whose default type it is; `--pure` sends every tensor there).
const TYPES: [(&str, &str); 5] = [
    ("q2_K", "Q2_K"),
    ("q3_K", "Q3_K"),
    ("q4_K", "Q4_K"),
    ("q5_K", "Q5_K"),
    ("q6_K", "Q6_K"),
];

const EXPECTED: Expected = Expected {
    path: "fixtures/kquants_imatrix_expected.json",
    about: "Facts from llama.cpp (the copy vendored in the PyPI sdist llama-cpp-python==0.3.36, built by scripts/build-llama.sh): blake3 of each tensor's data bytes as written by llama-quantize --pure --imatrix <im.gguf> from F32 input, per type (q2_K, q3_K, q4_K, q5_K, q6_K), with the test's imatrix (written by tq). Recorded by scripts/dev/kquants_imatrix_llama_oracle.sh; checked by tests/kquants_imatrix_llama.rs.",
    script: "scripts/dev/kquants_imatrix_llama_oracle.sh",
    record_var: "TQ_KQ_IMX_RECORD",
};

/// `general.name` of the F32 input files.
const NAME: &str = "tq k-quant imatrix oracle";

fn synthetic() -> Vec<Tensor> {
    let mut ts = Vec::new();
    let mut add = |name: &str, cols: u64, data: Vec<f32>| ts.push(Tensor::rows(name, cols, data));
    add("blk.0.attn_q.weight", 256, gaussian(201, 256 * 48, 0.02));
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
        256,
        fixtures::llama_oracle::imatrix_edge_rows(256, 137, 1e3, 1e2),
    );
    add(
        "blk.1.ffn_down.weight",
        1536,
        gaussian(202, 1536 * 16, 0.05),
    );
    ts
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

/// tq's `Encoder::Weighted` (what `tq convert --imatrix` writes) on a whole tensor.
fn ours(tn: &str, t: &Tensor, im: &Imatrix) -> Vec<u8> {
    let enc = Encoder::Weighted(im.imx.for_tensor(&t.name).expect("imatrix entry"));
    encode_rows(ty(tn), &t.name, &t.data, t.dims[0] as usize, &enc).expect("encode")
}

/// Every type of `tys` on `ts` against `llama-quantize --pure --imatrix` live: per type, the
/// tensors that differ (described); `None` when llama-quantize is missing. Records the hashes
/// of llama.cpp's output under `key` in record mode.
fn live(
    tys: &[(&str, &str)],
    ts: &[Tensor],
    md: &dyn Fn() -> Vec<(String, Value)>,
    key: &str,
) -> Option<BTreeMap<String, Vec<String>>> {
    let bin = fixtures::llama_quantize()?;
    let dir = tempfile::tempdir().unwrap();
    let im = imatrix(ts, dir.path());
    let inp = dir.path().join("in-f32.gguf");
    write_f32_gguf(&inp, md(), ts);
    let mut section = serde_json::Map::new();
    let mut problems = BTreeMap::new();
    for &(tn, ftype) in tys {
        let out = dir.path().join(format!("out-{tn}.gguf"));
        let theirs = llama_oracle::bytes_of_type(
            ty(tn),
            llama_oracle::run_llama(&bin, &inp, &out, ftype, Some(&im.path)),
        );
        let label = format!("{key} {tn} (--imatrix)");
        let ours = |t: &Tensor| ours(tn, t, &im);
        let (hashes, bad) = llama_oracle::compare_tensors(ty(tn), ts, &theirs, &ours, &label);
        section.insert(tn.to_string(), Json::Object(hashes));
        problems.insert(tn.to_string(), bad);
    }
    if EXPECTED.recording() && tys == TYPES {
        EXPECTED.record(key, Json::Object(section));
    }
    Some(problems)
}

/// [`TYPES`] on `ts` against llama-quantize live, every byte; false when it is missing.
fn compare_live(ts: &[Tensor], md: &dyn Fn() -> Vec<(String, Value)>, key: &str) -> bool {
    let Some(p) = live(&TYPES, ts, md, key) else {
        return false;
    };
    let bad: Vec<String> = p.into_values().flatten().collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    true
}

/// [`TYPES`] on `ts` against the recorded hashes; the imatrix must change every type's bytes
/// somewhere (against tq's plain encoder, itself byte-identical to llama-quantize without one).
fn compare_recorded(ts: &[Tensor], key: &str) {
    let exp = EXPECTED.load();
    let dir = tempfile::tempdir().unwrap();
    let im = imatrix(ts, dir.path());
    let mut bad = Vec::new();
    let mut n = 0;
    for (tn, _) in TYPES {
        let ours = |t: &Tensor| ours(tn, t, &im);
        bad.extend(llama_oracle::recorded_mismatches(
            &exp[key][tn],
            ts,
            &ours,
            tn,
        ));
        n += ts.len();
        let changed = ts
            .iter()
            .filter(|t| ours(t) != llama_oracle::registry_bytes(ty(tn), t))
            .count();
        assert!(changed > 0, "{key} {tn}: the imatrix changed nothing");
    }
    assert!(bad.is_empty(), "differ from llama-quantize: {bad:?}");
    eprintln!(
        "{key}: {n} (type, tensor) pairs byte-identical to the recorded llama-quantize --imatrix output"
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
        &|| llama_metadata(NAME, 2, 256, 4),
        "synthetic",
    );
}

/// SmolLM2's 30 `ffn_down` tensors (1536 wide) against llama-quantize live, and against the
/// recorded hashes (which also run where llama.cpp is missing).
#[test]
fn smollm2_ffn_down_matches_llama() {
    let Some(ts) = smollm2_ffn_down() else { return };
    let (l, e, h) = SMOLLM2_SHAPE;
    compare_live(&ts, &|| llama_metadata(NAME, l, e, h), "smollm2_ffn_down");
    compare_recorded(&ts, "smollm2_ffn_down");
}

/// The route a user takes: `tq convert SmolLM2 --preset Q4_K_M --imatrix IM` writes its k-quant
/// tensors (q4_K, q6_K) byte-identical to `llama-quantize --imatrix IM … Q4_K_M` (live, and
/// against the recorded blake3 of llama-quantize's tensors). Its q5_0 fallbacks (the 576-wide
/// matrices) are tq's own weighted grid fit and are not compared.
#[test]
fn smollm2_q4_k_m_imatrix_k_quant_tensors_match_llama() {
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
        "Q4_K_M",
        "--imatrix",
        fixtures::s(&im.path),
        "-q",
        "-o",
        fixtures::s(&ours),
    ]);
    assert_eq!(code, 0, "{err}");
    let kq = |t: TensorType| t.name().ends_with("_K");
    let g = GgufFile::open(&ours).unwrap();
    let mine: BTreeMap<String, String> = g
        .tensors
        .iter()
        .filter(|t| kq(t.ty))
        .map(|t| (t.name.clone(), fixtures::blake3_hex(g.tensor_data(t))))
        .collect();
    // SmolLM2's only 256-aligned rows are its 30 `ffn_down` (1536 wide; Q4_K_M: 16 q4_K, 14
    // q6_K); the 576-wide matrices fall back to q5_0 / q8_0.
    assert!(mine.len() >= 30, "only {} k-quant tensors", mine.len());
    let key = "smollm2_preset_Q4_K_M_imatrix";
    if let Some(bin) = fixtures::llama_quantize() {
        let theirs = dir.path().join("llama.gguf");
        let o = std::process::Command::new(bin)
            .arg("--allow-requantize")
            .arg("--imatrix")
            .arg(&im.path)
            .args([fixtures::s(&model), fixtures::s(&theirs), "Q4_K_M", "2"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let l = GgufFile::open(&theirs).unwrap();
        let live: BTreeMap<String, String> = l
            .tensors
            .iter()
            .filter(|t| kq(t.ty))
            .map(|t| (t.name.clone(), fixtures::blake3_hex(l.tensor_data(t))))
            .collect();
        let differ: Vec<&String> = live
            .keys()
            .filter(|k| mine.get(*k) != live.get(*k))
            .collect();
        assert!(
            differ.is_empty() && mine.len() == live.len(),
            "k-quant tensors differ from llama-quantize --imatrix (live): {differ:?}"
        );
        eprintln!(
            "{key}: {} k-quant tensors byte-identical to llama-quantize --imatrix",
            mine.len()
        );
        if EXPECTED.recording() {
            EXPECTED.record(key, json!(live));
        }
    }
    let exp = EXPECTED.load();
    let want: BTreeMap<String, String> = exp[key]
        .as_object()
        .unwrap_or_else(|| panic!("no recorded {key} (run {})", EXPECTED.script))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        mine, want,
        "k-quant tensors differ from the recorded llama-quantize output"
    );
}
