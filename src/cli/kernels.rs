//! `tq kernels check`: run the bundled GPU decode kernels on the conformance vectors and on random
//! tensors of real shapes, compare with the CPU reference, exit non-zero beyond tolerance.

use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use tq::error::{Error, Result};
use tq::gpu::{self, BackendKind, CheckOptions, OpenError};
use tq::types::TensorType;

#[derive(Args)]
pub struct KernelsArgs {
    #[command(subcommand)]
    pub command: KernelsCommand,
}

#[derive(Subcommand)]
pub enum KernelsCommand {
    /// Run the GPU kernels and compare them with the CPU reference (bit-exact dequantize;
    /// mat-vec and Q·K within a stated relative bound). Exit 2 when a kernel is out of tolerance.
    Check(CheckArgs),
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// Every backend built in and present (CUDA, Metal, wgpu); says what it skipped and why.
    Auto,
    Cuda,
    Metal,
    Wgpu,
    /// The kernels' arithmetic emulated on the CPU (harness self-test, no GPU).
    Cpu,
}

#[derive(Args)]
pub struct CheckArgs {
    /// Which backend runs the kernels.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendArg,
    /// Types to check (comma-separated; default: tq4_1s,tq3_1s,turbo2,turbo3,turbo4,tq2_r,tq2_t).
    #[arg(long, value_delimiter = ',')]
    pub types: Vec<String>,
    /// Directory of the conformance vectors (default: $TQ_CONFORMANCE, else shared/conformance
    /// found beside the current directory or the source tree).
    #[arg(long)]
    pub conformance: Option<PathBuf>,
    /// Smaller random tensors (seconds instead of minutes on a software device).
    #[arg(long)]
    pub quick: bool,
    /// Also time the dequantize kernels on 16 Mi values (GB/s vs the device's bandwidth).
    #[arg(long)]
    pub bench: bool,
    /// Also print the CPU model of the CUDA TQ paths (q8_0 at load / native int8) against the
    /// reference, on SmolLM2 shapes.
    #[arg(long)]
    pub cuda_model: bool,
}

pub fn run(a: KernelsArgs) -> Result<()> {
    match a.command {
        KernelsCommand::Check(c) => check(c),
    }
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

fn check(a: CheckArgs) -> Result<()> {
    let types = parse_types(&a.types)?;
    // tq2_t's harness reads no vector file (it has none): check against another type's.
    let with_file = types.iter().find(|t| **t != TensorType::TQ2T);
    let conformance_dir = match a.conformance {
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
            Some(d)
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
        BackendArg::Auto => vec![BackendKind::Cuda, BackendKind::Metal, BackendKind::Wgpu],
        BackendArg::Cuda => vec![BackendKind::Cuda],
        BackendArg::Metal => vec![BackendKind::Metal],
        BackendArg::Wgpu => vec![BackendKind::Wgpu],
        BackendArg::Cpu => vec![BackendKind::Cpu],
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
                    println!("{why}");
                    println!("{}: FAILED: {f}", kind.name());
                    failed += 1;
                    continue;
                }
                if a.backend == BackendArg::Auto {
                    println!("{why}");
                    skipped.push(why);
                    continue;
                }
                return Err(Error::Unsupported(why));
            }
            // Present but broken (a kernel does not compile, a pipeline or driver error): a
            // failure in every mode.
            Err(OpenError::Failed(e)) => {
                if a.backend != BackendArg::Auto {
                    return Err(e);
                }
                println!("{}: FAILED to open: {e}", kind.name());
                failed += 1;
                continue;
            }
        };
        let rep = gpu::check(backend.as_mut(), &opts)?;
        print!("{}", gpu::format_report(&rep));
        ran += 1;
        if !rep.pass() {
            failed += 1;
        }
    }
    if a.cuda_model {
        print_cuda_model(&types)?;
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

/// The CUDA models' worst error relative to Σ|w·x| and RMS error relative to |y|, per path.
fn print_cuda_model(types: &[TensorType]) -> Result<()> {
    use tq::numerics::cuda_native::{matvec, CudaTqPath};
    let mut rng = gpu::Rng(0x6375_6461);
    println!("CUDA TQ paths, CPU model vs CPU reference (err/S = |y - y_ref| / sum|w*x|):");
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
                println!(
                    "  {:<7} {:<18} {:<32} max err/S {:>9.3e}  rms err/rms y {:>9.3e}",
                    ty.name(),
                    s.name,
                    path.name(),
                    worst,
                    (se / sy).sqrt()
                );
            }
        }
    }
    Ok(())
}
