//! The random-weight architecture fixtures of issue 14 (`fixtures/arch_gen.rs`: gemma2, gemma3,
//! phi3, qwen3moe, Mixtral and Mixtral with tied experts) against what upstream llama.cpp computed
//! on them (`fixtures/arch/`, recorded by `scripts/dev/record-arch-fixtures.sh`): the generator
//! still makes the recorded bytes, the recorded distributions are sound and tokenized as tq
//! tokenizes, and `tq eval --ref-logits` matches llama.cpp (KLD ≤ 1e-4, PPL within 0.1%) on
//! every architecture it runs.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::arch_gen::{arch_fixture, synthetic_text, ARCH_FIXTURES};
use fixtures::{s, tq};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use tq::eval::logits_file::Reader;
use tq::gguf::GgufFile;
use tq::tokenizer::Tokenizer;

/// Mean KLD (nats) and relative PPL difference allowed between tq and llama.cpp (issue 14).
const MAX_KLD: f64 = 1e-4;
const MAX_PPL_REL: f64 = 1e-3;

fn arch_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/arch")
}

fn recorded() -> serde_json::Value {
    let p = arch_dir().join("llama.json");
    let t = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Fixture `name` written to `dir/<name>.gguf`.
fn write_fixture(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(format!("{name}.gguf"));
    std::fs::write(&p, arch_fixture(name).unwrap()).unwrap();
    p
}

#[test]
fn generator_reproduces_the_recorded_fixtures() {
    let j = recorded();
    let mut names: Vec<&str> = j["fixtures"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    names.sort();
    let mut want = ARCH_FIXTURES.to_vec();
    want.sort();
    assert_eq!(
        names, want,
        "fixtures/arch/llama.json records other fixtures than ARCH_FIXTURES"
    );
    for n in ARCH_FIXTURES {
        let got = sha256_hex(&arch_fixture(n).unwrap());
        assert_eq!(
            got, j["fixtures"][n]["gguf_sha256"],
            "{n}: the generator's bytes changed; re-record with scripts/dev/record-arch-fixtures.sh"
        );
        assert!(arch_dir().join(format!("{n}.kld")).exists(), "{n}.kld");
    }
    assert_eq!(
        sha256_hex(synthetic_text().as_bytes()),
        j["text_sha256"],
        "synthetic_text changed; re-record with scripts/dev/record-arch-fixtures.sh"
    );
    assert!(arch_fixture("gemma4").is_none());
}

/// Every recorded file parses with tq's reader, holds distributions (the top log-probability
/// lies in [-ln V, 0]) whose PPL on the text's tokens is llama.cpp's recorded PPL, over the tokens
/// tq's tokenizer makes of the text; gemma2's final soft-cap (3) bounds every row's log-prob
/// spread by 6 and reaches it.
#[test]
fn recorded_distributions_are_sound_and_tokenized_as_tq_does() {
    let j = recorded();
    let dir = tempfile::tempdir().unwrap();
    let text = synthetic_text();
    for n in ARCH_FIXTURES {
        let rec = &j["fixtures"][n];
        let (ctx, chunks) = (
            rec["ctx"].as_u64().unwrap() as usize,
            rec["chunks"].as_u64().unwrap() as usize,
        );
        let model = write_fixture(dir.path(), n);
        let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
        let ids = tok.encode(&text, true);

        let mut r = Reader::open(&arch_dir().join(format!("{n}.kld")))
            .unwrap_or_else(|e| panic!("{n}.kld: {e}"));
        let h = r.header.clone();
        assert_eq!(
            (h.n_ctx, h.n_chunk, h.n_vocab),
            (ctx, chunks, tok.n_vocab()),
            "{n}"
        );
        assert!(ids.len() >= ctx * chunks, "{n}: text too short");
        assert!(
            h.tokens == ids[..ctx * chunks],
            "{n}: llama.cpp tokenized the text differently from tq"
        );
        let (mut nll, mut count, mut max_spread) = (0f64, 0usize, 0f32);
        let ln_v = (h.n_vocab as f32).ln();
        for c in 0..chunks {
            for i in h.first..ctx - 1 {
                let row = r.next_row().unwrap_or_else(|e| panic!("{n}: {e}"));
                let spread = row.scale * 65535.0;
                let top = row.scale * *row.q.iter().max().unwrap() as f32 + row.min_log_prob;
                assert!(
                    spread.is_finite() && spread > 0.0 && (-ln_v - 1e-3..=1e-3).contains(&top),
                    "{n}: chunk {c} position {i}: spread {spread}, top log-prob {top}"
                );
                max_spread = max_spread.max(spread);
                if n == &"gemma2" {
                    assert!(
                        spread <= 6.0 + 1e-3,
                        "gemma2: spread {spread} beyond 2 x cap"
                    );
                }
                let next = h.tokens[c * ctx + i + 1] as usize;
                nll -= (row.scale * row.q[next] as f32 + row.min_log_prob) as f64;
                count += 1;
            }
        }
        assert!(r.next_row().is_err(), "{n}: rows beyond {chunks} chunks");
        if n == &"gemma2" {
            assert!(
                max_spread > 5.5,
                "gemma2: the final soft-cap never bites ({max_spread})"
            );
        }
        let ppl = (nll / count as f64).exp();
        let want = rec["ppl"].as_f64().unwrap();
        assert!(
            (ppl / want - 1.0).abs() < 1e-3,
            "{n}: PPL {ppl} from the recorded rows vs llama.cpp's {want}"
        );
    }
}

/// `tq eval FIXTURE --ref-logits <llama.cpp's file> --json`: (PPL, mean KLD), or the one-line
/// error when it fails.
fn tq_against_llama(dir: &Path, name: &str) -> Result<(f64, f64), String> {
    let model = write_fixture(dir, name);
    let kld = arch_dir().join(format!("{name}.kld"));
    let (code, out, err) = tq(&["eval", s(&model), "--ref-logits", s(&kld), "--json", "-q"]);
    if code != 0 {
        assert_eq!(code, 2, "{name}: exit {code} (a panic?): {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
        assert!(err.contains(&format!("{name}.gguf")), "{name}: {err}");
        return Err(err);
    }
    let r = serde_json::from_str::<serde_json::Value>(&out).unwrap()["result"].clone();
    Ok((
        r["ppl"]["value"].as_f64().unwrap(),
        r["kld"]["kld"]["value"].as_f64().unwrap(),
    ))
}

fn assert_matches_llama(name: &str, ppl: f64, kld: f64) {
    let want = recorded()["fixtures"][name]["ppl"].as_f64().unwrap();
    eprintln!("{name}: tq PPL {ppl:.4} vs llama.cpp {want:.4}, mean KLD {kld:.3e}");
    assert!(
        kld <= MAX_KLD,
        "{name}: mean KLD {kld} against llama.cpp > {MAX_KLD}"
    );
    assert!(
        (ppl / want - 1.0).abs() <= MAX_PPL_REL,
        "{name}: PPL {ppl} vs llama.cpp {want}"
    );
}

/// tq's runtime against llama.cpp on every architecture: mean KLD ≤ 1e-4 and PPL within 0.1%.
#[test]
fn tq_eval_matches_llama_on_every_architecture() {
    let dir = tempfile::tempdir().unwrap();
    for n in ARCH_FIXTURES {
        let (ppl, kld) = tq_against_llama(dir.path(), n).unwrap_or_else(|e| panic!("{n}: {e}"));
        assert_matches_llama(n, ppl, kld);
    }
}

/// An architecture the runtime does not know is one line naming the file and the supported
/// ones, exit 2.
#[test]
fn unknown_architecture_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = arch_fixture("gemma2").unwrap();
    // Same length: "gemma2" -> "gemmaX" in general.architecture (and its keys' prefix).
    let pat = b"gemma2";
    let mut i = 0;
    while i + pat.len() <= b.len() {
        if &b[i..i + pat.len()] == pat {
            b[i + 5] = b'X';
        }
        i += 1;
    }
    let p = dir.path().join("odd.gguf");
    std::fs::write(&p, &b).unwrap();
    let kld = arch_dir().join("gemma2.kld");
    let (code, _, err) = tq(&["eval", s(&p), "--ref-logits", s(&kld), "-q"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("odd.gguf")
            && err.contains("'gemmaX' is not supported")
            && err.contains("qwen3moe"),
        "{err}"
    );
}

/// The layout the architectures are about, read back with tq's GGUF reader: tied embeddings on
/// gemma, fused tensors on phi3, 3-D experts, and in `mixtral-ties` the routers of layers 1
/// and 3 with all rows identical (every expert tied) while every expert's weights differ.
#[test]
fn fixtures_have_the_intended_layout() {
    let dir = tempfile::tempdir().unwrap();
    let open = |n: &str| GgufFile::open(write_fixture(dir.path(), n)).unwrap();
    let dims = |f: &GgufFile, t: &str| f.tensor(t).unwrap_or_else(|| panic!("{t}")).dims.clone();
    for n in ["gemma2", "gemma3"] {
        let f = open(n);
        assert!(f.tensor("output.weight").is_none(), "{n}: tied embeddings");
        assert_eq!(
            dims(&f, "blk.0.attn_q.weight"),
            [96, 128],
            "{n}: head dim 32 x 4 != 96"
        );
        assert_eq!(
            f.get_u64(&format!("{n}.attention.sliding_window")),
            Some(16)
        );
    }
    let f = open("phi3");
    assert_eq!(dims(&f, "blk.0.attn_qkv.weight"), [96, 96 + 2 * 32]);
    assert_eq!(dims(&f, "blk.0.ffn_up.weight"), [96, 2 * 192]);
    assert!(
        f.tensor("blk.0.ffn_gate.weight").is_none() && f.tensor("blk.0.attn_q.weight").is_none()
    );
    assert_eq!(dims(&f, "rope_factors_long.weight"), [6]);
    let f = open("qwen3moe");
    assert_eq!(dims(&f, "blk.3.ffn_down_exps.weight"), [48, 64, 8]);
    for (n, n_exp, tied) in [("mixtral", 8usize, false), ("mixtral-ties", 6, true)] {
        let f = open(n);
        assert_eq!(f.architecture(), Some("llama"));
        for l in 0..4 {
            for t in [
                "ffn_gate_inp",
                "ffn_gate_exps",
                "ffn_up_exps",
                "ffn_down_exps",
            ] {
                let ti = f.tensor(&format!("blk.{l}.{t}.weight")).unwrap();
                assert_eq!(*ti.dims.last().unwrap() as usize, n_exp, "{n} {t}");
                let data = f.tensor_data(ti);
                let per = data.len() / n_exp;
                let e = |i: usize| &data[i * per..(i + 1) * per];
                // Only the routers of mixtral-ties' odd layers have identical rows.
                let same = tied && l % 2 == 1 && t == "ffn_gate_inp";
                for i in 1..n_exp {
                    assert_eq!(e(i) == e(0), same, "{n} layer {l} {t}: expert {i} vs 0");
                }
            }
        }
    }
}

/// Calibration end to end on an MoE and a Gemma fixture: `tq convert --calib TEXT` (per-expert
/// Hessians for the experts) against round-to-nearest at the same bytes, both measured against
/// llama.cpp's F16 distributions. Calibrated on the second half of the synthetic text; the
/// evaluation windows are its first 768 tokens.
#[test]
fn calibrated_ldlq_beats_round_to_nearest_on_moe_and_gemma() {
    let dir = tempfile::tempdir().unwrap();
    let text = synthetic_text();
    let calib = dir.path().join("calib.txt");
    std::fs::write(&calib, &text[text.len() / 2..]).unwrap();
    for (n, w) in [
        ("qwen3moe", "q4_0"),
        ("mixtral", "q4_0"),
        ("gemma2", "q4_0"),
        ("phi3", "tq4_1s"),
    ] {
        let model = write_fixture(dir.path(), n);
        let kld = arch_dir().join(format!("{n}.kld"));
        let mut got = vec![];
        for calibrated in [false, true] {
            let out = dir.path().join(format!("{n}-{calibrated}.gguf"));
            let mut args = vec!["convert", s(&model), "--weights", w, "-o", s(&out)];
            if calibrated {
                args.extend(["--calib", s(&calib), "--calib-ctx", "128"]);
            }
            let (code, _, err) = tq(&args);
            assert_eq!(code, 0, "{n}: {err}");
            if calibrated && !n.starts_with("gemma") && n != "phi3" {
                assert!(err.contains("routing: "), "{n}: no routing report: {err}");
            }
            let (code, o, err) = tq(&["eval", s(&out), "--ref-logits", s(&kld), "--json", "-q"]);
            assert_eq!(code, 0, "{n}: {err}");
            let r = serde_json::from_str::<serde_json::Value>(&o).unwrap()["result"].clone();
            got.push(r["kld"]["kld"]["value"].as_f64().unwrap());
            std::fs::remove_file(&out).unwrap();
        }
        eprintln!(
            "{n} {w}: KLD round-to-nearest {:.5}, LDLQ {:.5} ({:.2}x)",
            got[0],
            got[1],
            got[1] / got[0]
        );
        assert!(
            got[1] < 0.85 * got[0],
            "{n}: LDLQ {} vs RTN {}",
            got[1],
            got[0]
        );
    }
}

/// `tq calib` on an MoE model: per-expert Hessians in the file (token counts filled in after
/// each block), killed and resumed byte-identical, `convert --calib FILE` equal to the one-step
/// `convert --calib TEXT`, the imatrix in llama-imatrix's MoE layout, and `--sequential` runs.
#[test]
fn moe_hessian_file_resumes_and_converts_like_the_one_step_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    let model = write_fixture(dir.path(), "qwen3moe");
    let text = synthetic_text();
    std::fs::write(d("calib.txt"), &text[text.len() / 2..]).unwrap();
    let calib = |out: &str, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "calib",
            s(&model),
            "--text",
            s(&d("calib.txt")),
            "--ctx",
            "128",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        a.extend([
            "-o".into(),
            s(&d(out)).into(),
            "--checkpoint-secs".into(),
            "0".into(),
        ]);
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let (code, _, err) = tq(&calib(
        "full.safetensors",
        &["--imatrix-out", s(&d("im.gguf"))],
    ));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("block 3 routing: 8 experts"), "{err}");
    let (code, _, err) = fixtures::tq_env(
        &calib("part.safetensors", &[]),
        &[("TQ_CALIB_ABORT_AFTER", "2")],
    );
    assert_eq!(code, 137, "{err}");
    let (code, _, err) = tq(&calib("part.safetensors", &["--resume"]));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("resuming after 2 of 4 blocks"), "{err}");
    assert_eq!(
        std::fs::read(d("full.safetensors")).unwrap(),
        std::fs::read(d("part.safetensors")).unwrap(),
        "resumed Hessians differ"
    );
    // Every token goes to 2 of 8 experts: the experts' counts sum to twice the dense count.
    let (hs, _) = tq::quant::Hessians::load(&d("full.safetensors")).unwrap();
    for l in 0..4 {
        let dense = hs
            .for_tensor(&format!("blk.{l}.attn_q.weight"))
            .unwrap()
            .tokens;
        let name = format!("blk.{l}.ffn_gate_exps.weight");
        let routed: u64 = (0..8)
            .map(|e| hs.for_expert(&name, e).unwrap().tokens)
            .sum();
        assert_eq!(routed, 2 * dense, "layer {l}");
        let down = format!("blk.{l}.ffn_down_exps.weight");
        assert_eq!(hs.for_expert(&down, 0).unwrap().n, 48);
    }
    // Two steps (file) and one step (text) write the same tensors.
    let conv = |calib: &Path, out: &str, extra: &[&str]| {
        let mut a = vec![
            "convert",
            s(&model),
            "--weights",
            "q4_0",
            "--calib",
            s(calib),
        ];
        a.extend(extra);
        let o = d(out);
        a.extend(["-o", s(&o)]);
        let (code, _, err) = tq(&a);
        assert_eq!(code, 0, "{err}");
        GgufFile::open(o).unwrap()
    };
    let a = conv(&d("full.safetensors"), "a.gguf", &[]);
    let b = conv(&d("calib.txt"), "b.gguf", &["--calib-ctx", "128"]);
    for t in &a.tensors {
        let u = b.tensor(&t.name).unwrap();
        assert!(
            t.ty == u.ty && a.tensor_data(t) == b.tensor_data(u),
            "{}",
            t.name
        );
    }
    // The imatrix: one [n, n_expert] entry per expert tensor, per-expert counts.
    let im = GgufFile::open(d("im.gguf")).unwrap();
    let t = im.tensor("blk.0.ffn_gate_exps.weight.in_sum2").unwrap();
    assert_eq!(t.dims, [64, 8]);
    assert_eq!(
        im.tensor("blk.0.ffn_down_exps.weight.counts").unwrap().dims,
        [1, 8]
    );
    // Sequential calibration runs on MoE too.
    let (code, _, err) = tq(&calib("seq.safetensors", &["--sequential"]));
    assert_eq!(code, 0, "{err}");
}

/// The incremental decoder (greedy generation in `tq validate`, `tq calib --self-generate`)
/// computes the forward pass's logits on every architecture: sliding windows, soft-caps,
/// post-norms, LongRoPE, experts.
#[test]
fn incremental_decoder_matches_the_forward_pass_on_every_architecture() {
    use tq::model::{Model, Numerics};
    let dir = tempfile::tempdir().unwrap();
    for n in ARCH_FIXTURES {
        let f = GgufFile::open(write_fixture(dir.path(), n)).unwrap();
        let model = Model::new(&f, Numerics::F32).unwrap();
        let nv = model.cfg.n_vocab;
        // 40 positions: past the fixtures' 16-token sliding window.
        let (n_win, seq) = (2, 40);
        let toks: Vec<u32> = (0..n_win * seq)
            .map(|i| ((i * 37 + 11) % nv) as u32)
            .collect();
        let want = model.forward(&toks, seq, 0, None).unwrap();
        let dec = tq::model::decode::Decoder::new(&model, seq, usize::MAX).unwrap();
        let mut st = dec.state(n_win);
        let mut worst = 0f32;
        for pos in 0..seq {
            let cur: Vec<u32> = (0..n_win).map(|w| toks[w * seq + pos]).collect();
            let l = dec.step(&mut st, &cur).unwrap();
            for w in 0..n_win {
                let r = w * seq + pos;
                let want = &want[r * nv..(r + 1) * nv];
                let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
                for (a, b) in l[w * nv..(w + 1) * nv].iter().zip(want) {
                    worst = worst.max((a - b).abs() / scale);
                }
            }
        }
        eprintln!("{n}: decoder vs forward max rel err {worst:.2e}");
        assert!(worst < 1e-4, "{n}: decoder vs forward {worst}");
    }
}

/// The calibrated mix on the MoE fixtures: expert tensors are knapsack items (all experts of a
/// tensor share one type, as llama.cpp stores them) priced by the per-expert Hessians (so they
/// join the KLD fit instead of being probed once per candidate), every expert LDLQ'd in the probes
/// and the file, routers stay f32, the file is within the budget, and it beats the uncalibrated
/// mix at the same budget on llama.cpp's F16 distributions.
#[test]
fn mix_on_moe_fixtures() {
    let dir = tempfile::tempdir().unwrap();
    let text = synthetic_text();
    let calib = dir.path().join("calib.txt");
    std::fs::write(&calib, &text[text.len() / 2..]).unwrap();
    // The mix measures its plans on text held out from both the calibration (second half) and
    // the evaluation (the first 768 tokens): measured on the calibration text, LDLQ's fit to it
    // flatters the plans.
    let cut = |i: usize| (i..).find(|&j| text.is_char_boundary(j)).unwrap();
    let held = dir.path().join("held.txt");
    std::fs::write(&held, &text[cut(text.len() / 4)..cut(text.len() / 2)]).unwrap();
    for n in ["qwen3moe", "mixtral"] {
        let model = write_fixture(dir.path(), n);
        let mut kld = vec![];
        for calibrated in [true, false] {
            let out = dir.path().join(format!("{n}-{calibrated}.gguf"));
            let mut args = vec![
                "convert",
                s(&model),
                "--target",
                "upstream",
                "--target-bpw",
                "9",
                "--json",
                "-o",
                s(&out),
            ];
            if calibrated {
                args.extend(["--calib", s(&calib), "--calib-ctx", "128"]);
                args.extend(["--kld-text", s(&held)]);
            }
            let (code, o, err) = tq(&args);
            assert_eq!(code, 0, "{n}: {err}");
            assert!(!err.contains("experts saw fewer"), "{n}: {err}");
            let j: serde_json::Value = serde_json::from_str(&o).unwrap();
            let m = &j["mix"];
            assert!(
                m["file_bytes"].as_u64() <= m["target_bytes"].as_u64(),
                "{n}: {m}"
            );
            let f = GgufFile::open(&out).unwrap();
            let mut quantized_experts = 0;
            for t in &f.tensors {
                if t.name.contains("ffn_gate_inp") {
                    assert_eq!(t.ty.name(), "f32", "{n}: router {}", t.name);
                }
                if t.name.contains("_exps") && t.ty.name() != "f16" {
                    quantized_experts += 1;
                }
            }
            assert!(quantized_experts > 0, "{n}: no expert tensor quantized");
            if calibrated {
                assert!(
                    m["weighting"].as_str().unwrap().starts_with("hessian"),
                    "{m}"
                );
                // Experts are priced by their Hessians, not probed once per candidate.
                for d in m["direct"].as_array().unwrap() {
                    let t = d["tensor"].as_str().unwrap();
                    assert!(!t.contains("_exps"), "{n}: {t} measured directly");
                }
            }
            let kld_ref = arch_dir().join(format!("{n}.kld"));
            let (code, o, err) =
                tq(&["eval", s(&out), "--ref-logits", s(&kld_ref), "--json", "-q"]);
            assert_eq!(code, 0, "{n}: {err}");
            let r = serde_json::from_str::<serde_json::Value>(&o).unwrap()["result"].clone();
            kld.push(r["kld"]["kld"]["value"].as_f64().unwrap());
        }
        eprintln!(
            "{n}: KLD calibrated mix {:.5}, plain mix {:.5}",
            kld[0], kld[1]
        );
        assert!(
            kld[0] < kld[1],
            "{n}: calibrated {} vs plain {}",
            kld[0],
            kld[1]
        );
    }
}

/// One factor per expert Hessian (issue 32, item 2): `ffn_gate_exps` and `ffn_up_exps` read the
/// same per-expert Hessians, so each expert's is factored once for both. Oracle: each tensor
/// converted with the other left in F16 (so nothing is shared) must give the same bytes, and the
/// factorizations counted by `TQ_LDLQ_PROF=1` must be the same with one or both tensors
/// calibrated (without sharing, both would add one per calibrated gate|up expert).
#[test]
fn expert_tensors_sharing_a_hessian_share_its_factor() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    let model = write_fixture(dir.path(), "qwen3moe");
    let text = synthetic_text();
    std::fs::write(d("calib.txt"), &text[text.len() / 2..]).unwrap();
    let h = d("h.safetensors");
    let (code, _, err) = tq(&[
        "calib",
        s(&model),
        "--text",
        s(&d("calib.txt")),
        "--ctx",
        "128",
        "-o",
        s(&h),
    ]);
    assert_eq!(code, 0, "{err}");
    // The gate|up expert groups that LDLQ reads (at least MIN_EXPERT_TOKENS = 32 tokens): what
    // sharing saves.
    let (hs, _) = tq::quant::Hessians::load(&h).unwrap();
    let shared = hs
        .groups
        .values()
        .filter(|g| g.tensors.len() == 2 && g.tensors[0].contains("_exps.weight#"))
        .filter(|g| g.tokens >= 32)
        .count();
    assert!(shared >= 8, "only {shared} gate|up experts calibrated");
    for ty in ["q4_0", "tq4_1s"] {
        let conv = |out: &str, extra: &[&str]| -> (GgufFile, u64) {
            let o = d(&format!("{ty}-{out}.gguf"));
            let mut a = vec!["convert", s(&model), "--weights", ty, "--calib", s(&h)];
            a.extend(extra);
            a.extend(["--no-provenance", "-o", s(&o)]);
            let (code, _, err) = fixtures::tq_env(&a, &[("TQ_LDLQ_PROF", "1")]);
            assert_eq!(code, 0, "{ty}: {err}");
            let n = err
                .lines()
                .find_map(|l| l.split_once("; factors "))
                .and_then(|(_, n)| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("{ty}: no factor count in: {err}"));
            (GgufFile::open(o).unwrap(), n)
        };
        let (both, n_both) = conv("both", &[]);
        let (gate, n_gate) = conv("gate", &["--tensor-type", "ffn_up_exps=f16"]);
        let (up, n_up) = conv("up", &["--tensor-type", "ffn_gate_exps=f16"]);
        assert_eq!((n_both, n_both), (n_gate, n_up), "{ty}: factorizations");
        let mut checked = 0;
        for t in &both.tensors {
            let other = match () {
                _ if t.name.contains("ffn_up_exps") => &up,
                _ => &gate,
            };
            let u = other.tensor(&t.name).unwrap();
            assert_eq!(t.ty, u.ty, "{ty}: {}", t.name);
            assert!(
                both.tensor_data(t) == other.tensor_data(u),
                "{ty}: {} differs from its conversion without sharing",
                t.name
            );
            checked += t.name.contains("ffn_up_exps") as usize;
        }
        assert_eq!(checked, 4, "{ty}");
    }
}
