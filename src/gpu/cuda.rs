//! CUDA kernels through `cudarc`: the driver (libcuda) and NVRTC (libnvrtc) are loaded at run
//! time, so the crate builds and its tests run with no CUDA toolkit installed; without them the
//! backend reports why it is unavailable instead of failing the build.
//!
//! `kernels/cuda/common.cuh` is prepended to `tq.cu` / `turbo.cu` and compiled by NVRTC with
//! `--fmad=false` (no multiply-add contraction: the dequantize kernels must be bit-exact).

use super::{sources, Backend, BackendKind};
use crate::error::{Error, Result};
use crate::types::TensorType;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::sync::Arc;

fn cuda_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Unsupported(format!("cuda: {what}: {e:?}"))
}

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

/// Compile both kernel files with NVRTC (no driver, no GPU needed). Returns the PTX of
/// `tq.cu` and `turbo.cu`.
pub fn compile_kernels(arch: Option<&'static str>) -> Result<(Ptx, Ptx)> {
    if !nvrtc_present() {
        return Err(Error::Unsupported(
            "cuda: libnvrtc not found (install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and \
             put its lib directory on LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    let compile = |name: &str, body: &str| -> Result<Ptx> {
        let opts = CompileOptions {
            fmad: Some(false),
            ftz: Some(false),
            prec_div: Some(true),
            prec_sqrt: Some(true),
            use_fast_math: Some(false),
            arch,
            name: Some(name.to_string()),
            ..Default::default()
        };
        compile_ptx_with_opts(format!("{}\n{}", sources::CUDA_COMMON, body), opts).map_err(|e| {
            match e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                    Error::Unsupported(format!(
                        "cuda: NVRTC rejected kernels/cuda/{name}: {}",
                        log.to_string_lossy()
                    ))
                }
                e => cuda_err(&format!("NVRTC on kernels/cuda/{name}"), e),
            }
        })
    };
    Ok((
        compile("tq.cu", sources::CUDA_TQ)?,
        compile("turbo.cu", sources::CUDA_TURBO)?,
    ))
}

/// The CUDA backend: one context on device 0 and the two kernel modules.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    peak_gbs: Option<f64>,
    tq: Arc<cudarc::driver::CudaModule>,
    turbo: Arc<cudarc::driver::CudaModule>,
}

impl CudaBackend {
    pub fn new() -> Result<Self> {
        if !libcuda_present() {
            return Err(Error::Unsupported(
                "cuda: libcuda not found (no NVIDIA driver on this machine)".into(),
            ));
        }
        let ctx = CudaContext::new(0).map_err(|e| cuda_err("no usable device", e))?;
        let name = ctx.name().map_err(|e| cuda_err("device name", e))?;
        use cudarc::driver::sys::CUdevice_attribute as A;
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
        let (tq_ptx, turbo_ptx) = compile_kernels(None)?;
        let tq = ctx
            .load_module(tq_ptx)
            .map_err(|e| cuda_err("loading tq.cu", e))?;
        let turbo = ctx
            .load_module(turbo_ptx)
            .map_err(|e| cuda_err("loading turbo.cu", e))?;
        let stream = ctx.default_stream();
        Ok(CudaBackend {
            ctx,
            stream,
            name,
            peak_gbs,
            tq,
            turbo,
        })
    }

    fn func(&self, name: &str) -> Result<CudaFunction> {
        let m = if name.starts_with("turbo") {
            &self.turbo
        } else {
            &self.tq
        };
        m.load_function(name)
            .map_err(|e| cuda_err(&format!("kernel {name}"), e))
    }

    /// Launch the dequantize kernel of `ty` on device buffers.
    fn launch_dequant(
        &self,
        ty: TensorType,
        src: &cudarc::driver::CudaSlice<u8>,
        dst: &mut cudarc::driver::CudaSlice<f32>,
        nblk: usize,
    ) -> Result<()> {
        let (name, cfg) = match ty {
            TensorType::TQ4_1S | TensorType::TQ3_1S => (
                if ty == TensorType::TQ4_1S {
                    "tq4_dequant"
                } else {
                    "tq3_dequant"
                },
                LaunchConfig {
                    grid_dim: (nblk.div_ceil(8) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                },
            ),
            TensorType::Turbo2 | TensorType::Turbo3 | TensorType::Turbo4 => (
                match ty {
                    TensorType::Turbo2 => "turbo2_dequant",
                    TensorType::Turbo3 => "turbo3_dequant",
                    _ => "turbo4_dequant",
                },
                LaunchConfig {
                    grid_dim: (nblk as u32, 1, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                },
            ),
            _ => return Err(Error::Unsupported(format!("{ty}: no GPU kernel"))),
        };
        let f = self.func(name)?;
        let n = nblk as u32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(src).arg(dst).arg(&n);
        // SAFETY: the kernel reads nblk blocks from src and writes nblk·block_size f32 to dst,
        // both allocated with exactly those sizes; the argument types match the signature.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err(name, e))?;
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_name(&self) -> String {
        match nvrtc_version() {
            Some((a, b)) => format!("{} (NVRTC {a}.{b})", self.name),
            None => self.name.clone(),
        }
    }

    fn peak_bandwidth_gbs(&self) -> Option<f64> {
        self.peak_gbs
    }

    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>> {
        let nblk = blocks.len() / ty.block_bytes();
        let src = self
            .stream
            .clone_htod(blocks)
            .map_err(|e| cuda_err("upload", e))?;
        let mut dst = self
            .stream
            .alloc_zeros::<f32>(nblk * ty.block_size())
            .map_err(|e| cuda_err("alloc", e))?;
        self.launch_dequant(ty, &src, &mut dst, nblk)?;
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
        let name = match ty {
            TensorType::TQ4_1S => "tq4_matvec",
            TensorType::TQ3_1S => "tq3_matvec",
            _ => return Err(Error::Unsupported(format!("{ty}: no mat-vec kernel"))),
        };
        let s = &self.stream;
        let wd = s.clone_htod(w).map_err(|e| cuda_err("upload", e))?;
        let xd = s.clone_htod(x).map_err(|e| cuda_err("upload", e))?;
        let mut xr = s
            .alloc_zeros::<f32>(cols)
            .map_err(|e| cuda_err("alloc", e))?;
        let mut y = s
            .alloc_zeros::<f32>(rows)
            .map_err(|e| cuda_err("alloc", e))?;
        let nb = (cols / 32) as u32;
        let f = self.func("tq_prerotate")?;
        let mut b = s.launch_builder(&f);
        b.arg(&xd).arg(&mut xr).arg(&nb);
        let cfg = LaunchConfig {
            grid_dim: ((cols / 32).div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x and xr hold `cols` f32 = nb blocks of 32.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("tq_prerotate", e))?;
        let f = self.func(name)?;
        let (r, c) = (rows as u32, cols as u32);
        let mut b = s.launch_builder(&f);
        b.arg(&wd).arg(&xr).arg(&mut y).arg(&r).arg(&c);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: w holds rows·cols/32 blocks, xr cols f32, y rows f32.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err(name, e))?;
        s.clone_dtoh(&y).map_err(|e| cuda_err("download", e))
    }

    fn qk_dot(
        &mut self,
        ty: TensorType,
        k: &[u8],
        rows: usize,
        cols: usize,
        q_rot: &[f32],
    ) -> Result<Vec<f32>> {
        let name = match ty {
            TensorType::Turbo2 => "turbo2_qk",
            TensorType::Turbo3 => "turbo3_qk",
            TensorType::Turbo4 => "turbo4_qk",
            _ => return Err(Error::Unsupported(format!("{ty}: no Q·K kernel"))),
        };
        let s = &self.stream;
        let kd = s.clone_htod(k).map_err(|e| cuda_err("upload", e))?;
        let qd = s.clone_htod(q_rot).map_err(|e| cuda_err("upload", e))?;
        let mut out = s
            .alloc_zeros::<f32>(rows)
            .map_err(|e| cuda_err("alloc", e))?;
        let f = self.func(name)?;
        let (r, c) = (rows as u32, cols as u32);
        let mut b = s.launch_builder(&f);
        b.arg(&kd).arg(&qd).arg(&mut out).arg(&r).arg(&c);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: k holds rows·cols/128 groups, q cols f32, out rows f32.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err(name, e))?;
        s.clone_dtoh(&out).map_err(|e| cuda_err("download", e))
    }

    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64> {
        use cudarc::driver::sys::CUevent_flags;
        let nblk = blocks.len() / ty.block_bytes();
        let src = self
            .stream
            .clone_htod(blocks)
            .map_err(|e| cuda_err("upload", e))?;
        let mut dst = self
            .stream
            .alloc_zeros::<f32>(nblk * ty.block_size())
            .map_err(|e| cuda_err("alloc", e))?;
        self.launch_dequant(ty, &src, &mut dst, nblk)?; // warm-up
        let mut best = f64::INFINITY;
        for _ in 0..iters.max(1) {
            let a = self
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| cuda_err("event", e))?;
            self.launch_dequant(ty, &src, &mut dst, nblk)?;
            let b = self
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| cuda_err("event", e))?;
            b.synchronize().map_err(|e| cuda_err("sync", e))?;
            let ms = a.elapsed_ms(&b).map_err(|e| cuda_err("timing", e))?;
            best = best.min(ms as f64 / 1e3);
        }
        let _ = &self.ctx;
        Ok(best)
    }
}
