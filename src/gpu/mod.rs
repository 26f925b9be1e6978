//! GPU decode kernels and the parity harness that holds them to the CPU reference (issue 8).
//!
//! The kernels are plain text files under `kernels/` (CUDA C++, Metal Shading Language, WGSL),
//! embedded in the binary and compiled at run time by the driver: NVRTC for CUDA (through
//! `cudarc`, loaded dynamically), `newLibraryWithSource` for Metal, naga + the Vulkan/Metal/DX12
//! driver for WGSL (through `wgpu`). Each backend sits behind a cargo feature; without any, this
//! module still builds and its harness runs on [`CpuEmulation`], so the harness logic is tested on
//! every build.
//!
//! Kernels per type (FORMATS.md §2–§3):
//! - TQ4_1S, TQ3_1S: row dequantize (centroid × half scale, inverse 32-point RHT) and a mat-vec
//!   that rotates the activation blocks instead (`W·x = (C[idx]⊙d)·forward(x)` block by block).
//! - turbo2/3/4: block dequantize (rotated domain) and the Q·K dot with a pre-rotated query.
//!
//! The harness ([`check`]) runs every kernel on the conformance vectors and on random tensors of
//! real shapes and compares with the CPU reference:
//! - dequantize must be **bit-exact** (NaN where the reference gives NaN counts as equal);
//! - mat-vec and Q·K sum in another order than the reference (f64 dot of the CPU-dequantized row)
//!   and must satisfy `|y − y_ref| ≤ DOT_REL_BOUND · Σ_j |w_j·x_j|` per output.
//!
//! [`cuda_native`] models, on the CPU, what the fork's CUDA backend computes for TQ weights (the
//! q8_0 conversion at load, or the native int8-centroid × q8_1 path), for `tq eval`.

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(all(feature = "metal", target_os = "macos"))]
pub mod metal;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use crate::error::{Error, Result};
use crate::types::tq as tqs;
use crate::types::turbo;
use crate::types::turbo::{turbo_codebook, Turbo4Table};
use crate::types::{dequantize as cpu_dequantize, TensorType};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The TurboQuant types that have GPU kernels.
pub const KERNEL_TYPES: [TensorType; 5] = [
    TensorType::TQ4_1S,
    TensorType::TQ3_1S,
    TensorType::Turbo2,
    TensorType::Turbo3,
    TensorType::Turbo4,
];

/// Per-output bound for mat-vec and Q·K: `|y − y_ref| ≤ DOT_REL_BOUND · Σ_j |w_j·x_j|`
/// (2^-16). f32 summation of n terms in any order is within `n·u` (u = 2^-24) of the exact sum
/// relative to `Σ|w·x|`; for the row lengths checked here (≤ 8192) a tree/strided order stays far
/// below 2^-16, and the rotation of the activation adds a few u. Measured values are printed.
pub const DOT_REL_BOUND: f64 = 1.0 / 65536.0;

/// Threads per key row of the turbo Q·K kernels in every backend. The CUDA and Metal kernels
/// reduce through `part[4]`, one partial per 32-wide warp/SIMD group, so they must be launched
/// with exactly this many threads (CUDA also declares `__launch_bounds__(128)`); WGSL's
/// `@workgroup_size(128)` fixes it in the source.
pub const TURBO_QK_THREADS: usize = 128;

/// Source texts of the bundled kernels (compiled at run time by each backend).
pub mod sources {
    pub const CUDA_COMMON: &str = include_str!("../../kernels/cuda/common.cuh");
    pub const CUDA_TQ: &str = include_str!("../../kernels/cuda/tq.cu");
    pub const CUDA_TURBO: &str = include_str!("../../kernels/cuda/turbo.cu");
    pub const METAL_COMMON: &str = include_str!("../../kernels/metal/common.metal");
    pub const METAL_TQ: &str = include_str!("../../kernels/metal/tq.metal");
    pub const METAL_TURBO: &str = include_str!("../../kernels/metal/turbo.metal");
    pub const WGSL_COMMON: &str = include_str!("../../kernels/wgsl/common.wgsl");
    pub const WGSL_TQ: &str = include_str!("../../kernels/wgsl/tq.wgsl");
    pub const WGSL_TURBO: &str = include_str!("../../kernels/wgsl/turbo.wgsl");

    /// The text of `kernels/<lang>/<file>`: the embedded copy, or with `TQ_KERNELS_DIR=DIR` the
    /// file `DIR/<lang>/<file>` (to try a kernel edit without rebuilding; the harness and the
    /// `--backend auto` failure test use it). A file that cannot be read is an error.
    pub fn text(lang: &str, file: &str) -> crate::error::Result<String> {
        if let Some(dir) = std::env::var_os("TQ_KERNELS_DIR") {
            let p = std::path::Path::new(&dir).join(lang).join(file);
            return std::fs::read_to_string(&p).map_err(|e| crate::error::Error::io(&p, e));
        }
        Ok(match (lang, file) {
            ("cuda", "common.cuh") => CUDA_COMMON,
            ("cuda", "tq.cu") => CUDA_TQ,
            ("cuda", "turbo.cu") => CUDA_TURBO,
            ("metal", "common.metal") => METAL_COMMON,
            ("metal", "tq.metal") => METAL_TQ,
            ("metal", "turbo.metal") => METAL_TURBO,
            ("wgsl", "common.wgsl") => WGSL_COMMON,
            ("wgsl", "tq.wgsl") => WGSL_TQ,
            ("wgsl", "turbo.wgsl") => WGSL_TURBO,
            _ => {
                return Err(crate::error::Error::Unsupported(format!(
                    "no bundled kernel source {lang}/{file}"
                )))
            }
        }
        .to_string())
    }
}

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

/// A turbo block layout with its codebook: what the turbo kernels are parameterized by.
#[derive(Clone, Debug, PartialEq)]
pub struct TurboSpec {
    pub ty: TensorType,
    pub layout: turbo::TurboLayout,
    /// Ascending, `2^bits` entries; passed to the kernels as a buffer.
    pub codebook: Vec<f32>,
    /// The `--turbo-codebook` choices that give this layout and codebook (`may`, `fork`, ...),
    /// or `registry` for the stock May-2026 types.
    pub tables: Vec<&'static str>,
}

impl TurboSpec {
    /// The registry's type: the May-2026 128-value layout and CB2/CB3/CB4.
    pub fn stock(ty: TensorType) -> Result<TurboSpec> {
        let (layout, cb): (_, &[f32]) = match ty {
            TensorType::Turbo2 => (turbo::TurboLayout::MAY[0], &turbo::CB2),
            TensorType::Turbo3 => (turbo::TurboLayout::MAY[1], &turbo::CB3),
            TensorType::Turbo4 => (turbo::TurboLayout::MAY[2], &turbo::CB4),
            _ => return Err(Error::Unsupported(format!("{ty}: not a turbo type"))),
        };
        Ok(TurboSpec {
            ty,
            layout,
            codebook: cb.to_vec(),
            tables: vec!["registry"],
        })
    }

    /// What `tq eval` / `tq kv` simulate for `ty` with `--turbo-codebook table` on `group`-value
    /// groups (64 for 64-wide heads): turbo4 has the 4-byte May header only with the May table
    /// (`model::kv::bits_per_value`), the codebook is `types::turbo::turbo_codebook`.
    pub fn simulated(ty: TensorType, table: Turbo4Table, group: usize) -> Result<TurboSpec> {
        let bits = match ty {
            TensorType::Turbo2 => 2,
            TensorType::Turbo3 => 3,
            TensorType::Turbo4 => 4,
            _ => return Err(Error::Unsupported(format!("{ty}: not a turbo type"))),
        };
        let header = if bits == 4 && table == Turbo4Table::May {
            4
        } else {
            2
        };
        Ok(TurboSpec {
            ty,
            layout: turbo::TurboLayout::new(bits, group, header),
            codebook: turbo_codebook(ty, table, group).to_vec(),
            tables: vec![table.name()],
        })
    }

    pub fn is_stock(&self) -> bool {
        TurboSpec::stock(self.ty)
            .is_ok_and(|s| s.layout == self.layout && s.codebook == self.codebook)
    }

    /// `g64 66B? ...`: group, block bytes, codebook choices.
    pub fn label(&self) -> String {
        format!(
            "g{} {}B cb={}",
            self.layout.group,
            self.layout.block_bytes(),
            self.tables.join("=")
        )
    }

    /// Refuse what the kernels cannot decode (bad layout, codebook of the wrong size, a row
    /// that is not whole groups), so no kernel reads out of bounds.
    pub fn validate(&self, bytes: usize, rows_cols: Option<(usize, usize)>) -> Result<()> {
        let l = &self.layout;
        if !l.is_valid() || self.codebook.len() != 1 << l.bits {
            return Err(Error::Unsupported(format!(
                "{}: unsupported turbo layout {l:?} with {} centroids",
                self.ty,
                self.codebook.len()
            )));
        }
        if bytes % l.block_bytes() != 0 {
            return Err(Error::Unsupported(format!(
                "{}: {bytes} bytes is not a whole number of {}-byte blocks",
                self.ty,
                l.block_bytes()
            )));
        }
        if let Some((rows, cols)) = rows_cols {
            if cols % l.group != 0 || rows * cols / l.group * l.block_bytes() != bytes {
                return Err(Error::Unsupported(format!(
                    "{}: {rows}x{cols} keys do not match {bytes} bytes of {}-value groups",
                    self.ty, l.group
                )));
            }
        }
        Ok(())
    }

    /// CPU reference dequantize.
    pub fn reference(&self, blocks: &[u8]) -> Vec<f32> {
        let mut out = vec![0f32; blocks.len() / self.layout.block_bytes() * self.layout.group];
        turbo::dequantize_blocks(&self.layout, &self.codebook, blocks, &mut out);
        out
    }

    /// CPU reference quantize of whole groups.
    pub fn quantize(&self, src: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; src.len() / self.layout.group * self.layout.block_bytes()];
        turbo::quantize_blocks(&self.layout, &self.codebook, src, &mut out);
        out
    }
}

/// Every turbo layout and codebook `tq` writes or simulates for `ty`: the registry's (first),
/// then `--turbo-codebook may|fork|head-dim` on 128- and 64-value groups, duplicates merged.
pub fn turbo_specs(ty: TensorType) -> Result<Vec<TurboSpec>> {
    let mut out = vec![TurboSpec::stock(ty)?];
    for group in [128, 64] {
        for table in [
            Turbo4Table::May,
            Turbo4Table::LloydMax,
            Turbo4Table::HeadDim,
        ] {
            let s = TurboSpec::simulated(ty, table, group)?;
            match out
                .iter_mut()
                .find(|o| o.layout == s.layout && o.codebook == s.codebook)
            {
                Some(o) => o.tables.push(table.name()),
                None => out.push(s),
            }
        }
    }
    Ok(out)
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

/// The kernels of one GPU backend. Byte buffers hold whole blocks back to back; rows of a
/// matrix are consecutive.
pub trait Backend {
    fn kind(&self) -> BackendKind;
    /// The device as the driver names it (e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`).
    fn device_name(&self) -> String;
    /// Dequantize whole blocks of `ty` (TQ: original domain; turbo: rotated domain).
    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>>;
    /// `y = W·x` for a TQ weight of `rows × cols` (rotating the activation, not the weight).
    fn matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<Vec<f32>>;
    /// `score[r] = q̂ · dequant(K[r])` for turbo keys of `rows × cols` in the registry's layout,
    /// `q̂` pre-rotated.
    fn qk_dot(
        &mut self,
        ty: TensorType,
        k: &[u8],
        rows: usize,
        cols: usize,
        q_rot: &[f32],
    ) -> Result<Vec<f32>> {
        self.turbo_qk(&TurboSpec::stock(ty)?, k, rows, cols, q_rot)
    }
    /// Dequantize turbo blocks of any layout and codebook (rotated domain).
    fn turbo_dequantize(&mut self, spec: &TurboSpec, blocks: &[u8]) -> Result<Vec<f32>>;
    /// Q·K for turbo keys of any layout and codebook: `rows × cols`, cols a multiple of the group.
    fn turbo_qk(
        &mut self,
        spec: &TurboSpec,
        k: &[u8],
        rows: usize,
        cols: usize,
        q_rot: &[f32],
    ) -> Result<Vec<f32>>;
    /// Seconds per dequantize of `blocks` with the data resident on the device (best of
    /// `iters`, kernel time only where the API allows, else submit-to-completion).
    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64>;
    /// Values to decode in the throughput run: 16 Mi by default (software devices); GPU backends
    /// size it to a working set well above their L2 (≥ 256 MiB of blocks where memory allows).
    fn bench_values(&self, ty: TensorType) -> usize {
        let _ = ty;
        1 << 24
    }
    /// Peak memory bandwidth of the device in GB/s, when the API reports it.
    fn peak_bandwidth_gbs(&self) -> Option<f64> {
        None
    }
}

/// Open a backend by name; `Err` says why it is not available (absent: `auto` skips it) or why it
/// failed (present but a kernel does not compile, ...: `auto` counts a failure).
pub fn open_backend(kind: BackendKind) -> std::result::Result<Box<dyn Backend>, OpenError> {
    match kind {
        BackendKind::Cpu => Ok(Box::new(CpuEmulation)),
        BackendKind::Wgpu => {
            #[cfg(feature = "wgpu")]
            {
                Ok(Box::new(wgpu::WgpuBackend::new()?))
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
                Ok(Box::new(cuda::CudaBackend::new()?))
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
                Ok(Box::new(metal::MetalBackend::new()?))
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

// ---------------------------------------------------------------------------------------------
// Test data
// ---------------------------------------------------------------------------------------------

/// SplitMix64 with Box–Muller Gaussians (the conformance generator's PRNG; inputs only).
pub use crate::math::splitmix::SplitMix64 as Rng;
pub use crate::numerics::sample::{dots_of, random_activation, random_weights, reference_dots};

/// A weight or KV tensor shape to test on.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub rows: usize,
    pub cols: usize,
}

/// SmolLM2-135M's weight shapes (hidden 576, 9 heads / 3 KV heads of 64, FFN 1536), ggml
/// order: `rows` output features of `cols` inputs.
pub fn smollm2_weight_shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "smollm2.attn_q",
            rows: 576,
            cols: 576,
        },
        Shape {
            name: "smollm2.attn_k",
            rows: 192,
            cols: 576,
        },
        Shape {
            name: "smollm2.ffn_up",
            rows: 1536,
            cols: 576,
        },
        Shape {
            name: "smollm2.ffn_down",
            rows: 576,
            cols: 1536,
        },
    ]
}

/// KV-cache shapes for turbo: one row per (token, KV head), `cols` = head dim (128: Llama-3-8B,
/// 8 KV heads; 256: Gemma-style heads, two groups per row).
pub fn kv_shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "llama3-8b.k_cache[512 tok x 8 heads, hd 128]",
            rows: 4096,
            cols: 128,
        },
        Shape {
            name: "gemma.k_cache[128 tok x 4 heads, hd 256]",
            rows: 512,
            cols: 256,
        },
    ]
}

/// Forward turbo rotation of a query row (each 128-group separately, as the engine rotates Q).
pub fn rotate_query(q: &[f32]) -> Vec<f32> {
    rotate_query_groups(q, turbo::QK_TURBO)
}

/// The same for `group`-value groups (64: first 64 signs and 1/8, FORMATS.md §3).
pub fn rotate_query_groups(q: &[f32], group: usize) -> Vec<f32> {
    let mut out = q.to_vec();
    for g in out.chunks_exact_mut(group) {
        turbo::rotate_forward_n(g);
    }
    out
}

/// One conformance file: every case's packed row, back to back.
pub struct Conformance {
    pub file: PathBuf,
    pub cases: Vec<(String, Vec<u8>)>,
    /// Each case's f32 input (`input_f32`; empty when the file has none).
    pub inputs: Vec<Vec<f32>>,
}

/// The conformance file name for a type (`tq4_1s.json`, `turbo3_0.json`).
pub fn conformance_file(ty: TensorType) -> String {
    if ty.is_turbo() {
        format!("{}_0.json", ty.name())
    } else {
        format!("{}.json", ty.name())
    }
}

/// Where the conformance vectors are: `$TQ_CONFORMANCE`, then `shared/conformance` and
/// `../shared/conformance` beside the current directory and the source tree.
pub fn find_conformance_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("TQ_CONFORMANCE") {
        return Some(PathBuf::from(d));
    }
    let mut bases = vec![];
    if let Ok(c) = std::env::current_dir() {
        bases.push(c);
    }
    bases.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for b in bases {
        for rel in [
            "shared/conformance",
            "../shared/conformance",
            "../../shared/conformance",
        ] {
            let p = b.join(rel);
            if p.join("tq4_1s.json").exists() {
                return Some(p);
            }
        }
    }
    None
}

/// Read the packed rows of a conformance file.
pub fn load_conformance(dir: &Path, ty: TensorType) -> Result<Conformance> {
    let file = dir.join(conformance_file(ty));
    let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
    let bad = |what: &str| {
        Error::bad_input(
            &file,
            format!("{what} (not a turboquant-conformance/v1 file?)"),
        )
    };
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|_| bad("not JSON"))?;
    if doc["block_bytes"].as_u64() != Some(ty.block_bytes() as u64) {
        return Err(bad("block_bytes does not match the type"));
    }
    let mut cases = vec![];
    let mut inputs = vec![];
    for c in doc["cases"].as_array().ok_or_else(|| bad("no cases"))? {
        let input = match c["input_f32"].as_array() {
            Some(a) => a
                .iter()
                .map(|h| {
                    h.as_str()
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                        .map(f32::from_bits)
                })
                .collect::<Option<Vec<f32>>>()
                .ok_or_else(|| bad("bad input_f32"))?,
            None => vec![],
        };
        inputs.push(input);
        let id = c["id"].as_str().unwrap_or("?").to_string();
        let hex = c["expected_bytes"]
            .as_str()
            .ok_or_else(|| bad("case without expected_bytes"))?;
        if hex.len() % 2 != 0 {
            return Err(bad("odd hex length"));
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|_| bad("bad hex"))?;
        if bytes.len() % ty.block_bytes() != 0 {
            return Err(bad("a case is not a whole number of blocks"));
        }
        cases.push((id, bytes));
    }
    Ok(Conformance {
        file,
        cases,
        inputs,
    })
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

/// The kind of kernel checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    Dequantize,
    MatVec,
    QkDot,
}

impl KernelKind {
    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Dequantize => "dequantize",
            KernelKind::MatVec => "matvec",
            KernelKind::QkDot => "qk_dot",
        }
    }
}

/// What a kernel is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// Every value bit-identical (NaN where the reference is NaN).
    BitExact,
    /// `|y − y_ref| ≤ bound · Σ|w·x|` per output.
    RelativeToAbsSum(f64),
}

impl std::fmt::Display for Tolerance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tolerance::BitExact => f.write_str("bit-exact"),
            Tolerance::RelativeToAbsSum(b) => write!(f, "|err| <= {b:.3e}*sum|w*x|"),
        }
    }
}

/// The outcome of one kernel on one data set.
#[derive(Clone, Debug)]
pub struct KernelResult {
    pub ty: TensorType,
    pub kind: KernelKind,
    /// Data set: `conformance`, `random-bytes`, or a shape name.
    pub data: String,
    pub values: usize,
    /// Values bit-identical to the reference (NaN ↔ NaN counts).
    pub bit_exact: usize,
    /// Largest |gpu − ref| over values where both are finite.
    pub max_abs: f64,
    /// Largest |gpu − ref| / |ref| over finite non-zero references.
    pub max_rel: f64,
    /// Largest distance in f32 ulps over finite values (dequantize only).
    pub max_ulp: u64,
    /// Largest |gpu − ref| / Σ|w·x| (mat-vec and Q·K only).
    pub max_err_over_abs_sum: f64,
    /// Values where one side is non-finite and the other is not (or NaN vs inf).
    pub class_mismatch: usize,
    pub tolerance: Tolerance,
    pub pass: bool,
    /// First failing value, for the message.
    pub first_failure: Option<String>,
}

/// Distance in ulps between two finite f32 (0 for +0 vs −0 is *not* granted: they differ by 1).
pub fn ulp_distance(a: f32, b: f32) -> u64 {
    fn key(v: f32) -> i64 {
        let b = v.to_bits() as i32 as i64;
        if b < 0 {
            i64::from(i32::MIN) - b - 1
        } else {
            b
        }
    }
    (key(a) - key(b)).unsigned_abs()
}

/// Compare a dequantize output with the CPU reference, bit for bit.
pub fn compare_exact(ty: TensorType, data: &str, got: &[f32], want: &[f32]) -> KernelResult {
    let mut r = KernelResult {
        ty,
        kind: KernelKind::Dequantize,
        data: data.to_string(),
        values: want.len(),
        bit_exact: 0,
        max_abs: 0.0,
        max_rel: 0.0,
        max_ulp: 0,
        max_err_over_abs_sum: 0.0,
        class_mismatch: 0,
        tolerance: Tolerance::BitExact,
        pass: got.len() == want.len(),
        first_failure: None,
    };
    if got.len() != want.len() {
        r.first_failure = Some(format!("{} values, expected {}", got.len(), want.len()));
        return r;
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        if same {
            r.bit_exact += 1;
            continue;
        }
        if g.is_finite() && w.is_finite() {
            let d = (g as f64 - w as f64).abs();
            r.max_abs = r.max_abs.max(d);
            if w != 0.0 {
                r.max_rel = r.max_rel.max(d / (w as f64).abs());
            }
            r.max_ulp = r.max_ulp.max(ulp_distance(g, w));
        } else {
            r.class_mismatch += 1;
        }
        if r.first_failure.is_none() {
            r.first_failure = Some(format!(
                "value {i}: got {g:e} ({:08x}), reference {w:e} ({:08x})",
                g.to_bits(),
                w.to_bits()
            ));
        }
        r.pass = false;
    }
    r
}

/// Compare dot products (one per row) with f64 references and their `Σ|w·x|` scales.
pub fn compare_dots(
    ty: TensorType,
    kind: KernelKind,
    data: &str,
    got: &[f32],
    want: &[f64],
    abs_sum: &[f64],
    bound: f64,
) -> KernelResult {
    let mut r = KernelResult {
        ty,
        kind,
        data: data.to_string(),
        values: want.len(),
        bit_exact: 0,
        max_abs: 0.0,
        max_rel: 0.0,
        max_ulp: 0,
        max_err_over_abs_sum: 0.0,
        class_mismatch: 0,
        tolerance: Tolerance::RelativeToAbsSum(bound),
        pass: got.len() == want.len(),
        first_failure: None,
    };
    if got.len() != want.len() {
        r.first_failure = Some(format!("{} outputs, expected {}", got.len(), want.len()));
        return r;
    }
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(abs_sum).enumerate() {
        if (w as f32).to_bits() == g.to_bits() {
            r.bit_exact += 1;
        }
        let (g64, ok);
        if !g.is_finite() || !w.is_finite() {
            ok = (g.is_nan() && w.is_nan()) || (g as f64) == w;
            if !ok {
                r.class_mismatch += 1;
            }
        } else {
            g64 = g as f64;
            let d = (g64 - w).abs();
            r.max_abs = r.max_abs.max(d);
            if w != 0.0 {
                r.max_rel = r.max_rel.max(d / w.abs());
            }
            let e = if s > 0.0 {
                d / s
            } else if d == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            r.max_err_over_abs_sum = r.max_err_over_abs_sum.max(e);
            ok = e <= bound;
        }
        if !ok {
            r.pass = false;
            if r.first_failure.is_none() {
                r.first_failure = Some(format!(
                    "output {i}: got {g:e}, reference {w:e} (sum|w*x| = {s:e})"
                ));
            }
        }
    }
    r
}

fn cpu_reference(ty: TensorType, bytes: &[u8]) -> Result<Vec<f32>> {
    let n = bytes.len() / ty.block_bytes() * ty.block_size();
    let mut out = vec![0f32; n];
    cpu_dequantize(ty, bytes, &mut out, "reference")?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------------

/// What [`check`] runs.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    pub types: Vec<TensorType>,
    /// Directory with the conformance vectors (`None`: that part is skipped and reported).
    pub conformance_dir: Option<PathBuf>,
    /// Fewer/smaller random tensors (tests).
    pub quick: bool,
    /// Also time the dequantize kernels on a large tensor.
    pub bench: bool,
    pub seed: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            types: KERNEL_TYPES.to_vec(),
            conformance_dir: find_conformance_dir(),
            quick: false,
            bench: false,
            seed: 0x7167_7075,
        }
    }
}

/// Decode throughput of one type.
#[derive(Clone, Debug)]
pub struct Throughput {
    pub ty: TensorType,
    pub values: usize,
    pub seconds: f64,
    /// Bytes read (blocks) + bytes written (f32) per second, in GB/s.
    pub gbs: f64,
}

/// Everything [`check`] found.
#[derive(Clone, Debug)]
pub struct Report {
    pub backend: BackendKind,
    pub device: String,
    pub results: Vec<KernelResult>,
    pub notes: Vec<String>,
    pub throughput: Vec<Throughput>,
    pub peak_gbs: Option<f64>,
}

impl Report {
    pub fn pass(&self) -> bool {
        self.results.iter().all(|r| r.pass)
    }
}

/// Run every kernel of `opts.types` on `backend` and compare with the CPU reference.
pub fn check(backend: &mut dyn Backend, opts: &CheckOptions) -> Result<Report> {
    let mut rep = Report {
        backend: backend.kind(),
        device: backend.device_name(),
        results: vec![],
        notes: vec![],
        throughput: vec![],
        peak_gbs: backend.peak_bandwidth_gbs(),
    };
    let mut rng = Rng(opts.seed);
    for &ty in &opts.types {
        if !KERNEL_TYPES.contains(&ty) {
            return Err(Error::Unsupported(format!(
                "{ty}: no GPU kernel (kernels exist for tq4_1s, tq3_1s, turbo2, turbo3, turbo4)"
            )));
        }
        // 1. Conformance vectors: dequantize every case; dot every all-finite case.
        match &opts.conformance_dir {
            Some(dir) => {
                let conf = load_conformance(dir, ty)?;
                let all: Vec<u8> = conf
                    .cases
                    .iter()
                    .flat_map(|c| c.1.iter().copied())
                    .collect();
                let want = cpu_reference(ty, &all)?;
                let got = backend.dequantize(ty, &all)?;
                rep.results
                    .push(compare_exact(ty, "conformance", &got, &want));
                rep.results
                    .push(conformance_dots(backend, ty, &conf, &mut rng)?);
            }
            None => rep.notes.push(format!(
                "{ty}: conformance vectors not found (set TQ_CONFORMANCE or --conformance): skipped"
            )),
        }
        // 2. Random bytes: every scale bit pattern (subnormal, inf, NaN) and index.
        let nblk = if opts.quick { 2048 } else { 1 << 16 };
        let bytes = rng.bytes(nblk * ty.block_bytes());
        let want = cpu_reference(ty, &bytes)?;
        let got = backend.dequantize(ty, &bytes)?;
        rep.results
            .push(compare_exact(ty, "random-bytes", &got, &want));
        // 3. Real shapes: quantized Gaussian tensors, dequantize + dot.
        if ty.is_tq_weight() {
            let mut shapes = smollm2_weight_shapes();
            if opts.quick {
                shapes.truncate(2);
            }
            for s in shapes {
                let w = random_weights(ty, s.rows, s.cols, &mut rng)?;
                let want = cpu_reference(ty, &w)?;
                let got = backend.dequantize(ty, &w)?;
                rep.results.push(compare_exact(ty, s.name, &got, &want));
                let x = random_activation(s.cols, &mut rng);
                let (dots, sums) = reference_dots(ty, &w, s.rows, s.cols, &x)?;
                let got = backend.matvec(ty, &w, s.rows, s.cols, &x)?;
                rep.results.push(compare_dots(
                    ty,
                    KernelKind::MatVec,
                    s.name,
                    &got,
                    &dots,
                    &sums,
                    DOT_REL_BOUND,
                ));
            }
        } else {
            let mut shapes = kv_shapes();
            if opts.quick {
                shapes[0].rows = 512;
                shapes.truncate(2);
            }
            for s in shapes {
                let kv = random_weights(ty, s.rows, s.cols, &mut rng)?;
                let want = cpu_reference(ty, &kv)?;
                let got = backend.dequantize(ty, &kv)?;
                rep.results.push(compare_exact(ty, s.name, &got, &want));
                let q = rotate_query(&random_activation(s.cols, &mut rng));
                let (dots, sums) = reference_dots(ty, &kv, s.rows, s.cols, &q)?;
                let got = backend.qk_dot(ty, &kv, s.rows, s.cols, &q)?;
                rep.results.push(compare_dots(
                    ty,
                    KernelKind::QkDot,
                    s.name,
                    &got,
                    &dots,
                    &sums,
                    DOT_REL_BOUND,
                ));
            }
        }
        // 4. The other turbo layouts and codebooks `tq eval` / `tq kv` simulate.
        if !ty.is_tq_weight() {
            for spec in turbo_specs(ty)?.into_iter().filter(|s| !s.is_stock()) {
                check_turbo_variant(backend, &spec, opts, &mut rng, &mut rep)?;
            }
        }
        // 5. Throughput.
        if opts.bench {
            let values = backend.bench_values(ty);
            let bytes = random_weights_fast(ty, values, &mut rng);
            let secs = backend.time_dequantize(ty, &bytes, 10)?;
            let moved = bytes.len() as f64 + 4.0 * values as f64;
            rep.throughput.push(Throughput {
                ty,
                values,
                seconds: secs,
                gbs: moved / secs / 1e9,
            });
        }
    }
    Ok(rep)
}

/// One non-registry turbo layout/codebook: the conformance inputs re-quantized in that layout,
/// random bytes, and a KV cache of a real shape (SmolLM2's 64-wide heads for 64-value groups,
/// Llama-3-8B's for 128), through dequantize (bit-exact) and Q·K (relative bound).
fn check_turbo_variant(
    backend: &mut dyn Backend,
    spec: &TurboSpec,
    opts: &CheckOptions,
    rng: &mut Rng,
    rep: &mut Report,
) -> Result<()> {
    let ty = spec.ty;
    let g = spec.layout.group;
    let tag = |d: &str| format!("[{}] {d}", spec.label());
    let mut run = |rep: &mut Report,
                   data: &str,
                   bytes: &[u8],
                   rows: usize,
                   cols: usize,
                   rng: &mut Rng|
     -> Result<()> {
        let want = spec.reference(bytes);
        let got = backend.turbo_dequantize(spec, bytes)?;
        rep.results.push(compare_exact(ty, &tag(data), &got, &want));
        if rows == 0 {
            return Ok(());
        }
        // Rows whose decode is not all finite are left to the dequantize check.
        let finite: Vec<usize> = (0..rows)
            .filter(|r| want[r * cols..(r + 1) * cols].iter().all(|v| v.is_finite()))
            .collect();
        let rb = cols / g * spec.layout.block_bytes();
        let k: Vec<u8> = finite
            .iter()
            .flat_map(|r| bytes[r * rb..(r + 1) * rb].iter().copied())
            .collect();
        let w: Vec<f32> = finite
            .iter()
            .flat_map(|r| want[r * cols..(r + 1) * cols].iter().copied())
            .collect();
        let q = rotate_query_groups(&random_activation(cols, rng), g);
        let (dots, sums) = dots_of(&w, finite.len(), cols, &q);
        let got = backend.turbo_qk(spec, &k, finite.len(), cols, &q)?;
        rep.results.push(compare_dots(
            ty,
            KernelKind::QkDot,
            &tag(data),
            &got,
            &dots,
            &sums,
            DOT_REL_BOUND,
        ));
        Ok(())
    };
    // Conformance inputs, quantized in this layout by the CPU reference (`quantize_group`).
    if let Some(dir) = &opts.conformance_dir {
        let conf = load_conformance(dir, ty)?;
        let src: Vec<f32> = conf
            .inputs
            .iter()
            .filter(|x| !x.is_empty() && x.len() % g == 0)
            .flat_map(|x| x.iter().copied())
            .collect();
        if !src.is_empty() {
            let bytes = spec.quantize(&src);
            run(rep, "conformance inputs", &bytes, src.len() / g, g, rng)?;
        }
    }
    let nblk = if opts.quick { 1024 } else { 8192 };
    let bytes = rng.bytes(nblk * spec.layout.block_bytes());
    run(rep, "random-bytes", &bytes, 0, 0, rng)?;
    let s = if g == 64 {
        Shape {
            name: "smollm2.k_cache[512 tok x 3 heads, hd 64]",
            rows: 1536,
            cols: 64,
        }
    } else {
        Shape {
            name: "llama3-8b.k_cache[128 tok x 8 heads, hd 128]",
            rows: 1024,
            cols: 128,
        }
    };
    let rows = if opts.quick { s.rows / 4 } else { s.rows };
    let sigma = 0.02 + 0.05 * rng.uniform();
    let src: Vec<f32> = (0..rows * s.cols)
        .map(|_| (rng.gauss() * sigma) as f32)
        .collect();
    let bytes = spec.quantize(&src);
    run(rep, s.name, &bytes, rows, s.cols, rng)
}

/// Blocks for the throughput run: random indices with sane (finite, normal) scales; quantizing
/// 16 Mi values with the reference would take longer than the benchmark.
fn random_weights_fast(ty: TensorType, values: usize, rng: &mut Rng) -> Vec<u8> {
    let nb = values / ty.block_size();
    let bb = ty.block_bytes();
    let mut out = rng.bytes(nb * bb);
    let scale_bytes = if ty.is_tq_weight() { 4 } else { 2 };
    for b in out.chunks_exact_mut(bb) {
        for k in (0..scale_bytes).step_by(2) {
            // f16 in [2^-8, 2^-6): exponent 7..8, random mantissa.
            let h: u16 = (7 + (rng.next_u64() & 1) as u16) << 10 | (rng.next_u64() as u16 & 0x3ff);
            b[k..k + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    out
}

/// The conformance rows as mat-vec (TQ: each case is one row of `n`) or Q·K (turbo: each
/// case's groups are rows of 128) inputs. Rows whose reference dequantization is not all finite
/// are left to the dequantize check (their dot is inf/NaN in any order).
fn conformance_dots(
    backend: &mut dyn Backend,
    ty: TensorType,
    conf: &Conformance,
    rng: &mut Rng,
) -> Result<KernelResult> {
    // Group cases by row length so each group is one matrix.
    let mut by_len: std::collections::BTreeMap<usize, Vec<u8>> = Default::default();
    let mut skipped = 0;
    for (_, bytes) in &conf.cases {
        let n = bytes.len() / ty.block_bytes() * ty.block_size();
        let deq = cpu_reference(ty, bytes)?;
        if tq_row_cols(ty, n) == 0 {
            continue;
        }
        let cols = tq_row_cols(ty, n);
        for (rb, rv) in bytes
            .chunks_exact(cols / ty.block_size() * ty.block_bytes())
            .zip(deq.chunks_exact(cols))
        {
            if rv.iter().all(|v| v.is_finite()) {
                by_len.entry(cols).or_default().extend_from_slice(rb);
            } else {
                skipped += 1;
            }
        }
    }
    let kind = if ty.is_tq_weight() {
        KernelKind::MatVec
    } else {
        KernelKind::QkDot
    };
    let mut total: Option<KernelResult> = None;
    for (cols, bytes) in by_len {
        let rows = bytes.len() / (cols / ty.block_size() * ty.block_bytes());
        let mut x = random_activation(cols, rng);
        if !ty.is_tq_weight() {
            x = rotate_query(&x);
        }
        let (dots, sums) = reference_dots(ty, &bytes, rows, cols, &x)?;
        let got = if ty.is_tq_weight() {
            backend.matvec(ty, &bytes, rows, cols, &x)?
        } else {
            backend.qk_dot(ty, &bytes, rows, cols, &x)?
        };
        let r = compare_dots(ty, kind, "conformance", &got, &dots, &sums, DOT_REL_BOUND);
        total = Some(match total {
            None => r,
            Some(t) => merge(t, r),
        });
    }
    let mut r = total
        .unwrap_or_else(|| compare_dots(ty, kind, "conformance", &[], &[], &[], DOT_REL_BOUND));
    if skipped > 0 {
        r.data = format!("conformance ({skipped} non-finite rows left to dequantize)");
    }
    Ok(r)
}

/// Row length used for a conformance case of `n` values: TQ cases are one row; turbo cases are
/// rows of 128 (one KV head each).
fn tq_row_cols(ty: TensorType, n: usize) -> usize {
    if ty.is_tq_weight() {
        n
    } else {
        turbo::QK_TURBO
    }
}

fn merge(mut a: KernelResult, b: KernelResult) -> KernelResult {
    a.values += b.values;
    a.bit_exact += b.bit_exact;
    a.max_abs = a.max_abs.max(b.max_abs);
    a.max_rel = a.max_rel.max(b.max_rel);
    a.max_ulp = a.max_ulp.max(b.max_ulp);
    a.max_err_over_abs_sum = a.max_err_over_abs_sum.max(b.max_err_over_abs_sum);
    a.class_mismatch += b.class_mismatch;
    a.pass &= b.pass;
    if a.first_failure.is_none() {
        a.first_failure = b.first_failure;
    }
    a
}

/// The report as the CLI prints it: one line per kernel and data set.
pub fn format_report(rep: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "backend {} on {}", rep.backend.name(), rep.device);
    let _ = writeln!(
        s,
        "{:<8} {:<10} {:<66} {:>8} {:>10} {:>10} {:>10} {:>6} {:>10}  result",
        "type", "kernel", "data", "values", "bit-exact", "max-abs", "max-rel", "ulp", "err/S",
    );
    for r in &rep.results {
        let exact = if r.bit_exact == r.values {
            "all".to_string()
        } else {
            format!("{}", r.bit_exact)
        };
        let _ = writeln!(
            s,
            "{:<8} {:<10} {:<66} {:>8} {:>10} {:>10.3e} {:>10.3e} {:>6} {:>10.3e}  {} ({})",
            r.ty.name(),
            r.kind.name(),
            r.data,
            r.values,
            exact,
            r.max_abs,
            r.max_rel,
            r.max_ulp,
            r.max_err_over_abs_sum,
            if r.pass { "PASS" } else { "FAIL" },
            r.tolerance
        );
        if let Some(f) = &r.first_failure {
            if !r.pass {
                let _ = writeln!(s, "         first failure: {f}");
            }
        }
    }
    for n in &rep.notes {
        let _ = writeln!(s, "note: {n}");
    }
    for t in &rep.throughput {
        let _ = write!(
            s,
            "throughput {:<7} {:>9} values  {:>9.3} ms  {:>8.2} GB/s",
            t.ty.name(),
            t.values,
            t.seconds * 1e3,
            t.gbs
        );
        if let Some(p) = rep.peak_gbs {
            let _ = write!(s, "  ({:.1}% of {:.0} GB/s peak)", 100.0 * t.gbs / p, p);
        }
        let _ = writeln!(s);
    }
    let (pass, total) = (
        rep.results.iter().filter(|r| r.pass).count(),
        rep.results.len(),
    );
    let _ = writeln!(s, "{pass} passed, {} failed", total - pass);
    s
}

// ---------------------------------------------------------------------------------------------
// CPU emulation of the kernels (harness self-test)
// ---------------------------------------------------------------------------------------------

/// The kernels' arithmetic on the CPU, in the order the GPU kernels use (dequantize: the CPU
/// reference itself; mat-vec: rotated activation, 64 strided f32 partial sums, tree reduction;
/// Q·K: 128 strided partial sums, tree reduction). Lets the harness run without a GPU.
pub struct CpuEmulation;

fn tree_sum(mut v: Vec<f32>) -> f32 {
    let mut s = v.len() / 2;
    while s > 0 {
        for t in 0..s {
            v[t] += v[t + s];
        }
        s /= 2;
    }
    v[0]
}

impl Backend for CpuEmulation {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn device_name(&self) -> String {
        "CPU (emulated kernel arithmetic)".into()
    }
    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>> {
        cpu_reference(ty, blocks)
    }
    fn matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<Vec<f32>> {
        let mut xr = x.to_vec();
        for b in xr.chunks_exact_mut(tqs::QK) {
            let mut a = [0f32; tqs::QK];
            a.copy_from_slice(b);
            tqs::forward_rotate(&mut a);
            b.copy_from_slice(&a);
        }
        let bpr = cols / tqs::QK;
        let bb = ty.block_bytes();
        let mut out = Vec::with_capacity(rows);
        for r in 0..rows {
            let mut part = vec![0f32; 64];
            for (t, p) in part.iter_mut().enumerate() {
                let mut j = t;
                while j < cols {
                    let blk = &w[(r * bpr + j / 32) * bb..(r * bpr + j / 32 + 1) * bb];
                    *p += rotated_weight(ty, blk, j % 32) * xr[j];
                    j += 64;
                }
            }
            out.push(tree_sum(part));
        }
        Ok(out)
    }
    fn turbo_dequantize(&mut self, spec: &TurboSpec, blocks: &[u8]) -> Result<Vec<f32>> {
        spec.validate(blocks.len(), None)?;
        Ok(spec.reference(blocks))
    }
    fn turbo_qk(
        &mut self,
        spec: &TurboSpec,
        k: &[u8],
        rows: usize,
        cols: usize,
        q_rot: &[f32],
    ) -> Result<Vec<f32>> {
        spec.validate(k.len(), Some((rows, cols)))?;
        let deq = spec.reference(k);
        let mut out = Vec::with_capacity(rows);
        for r in 0..rows {
            let row = &deq[r * cols..(r + 1) * cols];
            let mut part = vec![0f32; TURBO_QK_THREADS];
            for (t, p) in part.iter_mut().enumerate() {
                let mut j = t;
                while j < cols {
                    *p += q_rot[j] * row[j];
                    j += TURBO_QK_THREADS;
                }
            }
            out.push(tree_sum(part));
        }
        Ok(out)
    }
    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..iters.max(1) {
            let t = Instant::now();
            std::hint::black_box(cpu_reference(ty, blocks)?);
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    }
}

/// Rotated-domain weight `C[idx_j] · d_half(j)` of element `j` of a TQ block.
pub fn rotated_weight(ty: TensorType, blk: &[u8], j: usize) -> f32 {
    let half = if j < 16 { 0 } else { 2 };
    let d = crate::types::float::f16_bits_to_f32(u16::from_le_bytes([blk[half], blk[half + 1]]));
    match ty {
        TensorType::TQ4_1S => tqs::C4[tqs::unpack_tq4(blk)[j] as usize] * d,
        _ => tqs::C3[tqs::unpack_tq3(blk)[j] as usize] * d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulp_distance_basics() {
        assert_eq!(ulp_distance(1.0, 1.0), 0);
        assert_eq!(ulp_distance(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(ulp_distance(0.0, -0.0), 1);
        assert_eq!(ulp_distance(f32::from_bits(1), -f32::from_bits(1)), 3);
    }

    #[test]
    fn compare_exact_nan_and_signed_zero() {
        let r = compare_exact(
            TensorType::TQ4_1S,
            "t",
            &[f32::NAN, -0.0],
            &[f32::NAN, -0.0],
        );
        assert!(r.pass && r.bit_exact == 2);
        let r = compare_exact(TensorType::TQ4_1S, "t", &[0.0], &[-0.0]);
        assert!(!r.pass && r.max_ulp == 1);
        let r = compare_exact(TensorType::TQ4_1S, "t", &[1.0], &[f32::INFINITY]);
        assert!(!r.pass && r.class_mismatch == 1);
    }

    #[test]
    fn compare_dots_bound() {
        let r = compare_dots(
            TensorType::TQ4_1S,
            KernelKind::MatVec,
            "t",
            &[1.0, 2.0],
            &[1.0, 2.0 + 1e-3],
            &[10.0, 10.0],
            DOT_REL_BOUND,
        );
        assert!(!r.pass);
        assert!((r.max_err_over_abs_sum - 1e-4).abs() < 1e-9);
    }

    #[test]
    #[allow(clippy::excessive_precision)]
    fn wgsl_tables_match_the_cpu_reference() {
        fn bits(src: &str, name: &str) -> Vec<u32> {
            let start = src.find(&format!("var<private> {name}:")).expect(name);
            let body = &src[start..];
            let open = body.find("array<u32").unwrap();
            let body = &body[open..];
            let open = body.find('(').unwrap();
            let close = body.find(");").unwrap();
            body[open + 1..close]
                .split(',')
                .map(|t| t.trim().trim_end_matches('u'))
                .filter(|t| !t.is_empty())
                .map(|t| u32::from_str_radix(t.trim_start_matches("0x"), 16).unwrap())
                .collect()
        }
        let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(sources::WGSL_TQ, "C4"), b(&tqs::C4));
        assert_eq!(bits(sources::WGSL_TQ, "C3"), b(&tqs::C3));
        // The turbo codebooks are not in the sources: the host passes them as a buffer.
        assert!(!sources::WGSL_TURBO.contains("var<private> CB"));
        assert!(
            sources::WGSL_TQ.contains(&format!("0x{:08x}u", 0.176_776_695_296_636_88f32.to_bits()))
        );
    }
}
