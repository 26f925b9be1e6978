//! TQ1_0, TQ2_0 (ggml's ternary types) and MXFP4 encoders against llama.cpp's own
//! `llama-quantize` (no imatrix: these types take none; ggml's `quantize_row_tq1_0_ref`,
//! `quantize_row_tq2_0_ref`, `quantize_row_mxfp4_ref`), byte for byte, through the shared oracle
//! (`fixtures/llama_oracle.rs`).
//!
//! * `synthetic_matches_recorded_llama_hashes`: deterministic synthetic F32 tensors (Gaussian,
//!   dynamic-range sweeps, heavy tails, 32 edge rows: zeros, −0, constants, ties of the rounding,
//!   1e-30, subnormals — a block of subnormals small enough that ggml's `1/amax` is infinite —,
//!   magnitudes up to 5e4; for MXFP4 also blocks up to f32::MAX whose scaled codes overflow)
//!   quantized with tq's registry encoders hash (blake3 of the tensor data) to what llama-quantize
//!   wrote, recorded in `fixtures/ternary_fp4_expected.json`. Runs everywhere.
//! * `synthetic_matches_llama_quantize_live`: with `$TQ_CACHE/llama.cpp/build/bin/llama-quantize`
//!   (missing: recorded as not run, a failure under `TQ_REQUIRE_DATA=1`) the same tensors through
//!   `llama-quantize --pure IN OUT {TQ1_0,TQ2_0,MXFP4_MOE}`, every byte compared, the first
//!   differing block described. `TQ_TERNARY_RECORD=1` (re)writes the recorded hashes.
//! * `smollm2_ffn_down_matches_llama`: SmolLM2's 30 `ffn_down` matrices (Q4_1 decoded to f32;
//!   rows of 1536), live and recorded.
//! * `presets_write_llama_quantize_bytes`: `tq convert --preset TQ1_0 / TQ2_0` on SmolLM2 and
//!   `--preset MXFP4_MOE` on the qwen3moe and Mixtral fixtures write every tensor as
//!   `llama-quantize` does for the same preset (types and data bytes; live and recorded), and
//!   the written files decode with tq's dequantizers.
//!
//! Not covered: ternary blocks whose largest |x| overflows the f16 scale (> 65504) — llama-quantize
//! refuses to write them (its row validation rejects an infinite `d`) — and MXFP4 blocks whose
//! largest |x| lies in [2^−126, 2^−125) (E8M0 exponent 255, rejected the same way).

#[path = "../fixtures/mod.rs"]
mod fixtures;

use std::collections::BTreeMap;

use fixtures::gguf_gen::{gaussian, pseudo_bytes, uniform};
use fixtures::llama_oracle::{
    first_diff, llama_metadata, registry_bytes, run_llama, smollm2_ffn_down, ty, write_f32_gguf,
    Expected, Tensor, SMOLLM2_SHAPE,
};
use fixtures::{s, tq};
use serde_json::{json, Value as Json};
use tq::gguf::GgufFile;
use tq::types::{self, TensorType};

/// (type, llama-quantize ftype whose `--pure` type it is).
const TYPES: [(&str, &str); 3] = [
    ("tq1_0", "TQ1_0"),
    ("tq2_0", "TQ2_0"),
    ("mxfp4", "MXFP4_MOE"),
];

const EXPECTED: Expected = Expected {
    path: "fixtures/ternary_fp4_expected.json",
    about: "Facts from llama.cpp (the copy vendored in the PyPI sdist llama-cpp-python==0.3.36, built by scripts/build-llama.sh): blake3 of each tensor's data bytes as written by llama-quantize --pure <in.gguf> <out.gguf> {TQ1_0,TQ2_0,MXFP4_MOE} (no imatrix) from F32 input ('synthetic', 'smollm2_ffn_down'), and of every tensor of tq convert's input model as llama-quantize writes it for a preset ('presets'). Recorded with TQ_TERNARY_RECORD=1 by tests/ternary_fp4_llama.rs, which checks them.",
    script: "TQ_TERNARY_RECORD=1 cargo test --test ternary_fp4_llama",
    record_var: "TQ_TERNARY_RECORD",
};

/// 32 edge rows of 256 values each (MXFP4 blocks of 32 inside them stay out of E8M0 exponent
/// 255, ternary blocks under f16's largest finite scale).
fn edge_rows() -> Vec<f32> {
    let g = |seed: u64| gaussian(seed, 256, 1.0);
    let mut rows: Vec<Vec<f32>> = vec![
        vec![0.0; 256],
        vec![-0.0; 256],
        vec![0.5; 256],
        vec![-0.75; 256],
        g(301).iter().map(|v| v * 1e-30).collect(),
        g(302).iter().map(|v| v * 1e-39).collect(), // f32 subnormals
        // tiny subnormal bit patterns: the largest |x| is below 1/f32::MAX, so 1/amax = inf
        (0..256)
            .map(|i| f32::from_bits(1 + i as u32 * 977) * if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect(),
        g(303).iter().map(|v| v.abs() + 0.1).collect(),
        g(304).iter().map(|v| -v.abs() - 0.1).collect(),
    ];
    let mut spike = vec![0.0; 256];
    spike[37] = 3.0;
    rows.push(spike);
    rows.push((0..256).map(|i| (i % 16) as f32 - 8.0).collect()); // ties: −4/8, 5 and 7 on E2M1
    rows.push((0..256).map(|i| (i % 64) as f32 * 0.5 - 16.0).collect()); // half-integer ties
    rows.push(
        (0..256)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect(),
    );
    rows.push(
        (0..256)
            .map(|i| match i % 4 {
                0 => 2.0,
                1 => 1.0,
                2 => -1.0,
                _ => -0.999_999_9,
            })
            .collect(),
    ); // exactly ±amax/2 and just under
    rows.push(
        g(305)
            .iter()
            .enumerate()
            .map(|(i, v)| if i < 128 { 0.0 } else { *v })
            .collect(),
    );
    rows.push(g(306).iter().map(|v| v * 1e4).collect());
    rows.push(g(309).iter().map(|v| v * 5e3 + 3e4).collect());
    rows.push((0..256).map(|i| (i % 31) as f32 / 31.0).collect()); // ramp
    rows.push(
        g(311)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 32 == 5 { 1e3 } else { v * 1e-3 })
            .collect(),
    );
    rows.push(
        g(312)
            .iter()
            .zip(pseudo_bytes(313, 256))
            .map(|(v, b)| if b < 230 { 0.0 } else { *v })
            .collect(),
    ); // sparse
    rows.push(g(314).iter().map(|v| v + 5.0).collect());
    rows.push(g(315).iter().map(|v| v - 5.0).collect());
    rows.push(
        g(316)
            .iter()
            .enumerate()
            .map(|(i, v)| if (i / 16) % 2 == 0 { *v } else { v * 1e-6 })
            .collect(),
    );
    rows.push(
        g(317)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1u32 << (i / 32)) as f32)
            .collect(),
    );
    rows.push(
        g(318)
            .iter()
            .enumerate()
            .map(|(i, v)| if (i / 32) % 2 == 1 { 0.0 } else { *v })
            .collect(),
    ); // every other MXFP4 block zero
    rows.push(g(319).iter().map(|v| v * 1e-15).collect());
    rows.push((0..256).map(|i| ((i / 16) as f32 - 7.5) * 0.3).collect());
    rows.push(g(320).iter().map(|v| v * 0.02 + 0.001).collect());
    rows.push(
        g(321)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 16 == 0 { -4.0 } else { v * 0.5 })
            .collect(),
    );
    rows.push(
        g(322)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 16 == 0 { 4.0 } else { v * 0.5 })
            .collect(),
    );
    // powers of two (the E8M0 exponent at exact log2) and just below them (log2f rounds up)
    rows.push(
        (0..256)
            .map(|i| {
                let p = 2f32.powi((i / 32) * 3 - 10);
                if i % 2 == 0 {
                    p
                } else {
                    -p * (1.0 - f32::EPSILON / 2.0)
                }
            })
            .collect(),
    );
    rows.push(
        (0..256)
            .map(|i| {
                let p = 2f32.powi((i / 32) * 5 - 20) * (1.0 - f32::EPSILON / 2.0);
                if i % 32 == 0 {
                    p
                } else {
                    p * 0.3
                }
            })
            .collect(),
    );
    assert_eq!(rows.len(), 32);
    rows.concat()
}

/// MXFP4 only (ternary scales would overflow f16 and be refused): blocks up to f32::MAX, where
/// `code · d` overflows to infinity for the large codes.
fn huge_rows() -> Vec<f32> {
    let g = |seed: u64| gaussian(seed, 256, 1.0);
    [
        g(401).iter().map(|v| v * 1e30).collect::<Vec<f32>>(),
        g(402).iter().map(|v| v * 1e38).collect(),
        (0..256)
            .map(|i| if i % 2 == 0 { 3.4e38 } else { -3.4e38 })
            .collect(),
        g(403)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 32 == 7 { f32::MAX } else { v * 1e37 })
            .collect(),
    ]
    .concat()
}

/// The synthetic tensors: (tensor, which types take it).
fn synthetic() -> Vec<Tensor> {
    let mut ts = Vec::new();
    let mut add = |name: &str, cols: u64, rows: u64, data: Vec<f32>| {
        assert_eq!(data.len() as u64, cols * rows, "{name}");
        ts.push(Tensor {
            name: name.to_string(),
            dims: [cols, rows],
            data,
        });
    };
    add(
        "blk.0.attn_q.weight",
        256,
        64,
        gaussian(101, 256 * 64, 0.02),
    );
    let ranged = fixtures::llama_oracle::ranged_rows(64);
    add("blk.0.ffn_up.weight", 512, 64, ranged);
    let heavy = fixtures::llama_oracle::heavy_rows(32);
    add("blk.0.ffn_down.weight", 768, 32, heavy);
    add("blk.0.attn_output.weight", 256, 32, edge_rows());
    add("blk.1.ffn_gate.weight", 1024, 16, uniform(105, 1024 * 16));
    add("blk.1.attn_k.weight", 256, 4, huge_rows());
    ts
}

/// The tensors type `tn` is checked on (MXFP4 also on the huge rows).
fn for_type<'a>(tn: &str, ts: &'a [Tensor]) -> Vec<&'a Tensor> {
    ts.iter()
        .filter(|t| tn == "mxfp4" || t.name != "blk.1.attn_k.weight")
        .collect()
}

/// Every type against llama-quantize live on `ts` (one input file per type: the huge rows only
/// for MXFP4); the hashes recorded under `key` in record mode. `false`: llama.cpp missing.
fn compare_live(ts: &[Tensor], md: &dyn Fn() -> Vec<(String, tq::gguf::Value)>, key: &str) -> bool {
    let Some(bin) = fixtures::llama_quantize() else {
        return false;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut section = serde_json::Map::new();
    let mut problems = Vec::new();
    for (tn, ftype) in TYPES {
        let t_ty = ty(tn);
        let sel = for_type(tn, ts);
        let inp = dir.path().join(format!("{key}-{tn}-f32.gguf"));
        write_f32_gguf(&inp, md(), &sel);
        let theirs = run_llama(&bin, &inp, &dir.path().join("out.gguf"), ftype, None);
        std::fs::remove_file(&inp).ok();
        let mut hashes = serde_json::Map::new();
        let (mut same, mut blocks) = (0, 0);
        for t in &sel {
            let (lty, lb) = &theirs[&t.name];
            assert_eq!(
                *lty, t_ty,
                "{}: llama-quantize --pure {ftype} wrote {lty}",
                t.name
            );
            hashes.insert(t.name.clone(), json!(fixtures::blake3_hex(lb)));
            let ob = registry_bytes(t_ty, t);
            match first_diff(t_ty, t, &ob, lb) {
                None => {
                    same += 1;
                    blocks += ob.len() / t_ty.block_bytes();
                }
                Some(d) => problems.push(d),
            }
        }
        eprintln!(
            "{key} {tn}: {same}/{} tensors, {blocks} blocks byte-identical to llama-quantize",
            sel.len()
        );
        section.insert(tn.to_string(), Json::Object(hashes));
    }
    if EXPECTED.recording() {
        EXPECTED.record(key, Json::Object(section));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    true
}

/// Every type's bytes on `ts` against the hashes recorded under `key`.
fn compare_recorded(ts: &[Tensor], key: &str) {
    let exp = EXPECTED.load();
    let mut bad = Vec::new();
    let mut n = 0;
    for (tn, _) in TYPES {
        for t in for_type(tn, ts) {
            let want = exp[key][tn][&t.name]
                .as_str()
                .unwrap_or_else(|| panic!("no recorded hash for {key} {tn} {}", t.name));
            if fixtures::blake3_hex(&registry_bytes(ty(tn), t)) != want {
                bad.push(format!("{tn} {}", t.name));
            }
            n += 1;
        }
    }
    assert!(bad.is_empty(), "differ from llama-quantize: {bad:?}");
    eprintln!(
        "{key}: {n} (type, tensor) pairs byte-identical to the recorded llama-quantize output"
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
        &|| llama_metadata("tq ternary/mxfp4 oracle", 2, 256, 4),
        "synthetic",
    );
}

#[test]
fn smollm2_ffn_down_matches_llama() {
    let Some(ts) = smollm2_ffn_down() else { return };
    let (l, e, h) = SMOLLM2_SHAPE;
    compare_live(
        &ts,
        &|| llama_metadata("tq ternary/mxfp4 oracle", l, e, h),
        "smollm2_ffn_down",
    );
    compare_recorded(&ts, "smollm2_ffn_down");
}

/// Tensor name → (type, blake3 of its data).
type Hashes = BTreeMap<String, (String, String)>;

/// (type, data hash) of every tensor of a GGUF file.
fn file_hashes(f: &GgufFile) -> Hashes {
    f.tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                (
                    t.ty.name().to_string(),
                    fixtures::blake3_hex(f.tensor_data(t)),
                ),
            )
        })
        .collect()
}

/// Every quantized tensor of `f` decodes with tq's dequantizers to finite values.
fn decodes(f: &GgufFile, what: &str) {
    for t in f.tensors.iter().filter(|t| t.ty.is_quantized()) {
        let mut y = vec![0f32; t.n_elements() as usize];
        types::dequantize_rows(t.ty, f.tensor_data(t), &mut y, t.dims[0] as usize, &t.name)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            y.iter().all(|v| v.is_finite()),
            "{what}: {} decodes to non-finite",
            t.name
        );
    }
}

/// `tq convert --preset` (TQ1_0 / TQ2_0 on SmolLM2, MXFP4_MOE on the MoE fixtures) against
/// llama-quantize's file for the same preset: same types, same bytes for every tensor.
#[test]
fn presets_write_llama_quantize_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut models: Vec<(String, std::path::PathBuf, &[&str])> = Vec::new();
    for arch in ["qwen3moe", "mixtral"] {
        let p = dir.path().join(format!("{arch}.gguf"));
        std::fs::write(&p, fixtures::arch_gen::arch_fixture(arch).unwrap()).unwrap();
        models.push((arch.to_string(), p, &["MXFP4_MOE"]));
    }
    if let Some(smol) = fixtures::smollm2() {
        models.push(("smollm2".into(), smol, &["TQ1_0", "TQ2_0"]));
    }
    let bin = fixtures::llama_quantize();
    let exp = EXPECTED.load();
    let mut section = serde_json::Map::new();
    for (name, path, presets) in &models {
        for &preset in *presets {
            let what = format!("{name} --preset {preset}");
            let ours = dir.path().join(format!("tq-{name}-{preset}.gguf"));
            let (code, _, err) =
                tq(&["convert", s(path), "--preset", preset, "-q", "-o", s(&ours)]);
            assert_eq!(code, 0, "tq convert {what}: {err}");
            let f = GgufFile::open(&ours).unwrap();
            decodes(&f, &what);
            let mine = file_hashes(&f);
            let want_ty = if preset == "MXFP4_MOE" {
                TensorType::MXFP4
            } else {
                ty(&preset.to_ascii_lowercase())
            };
            assert!(
                f.tensors.iter().any(|t| t.ty == want_ty),
                "{what}: no tensor written as {want_ty}"
            );
            let mut oracles: Vec<(&str, Hashes)> = vec![];
            if let Some(b) = &bin {
                let theirs = dir.path().join(format!("llama-{name}-{preset}.gguf"));
                let o = std::process::Command::new(b)
                    .args(["--allow-requantize", s(path), s(&theirs), preset, "2"])
                    .output()
                    .unwrap();
                assert!(
                    o.status.success(),
                    "llama-quantize {what}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                let live = file_hashes(&GgufFile::open(&theirs).unwrap());
                std::fs::remove_file(&theirs).ok();
                section.insert(format!("{name} {preset}"), json!(live));
                oracles.push(("live", live));
            }
            match exp
                .get("presets")
                .and_then(|p| p.get(format!("{name} {preset}")))
            {
                Some(j) => oracles.push((
                    "recorded",
                    serde_json::from_value(j.clone()).expect("recorded preset hashes"),
                )),
                None if EXPECTED.recording() => {}
                None => panic!("{what}: no recorded hashes ({})", EXPECTED.script),
            }
            for (kind, want) in oracles {
                assert_eq!(mine.len(), want.len(), "{what}: tensor count vs {kind}");
                for (n, (t, h)) in &want {
                    let (mt, mh) = &mine[n];
                    assert_eq!(mt, t, "{what}: {n} type vs {kind}");
                    assert_eq!(
                        mh, h,
                        "{what}: {n} ({t}) data differs from llama-quantize's ({kind})"
                    );
                }
            }
            eprintln!(
                "{what}: {} tensors as llama-quantize writes them",
                mine.len()
            );
        }
    }
    if EXPECTED.recording() && bin.is_some() {
        EXPECTED.record("presets", Json::Object(section));
    }
}
