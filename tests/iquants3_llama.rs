//! IQ3_XXS, IQ3_S, IQ1_S, IQ1_M encoders against llama.cpp's own `llama-quantize`, byte for byte,
//! with an importance matrix (`--imatrix`, written by tq and read by both) and without one.
//!
//! Without an imatrix llama-quantize refuses IQ3_XXS, IQ1_S and IQ1_M for ordinary tensors, but
//! it quantizes `output.weight` without one: the no-imatrix oracle of IQ3_XXS / IQ1_M runs each
//! width's tensors, rows concatenated, as a lone `output.weight` (rows are encoded independently,
//! so the bytes are the same). ggml's IQ1_S encoder needs importances; tq's registry IQ1_S uses
//! importance 1 everywhere, checked against llama-quantize with an imatrix of ones.
//!
//! * `*_matches_recorded_llama_hashes`: the blake3 of llama-quantize's output per (type, mode,
//!   tensor), recorded in `fixtures/iquants3_expected.json` by `scripts/dev/iquants3_llama_oracle.sh`,
//!   must equal the hash of ours. Runs everywhere (SmolLM2 missing: recorded as not run).
//! * `*_matches_llama_quantize_live`: with `$TQ_CACHE/llama.cpp/build/bin/llama-quantize`
//!   (missing: recorded as not run, a failure under `TQ_REQUIRE_DATA=1`), every byte compared,
//!   the first differing block reported. `TQ_IQ3_RECORD=1` (re)writes the recorded hashes.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use fixtures::gguf_gen::{gaussian, pseudo_bytes};
use fixtures::llama_oracle::{
    self, llama_metadata, smollm2_ffn_down, ty, write_f32_gguf, Expected, Tensor, SMOLLM2_SHAPE,
};
use serde_json::Value as Json;
use tq::gguf::{GgufFile, Value};
use tq::quant::{encode_rows, Encoder};

/// (type, llama-quantize ftype).
const TYPES: [(&str, &str); 4] = [
    ("iq3_xxs", "IQ3_XXS"),
    ("iq3_s", "IQ3_S"),
    ("iq1_s", "IQ1_S"),
    ("iq1_m", "IQ1_M"),
];

const EXPECTED: Expected = Expected {
    path: "fixtures/iquants3_expected.json",
    about: "Facts from llama.cpp (the copy vendored in the PyPI sdist llama-cpp-python==0.3.36, built by scripts/build-llama.sh): blake3 of each tensor's data bytes as written by llama-quantize --pure from F32 input, per type (iq3_xxs, iq3_s, iq1_s, iq1_m) and mode: 'imatrix' with the test's imatrix (written by tq), 'plain' without one (iq3_xxs / iq1_m: as a lone output.weight, which llama-quantize encodes without an imatrix; iq1_s: an imatrix of ones). Recorded by scripts/dev/iquants3_llama_oracle.sh; checked by tests/iquants3_llama.rs.",
    script: "scripts/dev/iquants3_llama_oracle.sh",
    record_var: "TQ_IQ3_RECORD",
};

/// `general.name` of the F32 input files.
const NAME: &str = "tq i-quant oracle";

/// Edge rows of 256 values: zeros, constants, tiny and subnormal values, ties, sparse rows,
/// zero groups between non-zero ones (IQ3_S's write-position quirk), outliers.
fn edge_rows() -> Vec<f32> {
    let g = |seed: u64| gaussian(seed, 256, 1.0);
    let mut spike = vec![0.0; 256];
    spike[37] = 3.0;
    let rows: Vec<Vec<f32>> = vec![
        vec![0.0; 256],
        vec![0.5; 256],
        vec![-0.75; 256],
        g(301).iter().map(|v| v * 1e-30).collect(),
        g(302).iter().map(|v| v * 1e-38).collect(),
        g(303).iter().map(|v| v.abs() + 0.1).collect(),
        g(304).iter().map(|v| -v.abs() - 0.1).collect(),
        spike,
        (0..256).map(|i| (i % 16) as f32 - 8.0).collect(),
        (0..256)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect(),
        g(305)
            .iter()
            .enumerate()
            .map(|(i, v)| if i < 128 { 0.0 } else { *v })
            .collect(),
        g(306).iter().map(|v| v * 1e4).collect(),
        (0..256).map(|i| (i % 31) as f32 / 31.0).collect(),
        g(311)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 32 == 5 { 1e3 } else { v * 1e-3 })
            .collect(),
        g(312)
            .iter()
            .zip(pseudo_bytes(313, 256))
            .map(|(v, b)| if b < 230 { 0.0 } else { *v })
            .collect(),
        g(316)
            .iter()
            .enumerate()
            .map(|(i, v)| if (i / 16) % 2 == 0 { *v } else { v * 1e-6 })
            .collect(),
        g(317)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1u32 << (i / 32)) as f32)
            .collect(),
        g(318)
            .iter()
            .enumerate()
            .map(|(i, v)| if (i / 32) % 2 == 1 { 0.0 } else { *v })
            .collect(),
        g(319)
            .iter()
            .enumerate()
            .map(|(i, v)| if (i / 32) % 3 == 0 { 0.0 } else { *v })
            .collect(),
        g(320).iter().map(|v| v * 1e-9).collect(),
        vec![-0.0; 256],
        (0..256).map(|i| ((i / 16) as f32 - 7.5) * 0.3).collect(),
        g(321).iter().map(|v| v + 5.0).collect(),
        g(322)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 16 == 0 { -4.0 } else { v * 0.5 })
            .collect(),
    ];
    rows.concat()
}

fn synthetic() -> Vec<Tensor> {
    let mut ts = Vec::new();
    let mut add = |name: &str, cols: u64, data: Vec<f32>| ts.push(Tensor::rows(name, cols, data));
    add("blk.0.attn_q.weight", 256, gaussian(101, 256 * 48, 0.02));
    let ranged = fixtures::llama_oracle::ranged_rows(32);
    add("blk.0.ffn_up.weight", 512, ranged);
    let heavy = fixtures::llama_oracle::heavy_rows(24);
    add("blk.0.ffn_down.weight", 768, heavy);
    add("blk.0.attn_output.weight", 256, edge_rows());
    add(
        "blk.1.ffn_gate.weight",
        1024,
        fixtures::gguf_gen::uniform(105, 1024 * 12),
    );
    ts
}

/// The per-column importances: a wide spread (1/100 .. 100) as real imatrices have, or all ones
/// (`ones`), written as a GGUF imatrix and read back as llama-quantize reads it (sum / count).
struct Imatrix {
    path: PathBuf,
    imx: tq::calib::imatrix::Imatrix,
}

fn imatrix(ts: &[Tensor], dir: &Path, ones: bool) -> Imatrix {
    let diag: Vec<tq::quant::Diagonal> = ts
        .iter()
        .enumerate()
        .map(|(k, t)| tq::quant::Diagonal {
            tensors: vec![t.name.clone()],
            tokens: 64,
            d: if ones {
                vec![64.0; t.dims[0] as usize]
            } else {
                fixtures::gguf_gen::uniform(900 + k as u64, t.dims[0] as usize)
                    .iter()
                    .map(|u| 64.0 * 10f64.powf(2.0 * *u as f64))
                    .collect()
            },
        })
        .collect();
    let path = dir.join(if ones {
        "ones.imatrix.gguf"
    } else {
        "imatrix.gguf"
    });
    tq::calib::imatrix::write_gguf(&diag, &path, "synthetic", 64).unwrap();
    let imx = tq::calib::imatrix::load(&path).unwrap();
    Imatrix { path, imx }
}

/// Our bytes: `imp` given → the importance-weighted encoder `tq convert --imatrix` uses,
/// otherwise the registry's encoder.
fn ours(tn: &str, t: &Tensor, imp: Option<&[f32]>) -> Vec<u8> {
    let enc = match imp {
        Some(w) => Encoder::Weighted(w),
        None => Encoder::Nearest,
    };
    encode_rows(ty(tn), &t.name, &t.data, t.dims[0] as usize, &enc).expect("encode")
}

/// Both modes of one type: `imatrix` and `plain` (no imatrix).
const MODES: [&str; 2] = ["imatrix", "plain"];

fn ours_mode(tn: &str, mode: &str, t: &Tensor, im: &Imatrix) -> Vec<u8> {
    match mode {
        "imatrix" => ours(tn, t, im.imx.for_tensor(&t.name)),
        _ => ours(tn, t, None),
    }
}

/// The shared oracle's `llama-quantize --pure` run, every tensor checked to be of `ftype`'s type:
/// (tensor name → data bytes).
fn run_llama(
    bin: &Path,
    inp: &Path,
    out: &Path,
    ftype: &str,
    imatrix: Option<&Path>,
) -> BTreeMap<String, Vec<u8>> {
    llama_oracle::run_llama(bin, inp, out, ftype, imatrix)
        .into_iter()
        .map(|(name, (t, b))| {
            assert_eq!(t, ty(&ftype.to_ascii_lowercase()), "{name}");
            (name, b)
        })
        .collect()
}

/// llama-quantize's bytes for every tensor of `ts`, in `mode`.
fn llama_bytes(
    bin: &Path,
    tn: &str,
    ftype: &str,
    mode: &str,
    ts: &[Tensor],
    md: &dyn Fn() -> Vec<(String, Value)>,
    dir: &Path,
) -> BTreeMap<String, Vec<u8>> {
    let inp = dir.join("in-f32.gguf");
    let out = dir.join(format!("out-{tn}-{mode}.gguf"));
    let all: Vec<&Tensor> = ts.iter().collect();
    match (mode, tn) {
        ("imatrix", _) => {
            write_f32_gguf(&inp, md(), &all);
            run_llama(bin, &inp, &out, ftype, Some(&imatrix(ts, dir, false).path))
        }
        (_, "iq1_s") => {
            write_f32_gguf(&inp, md(), &all);
            run_llama(bin, &inp, &out, ftype, Some(&imatrix(ts, dir, true).path))
        }
        (_, "iq3_s") => {
            write_f32_gguf(&inp, md(), &all);
            run_llama(bin, &inp, &out, ftype, None)
        }
        _ => {
            // A lone output.weight per row width (module comment), split back by rows.
            let mut res = BTreeMap::new();
            let mut widths: Vec<u64> = ts.iter().map(|t| t.dims[0]).collect();
            widths.sort();
            widths.dedup();
            for w in widths {
                let group: Vec<&Tensor> = ts.iter().filter(|t| t.dims[0] == w).collect();
                let rows: u64 = group.iter().map(|t| t.dims[1]).sum();
                let cat = Tensor {
                    name: "output.weight".into(),
                    dims: [w, rows],
                    data: group.iter().flat_map(|t| t.data.iter().copied()).collect(),
                };
                write_f32_gguf(&inp, llama_metadata(NAME, 1, 256, 4), &[&cat]);
                let b = run_llama(bin, &inp, &out, ftype, None)
                    .remove("output.weight")
                    .expect("output.weight");
                let rb = ty(tn).bytes_for(w).unwrap() as usize;
                let mut at = 0;
                for t in group {
                    let n = rb * t.dims[1] as usize;
                    res.insert(t.name.clone(), b[at..at + n].to_vec());
                    at += n;
                }
            }
            res
        }
    }
}

/// Every type and mode of `ts` against llama-quantize live; false when it is missing.
fn compare_live(ts: &[Tensor], md: &dyn Fn() -> Vec<(String, Value)>, key: &str) -> bool {
    let Some(bin) = fixtures::llama_quantize() else {
        return false;
    };
    let dir = tempfile::tempdir().unwrap();
    let im = imatrix(ts, dir.path(), false);
    let mut section = serde_json::Map::new();
    let mut problems = Vec::new();
    for (tn, ftype) in TYPES {
        let mut per_mode = serde_json::Map::new();
        for mode in MODES {
            let theirs = llama_bytes(&bin, tn, ftype, mode, ts, md, dir.path());
            let label = format!("{key} {tn} {mode}");
            let ours = |t: &Tensor| ours_mode(tn, mode, t, &im);
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
    let im = imatrix(ts, dir.path(), false);
    let mut bad = Vec::new();
    let mut n = 0;
    for (tn, _) in TYPES {
        // The importance is used: the two modes differ on the first tensor.
        let (a, b) = (
            &exp[key][tn]["imatrix"][&ts[0].name],
            &exp[key][tn]["plain"][&ts[0].name],
        );
        assert_ne!(a, b, "{key} {tn}: the imatrix changed nothing");
        for mode in MODES {
            let ours = |t: &Tensor| ours_mode(tn, mode, t, &im);
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
    eprintln!("{key}: {n} (type, mode, tensor) triples byte-identical to the recorded llama-quantize output");
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

/// SmolLM2 against llama-quantize live, or (llama.cpp missing) against the recorded hashes: the
/// live comparison checks every byte, so the recorded one would only repeat the encoding.
#[test]
fn smollm2_ffn_down_matches_llama() {
    let Some(ts) = smollm2_ffn_down() else { return };
    if !compare_live(
        &ts,
        &|| llama_metadata(NAME, SMOLLM2_SHAPE.0, SMOLLM2_SHAPE.1, SMOLLM2_SHAPE.2),
        "smollm2_ffn_down",
    ) || EXPECTED.recording()
    {
        compare_recorded(&ts, "smollm2_ffn_down");
    }
}

/// Encode time of IQ3_XXS on a 7B-shaped matrix (11008 rows of 4096, Gaussian) against
/// llama-quantize on the same F32 tensor and imatrix, both with every core (docs/bench/iquants.md):
/// `cargo test --release --test iquants3_llama throughput -- --ignored --nocapture`.
/// llama-quantize's time is its whole run (reading 180 MB of F32, its grid set-up, writing);
/// ours is `encode_rows` alone, plus the grid set-up on first use, so the ratio slightly favours us.
#[test]
#[ignore]
fn throughput() {
    let Some(bin) = fixtures::llama_quantize() else {
        return;
    };
    let (n, rows) = (4096usize, 11008usize);
    let t = Tensor {
        name: "blk.0.ffn_up.weight".into(),
        dims: [n as u64, rows as u64],
        data: gaussian(77, n * rows, 0.02),
    };
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("big-f32.gguf");
    write_f32_gguf(&inp, llama_metadata(NAME, 1, 4096, 32), &[&t]);
    let ts = [t];
    let im = imatrix(&ts, dir.path(), false);
    let threads = std::thread::available_parallelism().map_or(1, |v| v.get());
    let (tn, ftype) = ("iq3_xxs", "IQ3_XXS");
    let out = dir.path().join("out.gguf");
    let t0 = std::time::Instant::now();
    let o = Command::new(&bin)
        .arg("--imatrix")
        .arg(&im.path)
        .arg("--pure")
        .arg(&inp)
        .arg(&out)
        .arg(ftype)
        .arg(threads.to_string())
        .output()
        .unwrap();
    let t_llama = t0.elapsed().as_secs_f64();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let f = GgufFile::open(&out).unwrap();
    let theirs = f.tensor_data(&f.tensors[0]).to_vec();
    let t0 = std::time::Instant::now();
    let ob = ours(tn, &ts[0], im.imx.for_tensor(&ts[0].name));
    let t_ours = t0.elapsed().as_secs_f64();
    assert_eq!(
        fixtures::blake3_hex(&ob),
        fixtures::blake3_hex(&theirs),
        "{tn}: bytes differ"
    );
    eprintln!(
        "{tn} 11008x4096 with imatrix, {threads} threads: tq {t_ours:.2} s, llama-quantize {t_llama:.2} s (ratio {:.2}); bytes identical",
        t_ours / t_llama
    );
}
