//! `tq calib` + `tq convert --calib`: Hessians from the layer-streaming runtime, checkpoint/resume
//! equality, and LDLQ output that the stock decoder reads, with lower calibration-weighted error
//! than round-to-nearest at identical size.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use std::path::Path;
use tq::types::TensorType;

fn setup(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let fx = fixtures::gguf_gen::tiny_llama(2, 64, 128, 96);
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, &fx.bytes).unwrap();
    // Pseudo-text: a token stream with structure (repeats), so activations are correlated.
    let ids: Vec<String> = (0..400u32)
        .map(|i| ((i * i + 7 * (i / 5)) % 96).to_string())
        .collect();
    let toks = dir.join("tokens.txt");
    std::fs::write(&toks, ids.join(" ")).unwrap();
    (model, toks)
}

#[test]
fn calib_resume_equals_uninterrupted() {
    let dir = tempfile::tempdir().unwrap();
    let (model, toks) = setup(dir.path());
    let full = dir.path().join("full.safetensors");
    let args = |o: &Path| calib_args(&model, &toks, o, &[]);
    let run = |a: Vec<String>, abort_after: Option<&str>| {
        run_tq(&a, abort_after.map(|v| ("TQ_CALIB_ABORT_AFTER", v)))
    };
    let (code, err) = run(args(&full), None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("block 2/2"), "{err}");
    // Killed (no cleanup, as kill -9) after block 1 of 2, then resumed.
    let part = dir.path().join("part.safetensors");
    let partial = dir.path().join(".part.safetensors.tq-partial");
    let (code, err) = run(args(&part), Some("1"));
    assert_eq!(code, 137, "{err}");
    assert!(err.contains("--resume"), "{err}");
    assert!(!part.exists() && partial.exists());
    let mut a = args(&part);
    a.push("--resume".into());
    let (code, err) = run(a, None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("resuming after 1 of 2 blocks"), "{err}");
    assert!(!partial.exists());
    assert_eq!(
        std::fs::read(&full).unwrap(),
        std::fs::read(&part).unwrap(),
        "resumed Hessians differ"
    );
    let (hs, meta) = tq::quant::Hessians::load(&full).unwrap();
    assert_eq!(meta["tq.complete"], "true");
    // q/k/v share one Hessian, gate/up another; attn_output and ffn_down their own: 4 per layer.
    assert_eq!(hs.groups.len(), 8);
    let qkv = hs.for_tensor("blk.1.attn_k.weight").unwrap();
    assert!(qkv.tensors.iter().any(|t| t == "blk.1.attn_q.weight"));
    assert_eq!(qkv.n, 64);
    assert_eq!(qkv.tokens, 256);
    assert_eq!(hs.for_tensor("blk.0.ffn_down.weight").unwrap().n, 128);
    // A resume against another configuration is refused, and leaves the partial file.
    let (code, err) = run(args(&part), Some("1"));
    assert_eq!(code, 137, "{err}");
    let mut a = args(&part);
    a[7] = "16".into();
    a.push("--resume".into());
    let (code, err) = run(a, None);
    assert_eq!(code, 2);
    assert!(err.contains("checkpoint is for another"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // So does another store; the same command finishes it.
    let (code, err) = run(
        calib_args(&model, &toks, &part, &["--store", "f32", "--resume"]),
        None,
    );
    assert_eq!(code, 2, "{err}");
    let (code, err) = run(calib_args(&model, &toks, &part, &["--resume"]), None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&full).unwrap(), std::fs::read(&part).unwrap());
}

/// `--store f32` / `f32-upper` keep every matrix to f32 precision (upper: mirrored), a half /
/// a quarter of the bytes, and `--imatrix-out` writes the same diagonals from any store.
#[test]
fn hessian_stores_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (model, toks) = setup(dir.path());
    let p = |n: &str| dir.path().join(n);
    let (code, err) = run_tq(&calib_args(&model, &toks, &p("f64.safetensors"), &[]), None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("tq calib: wrote"), "{err}");
    // -q: the same file, nothing on stderr.
    let quiet = p("quiet.safetensors");
    let (code, err) = run_tq(&calib_args(&model, &toks, &quiet, &["-q"]), None);
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(
        std::fs::read(&quiet).unwrap(),
        std::fs::read(p("f64.safetensors")).unwrap()
    );
    let (exact, _) = tq::quant::Hessians::load(&p("f64.safetensors")).unwrap();
    let data: u64 = exact.groups.values().map(|g| (g.n * g.n * 8) as u64).sum();
    for (store, bytes) in [("f32", data / 2), ("f32-upper", 0)] {
        let out = p(&format!("{store}.safetensors"));
        let (code, err) = run_tq(&calib_args(&model, &toks, &out, &["--store", store]), None);
        assert_eq!(code, 0, "{err}");
        let (file, meta) = tq::quant::HessianFile::open(&out).unwrap();
        assert_eq!(meta["tq.hessian_store"], store);
        let len = std::fs::metadata(&out).unwrap().len();
        let upper: u64 = exact
            .groups
            .values()
            .map(|g| (g.n * (g.n + 1) / 2 * 4) as u64)
            .sum();
        let want = if bytes == 0 { upper } else { bytes };
        assert!(
            len > want && len < want + 4096,
            "{store}: {len} bytes vs {want} of data"
        );
        for (k, g) in &exact.groups {
            let h = file.load_group(k).unwrap();
            assert_eq!((h.n, h.tokens), (g.n, g.tokens));
            for i in 0..g.n {
                for j in 0..g.n {
                    // f32 rounding of the f64 sum; the upper store mirrors (i, j) for i > j.
                    let v = g.h[i.min(j) * g.n + i.max(j)] as f32 as f64;
                    let v = if store == "f32" {
                        g.h[i * g.n + j] as f32 as f64
                    } else {
                        v
                    };
                    assert_eq!(
                        h.h[i * g.n + j].to_bits(),
                        v.to_bits(),
                        "{store} {k} ({i},{j})"
                    );
                }
            }
        }
    }
}

/// An incomplete Hessian file (`tq.complete = "false"`: a window-major checkpoint of tq before
/// 0.x streamed block by block, or a hand-made file) is refused by `convert --calib`, naming how
/// many windows it holds and how to finish it, unless --allow-partial-calib is given.
#[test]
fn convert_refuses_an_interrupted_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (model, toks) = setup(dir.path());
    let full = dir.path().join("full.safetensors");
    let (code, err) = run_tq(&calib_args(&model, &toks, &full, &[]), None);
    assert_eq!(code, 0, "{err}");
    let (hs, mut meta) = tq::quant::Hessians::load(&full).unwrap();
    meta.insert("tq.complete".into(), "false".into());
    meta.insert("tq.windows_done".into(), "2".into());
    let part = dir.path().join("part.safetensors");
    hs.save(&part, &meta, tq::quant::Store::F64).unwrap();
    let out = dir.path().join("out.gguf");
    let conv = |extra: &[&str]| {
        let mut a = vec![
            "convert",
            s(&model),
            "--weights",
            "tq4_1s",
            "--calib",
            s(&part),
            "-q",
            "-o",
            s(&out),
        ];
        a.extend(extra);
        tq(&a)
    };
    let (code, _, err) = conv(&[]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("part.safetensors")
            && err.contains("2 of 8 windows")
            && err.contains("--resume")
            && err.contains("--allow-partial-calib"),
        "{err}"
    );
    assert!(!out.exists());
    let (code, _, err) = conv(&["--allow-partial-calib"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.exists());
}

#[test]
fn convert_with_ldlq_beats_rtn_at_identical_size() {
    let dir = tempfile::tempdir().unwrap();
    let (model, toks) = setup(dir.path());
    let h = dir.path().join("h.safetensors");
    let (code, _, err) = tq(&[
        "calib",
        s(&model),
        "--token-file",
        s(&toks),
        "--tokens",
        "384",
        "--ctx",
        "32",
        "-o",
        s(&h),
    ]);
    assert_eq!(code, 0, "{err}");
    let rtn = dir.path().join("rtn.gguf");
    let ldlq = dir.path().join("ldlq.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&model),
        "--weights",
        "tq4_1s",
        "-q",
        "-o",
        s(&rtn),
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = tq(&[
        "convert",
        s(&model),
        "--weights",
        "tq4_1s",
        "--calib",
        s(&h),
        "-q",
        "-o",
        s(&ldlq),
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = tq(&[
        "convert",
        s(&model),
        "--weights",
        "tq4_1s",
        "--calib",
        s(&h),
        "--threads",
        "1",
        "-q",
        "-o",
        s(&dir.path().join("l1.gguf")),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read(&ldlq).unwrap(),
        std::fs::read(dir.path().join("l1.gguf")).unwrap(),
        "thread count changed the bytes"
    );
    let src = tq::gguf::GgufFile::open(&model).unwrap();
    let fr = tq::gguf::GgufFile::open(&rtn).unwrap();
    let fl = tq::gguf::GgufFile::open(&ldlq).unwrap();
    let (hs, _) = tq::quant::Hessians::load(&h).unwrap();
    let methods = fl
        .get("tq.tensor_methods")
        .unwrap()
        .as_array()
        .unwrap()
        .len();
    assert_eq!(methods, src.tensors.len());
    let (mut n_ldlq, mut better) = (0, 0);
    let (mut sum_r, mut sum_l) = (0f64, 0f64);
    for t in &fl.tensors {
        let tr = fr.tensor(&t.name).unwrap();
        assert_eq!(
            (t.ty, t.size),
            (tr.ty, tr.size),
            "{}: same type and bytes as RTN",
            t.name
        );
        if t.ty != TensorType::TQ4_1S {
            continue;
        }
        let Some(hg) = hs.for_tensor(&t.name) else {
            continue;
        };
        n_ldlq += 1;
        let w = src.tensor_f32(src.tensor(&t.name).unwrap()).unwrap();
        let ql = fl.tensor_f32(t).unwrap();
        let qr = fr.tensor_f32(tr).unwrap();
        let (ll, lr) = (
            tq::quant::ldlq::proxy_loss(&hg.h, hg.n, &w, &ql),
            tq::quant::ldlq::proxy_loss(&hg.h, hg.n, &w, &qr),
        );
        eprintln!("{}: H-weighted error rtn {lr:.5} ldlq {ll:.5}", t.name);
        sum_r += lr;
        sum_l += ll;
        if ll < lr {
            better += 1;
        }
    }
    assert_eq!(
        n_ldlq, 14,
        "7 TQ tensors per layer x 2 layers have Hessians"
    );
    assert!(better >= 12, "LDLQ better on {better} of {n_ldlq} tensors");
    assert!(sum_l < 0.9 * sum_r, "LDLQ {sum_l} vs RTN {sum_r}");
}

// ---------------------------------------------------------------------------------------------
// Sequential (GPTQ-style) calibration

fn calib_args(model: &Path, toks: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "calib",
        s(model),
        "--token-file",
        s(toks),
        "--tokens",
        "256",
        "--ctx",
        "32",
        "--batch",
        "2",
        "-o",
        s(out),
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    v.extend(extra.iter().map(|x| x.to_string()));
    v
}

/// `tq` with at most one environment variable; (exit code, stderr).
fn run_tq(args: &[String], env: Option<(&str, &str)>) -> (i32, String) {
    let (code, _, err) = fixtures::tq_env(args, env.as_slice());
    (code, err)
}

/// ‖a − b‖_F / ‖b‖_F.
fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

#[test]
fn sequential_hessians_follow_the_quantized_model() {
    let dir = tempfile::tempdir().unwrap();
    let (model, toks) = setup(dir.path());
    let hb = dir.path().join("batched.safetensors");
    let hs_path = dir.path().join("seq.safetensors");
    let hf = dir.path().join("seq-f32.safetensors");
    let (code, err) = run_tq(&calib_args(&model, &toks, &hb, &[]), None);
    assert_eq!(code, 0, "{err}");
    let (code, err) = run_tq(
        &calib_args(
            &model,
            &toks,
            &hs_path,
            &["--sequential", "--weights", "tq4_1s"],
        ),
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("14 tensors quantized with LDLQ"), "{err}");
    // Simulating f32 weights (the plan copies every tensor) is the batched calibration again.
    let (code, err) = run_tq(
        &calib_args(&model, &toks, &hf, &["--sequential", "--weights", "f32"]),
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("0 tensors quantized with LDLQ, 0 round-to-nearest, 14 kept"),
        "{err}"
    );

    let (b, _) = tq::quant::Hessians::load(&hb).unwrap();
    let (sq, meta) = tq::quant::Hessians::load(&hs_path).unwrap();
    let (sf, _) = tq::quant::Hessians::load(&hf).unwrap();
    assert_eq!(meta["tq.sequential"], "true");
    assert_eq!(meta["tq.weights"], "tq4_1s");
    assert_eq!(meta["tq.recipe"], "pure");
    assert_eq!(meta["tq.complete"], "true");
    assert!(meta["tq.tensor_types"].contains("blk.1.ffn_down.weight=tq4_1s"));
    assert_eq!(sq.groups.len(), 8);
    for (k, g) in &b.groups {
        let s_ = &sq.groups[k];
        assert_eq!(s_.tokens, g.tokens, "{k}");
        let d = rel_diff(&s_.h, &g.h);
        let df = rel_diff(&sf.groups[k].h, &g.h);
        eprintln!("{k}: sequential vs batched {d:.3e} (f32 simulation {df:.3e})");
        assert!(df < 1e-5, "{k}: identity quantization changed H by {df}");
        if k.starts_with("blk.0.attn_q.weight") {
            // Layer 0's q/k/v input is the embedding: nothing before it is quantized.
            assert_eq!(
                s_.h, g.h,
                "{k}: layer 0 q/k/v must equal the batched Hessian"
            );
        } else {
            // Everything after layer 0's q/k/v sees quantized weights (attn_output inside layer 0
            // too: its input comes from the quantized q/k/v).
            assert!(
                d > 1e-3,
                "{k}: sequential Hessian equals the batched one ({d})"
            );
        }
    }

    // The model the calibration simulated is the one convert writes: calibrating the converted
    // model (batched) gives the same Hessians. token_embd kept f32 (the simulation does not
    // quantize the embedding lookup).
    let out = dir.path().join("seq.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&model),
        "--weights",
        "tq4_1s",
        "--token-embedding-type",
        "f32",
        "--calib",
        s(&hs_path),
        "-q",
        "-o",
        s(&out),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
    let hc = dir.path().join("converted.safetensors");
    let (code, err) = run_tq(&calib_args(&out, &toks, &hc, &[]), None);
    assert_eq!(code, 0, "{err}");
    let (c, _) = tq::quant::Hessians::load(&hc).unwrap();
    for (k, g) in &sq.groups {
        let d = rel_diff(&g.h, &c.groups[k].h);
        let d_batched = rel_diff(&b.groups[k].h, &c.groups[k].h);
        eprintln!("{k}: sequential vs converted model {d:.3e} (batched {d_batched:.3e})");
        assert!(
            d < 1e-5,
            "{k}: sequential calibration did not simulate the converted model ({d})"
        );
    }

    // Converting with another quantization than the one simulated: one warning line.
    let (code, _, err) = tq(&[
        "convert",
        s(&model),
        "--weights",
        "tq3_1s",
        "--ldlq-band",
        "16",
        "--calib",
        s(&hs_path),
        "-q",
        "-o",
        s(&dir.path().join("other.gguf")),
    ]);
    assert_eq!(code, 0, "{err}");
    let warn: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warn.len(), 1, "{err}");
    assert!(
        warn[0].contains("seq.safetensors")
            && warn[0].contains("tq3_1s")
            && warn[0].contains("--ldlq-band 0 vs 16"),
        "{err}"
    );
}

#[test]
fn sequential_resume_equals_uninterrupted() {
    let dir = tempfile::tempdir().unwrap();
    let (model, toks) = setup(dir.path());
    let seq = ["--sequential", "--checkpoint-secs", "0"];
    let full = dir.path().join("full.safetensors");
    let (code, err) = run_tq(&calib_args(&model, &toks, &full, &seq), None);
    assert_eq!(code, 0, "{err}");
    let part = dir.path().join("part.safetensors");
    let (code, err) = run_tq(
        &calib_args(&model, &toks, &part, &seq),
        Some(("TQ_CALIB_ABORT_AFTER", "1")),
    );
    assert_eq!(code, 137, "{err}");
    assert!(err.contains("--resume"), "{err}");
    assert!(!part.exists());
    assert!(dir
        .path()
        .join(".part.safetensors.tq-partial.json")
        .exists());
    let mut resume: Vec<&str> = seq.to_vec();
    resume.push("--resume");
    let (code, err) = run_tq(&calib_args(&model, &toks, &part, &resume), None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("resuming after 1 of 2 blocks"), "{err}");
    assert_eq!(
        std::fs::read(&full).unwrap(),
        std::fs::read(&part).unwrap(),
        "resumed sequential Hessians differ"
    );
    // Same bytes with one thread.
    let one = dir.path().join("one.safetensors");
    let mut t1: Vec<&str> = seq.to_vec();
    t1.extend(["--threads", "1"]);
    let (code, err) = run_tq(&calib_args(&model, &toks, &one, &t1), None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&full).unwrap(), std::fs::read(&one).unwrap());
    // A checkpoint of another quantization, or of the batched mode, is refused.
    let (code, err) = run_tq(
        &calib_args(&model, &toks, &part, &seq),
        Some(("TQ_CALIB_ABORT_AFTER", "1")),
    );
    assert_eq!(code, 137, "{err}");
    let (code, err) = run_tq(
        &calib_args(
            &model,
            &toks,
            &part,
            &["--sequential", "--weights", "tq3_1s", "--resume"],
        ),
        None,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("checkpoint is for another"), "{err}");
    let (code, err) = run_tq(&calib_args(&model, &toks, &part, &["--resume"]), None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("checkpoint is for another"), "{err}");
}

#[test]
fn sequential_flag_errors_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (model, toks) = setup(dir.path());
    let o = dir.path().join("h.safetensors");
    for (extra, want) in [
        (vec!["--weights", "tq4_1s"], "--sequential"),
        (
            vec!["--sequential", "--recipe", "nope"],
            "unknown recipe 'nope'",
        ),
        (
            vec!["--sequential", "--weights", "q9_9"],
            "unknown tensor type 'q9_9'",
        ),
    ] {
        let (code, err) = run_tq(&calib_args(&model, &toks, &o, &extra), None);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(!o.exists());
}

/// Real data: SmolLM2 (Q4_1 source, token_embd q8_0, kept) on a few Botchan windows. Sequential calibration leaves layer
/// 0's q/k/v Hessian as it is, changes every later one, and its Hessians are those of the model
/// `tq convert --calib` then writes.
#[test]
fn sequential_on_smollm2_simulates_the_converted_model() {
    let Some(smol) = fixtures::smollm2() else {
        return;
    };
    let Some(text) = fixtures::botchan() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let args = |m: &Path, o: &Path, extra: &[&str]| {
        let mut v: Vec<String> = [
            "calib",
            s(m),
            "--text",
            s(&text),
            "--tokens",
            "256",
            "--ctx",
            "64",
            "--batch",
            "2",
            "-o",
            s(o),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    let hb = dir.path().join("b.safetensors");
    let hs_path = dir.path().join("s.safetensors");
    let (code, err) = run_tq(&args(&smol, &hb, &[]), None);
    assert_eq!(code, 0, "{err}");
    let (code, err) = run_tq(
        &args(&smol, &hs_path, &["--sequential", "--ldlq-band", "16"]),
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("210 tensors quantized with LDLQ"), "{err}");
    let out = dir.path().join("s.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&smol),
        "--weights",
        "tq4_1s",
        "--ldlq-band",
        "16",
        "--token-embedding-type",
        "q8_0",
        "--calib",
        s(&hs_path),
        "-q",
        "-o",
        s(&out),
    ]);
    assert_eq!(code, 0, "{err}");
    let hc = dir.path().join("c.safetensors");
    let (code, err) = run_tq(&args(&out, &hc, &[]), None);
    assert_eq!(code, 0, "{err}");
    let (b, _) = tq::quant::Hessians::load(&hb).unwrap();
    let (sq, _) = tq::quant::Hessians::load(&hs_path).unwrap();
    let (c, _) = tq::quant::Hessians::load(&hc).unwrap();
    assert_eq!(sq.groups.len(), 120);
    let (mut min_change, mut max_sim) = (f64::INFINITY, 0f64);
    for (k, g) in &sq.groups {
        let d_b = rel_diff(&g.h, &b.groups[k].h);
        let d_c = rel_diff(&g.h, &c.groups[k].h);
        if k.starts_with("blk.0.attn_q.weight") {
            assert_eq!(g.h, b.groups[k].h, "{k}");
            continue;
        }
        min_change = min_change.min(d_b);
        max_sim = max_sim.max(d_c);
    }
    eprintln!(
        "SmolLM2: smallest sequential-vs-batched change {min_change:.3e}; largest sequential-vs-converted difference {max_sim:.3e}"
    );
    assert!(
        min_change > 1e-3,
        "a later Hessian did not change: {min_change}"
    );
    assert!(
        max_sim < 1e-4,
        "sequential calibration and the converted model disagree: {max_sim}"
    );
}

// ---------------------------------------------------------------------------------------------
// tq convert --calib TEXT (inline calibration)

/// The tiny model with a byte-level gpt2 vocabulary of exactly its 96 ids: printable ASCII
/// `!`..`}`, `Ġ` (space), one merge `h e`, and `<s>` (BOS, added).
fn tiny_with_tokenizer(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("tiny-tok.gguf");
    std::fs::write(&p, fixtures::gguf_gen::tiny_llama_with_tokenizer().bytes).unwrap();
    p
}

fn tensors_equal(a: &Path, b: &Path) -> bool {
    let (fa, fb) = (
        tq::gguf::GgufFile::open(a).unwrap(),
        tq::gguf::GgufFile::open(b).unwrap(),
    );
    fa.tensors.len() == fb.tensors.len()
        && fa.tensors.iter().all(|t| {
            let u = fb.tensor(&t.name).unwrap();
            t.ty == u.ty && fa.tensor_data(t) == fb.tensor_data(u)
        })
}

#[test]
fn convert_calibrates_inline_on_text() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_with_tokenizer(dir.path());
    let text = dir.path().join("calib.txt");
    std::fs::write(&text, fixtures::gguf_gen::pseudo_text(400)).unwrap();
    let p = |n: &str| dir.path().join(n);
    let calib = |extra: &[&str], out: &Path| {
        let mut a = vec![
            "calib",
            s(&model),
            "--text",
            s(&text),
            "--tokens",
            "512",
            "--ctx",
            "32",
            "-o",
            s(out),
        ];
        a.extend(extra);
        let (code, _, err) = tq(&a);
        assert_eq!(code, 0, "{err}");
    };
    let convert = |extra: &[&str], out: &Path| {
        let mut a = vec![
            "convert",
            s(&model),
            "--weights",
            "tq4_1s",
            "-q",
            "-o",
            s(out),
        ];
        a.extend(extra);
        tq(&a)
    };
    // Two steps vs one: the same tensors.
    calib(&[], &p("h.safetensors"));
    let (code, _, err) = convert(&["--calib", s(&p("h.safetensors"))], &p("two.gguf"));
    assert_eq!(code, 0, "{err}");
    let inline = [
        "--calib",
        s(&text),
        "--calib-tokens",
        "512",
        "--calib-ctx",
        "32",
    ];
    let (code, _, err) = convert(&inline, &p("one.gguf"));
    assert_eq!(code, 0, "{err}");
    assert!(
        tensors_equal(&p("two.gguf"), &p("one.gguf")),
        "inline calibration differs"
    );
    let (code, _, err) = convert(&[], &p("rtn.gguf"));
    assert_eq!(code, 0, "{err}");
    assert!(
        !tensors_equal(&p("rtn.gguf"), &p("one.gguf")),
        "inline calibration had no effect"
    );
    let f = tq::gguf::GgufFile::open(p("one.gguf")).unwrap();
    let flags = f.get_str("tq.flags").unwrap().to_string();
    assert!(
        flags.contains("--calib calib.txt --calib-tokens 512 --calib-ctx 32"),
        "{flags}"
    );
    let methods = format!("{:?}", f.get("tq.tensor_methods").unwrap());
    assert!(
        methods.contains("blk.1.ffn_down.weight=tq4_1s:ldlq"),
        "{methods}"
    );

    // Sequential, inline and in two steps.
    calib(&["--sequential"], &p("hs.safetensors"));
    let (code, _, err) = convert(&["--calib", s(&p("hs.safetensors"))], &p("two-seq.gguf"));
    assert_eq!(code, 0, "{err}");
    let mut seq = inline.to_vec();
    seq.push("--calib-sequential");
    let (code, _, err) = convert(&seq, &p("one-seq.gguf"));
    assert_eq!(code, 0, "{err}");
    assert!(tensors_equal(&p("two-seq.gguf"), &p("one-seq.gguf")));
    assert!(!tensors_equal(&p("one.gguf"), &p("one-seq.gguf")));

    // --dry-run does not calibrate; bad inputs are one-line errors.
    let (code, out, err) = tq(&[
        "convert",
        s(&model),
        "--weights",
        "tq4_1s",
        "--calib",
        s(&text),
        "--dry-run",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("not run") && out.contains("blk.0.attn_q.weight"),
        "{err}"
    );
    std::fs::write(p("bin.txt"), [0xffu8, 0xfe, 0x00, 0x41]).unwrap();
    for (extra, want) in [
        (vec!["--calib", s(&p("bin.txt"))], "bin.txt: not UTF-8 text"),
        (
            vec![
                "--calib",
                s(&text),
                "--calib-tokens",
                "10",
                "--calib-ctx",
                "32",
            ],
            "is less than one window: it must be at least --calib-ctx 32",
        ),
        (vec!["--calib", s(&p("missing.txt"))], "missing.txt"),
        (
            vec!["--calib", s(&p("h.safetensors")), "--calib-sequential"],
            "--calib-sequential",
        ),
    ] {
        let (code, _, err) = convert(&extra, &p("bad.gguf"));
        assert_ne!(code, 0, "{extra:?}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // --calib-tokens without --calib: a usage error from the argument parser.
    let (code, _, err) = convert(&["--calib-tokens", "64"], &p("bad.gguf"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--calib <CALIB>"), "{err}");
    assert!(!p("bad.gguf").exists());
}

// ---------------------------------------------------------------------------------------------
// tq calib --self-generate (data-free)

#[test]
fn self_generate_is_deterministic_in_range_and_calibrates_on_its_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_with_tokenizer(dir.path());
    let p = |n: &str| dir.path().join(n);
    let gen = |seed: &str, threads: &str, toks: &Path, out: &Path| {
        let (code, _, err) = tq(&[
            "calib",
            s(&model),
            "--self-generate",
            "3",
            "--ctx",
            "24",
            "--seed",
            seed,
            "--threads",
            threads,
            "--save-tokens",
            s(toks),
            "-o",
            s(out),
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("tokens/s"), "{err}");
        std::fs::read_to_string(toks).unwrap()
    };
    let a = gen("7", "2", &p("a.txt"), &p("a.safetensors"));
    let b = gen("7", "1", &p("b.txt"), &p("b.safetensors"));
    let c = gen("8", "2", &p("c.txt"), &p("c.safetensors"));
    assert_eq!(a, b, "same seed, other thread count: other tokens");
    assert_ne!(a, c, "another seed gave the same tokens");
    assert_eq!(
        std::fs::read(p("a.safetensors")).unwrap(),
        std::fs::read(p("b.safetensors")).unwrap()
    );
    let windows: Vec<Vec<u32>> = a
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(windows.len(), 3);
    let mut distinct = std::collections::BTreeSet::new();
    for w in &windows {
        assert_eq!(w.len(), 24);
        assert_eq!(w[0], 95, "every window starts with BOS");
        assert!(w.iter().all(|&t| t < 96), "{w:?}");
        distinct.extend(w[1..].iter().copied());
    }
    assert!(distinct.len() > 10, "sampling collapsed: {distinct:?}");
    // The Hessians are those of a calibration on the saved tokens.
    let (code, _, err) = tq(&[
        "calib",
        s(&model),
        "--token-file",
        s(&p("a.txt")),
        "--ctx",
        "24",
        "-o",
        s(&p("t.safetensors")),
    ]);
    assert_eq!(code, 0, "{err}");
    let (g, meta) = tq::quant::Hessians::load(&p("a.safetensors")).unwrap();
    let (t, _) = tq::quant::Hessians::load(&p("t.safetensors")).unwrap();
    assert!(meta["tq.source"].contains("self-generate 3 windows, seed 7"));
    assert_eq!(g.groups.len(), 8);
    for (k, h) in &g.groups {
        assert_eq!(h.h, t.groups[k].h, "{k}");
        assert_eq!(h.tokens, 72);
    }
    // With --sequential too.
    let (code, _, err) = tq(&[
        "calib",
        s(&model),
        "--self-generate",
        "2",
        "--ctx",
        "16",
        "--sequential",
        "-o",
        s(&p("s.safetensors")),
    ]);
    assert_eq!(code, 0, "{err}");
    // A model without BOS, and bad counts: one-line errors.
    let plain = dir.path().join("plain.gguf");
    std::fs::write(&plain, fixtures::gguf_gen::tiny_llama(1, 64, 128, 96).bytes).unwrap();
    for (m, n, want) in [
        (&plain, "2", "bos_token_id"),
        (&model, "0", "--self-generate N"),
    ] {
        let (code, _, err) = tq(&[
            "calib",
            s(m),
            "--self-generate",
            n,
            "--ctx",
            "16",
            "-o",
            s(&p("x.safetensors")),
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(want), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let (code, _, err) = tq(&[
        "calib",
        s(&model),
        "--self-generate",
        "2",
        "--tokens",
        "64",
        "-o",
        s(&p("x.safetensors")),
    ]);
    assert_eq!(code, 2, "--tokens conflicts with --self-generate: {err}");
    assert!(!p("x.safetensors").exists());
}
