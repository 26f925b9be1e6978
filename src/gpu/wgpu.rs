//! WGSL kernels through `wgpu` (Vulkan, Metal, DX12; in CI Mesa's lavapipe software Vulkan).
//!
//! The WGSL text (`kernels/wgsl/common.wgsl` prepended to `tq.wgsl` / `turbo.wgsl`) is compiled
//! at run time by naga and the driver. Adapter choice: `TQ_WGPU_ADAPTER=<substring>` picks an
//! adapter by name; otherwise the first hardware adapter, else the first one (lavapipe).

use super::{sources, Backend, BackendKind, OpenError, TurboSpec};
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
    pipelines: HashMap<&'static str, wgpu::ComputePipeline>,
    max_groups: u32,
    max_binding: u64,
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
        Ok(WgpuBackend {
            max_groups: device.limits().max_compute_workgroups_per_dimension,
            max_binding: device.limits().max_storage_buffer_binding_size,
            device,
            queue,
            info,
            tq,
            turbo,
            pipelines: HashMap::new(),
        })
    }

    fn pipeline(&mut self, entry: &'static str) -> Result<wgpu::ComputePipeline> {
        if let Some(p) = self.pipelines.get(entry) {
            return Ok(p.clone());
        }
        let module = if entry.starts_with("turbo") {
            &self.turbo
        } else {
            &self.tq
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

    fn params(&self, n: usize, cols: usize) -> wgpu::Buffer {
        self.params_turbo(n, cols, None)
    }

    /// Params with a turbo layout (`group`, `bytes`, `hdr`; zero for the TQ kernels).
    fn params_turbo(&self, n: usize, cols: usize, spec: Option<&TurboSpec>) -> wgpu::Buffer {
        let (g, b, h) = spec.map_or((0, 0, 0), |s| {
            let l = &s.layout;
            (l.group as u32, l.block_bytes() as u32, l.header as u32)
        });
        let p: [u32; 8] = [n as u32, cols as u32, g, b, h, 0, 0, 0];
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
        entry: &'static str,
        bufs: &[(u32, &wgpu::Buffer)],
    ) -> Result<(wgpu::ComputePipeline, wgpu::BindGroup)> {
        let p = self.pipeline(entry)?;
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

    fn dequant_entry(ty: TensorType) -> Result<(&'static str, usize)> {
        // (entry point, elements per workgroup)
        Ok(match ty {
            TensorType::TQ4_1S => ("tq4_dequant", 256),
            TensorType::TQ3_1S => ("tq3_dequant", 256),
            TensorType::Turbo2 => ("turbo2_dequant", 128),
            TensorType::Turbo3 => ("turbo3_dequant", 128),
            TensorType::Turbo4 => ("turbo4_dequant", 128),
            _ => return Err(Error::Unsupported(format!("{ty}: no GPU kernel"))),
        })
    }

    /// Encode `reps` back-to-back dequantize dispatches of `nblk` blocks (`reps` > 1: timing).
    fn encode_dequant(
        &mut self,
        ty: TensorType,
        spec: Option<&TurboSpec>,
        src: &wgpu::Buffer,
        out: &wgpu::Buffer,
        nblk: usize,
        reps: usize,
    ) -> Result<wgpu::CommandEncoder> {
        let (entry, per_group) = Self::dequant_entry(ty)?;
        let n = nblk * spec.map_or(ty.block_size(), |s| s.layout.group);
        let params = self.params_turbo(nblk, 0, spec);
        let cb = spec.map(|s| self.f32_storage("cb", &s.codebook));
        let mut bufs = vec![(0, src), (1, out), (2, &params)];
        if let Some(cb) = &cb {
            bufs.push((4, cb));
        }
        let (p, bg) = self.bind(entry, &bufs)?;
        let grid = self.grid(n.div_ceil(per_group))?;
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        for _ in 0..reps.max(1) {
            self.encode(&mut enc, &p, &bg, grid);
        }
        Ok(enc)
    }

    fn f32_storage(&self, label: &str, v: &[f32]) -> wgpu::Buffer {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.storage(label, &b)
    }
}

impl Backend for WgpuBackend {
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

    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> Result<Vec<f32>> {
        if let Ok(spec) = TurboSpec::stock(ty) {
            return self.turbo_dequantize(&spec, blocks);
        }
        let nblk = blocks.len() / ty.block_bytes();
        let n = nblk * ty.block_size();
        if n == 0 {
            return Ok(vec![]);
        }
        let src = self.storage("blocks", blocks);
        let out = self.output(n);
        let enc = self.encode_dequant(ty, None, &src, &out, nblk, 1)?;
        self.finish(enc, &out, n)
    }

    fn turbo_dequantize(&mut self, spec: &TurboSpec, blocks: &[u8]) -> Result<Vec<f32>> {
        spec.validate(blocks.len(), None)?;
        let nblk = blocks.len() / spec.layout.block_bytes();
        let n = nblk * spec.layout.group;
        if n == 0 {
            return Ok(vec![]);
        }
        let src = self.storage("blocks", blocks);
        let out = self.output(n);
        let enc = self.encode_dequant(spec.ty, Some(spec), &src, &out, nblk, 1)?;
        self.finish(enc, &out, n)
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
        let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let xbuf = self.storage("x", &xb);
        let xr = self.output(cols);
        let wbuf = self.storage("w", w);
        let y = self.output(rows);
        let p_rot = self.params(cols / 32, 0);
        let p_mv = self.params(rows, cols);
        let (pr, bgr) = self.bind("tq_prerotate", &[(1, &xr), (2, &p_rot), (3, &xbuf)])?;
        let (pm, bgm) = self.bind(entry, &[(0, &wbuf), (1, &y), (2, &p_mv), (3, &xr)])?;
        let g_rot = self.grid((cols / 32).div_ceil(8))?;
        let g_mv = self.grid(rows)?;
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.encode(&mut enc, &pr, &bgr, g_rot);
        self.encode(&mut enc, &pm, &bgm, g_mv);
        self.finish(enc, &y, rows)
    }

    fn turbo_qk(
        &mut self,
        spec: &TurboSpec,
        k: &[u8],
        rows: usize,
        cols: usize,
        q_rot: &[f32],
    ) -> Result<Vec<f32>> {
        let entry = match spec.ty {
            TensorType::Turbo2 => "turbo2_qk",
            TensorType::Turbo3 => "turbo3_qk",
            TensorType::Turbo4 => "turbo4_qk",
            ty => return Err(Error::Unsupported(format!("{ty}: no Q·K kernel"))),
        };
        spec.validate(k.len(), Some((rows, cols)))?;
        if rows == 0 || cols == 0 {
            return Ok(vec![0.0; rows]);
        }
        let qbuf = self.f32_storage("q", q_rot);
        let kbuf = self.storage("k", k);
        let cb = self.f32_storage("cb", &spec.codebook);
        let out = self.output(rows);
        let params = self.params_turbo(rows, cols, Some(spec));
        let (p, bg) = self.bind(
            entry,
            &[(0, &kbuf), (1, &out), (2, &params), (3, &qbuf), (4, &cb)],
        )?;
        let grid = self.grid(rows)?;
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.encode(&mut enc, &p, &bg, grid);
        self.finish(enc, &out, rows)
    }

    /// Best over `iters` submissions of `REPS` back-to-back dispatches each (one submit and one
    /// wait per `REPS` kernels, so the fixed submit/poll cost is amortized), per dispatch.
    fn time_dequantize(&mut self, ty: TensorType, blocks: &[u8], iters: usize) -> Result<f64> {
        const REPS: usize = 8;
        let spec = TurboSpec::stock(ty).ok();
        let nblk = blocks.len() / ty.block_bytes();
        let n = nblk * ty.block_size();
        if n == 0 {
            return Err(Error::Unsupported("wgpu: nothing to time".into()));
        }
        let src = self.storage("blocks", blocks);
        let out = self.output(n);
        // Warm-up (pipeline creation, first-touch of the buffers).
        let enc = self.encode_dequant(ty, spec.as_ref(), &src, &out, nblk, 1)?;
        self.queue.submit([enc.finish()]);
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| gpu_err("poll", e))?;
        let mut best = f64::INFINITY;
        for _ in 0..iters.max(1) {
            let enc = self.encode_dequant(ty, spec.as_ref(), &src, &out, nblk, REPS)?;
            let t = Instant::now();
            self.queue.submit([enc.finish()]);
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| gpu_err("poll", e))?;
            best = best.min(t.elapsed().as_secs_f64() / REPS as f64);
        }
        Ok(best)
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
