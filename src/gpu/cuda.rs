//! CUDA kernels through `cudarc`: the driver (libcuda) and NVRTC (libnvrtc) are loaded at run
//! time, so the crate builds and its tests run with no CUDA toolkit installed; without them the
//! backend reports why it is unavailable instead of failing the build.
//!
//! `kernels/cuda/common.cuh` is prepended to `tq.cu` / `turbo.cu` and compiled by NVRTC with
//! `--fmad=false` (no multiply-add contraction: the dequantize kernels must be bit-exact).
//!
//! Driver compatibility: NVRTC 12.9 writes PTX ISA 8.8 whatever `--gpu-architecture` says, and a
//! driver older than the NVRTC release refuses that PTX (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`).
//! So the backend compiles a CUBIN (SASS) for the device's own `sm_XY`, which the driver loads
//! without a PTX JIT (CUDA minor-version compatibility), and only falls back to PTX for
//! `compute_XY` when NVRTC cannot emit SASS for that architecture. The PTX-only check
//! ([`compile_kernels`], no GPU needed) targets `compute_80` by default.

use super::{sources, Backend, BackendKind, OpenError, TurboSpec, TURBO_QK_THREADS};
use crate::error::{Error, Result};
use crate::types::TensorType;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::sync::Arc;

fn cuda_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Unsupported(format!("cuda: {what}: {e:?}"))
}

/// The architecture [`compile_kernels`] targets when none is given: Ampere, the oldest the
/// engines' TurboQuant CUDA paths are used on; PTX for it JIT-compiles on any newer GPU.
pub const DEFAULT_ARCH: &str = "compute_80";

/// Whether the driver library can be loaded (no GPU call is made).
pub fn libcuda_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// NVRTC's version, when the library is present.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_present() {
        return None;
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((a, b))
}

fn nvrtc_missing() -> Error {
    Error::Unsupported(
        "cuda: libnvrtc not found (install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and \
         put its lib directory on LD_LIBRARY_PATH)"
            .into(),
    )
}

/// The kernel files' full texts (common.cuh prepended), as NVRTC gets them.
fn kernel_texts() -> Result<[(&'static str, String); 2]> {
    let common = sources::text("cuda", "common.cuh")?;
    Ok([
        (
            "tq.cu",
            format!("{common}\n{}", sources::text("cuda", "tq.cu")?),
        ),
        (
            "turbo.cu",
            format!("{common}\n{}", sources::text("cuda", "turbo.cu")?),
        ),
    ])
}

/// Compile both kernel files to PTX with NVRTC (no driver, no GPU needed), for `arch`
/// (default [`DEFAULT_ARCH`]). Returns the PTX of `tq.cu` and `turbo.cu`.
pub fn compile_kernels(arch: Option<&'static str>) -> Result<(Ptx, Ptx)> {
    if !nvrtc_present() {
        return Err(nvrtc_missing());
    }
    let compile = |name: &str, text: &str| -> Result<Ptx> {
        let opts = CompileOptions {
            fmad: Some(false),
            ftz: Some(false),
            prec_div: Some(true),
            prec_sqrt: Some(true),
            use_fast_math: Some(false),
            arch: Some(arch.unwrap_or(DEFAULT_ARCH)),
            name: Some(name.to_string()),
            ..Default::default()
        };
        compile_ptx_with_opts(text, opts).map_err(|e| match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => Error::Unsupported(format!(
                "cuda: NVRTC rejected kernels/cuda/{name}: {}",
                log.to_string_lossy()
            )),
            e => cuda_err(&format!("NVRTC on kernels/cuda/{name}"), e),
        })
    };
    let [(a, ta), (b, tb)] = kernel_texts()?;
    Ok((compile(a, &ta)?, compile(b, &tb)?))
}

/// Compile both kernel files to CUBIN (SASS) for `sm` (e.g. `sm_90`) with NVRTC: loads on any
/// driver of the same CUDA major version without a PTX JIT. No GPU needed.
pub fn compile_cubins(sm: &str) -> Result<(Vec<u8>, Vec<u8>)> {
    use cudarc::nvrtc::{result, sys};
    if !nvrtc_present() {
        return Err(nvrtc_missing());
    }
    let opts = [
        format!("--gpu-architecture={sm}"),
        "--fmad=false".into(),
        "--ftz=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
    ];
    let compile = |name: &str, text: &str| -> Result<Vec<u8>> {
        let src = std::ffi::CString::new(text)
            .map_err(|_| Error::Unsupported(format!("cuda: NUL byte in kernels/cuda/{name}")))?;
        let cname = std::ffi::CString::new(name).expect("file name");
        let prog = result::create_program(&src, Some(&cname))
            .map_err(|e| cuda_err(&format!("NVRTC on kernels/cuda/{name}"), e))?;
        // SAFETY: `prog` was created above and is destroyed once, at the end.
        let out = unsafe {
            match result::compile_program(prog, &opts) {
                Err(e) => {
                    let log = result::get_program_log(prog)
                        .map(|l| {
                            std::ffi::CStr::from_ptr(l.as_ptr())
                                .to_string_lossy()
                                .into_owned()
                        })
                        .unwrap_or_default();
                    Err(Error::Unsupported(format!(
                        "cuda: NVRTC rejected kernels/cuda/{name} for {sm} ({e:?}): {log}"
                    )))
                }
                Ok(()) => {
                    let mut n = 0usize;
                    sys::nvrtcGetCUBINSize(prog, &mut n)
                        .result()
                        .map_err(|e| cuda_err("nvrtcGetCUBINSize", e))
                        .and_then(|()| {
                            let mut buf = vec![0u8; n];
                            sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                                .result()
                                .map_err(|e| cuda_err("nvrtcGetCUBIN", e))?;
                            Ok(buf)
                        })
                }
            }
        };
        // SAFETY: created above, not freed before.
        let _ = unsafe { result::destroy_program(prog) };
        let out = out?;
        if out.is_empty() {
            return Err(Error::Unsupported(format!(
                "cuda: NVRTC gave no CUBIN for kernels/cuda/{name} ({sm})"
            )));
        }
        Ok(out)
    };
    let [(a, ta), (b, tb)] = kernel_texts()?;
    Ok((compile(a, &ta)?, compile(b, &tb)?))
}

fn is_code(e: &DriverError, c: cudarc::driver::sys::cudaError_enum) -> bool {
    e.0 == c
}

/// The kernel functions, looked up once.
struct Funcs {
    tq4_dequant: CudaFunction,
    tq3_dequant: CudaFunction,
    tq_prerotate: CudaFunction,
    tq4_matvec: CudaFunction,
    tq3_matvec: CudaFunction,
    turbo_dequant: [CudaFunction; 3],
    turbo_qk: [CudaFunction; 3],
}

/// The CUDA backend: one context on device 0 and the kernel functions.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    /// How the kernels were built (`sm_90 CUBIN`, `compute_90 PTX`).
    build: String,
    peak_gbs: Option<f64>,
    free_mem: Option<usize>,
    f: Funcs,
}

fn turbo_index(ty: TensorType) -> Result<usize> {
    match ty {
        TensorType::Turbo2 => Ok(0),
        TensorType::Turbo3 => Ok(1),
        TensorType::Turbo4 => Ok(2),
        _ => Err(Error::Unsupported(format!("{ty}: not a turbo type"))),
    }
}

impl CudaBackend {
    /// Absent: no libcuda, no device, no libnvrtc. Failed: anything else (driver errors, NVRTC
    /// rejecting a kernel, the driver refusing the module).
    pub fn new() -> std::result::Result<Self, OpenError> {
        use cudarc::driver::sys::cudaError_enum as C;
        use cudarc::driver::sys::CUdevice_attribute as A;
        if !libcuda_present() {
            return Err(OpenError::Absent(
                "cuda: libcuda not found (no NVIDIA driver on this machine)".into(),
            ));
        }
        let ctx = CudaContext::new(0).map_err(|e| {
            if is_code(&e, C::CUDA_ERROR_NO_DEVICE) {
                OpenError::Absent("cuda: the driver found no CUDA device".into())
            } else {
                OpenError::Failed(cuda_err("initializing device 0", e))
            }
        })?;
        if !nvrtc_present() {
            return Err(OpenError::Absent(nvrtc_missing().to_string()));
        }
        let name = ctx.name().map_err(|e| cuda_err("device name", e))?;
        let clock_khz = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).ok();
        let bus_bits = ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
            .ok();
        // DDR: two transfers per clock.
        let peak_gbs = match (clock_khz, bus_bits) {
            (Some(c), Some(b)) if c > 0 && b > 0 => {
                Some(2.0 * c as f64 * 1e3 * (b as f64 / 8.0) / 1e9)
            }
            _ => None,
        };
        let free_mem = ctx.mem_get_info().ok().map(|(free, _)| free);
        let (maj, min) = ctx
            .compute_capability()
            .map_err(|e| cuda_err("compute capability", e))?;
        let sm = format!("sm_{maj}{min}");
        let (tq_img, turbo_img, build) = match compile_cubins(&sm) {
            Ok((a, b)) => (
                Ptx::from_binary(a),
                Ptx::from_binary(b),
                format!("{sm} CUBIN"),
            ),
            Err(cubin_err) => {
                // NVRTC cannot emit SASS for this architecture (newer than the NVRTC): PTX for
                // compute_XY, JIT-compiled by the driver.
                let arch: &'static str = Box::leak(format!("compute_{maj}{min}").into_boxed_str());
                let (a, b) = compile_kernels(Some(arch)).map_err(|e| {
                    Error::Unsupported(format!("{e} (CUBIN for {sm} failed too: {cubin_err})"))
                })?;
                (a, b, format!("{arch} PTX (no CUBIN: {cubin_err})"))
            }
        };
        let load = |what: &str, img: Ptx| {
            ctx.load_module(img).map_err(|e| {
                if is_code(&e, C::CUDA_ERROR_UNSUPPORTED_PTX_VERSION) {
                    Error::Unsupported(format!(
                        "cuda: loading {what} ({build}): the driver is older than NVRTC {} and \
                         refuses its PTX ISA version; use a libnvrtc no newer than the driver's \
                         CUDA version (nvidia-smi), or a GPU NVRTC can build a CUBIN for",
                        nvrtc_version().map_or("?".into(), |(a, b)| format!("{a}.{b}"))
                    ))
                } else {
                    cuda_err(&format!("loading {what} ({build})"), e)
                }
            })
        };
        let tq = load("tq.cu", tq_img)?;
        let turbo = load("turbo.cu", turbo_img)?;
        let get = |m: &Arc<cudarc::driver::CudaModule>, n: &str| {
            m.load_function(n)
                .map_err(|e| cuda_err(&format!("kernel {n}"), e))
        };
        let f = Funcs {
            tq4_dequant: get(&tq, "tq4_dequant")?,
            tq3_dequant: get(&tq, "tq3_dequant")?,
            tq_prerotate: get(&tq, "tq_prerotate")?,
            tq4_matvec: get(&tq, "tq4_matvec")?,
            tq3_matvec: get(&tq, "tq3_matvec")?,
            turbo_dequant: [
                get(&turbo, "turbo2_dequant")?,
                get(&turbo, "turbo3_dequant")?,
                get(&turbo, "turbo4_dequant")?,
            ],
            turbo_qk: [
                get(&turbo, "turbo2_qk")?,
                get(&turbo, "turbo3_qk")?,
                get(&turbo, "turbo4_qk")?,
            ],
        };
        let stream = ctx.default_stream();
        Ok(CudaBackend {
            ctx,
            stream,
            name,
            build,
            peak_gbs,
            free_mem,
            f,
        })
    }

    fn upload<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(v).map_err(|e| cuda_err("upload", e))
    }

    fn zeros(&self, n: usize) -> Result<CudaSlice<f32>> {
        self.stream
            .alloc_zeros::<f32>(n)
            .map_err(|e| cuda_err("alloc", e))
    }

    /// Launch the dequantize kernel of `ty` (TQ) or `spec` (turbo) on device buffers holding
    /// `nblk` (> 0) blocks; `cb` is the turbo codebook on the device.
    fn launch_dequant(
        &self,
        ty: TensorType,
        spec: Option<(&TurboSpec, &CudaSlice<f32>)>,
        src: &CudaSlice<u8>,
        dst: &mut CudaSlice<f32>,
        nblk: usize,
    ) -> Result<()> {
        let n = u32::try_from(nblk)
            .map_err(|_| Error::Unsupported(format!("cuda: {nblk} blocks in one launch")))?;
        match spec {
            None => {
                let f = match ty {
                    TensorType::TQ4_1S => &self.f.tq4_dequant,
                    TensorType::TQ3_1S => &self.f.tq3_dequant,
                    _ => return Err(Error::Unsupported(format!("{ty}: no GPU kernel"))),
                };
                let cfg = LaunchConfig {
                    grid_dim: (nblk.div_ceil(8) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = self.stream.launch_builder(f);
                b.arg(src).arg(dst).arg(&n);
                // SAFETY: the kernel reads nblk blocks from src and writes nblk·32 f32 to dst,
                // both allocated with those sizes; the argument types match the signature.
                unsafe { b.launch(cfg) }.map_err(|e| cuda_err("tq dequant", e))?;
            }
            Some((spec, cb)) => {
                let l = &spec.layout;
                let f = &self.f.turbo_dequant[turbo_index(spec.ty)?];
                let values = nblk * l.group;
                let cfg = LaunchConfig {
                    grid_dim: (
                        u32::try_from(values.div_ceil(128))
                            .map_err(|_| cuda_err("grid", values))?,
                        1,
                        1,
                    ),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (g, bb, h) = (l.group as u32, l.block_bytes() as u32, l.header as u32);
                let mut b = self.stream.launch_builder(f);
                b.arg(src).arg(dst).arg(&n).arg(cb).arg(&g).arg(&bb).arg(&h);
                // SAFETY: src holds nblk blocks of bb bytes (validated), dst nblk·g f32, cb
                // 2^bits f32; threads past nblk·g return.
                unsafe { b.launch(cfg) }.map_err(|e| cuda_err("turbo dequant", e))?;
            }
        }
        Ok(())
    }

    /// Working set for the throughput run: ≥ 256 MiB of blocks (H100's L2 is 50 MB), at most
    /// a quarter of the free memory for blocks + f32 output.
    fn bench_values_for(&self, ty: TensorType) -> usize {
        let bs = ty.block_size();
        let per_value = ty.block_bytes() as f64 / bs as f64;
        let mut v = (256u64 << 20) as f64 / per_value;
        if let Some(free) = self.free_mem {
            v = v.min(free as f64 / 4.0 / (per_value + 4.0));
        }
        ((v as usize) / bs * bs).max(bs)
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_name(&self) -> String {
        match nvrtc_version() {
            Some((a, b)) => format!("{} (NVRTC {a}.{b}, {})", self.name, self.build),
            None => self.name.clone(),
        }
    }

    fn peak_bandwidth_gbs(&self) -> Option<f64> {
        self.peak_gbs
    }

    fn bench_values(&self, ty: TensorType) -> usize {
        self.bench_values_for(ty)
    }

    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>> {
        if let Ok(spec) = TurboSpec::stock(ty) {
            return self.turbo_dequantize(&spec, blocks);
        }
        let nblk = blocks.len() / ty.block_bytes();
        if nblk == 0 {
            return Ok(vec![]);
        }
        let src = self.upload(&blocks[..nblk * ty.block_bytes()])?;
        let mut dst = self.zeros(nblk * ty.block_size())?;
        self.launch_dequant(ty, None, &src, &mut dst, nblk)?;
        self.stream
            .clone_dtoh(&dst)
            .map_err(|e| cuda_err("download", e))
    }

    fn turbo_dequantize(&mut self, spec: &TurboSpec, blocks: &[u8]) -> Result<Vec<f32>> {
        spec.validate(blocks.len(), None)?;
        let nblk = blocks.len() / spec.layout.block_bytes();
        if nblk == 0 {
            return Ok(vec![]);
        }
        let src = self.upload(blocks)?;
        let cb = self.upload(&spec.codebook)?;
        let mut dst = self.zeros(nblk * spec.layout.group)?;
        self.launch_dequant(spec.ty, Some((spec, &cb)), &src, &mut dst, nblk)?;
        self.stream
            .clone_dtoh(&dst)
            .map_err(|e| cuda_err("download", e))
    }

    fn matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<Vec<f32>> {
        let f = match ty {
            TensorType::TQ4_1S => &self.f.tq4_matvec,
            TensorType::TQ3_1S => &self.f.tq3_matvec,
            _ => return Err(Error::Unsupported(format!("{ty}: no mat-vec kernel"))),
        };
        if cols % 32 != 0 || x.len() < cols || w.len() < rows * cols / 32 * ty.block_bytes() {
            return Err(Error::Unsupported(format!(
                "{ty}: mat-vec {rows}x{cols} does not match its buffers"
            )));
        }
        if rows == 0 || cols == 0 {
            return Ok(vec![0.0; rows]);
        }
        let s = &self.stream;
        let wd = self.upload(w)?;
        let xd = self.upload(x)?;
        let mut xr = self.zeros(cols)?;
        let mut y = self.zeros(rows)?;
        let nb = (cols / 32) as u32;
        let mut b = s.launch_builder(&self.f.tq_prerotate);
        b.arg(&xd).arg(&mut xr).arg(&nb);
        let cfg = LaunchConfig {
            grid_dim: ((cols / 32).div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x and xr hold `cols` f32 = nb blocks of 32.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("tq_prerotate", e))?;
        let (r, c) = (rows as u32, cols as u32);
        let mut b = s.launch_builder(f);
        b.arg(&wd).arg(&xr).arg(&mut y).arg(&r).arg(&c);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: w holds rows·cols/32 blocks, xr cols f32, y rows f32.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("tq matvec", e))?;
        s.clone_dtoh(&y).map_err(|e| cuda_err("download", e))
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
        if q_rot.len() < cols {
            return Err(Error::Unsupported(
                "cuda: query shorter than a key row".into(),
            ));
        }
        if rows == 0 || cols == 0 {
            return Ok(vec![0.0; rows]);
        }
        let f = &self.f.turbo_qk[turbo_index(spec.ty)?];
        let kd = self.upload(k)?;
        let qd = self.upload(q_rot)?;
        let cb = self.upload(&spec.codebook)?;
        let mut out = self.zeros(rows)?;
        let l = &spec.layout;
        let (r, c) = (rows as u32, cols as u32);
        let (g, bb, h) = (l.group as u32, l.block_bytes() as u32, l.header as u32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&kd)
            .arg(&qd)
            .arg(&mut out)
            .arg(&r)
            .arg(&c)
            .arg(&cb)
            .arg(&g)
            .arg(&bb)
            .arg(&h);
        // The kernel's part[4] holds one partial per warp: exactly 128 threads per row.
        const _: () = assert!(TURBO_QK_THREADS == 128);
        let cfg = LaunchConfig {
            grid_dim: (r, 1, 1),
            block_dim: (TURBO_QK_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: k holds rows·cols/g blocks (validated), q cols f32, out rows f32, cb 2^bits.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("turbo qk", e))?;
        self.stream
            .clone_dtoh(&out)
            .map_err(|e| cuda_err("download", e))
    }

    /// Seconds per dequantize: the function is looked up once (at open), then each event pair
    /// brackets `REPS` back-to-back launches; best of `iters` pairs. The harness sizes the input
    /// to ≥ 256 MiB ([`Backend::bench_values`]) so it does not sit in L2.
    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64> {
        use cudarc::driver::sys::CUevent_flags;
        const REPS: usize = 10;
        let spec = TurboSpec::stock(ty).ok();
        let nblk = blocks.len() / ty.block_bytes();
        if nblk == 0 {
            return Err(Error::Unsupported("cuda: nothing to time".into()));
        }
        let src = self.upload(&blocks[..nblk * ty.block_bytes()])?;
        let cb = match &spec {
            Some(s) => Some(self.upload(&s.codebook)?),
            None => None,
        };
        let sc = spec.as_ref().zip(cb.as_ref());
        let mut dst = self.zeros(nblk * ty.block_size())?;
        self.launch_dequant(ty, sc, &src, &mut dst, nblk)?; // warm-up
        let mut best = f64::INFINITY;
        for _ in 0..iters.max(1) {
            let a = self
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| cuda_err("event", e))?;
            for _ in 0..REPS {
                self.launch_dequant(ty, sc, &src, &mut dst, nblk)?;
            }
            let b = self
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| cuda_err("event", e))?;
            b.synchronize().map_err(|e| cuda_err("sync", e))?;
            let ms = a.elapsed_ms(&b).map_err(|e| cuda_err("timing", e))?;
            best = best.min(ms as f64 / 1e3 / REPS as f64);
        }
        let _ = &self.ctx;
        Ok(best)
    }
}
