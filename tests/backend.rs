//! `--backend` (issue 16 item 4): the model's linear weights through the bundled mat-mul kernels
//! in `tq eval` and `tq validate`, on small generated models with the CPU emulation of the
//! kernels (no GPU needed; `tests/kernels.rs` runs the same on wgpu when it is built in): what
//! ran where, the KLD between the CPU run and the kernel run within its bound, `--backend cpu`
//! unchanged, the check failing for a backend that is off, and the usage errors.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::gguf_gen::tiny_llama;
use fixtures::{s, tq, tq_env};
use std::path::{Path, PathBuf};
use tq::eval::backend::KldBound;
use tq::eval::{evaluate, Reference, Windows};
use tq::gguf::GgufFile;
use tq::gpu::{open_linear, BackendKind, Linear, WeightId};
use tq::model::{Model, Numerics};
use tq::types::TensorType;

struct Setup {
    _dir: tempfile::TempDir,
    model: PathBuf,
    q8: PathBuf,
    tq3: PathBuf,
    tq4: PathBuf,
    tokens: PathBuf,
}

/// A tiny f32 llama (2 blocks, hidden 64, FFN 128, vocabulary 100), its q8_0, TQ3_1S (output
/// projection q8_0) and TQ4_1S (output projection TQ4_1S too) conversions, and 8 windows of 16
/// random tokens.
fn setup() -> Setup {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, tiny_llama(2, 64, 128, 100).bytes).unwrap();
    let conv = |w: &str, extra: &[&str]| {
        let out = dir.join(format!("tiny-{w}.gguf"));
        let mut a = vec![
            "convert",
            s(&model),
            "--weights",
            w,
            "--recipe",
            "pure",
            "-q",
            "-o",
            s(&out),
        ];
        a.extend_from_slice(extra);
        let (code, _, err) = tq(&a);
        assert_eq!(code, 0, "{err}");
        out
    };
    let q8 = conv("q8_0", &[]);
    let tq3 = conv("tq3_1s", &["--tensor-type", "^output\\.weight$=q8_0"]);
    let tq4 = conv("tq4_1s", &[]);
    let mut x = 777u64;
    let ids: Vec<String> = (0..16 * 8)
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
        model,
        q8,
        tq3,
        tq4,
        tokens,
    }
}

impl Setup {
    fn eval(&self, model: &Path, extra: &[&str]) -> (i32, String, String) {
        self.eval_env(model, extra, &[])
    }

    fn eval_env(
        &self,
        model: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (i32, String, String) {
        let mut a = vec![
            "eval",
            s(model),
            "--tokens",
            s(&self.tokens),
            "--ctx",
            "16",
            "--chunks",
            "4",
            "-q",
        ];
        a.extend_from_slice(extra);
        tq_env(&a, env)
    }

    /// `tq eval` with the CPU's TQ weights through the f32 path, the reference `--backend` runs
    /// are compared with (plain `tq eval` may take the int8 path on a CPU with VNNI).
    fn eval_json_f32(&self, model: &Path, extra: &[&str]) -> serde_json::Value {
        let mut e = extra.to_vec();
        e.push("--json");
        // The backend's CPU reference run multiplies on the f32 path: TQ and q8_0 weights alike.
        let (code, out, err) =
            self.eval_env(model, &e, &[("TQ_TQ_DOT", "f32"), ("TQ_Q8_DOT", "f32")]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap()
    }

    fn eval_json(&self, model: &Path, extra: &[&str]) -> serde_json::Value {
        let mut e = extra.to_vec();
        e.push("--json");
        let (code, out, err) = self.eval(model, &e);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap()
    }
}

fn one_line_error(err: &str, want: &str) {
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("tq: error: "), "{err}");
    assert!(err.contains(want), "want '{want}' in: {err}");
}

/// The kernel run (CPU emulation of the kernels' arithmetic) is compared with the CPU run on
/// the same windows: every TQ weight on the backend (the TQ4_1S output projection too), a q8_0
/// output on the CPU, the KLD far inside the bound of each numerics, and the PPL of the two runs
/// equal to ~1e-5.
#[test]
fn eval_backend_reports_placement_and_the_kld_to_the_cpu_run() {
    let t = setup();
    for (art, ty, n) in [(&t.tq3, "tq3_1s", 14), (&t.tq4, "tq4_1s", 15)] {
        for numerics in ["ggml", "f32"] {
            let j = t.eval_json(art, &["--backend", "cpu-emulation", "--numerics", numerics]);
            assert_eq!(j["backend"], "cpu-emulation");
            let b = &j["result"]["backend"];
            assert_eq!(b["backend"], "cpu-emulation", "{b}");
            // 2 blocks x (q, k, v, output, gate, up, down), and the output projection if TQ.
            assert_eq!(b["on_backend"][ty], n, "{b}");
            if n == 14 {
                assert_eq!(b["on_cpu"]["q8_0"], 1, "{b}");
                assert_eq!(b["cpu_tensors"][0], "output.weight", "{b}");
            } else {
                assert!(b["on_cpu"].as_object().unwrap().is_empty(), "{b}");
            }
            assert!(b["resident_bytes"].as_u64().unwrap() > 0);
            let c = &b["comparison"];
            let bound = if numerics == "f32" {
                KldBound::F32
            } else {
                KldBound::GGML
            };
            assert_eq!(c["bound"]["mean"], bound.mean, "{c}");
            assert_eq!(c["within_bound"], true, "{c}");
            assert!(
                c["kld"]["value"].as_f64().unwrap() <= bound.mean / 100.0,
                "{c}"
            );
            assert_eq!(c["tokens"], 4 * 7, "{c}");
            let ppl = j["result"]["ppl"]["value"].as_f64().unwrap();
            let ppl_cpu = c["ppl_cpu"]["value"].as_f64().unwrap();
            assert!((ppl / ppl_cpu - 1.0).abs() < 1e-4, "{ppl} {ppl_cpu}");
            // The CPU run's PPL is what `tq eval` reports on the f32 path.
            let cpu = t.eval_json_f32(art, &["--numerics", numerics]);
            assert_eq!(cpu["result"]["ppl"]["value"], c["ppl_cpu"]["value"]);
        }
    }
    // The text report says where the weights ran and the comparison.
    let (code, out, err) = t.eval(&t.tq3, &["--backend", "cpu-emulation"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Backend: cpu-emulation")
            && out.contains("14 tq3_1s")
            && out.contains("on the CPU: 1 q8_0")
            && out.contains("within"),
        "{out}"
    );
}

/// `--backend cpu` is the default: the JSON result is the same, number for number, and has no
/// backend part; a model with no weight of a kernel type runs all on the CPU (no comparison).
#[test]
fn backend_cpu_is_todays_run_and_no_kernel_type_means_no_comparison() {
    let t = setup();
    let a = t.eval_json(&t.tq3, &[]);
    let b = t.eval_json(&t.tq3, &["--backend", "cpu"]);
    let strip = |mut v: serde_json::Value| {
        let r = v["result"].as_object_mut().unwrap();
        r.remove("seconds");
        r.remove("tokens_per_second");
        v
    };
    assert_eq!(strip(a.clone()), strip(b));
    assert!(a["result"].get("backend").is_none());
    assert_eq!(a["backend"], "cpu");
    let j = t.eval_json(&t.q8, &["--backend", "cpu-emulation"]);
    let b = &j["result"]["backend"];
    assert!(b["comparison"].is_null(), "{b}");
    assert!(b["on_backend"].as_object().unwrap().is_empty(), "{b}");
    assert_eq!(b["on_cpu"]["q8_0"], 15, "{b}");
    // --backend auto: without a GPU backend built in and present, the CPU run, unchanged.
    let auto = t.eval_json(&t.tq3, &["--backend", "auto"]);
    match auto["backend"].as_str().unwrap() {
        "cpu" => assert_eq!(strip(auto), strip(a)),
        gpu => assert!(["wgpu", "cuda", "metal"].contains(&gpu), "{auto}"),
    }
}

/// `tq validate --backend`: the quality numbers are the kernel run's and `backend/kld_vs_cpu`
/// passes (JSON, text, JUnit); without a kernel type it is skipped; without quality windows too.
#[test]
fn validate_backend_check_passes_and_is_reported() {
    let t = setup();
    let dir = t.model.parent().unwrap();
    let junit = dir.join("junit.xml");
    let run = |art: &Path, extra: &[&str]| {
        let mut a = vec![
            "validate",
            s(art),
            "--ref",
            s(&t.model),
            "--tokens",
            s(&t.tokens),
            "--ctx",
            "16",
            "--chunks",
            "4",
            "--gen-prompts",
            "0",
            "--kernels",
            "none",
            "--backend",
            "cpu-emulation",
            "-q",
        ];
        a.extend_from_slice(extra);
        tq(&a)
    };
    let (code, out, err) = run(&t.tq4, &["--json", "--junit", s(&junit)]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["group"] == "backend" && c["name"] == "kld_vs_cpu")
        .unwrap_or_else(|| panic!("no backend check: {r}"));
    assert_eq!(c["status"], "pass", "{c}");
    assert_eq!(c["limit"]["value"], KldBound::GGML.mean, "{c}");
    assert!(c["detail"].as_str().unwrap().contains("15 tq4_1s"), "{c}");
    assert_eq!(r["backend"]["on_backend"]["tq4_1s"], 15);
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(
        x.contains("classname=\"tq.validate.backend\" name=\"kld_vs_cpu\"><system-out>"),
        "{x}"
    );
    let (code, out, err) = run(&t.tq4, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("backend/kld_vs_cpu") && out.contains("Backend: cpu-emulation"),
        "{out}"
    );
    // No weight of a kernel type: skipped, with the reason.
    let (code, out, err) = run(&t.q8, &["--json"]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["group"] == "backend")
        .unwrap();
    assert_eq!(c["status"], "skipped", "{c}");
}

/// A backend whose mat-mul is off on every third output is caught by the bound of each
/// numerics: a relative 1e-2 under f32 numerics (where the bound is tight; the KLD grows with the
/// square of the error and the scale of the logits, which is small in this random model), a
/// flipped sign under ggml numerics (whose bound leaves room for the roundings that the runs'
/// last-bit differences flip).
#[test]
fn a_backend_that_is_off_fails_the_bound() {
    struct Off(Box<dyn Linear>, f32);
    impl Linear for Off {
        fn kind(&self) -> BackendKind {
            self.0.kind()
        }
        fn device_name(&self) -> String {
            format!("off by {}", self.1)
        }
        fn upload_weight(
            &mut self,
            ty: TensorType,
            w: &[u8],
            rows: usize,
            cols: usize,
        ) -> tq::Result<WeightId> {
            self.0.upload_weight(ty, w, rows, cols)
        }
        fn matmul(&mut self, w: WeightId, x: &[f32], tokens: usize) -> tq::Result<Vec<f32>> {
            Ok(self
                .0
                .matmul(w, x, tokens)?
                .into_iter()
                .enumerate()
                .map(|(i, v)| if i % 3 == 0 { v * (1.0 + self.1) } else { v })
                .collect())
        }
        fn resident_bytes(&self) -> u64 {
            self.0.resident_bytes()
        }
    }
    let t = setup();
    let f = GgufFile::open(&t.tq4).unwrap();
    let ids: Vec<u32> = std::fs::read_to_string(&t.tokens)
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let win = Windows::new(&ids, 16, Some(4), None).unwrap();
    let run = |eps: f32, numerics: Numerics| {
        let mut m = Model::new(&f, numerics).unwrap();
        let lin = open_linear(BackendKind::Cpu).unwrap();
        m.use_kernels(if eps == 0.0 {
            lin
        } else {
            Box::new(Off(lin, eps))
        })
        .unwrap();
        let c = evaluate(&m, &win, Reference::None, None, 4, &|_, _| {})
            .unwrap()
            .backend
            .unwrap()
            .comparison
            .unwrap();
        println!(
            "{numerics:?} eps {eps}: KLD mean {:.3e} max {:.3e} (bound {:?})",
            c.kld.value, c.kld_max, c.bound
        );
        c
    };
    for (numerics, eps) in [(Numerics::F32, 1e-2), (Numerics::Ggml, -2.0)] {
        let good = run(0.0, numerics);
        assert!(good.within_bound, "{good:?}");
        let bad = run(eps, numerics);
        assert!(!bad.within_bound, "{bad:?}");
    }
}

#[test]
fn backend_usage_errors_are_one_line() {
    let t = setup();
    let (code, _, err) = t.eval(&t.tq3, &["--backend", "opencl"]);
    assert_eq!(code, 2);
    one_line_error(
        &err,
        "--backend opencl: expected cpu, auto, wgpu, cuda, metal",
    );
    let (code, _, err) = t.eval(
        &t.tq3,
        &["--backend", "cpu-emulation", "--numerics", "cuda"],
    );
    assert_eq!(code, 2);
    one_line_error(&err, "choose one");
    #[cfg(not(feature = "wgpu"))]
    {
        let (code, _, err) = t.eval(&t.tq3, &["--backend", "wgpu"]);
        assert_eq!(code, 2);
        one_line_error(&err, "rebuild with `--features wgpu`");
    }
    #[cfg(not(feature = "cuda"))]
    {
        let (code, _, err) = t.eval(&t.tq3, &["--backend", "cuda"]);
        assert_eq!(code, 2);
        one_line_error(&err, "rebuild with `--features cuda`");
    }
    let (code, _, err) = tq(&[
        "validate",
        s(&t.tq3),
        "--tokens",
        s(&t.tokens),
        "--ctx",
        "16",
        "--backend",
        "vulkan",
    ]);
    assert_eq!(code, 2);
    one_line_error(&err, "--backend vulkan");
}
