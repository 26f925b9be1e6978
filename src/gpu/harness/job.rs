//! `tq kernels check` as one call ([`run`]): the flags as plain values ([`KernelsCheckFlags`]),
//! every requested backend opened and held to the CPU reference with [`check`](super::check)
//! (an absent one skipped under `auto`, with why), and with `--cuda-model` the CPU model of the
//! fork's CUDA TQ paths against the reference. The report goes, as it is made, to the caller's
//! `out` (the CLI prints it on stdout).

use crate::error::{Error, Result};
use crate::gpu::{self, BackendKind, CheckOptions, OpenError};
use crate::types::TensorType;
use std::path::PathBuf;

/// The flags of `tq kernels check` as plain values.
#[derive(Clone, Debug, Default)]
pub struct KernelsCheckFlags {
    /// The backend that runs the kernels; `None`: auto (every backend built in and present:
    /// CUDA, Metal, wgpu; an absent one is skipped with the reason).
    pub backend: Option<BackendKind>,
    /// Type names (empty: every type with kernels).
    pub types: Vec<String>,
    pub conformance: Option<PathBuf>,
    pub quick: bool,
    pub bench: bool,
    pub cuda_model: bool,
}

fn parse_types(names: &[String]) -> Result<Vec<TensorType>> {
    if names.is_empty() {
        return Ok(gpu::KERNEL_TYPES.to_vec());
    }
    names
        .iter()
        .map(|n| {
            TensorType::from_name(n.trim())
                .filter(|t| gpu::KERNEL_TYPES.contains(t))
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "--types: '{n}' has no GPU kernel (choose from tq4_1s, tq3_1s, turbo2, turbo3, turbo4, tq2_r, tq2_t)"
                    ))
                })
        })
        .collect()
}

/// Why CUDA is absent, with the NVRTC compile check when NVRTC itself is present: the skip
/// line, and the NVRTC error when it rejects a kernel (a failure even though no GPU is here).
fn cuda_absent(msg: &str) -> (String, Option<String>) {
    #[cfg(feature = "cuda")]
    {
        if !gpu::cuda::libcuda_present() {
            let (nvrtc, failure) = match gpu::cuda::compile_kernels(None) {
                Ok(_) => (
                    match gpu::cuda::nvrtc_version() {
                        Some((a, b)) => format!(
                            "; kernels compile with NVRTC {a}.{b} for {}",
                            gpu::cuda::DEFAULT_ARCH
                        ),
                        None => "; kernels compile with NVRTC".into(),
                    },
                    None,
                ),
                Err(e) if gpu::cuda::nvrtc_present() => (String::new(), Some(e.to_string())),
                Err(_) => (String::new(), None),
            };
            return (format!("cuda: skipped (libcuda not found{nvrtc})"), failure);
        }
    }
    (format!("cuda: skipped ({})", strip(msg, "cuda: ")), None)
}

fn strip(s: &str, prefix: &str) -> String {
    s.strip_prefix(prefix).unwrap_or(s).to_string()
}

/// Run `tq kernels check`, handing each part of the report to `out` as it is made. An error when
/// a backend failed (a kernel out of tolerance, or one that did not open), when a named backend
/// is absent, or when no backend ran.
pub fn run(a: &KernelsCheckFlags, out: &mut dyn FnMut(&str)) -> Result<()> {
    let types = parse_types(&a.types)?;
    // tq2_t's harness reads no vector file (it has none): check against another type's.
    let with_file = types.iter().find(|t| **t != TensorType::TQ2T);
    let conformance_dir = match &a.conformance {
        Some(d) => {
            if let Some(&t) = with_file {
                if !d.join(gpu::conformance_file(t)).exists() {
                    return Err(Error::Usage(format!(
                        "--conformance {}: no {} there",
                        d.display(),
                        gpu::conformance_file(t)
                    )));
                }
            }
            Some(d.clone())
        }
        None => gpu::find_conformance_dir(),
    };
    let opts = CheckOptions {
        types: types.clone(),
        conformance_dir,
        quick: a.quick,
        bench: a.bench,
        ..Default::default()
    };
    let kinds: Vec<BackendKind> = match a.backend {
        None => vec![BackendKind::Cuda, BackendKind::Metal, BackendKind::Wgpu],
        Some(k) => vec![k],
    };
    let mut ran = 0;
    let mut failed = 0;
    let mut skipped = vec![];
    for kind in kinds {
        let mut backend = match gpu::open_backend(kind) {
            Ok(b) => b,
            // Absent (not built in, no library, no device): `auto` skips it.
            Err(OpenError::Absent(msg)) => {
                let (why, failure) = match kind {
                    BackendKind::Cuda => cuda_absent(&msg),
                    _ => (
                        format!(
                            "{}: skipped ({})",
                            kind.name(),
                            strip(&msg, &format!("{}: ", kind.name()))
                        ),
                        None,
                    ),
                };
                if let Some(f) = failure {
                    out(&format!("{why}\n"));
                    out(&format!("{}: FAILED: {f}\n", kind.name()));
                    failed += 1;
                    continue;
                }
                if a.backend.is_none() {
                    out(&format!("{why}\n"));
                    skipped.push(why);
                    continue;
                }
                return Err(Error::Unsupported(why));
            }
            // Present but broken (a kernel does not compile, a pipeline or driver error): a
            // failure in every mode.
            Err(OpenError::Failed(e)) => {
                if a.backend.is_some() {
                    return Err(e);
                }
                out(&format!("{}: FAILED to open: {e}\n", kind.name()));
                failed += 1;
                continue;
            }
        };
        let rep = gpu::check(backend.as_mut(), &opts)?;
        out(&gpu::format_report(&rep));
        ran += 1;
        if !rep.pass() {
            failed += 1;
        }
    }
    if a.cuda_model {
        cuda_model(&types, out)?;
    }
    if failed > 0 {
        return Err(Error::Unsupported(format!(
            "{failed} backend(s) failed: a kernel out of tolerance or a backend that did not \
             open (see the FAIL/FAILED lines above)"
        )));
    }
    if ran == 0 {
        return Err(Error::Unsupported(format!(
            "no GPU backend available ({})",
            skipped.join("; ")
        )));
    }
    Ok(())
}

/// The CUDA models' worst error relative to Σ|w·x| and RMS error relative to |y|, per path, to
/// `out` line by line.
fn cuda_model(types: &[TensorType], out: &mut dyn FnMut(&str)) -> Result<()> {
    use crate::numerics::cuda_native::{matvec, CudaTqPath};
    let mut rng = gpu::Rng(0x6375_6461);
    out("CUDA TQ paths, CPU model vs CPU reference (err/S = |y - y_ref| / sum|w*x|):\n");
    for &ty in types.iter().filter(|t| t.is_tq_weight()) {
        for s in gpu::smollm2_weight_shapes() {
            let w = gpu::random_weights(ty, s.rows, s.cols, &mut rng)?;
            let x = gpu::random_activation(s.cols, &mut rng);
            let (dots, sums) = gpu::reference_dots(ty, &w, s.rows, s.cols, &x)?;
            for path in [CudaTqPath::LoadQ8_0, CudaTqPath::Native] {
                let y = matvec(path, ty, &w, s.rows, s.cols, &x)?;
                let (mut worst, mut se, mut sy) = (0f64, 0f64, 0f64);
                for ((g, r), s) in y.iter().zip(&dots).zip(&sums) {
                    let d = *g as f64 - r;
                    worst = worst.max(d.abs() / s);
                    se += d * d;
                    sy += r * r;
                }
                out(&format!(
                    "  {:<7} {:<18} {:<32} max err/S {:>9.3e}  rms err/rms y {:>9.3e}\n",
                    ty.name(),
                    s.name,
                    path.name(),
                    worst,
                    (se / sy).sqrt()
                ));
            }
        }
    }
    Ok(())
}
