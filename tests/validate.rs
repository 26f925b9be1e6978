//! `tq validate` on small generated models: exit codes for pass / fail / undecided, `--chunks
//! auto`, the JSON report, JUnit parsed by Python's xml module, structure failures (a NaN block
//! named), and every bad-input path (truncated file, stale or foreign reference, bad policy,
//! baseline made another way) as one line with exit 2.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::gguf_gen::tiny_llama;
use fixtures::{s, tq};
use std::path::{Path, PathBuf};

struct Setup {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    model: PathBuf,
    q8: PathBuf,
    tq3: PathBuf,
    tokens: PathBuf,
}

/// A tiny f32 llama (2 blocks, hidden 64, vocabulary 100), its q8_0 and TQ3_1S conversions made by
/// tq (so they carry provenance naming the model), and 24 windows of 16 random tokens.
fn setup() -> Setup {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, tiny_llama(2, 64, 128, 100).bytes).unwrap();
    let arts = dir.join("artifacts");
    std::fs::create_dir(&arts).unwrap();
    let conv = |w: &str| {
        let out = arts.join(format!("tiny-{w}.gguf"));
        let (code, _, err) = tq(&[
            "convert",
            s(&model),
            "--weights",
            w,
            "--recipe",
            "pure",
            "-q",
            "-o",
            s(&out),
        ]);
        assert_eq!(code, 0, "{err}");
        out
    };
    let (q8, tq3) = (conv("q8_0"), conv("tq3_1s"));
    let mut x = 12345u64;
    let ids: Vec<String> = (0..16 * 24)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 100).to_string()
        })
        .collect();
    let tokens = dir.join("tokens.txt");
    std::fs::write(&tokens, ids.join(" ")).unwrap();
    Setup {
        _dir: d,
        dir,
        model,
        q8,
        tq3,
        tokens,
    }
}

impl Setup {
    fn validate(&self, art: &Path, extra: &[&str]) -> (i32, String, String) {
        let mut a = vec![
            "validate",
            s(art),
            "--ref",
            s(&self.model),
            "--tokens",
            s(&self.tokens),
            "--ctx",
            "16",
            "-q",
        ];
        a.extend_from_slice(extra);
        tq(&a)
    }

    fn json(&self, art: &Path, extra: &[&str]) -> (i32, serde_json::Value) {
        let mut e = extra.to_vec();
        e.push("--json");
        let (code, out, err) = self.validate(art, &e);
        assert!(code == 0 || code == 3 || code == 4, "exit {code}: {err}");
        (code, serde_json::from_str(&out).unwrap())
    }
}

fn check<'a>(r: &'a serde_json::Value, group: &str, name: &str) -> &'a serde_json::Value {
    r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["group"] == group && c["name"] == name)
        .unwrap_or_else(|| panic!("no check {group}/{name} in {r}"))
}

fn one_line_error(err: &str, want: &str) {
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("tq: error: "), "{err}");
    assert!(err.contains(want), "want '{want}' in: {err}");
}

#[test]
fn verdicts_and_exit_codes_follow_the_interval() {
    let t = setup();
    // Measure the q8_0 artifact's mean KLD on all windows.
    let (code, r) = t.json(&t.q8, &["--chunks", "all", "--gen-prompts", "0"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["report_version"], 1);
    assert_eq!(r["verdict"], "pass");
    let q = &r["quality"];
    assert_eq!(q["windows"], 24);
    let (kld, err) = (
        q["kld"]["value"].as_f64().unwrap(),
        q["kld"]["err"].as_f64().unwrap(),
    );
    assert!(kld > 0.0 && err > 0.0, "{q}");
    for name in ["header", "engine", "finite", "provenance", "reference"] {
        assert_eq!(
            check(&r, "structure", name)["status"],
            "pass",
            "{name}: {r}"
        );
    }
    // Without a threshold a quality check reports its number and is skipped.
    assert_eq!(check(&r, "quality", "kld")["status"], "skipped");

    let all = ["--chunks", "all", "--gen-prompts", "0", "--max-kld"];
    let with = |limit: f64| {
        let l = format!("{limit:e}");
        let mut a = all.to_vec();
        a.push(&l);
        t.validate(&t.q8, &a).0
    };
    // Limit above kld + 2 SE: pass; below kld - 2 SE: fail (3); inside the interval: undecided (4).
    assert_eq!(with(kld + 2.5 * err), 0);
    assert_eq!(with(kld - 2.5 * err), 3);
    assert_eq!(with(kld + 1.0 * err), 4);
    assert_eq!(with(kld - 1.0 * err), 4);
}

#[test]
fn pass_fail_pair_and_chunks_auto() {
    let t = setup();
    let lim = [
        "--max-kld",
        "1e-4",
        "--min-top1",
        "90",
        "--gen-prompts",
        "0",
    ];
    let (code, q8) = t.json(&t.q8, &lim);
    assert_eq!(code, 0, "{q8}");
    let (code, tq3) = t.json(&t.tq3, &lim);
    assert_eq!(code, 3, "{tq3}");
    assert_eq!(check(&tq3, "quality", "kld")["status"], "fail");
    // Decided well before the 20-window cap: auto stopped early, at or after its minimum of 2.
    for r in [&q8, &tq3] {
        let w = r["quality"]["windows"].as_u64().unwrap();
        assert!((2..20).contains(&w), "windows {w}: {r}");
        assert_eq!(r["quality"]["windows_available"], 20);
        assert_eq!(r["chunks"], "auto");
    }
}

#[test]
fn junit_parses_with_python_and_carries_the_numbers() {
    let t = setup();
    let junit = t.dir.join("v.xml");
    let (code, _, err) = t.validate(
        &t.tq3,
        &[
            "--max-kld",
            "1e-4",
            "--junit",
            s(&junit),
            "--gen-prompts",
            "2",
        ],
    );
    assert_eq!(code, 3, "{err}");
    let py = r#"
import sys, xml.etree.ElementTree as E
root = E.parse(sys.argv[1]).getroot()
cases = root.findall('./testsuite/testcase')
fails = [c for c in cases if c.find('failure') is not None]
print(root.tag, len(cases), root.get('failures'), len(fails))
for c in fails:
    print(c.get('classname'), c.get('name'), c.find('failure').get('message'))
"#;
    let o = std::process::Command::new("python3")
        .args(["-c", py, s(&junit)])
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let first: Vec<&str> = out.lines().next().unwrap().split(' ').collect();
    assert_eq!(first[0], "testsuites");
    // header, engine, finite, provenance, reference, 4 quality, 3 kernels (auto: cuda, metal,
    // wgpu, each skipped or run), 2 generation.
    assert_eq!(first[1], "14", "{out}");
    assert_eq!(first[2], first[3], "{out}");
    assert!(
        out.contains("tq.validate.quality kld kld = ") && out.contains("limit <= 0.0001"),
        "{out}"
    );
}

#[test]
fn nan_block_fails_structure_with_the_tensor_named() {
    let t = setup();
    let bad = t.dir.join("nan.gguf");
    let mut bytes = std::fs::read(&t.q8).unwrap();
    let f = tq::gguf::GgufFile::open(&t.q8).unwrap();
    let ti = f.tensor("blk.1.ffn_up.weight").unwrap();
    // q8_0 block 3: its f16 scale set to NaN (0x7E00).
    let at = (f.data_offset + ti.offset) as usize + 3 * 34;
    bytes[at..at + 2].copy_from_slice(&0x7E00u16.to_le_bytes());
    std::fs::write(&bad, &bytes).unwrap();
    let (code, r) = t.json(&bad, &["--gen-prompts", "0", "--chunks", "2"]);
    assert_eq!(code, 3, "{r}");
    let c = check(&r, "structure", "finite");
    assert_eq!(c["status"], "fail");
    let d = c["detail"].as_str().unwrap();
    assert!(
        d.contains("blk.1.ffn_up.weight") && d.contains("block 3"),
        "{d}"
    );
}

#[test]
fn bad_inputs_are_one_line_with_exit_2() {
    let t = setup();
    // Truncated artifact.
    let cut = t.dir.join("cut.gguf");
    let b = std::fs::read(&t.q8).unwrap();
    std::fs::write(&cut, &b[..b.len() / 2]).unwrap();
    let (code, _, err) = t.validate(&cut, &[]);
    assert_eq!(code, 2);
    one_line_error(&err, "cut.gguf");

    // Stale reference: another model than the one the artifact was made from.
    let other = t.dir.join("other.gguf");
    std::fs::write(&other, tiny_llama(2, 64, 96, 100).bytes).unwrap();
    let (code, _, err) = tq(&[
        "validate",
        s(&t.q8),
        "--ref",
        s(&other),
        "--tokens",
        s(&t.tokens),
        "--ctx",
        "16",
        "-q",
    ]);
    assert_eq!(code, 2);
    one_line_error(&err, "stale or wrong reference");

    // A reference of another architecture (the artifact has no provenance to catch it first).
    let noprov = t.dir.join("noprov.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&t.model),
        "--weights",
        "q8_0",
        "--no-provenance",
        "-q",
        "-o",
        s(&noprov),
    ]);
    assert_eq!(code, 0, "{err}");
    let wider = t.dir.join("wider.gguf");
    std::fs::write(&wider, tiny_llama(3, 64, 128, 100).bytes).unwrap();
    let (code, _, err) = tq(&[
        "validate",
        s(&noprov),
        "--ref",
        s(&wider),
        "--tokens",
        s(&t.tokens),
        "--ctx",
        "16",
        "-q",
    ]);
    assert_eq!(code, 2);
    one_line_error(&err, "llama.block_count");
    // ... and one of another architecture altogether.
    let fx = tiny_llama(2, 64, 128, 100);
    let md = fx
        .metadata
        .iter()
        .map(|(k, v)| match k.as_str() {
            "general.architecture" => (k.clone(), tq::gguf::Value::string("qwen2")),
            _ => (k.replacen("llama.", "qwen2.", 1), v.clone()),
        })
        .collect();
    let qwen = t.dir.join("qwen2.gguf");
    std::fs::write(
        &qwen,
        fixtures::gguf_gen::build_with_data(3, None, md, fx.tensors).bytes,
    )
    .unwrap();
    let (code, _, err) = tq(&[
        "validate",
        s(&noprov),
        "--ref",
        s(&qwen),
        "--tokens",
        s(&t.tokens),
        "--ctx",
        "16",
        "-q",
    ]);
    assert_eq!(code, 2);
    one_line_error(&err, "the reference is a qwen2 model");

    // Policy: unknown threshold, bad JSON, no matching rule.
    for (text, want) in [
        (
            r#"{"policy_version":1,"rules":[{"match":"*","thresholds":{"max_kl":0.1}}]}"#,
            "unknown field `max_kl`",
        ),
        ("{not json", "not a valid policy"),
        (
            r#"{"policy_version":1,"rules":[{"match":"*q4*","thresholds":{"max_kld":0.1}}]}"#,
            "no rule of the policy matches",
        ),
    ] {
        let p = t.dir.join("policy.json");
        std::fs::write(&p, text).unwrap();
        let (code, _, err) = t.validate(&t.q8, &["--policy", s(&p)]);
        assert_eq!(code, 2, "{err}");
        one_line_error(&err, want);
    }
    // Thresholds out of range and bad --chunks.
    let (code, _, err) = t.validate(&t.q8, &["--min-top1", "120"]);
    assert_eq!(code, 2);
    one_line_error(&err, "--min-top1");
    let (code, _, err) = t.validate(&t.q8, &["--chunks", "zero"]);
    assert_eq!(code, 2);
    one_line_error(&err, "--chunks zero");
    // Quality thresholds without a reference.
    let (code, _, err) = tq(&["validate", s(&t.q8), "--max-kld", "0.1", "-q"]);
    assert_eq!(code, 2);
    one_line_error(&err, "need a reference");
}

#[test]
fn policy_validates_a_directory() {
    let t = setup();
    let p = t.dir.join("policy.json");
    std::fs::write(
        &p,
        r#"{"policy_version":1,"rules":[
            {"match":"*q8_0*","thresholds":{"max_kld":1e-4}},
            {"match":"*","thresholds":{"max_kld":1e-4,"min_top1":90}}]}"#,
    )
    .unwrap();
    let arts = t.q8.parent().unwrap();
    let (code, out, err) = t.validate(arts, &["--policy", s(&p), "--gen-prompts", "0", "--json"]);
    assert_eq!(code, 3, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["verdict"], "fail");
    let reps = j["reports"].as_array().unwrap();
    assert_eq!(reps.len(), 2);
    // Name order: tiny-q8_0 (its own rule: no top-1 limit), then tiny-tq3_1s.
    assert!(reps[0]["artifact"]
        .as_str()
        .unwrap()
        .ends_with("tiny-q8_0.gguf"));
    assert_eq!(reps[0]["verdict"], "pass");
    assert_eq!(reps[0]["thresholds"]["min_top1"], serde_json::Value::Null);
    assert_eq!(reps[1]["verdict"], "fail");
    assert_eq!(reps[1]["thresholds"]["min_top1"], 90.0);
}

#[test]
fn baseline_regression_and_refusal() {
    let t = setup();
    let common = [
        "--chunks",
        "8",
        "--gen-prompts",
        "0",
        "--max-regression",
        "0.5",
    ];
    let (_, base) = t.json(&t.q8, &common);
    let bp = t.dir.join("base.json");
    std::fs::write(&bp, base.to_string()).unwrap();
    // The same artifact against its own baseline: no regression.
    let mut a = common.to_vec();
    a.extend(["--baseline", s(&bp)]);
    let (code, r) = t.json(&t.q8, &a);
    assert_eq!(code, 0, "{r}");
    assert_eq!(check(&r, "regression", "kld")["status"], "pass");
    // The TQ3_1S artifact against the q8_0 baseline: KLD far worse.
    let (code, r) = t.json(&t.tq3, &a);
    assert_eq!(code, 3, "{r}");
    assert_eq!(check(&r, "regression", "kld")["status"], "fail");
    // A baseline made with another ctx (or report version) is refused.
    let (code, _, err) = tq(&[
        "validate",
        s(&t.q8),
        "--ref",
        s(&t.model),
        "--tokens",
        s(&t.tokens),
        "--ctx",
        "32",
        "--chunks",
        "4",
        "--gen-prompts",
        "0",
        "--baseline",
        s(&bp),
        "-q",
    ]);
    assert_eq!(code, 2);
    one_line_error(&err, "different ctx");
    let mut old = base.clone();
    old["report_version"] = 0.into();
    std::fs::write(&bp, old.to_string()).unwrap();
    let (code, _, err) = t.validate(&t.q8, &a);
    assert_eq!(code, 2);
    one_line_error(&err, "different report version");
}

#[test]
fn generation_reports_agreement_and_divergence() {
    let t = setup();
    let (code, r) = t.json(
        &t.q8,
        &[
            "--chunks",
            "2",
            "--gen-prompts",
            "3",
            "--gen-tokens",
            "20",
            "--min-gen-agreement",
            "0",
        ],
    );
    assert_eq!(code, 0, "{r}");
    let g = r["generation"].as_array().unwrap();
    assert_eq!(g.len(), 3);
    for p in g {
        let a = p["agreement"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&a));
        // Identical continuations have no divergence; otherwise it is a position < 20.
        match p["first_divergence"].as_u64() {
            None => assert_eq!(a, 100.0),
            Some(d) => assert!(d < 20),
        }
    }
    assert_eq!(check(&r, "generation", "agreement")["status"], "pass");
    // The artifact against itself as reference is not allowed to differ at all.
    let (code, _, err) = tq(&[
        "validate",
        s(&t.model),
        "--ref",
        s(&t.model),
        "--tokens",
        s(&t.tokens),
        "--ctx",
        "16",
        "--chunks",
        "2",
        "--min-gen-agreement",
        "100",
        "--max-kld",
        "1e-5",
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn kernels_check_runs_on_the_artifacts_tq_blocks() {
    let t = setup();
    let (code, r) = t.json(
        &t.tq3,
        &["--chunks", "2", "--gen-prompts", "0", "--kernels", "cpu"],
    );
    assert_eq!(code, 0, "{r}");
    let c = check(&r, "kernels", "cpu-emulation");
    assert_eq!(c["status"], "pass", "{c}");
    // Every TQ3_1S tensor of the file, 8 rows each (32 values per block).
    let f = tq::gguf::GgufFile::open(&t.tq3).unwrap();
    let tqs: Vec<_> = f
        .tensors
        .iter()
        .filter(|t| t.ty.name() == "tq3_1s")
        .collect();
    let n = tqs.len();
    assert!(n >= 14, "{n}");
    let blocks: u64 = tqs.iter().map(|t| 8 * t.row_len() / 32).sum();
    let d = c["detail"].as_str().unwrap();
    let want = format!("{n} tensors, {blocks} blocks");
    assert!(
        d.contains(&want) && d.contains("dequantize bit-exact"),
        "{d} / {want}"
    );
    // No TQ tensor: skipped with the reason.
    let (_, r) = t.json(
        &t.q8,
        &["--chunks", "2", "--gen-prompts", "0", "--kernels", "cpu"],
    );
    assert_eq!(check(&r, "kernels", "cpu-emulation")["status"], "skipped");
    let (code, _, err) = t.validate(&t.q8, &["--kernels", "opencl"]);
    assert_eq!(code, 2);
    one_line_error(&err, "--kernels opencl");
}

#[test]
fn saved_reference_logits_work_and_skip_the_hash_check() {
    let t = setup();
    let logits = t.dir.join("ref.logits");
    let (code, _, err) = tq(&[
        "eval",
        s(&t.model),
        "--tokens",
        s(&t.tokens),
        "--ctx",
        "16",
        "--chunks",
        "6",
        "--save-logits",
        s(&logits),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    let run = |reference: &[&str]| {
        let mut a = vec![
            "validate",
            s(&t.tq3),
            "--tokens",
            s(&t.tokens),
            "--ctx",
            "16",
            "--chunks",
            "6",
            "--json",
            "-q",
        ];
        a.extend_from_slice(reference);
        let (code, out, err) = tq(&a);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let from_file = run(&["--ref-logits", s(&logits)]);
    let side_by_side = run(&["--ref", s(&t.model), "--gen-prompts", "0"]);
    assert_eq!(from_file["reference"]["kind"], "logits");
    assert_eq!(
        check(&from_file, "structure", "reference")["status"],
        "skipped"
    );
    // The same windows and reference distributions: the same KLD.
    assert_eq!(from_file["quality"]["kld"], side_by_side["quality"]["kld"]);
    assert_eq!(from_file["quality"]["windows"], 6);
}

/// `--prompts FILE`: one prompt per non-empty line replaces the slices of the text; a file with no
/// prompt is a one-line bad-input error naming it.
#[test]
fn prompts_file_sets_the_generation_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tok.gguf");
    std::fs::write(
        &model,
        fixtures::gguf_gen::tiny_llama_with_tokenizer().bytes,
    )
    .unwrap();
    let art = dir.path().join("tok-q8.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&model),
        "--weights",
        "q8_0",
        "-q",
        "-o",
        s(&art),
    ]);
    assert_eq!(code, 0, "{err}");
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(&prompts, "the cat sat\n\nhe said that it was\n").unwrap();
    let args = [
        "validate",
        s(&art),
        "--ref",
        s(&model),
        "--prompts",
        s(&prompts),
        "--gen-tokens",
        "6",
        "--min-gen-agreement",
        "0",
        "--kernels",
        "none",
        "--json",
        "-q",
    ];
    let (code, out, err) = tq(&args);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let g = r["generation"]
        .as_array()
        .unwrap_or_else(|| panic!("no generation in {r}"));
    assert_eq!(g.len(), 2, "{r}");
    assert_eq!(check(&r, "generation", "agreement")["status"], "pass");
    std::fs::write(&prompts, "\n   \n").unwrap();
    let (code, _, err) = tq(&args);
    assert_eq!(code, 2, "{err}");
    one_line_error(&err, "no prompts");
    assert!(err.contains("prompts.txt"), "{err}");
}

/// The generation gate can fail with its default settings (no `--min-gen-agreement`, 3 prompts of
/// 16 tokens, 24 generated): a copy of the real SmolLM2's q8_0 conversion whose blocks write
/// nothing back into the residual stream (every `attn_output` and `ffn_down` zeroed, written with
/// tq's own GGUF writer; provenance kept, so the reference check still passes) predicts from the
/// current token's embedding alone and loops; `tq validate` fails it (exit 3) on
/// `generation/degenerate` and on nothing else, while the good q8_0 file passes with the same flags.
#[test]
fn generation_gate_fails_a_looping_model_with_default_thresholds() {
    let Some(smol) = fixtures::smollm2() else {
        return;
    };
    let Some(text) = fixtures::botchan() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("smol-q8_0.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&smol),
        "--weights",
        "q8_0",
        "-q",
        "-o",
        s(&good),
    ]);
    assert_eq!(code, 0, "{err}");
    let bad = dir.path().join("smol-q8_0-looping.gguf");
    {
        use tq::gguf::{GgufFile, GgufWriter, TensorSpec};
        let f = GgufFile::open(&good).unwrap();
        let specs: Vec<TensorSpec> = f.tensors.iter().map(|t| t.spec()).collect();
        let mut w = GgufWriter::create(&bad, f.version, &f.metadata, &specs).unwrap();
        let mut zeroed = 0;
        for t in &f.tensors {
            if t.name.ends_with(".attn_output.weight") || t.name.ends_with(".ffn_down.weight") {
                w.write_data(&vec![0u8; t.size as usize]).unwrap();
                zeroed += 1;
            } else {
                w.write_data(f.tensor_data(t)).unwrap();
            }
        }
        w.finish().unwrap();
        assert_eq!(zeroed, 60, "30 blocks x 2 tensors");
    }
    let run = |art: &Path| {
        let (code, out, err) = tq(&[
            "validate",
            s(art),
            "--ref",
            s(&smol),
            "--text",
            s(&text),
            "--ctx",
            "128",
            "--chunks",
            "1",
            "--kernels",
            "none",
            "--json",
            "-q",
        ]);
        let r: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("exit {code}: {e}: {err}"));
        (code, r)
    };
    let (code, r) = run(&good);
    assert_eq!(code, 0, "{r}");
    assert_eq!(check(&r, "generation", "degenerate")["status"], "pass");
    let (code, r) = run(&bad);
    assert_eq!(code, 3, "{r}");
    let d = check(&r, "generation", "degenerate");
    assert_eq!(d["status"], "fail", "{d}");
    assert!(d["detail"].as_str().unwrap().contains("loop"), "{d}");
    let failed: Vec<String> = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| format!("{}/{}", c["group"], c["name"]))
        .collect();
    assert_eq!(failed, vec!["\"generation\"/\"degenerate\""], "{r}");
    // Every prompt loops; the reference's own continuations do not.
    for p in r["generation"].as_array().unwrap() {
        let flags = p["artifact_flags"].as_array().unwrap();
        assert!(flags.iter().any(|f| f == "loop"), "{p}");
        assert!(p["reference_flags"].as_array().unwrap().is_empty(), "{p}");
    }
}
