//! Metal kernels through `objc2-metal` (macOS only, feature `metal`).
//!
//! `kernels/metal/common.metal` is prepended to `tq.metal` / `turbo.metal` and compiled at run
//! time with `newLibraryWithSource`, fast math disabled. NOTE: this file and the Metal sources
//! were written and reviewed against the CPU reference but have not been compiled yet (no macOS
//! machine was available when they were written); see docs/kernels.md.

// Some objc2-metal methods are `unsafe` in one release and safe in another: calls whose safety
// status we could not check without a Mac are wrapped in `unsafe` blocks.
#![allow(unused_unsafe)]

use super::{sources, Backend, BackendKind, OpenError, TurboSpec, TURBO_QK_THREADS};
use crate::error::{Error, Result};
use crate::types::TensorType;
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
type Buf = Retained<ProtocolObject<dyn MTLBuffer>>;

fn metal_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("metal: {what}: {e}"))
}

pub struct MetalBackend {
    device: Retained<Dev>,
    queue: Retained<ProtocolObject<dyn MTLCommandQueue>>,
    tq: Retained<ProtocolObject<dyn MTLLibrary>>,
    turbo: Retained<ProtocolObject<dyn MTLLibrary>>,
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
        let queue = device
            .newCommandQueue()
            .ok_or_else(|| Error::Unsupported("metal: no command queue".into()))?;
        Ok(MetalBackend {
            device,
            queue,
            tq,
            turbo,
        })
    }

    fn pipeline(
        &self,
        entry: &str,
    ) -> Result<Retained<ProtocolObject<dyn MTLComputePipelineState>>> {
        let lib = if entry.starts_with("turbo") {
            &self.turbo
        } else {
            &self.tq
        };
        let f = lib
            .newFunctionWithName(&NSString::from_str(entry))
            .ok_or_else(|| metal_err("missing kernel", entry))?;
        self.device
            .newComputePipelineStateWithFunction_error(&f)
            .map_err(|e| metal_err(entry, e.localizedDescription()))
    }

    fn buffer(&self, bytes: &[u8]) -> Result<Buf> {
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

    fn out(&self, n: usize) -> Result<Buf> {
        self.device
            .newBufferWithLength_options(n.max(1) * 4, MTLResourceOptions::StorageModeShared)
            .ok_or_else(|| Error::Unsupported("metal: buffer allocation failed".into()))
    }

    /// Run `entry` with buffers at their indices, `threads` threads in groups of `tg`; returns
    /// the GPU time in seconds.
    fn run(&self, entry: &str, bufs: &[(usize, &Buf)], threads: usize, tg: usize) -> Result<f64> {
        let pso = self.pipeline(entry)?;
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
        let groups = threads.div_ceil(tg);
        // SAFETY: every buffer the kernel reads or writes is bound above with enough room for
        // `threads` threads (the kernels bound-check their indices).
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

    fn read(buf: &Buf, n: usize) -> Vec<f32> {
        let p = buf.contents().as_ptr() as *const f32;
        // SAFETY: the buffer holds at least n f32 and the GPU work on it has completed.
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    }

    fn u32_buf(&self, v: u32) -> Result<Buf> {
        self.buffer(&v.to_le_bytes())
    }

    fn f32_buf(&self, v: &[f32]) -> Result<Buf> {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.buffer(&b)
    }

    fn dequant(&self, ty: TensorType, blocks: &[u8]) -> Result<(Vec<f32>, f64)> {
        let nblk = blocks.len() / ty.block_bytes();
        let n = nblk * ty.block_size();
        if let Ok(spec) = TurboSpec::stock(ty) {
            return self.turbo_dequant(&spec, blocks);
        }
        let (entry, tg) = match ty {
            TensorType::TQ4_1S => ("tq4_dequant", 256),
            TensorType::TQ3_1S => ("tq3_dequant", 256),
            _ => return Err(Error::Unsupported(format!("{ty}: no GPU kernel"))),
        };
        if n == 0 {
            return Ok((vec![], 0.0));
        }
        let src = self.buffer(blocks)?;
        let dst = self.out(n)?;
        let nb = self.u32_buf(nblk as u32)?;
        let t = self.run(entry, &[(0, &src), (1, &dst), (2, &nb)], n, tg)?;
        Ok((Self::read(&dst, n), t))
    }

    /// The layout of `spec` as the kernels' `lay` buffer: {group, bytes, hdr}.
    fn layout_buf(&self, spec: &TurboSpec) -> Result<Buf> {
        let l = &spec.layout;
        let v = [l.group as u32, l.block_bytes() as u32, l.header as u32];
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.buffer(&b)
    }

    fn turbo_dequant(&self, spec: &TurboSpec, blocks: &[u8]) -> Result<(Vec<f32>, f64)> {
        spec.validate(blocks.len(), None)?;
        let entry = match spec.ty {
            TensorType::Turbo2 => "turbo2_dequant",
            TensorType::Turbo3 => "turbo3_dequant",
            _ => "turbo4_dequant",
        };
        let nblk = blocks.len() / spec.layout.block_bytes();
        let n = nblk * spec.layout.group;
        if n == 0 {
            return Ok((vec![], 0.0));
        }
        let src = self.buffer(blocks)?;
        let dst = self.out(n)?;
        let nb = self.u32_buf(nblk as u32)?;
        let cb = self.f32_buf(&spec.codebook)?;
        let lay = self.layout_buf(spec)?;
        let t = self.run(
            entry,
            &[(0, &src), (1, &dst), (2, &nb), (5, &cb), (6, &lay)],
            n,
            128,
        )?;
        Ok((Self::read(&dst, n), t))
    }
}

impl Backend for MetalBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Metal
    }

    fn device_name(&self) -> String {
        self.device.name().to_string()
    }

    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>> {
        Ok(self.dequant(ty, blocks)?.0)
    }

    fn matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<Vec<f32>> {
        let entry = match ty {
            TensorType::TQ4_1S => "tq4_matvec",
            TensorType::TQ3_1S => "tq3_matvec",
            _ => return Err(Error::Unsupported(format!("{ty}: no mat-vec kernel"))),
        };
        if rows == 0 || cols == 0 {
            return Ok(vec![0.0; rows]);
        }
        let xb = self.f32_buf(x)?;
        let xr = self.out(cols)?;
        let nb = self.u32_buf((cols / 32) as u32)?;
        self.run("tq_prerotate", &[(1, &xr), (2, &nb), (4, &xb)], cols, 256)?;
        let wb = self.buffer(w)?;
        let y = self.out(rows)?;
        let r = self.u32_buf(rows as u32)?;
        let c = self.u32_buf(cols as u32)?;
        self.run(
            entry,
            &[(0, &wb), (1, &y), (2, &r), (3, &c), (4, &xr)],
            rows * 32,
            128,
        )?;
        Ok(Self::read(&y, rows))
    }

    fn turbo_dequantize(&mut self, spec: &TurboSpec, blocks: &[u8]) -> Result<Vec<f32>> {
        Ok(self.turbo_dequant(spec, blocks)?.0)
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
        let entry = match spec.ty {
            TensorType::Turbo2 => "turbo2_qk",
            TensorType::Turbo3 => "turbo3_qk",
            _ => "turbo4_qk",
        };
        if rows == 0 || cols == 0 {
            return Ok(vec![0.0; rows]);
        }
        let kb = self.buffer(k)?;
        let qb = self.f32_buf(q_rot)?;
        let out = self.out(rows)?;
        let r = self.u32_buf(rows as u32)?;
        let c = self.u32_buf(cols as u32)?;
        let cb = self.f32_buf(&spec.codebook)?;
        let lay = self.layout_buf(spec)?;
        // part[4] in the kernel: exactly TURBO_QK_THREADS (128) threads per row.
        self.run(
            entry,
            &[
                (0, &kb),
                (1, &out),
                (2, &r),
                (3, &c),
                (4, &qb),
                (5, &cb),
                (6, &lay),
            ],
            rows * TURBO_QK_THREADS,
            TURBO_QK_THREADS,
        )?;
        Ok(Self::read(&out, rows))
    }

    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..iters.max(1) + 1 {
            best = best.min(self.dequant(ty, blocks)?.1);
        }
        Ok(best)
    }
}
