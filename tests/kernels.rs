//! GPU decode kernels (issue 8): the parity harness on the CPU emulation (always), on wgpu when
//! built with `--features wgpu` (CI: Mesa's lavapipe), NVRTC compilation of the CUDA sources when
//! built with `--features cuda` and NVRTC is present, and the kernel sources' constant tables.
//!
//! `TQ_REQUIRE_GPU=1` (set by scripts/ci-gpu.sh) turns "no wgpu adapter" into a failure.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use tq::gpu::{self, Backend, BackendKind, CheckOptions, CpuEmulation, KernelKind};
use tq::types::tq as tqs;
use tq::types::turbo;
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
        assert!(rep
            .results
            .iter()
            .any(|r| r.ty == ty && r.data == "conformance" && r.kind == KernelKind::Dequantize));
    }
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
    fn qk_dot(
        &mut self,
        ty: TensorType,
        k: &[u8],
        rows: usize,
        cols: usize,
        q: &[f32],
    ) -> tq::Result<Vec<f32>> {
        let v = CpuEmulation.qk_dot(ty, k, rows, cols, q)?;
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
    assert!(bad.iter().any(|r| r.kind == KernelKind::QkDot));
}

/// The decimal codebook literals in the CUDA and Metal sources are the CPU reference's f32
/// values (C compilers round decimal literals correctly, as Rust's parser does).
#[test]
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
        assert_eq!(bits(&table(turbo_src, "TURBO_CB2")), bits(&turbo::CB2));
        assert_eq!(bits(&table(turbo_src, "TURBO_CB3")), bits(&turbo::CB3));
        assert_eq!(bits(&table(turbo_src, "TURBO_CB4")), bits(&turbo::CB4));
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

#[cfg(feature = "cuda")]
#[test]
fn cuda_kernels_compile_with_nvrtc() {
    if !gpu::cuda::nvrtc_present() {
        eprintln!("SKIP: libnvrtc not found (put the NVRTC lib directory on LD_LIBRARY_PATH)");
        return;
    }
    for arch in [None, Some("compute_80")] {
        if let Err(e) = gpu::cuda::compile_kernels(arch) {
            panic!("{arch:?}: {e}");
        }
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
