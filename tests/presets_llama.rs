//! `tq convert --preset NAME` against llama-quantize's own choices (llama.cpp as the upstream
//! profile pins it, scripts/build-llama.sh).
//!
//! * `preset_types_match_llama_quantize`: for every preset and every model — SmolLM2 (Q4_1, so
//!   `--allow-requantize`), the architecture fixtures (gemma2/3, phi3, qwen3moe, Mixtral, and the
//!   8×-wide dense ones whose rows hold 256-superblocks) and synthetic llama-shaped models
//!   (32 layers with GQA 2 and GQA 4, 80 layers with GQA 8 = llama.cpp's 70B class, 4 layers with
//!   tied embeddings; 256-wide rows, few rows per matrix; and a 2-layer 7B shape, 4096 wide with
//!   an 11008 FFN, where every matrix holds i-quant superblocks and the IQ2_XXS / IQ2_XS /
//!   IQ3_XXS / IQ1_S presets are checked to fall back nowhere) — with an imatrix and, where
//!   llama-quantize accepts it, without: the type of every tensor tq's preset planner gives equals
//!   llama-quantize's, and tq refuses exactly where llama-quantize asks for an imatrix. Live with
//!   `$TQ_CACHE/llama.cpp/build/bin/llama-quantize` (the tiny models' output files read with tq's
//!   GGUF reader; SmolLM2, the wide fixtures and the synthetic llamas through
//!   `llama-quantize --dry-run`, whose printed target types are the ones it writes — the same
//!   `target_type` — to keep the run to a few minutes), and always against the recorded llama-quantize
//!   choices in `fixtures/presets_expected.json` (`TQ_PRESETS_RECORD=1` rewrites them live).
//!   Where tq has the encoders, the whole `tq convert --preset --dry-run` plan is compared too.
//! * `smollm2_preset_bytes_match_llama_quantize`: Q4_K_M, Q6_K and Q8_0 written by tq without
//!   calibration have every tensor's data byte-identical to llama-quantize's output (live, and
//!   against the recorded blake3 of llama-quantize's tensors).
//! * `calibrated_preset_keeps_types_and_bytes`: `--preset Q4_K_M --calib TEXT` writes the same
//!   types and tensor bytes as the round-to-nearest preset, with LDLQ changing the values.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::arch_gen::arch_fixture;
use fixtures::gguf_gen::{build_with_data, gaussian};
use fixtures::{s, tq};
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use tq::gguf::{GgufFile, Value};
use tq::plan::preset::{self, ModelFacts, Options, PRESETS};
use tq::types::TensorType;

const RECORDED: &str = "fixtures/presets_expected.json";

/// The architecture fixtures the presets are checked on.
const ARCH: &[&str] = &[
    "gemma2",
    "gemma3",
    "phi3",
    "qwen3moe",
    "mixtral",
    "gemma2-wide",
    "phi3-wide",
];

/// Synthetic llama-shaped models: (name, layers, heads, KV heads, tied embeddings, hidden
/// width, FFN width).
const LAYERED: &[(&str, u32, u32, u32, bool, u64, u64)] = &[
    ("llama32-gqa2", 32, 8, 4, false, 256, 512),
    ("llama32-gqa4", 32, 8, 2, false, 256, 512),
    ("llama80-gqa8", 80, 64, 8, false, 256, 512),
    ("llama4-tied", 4, 4, 4, true, 256, 512),
    // 7B's widths (4096, FFN 11008 = 43 superblocks, 32 heads), 2 blocks: every matrix, token
    // embedding and output included, holds i-quant superblocks, so no type falls back.
    (SEVEN_B, 2, 32, 32, false, 4096, 11008),
];

/// The 7B-shaped model of [`LAYERED`].
const SEVEN_B: &str = "llama7b-4096";

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A llama with 7B's tensor names, hidden `h` and ffn `ff` (multiples of 256: rows hold
/// 256-superblocks) but only 4 rows per matrix: the rules read row lengths, names, layer
/// positions and hyper-parameters, never the row count.
fn layered(n_layer: u32, n_head: u32, n_kv: u32, tied: bool, h: u64, ff: u64) -> Vec<u8> {
    let rows = 4u64;
    let md = vec![
        ("general.architecture".to_string(), Value::string("llama")),
        (
            "general.name".to_string(),
            Value::string("tq preset oracle"),
        ),
        ("llama.context_length".to_string(), Value::U32(256)),
        ("llama.embedding_length".to_string(), Value::U32(h as u32)),
        ("llama.block_count".to_string(), Value::U32(n_layer)),
        (
            "llama.feed_forward_length".to_string(),
            Value::U32(ff as u32),
        ),
        ("llama.attention.head_count".to_string(), Value::U32(n_head)),
        (
            "llama.attention.head_count_kv".to_string(),
            Value::U32(n_kv),
        ),
        (
            "llama.attention.layer_norm_rms_epsilon".to_string(),
            Value::F32(1e-5),
        ),
        ("general.file_type".to_string(), Value::U32(0)),
    ];
    let mut t: Vec<(String, Vec<u64>)> = vec![("token_embd.weight".into(), vec![h, 32])];
    for l in 0..n_layer {
        for (n, d) in [
            ("attn_norm", vec![h]),
            ("attn_q", vec![h, rows]),
            ("attn_k", vec![h, rows]),
            ("attn_v", vec![h, rows]),
            ("attn_output", vec![h, rows]),
            ("ffn_norm", vec![h]),
            ("ffn_gate", vec![h, rows]),
            ("ffn_up", vec![h, rows]),
            ("ffn_down", vec![ff, rows]),
        ] {
            t.push((format!("blk.{l}.{n}.weight"), d));
        }
    }
    t.push(("output_norm.weight".into(), vec![h]));
    if !tied {
        t.push(("output.weight".into(), vec![h, 32]));
    }
    let data = t
        .into_iter()
        .enumerate()
        .map(|(i, (name, dims))| {
            let n: u64 = dims.iter().product();
            let v = if dims.len() == 1 {
                vec![1.0f32; n as usize]
            } else {
                gaussian(i as u64 + 11, n as usize, 0.02)
            };
            (name, dims, 0u32, f32_bytes(&v))
        })
        .collect();
    build_with_data(3, None, md, data).bytes
}

struct Model {
    name: String,
    path: PathBuf,
    /// Ask llama-quantize with --dry-run (a real model: quantizing it 60 times takes minutes).
    dry_run: bool,
}

/// Every model, written under `dir` (SmolLM2 when it is in the cache).
fn models(dir: &Path) -> Vec<Model> {
    let mut v = vec![];
    for &name in ARCH {
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, arch_fixture(name).unwrap()).unwrap();
        v.push(Model {
            name: name.into(),
            path,
            // The wide ones' i-quant encodes take llama-quantize seconds each.
            dry_run: name.ends_with("-wide"),
        });
    }
    for &(name, l, h, kv, tied, width, ff) in LAYERED {
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, layered(l, h, kv, tied, width, ff)).unwrap();
        v.push(Model {
            name: name.into(),
            path,
            // 32-80 layers: llama-quantize's i-quant encodes take seconds each.
            dry_run: true,
        });
    }
    if let Some(p) = fixtures::smollm2() {
        v.push(Model {
            name: "smollm2".into(),
            path: p,
            dry_run: true,
        });
    }
    v
}

/// An imatrix covering every tensor of `f` llama-quantize may quantize (experts per slice).
fn write_imatrix(f: &GgufFile, out: &Path) {
    let mut diag = vec![];
    for (k, t) in f.tensors.iter().enumerate() {
        let nd = t.dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
        if nd < 2 || !t.name.ends_with("weight") {
            continue;
        }
        let d: Vec<f64> = (0..t.dims[0])
            .map(|i| 1.0 + ((i as usize * 7 + k) % 13) as f64)
            .collect();
        let names: Vec<String> = if t.dims.len() == 3 && t.dims[2] > 1 {
            (0..t.dims[2]).map(|e| format!("{}#{e}", t.name)).collect()
        } else {
            vec![t.name.clone()]
        };
        for n in names {
            diag.push(tq::quant::Diagonal {
                tensors: vec![n],
                tokens: 64,
                d: d.clone(),
            });
        }
    }
    tq::calib::imatrix::write_gguf(&diag, out, "synthetic", 64).unwrap();
}

/// What llama-quantize chose: each quantizable (≥ 2-D) tensor's type, or that it refused for
/// want of an imatrix.
#[derive(Debug, PartialEq)]
enum Choice {
    Types(BTreeMap<String, String>),
    NeedsImatrix,
}

/// `blk.0.attn_k.weight - [ 576, 192, 1, 1], type = q4_1, size = ... (iq4_nl)` → name, type.
fn parse_dry_run(log: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for l in log
        .lines()
        .filter(|l| l.starts_with('[') && l.contains(" type = "))
    {
        let name = l
            .split(']')
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        let dims: Vec<u64> = l
            .split('[')
            .nth(2)
            .unwrap()
            .split(']')
            .next()
            .unwrap()
            .split(',')
            .map(|d| d.trim().parse().unwrap())
            .collect();
        let cur = l.split(" type = ").nth(1).unwrap();
        let cur = cur.split(',').next().unwrap().trim();
        let new = match l.rfind('(') {
            Some(i) if l.ends_with(')') => &l[i + 1..l.len() - 1],
            _ => cur,
        };
        if dims.iter().filter(|&&d| d > 1).count() >= 2 {
            m.insert(name.to_string(), new.trim().to_string());
        }
    }
    m
}

fn run_llama(bin: &Path, m: &Model, preset: &str, im: Option<&Path>, out: &Path) -> Choice {
    let mut cmd = Command::new(bin);
    cmd.arg("--allow-requantize");
    if m.dry_run {
        cmd.arg("--dry-run");
    }
    if let Some(im) = im {
        cmd.arg("--imatrix").arg(im);
    }
    let o = cmd
        .arg(&m.path)
        .arg(out)
        .arg(preset)
        .arg("1")
        .output()
        .expect("run llama-quantize");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if log.contains("requires an importance matrix") || log.contains("will require an imatrix") {
        return Choice::NeedsImatrix;
    }
    assert!(
        o.status.success(),
        "llama-quantize {preset} on {}: {}",
        m.name,
        log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
    );
    if m.dry_run {
        return Choice::Types(parse_dry_run(&log));
    }
    let f = GgufFile::open(out).expect("open llama-quantize output");
    let _ = std::fs::remove_file(out);
    Choice::Types(
        f.tensors
            .iter()
            .filter(|t| t.dims.iter().filter(|&&d| d > 1).count() >= 2)
            .map(|t| (t.name.clone(), t.ty.name().to_string()))
            .collect(),
    )
}

/// tq's choice for the same model and preset.
fn tq_choice(path: &Path, preset_name: &str, has_imatrix: bool) -> Choice {
    let src = tq::source::open(path, &Default::default()).unwrap();
    let facts = ModelFacts::of(src.as_ref()).unwrap();
    let p = preset::parse(preset_name).unwrap();
    let types = preset::types(
        p,
        &facts,
        src.tensors(),
        &Options {
            has_imatrix,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{preset_name} on {}: {e}", path.display()));
    if !has_imatrix && types.values().any(|c| c.needs_imatrix) {
        return Choice::NeedsImatrix;
    }
    Choice::Types(
        src.tensors()
            .iter()
            .filter(|t| t.is_matrix())
            .map(|t| (t.name.clone(), types[&t.name].ty.name().to_string()))
            .collect(),
    )
}

/// The whole `tq convert --preset --dry-run` plan, where tq has every encoder the preset needs.
fn pipeline_types(path: &Path, preset_name: &str, im: Option<&Path>) -> Option<Choice> {
    let job = tq::pipeline::Job::resolve(tq::pipeline::ConvertFlags {
        input: path.to_path_buf(),
        preset: Some(preset_name.into()),
        imatrix: im.map(Path::to_path_buf),
        dry_run: true,
        quiet: true,
        kld_windows: 2,
        ..Default::default()
    })
    .unwrap();
    match tq::pipeline::convert(&job) {
        Ok(o) => Some(Choice::Types(
            o.plan
                .entries
                .iter()
                .filter(|e| e.dims.iter().filter(|&&d| d > 1).count() >= 2)
                .map(|e| (e.name.clone(), e.dst.name().to_string()))
                .collect(),
        )),
        Err(e) if e.to_string().contains("needs an importance matrix") => {
            Some(Choice::NeedsImatrix)
        }
        Err(e) if e.to_string().contains("tq cannot encode yet") => None,
        Err(e) => panic!("tq convert --preset {preset_name} {}: {e}", path.display()),
    }
}

/// Name the first tensor whose type differs (or the refusal that differs).
fn diff(what: &str, tq: &Choice, llama: &Choice) -> Option<String> {
    match (tq, llama) {
        (Choice::Types(a), Choice::Types(b)) => {
            for (n, t) in b {
                match a.get(n) {
                    Some(x) if x == t => {}
                    Some(x) => {
                        return Some(format!("{what}: {n} is {x} in tq, {t} in llama-quantize"))
                    }
                    None => return Some(format!("{what}: {n} ({t}) missing from tq's plan")),
                }
            }
            a.keys()
                .find(|n| !b.contains_key(*n))
                .map(|n| format!("{what}: {n} planned by tq but not in llama-quantize's file"))
        }
        (a, b) if a == b => None,
        (a, b) => Some(format!(
            "{what}: tq {}, llama-quantize {}",
            if matches!(a, Choice::NeedsImatrix) {
                "refuses without an imatrix"
            } else {
                "plans it"
            },
            if matches!(b, Choice::NeedsImatrix) {
                "refuses without an imatrix"
            } else {
                "writes it"
            },
        )),
    }
}

/// Recorded form, compact: per model the sorted names of its ≥ 2-D tensors once, and per preset
/// and mode one character per tensor (the type's index in the registry, from '0'), or
/// "needs imatrix".
fn code(t: &str) -> char {
    let i = tq::types::TYPES.iter().position(|x| x.name == t).unwrap();
    (b'0' + i as u8) as char
}

fn to_json(c: &Choice, names: &[String]) -> Json {
    match c {
        Choice::NeedsImatrix => json!("needs imatrix"),
        Choice::Types(m) => {
            assert_eq!(m.len(), names.len(), "tensor count");
            json!(names.iter().map(|n| code(&m[n])).collect::<String>())
        }
    }
}

fn from_json(j: &Json, names: &[String]) -> Choice {
    let s = j.as_str().unwrap();
    if s == "needs imatrix" {
        return Choice::NeedsImatrix;
    }
    assert_eq!(s.len(), names.len(), "recorded tensor count");
    Choice::Types(
        names
            .iter()
            .zip(s.bytes())
            .map(|(n, c)| {
                (
                    n.clone(),
                    tq::types::TYPES[(c - b'0') as usize].name.to_string(),
                )
            })
            .collect(),
    )
}

fn recorded() -> Json {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORDED);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

#[test]
fn preset_types_match_llama_quantize() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recorded();
    let record = std::env::var("TQ_PRESETS_RECORD").as_deref() == Ok("1");
    // Missing: recorded as not run (the recorded choices are still compared).
    let bin = fixtures::llama_quantize();
    let mut fresh = serde_json::Map::new();
    let mut fails = vec![];
    let mut compared = 0;
    for m in models(dir.path()) {
        let f = GgufFile::open(&m.path).unwrap();
        let im = dir.path().join(format!("{}.imatrix.gguf", m.name));
        write_imatrix(&f, &im);
        let names: Vec<String> = {
            let mut v: Vec<String> = f
                .tensors
                .iter()
                .filter(|t| t.dims.iter().filter(|&&d| d > 1).count() >= 2)
                .map(|t| t.name.clone())
                .collect();
            v.sort();
            v
        };
        let mut per_model = serde_json::Map::new();
        per_model.insert("tensors".into(), json!(names));
        let t0 = std::time::Instant::now();
        for p in PRESETS {
            let mut per_mode = serde_json::Map::new();
            for (mode, imx) in [("imatrix", Some(im.as_path())), ("plain", None)] {
                let what = format!("{} {} ({mode})", m.name, p.name);
                let ours = tq_choice(&m.path, p.name, imx.is_some());
                if m.name == SEVEN_B && imx.is_some() {
                    seven_b_has_no_fallbacks(p.name, &ours);
                }
                let mut oracles = vec![];
                if let Some(j) = rec
                    .get(&m.name)
                    .and_then(|r| r.get(p.name))
                    .and_then(|r| r.get(mode))
                {
                    let rn: Vec<String> = rec[&m.name]["tensors"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_str().unwrap().to_string())
                        .collect();
                    oracles.push(("recorded", from_json(j, &rn)));
                } else if !record {
                    fails.push(format!(
                        "{what}: no recorded llama-quantize choice in {RECORDED}"
                    ));
                }
                if let Some(b) = &bin {
                    let out = dir.path().join("out.gguf");
                    let live = run_llama(b, &m, p.name, imx, &out);
                    per_mode.insert(mode.into(), to_json(&live, &names));
                    oracles.push(("live", live));
                }
                for (kind, want) in &oracles {
                    compared += 1;
                    if let Some(d) = diff(&format!("{what} vs {kind}"), &ours, want) {
                        fails.push(d);
                    }
                }
                // The whole planner (overrides path, row constraints) agrees where tq can encode.
                if let (Some(pipe), Some((_, want))) =
                    (pipeline_types(&m.path, p.name, imx), oracles.first())
                {
                    if let Some(d) = diff(&format!("{what}, tq convert --dry-run"), &pipe, want) {
                        fails.push(d);
                    }
                }
            }
            per_model.insert(p.name.into(), Json::Object(per_mode));
        }
        eprintln!("{}: {:.1} s", m.name, t0.elapsed().as_secs_f64());
        fresh.insert(m.name.clone(), Json::Object(per_model));
    }
    if record && bin.is_some() {
        let mut all = rec.as_object().cloned().unwrap_or_default();
        all.insert(
            "presets".into(),
            json!(PRESETS.iter().map(|p| p.name).collect::<Vec<_>>()),
        );
        for (k, v) in fresh {
            all.insert(k, v);
        }
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORDED);
        std::fs::write(
            &p,
            serde_json::to_string_pretty(&Json::Object(all)).unwrap() + "\n",
        )
        .unwrap();
    }
    assert!(compared > 0, "nothing compared");
    assert!(
        fails.is_empty(),
        "{} differences:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

/// On the 4096-wide model, the i-quant presets put i-quants in every layer and fall back nowhere:
/// every ≥ 2-D tensor gets a 256-superblock type (a k- or i-quant), never the legacy/iq4_nl
/// types llama-quantize falls back to for rows that cannot hold one.
fn seven_b_has_no_fallbacks(preset: &str, c: &Choice) {
    if !["IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S"].contains(&preset) {
        return;
    }
    let Choice::Types(m) = c else {
        panic!("{SEVEN_B} {preset}: refused with an imatrix")
    };
    let (mut iq, mut n) = (0, 0);
    for (name, t) in m {
        let ty = TensorType::from_name(t).unwrap();
        assert_eq!(
            ty.block_size(),
            256,
            "{SEVEN_B} {preset}: {name} fell back to {t}"
        );
        n += 1;
        iq += (name.starts_with("blk.") && t.starts_with("iq")) as usize;
    }
    assert!(
        iq * 2 > n,
        "{SEVEN_B} {preset}: only {iq} of {n} tensors are i-quants: {m:?}"
    );
}

/// blake3 of each tensor's data.
fn hashes(f: &GgufFile) -> BTreeMap<String, String> {
    f.tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                blake3::hash(f.tensor_data(t)).to_hex().to_string(),
            )
        })
        .collect()
}

#[test]
fn smollm2_preset_bytes_match_llama_quantize() {
    let Some(model) = fixtures::smollm2() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rec = recorded();
    // Missing: recorded as not run (the recorded choices are still compared).
    let bin = fixtures::llama_quantize();
    let mut fresh = serde_json::Map::new();
    for preset in ["Q4_K_M", "Q6_K", "Q8_0"] {
        let ours = dir.path().join(format!("tq-{preset}.gguf"));
        let (code, _, err) = tq(&[
            "convert",
            s(&model),
            "--preset",
            preset,
            "-o",
            s(&ours),
            "-q",
        ]);
        assert_eq!(code, 0, "tq convert --preset {preset}: {err}");
        let f = GgufFile::open(&ours).unwrap();
        let mine = hashes(&f);
        let mut oracles: Vec<(&str, BTreeMap<String, String>)> = vec![];
        let record = std::env::var("TQ_PRESETS_RECORD").as_deref() == Ok("1");
        if let Some(j) = rec.get("smollm2_bytes").and_then(|r| r.get(preset)) {
            oracles.push((
                "recorded",
                j.as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect(),
            ));
        } else if !record {
            panic!("no recorded hashes for {preset} in {RECORDED}");
        }
        if let Some(b) = &bin {
            let theirs = dir.path().join(format!("llama-{preset}.gguf"));
            let o = Command::new(b)
                .args(["--allow-requantize", s(&model), s(&theirs), preset, "2"])
                .output()
                .unwrap();
            assert!(o.status.success(), "llama-quantize {preset}");
            let g = GgufFile::open(&theirs).unwrap();
            let live = hashes(&g);
            fresh.insert(preset.into(), json!(live));
            // Types too, read from the written file.
            for t in &g.tensors {
                let mt = f.tensors.iter().find(|x| x.name == t.name).unwrap();
                assert_eq!(mt.ty, t.ty, "{preset}: {} type", t.name);
            }
            oracles.push(("live", live));
        }
        for (kind, want) in oracles {
            assert_eq!(mine.len(), want.len(), "{preset}: tensor count vs {kind}");
            for (n, h) in &want {
                assert_eq!(
                    mine.get(n),
                    Some(h),
                    "{preset}: {n} data differs from llama-quantize's ({kind})"
                );
            }
        }
    }
    if std::env::var("TQ_PRESETS_RECORD").as_deref() == Ok("1") && bin.is_some() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORDED);
        let mut all = rec.as_object().cloned().unwrap();
        all.insert("smollm2_bytes".into(), Json::Object(fresh));
        std::fs::write(
            &p,
            serde_json::to_string_pretty(&Json::Object(all)).unwrap() + "\n",
        )
        .unwrap();
    }
}

/// Rows that cannot hold a k-quant super-block (96 and 288 wide) make llama-quantize's Q5_K_M
/// and Q5_K_S fall back to q5_1 (and Q4_1 is q4_1 throughout): with `--calib` those tensors are
/// LDLQ'd (`tq.tensor_methods` says `ldlq`, the bytes differ from the round-to-nearest preset's,
/// the types and sizes do not), with `--imatrix` importance-weighted, and without either
/// round-to-nearest.
#[test]
fn calibrated_fallback_presets_ldlq_q4_1_and_q5_1() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, fixtures::gguf_gen::tiny_llama_tok(2, 96, 288).bytes).unwrap();
    let text = dir.path().join("calib.txt");
    std::fs::write(&text, fixtures::gguf_gen::pseudo_text(3000)).unwrap();
    let calib = [
        "--calib",
        s(&text),
        "--calib-tokens",
        "1024",
        "--calib-ctx",
        "128",
    ];
    let methods = |f: &GgufFile| -> BTreeMap<String, String> {
        f.get("tq.tensor_methods")
            .and_then(|v| v.as_array())
            .expect("tq.tensor_methods")
            .iter()
            .map(|v| {
                let e = v.as_str().expect("a string").to_string();
                let (name, m) = e.split_once('=').expect("name=type:method");
                (name.to_string(), m.to_string())
            })
            .collect()
    };
    for (preset, ty) in [("Q5_K_M", "q5_1"), ("Q5_K_S", "q5_1"), ("Q4_1", "q4_1")] {
        let conv = |name: &str, extra: &[&str]| {
            let out = dir.path().join(format!("{preset}-{name}.gguf"));
            let mut a = vec![
                "convert",
                s(&model),
                "--preset",
                preset,
                "-q",
                "-o",
                s(&out),
            ];
            a.extend_from_slice(extra);
            let (c, _, e) = tq(&a);
            assert_eq!(c, 0, "{preset} {name}: {e}");
            GgufFile::open(&out).unwrap()
        };
        let (rtn, cal) = (conv("rtn", &[]), conv("calib", &calib));
        let (mr, mc) = (methods(&rtn), methods(&cal));
        let (mut n, mut changed) = (0, 0);
        for (x, y) in rtn.tensors.iter().zip(&cal.tensors) {
            assert_eq!(
                (&x.name, x.ty),
                (&y.name, y.ty),
                "{preset}: type under --calib"
            );
            assert_eq!(rtn.tensor_data(x).len(), cal.tensor_data(y).len());
            if x.ty.name() != ty || x.dims.len() != 2 || x.name == "token_embd.weight" {
                continue;
            }
            n += 1;
            assert_eq!(mr[&x.name], format!("{ty}:rtn"), "{preset} {}", x.name);
            assert_eq!(mc[&x.name], format!("{ty}:ldlq"), "{preset} {}", x.name);
            changed += (rtn.tensor_data(x) != cal.tensor_data(y)) as usize;
        }
        assert!(n >= 8, "{preset}: only {n} {ty} matrices");
        assert_eq!(changed, n, "{preset}: LDLQ left some {ty} matrix unchanged");
    }
}

#[test]
fn calibrated_preset_keeps_types_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(
        &model,
        fixtures::gguf_gen::tiny_llama_tok(4, 256, 512).bytes,
    )
    .unwrap();
    let text = dir.path().join("calib.txt");
    std::fs::write(&text, fixtures::gguf_gen::pseudo_text(3000)).unwrap();
    let rtn = dir.path().join("rtn.gguf");
    let cal = dir.path().join("cal.gguf");
    let (c, _, e) = tq(&[
        "convert",
        s(&model),
        "--preset",
        "Q4_K_M",
        "-o",
        s(&rtn),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    let (c, _, e) = tq(&[
        "convert",
        s(&model),
        "--preset",
        "Q4_K_M",
        "--calib",
        s(&text),
        "--calib-tokens",
        "1024",
        "--calib-ctx",
        "128",
        "-o",
        s(&cal),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    let (a, b) = (GgufFile::open(&rtn).unwrap(), GgufFile::open(&cal).unwrap());
    assert_eq!(a.tensors.len(), b.tensors.len());
    let (mut bytes_a, mut bytes_b, mut changed) = (0, 0, 0);
    for (x, y) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!((&x.name, x.ty), (&y.name, y.ty), "type under --calib");
        bytes_a += a.tensor_data(x).len();
        bytes_b += b.tensor_data(y).len();
        if x.ty.is_quantized() && a.tensor_data(x) != b.tensor_data(y) {
            changed += 1;
        }
    }
    assert_eq!(bytes_a, bytes_b, "total tensor bytes under --calib");
    // The 4-layer model's preset has q4_K, q6_K (layers 0 and 3) and q8_0/q6_K embeddings:
    // LDLQ changes the values of the calibrated matrices.
    assert!(
        changed >= 8,
        "only {changed} quantized tensors changed under --calib"
    );
}

#[test]
fn preset_flag_errors() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, layered(4, 4, 4, false, 256, 512)).unwrap();
    let out = dir.path().join("o.gguf");
    let run = |extra: &[&str]| {
        let mut a = vec!["convert", s(&model), "-o", s(&out)];
        a.extend_from_slice(extra);
        tq(&a)
    };
    let one_line = |e: &str| e.trim().lines().count() == 1;
    let (c, _, e) = run(&["--preset", "Q4_K_Z"]);
    assert_eq!(c, 2);
    assert!(
        one_line(&e)
            && e.contains("unknown preset 'Q4_K_Z'")
            && e.contains("Q4_K_M")
            && e.contains("IQ2_XS"),
        "{e}"
    );
    for clash in [
        &["--weights", "q4_0"][..],
        &["--target-size", "1MB"],
        &["--target-bpw", "4"],
        &["--recipe", "pure"],
    ] {
        let mut a = vec!["--preset", "Q4_K_M"];
        a.extend_from_slice(clash);
        let (c, _, e) = run(&a);
        assert_eq!(c, 2, "{clash:?}");
        assert!(one_line(&e) && e.contains(clash[0]), "{clash:?}: {e}");
    }
    // llama-quantize refuses these without an imatrix; so does tq, naming a tensor and the way out.
    for p in ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "Q2_K_S"] {
        let (c, _, e) = run(&["--preset", p]);
        assert_eq!(c, 2, "{p}: {e}");
        assert!(
            one_line(&e) && e.contains("needs an importance matrix") && e.contains("--imatrix"),
            "{p}: {e}"
        );
    }
    // A type without an encoder in the registry is named (the message goes when the encoder
    // lands); a preset whose types all have one is planned.
    let im = dir.path().join("im.gguf");
    write_imatrix(&GgufFile::open(&model).unwrap(), &im);
    let src = tq::source::open(&model, &Default::default()).unwrap();
    let facts = ModelFacts::of(src.as_ref()).unwrap();
    for p in PRESETS {
        let o = Options {
            has_imatrix: true,
            ..Default::default()
        };
        let types = preset::types(p, &facts, src.tensors(), &o).unwrap();
        let lacking = src
            .tensors()
            .iter()
            .map(|t| types[&t.name].ty)
            .find(|t| t.info().quantize.is_none());
        let (c, _, e) = run(&["--preset", p.name, "--imatrix", s(&im), "--dry-run"]);
        match lacking {
            Some(t) => {
                assert_eq!(c, 2, "{}: {e}", p.name);
                assert!(
                    one_line(&e) && e.contains("cannot encode yet") && e.contains(t.name()),
                    "{}: {e}",
                    p.name
                );
            }
            None => assert_eq!(c, 0, "{}: {e}", p.name),
        }
    }
    assert!(!out.exists(), "nothing is written on an error");
    // The default type of every preset is a registry type, and the names round-trip.
    for p in PRESETS {
        assert_eq!(preset::parse(&p.name.to_lowercase()).unwrap().name, p.name);
        assert!(TensorType::from_name(p.default.name()).is_some());
    }
    assert_eq!(preset::parse("q4_k").unwrap().name, "Q4_K_M");
}
