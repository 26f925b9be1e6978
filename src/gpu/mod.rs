//! GPU decode kernels and the parity harness that holds them to the CPU reference (issue 8).
//!
//! The kernels are plain text files under `kernels/` (CUDA C++, Metal Shading Language, WGSL),
//! embedded in the binary ([`sources`]) and compiled at run time by the driver: NVRTC for CUDA
//! (through `cudarc`, loaded dynamically), `newLibraryWithSource` for Metal, naga + the
//! Vulkan/Metal/DX12 driver for WGSL (through `wgpu`). Each backend sits behind a cargo feature;
//! without any, this module still builds and its harness runs on [`CpuEmulation`], so the harness
//! logic is tested on every build.
//!
//! Kernels per type (FORMATS.md §2–§3):
//! - TQ4_1S, TQ3_1S: row dequantize (centroid × half scale, inverse 32-point RHT) and a mat-vec
//!   that rotates the activation blocks instead (`W·x = (C[idx]⊙d)·forward(x)` block by block).
//! - turbo2/3/4: block dequantize (rotated domain) and the Q·K dot with a pre-rotated query.
//! - tq2_r (the seed design's 2-bit weights, FORMATS.md §6): block decode in the rotated domain
//!   (tq2_r blocks or the design's own split layout, [`TwoBitLayout`]), the whole-row rotation
//!   (`R·x` for the mat-vec's input, `Rᵀ` to decode rows: one workgroup per row up to
//!   [`ROTATE_MAX`], a multi-pass path above) and a word-oriented 2-bit GEMV over the rotated
//!   input.
//! - tq2_t (issue 19, trellis-coded 2-bit on the same rotation): block decode in the rotated
//!   domain (each value's tail-biting state read from its block, the 1MAD codeword, × the scale
//!   byte) and a GEMV over the rotated input; the rotation is tq2_r's kernels.
//!
//! Layout of the room:
//! - `kernels.rs`: the one table of kernel entries (entry point, file, launch geometry per type
//!   and operation) that every backend reads;
//! - `device/` (by operation: dequant, matvec, kv, twobit, rotate, timing): the `Device` trait a backend implements (upload / launch / download / timing)
//!   and [`Backend`], the kernels as the harness calls them, implemented once over `Device` (size
//!   checks, table lookups, launch sequences);
//! - `linear.rs`: [`Linear`], weights resident on a device for repeated mat-muls (the model
//!   runtime's `--backend`), opened with [`open_linear`];
//! - `cuda.rs`, `metal.rs`, `wgpu.rs`, `cpu.rs`: the devices (the CPU emulation is one more);
//! - `turbo_spec.rs`: [`TurboSpec`], the turbo layouts and codebooks the kernels take;
//! - `harness/`: [`check`] and its comparisons, test data and report, and `tq kernels check`
//!   over the requested backends ([`kernels_check`]).
//!
//! The harness ([`check`]) runs every kernel on the conformance vectors and on random tensors of
//! real shapes and compares with the CPU reference:
//! - dequantize must be **bit-exact** (NaN where the reference gives NaN counts as equal);
//! - mat-vec and Q·K sum in another order than the reference (f64 dot of the CPU-dequantized row)
//!   and must satisfy `|y − y_ref| ≤ DOT_REL_BOUND · Σ_j |w_j·x_j|` per output.
//!
//! The CPU model of what the fork's CUDA backend computes for TQ weights is
//! `numerics::cuda_native`.

mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
mod harness;
mod kernels;
mod linear;
#[cfg(all(feature = "metal", target_os = "macos"))]
pub mod metal;
pub mod sources;
mod turbo_spec;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use self::cpu::{rotated_weight, CpuEmulation};
pub use self::device::{Backend, RotatePath, TwoBit, TwoBitLayout};
pub use self::harness::compare::{
    compare_dots, compare_exact, ulp_distance, KernelKind, KernelResult, Tolerance, DOT_REL_BOUND,
};
pub use self::harness::data::{
    conformance_file, dots_of, find_conformance_dir, kv_shapes, load_conformance,
    random_activation, random_weights, reference_dots, rotate_query, rotate_query_groups,
    smollm2_weight_shapes, Conformance, Rng, Shape,
};
pub use self::harness::job as kernels_check;
pub use self::harness::report::format_report;
pub(crate) use self::harness::tq2r::{is_hadamard, row_decode};
pub use self::harness::{check, CheckOptions, MatvecTime, Report, Throughput};
pub use self::kernels::{has_matmul, MATMUL_TOKENS, ROTATE_MAX, TURBO_QK_THREADS};
pub use self::linear::{Linear, WeightId};
pub use self::turbo_spec::{turbo_specs, TurboSpec};

use crate::error::Error;
use crate::types::TensorType;

/// The TurboQuant types that have GPU kernels.
pub const KERNEL_TYPES: [TensorType; 7] = [
    TensorType::TQ4_1S,
    TensorType::TQ3_1S,
    TensorType::Turbo2,
    TensorType::Turbo3,
    TensorType::Turbo4,
    TensorType::TQ2R,
    TensorType::TQ2T,
];

/// Why a backend could not be opened: absent (not built in, library or device not found: `auto`
/// skips it) or failed (present but broken: a kernel compile or pipeline error, a driver error;
/// `auto` counts it as a failure).
#[derive(Debug)]
pub enum OpenError {
    Absent(String),
    Failed(Error),
}

impl OpenError {
    pub fn is_absent(&self) -> bool {
        matches!(self, OpenError::Absent(_))
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Absent(s) => f.write_str(s),
            OpenError::Failed(e) => write!(f, "{e}"),
        }
    }
}

impl From<OpenError> for Error {
    fn from(e: OpenError) -> Error {
        match e {
            OpenError::Absent(s) => Error::Unsupported(s),
            OpenError::Failed(e) => e,
        }
    }
}

impl From<Error> for OpenError {
    /// Any error after the backend was found is a failure.
    fn from(e: Error) -> OpenError {
        OpenError::Failed(e)
    }
}

/// Which GPU API runs the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Cuda,
    Metal,
    Wgpu,
    /// The CPU emulation of the kernels' arithmetic (harness self-test; no GPU).
    Cpu,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Metal => "metal",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cpu => "cpu-emulation",
        }
    }
}

/// What an opened device is handed out as: [`Backend`] (the harness) or [`Linear`] (resident
/// weights for the model runtime).
trait Wrap {
    type Out;
    fn wrap<D: device::Device + 'static>(d: D) -> Self::Out;
}

struct AsBackend;
impl Wrap for AsBackend {
    type Out = Box<dyn Backend>;
    fn wrap<D: device::Device + 'static>(d: D) -> Box<dyn Backend> {
        Box::new(d)
    }
}

struct AsLinear;
impl Wrap for AsLinear {
    type Out = Box<dyn Linear>;
    fn wrap<D: device::Device + 'static>(d: D) -> Box<dyn Linear> {
        Box::new(linear::Resident::new(d))
    }
}

/// Open a backend by name; `Err` says why it is not available (absent: `auto` skips it) or why it
/// failed (present but a kernel does not compile, ...: `auto` counts a failure).
pub fn open_backend(kind: BackendKind) -> std::result::Result<Box<dyn Backend>, OpenError> {
    open::<AsBackend>(kind)
}

/// Open a backend for mat-muls with resident weights ([`Linear`]); errors as [`open_backend`].
pub fn open_linear(kind: BackendKind) -> std::result::Result<Box<dyn Linear>, OpenError> {
    open::<AsLinear>(kind)
}

fn open<W: Wrap>(kind: BackendKind) -> std::result::Result<W::Out, OpenError> {
    match kind {
        BackendKind::Cpu => Ok(W::wrap(CpuEmulation)),
        BackendKind::Wgpu => {
            #[cfg(feature = "wgpu")]
            {
                Ok(W::wrap(wgpu::WgpuBackend::new()?))
            }
            #[cfg(not(feature = "wgpu"))]
            {
                Err(OpenError::Absent(
                    "wgpu: not built in; rebuild with `--features wgpu`".into(),
                ))
            }
        }
        BackendKind::Cuda => {
            #[cfg(feature = "cuda")]
            {
                Ok(W::wrap(cuda::CudaBackend::new()?))
            }
            #[cfg(not(feature = "cuda"))]
            {
                Err(OpenError::Absent(
                    "cuda: not built in; rebuild with `--features cuda`".into(),
                ))
            }
        }
        BackendKind::Metal => {
            #[cfg(all(feature = "metal", target_os = "macos"))]
            {
                Ok(W::wrap(metal::MetalBackend::new()?))
            }
            #[cfg(not(all(feature = "metal", target_os = "macos")))]
            {
                Err(OpenError::Absent(if cfg!(target_os = "macos") {
                    "metal: not built in; rebuild with `--features metal`".into()
                } else {
                    "metal: macOS only".into()
                }))
            }
        }
    }
}
