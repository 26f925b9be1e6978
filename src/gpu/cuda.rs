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

use super::device::{Args, Device, Grid};
use super::kernels::{Dialect, Kernel, Module, KERNELS};
use super::{sources, BackendKind, OpenError};
use crate::error::{Error, Result};
use crate::types::TensorType;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::collections::HashMap;
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

/// The kernel files, in the order [`compile_kernels`] and [`compile_cubins`] return them.
pub const KERNEL_FILES: [&str; 3] = ["tq.cu", "turbo.cu", "tq2r.cu"];

/// The module of each kernel file of [`KERNEL_FILES`].
const FILE_MODULES: [Module; 3] = [Module::Tq, Module::Turbo, Module::Tq2r];

/// The kernel files' full texts (common.cuh prepended), as NVRTC gets them.
fn kernel_texts() -> Result<Vec<(&'static str, String)>> {
    let common = sources::text("cuda", "common.cuh")?;
    KERNEL_FILES
        .iter()
        .map(|f| Ok((*f, format!("{common}\n{}", sources::text("cuda", f)?))))
        .collect()
}

/// Compile every kernel file to PTX with NVRTC (no driver, no GPU needed), for `arch`
/// (default [`DEFAULT_ARCH`]). Returns the PTX of each of [`KERNEL_FILES`].
pub fn compile_kernels(arch: Option<&'static str>) -> Result<Vec<Ptx>> {
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
    kernel_texts()?.iter().map(|(f, t)| compile(f, t)).collect()
}

/// Compile every kernel file to CUBIN (SASS) for `sm` (e.g. `sm_90`) with NVRTC: loads on any
/// driver of the same CUDA major version without a PTX JIT. No GPU needed. In the order of
/// [`KERNEL_FILES`].
pub fn compile_cubins(sm: &str) -> Result<Vec<Vec<u8>>> {
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
    kernel_texts()?.iter().map(|(f, t)| compile(f, t)).collect()
}

fn is_code(e: &DriverError, c: cudarc::driver::sys::cudaError_enum) -> bool {
    e.0 == c
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
    /// Every entry of the kernel table, looked up once at open.
    funcs: HashMap<&'static str, CudaFunction>,
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
        let (images, build): (Vec<Ptx>, String) = match compile_cubins(&sm) {
            Ok(v) => (
                v.into_iter().map(Ptx::from_binary).collect(),
                format!("{sm} CUBIN"),
            ),
            Err(cubin_err) => {
                // NVRTC cannot emit SASS for this architecture (newer than the NVRTC): PTX for
                // compute_XY, JIT-compiled by the driver.
                let arch: &'static str = Box::leak(format!("compute_{maj}{min}").into_boxed_str());
                let v = compile_kernels(Some(arch)).map_err(|e| {
                    Error::Unsupported(format!("{e} (CUBIN for {sm} failed too: {cubin_err})"))
                })?;
                (v, format!("{arch} PTX (no CUBIN: {cubin_err})"))
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
        let mut modules = Vec::with_capacity(images.len());
        for (file, img) in KERNEL_FILES.iter().zip(images) {
            modules.push(load(file, img)?);
        }
        let mut funcs = HashMap::new();
        for k in &KERNELS {
            let i = FILE_MODULES
                .iter()
                .position(|m| *m == k.module)
                .expect("every module has a file");
            let m = &modules[i];
            let f = m
                .load_function(k.entry)
                .map_err(|e| cuda_err(&format!("kernel {}", k.entry), e))?;
            funcs.insert(k.entry, f);
        }
        let stream = ctx.default_stream();
        Ok(CudaBackend {
            ctx,
            stream,
            name,
            build,
            peak_gbs,
            free_mem,
            funcs,
        })
    }
}

impl Device for CudaBackend {
    type Buf = CudaSlice<u8>;
    const DIALECT: Dialect = Dialect::Simt;
    /// Launches between two events: a launch is microseconds, an event pair's resolution ~0.5 µs.
    const TIMING_REPS: usize = 10;

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

    /// Working set for the throughput run: ≥ 256 MiB of blocks (H100's L2 is 50 MB), at most
    /// a quarter of the free memory for blocks + f32 output.
    fn bench_values(&self, ty: TensorType) -> usize {
        let bs = ty.block_size();
        let per_value = ty.block_bytes() as f64 / bs as f64;
        let mut v = (256u64 << 20) as f64 / per_value;
        if let Some(free) = self.free_mem {
            v = v.min(free as f64 / 4.0 / (per_value + 4.0));
        }
        ((v as usize) / bs * bs).max(bs)
    }

    fn upload(&mut self, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        self.stream
            .clone_htod(bytes)
            .map_err(|e| cuda_err("upload", e))
    }

    fn alloc_f32(&mut self, n: usize) -> Result<CudaSlice<u8>> {
        self.stream
            .alloc_zeros::<u8>(n * 4)
            .map_err(|e| cuda_err("alloc", e))
    }

    /// Arguments in the kernels' order: blocks, vec_in, out, n, cols, tokens (mat-mul), then cb,
    /// group, bytes, hdr (turbo), or signs, mat (where present) and flags, h, scale, step (every
    /// tq2_r kernel)
    /// (`kernels/cuda/*.cu`; buffers are untyped device pointers).
    fn launch(&mut self, k: &'static Kernel, grid: Grid, a: &Args<CudaSlice<u8>>) -> Result<()> {
        let f = &self.funcs[k.entry];
        let mut b = self.stream.launch_builder(f);
        if let Some(blocks) = a.blocks {
            b.arg(blocks);
        }
        if let Some(v) = a.vec_in {
            b.arg(v);
        }
        b.arg(a.out).arg(&a.n);
        if let Some(c) = &a.cols {
            b.arg(c);
        }
        if let Some(t) = &a.tokens {
            b.arg(t);
        }
        if let Some((cb, p)) = &a.turbo {
            b.arg(*cb).arg(&p.group).arg(&p.bytes).arg(&p.hdr);
        }
        let t = a.tq2r.as_ref();
        if let Some(s) = t.and_then(|t| t.signs) {
            b.arg(s);
        }
        if let Some(m) = t.and_then(|t| t.mat) {
            b.arg(m);
        }
        let p = t.map(|t| t.p).unwrap_or_default();
        if k.module == Module::Tq2r {
            b.arg(&p.flags).arg(&p.h).arg(&p.scale).arg(&p.step);
        }
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(grid.groups).map_err(|_| cuda_err("grid", grid.groups))?,
                1,
                1,
            ),
            block_dim: (grid.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the argument list matches the kernel's signature (the order above); the shared
        // launch code (gpu/device.rs) sized every buffer for `n` (and `cols`, the layout) and
        // checked the inputs, and the kernels bound-check their indices against `n`. The turbo
        // Q·K gets exactly TURBO_QK_THREADS threads from the table, which its part[4] requires;
        // the tq2_r rotations get rows (sub-blocks) of at most ROTATE_MAX values, their shared
        // array's size.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err(k.entry, e))?;
        Ok(())
    }

    fn download(&mut self, buf: &CudaSlice<u8>, n: usize) -> Result<Vec<f32>> {
        let bytes = self
            .stream
            .clone_dtoh(buf)
            .map_err(|e| cuda_err("download", e))?;
        Ok(bytes[..n * 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Kernel time between two events around the launches `work` makes (the functions were
    /// looked up once, at open).
    fn timed(&mut self, work: &mut dyn FnMut(&mut Self) -> Result<()>) -> Result<f64> {
        use cudarc::driver::sys::CUevent_flags;
        let a = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| cuda_err("event", e))?;
        work(self)?;
        let b = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| cuda_err("event", e))?;
        b.synchronize().map_err(|e| cuda_err("sync", e))?;
        let ms = a.elapsed_ms(&b).map_err(|e| cuda_err("timing", e))?;
        let _ = &self.ctx;
        Ok(ms as f64 / 1e3)
    }
}
