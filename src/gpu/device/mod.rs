//! The two traits of the GPU room.
//!
//! - [`Device`] is what a backend implements: upload, launch one kernel of the table
//!   (`gpu/kernels.rs`) with its arguments, download, and time a batch of launches.
//! - [`Backend`] is what the harness and the CLI call: dequantize, mat-vec, Q·K and the
//!   throughput run. It is implemented once for every [`Device`] by the functions of this folder,
//!   which hold the size checks, the table lookups, the grid arithmetic and the launch sequences
//!   (the TQ mat-vec is two launches: prerotate, then mat-vec). A backend that is wrong on purpose
//!   (the harness tests) implements [`Backend`] directly.
//!
//! One file per operation: `args.rs` (the arguments of a launch), `dequant.rs` (block
//! dequantize), `matvec.rs` (TQ mat-vec and mat-mul), `kv.rs` (turbo KV blocks: dequantize, Q·K),
//! `twobit.rs` (the 2-bit matrices of tq2_r / tq2_t: decode, GEMV), `rotate.rs` (tq2_r's whole-row
//! rotation), `timing.rs` (the throughput run). This file holds the traits, the launch helper
//! ([`run`]) and the dispatch of [`Backend`] to those files.

mod args;
mod dequant;
mod kv;
mod matvec;
mod rotate;
mod timing;
mod twobit;

pub(crate) use self::args::{
    Args, Tq2rParams, TurboParams, TQ2R_INVERSE, TQ2R_MIX_THEN_SCALE, TQ2R_SEED_LAYOUT,
};
pub(crate) use self::matvec::{matmul_resident, matmul_weight_check};
pub use self::rotate::RotatePath;
pub use self::twobit::{TwoBit, TwoBitLayout};

use super::kernels::{Dialect, Kernel, Unit, MATMUL_TOKENS};
use super::{BackendKind, TurboSpec};
use crate::error::{Error, Result};
use crate::types::TensorType;

/// Workgroups (CUDA blocks, Metal threadgroups) of `threads` each, from the table (a mat-mul's
/// are numbered row-group-major within a token tile).
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // read by the feature-gated GPU backends only (the CPU emulation has no grid)
pub(crate) struct Grid {
    pub groups: usize,
    pub threads: u32,
}

/// The low-level operations of one GPU API.
pub(crate) trait Device {
    /// A device buffer.
    type Buf;
    /// The geometry column of the kernel table this backend's kernels are written for.
    const DIALECT: Dialect;
    /// Launches per timing measurement in the throughput run (amortizes submit/poll costs).
    const TIMING_REPS: usize;

    fn kind(&self) -> BackendKind;
    fn device_name(&self) -> String;
    /// A buffer holding `bytes` (f32 data as little-endian bytes).
    fn upload(&mut self, bytes: &[u8]) -> Result<Self::Buf>;
    /// An output buffer of `n` f32.
    fn alloc_f32(&mut self, n: usize) -> Result<Self::Buf>;
    /// Queue kernel `k` on `grid` with `args`; launches run in the order they are made.
    fn launch(&mut self, k: &'static Kernel, grid: Grid, args: &Args<Self::Buf>) -> Result<()>;
    /// The first `n` f32 of `buf`, after every launch before it has finished.
    fn download(&mut self, buf: &Self::Buf, n: usize) -> Result<Vec<f32>>;
    /// Seconds the launches that `work` makes take on the device (kernel time where the API
    /// reports it, else submit to completion).
    fn timed(&mut self, work: &mut dyn FnMut(&mut Self) -> Result<()>) -> Result<f64>;
    /// See [`Backend::bench_values`].
    fn bench_values(&self, ty: TensorType) -> usize {
        let _ = ty;
        1 << 24
    }
    fn peak_bandwidth_gbs(&self) -> Option<f64> {
        None
    }
}

/// The kernels of one GPU backend, as the harness calls them. Byte buffers hold whole blocks back
/// to back; rows of a matrix are consecutive.
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
    /// `Y = X·Wᵀ` for a TQ weight of `rows × cols` and `tokens` activation rows `X` (`tokens ×
    /// cols`, row-major): `Y` is `tokens × rows`, token-major. Backends over a [`Device`] run the
    /// mat-mul kernel (upload, prerotate every activation row, one launch per chunk of tokens);
    /// the default runs [`Backend::matvec`] once per token (backends that are wrong on purpose).
    fn matmul(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        tokens: usize,
    ) -> Result<Vec<f32>> {
        if x.len() < tokens * cols {
            return Err(Error::Unsupported(format!(
                "{ty}: mat-mul of {tokens} rows of {cols}: activation too short"
            )));
        }
        let mut y = Vec::with_capacity(tokens * rows);
        for t in 0..tokens {
            y.extend(self.matvec(ty, w, rows, cols, &x[t * cols..(t + 1) * cols])?);
        }
        Ok(y)
    }
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
    /// Decode a 2-bit matrix: the rotated-domain values `(2q − 3)·d`, or with `original` every
    /// stored-rotated row turned back (`Rᵀ` on the device).
    fn twobit_decode(&mut self, w: &TwoBit, original: bool) -> Result<Vec<f32>> {
        let _ = (w, original);
        Err(no_twobit(self.kind()))
    }
    /// `y = W·x` for a 2-bit matrix. With `prerotated`, `x` is already `R·x` and only the GEMV
    /// runs; otherwise the device rotates `x` first when the rows are stored rotated.
    fn twobit_matvec(&mut self, w: &TwoBit, x: &[f32], prerotated: bool) -> Result<Vec<f32>> {
        let _ = (w, x, prerotated);
        Err(no_twobit(self.kind()))
    }
    /// tq2_r's whole-row rotation of every row (`cols` values) of `x`: `R·x`, or `Rᵀ·x` with
    /// `inverse`, by the launch sequence `path` picks.
    fn rotate_rows(
        &mut self,
        cols: usize,
        x: &[f32],
        inverse: bool,
        path: RotatePath,
    ) -> Result<Vec<f32>> {
        let _ = (cols, x, inverse, path);
        Err(no_twobit(self.kind()))
    }
    /// Seconds per dequantize of `blocks` with the data resident on the device (best of
    /// `iters`, kernel time only where the API allows, else submit-to-completion).
    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64>;
    /// Seconds per mat-vec `y = W·x` of a `rows × cols` weight of `ty` (TQ: prerotate + mat-vec;
    /// tq2_r: whole-row rotation + GEMV), data resident on the device, best of `iters`.
    fn time_matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        iters: usize,
    ) -> Result<f64> {
        let _ = (ty, w, rows, cols, iters);
        Err(Error::Unsupported(format!(
            "{}: no mat-vec timing",
            self.kind().name()
        )))
    }
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

impl<D: Device> Backend for D {
    fn kind(&self) -> BackendKind {
        Device::kind(self)
    }
    fn device_name(&self) -> String {
        Device::device_name(self)
    }
    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>> {
        dequant::dequantize(self, ty, blocks)
    }
    fn matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<Vec<f32>> {
        matvec::matvec(self, ty, w, rows, cols, x)
    }
    fn matmul(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        tokens: usize,
    ) -> Result<Vec<f32>> {
        let k = matmul_weight_check(ty, w.len(), rows, cols)?;
        if rows == 0 || tokens == 0 {
            return Ok(vec![0.0; rows * tokens]);
        }
        let wd = self.upload(&w[..rows * cols / 32 * ty.block_bytes()])?;
        matmul_resident(self, k, &wd, rows, cols, x, tokens)
    }
    fn turbo_dequantize(&mut self, spec: &TurboSpec, blocks: &[u8]) -> Result<Vec<f32>> {
        kv::turbo_dequantize(self, spec, blocks)
    }
    fn turbo_qk(
        &mut self,
        spec: &TurboSpec,
        k: &[u8],
        rows: usize,
        cols: usize,
        q_rot: &[f32],
    ) -> Result<Vec<f32>> {
        kv::turbo_qk(self, spec, k, rows, cols, q_rot)
    }
    fn twobit_decode(&mut self, w: &TwoBit, original: bool) -> Result<Vec<f32>> {
        twobit::twobit_decode(self, w, original)
    }
    fn twobit_matvec(&mut self, w: &TwoBit, x: &[f32], prerotated: bool) -> Result<Vec<f32>> {
        twobit::twobit_matvec(self, w, x, prerotated)
    }
    fn rotate_rows(
        &mut self,
        cols: usize,
        x: &[f32],
        inverse: bool,
        path: RotatePath,
    ) -> Result<Vec<f32>> {
        rotate::rotate_rows(self, cols, x, inverse, path)
    }
    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64> {
        timing::time_dequantize(self, ty, blocks, iters)
    }
    fn time_matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        iters: usize,
    ) -> Result<f64> {
        timing::time_matvec(self, ty, w, rows, cols, iters)
    }
    fn bench_values(&self, ty: TensorType) -> usize {
        Device::bench_values(self, ty)
    }
    fn peak_bandwidth_gbs(&self) -> Option<f64> {
        Device::peak_bandwidth_gbs(self)
    }
}

pub(super) fn no_twobit(kind: BackendKind) -> Error {
    Error::Unsupported(format!("{}: no 2-bit (tq2_r, tq2_t) kernels", kind.name()))
}

pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(super) fn count_u32(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Unsupported(format!("{n} {what} in one launch")))
}

/// Launch `k` with the grid the table gives for `args` on this device's dialect.
pub(super) fn run<D: Device>(d: &mut D, k: &'static Kernel, args: &Args<D::Buf>) -> Result<()> {
    let g = k.geometry(D::DIALECT);
    let groups = match k.unit {
        Unit::Block | Unit::Row => (args.n as usize).div_ceil(g.per_group),
        Unit::Value => {
            (args.n as usize * args.turbo.map_or(1, |t| t.1.group as usize)).div_ceil(g.per_group)
        }
        Unit::RowTokens => {
            let tiles = (args.tokens.unwrap_or(0) as usize).div_ceil(MATMUL_TOKENS);
            (args.n as usize).div_ceil(g.per_group) * tiles
        }
    };
    let grid = Grid {
        groups,
        threads: g.threads,
    };
    d.launch(k, grid, args)
}
