//! GPU decode kernels (issue 8): the parity harness on the CPU emulation (always), on wgpu when
//! built with `--features wgpu` (CI: Mesa's lavapipe), NVRTC compilation of the CUDA sources when
//! built with `--features cuda` and NVRTC is present, and the kernel sources' constant tables.
//!
//! `TQ_REQUIRE_GPU=1` (set by scripts/ci-gpu.sh) turns "no wgpu adapter" into a failure, and
//! `TQ_REQUIRE_NVRTC=1` (also set there) turns "libnvrtc not found" into one.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use tq::gpu::{self, Backend, BackendKind, CheckOptions, CpuEmulation, KernelKind, TurboSpec};
use tq::types::tq as tqs;
use tq::types::TensorType;

fn conformance_dir() -> std::path::PathBuf {
    fixtures::conformance("tq4_1s.json")
        .parent()
        .unwrap()
        .to_path_buf()
}

fn quick_opts() -> CheckOptions {
    CheckOptions {
        conformance_dir: Some(conformance_dir()),
        quick: true,
        ..Default::default()
    }
}

#[allow(dead_code)] // used by the feature-gated tests
fn require_gpu() -> bool {
    std::env::var("TQ_REQUIRE_GPU")
        .map(|v| v == "1")
        .unwrap_or(false)
}

#[allow(dead_code)] // used by the feature-gated tests
fn require_nvrtc() -> bool {
    std::env::var("TQ_REQUIRE_NVRTC")
        .map(|v| v == "1")
        .unwrap_or(false)
}

#[test]
fn harness_passes_on_cpu_emulation() {
    let rep = gpu::check(&mut CpuEmulation, &quick_opts()).unwrap();
    println!("{}", gpu::format_report(&rep));
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
    // Every type has dequantize on conformance + random bytes + shapes, and its dot kernel.
    for ty in gpu::KERNEL_TYPES {
        let of = |k: KernelKind| {
            rep.results
                .iter()
                .filter(|r| r.ty == ty && r.kind == k)
                .count()
        };
        assert!(of(KernelKind::Dequantize) >= 4, "{ty}");
        assert!(of(KernelKind::MatVec) + of(KernelKind::QkDot) >= 3, "{ty}");
        // The mat-mul (many activation rows per launch) on every real shape of a TQ type.
        assert_eq!(of(KernelKind::MatMul) >= 2, ty.is_tq_weight(), "{ty}");
        assert!(rep
            .results
            .iter()
            .any(|r| r.ty == ty && r.data == "conformance" && r.kind == KernelKind::Dequantize));
    }
}

/// Every turbo layout and codebook tq writes or simulates is checked: the registry's May-2026
/// 128-value layout, June turbo4 (66 bytes), 64-value groups (SmolLM2's heads), and the
/// `--turbo-codebook may|fork|head-dim` tables; each with conformance inputs, random bytes, a
/// real KV shape and Q·K.
#[test]
fn harness_covers_every_turbo_layout_and_codebook() {
    let rep = gpu::check(&mut CpuEmulation, &quick_opts()).unwrap();
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
    for ty in [TensorType::Turbo2, TensorType::Turbo3, TensorType::Turbo4] {
        let specs = gpu::turbo_specs(ty).unwrap();
        // turbo2/3: registry(=may=fork) and head-dim at 128, may=fork and head-dim at 64;
        // turbo4: registry(=may), fork(=head-dim: both Lloyd-Max for d = 128) at 128, and may,
        // fork, head-dim at 64.
        let want = if ty == TensorType::Turbo4 { 5 } else { 4 };
        assert_eq!(specs.len(), want, "{ty}: {specs:?}");
        for s in specs.iter().filter(|s| !s.is_stock()) {
            let label = format!("[{}]", s.label());
            for (kind, data) in [
                (KernelKind::Dequantize, "conformance inputs"),
                (KernelKind::QkDot, "conformance inputs"),
                (KernelKind::Dequantize, "random-bytes"),
                (KernelKind::Dequantize, "k_cache"),
                (KernelKind::QkDot, "k_cache"),
            ] {
                assert!(
                    rep.results.iter().any(|r| r.ty == ty
                        && r.kind == kind
                        && r.data.starts_with(&label)
                        && r.data.contains(data)),
                    "{ty} {label} {kind:?} {data}"
                );
            }
        }
    }
    let t4 = gpu::turbo_specs(TensorType::Turbo4).unwrap();
    assert!(t4
        .iter()
        .any(|s| s.layout.group == 128 && s.layout.block_bytes() == 66));
    assert!(t4
        .iter()
        .any(|s| s.layout.group == 64 && s.layout.block_bytes() == 34));
    assert!(rep
        .results
        .iter()
        .any(|r| r.data.contains("smollm2.k_cache") && r.data.contains("g64")));
}

/// The generalized packer reproduces the conformance bytes for the registry's layouts, and the
/// KV simulator's stored values for every layout and codebook.
#[test]
fn turbo_layouts_are_the_reference_and_the_simulator() {
    use tq::model::kv;
    let dir = conformance_dir();
    for ty in [TensorType::Turbo2, TensorType::Turbo3, TensorType::Turbo4] {
        let conf = gpu::load_conformance(&dir, ty).unwrap();
        let stock = TurboSpec::stock(ty).unwrap();
        let mut n = 0;
        for ((id, bytes), x) in conf.cases.iter().zip(&conf.inputs) {
            if x.iter().all(|v| v.is_finite()) {
                assert_eq!(&stock.quantize(x), bytes, "{ty} {id}");
                n += 1;
            }
        }
        assert!(n > 100, "{ty}: {n} cases");
        for spec in gpu::turbo_specs(ty).unwrap() {
            let g = spec.layout.group;
            let x: Vec<f32> = conf.inputs[0][..g].to_vec();
            let got = spec.reference(&spec.quantize(&x));
            let mut want = vec![0f32; g];
            kv::turbo_group_rotated(&x, &spec.codebook, &mut want);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{ty} {}",
                spec.label()
            );
        }
    }
    // Hostile layouts and shapes are errors, not panics or out-of-bounds reads.
    let mut bad = TurboSpec::stock(TensorType::Turbo3).unwrap();
    bad.codebook.pop();
    assert!(CpuEmulation.turbo_dequantize(&bad, &[0u8; 50]).is_err());
    let good = TurboSpec::stock(TensorType::Turbo3).unwrap();
    assert!(CpuEmulation.turbo_dequantize(&good, &[0u8; 49]).is_err());
    assert!(CpuEmulation
        .turbo_qk(&good, &[0u8; 50], 1, 64, &[0.0; 64])
        .is_err());
    assert!(CpuEmulation
        .turbo_dequantize(&good, &[])
        .unwrap()
        .is_empty());
}

/// A backend that is wrong in a chosen way, to show the harness fails it.
struct Broken {
    flip_one_bit: bool,
    dot_scale: f32,
}

impl Backend for Broken {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn device_name(&self) -> String {
        "broken".into()
    }
    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> tq::Result<Vec<f32>> {
        let mut v = CpuEmulation.dequantize(ty, blocks)?;
        if self.flip_one_bit {
            let i = v.len() / 2;
            v[i] = f32::from_bits(v[i].to_bits() ^ 1);
        }
        Ok(v)
    }
    fn matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> tq::Result<Vec<f32>> {
        let v = CpuEmulation.matvec(ty, w, rows, cols, x)?;
        Ok(v.iter().map(|y| y * self.dot_scale).collect())
    }
    fn turbo_dequantize(&mut self, spec: &TurboSpec, blocks: &[u8]) -> tq::Result<Vec<f32>> {
        let mut v = CpuEmulation.turbo_dequantize(spec, blocks)?;
        if self.flip_one_bit {
            let i = v.len() / 2;
            v[i] = f32::from_bits(v[i].to_bits() ^ 1);
        }
        Ok(v)
    }
    fn turbo_qk(
        &mut self,
        spec: &TurboSpec,
        k: &[u8],
        rows: usize,
        cols: usize,
        q: &[f32],
    ) -> tq::Result<Vec<f32>> {
        let v = CpuEmulation.turbo_qk(spec, k, rows, cols, q)?;
        Ok(v.iter().map(|y| y * self.dot_scale).collect())
    }
    fn time_dequantize(&mut self, _: TensorType, _: &[u8], _: usize) -> tq::Result<f64> {
        Ok(1.0)
    }
}

#[test]
fn harness_fails_a_one_ulp_dequantize_error() {
    let opts = CheckOptions {
        types: vec![TensorType::TQ3_1S],
        ..quick_opts()
    };
    let mut b = Broken {
        flip_one_bit: true,
        dot_scale: 1.0,
    };
    let rep = gpu::check(&mut b, &opts).unwrap();
    assert!(!rep.pass());
    let bad: Vec<_> = rep.results.iter().filter(|r| !r.pass).collect();
    assert!(bad.iter().all(|r| r.kind == KernelKind::Dequantize));
    assert!(bad.iter().any(|r| r.max_ulp == 1 || r.class_mismatch == 1));
    assert!(gpu::format_report(&rep).contains("FAIL"));
}

#[test]
fn harness_fails_a_dot_off_by_1e_minus_4() {
    let opts = CheckOptions {
        types: vec![TensorType::TQ4_1S, TensorType::Turbo3],
        ..quick_opts()
    };
    let mut b = Broken {
        flip_one_bit: false,
        dot_scale: 1.0 + 1e-4,
    };
    let rep = gpu::check(&mut b, &opts).unwrap();
    let bad: Vec<_> = rep.results.iter().filter(|r| !r.pass).collect();
    assert!(!bad.is_empty());
    assert!(bad.iter().all(|r| r.kind != KernelKind::Dequantize));
    assert!(bad.iter().any(|r| r.kind == KernelKind::MatVec));
    assert!(bad.iter().any(|r| r.kind == KernelKind::MatMul));
    assert!(bad.iter().any(|r| r.kind == KernelKind::QkDot));
}

/// The decimal codebook literals in the CUDA and Metal sources are the CPU reference's f32
/// values (C compilers round decimal literals correctly, as Rust's parser does).
#[test]
#[allow(clippy::excessive_precision)]
fn cuda_and_metal_tables_match_the_cpu_reference() {
    fn table(src: &str, name: &str) -> Vec<f32> {
        let at = src
            .find(&format!("{name}["))
            .unwrap_or_else(|| panic!("{name}"));
        let body = &src[at..];
        let open = body.find('{').unwrap();
        let close = body.find('}').unwrap();
        body[open + 1..close]
            .split(',')
            .map(|t| t.trim().trim_end_matches('f'))
            .filter(|t| !t.is_empty())
            .map(|t| t.parse::<f32>().unwrap())
            .collect()
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (tq, turbo_src) in [
        (gpu::sources::CUDA_TQ, gpu::sources::CUDA_TURBO),
        (gpu::sources::METAL_TQ, gpu::sources::METAL_TURBO),
    ] {
        assert_eq!(bits(&table(tq, "TQ_C4")), bits(&tqs::C4));
        assert_eq!(bits(&table(tq, "TQ_C3")), bits(&tqs::C3));
        // Turbo codebooks are passed by the host (any table), never hard-coded.
        assert!(!turbo_src.contains("TURBO_CB"));
        assert!(tq.contains("0.17677669529663688f"));
        assert_eq!(
            "0.17677669529663688".parse::<f32>().unwrap(),
            0.176_776_695_296_636_88f32
        );
    }
}

#[test]
fn cli_check_on_cpu_emulation() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args([
            "kernels",
            "check",
            "--backend",
            "cpu",
            "--quick",
            "--types",
            "tq4_1s,turbo2",
        ])
        .env("TQ_CONFORMANCE", conformance_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("backend cpu-emulation"), "{text}");
    assert!(text.contains("tq4_1s   dequantize conformance"), "{text}");
    assert!(text.contains(" 0 failed"), "{text}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(["kernels", "check", "--backend", "cpu", "--types", "q4_0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("has no GPU kernel"));
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_kernels_match_the_cpu_reference() {
    let mut b = match gpu::open_backend(BackendKind::Wgpu) {
        Ok(b) => b,
        Err(e) => {
            if require_gpu() {
                panic!("TQ_REQUIRE_GPU=1 but {e}");
            }
            eprintln!("SKIP: {e}");
            return;
        }
    };
    let opts = CheckOptions {
        conformance_dir: Some(conformance_dir()),
        ..Default::default()
    };
    let rep = gpu::check(b.as_mut(), &opts).unwrap();
    println!("{}", gpu::format_report(&rep));
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
}

/// `--backend wgpu`: a tiny TQ3_1S model (output projection TQ too) runs its linear layers
/// through the wgpu mat-mul kernels, and the run stays within the bound of the CPU run under
/// both numerics (scripts/ci-gpu.sh does the same on SmolLM2 with `tq validate`).
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_model_run_is_within_the_bound_of_the_cpu_run() {
    use tq::eval::{evaluate, Reference, Windows};
    use tq::model::{Model, Numerics};
    if let Err(e) = gpu::open_linear(BackendKind::Wgpu) {
        if require_gpu() {
            panic!("TQ_REQUIRE_GPU=1 but {e}");
        }
        eprintln!("SKIP: {e}");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("tiny.gguf");
    std::fs::write(&src, fixtures::gguf_gen::tiny_llama(2, 64, 128, 100).bytes).unwrap();
    let art = d.path().join("tiny-tq3.gguf");
    let (code, _, err) = fixtures::tq(&[
        "convert",
        fixtures::s(&src),
        "--weights",
        "tq3_1s",
        "--recipe",
        "pure",
        "-q",
        "-o",
        fixtures::s(&art),
    ]);
    assert_eq!(code, 0, "{err}");
    let f = tq::gguf::GgufFile::open(&art).unwrap();
    let ids: Vec<u32> = (0..16 * 4).map(|i| (i * 37 + 11) % 100).collect();
    let win = Windows::new(&ids, 16, None, None).unwrap();
    for numerics in [Numerics::F32, Numerics::Ggml] {
        let mut m = Model::new(&f, numerics).unwrap();
        m.use_backend(BackendKind::Wgpu).unwrap();
        let r = evaluate(&m, &win, Reference::None, None, 4, &|_, _| {}).unwrap();
        let b = r.backend.unwrap();
        assert_eq!(b.on_backend["tq3_1s"], 15, "{b:?}");
        let c = b.comparison.unwrap();
        println!("wgpu {numerics:?}: {}", b_line(&c));
        assert!(c.within_bound, "{c:?}");
    }
}

#[cfg(feature = "wgpu")]
fn b_line(c: &tq::eval::backend::Comparison) -> String {
    format!(
        "KLD mean {:.3e}, max {:.3e}, max |dlogit| {:.3e}",
        c.kld.value, c.kld_max, c.max_abs_logit_diff
    )
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_kernels_compile_with_nvrtc() {
    if !gpu::cuda::nvrtc_present() {
        if require_nvrtc() {
            panic!("TQ_REQUIRE_NVRTC=1 but libnvrtc was not found (LD_LIBRARY_PATH)");
        }
        eprintln!("SKIP: libnvrtc not found (put the NVRTC lib directory on LD_LIBRARY_PATH)");
        return;
    }
    for arch in [None, Some("compute_80"), Some("compute_90")] {
        if let Err(e) = gpu::cuda::compile_kernels(arch) {
            panic!("{arch:?}: {e}");
        }
    }
    // What the backend loads on a GPU: SASS for the device's own architecture (no PTX JIT, so
    // an older driver than NVRTC still loads it).
    for sm in ["sm_80", "sm_86", "sm_89", "sm_90"] {
        let (a, b) = gpu::cuda::compile_cubins(sm).unwrap_or_else(|e| panic!("{sm}: {e}"));
        assert!(
            a.starts_with(b"\x7fELF") && b.starts_with(b"\x7fELF"),
            "{sm}"
        );
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_kernels_match_the_cpu_reference() {
    let mut b = match gpu::open_backend(BackendKind::Cuda) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("SKIP: {e}");
            return;
        }
    };
    let rep = gpu::check(b.as_mut(), &quick_opts()).unwrap();
    println!("{}", gpu::format_report(&rep));
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
}

/// `--backend auto` skips absent backends but counts a backend whose kernels do not compile as a
/// failure (exit 2, `FAILED`): a broken turbo kernel (through `TQ_KERNELS_DIR`) must not pass as
/// "skipped". Runs where a compiler is present: NVRTC (CUDA, even with no GPU) or a wgpu adapter.
#[test]
fn auto_counts_kernel_compile_errors_as_failures() {
    let dir = std::env::temp_dir().join(format!("tq-broken-kernels-{}", std::process::id()));
    for (lang, files) in [
        ("cuda", ["common.cuh", "tq.cu", "turbo.cu"]),
        ("metal", ["common.metal", "tq.metal", "turbo.metal"]),
        ("wgsl", ["common.wgsl", "tq.wgsl", "turbo.wgsl"]),
    ] {
        std::fs::create_dir_all(dir.join(lang)).unwrap();
        for f in files {
            let mut text = gpu::sources::text(lang, f).unwrap();
            if f.starts_with("turbo") {
                text.push_str("\nthis is not valid kernel code;\n");
            }
            std::fs::write(dir.join(lang).join(f), text).unwrap();
        }
    }
    let run = |kernels: Option<&std::path::Path>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_tq"));
        c.args([
            "kernels",
            "check",
            "--backend",
            "auto",
            "--quick",
            "--types",
            "turbo2",
        ])
        .env("TQ_CONFORMANCE", conformance_dir());
        if let Some(k) = kernels {
            c.env("TQ_KERNELS_DIR", k);
        }
        let o = c.output().unwrap();
        (
            o.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    let (code, text) = run(Some(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    let compilers = text.contains("cuda: FAILED") || text.contains("wgpu: FAILED");
    if !compilers {
        // Neither NVRTC nor a wgpu adapter here: every backend is absent and skipped.
        assert!(!text.contains("FAILED"), "{text}");
        assert!(text.contains("skipped"), "{text}");
        if require_gpu() || require_nvrtc() {
            panic!("CI: a compiler was required but the broken kernels were not compiled:\n{text}");
        }
        eprintln!("SKIP: no NVRTC and no wgpu adapter: {text}");
        return;
    }
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("NVRTC rejected kernels/cuda/turbo.cu") || text.contains("turbo.wgsl"),
        "{text}"
    );
    assert!(
        !text.contains("cuda: skipped (libcuda not found; kernels compile"),
        "{text}"
    );
}

/// Absent backends are skipped, and the reason is printed: Metal off macOS, and a backend that is
/// not built in.
#[test]
fn auto_skips_absent_backends() {
    match gpu::open_backend(BackendKind::Metal) {
        Err(e) if !cfg!(target_os = "macos") => assert!(e.is_absent(), "{e}"),
        _ => {}
    }
    #[cfg(not(feature = "cuda"))]
    assert!(gpu::open_backend(BackendKind::Cuda)
        .err()
        .unwrap()
        .is_absent());
    #[cfg(not(feature = "wgpu"))]
    assert!(gpu::open_backend(BackendKind::Wgpu)
        .err()
        .unwrap()
        .is_absent());
}
