//! `tq kernels check`: run the bundled GPU decode kernels on the conformance vectors and on random
//! tensors of real shapes, compare with the CPU reference, exit non-zero beyond tolerance.

use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use tq::error::Result;
use tq::gpu::kernels_check::{self, KernelsCheckFlags};
use tq::gpu::BackendKind;

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
        KernelsCommand::Check(c) => kernels_check::run(&flags(c), &mut |s| print!("{s}")),
    }
}

/// The flags as the library's plain values.
fn flags(a: CheckArgs) -> KernelsCheckFlags {
    KernelsCheckFlags {
        backend: match a.backend {
            BackendArg::Auto => None,
            BackendArg::Cuda => Some(BackendKind::Cuda),
            BackendArg::Metal => Some(BackendKind::Metal),
            BackendArg::Wgpu => Some(BackendKind::Wgpu),
            BackendArg::Cpu => Some(BackendKind::Cpu),
        },
        types: a.types,
        conformance: a.conformance,
        quick: a.quick,
        bench: a.bench,
        cuda_model: a.cuda_model,
    }
}
