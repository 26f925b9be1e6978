//! The two traits of the GPU room.
//!
//! - [`Device`] is what a backend implements: upload, launch one kernel of the table
//!   (`gpu/kernels.rs`) with its arguments, download, and time a batch of launches.
//! - [`Backend`] is what the harness and the CLI call: dequantize, mat-vec, Q·K and the
//!   throughput run. It is implemented once for every [`Device`] by the functions below, which hold
//!   the size checks, the table lookups, the grid arithmetic and the launch sequences (the TQ
//!   mat-vec is two launches: prerotate, then mat-vec). A backend that is wrong on purpose (the
//!   harness tests) implements [`Backend`] directly.

use super::kernels::{self, Dialect, Kernel, Op, Unit, MATMUL_TOKENS};
use super::{BackendKind, TurboSpec};
use crate::error::{Error, Result};
use crate::types::TensorType;

/// A turbo layout as the kernels take it: CUDA arguments, Metal's `lay` buffer, WGSL params.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TurboParams {
    pub group: u32,
    pub bytes: u32,
    pub hdr: u32,
}

impl TurboParams {
    fn of(spec: &TurboSpec) -> TurboParams {
        let l = &spec.layout;
        // Validated layouts: group ≤ 128, bytes ≤ 68.
        TurboParams {
            group: l.group as u32,
            bytes: l.block_bytes() as u32,
            hdr: l.header as u32,
        }
    }
}

/// The arguments of one launch. Every kernel takes the ones it uses in this order, which each
/// backend maps to its own binding scheme:
///
/// | argument | CUDA (positional) | Metal buffer | WGSL binding |
/// |---|---|---|---|
/// | `blocks` | if present | 0 | 0 `src` |
/// | `vec_in` | if present | 4 | 3 `vec_in` |
/// | `out` | always | 1 | 1 `dst` |
/// | `n` | always | 2 | 2 `params.n` |
/// | `cols` | if present | 3 | 2 `params.cols` (else 0) |
/// | `tokens` | if present | 7 | 2 `params.tokens` (else 0) |
/// | `turbo` | `cb, group, bytes, hdr` | 5 `cb`, 6 `{group, bytes, hdr}` | 4 `cb`, 2 `params.group/bytes/hdr` |
pub(crate) struct Args<'a, B> {
    /// Packed blocks (weights, keys).
    pub blocks: Option<&'a B>,
    /// f32 input vector: the activation, its rotated copy, or the rotated query.
    pub vec_in: Option<&'a B>,
    /// f32 output.
    pub out: &'a B,
    /// Blocks (TQ dequantize, prerotate), groups (turbo dequantize) or rows (mat-vec, Q·K).
    pub n: u32,
    /// Row length in values (mat-vec, mat-mul, Q·K).
    pub cols: Option<u32>,
    /// Activation rows (mat-mul); `vec_in` holds them padded to a multiple of `MATMUL_TOKENS`.
    pub tokens: Option<u32>,
    /// The codebook buffer and the layout (turbo kernels).
    pub turbo: Option<(&'a B, TurboParams)>,
}

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

impl<D: Device> Backend for D {
    fn kind(&self) -> BackendKind {
        Device::kind(self)
    }
    fn device_name(&self) -> String {
        Device::device_name(self)
    }
    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>> {
        dequantize(self, ty, blocks)
    }
    fn matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<Vec<f32>> {
        matvec(self, ty, w, rows, cols, x)
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
        turbo_dequantize(self, spec, blocks)
    }
    fn turbo_qk(
        &mut self,
        spec: &TurboSpec,
        k: &[u8],
        rows: usize,
        cols: usize,
        q_rot: &[f32],
    ) -> Result<Vec<f32>> {
        turbo_qk(self, spec, k, rows, cols, q_rot)
    }
    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64> {
        time_dequantize(self, ty, blocks, iters)
    }
    fn bench_values(&self, ty: TensorType) -> usize {
        Device::bench_values(self, ty)
    }
    fn peak_bandwidth_gbs(&self) -> Option<f64> {
        Device::peak_bandwidth_gbs(self)
    }
}

pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn count_u32(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Unsupported(format!("{n} {what} in one launch")))
}

/// Launch `k` with the grid the table gives for `args` on this device's dialect.
fn run<D: Device>(d: &mut D, k: &'static Kernel, args: &Args<D::Buf>) -> Result<()> {
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

/// The rule every dequantize input follows: whole blocks only.
fn whole_blocks(ty: TensorType, bytes: usize, block_bytes: usize) -> Result<usize> {
    if bytes % block_bytes != 0 {
        return Err(Error::Unsupported(format!(
            "{ty}: {bytes} bytes is not a whole number of {block_bytes}-byte blocks"
        )));
    }
    Ok(bytes / block_bytes)
}

fn dequantize<D: Device>(d: &mut D, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>> {
    if let Ok(spec) = TurboSpec::stock(ty) {
        return turbo_dequantize(d, &spec, blocks);
    }
    let k = kernels::kernel(ty, Op::Dequantize)?;
    let nblk = whole_blocks(ty, blocks.len(), ty.block_bytes())?;
    let n = nblk * ty.block_size();
    if n == 0 {
        return Ok(vec![]);
    }
    let src = d.upload(blocks)?;
    let out = d.alloc_f32(n)?;
    let args = Args {
        blocks: Some(&src),
        vec_in: None,
        out: &out,
        n: count_u32("blocks", nblk)?,
        cols: None,
        tokens: None,
        turbo: None,
    };
    run(d, k, &args)?;
    d.download(&out, n)
}

fn turbo_dequantize<D: Device>(d: &mut D, spec: &TurboSpec, blocks: &[u8]) -> Result<Vec<f32>> {
    spec.validate(blocks.len(), None)?;
    let k = kernels::kernel(spec.ty, Op::Dequantize)?;
    let nblk = blocks.len() / spec.layout.block_bytes();
    let n = nblk * spec.layout.group;
    if n == 0 {
        return Ok(vec![]);
    }
    let src = d.upload(blocks)?;
    let cb = d.upload(&f32_bytes(&spec.codebook))?;
    let out = d.alloc_f32(n)?;
    let args = Args {
        blocks: Some(&src),
        vec_in: None,
        out: &out,
        n: count_u32("blocks", nblk)?,
        cols: None,
        tokens: None,
        turbo: Some((&cb, TurboParams::of(spec))),
    };
    run(d, k, &args)?;
    d.download(&out, n)
}

fn matvec<D: Device>(
    d: &mut D,
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
) -> Result<Vec<f32>> {
    let k = kernels::kernel(ty, Op::MatVec)?;
    if cols % 32 != 0 || x.len() < cols || w.len() < rows * cols / 32 * ty.block_bytes() {
        return Err(Error::Unsupported(format!(
            "{ty}: mat-vec {rows}x{cols} does not match its buffers"
        )));
    }
    if rows == 0 || cols == 0 {
        return Ok(vec![0.0; rows]);
    }
    let wd = d.upload(w)?;
    let xd = d.upload(&f32_bytes(x))?;
    let xr = d.alloc_f32(cols)?;
    let y = d.alloc_f32(rows)?;
    let (r, c) = (count_u32("rows", rows)?, count_u32("columns", cols)?);
    // 1. x̂ = each 32-block of x rotated forward, once for all rows.
    let rot = Args {
        blocks: None,
        vec_in: Some(&xd),
        out: &xr,
        n: c / 32,
        cols: None,
        tokens: None,
        turbo: None,
    };
    run(d, kernels::prerotate(), &rot)?;
    // 2. y[r] = Σ C[idx]·d_half · x̂ over each row (the weight is never un-rotated).
    let mv = Args {
        blocks: Some(&wd),
        vec_in: Some(&xr),
        out: &y,
        n: r,
        cols: Some(c),
        tokens: None,
        turbo: None,
    };
    run(d, k, &mv)?;
    d.download(&y, rows)
}

/// The mat-mul kernel of `ty`, after checking that `bytes` hold a `rows × cols` weight.
pub(crate) fn matmul_weight_check(
    ty: TensorType,
    bytes: usize,
    rows: usize,
    cols: usize,
) -> Result<&'static Kernel> {
    let k = kernels::kernel(ty, Op::MatMul)?;
    if cols % 32 != 0 || bytes < rows * (cols / 32) * ty.block_bytes() {
        return Err(Error::Unsupported(format!(
            "{ty}: mat-mul weight {rows}x{cols} does not match its {bytes} bytes"
        )));
    }
    Ok(k)
}

/// Activation (and output) bytes per mat-mul launch at most: the device scratch of one call is
/// about three times this (X, X̂, Y), whatever the number of tokens.
pub(crate) const MATMUL_CHUNK_BYTES: usize = 32 << 20;

/// Tokens per mat-mul launch: a multiple of [`MATMUL_TOKENS`] with X̂ and Y within
/// [`MATMUL_CHUNK_BYTES`].
fn matmul_chunk(rows: usize, cols: usize) -> usize {
    let per = MATMUL_CHUNK_BYTES / (4 * rows.max(cols).max(1));
    (per / MATMUL_TOKENS).max(1) * MATMUL_TOKENS
}

/// `Y = X·Wᵀ` with the weight `wd` (`rows × cols`, checked by [`matmul_weight_check`]) already on
/// the device: per chunk of tokens, upload X padded with zero rows to a multiple of
/// [`MATMUL_TOKENS`], rotate every 32-block of it once (prerotate), one mat-mul launch, download
/// Y (`tokens × rows`).
pub(crate) fn matmul_resident<D: Device>(
    d: &mut D,
    k: &'static Kernel,
    wd: &D::Buf,
    rows: usize,
    cols: usize,
    x: &[f32],
    tokens: usize,
) -> Result<Vec<f32>> {
    if x.len() < tokens * cols {
        return Err(Error::Unsupported(format!(
            "mat-mul of {tokens} rows of {cols}: activation too short"
        )));
    }
    let mut y = Vec::with_capacity(tokens * rows);
    if rows == 0 || cols == 0 {
        y.resize(tokens * rows, 0.0);
        return Ok(y);
    }
    let (r, c) = (count_u32("rows", rows)?, count_u32("columns", cols)?);
    let chunk = matmul_chunk(rows, cols);
    let mut t0 = 0;
    while t0 < tokens {
        let n = chunk.min(tokens - t0);
        let padded = n.next_multiple_of(MATMUL_TOKENS);
        let mut xb = f32_bytes(&x[t0 * cols..(t0 + n) * cols]);
        xb.resize(padded * cols * 4, 0);
        let xd = d.upload(&xb)?;
        let xr = d.alloc_f32(padded * cols)?;
        let yd = d.alloc_f32(n * rows)?;
        // 1. X̂: every 32-block of every activation row rotated forward, once for all rows of W.
        let rot = Args {
            blocks: None,
            vec_in: Some(&xd),
            out: &xr,
            n: count_u32("blocks", padded * cols / 32)?,
            cols: None,
            tokens: None,
            turbo: None,
        };
        run(d, kernels::prerotate(), &rot)?;
        // 2. Y[t][r] = Σ C[idx]·d_half · X̂[t] over each row (the weight is never un-rotated).
        let mm = Args {
            blocks: Some(wd),
            vec_in: Some(&xr),
            out: &yd,
            n: r,
            cols: Some(c),
            tokens: Some(count_u32("tokens", n)?),
            turbo: None,
        };
        run(d, k, &mm)?;
        y.extend(d.download(&yd, n * rows)?);
        t0 += n;
    }
    Ok(y)
}

fn turbo_qk<D: Device>(
    d: &mut D,
    spec: &TurboSpec,
    k: &[u8],
    rows: usize,
    cols: usize,
    q_rot: &[f32],
) -> Result<Vec<f32>> {
    let kern = kernels::kernel(spec.ty, Op::TurboQk)?;
    spec.validate(k.len(), Some((rows, cols)))?;
    if q_rot.len() < cols {
        return Err(Error::Unsupported(format!(
            "{}: query shorter than a key row",
            spec.ty
        )));
    }
    if rows == 0 || cols == 0 {
        return Ok(vec![0.0; rows]);
    }
    let kd = d.upload(k)?;
    let qd = d.upload(&f32_bytes(q_rot))?;
    let cb = d.upload(&f32_bytes(&spec.codebook))?;
    let out = d.alloc_f32(rows)?;
    let args = Args {
        blocks: Some(&kd),
        vec_in: Some(&qd),
        out: &out,
        n: count_u32("rows", rows)?,
        cols: Some(count_u32("columns", cols)?),
        tokens: None,
        turbo: Some((&cb, TurboParams::of(spec))),
    };
    run(d, kern, &args)?;
    d.download(&out, rows)
}

/// Upload once, one warm-up launch (pipeline creation, first touch of the buffers), then the
/// best over `iters` measurements of [`Device::TIMING_REPS`] back-to-back launches, per launch.
fn time_dequantize<D: Device>(
    d: &mut D,
    ty: TensorType,
    blocks: &[u8],
    iters: usize,
) -> Result<f64> {
    let k = kernels::kernel(ty, Op::Dequantize)?;
    let spec = TurboSpec::stock(ty).ok();
    let nblk = blocks.len() / ty.block_bytes();
    if nblk == 0 {
        return Err(Error::Unsupported(format!(
            "{}: nothing to time",
            Device::kind(d).name()
        )));
    }
    let src = d.upload(&blocks[..nblk * ty.block_bytes()])?;
    let cb = match &spec {
        Some(s) => Some(d.upload(&f32_bytes(&s.codebook))?),
        None => None,
    };
    let out = d.alloc_f32(nblk * ty.block_size())?;
    let args = Args {
        blocks: Some(&src),
        vec_in: None,
        out: &out,
        n: count_u32("blocks", nblk)?,
        cols: None,
        tokens: None,
        turbo: spec
            .as_ref()
            .zip(cb.as_ref())
            .map(|(s, cb)| (cb, TurboParams::of(s))),
    };
    d.timed(&mut |d| run(d, k, &args))?;
    let mut best = f64::INFINITY;
    for _ in 0..iters.max(1) {
        let secs = d.timed(&mut |d| {
            for _ in 0..D::TIMING_REPS {
                run(d, k, &args)?;
            }
            Ok(())
        })?;
        best = best.min(secs / D::TIMING_REPS as f64);
    }
    Ok(best)
}
