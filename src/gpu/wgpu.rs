//! WGSL kernels through `wgpu` (Vulkan, Metal, DX12; in CI Mesa's lavapipe software Vulkan).
//!
//! The WGSL text (`kernels/wgsl/common.wgsl` prepended to `tq.wgsl` / `turbo.wgsl`) is compiled
//! at run time by naga and the driver. Adapter choice: `TQ_WGPU_ADAPTER=<substring>` picks an
//! adapter by name; otherwise the first hardware adapter, else the first one (lavapipe).

use super::device::{Args, Device, Grid};
use super::kernels::{Dialect, Kernel, Module};
use super::{sources, BackendKind, OpenError};
use crate::error::{Error, Result};
use crate::types::TensorType;
use std::collections::HashMap;
use std::time::Instant;
use wgpu::util::DeviceExt;

fn gpu_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("wgpu: {what}: {e}"))
}

/// A wgpu device with the compiled kernel modules.
pub struct WgpuBackend {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    tq: wgpu::ShaderModule,
    turbo: wgpu::ShaderModule,
    tq2r: wgpu::ShaderModule,
    pipelines: HashMap<&'static str, wgpu::ComputePipeline>,
    max_groups: u32,
    max_binding: u64,
    /// Dispatches launched since the last submit (a download or a timing submits them).
    pending: Option<wgpu::CommandEncoder>,
}

/// Adapters wgpu can see, as `name (backend, type)` lines (for `--backend auto` messages).
pub fn list_adapters() -> Vec<String> {
    let instance = make_instance();
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .iter()
        .map(|a| {
            let i = a.get_info();
            format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
        })
        .collect()
}

fn make_instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    wgpu::Instance::new(desc)
}

impl WgpuBackend {
    /// Absent: no adapter, or none matching `TQ_WGPU_ADAPTER`. Failed: the device request, a
    /// kernel's WGSL validation.
    pub fn new() -> std::result::Result<Self, OpenError> {
        let instance = make_instance();
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        if adapters.is_empty() {
            return Err(OpenError::Absent(
                "wgpu: no adapter found (no Vulkan/Metal/DX12 driver; on Linux install \
                 mesa-vulkan-drivers for the lavapipe software device)"
                    .into(),
            ));
        }
        let wanted = std::env::var("TQ_WGPU_ADAPTER").ok();
        let adapter = match &wanted {
            Some(w) => adapters
                .into_iter()
                .find(|a| a.get_info().name.to_lowercase().contains(&w.to_lowercase()))
                .ok_or_else(|| {
                    OpenError::Absent(format!(
                        "wgpu: no adapter matches TQ_WGPU_ADAPTER={w} (adapters: {})",
                        list_adapters().join(", ")
                    ))
                })?,
            None => {
                let hw = adapters
                    .iter()
                    .position(|a| a.get_info().device_type != wgpu::DeviceType::Cpu)
                    .unwrap_or(0);
                adapters.into_iter().nth(hw).unwrap()
            }
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("tq kernels"),
            required_features: wgpu::Features::empty(),
            required_limits: wgpu::Limits {
                max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
                max_buffer_size: limits.max_buffer_size,
                // tq2r_rotate keeps a row of up to 4096 f32 in workgroup memory (16 KiB, the
                // WebGPU default; downlevel_defaults has 16352 bytes).
                max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
                ..wgpu::Limits::downlevel_defaults()
            },
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| gpu_err("request_device", e))?;
        let compile = |name: &str, body: &str| -> Result<wgpu::ShaderModule> {
            let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
            let m = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(
                    format!("{}\n{}", sources::text("wgsl", "common.wgsl")?, body).into(),
                ),
            });
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(gpu_err(&format!("compiling kernels/wgsl/{name}"), e));
            }
            Ok(m)
        };
        let tq = compile("tq.wgsl", &sources::text("wgsl", "tq.wgsl")?)?;
        let turbo = compile("turbo.wgsl", &sources::text("wgsl", "turbo.wgsl")?)?;
        let tq2r = compile("tq2r.wgsl", &sources::text("wgsl", "tq2r.wgsl")?)?;
        Ok(WgpuBackend {
            max_groups: device.limits().max_compute_workgroups_per_dimension,
            max_binding: device.limits().max_storage_buffer_binding_size,
            device,
            queue,
            info,
            tq,
            turbo,
            tq2r,
            pipelines: HashMap::new(),
            pending: None,
        })
    }

    fn pipeline(&mut self, k: &'static Kernel) -> Result<wgpu::ComputePipeline> {
        let entry = k.entry;
        if let Some(p) = self.pipelines.get(entry) {
            return Ok(p.clone());
        }
        let module = match k.module {
            Module::Tq => &self.tq,
            Module::Turbo => &self.turbo,
            Module::Tq2r => &self.tq2r,
        };
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: None,
                module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(gpu_err(&format!("pipeline {entry}"), e));
        }
        self.pipelines.insert(entry, p.clone());
        Ok(p)
    }

    fn storage(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        // Storage bindings must be non-empty and a multiple of 4 bytes.
        let mut v = bytes.to_vec();
        v.resize(v.len().max(4).next_multiple_of(4), 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &v,
                usage: wgpu::BufferUsages::STORAGE,
            })
    }

    fn output(&self, n: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("out"),
            size: (n.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// The kernels' `Params` uniform: `n, cols, group, bytes, hdr, tokens, flags, rot_h,
    /// rot_scale, rot_step` (zero where a kernel has no such argument) and padding to 48 bytes.
    fn params(&self, a: &Args<wgpu::Buffer>) -> wgpu::Buffer {
        let (g, b, h) = a
            .turbo
            .map_or((0, 0, 0), |(_, p)| (p.group, p.bytes, p.hdr));
        let t = a.tq2r.as_ref().map(|t| t.p).unwrap_or_default();
        let p: [u32; 12] = [
            a.n,
            a.cols.unwrap_or(0),
            g,
            b,
            h,
            a.tokens.unwrap_or(0),
            t.flags,
            t.h,
            t.scale,
            t.step,
            0,
            0,
        ];
        let bytes: Vec<u8> = p.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: &bytes,
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    /// Workgroup counts for `groups` workgroups: a 2-D grid when above the per-dimension limit.
    fn grid(&self, groups: usize) -> Result<(u32, u32)> {
        let m = self.max_groups as usize;
        if groups <= m {
            return Ok((groups.max(1) as u32, 1));
        }
        let y = groups.div_ceil(m);
        if y > m {
            return Err(Error::Unsupported(format!(
                "wgpu: {groups} workgroups exceed the device's grid"
            )));
        }
        Ok((m as u32, y as u32))
    }

    fn bind(
        &mut self,
        k: &'static Kernel,
        bufs: &[(u32, &wgpu::Buffer)],
    ) -> Result<(wgpu::ComputePipeline, wgpu::BindGroup)> {
        let entry = k.entry;
        let p = self.pipeline(k)?;
        let entries: Vec<wgpu::BindGroupEntry> = bufs
            .iter()
            .map(|(b, buf)| wgpu::BindGroupEntry {
                binding: *b,
                resource: buf.as_entire_binding(),
            })
            .collect();
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(entry),
            layout: &p.get_bind_group_layout(0),
            entries: &entries,
        });
        Ok((p, bg))
    }

    fn encode(
        &self,
        enc: &mut wgpu::CommandEncoder,
        p: &wgpu::ComputePipeline,
        bg: &wgpu::BindGroup,
        grid: (u32, u32),
    ) {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        pass.set_pipeline(p);
        pass.set_bind_group(0, bg, &[]);
        pass.dispatch_workgroups(grid.0, grid.1, 1);
    }

    /// Submit `enc` with a copy of `out` (n f32) to a mappable buffer; wait; read back.
    fn finish(
        &self,
        mut enc: wgpu::CommandEncoder,
        out: &wgpu::Buffer,
        n: usize,
    ) -> Result<Vec<f32>> {
        let size = (n.max(1) * 4) as u64;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        enc.copy_buffer_to_buffer(out, 0, &staging, 0, size);
        self.queue.submit([enc.finish()]);
        let slice = staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| gpu_err("poll", e))?;
        rx.recv()
            .map_err(|e| gpu_err("map", e))?
            .map_err(|e| gpu_err("map", e))?;
        let view = slice.get_mapped_range().map_err(|e| gpu_err("map", e))?;
        let v: Vec<f32> = view[..n * 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        drop(view);
        staging.unmap();
        Ok(v)
    }
}

impl Device for WgpuBackend {
    type Buf = wgpu::Buffer;
    const DIALECT: Dialect = Dialect::Wgsl;
    /// One submit and one wait per 8 dispatches, so the fixed submit/poll cost is amortized.
    const TIMING_REPS: usize = 8;

    fn kind(&self) -> BackendKind {
        BackendKind::Wgpu
    }

    fn device_name(&self) -> String {
        format!(
            "{} ({:?}, {:?}, driver {} {})",
            self.info.name,
            self.info.backend,
            self.info.device_type,
            self.info.driver,
            self.info.driver_info
        )
    }

    fn upload(&mut self, bytes: &[u8]) -> Result<wgpu::Buffer> {
        Ok(self.storage("in", bytes))
    }

    fn alloc_f32(&mut self, n: usize) -> Result<wgpu::Buffer> {
        Ok(self.output(n))
    }

    /// Encode one dispatch into the pending command encoder; bindings as in
    /// `kernels/wgsl/common.wgsl` (0 src, 1 dst, 2 params, 3 vec_in), `turbo.wgsl` (4 cb) and
    /// `tq2r.wgsl` (4 rot_signs, 5 rot_mat).
    fn launch(&mut self, k: &'static Kernel, grid: Grid, a: &Args<wgpu::Buffer>) -> Result<()> {
        let params = self.params(a);
        let mut bufs = vec![];
        if let Some(b) = a.blocks {
            bufs.push((0, b));
        }
        bufs.push((1, a.out));
        bufs.push((2, &params));
        if let Some(v) = a.vec_in {
            bufs.push((3, v));
        }
        if let Some((cb, _)) = &a.turbo {
            bufs.push((4, *cb));
        }
        if let Some(t) = &a.tq2r {
            if let Some(s) = t.signs {
                bufs.push((4, s));
            }
            if let Some(m) = t.mat {
                bufs.push((5, m));
            }
        }
        let (p, bg) = self.bind(k, &bufs)?;
        let grid = self.grid(grid.groups)?;
        let mut enc = self.pending.take().unwrap_or_else(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        });
        self.encode(&mut enc, &p, &bg, grid);
        self.pending = Some(enc);
        Ok(())
    }

    fn download(&mut self, buf: &wgpu::Buffer, n: usize) -> Result<Vec<f32>> {
        let enc = self.pending.take().unwrap_or_else(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        });
        self.finish(enc, buf, n)
    }

    /// Submit to completion of the dispatches `work` encodes (encoding is not timed).
    fn timed(&mut self, work: &mut dyn FnMut(&mut Self) -> Result<()>) -> Result<f64> {
        work(self)?;
        let enc = self.pending.take();
        let t = Instant::now();
        self.queue.submit(enc.map(|e| e.finish()));
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| gpu_err("poll", e))?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Discrete/integrated GPUs: up to 256 MiB of blocks (well above any L2), within the
    /// device's largest storage binding for input and output; software devices: 16 Mi values.
    fn bench_values(&self, ty: TensorType) -> usize {
        if self.info.device_type == wgpu::DeviceType::Cpu {
            return 1 << 24;
        }
        let per_value = ty.block_bytes() as f64 / ty.block_size() as f64;
        let by_input = (256u64 << 20) as f64 / per_value;
        let by_binding = self.max_binding as f64 / 4.0;
        let v = by_input.min(by_binding) as usize;
        (v / ty.block_size() * ty.block_size()).max(ty.block_size())
    }
}
