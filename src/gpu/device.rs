//! The two traits of the GPU room.
//!
//! - [`Device`] is what a backend implements: upload, launch one kernel of the table
//!   (`gpu/kernels.rs`) with its arguments, download, and time a batch of launches.
//! - [`Backend`] is what the harness and the CLI call: dequantize, mat-vec, Q·K and the
//!   throughput run. It is implemented once for every [`Device`] by the functions below, which hold
//!   the size checks, the table lookups, the grid arithmetic and the launch sequences (the TQ
//!   mat-vec is two launches: prerotate, then mat-vec). A backend that is wrong on purpose (the
//!   harness tests) implements [`Backend`] directly.

use super::kernels::{self, Dialect, Kernel, Op, Unit, MATMUL_TOKENS, ROTATE_MAX};
use super::{BackendKind, TurboSpec};
use crate::error::{Error, Result};
use crate::types::{tq2r, tq2t, TensorType};

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

/// `Tq2rParams::flags`: the blocks are in the seed design's split layout ([`TwoBitLayout::Seed`]).
pub(crate) const TQ2R_SEED_LAYOUT: u32 = 1;
/// `Tq2rParams::flags`: the inverse rotation `Rᵀ` (signs last, the dense factor transposed).
pub(crate) const TQ2R_INVERSE: u32 = 2;
/// `Tq2rParams::flags`: Hadamard factor (mix, then scale) rather than DCT (scale, then mix).
pub(crate) const TQ2R_MIX_THEN_SCALE: u32 = 4;

/// The scalars every tq2_r kernel takes (zero where a kernel does not use one).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tq2rParams {
    /// `TQ2R_*` bits.
    pub flags: u32,
    /// Order of the rotation's dense factor (`math::rotation::Factors::h`).
    pub h: u32,
    /// The rotation's scale, as f32 bits.
    pub scale: u32,
    /// Sub-block length (`tq2r_rot_local`) or butterfly step (`tq2r_rot_stage`).
    pub step: u32,
}

/// The tq2_r arguments of a launch: the rotation's buffers where the kernel reads them, and the
/// scalars (every tq2_r kernel).
pub(crate) struct Tq2rArgs<'a, B> {
    /// ±1 per position of a row (f32).
    pub signs: Option<&'a B>,
    /// The dense factor, `h × h` f32 row-major (transposed for the inverse).
    pub mat: Option<&'a B>,
    pub p: Tq2rParams,
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
/// | `tokens` | if present | 8 | 2 `params.tokens` (else 0) |
/// | `turbo` | `cb, group, bytes, hdr` | 5 `cb`, 6 `{group, bytes, hdr}` | 4 `cb`, 2 `params.group/bytes/hdr` |
/// | `tq2r.signs` | if present | 5 | 4 `rot_signs` |
/// | `tq2r.mat` | if present | 6 | 5 `rot_mat` |
/// | `tq2r.p` | `flags, h, scale, step` (every tq2_r kernel) | 7 `{flags, h, scale, step}` | 2 `params.flags/rot_h/rot_scale/rot_step` |
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
    /// tq2_r kernels.
    pub tq2r: Option<Tq2rArgs<'a, B>>,
}

impl<'a, B> Args<'a, B> {
    /// `n` work items into `out`, nothing else.
    fn new(out: &'a B, n: u32) -> Self {
        Args {
            blocks: None,
            vec_in: None,
            out,
            n,
            cols: None,
            tokens: None,
            turbo: None,
            tq2r: None,
        }
    }
}

/// Where a 2-bit matrix of the seed design's family keeps its codes and scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwoBitLayout {
    /// tq2_r GGUF blocks: f16 scale + 8 code bytes per 32 values (10 bytes), rows consecutive.
    Tq2r,
    /// The seed design's own arrays (FORMATS.md §6) in one buffer: the u32 code words (16 codes
    /// per word over the whole tensor), then one f32 scale per 32 values; little-endian.
    Seed,
    /// tq2_t GGUF blocks (issue 19): scale byte + 16 code bytes per 64 values (17 bytes), decoded
    /// by the tail-biting trellis; rows consecutive, on tq2_r's rotation.
    Tq2t,
}

impl TwoBitLayout {
    /// The layout of a GGUF type's blocks: tq2_t's, else tq2_r's.
    pub fn of(ty: TensorType) -> TwoBitLayout {
        if ty == TensorType::TQ2T {
            TwoBitLayout::Tq2t
        } else {
            TwoBitLayout::Tq2r
        }
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            TwoBitLayout::Tq2r | TwoBitLayout::Seed => tq2r::QK,
            TwoBitLayout::Tq2t => tq2t::QK,
        }
    }

    /// The GGUF type whose kernels decode this layout.
    pub(crate) fn kernel_type(self) -> TensorType {
        match self {
            TwoBitLayout::Tq2r | TwoBitLayout::Seed => TensorType::TQ2R,
            TwoBitLayout::Tq2t => TensorType::TQ2T,
        }
    }
}

/// A 2-bit weight matrix for the tq2_r / tq2_t kernels: `rows × cols` values, `cols` a multiple of
/// the layout's block (32; tq2_t 64).
#[derive(Clone, Copy, Debug)]
pub struct TwoBit<'a> {
    pub layout: TwoBitLayout,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    /// The rows are stored rotated by tq2_r's whole-row rotation of `cols` (always for tq2_r;
    /// the design's `incoherent`, which needs a power-of-two `cols`).
    pub rotated: bool,
}

impl TwoBit<'_> {
    /// Bytes per block of [`TwoBitLayout::block_values`] values.
    pub fn block_bytes(layout: TwoBitLayout) -> usize {
        match layout {
            TwoBitLayout::Tq2r => tq2r::TQ2R_BYTES,
            TwoBitLayout::Seed => 12,
            TwoBitLayout::Tq2t => tq2t::TQ2T_BYTES,
        }
    }

    /// The design's codes and scales as one [`TwoBitLayout::Seed`] buffer.
    pub fn seed_bytes(qw: &[u32], sc: &[f32]) -> Vec<u8> {
        qw.iter()
            .flat_map(|w| w.to_le_bytes())
            .chain(sc.iter().flat_map(|s| s.to_le_bytes()))
            .collect()
    }

    /// The number of blocks (of [`TwoBitLayout::block_values`]), after checking the shape
    /// against the data.
    pub fn blocks(&self) -> Result<usize> {
        let bad = |why: String| Err(Error::Unsupported(format!("2-bit matrix: {why}")));
        let qk = self.layout.block_values();
        if self.cols == 0 || self.cols % qk != 0 {
            return bad(format!(
                "row length {} is not a positive multiple of {qk}",
                self.cols
            ));
        }
        let Some(n) = self.rows.checked_mul(self.cols) else {
            return bad(format!("{} x {} values overflow", self.rows, self.cols));
        };
        let nblk = n / qk;
        let want = nblk.checked_mul(Self::block_bytes(self.layout));
        if want != Some(self.data.len()) {
            return bad(format!(
                "{} bytes for {} x {} values in the {:?} layout",
                self.data.len(),
                self.rows,
                self.cols,
                self.layout
            ));
        }
        if self.rotated && self.layout == TwoBitLayout::Seed && !self.cols.is_power_of_two() {
            return bad(format!(
                "the design's rotation needs a power-of-two row length, not {}",
                self.cols
            ));
        }
        Ok(nblk)
    }

    fn flags(&self) -> u32 {
        match self.layout {
            TwoBitLayout::Tq2r | TwoBitLayout::Tq2t => 0,
            TwoBitLayout::Seed => TQ2R_SEED_LAYOUT,
        }
    }
}

/// Which launch sequence rotates rows (`Backend::rotate_rows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotatePath {
    /// One workgroup per row up to [`ROTATE_MAX`] values, the multi-pass path above.
    Auto,
    /// One workgroup per row (an error above [`ROTATE_MAX`]).
    SingleWorkgroup,
    /// Sub-block butterflies, global butterfly stages, then the dense factor: any row length.
    MultiPass,
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
    fn twobit_decode(&mut self, w: &TwoBit, original: bool) -> Result<Vec<f32>> {
        twobit_decode(self, w, original)
    }
    fn twobit_matvec(&mut self, w: &TwoBit, x: &[f32], prerotated: bool) -> Result<Vec<f32>> {
        twobit_matvec(self, w, x, prerotated)
    }
    fn rotate_rows(
        &mut self,
        cols: usize,
        x: &[f32],
        inverse: bool,
        path: RotatePath,
    ) -> Result<Vec<f32>> {
        rotate_rows(self, cols, x, inverse, path)
    }
    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64> {
        time_dequantize(self, ty, blocks, iters)
    }
    fn time_matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        iters: usize,
    ) -> Result<f64> {
        time_matvec(self, ty, w, rows, cols, iters)
    }
    fn bench_values(&self, ty: TensorType) -> usize {
        Device::bench_values(self, ty)
    }
    fn peak_bandwidth_gbs(&self) -> Option<f64> {
        Device::peak_bandwidth_gbs(self)
    }
}

fn no_twobit(kind: BackendKind) -> Error {
    Error::Unsupported(format!("{}: no 2-bit (tq2_r, tq2_t) kernels", kind.name()))
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
    if ty.rotates_rows() {
        // Blocks alone: the rotated-domain values (the registry's per-block decoder).
        let nblk = whole_blocks(ty, blocks.len(), ty.block_bytes())?;
        let w = TwoBit {
            layout: TwoBitLayout::of(ty),
            data: blocks,
            rows: nblk,
            cols: ty.block_size(),
            rotated: false,
        };
        return twobit_decode(d, &w, false);
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
        tq2r: None,
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
        tq2r: None,
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
    if ty.rotates_rows() {
        let rb = cols / ty.block_size() * ty.block_bytes();
        let need = rows
            .checked_mul(rb)
            .filter(|&n| n <= w.len() && cols % ty.block_size() == 0);
        let Some(need) = need else {
            return Err(Error::Unsupported(format!(
                "{ty}: mat-vec {rows}x{cols} does not match its buffers"
            )));
        };
        let m = TwoBit {
            layout: TwoBitLayout::of(ty),
            data: &w[..need],
            rows,
            cols,
            rotated: true,
        };
        return twobit_matvec(d, &m, x, false);
    }
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
        tq2r: None,
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
        tq2r: None,
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
            tq2r: None,
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
            tq2r: None,
        };
        run(d, k, &mm)?;
        y.extend(d.download(&yd, n * rows)?);
        t0 += n;
    }
    Ok(y)
}

fn tq2r_kernel(op: Op) -> Result<&'static Kernel> {
    kernels::kernel(TensorType::TQ2R, op)
}

fn tq2r_args<'a, B>(
    signs: Option<&'a B>,
    mat: Option<&'a B>,
    p: Tq2rParams,
) -> Option<Tq2rArgs<'a, B>> {
    Some(Tq2rArgs { signs, mat, p })
}

/// The layout's decode or GEMV kernel (tq2_t's decode its trellis blocks; both share tq2_r's
/// rotation kernels).
fn twobit_kernel(layout: TwoBitLayout, op: Op) -> Result<&'static Kernel> {
    kernels::kernel(layout.kernel_type(), op)
}

fn twobit_decode<D: Device>(d: &mut D, w: &TwoBit, original: bool) -> Result<Vec<f32>> {
    let nblk = w.blocks()?;
    let n = nblk * w.layout.block_values();
    if n == 0 {
        return Ok(vec![]);
    }
    let src = d.upload(w.data)?;
    let out = d.alloc_f32(n)?;
    let p = Tq2rParams {
        flags: w.flags(),
        ..Default::default()
    };
    let mut args = Args::new(&out, count_u32("blocks", nblk)?);
    args.blocks = Some(&src);
    args.tq2r = tq2r_args(None, None, p);
    run(d, twobit_kernel(w.layout, Op::Dequantize)?, &args)?;
    if original && w.rotated {
        let y = rotate_launches(d, &out, w.rows, w.cols, true, RotatePath::Auto)?;
        return d.download(&y, n);
    }
    d.download(&out, n)
}

fn twobit_matvec<D: Device>(
    d: &mut D,
    w: &TwoBit,
    x: &[f32],
    prerotated: bool,
) -> Result<Vec<f32>> {
    w.blocks()?;
    if x.len() < w.cols {
        return Err(Error::Unsupported(format!(
            "2-bit mat-vec: {} activation values for rows of {}",
            x.len(),
            w.cols
        )));
    }
    if w.rows == 0 {
        return Ok(vec![]);
    }
    let wd = d.upload(w.data)?;
    let xd = d.upload(&f32_bytes(&x[..w.cols]))?;
    let xr = if w.rotated && !prerotated {
        // 1. x' = R·x, once for all rows.
        Some(rotate_launches(d, &xd, 1, w.cols, false, RotatePath::Auto)?)
    } else {
        None
    };
    // 2. y[r] = Σ_b d_b · Σ_j v_j·x'_j (tq2_r: v = 2q − 3, 16 codes per u32 word; tq2_t: the
    //    trellis codeword of each value's state).
    let y = d.alloc_f32(w.rows)?;
    let p = Tq2rParams {
        flags: w.flags(),
        ..Default::default()
    };
    let mut args = Args::new(&y, count_u32("rows", w.rows)?);
    args.blocks = Some(&wd);
    args.vec_in = Some(xr.as_ref().unwrap_or(&xd));
    args.cols = Some(count_u32("columns", w.cols)?);
    args.tq2r = tq2r_args(None, None, p);
    run(d, twobit_kernel(w.layout, Op::MatVec)?, &args)?;
    d.download(&y, w.rows)
}

fn rotate_rows<D: Device>(
    d: &mut D,
    cols: usize,
    x: &[f32],
    inverse: bool,
    path: RotatePath,
) -> Result<Vec<f32>> {
    if cols == 0 || x.len() % cols != 0 {
        return Err(Error::Unsupported(format!(
            "rotation: {} values are not whole rows of {cols}",
            x.len()
        )));
    }
    if x.is_empty() {
        return Ok(vec![]);
    }
    let xd = d.upload(&f32_bytes(x))?;
    let y = rotate_launches(d, &xd, x.len() / cols, cols, inverse, path)?;
    d.download(&y, x.len())
}

/// tq2_r's rotation of `rows` rows of `cols` values, prepared on the device: the signs, the
/// dense factor (transposed for the inverse), the scalars, the scratch and output buffers.
struct RotPlan<B> {
    signs: B,
    mat: B,
    p: Tq2rParams,
    rows: u32,
    cols: u32,
    /// Values in all rows.
    n: usize,
    /// FWHT segment length.
    w: usize,
    single: bool,
    scratch: Option<B>,
    out: B,
}

fn rot_plan<D: Device>(
    d: &mut D,
    rows: usize,
    cols: usize,
    inverse: bool,
    path: RotatePath,
) -> Result<RotPlan<D::Buf>> {
    let rot = tq2r::rotation(cols)?;
    let f = rot.factors().ok_or_else(|| {
        Error::Unsupported(format!(
            "tq2_r: the rotation of {cols} ({}) has no GPU kernel",
            rot.describe()
        ))
    })?;
    let single = match path {
        RotatePath::Auto => cols <= ROTATE_MAX,
        RotatePath::MultiPass => false,
        RotatePath::SingleWorkgroup if cols <= ROTATE_MAX => true,
        RotatePath::SingleWorkgroup => {
            return Err(Error::Unsupported(format!(
                "tq2_r: rows of {cols} are longer than the single-workgroup rotation's {ROTATE_MAX}"
            )))
        }
    };
    let n = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::Unsupported(format!("rotation: {rows} x {cols} overflows")))?;
    let signs = d.upload(&f32_bytes(f.signs))?;
    let mat: Vec<f32> = if inverse {
        (0..f.h * f.h)
            .map(|i| f.mat[(i % f.h) * f.h + i / f.h])
            .collect()
    } else {
        f.mat.to_vec()
    };
    let mat = d.upload(&f32_bytes(&mat))?;
    let mut flags = 0;
    if inverse {
        flags |= TQ2R_INVERSE;
    }
    if f.mix_then_scale {
        flags |= TQ2R_MIX_THEN_SCALE;
    }
    let p = Tq2rParams {
        flags,
        h: count_u32("factor order", f.h)?,
        scale: f.scale.to_bits(),
        step: 0,
    };
    count_u32("values", n)?;
    let scratch = if single { None } else { Some(d.alloc_f32(n)?) };
    Ok(RotPlan {
        signs,
        mat,
        p,
        rows: count_u32("rows", rows)?,
        cols: count_u32("columns", cols)?,
        n,
        w: f.w,
        single,
        scratch,
        out: d.alloc_f32(n)?,
    })
}

/// Queue the launches of a prepared rotation on `input`; the result is in `plan.out`. Rows up to
/// [`ROTATE_MAX`] values: one workgroup per row (the row in workgroup memory). Longer rows: the
/// signs and the butterflies inside sub-blocks of up to [`ROTATE_MAX`] values, one launch per
/// remaining butterfly stage, then the dense factor and the scale. Both paths do the same
/// operations in the same order (bit-identical results).
fn rot_enqueue<D: Device>(d: &mut D, plan: &RotPlan<D::Buf>, input: &D::Buf) -> Result<()> {
    let p = plan.p;
    let scratch = match &plan.scratch {
        None => {
            let mut a = Args::new(&plan.out, plan.rows);
            a.vec_in = Some(input);
            a.cols = Some(plan.cols);
            a.tq2r = tq2r_args(Some(&plan.signs), Some(&plan.mat), p);
            return run(d, tq2r_kernel(Op::Rotate)?, &a);
        }
        Some(s) => s,
    };
    debug_assert!(!plan.single);
    // 1. Signs (forward) and the butterfly stages below `l`, per sub-block of `l` values.
    let l = plan.w.min(ROTATE_MAX);
    let mut a = Args::new(scratch, (plan.n / l) as u32);
    a.vec_in = Some(input);
    a.cols = Some(plan.cols);
    a.tq2r = tq2r_args(
        Some(&plan.signs),
        None,
        Tq2rParams {
            step: l as u32,
            ..p
        },
    );
    run(d, tq2r_kernel(Op::RotateLocal)?, &a)?;
    // 2. The remaining stages of each segment's butterfly, in place.
    let mut step = l;
    while step < plan.w {
        let mut a = Args::new(scratch, (plan.n / 2) as u32);
        a.cols = Some(plan.cols);
        a.tq2r = tq2r_args(
            None,
            None,
            Tq2rParams {
                step: step as u32,
                ..p
            },
        );
        run(d, tq2r_kernel(Op::RotateStage)?, &a)?;
        step *= 2;
    }
    // 3. The dense factor and the scale (inverse: then the signs).
    let mut a = Args::new(&plan.out, plan.n as u32);
    a.vec_in = Some(scratch);
    a.cols = Some(plan.cols);
    a.tq2r = tq2r_args(Some(&plan.signs), Some(&plan.mat), p);
    run(d, tq2r_kernel(Op::RotateMix)?, &a)
}

/// Prepare and queue a rotation of `input`; returns the output buffer.
fn rotate_launches<D: Device>(
    d: &mut D,
    input: &D::Buf,
    rows: usize,
    cols: usize,
    inverse: bool,
    path: RotatePath,
) -> Result<D::Buf> {
    let plan = rot_plan(d, rows, cols, inverse, path)?;
    rot_enqueue(d, &plan, input)?;
    Ok(plan.out)
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
        tq2r: None,
    };
    run(d, kern, &args)?;
    d.download(&out, rows)
}

/// Best of `iters` timings of `work` (after one warm-up), per repetition of
/// [`Device::TIMING_REPS`].
fn best_time<D: Device>(
    d: &mut D,
    iters: usize,
    work: &mut dyn FnMut(&mut D) -> Result<()>,
) -> Result<f64> {
    d.timed(&mut |d| work(d))?;
    let mut best = f64::INFINITY;
    for _ in 0..iters.max(1) {
        let secs = d.timed(&mut |d| {
            for _ in 0..D::TIMING_REPS {
                work(d)?;
            }
            Ok(())
        })?;
        best = best.min(secs / D::TIMING_REPS as f64);
    }
    Ok(best)
}

/// The mat-vec's launches on resident data, timed: TQ prerotate + mat-vec, tq2_r rotation + GEMV.
fn time_matvec<D: Device>(
    d: &mut D,
    ty: TensorType,
    w: &[u8],
    rows: usize,
    cols: usize,
    iters: usize,
) -> Result<f64> {
    let k = kernels::kernel(ty, Op::MatVec)?;
    let bs = ty.block_size();
    let need = cols / bs * rows * ty.block_bytes();
    if rows == 0 || cols == 0 || cols % bs != 0 || w.len() < need {
        return Err(Error::Unsupported(format!(
            "{ty}: mat-vec {rows}x{cols} does not match its buffers"
        )));
    }
    let wd = d.upload(&w[..need])?;
    let x: Vec<f32> = (0..cols).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect();
    let xd = d.upload(&f32_bytes(&x))?;
    let xr = d.alloc_f32(cols)?;
    let y = d.alloc_f32(rows)?;
    let (r, c) = (count_u32("rows", rows)?, count_u32("columns", cols)?);
    let plan = if ty.rotates_rows() {
        Some(rot_plan(d, 1, cols, false, RotatePath::Auto)?)
    } else {
        None
    };
    best_time(d, iters, &mut |d| {
        match &plan {
            Some(p) => rot_enqueue(d, p, &xd)?,
            None => {
                let mut a = Args::new(&xr, c / 32);
                a.vec_in = Some(&xd);
                run(d, kernels::prerotate(), &a)?;
            }
        }
        let mut a = Args::new(&y, r);
        a.blocks = Some(&wd);
        a.vec_in = Some(plan.as_ref().map_or(&xr, |p| &p.out));
        a.cols = Some(c);
        if plan.is_some() {
            a.tq2r = tq2r_args(None, None, Tq2rParams::default());
        }
        run(d, k, &a)
    })
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
        tq2r: ty.rotates_rows().then_some(Tq2rArgs {
            signs: None,
            mat: None,
            p: Tq2rParams::default(),
        }),
    };
    best_time(d, iters, &mut |d| run(d, k, &args))
}
