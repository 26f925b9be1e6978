//! `tq calib` + `tq convert --calib`: Hessians from the layer-streaming runtime, checkpoint/resume
//! equality, and LDLQ output that the stock decoder reads, with lower calibration-weighted error
//! than round-to-nearest at identical size.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use std::path::Path;
use std::process::Command;
use tq::types::TensorType;

fn tq(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

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
    let args = |o: &Path| {
        vec![
            "calib".to_string(),
            s(&model).into(),
            "--token-file".into(),
            s(&toks).into(),
            "--tokens".into(),
            "256".into(),
            "--ctx".into(),
            "32".into(),
            "--batch".into(),
            "2".into(),
            "-o".into(),
            s(o).into(),
        ]
    };
    let run = |a: Vec<String>, env: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tq"));
        c.args(&a);
        if let Some(v) = env {
            c.env("TQ_CALIB_ABORT_AFTER", v);
        }
        let o = c.output().unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let (code, err) = run(args(&full), None);
    assert_eq!(code, 0, "{err}");
    // Interrupted after 2 of 4 batches, then resumed.
    let part = dir.path().join("part.safetensors");
    let (code, err) = run(args(&part), Some("2"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--resume"), "{err}");
    let mut a = args(&part);
    a.push("--resume".into());
    let (code, err) = run(a, None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("resuming after 4 of 8 windows"), "{err}");
    assert_eq!(
        std::fs::read(&full).unwrap(),
        std::fs::read(&part).unwrap(),
        "resumed Hessians differ"
    );
    let (hs, meta) = tq::calib::Hessians::load(&full).unwrap();
    assert_eq!(meta["tq.complete"], "true");
    // q/k/v share one Hessian, gate/up another; attn_output and ffn_down their own: 4 per layer.
    assert_eq!(hs.groups.len(), 8);
    let qkv = hs.for_tensor("blk.1.attn_k.weight").unwrap();
    assert!(qkv.tensors.iter().any(|t| t == "blk.1.attn_q.weight"));
    assert_eq!(qkv.n, 64);
    assert_eq!(qkv.tokens, 256);
    assert_eq!(hs.for_tensor("blk.0.ffn_down.weight").unwrap().n, 128);
    // A resume against another configuration is refused.
    let mut a = args(&part);
    a[7] = "16".into();
    a.push("--resume".into());
    let (code, err) = run(a, None);
    assert_eq!(code, 2);
    assert!(err.contains("checkpoint is for another"), "{err}");
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
    let (hs, _) = tq::calib::Hessians::load(&h).unwrap();
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
            tq::ldlq::proxy_loss(&hg.h, hg.n, &w, &ql),
            tq::ldlq::proxy_loss(&hg.h, hg.n, &w, &qr),
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
