//! Metal kernels through `objc2-metal` (macOS only, feature `metal`).
//!
//! `kernels/metal/common.metal` is prepended to `tq.metal` / `turbo.metal` and compiled at run
//! time with `newLibraryWithSource`, fast math disabled. NOTE: this file and the Metal sources
//! were written and reviewed against the CPU reference but have not been compiled as Metal or run
//! (no macOS machine was available when they were written). This file was last type-checked for
//! macOS (`cargo check --target aarch64-apple-darwin --features metal`, from Linux) at commit
//! 80a8a4b, 2026-11-21; it has changed since without a new check, and CI does not compile it
//! (docs/kernels.md, "What has and has not run").

// Some objc2-metal methods are `unsafe` in one release and safe in another: calls whose safety
// status we could not check without a Mac are wrapped in `unsafe` blocks.
#![allow(unused_unsafe)]

use super::device::{Args, Device, Grid, Tq2rParams, TurboParams};
use super::kernels::{Dialect, Kernel, Module};
use super::{sources, BackendKind, OpenError};
use crate::error::{Error, Result};
use objc2::rc::Retained;
use objc2::runtime::ProtocolObject;
use objc2_foundation::NSString;
use objc2_metal::{
    MTLBuffer, MTLCommandBuffer, MTLCommandBufferStatus, MTLCommandEncoder, MTLCommandQueue,
    MTLCompileOptions, MTLComputeCommandEncoder, MTLComputePipelineState,
    MTLCreateSystemDefaultDevice, MTLDevice, MTLLibrary, MTLResourceOptions, MTLSize,
};
use std::ffi::c_void;
use std::ptr::NonNull;

type Dev = ProtocolObject<dyn MTLDevice>;
type MetalBuf = Retained<ProtocolObject<dyn MTLBuffer>>;

fn metal_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("metal: {what}: {e}"))
}

pub struct MetalBackend {
    device: Retained<Dev>,
    queue: Retained<ProtocolObject<dyn MTLCommandQueue>>,
    tq: Retained<ProtocolObject<dyn MTLLibrary>>,
    turbo: Retained<ProtocolObject<dyn MTLLibrary>>,
    tq2r: Retained<ProtocolObject<dyn MTLLibrary>>,
    /// GPU seconds of the launches since the last [`Device::timed`] began.
    gpu_seconds: f64,
}

impl MetalBackend {
    /// Absent: no Metal device. Failed: a kernel file does not compile, no command queue.
    pub fn new() -> std::result::Result<Self, OpenError> {
        let device = MTLCreateSystemDefaultDevice()
            .ok_or_else(|| OpenError::Absent("metal: no Metal device".into()))?;
        let common = sources::text("metal", "common.metal")?;
        let opts = MTLCompileOptions::new();
        #[allow(deprecated)]
        opts.setFastMathEnabled(false);
        let compile =
            |name: &str, body: &str| -> Result<Retained<ProtocolObject<dyn MTLLibrary>>> {
                let src = NSString::from_str(&format!("{common}\n{body}"));
                device
                    .newLibraryWithSource_options_error(&src, Some(&opts))
                    .map_err(|e| {
                        metal_err(
                            &format!("compiling kernels/metal/{name}"),
                            e.localizedDescription(),
                        )
                    })
            };
        let tq = compile("tq.metal", &sources::text("metal", "tq.metal")?)?;
        let turbo = compile("turbo.metal", &sources::text("metal", "turbo.metal")?)?;
        let tq2r = compile("tq2r.metal", &sources::text("metal", "tq2r.metal")?)?;
        let queue = device
            .newCommandQueue()
            .ok_or_else(|| Error::Unsupported("metal: no command queue".into()))?;
        Ok(MetalBackend {
            device,
            queue,
            tq,
            turbo,
            tq2r,
            gpu_seconds: 0.0,
        })
    }

    fn pipeline(
        &self,
        k: &Kernel,
    ) -> Result<Retained<ProtocolObject<dyn MTLComputePipelineState>>> {
        let entry = k.entry;
        let lib = match k.module {
            Module::Tq => &self.tq,
            Module::Turbo => &self.turbo,
            Module::Tq2r => &self.tq2r,
        };
        let f = lib
            .newFunctionWithName(&NSString::from_str(entry))
            .ok_or_else(|| metal_err("missing kernel", entry))?;
        self.device
            .newComputePipelineStateWithFunction_error(&f)
            .map_err(|e| metal_err(entry, e.localizedDescription()))
    }

    fn buffer(&self, bytes: &[u8]) -> Result<MetalBuf> {
        let mut v = bytes.to_vec();
        v.resize(v.len().max(4), 0);
        // SAFETY: `v` is a live allocation of v.len() bytes; Metal copies it.
        unsafe {
            self.device.newBufferWithBytes_length_options(
                NonNull::new(v.as_mut_ptr() as *mut c_void).unwrap(),
                v.len(),
                MTLResourceOptions::StorageModeShared,
            )
        }
        .ok_or_else(|| Error::Unsupported("metal: buffer allocation failed".into()))
    }

    fn out(&self, n: usize) -> Result<MetalBuf> {
        self.device
            .newBufferWithLength_options(n.max(1) * 4, MTLResourceOptions::StorageModeShared)
            .ok_or_else(|| Error::Unsupported("metal: buffer allocation failed".into()))
    }

    /// Run kernel `k` with buffers at their indices on `grid` (threadgroups of `grid.threads`);
    /// returns the GPU time in seconds.
    fn run(&self, k: &Kernel, bufs: &[(usize, &MetalBuf)], grid: Grid) -> Result<f64> {
        let entry = k.entry;
        let pso = self.pipeline(k)?;
        let cb = self
            .queue
            .commandBuffer()
            .ok_or_else(|| Error::Unsupported("metal: no command buffer".into()))?;
        let enc = cb
            .computeCommandEncoder()
            .ok_or_else(|| Error::Unsupported("metal: no encoder".into()))?;
        enc.setComputePipelineState(&pso);
        for (i, b) in bufs {
            let b: &ProtocolObject<dyn MTLBuffer> = b;
            // SAFETY: the buffer outlives the command buffer (waited on below); the kernel's
            // argument at index i is a device buffer of this kind.
            unsafe { enc.setBuffer_offset_atIndex(Some(b), 0, *i) };
        }
        let (groups, tg) = (grid.groups, grid.threads as usize);
        // SAFETY: every buffer the kernel reads or writes is bound above, sized by the shared
        // launch code (gpu/device.rs) for `n` work items (the kernels bound-check their indices).
        unsafe {
            enc.dispatchThreadgroups_threadsPerThreadgroup(
                MTLSize {
                    width: groups,
                    height: 1,
                    depth: 1,
                },
                MTLSize {
                    width: tg,
                    height: 1,
                    depth: 1,
                },
            )
        };
        enc.endEncoding();
        cb.commit();
        cb.waitUntilCompleted();
        // A command buffer that faulted (or was not completed) has garbage in its outputs.
        if cb.status() != MTLCommandBufferStatus::Completed {
            let why = cb
                .error()
                .map(|e| e.localizedDescription().to_string())
                .unwrap_or_else(|| "no error object".into());
            return Err(metal_err(
                &format!("{entry}: command buffer status {:?}", cb.status()),
                why,
            ));
        }
        Ok(cb.GPUEndTime() - cb.GPUStartTime())
    }

    fn read(buf: &MetalBuf, n: usize) -> Vec<f32> {
        let p = buf.contents().as_ptr() as *const f32;
        // SAFETY: the buffer holds at least n f32 and the GPU work on it has completed.
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    }

    fn u32_buf(&self, v: u32) -> Result<MetalBuf> {
        self.buffer(&v.to_le_bytes())
    }

    /// The tq2_r scalars as the kernels' `Tq2rParams` buffer: {flags, h, scale, step}.
    fn tq2r_buf(&self, p: &Tq2rParams) -> Result<MetalBuf> {
        let v = [p.flags, p.h, p.scale, p.step];
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.buffer(&b)
    }

    /// A turbo layout as the kernels' `lay` buffer: {group, bytes, hdr}.
    fn layout_buf(&self, p: &TurboParams) -> Result<MetalBuf> {
        let v = [p.group, p.bytes, p.hdr];
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.buffer(&b)
    }
}

impl Device for MetalBackend {
    type Buf = MetalBuf;
    const DIALECT: Dialect = Dialect::Simt;
    /// Each launch is one command buffer whose GPU start/end times the API reports.
    const TIMING_REPS: usize = 1;

    fn kind(&self) -> BackendKind {
        BackendKind::Metal
    }

    fn device_name(&self) -> String {
        self.device.name().to_string()
    }

    fn upload(&mut self, bytes: &[u8]) -> Result<MetalBuf> {
        self.buffer(bytes)
    }

    fn alloc_f32(&mut self, n: usize) -> Result<MetalBuf> {
        self.out(n)
    }

    /// Buffer indices as in `kernels/metal/*.metal`: 0 blocks, 1 output, 2 n, 3 cols, 4 vector
    /// input, 5 codebook, 6 layout {group, bytes, hdr} (turbo), or 5 signs, 6 dense factor,
    /// 7 {flags, h, scale, step} (tq2_r); 8 tokens (mat-mul). Commits and waits (one command
    /// buffer per launch).
    fn launch(&mut self, k: &'static Kernel, grid: Grid, a: &Args<MetalBuf>) -> Result<()> {
        let n = self.u32_buf(a.n)?;
        let cols = match a.cols {
            Some(c) => Some(self.u32_buf(c)?),
            None => None,
        };
        let tokens = match a.tokens {
            Some(t) => Some(self.u32_buf(t)?),
            None => None,
        };
        let turbo = match a.turbo {
            Some((cb, p)) => Some((cb, self.layout_buf(&p)?)),
            None => None,
        };
        let tq2r = match (k.module, &a.tq2r) {
            (Module::Tq2r, t) => Some(self.tq2r_buf(&t.as_ref().map(|t| t.p).unwrap_or_default())?),
            _ => None,
        };
        let mut bufs: Vec<(usize, &MetalBuf)> = vec![];
        if let Some(b) = a.blocks {
            bufs.push((0, b));
        }
        bufs.push((1, a.out));
        bufs.push((2, &n));
        if let Some(c) = &cols {
            bufs.push((3, c));
        }
        if let Some(v) = a.vec_in {
            bufs.push((4, v));
        }
        if let Some((cb, lay)) = &turbo {
            bufs.push((5, *cb));
            bufs.push((6, lay));
        }
        if let Some(t) = &a.tq2r {
            if let Some(s) = t.signs {
                bufs.push((5, s));
            }
            if let Some(m) = t.mat {
                bufs.push((6, m));
            }
        }
        if let Some(p) = &tq2r {
            bufs.push((7, p));
        }
        if let Some(t) = &tokens {
            bufs.push((8, t));
        }
        self.gpu_seconds += self.run(k, &bufs, grid)?;
        Ok(())
    }

    fn download(&mut self, buf: &MetalBuf, n: usize) -> Result<Vec<f32>> {
        // Every launch waited for its command buffer.
        Ok(Self::read(buf, n))
    }

    /// The GPU time of the launches `work` makes (sum of their command buffers').
    fn timed(&mut self, work: &mut dyn FnMut(&mut Self) -> Result<()>) -> Result<f64> {
        self.gpu_seconds = 0.0;
        work(self)?;
        Ok(self.gpu_seconds)
    }
}
