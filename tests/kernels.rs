//! GPU decode kernels (issue 8): the parity harness on the CPU emulation (always), on wgpu when
//! built with `--features wgpu` (CI: Mesa's lavapipe), NVRTC compilation of the CUDA sources when
//! built with `--features cuda` and NVRTC is present, and the kernel sources' constant tables.
//!
//! `TQ_REQUIRE_GPU=1` (set by scripts/ci-gpu.sh) turns "no wgpu adapter" into a failure, and
//! `TQ_REQUIRE_NVRTC=1` (also set there) turns "libnvrtc not found" into one. Without them a test
//! that cannot run is recorded (`fixtures::no_device` / `fixtures::not_run`), never passed
//! silently. The CUDA parity test runs wherever an NVIDIA device is visible and must then pass;
//! with none visible it is recorded as "not run: no device".

#[path = "../fixtures/mod.rs"]
mod fixtures;

use tq::gpu::{
    self, Backend, BackendKind, CheckOptions, CpuEmulation, KernelKind, RotatePath, TurboSpec,
    TwoBit, TwoBitLayout,
};
use tq::types::tq as tqs;
use tq::types::TensorType;

fn conformance_dir() -> std::path::PathBuf {
    fixtures::conformance("tq4_1s.json")
        .parent()
        .unwrap()
        .to_path_buf()
}

fn quick_opts() -> CheckOptions {
    CheckOptions {
        conformance_dir: Some(conformance_dir()),
        quick: true,
        ..Default::default()
    }
}

#[allow(dead_code)] // used by the feature-gated tests
fn require_gpu() -> bool {
    std::env::var("TQ_REQUIRE_GPU")
        .map(|v| v == "1")
        .unwrap_or(false)
}

#[allow(dead_code)] // used by the feature-gated tests
fn require_nvrtc() -> bool {
    std::env::var("TQ_REQUIRE_NVRTC")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// A wgpu test whose backend did not open: with no adapter (absent) it is "not run: no device",
/// a failure under `TQ_REQUIRE_GPU=1` (CI's lavapipe); a backend that is there but fails to open
/// is a failure everywhere. The caller returns after it.
#[cfg(feature = "wgpu")]
fn wgpu_not_open(e: &gpu::OpenError) {
    if require_gpu() {
        panic!("TQ_REQUIRE_GPU=1 but {e}");
    }
    assert!(
        e.is_absent(),
        "the wgpu backend is there but failed to open: {e}"
    );
    fixtures::no_device(&e.to_string());
}

#[test]
fn harness_passes_on_cpu_emulation() {
    let rep = gpu::check(&mut CpuEmulation, &quick_opts()).unwrap();
    println!("{}", gpu::format_report(&rep));
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
    // Every type has dequantize on conformance + random bytes + shapes, and its dot kernel.
    for ty in gpu::KERNEL_TYPES {
        let of = |k: KernelKind| {
            rep.results
                .iter()
                .filter(|r| r.ty == ty && r.kind == k)
                .count()
        };
        assert!(of(KernelKind::Dequantize) >= 4, "{ty}");
        assert!(of(KernelKind::MatVec) + of(KernelKind::QkDot) >= 3, "{ty}");
        // The mat-mul (many activation rows per launch) on every real shape of a TQ type.
        assert_eq!(of(KernelKind::MatMul) >= 2, ty.is_tq_weight(), "{ty}");
        let conf = if ty.is_row_rotated() {
            "seed2bit.json, design layout"
        } else if ty == TensorType::TQ2T {
            // No vector file for tq2_t: random bytes with every scale byte.
            "random-bytes (every scale byte)"
        } else {
            "conformance"
        };
        assert!(rep
            .results
            .iter()
            .any(|r| r.ty == ty && r.data == conf && r.kind == KernelKind::Dequantize));
    }
}

/// tq2_r goes through every kernel and data set: the design's vectors in its own layout
/// (decode bit-exact, reconstruction, GEMV), their inputs as tq2_r blocks, random bytes (every
/// f16 scale, subnormal/inf/NaN f32 scales), the rotation on both launch paths and directions
/// (Hadamard bit-exact, DCT bounded), real shapes up to 14336 (multi-pass) with row decode and
/// the GEMV alone and end to end.
#[test]
fn harness_covers_tq2r() {
    let opts = CheckOptions {
        types: vec![TensorType::TQ2R],
        ..quick_opts()
    };
    let rep = gpu::check(&mut CpuEmulation, &opts).unwrap();
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
    let has = |kind: KernelKind, data: &str| {
        rep.results
            .iter()
            .any(|r| r.ty == TensorType::TQ2R && r.kind == kind && r.data.contains(data))
    };
    for (kind, data) in [
        (KernelKind::Dequantize, "seed2bit.json, design layout"),
        (KernelKind::RowDecode, "reconstruction (plain rows)"),
        (KernelKind::RowDecode, "reconstruction (rotated rows)"),
        (KernelKind::MatVec, "seed2bit.json, design layout"),
        (KernelKind::Dequantize, "seed2bit.json inputs"),
        (KernelKind::RowDecode, "seed2bit.json inputs"),
        (KernelKind::Dequantize, "random-bytes, design layout"),
        (KernelKind::RowDecode, "random-bytes, rows of 576"),
        (
            KernelKind::Rotate,
            "K=576 hadamard 36x16 (Paley II, p=17), forward, one workgroup",
        ),
        (
            KernelKind::Rotate,
            "K=576 hadamard 36x16 (Paley II, p=17), inverse, multi-pass",
        ),
        (KernelKind::Rotate, "K=1376 dct 43 x hadamard 32"),
        (
            KernelKind::Rotate,
            "K=8192 hadamard 8192 (Sylvester), forward, multi-pass",
        ),
        (KernelKind::MatVec, "smollm2.attn_q [GEMV alone]"),
        (KernelKind::MatVec, "pow2 8192"),
        (KernelKind::RowDecode, "dct 1376"),
    ] {
        assert!(
            has(kind, data),
            "{kind:?} {data}\n{}",
            gpu::format_report(&rep)
        );
    }
    // Hadamard rotations are held bit-exact, DCT ones to the bound.
    for r in rep.results.iter().filter(|r| r.kind == KernelKind::Rotate) {
        let exact = r.tolerance == gpu::Tolerance::BitExact;
        assert_eq!(exact, !r.data.contains("dct"), "{}", r.data);
    }
}

/// tq2_t goes through every kernel and data set: random bytes with every scale byte (decode,
/// and rows of 576 through the inverse rotation), rows from the CPU's Viterbi encoder, random
/// codes at real and odd shapes (one-block rows, 3-block rows, multi-pass and DCT rotations),
/// the GEMV alone and end to end. Decode bit-exact; row decode bit-exact except the DCT length.
#[test]
fn harness_covers_tq2t() {
    let opts = CheckOptions {
        types: vec![TensorType::TQ2T],
        ..quick_opts()
    };
    let rep = gpu::check(&mut CpuEmulation, &opts).unwrap();
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
    assert!(rep.results.iter().all(|r| r.ty == TensorType::TQ2T));
    let has = |kind: KernelKind, data: &str| {
        rep.results
            .iter()
            .any(|r| r.kind == kind && r.data.contains(data) && r.values > 0)
    };
    for (kind, data) in [
        (KernelKind::Dequantize, "random-bytes (every scale byte)"),
        (KernelKind::RowDecode, "random-bytes, rows of 576"),
        (
            KernelKind::Dequantize,
            "gaussian 2x576, CPU Viterbi encoder",
        ),
        (
            KernelKind::MatVec,
            "gaussian 2x1536, CPU Viterbi encoder [GEMV alone]",
        ),
        (KernelKind::MatVec, "smollm2.ffn_down 576x1536"),
        (KernelKind::MatVec, "one block per row 7x64 [GEMV alone]"),
        (KernelKind::RowDecode, "odd 13x192"),
        (KernelKind::MatVec, "pow2 8192"),
        (KernelKind::RowDecode, "llama3-8b.ffn_down 14336"),
        (KernelKind::RowDecode, "dct 4672"),
    ] {
        assert!(
            has(kind, data),
            "{kind:?} {data}\n{}",
            gpu::format_report(&rep)
        );
    }
    for r in rep.results.iter() {
        let exact = r.tolerance == gpu::Tolerance::BitExact;
        match r.kind {
            KernelKind::Dequantize => assert!(exact, "{}", r.data),
            KernelKind::RowDecode => assert_eq!(exact, !r.data.contains("dct"), "{}", r.data),
            _ => assert!(!exact, "{}", r.data),
        }
    }
}

/// The harness run on a deliberately broken backend must fail; the kinds of kernel that failed,
/// each once.
fn failing_kinds(mut b: Broken, opts: &CheckOptions) -> Vec<KernelKind> {
    let rep = gpu::check(&mut b, opts).unwrap();
    assert!(!rep.pass());
    let mut kinds: Vec<KernelKind> = rep
        .results
        .iter()
        .filter(|r| !r.pass)
        .map(|r| r.kind)
        .collect();
    kinds.sort_by_key(|k| format!("{k:?}"));
    kinds.dedup();
    kinds
}

/// tq2_t: a one-bit error in the decode or a dot off by 1e-4 fails the checks of that kernel
/// and only those; hostile shapes are errors.
#[test]
fn harness_fails_wrong_tq2t_kernels() {
    let opts = CheckOptions {
        types: vec![TensorType::TQ2T],
        ..quick_opts()
    };
    let failing = |b: Broken| failing_kinds(b, &opts);
    let k = failing(Broken {
        flip_one_bit: true,
        ..Broken::default()
    });
    assert!(k.contains(&KernelKind::Dequantize), "{k:?}");
    assert!(!k.contains(&KernelKind::MatVec), "{k:?}");
    let k = failing(Broken {
        dot_scale: 1.0 + 1e-4,
        ..Broken::default()
    });
    assert_eq!(k, [KernelKind::MatVec]);
    let k = failing(Broken {
        flip_rotation: true,
        ..Broken::default()
    });
    assert_eq!(k, [KernelKind::RowDecode]);
    let mut b = CpuEmulation;
    let blk = [0u8; 17];
    fn w(data: &[u8], cols: usize) -> TwoBit<'_> {
        TwoBit {
            layout: TwoBitLayout::Tq2t,
            data,
            rows: 1,
            cols,
            rotated: true,
        }
    }
    assert!(b.twobit_decode(&w(&blk, 64), true).is_ok());
    assert!(b.twobit_decode(&w(&blk, 32), false).is_err());
    assert!(b.twobit_decode(&w(&blk[..16], 64), false).is_err());
    assert!(b.twobit_matvec(&w(&blk, 64), &[0.0; 32], false).is_err());
    assert!(b.matvec(TensorType::TQ2T, &blk, 1, 96, &[0.0; 96]).is_err());
    assert!(b.dequantize(TensorType::TQ2T, &blk[..10]).is_err());
}

/// The GPU path of `tq conformance` on the CPU emulation: every pack2bit case's reconstruction
/// and mat-vec through the tq2_r kernels, every fork case through the dequantize kernel.
#[test]
fn conformance_backend_on_cpu_emulation() {
    let rep = tq::conformance::run_file_on(
        &fixtures::conformance("seed2bit.json"),
        Some(&mut CpuEmulation),
    )
    .unwrap();
    assert!(rep.pass(), "{:?}", rep.failures);
    let count = |op: &str| {
        rep.ops
            .iter()
            .find(|o| o.op == op)
            .map(|o| (o.pass, o.total))
    };
    assert_eq!(count("reconstruct[cpu-emulation]"), Some((42, 42)));
    assert_eq!(count("matvec[cpu-emulation]"), Some((42, 42)));
    assert_eq!(count("pack2bit"), Some((42, 42)));
    assert!(rep.notes.iter().any(|n| n.contains("CPU only")));
    let rep = tq::conformance::run_file_on(
        &fixtures::conformance("tq3_1s.json"),
        Some(&mut CpuEmulation),
    )
    .unwrap();
    assert!(rep.pass(), "{:?}", rep.failures);
    assert!(rep
        .ops
        .iter()
        .any(|o| o.op == "tq3_1s.dequantize[cpu-emulation]" && o.pass == 220));
    // A backend off by one bit in the decode fails the GPU ops and names the case.
    let mut b = Broken {
        flip_one_bit: true,
        ..Broken::default()
    };
    let rep = tq::conformance::run_file_on(&fixtures::conformance("seed2bit.json"), Some(&mut b))
        .unwrap();
    assert!(!rep.pass());
    assert!(rep
        .failures
        .iter()
        .all(|f| f.starts_with("reconstruct[cpu-emulation]")));
}

/// Every turbo layout and codebook tq writes or simulates is checked: the registry's May-2026
/// 128-value layout, June turbo4 (66 bytes), 64-value groups (SmolLM2's heads), and the
/// `--turbo-codebook may|fork|head-dim` tables; each with conformance inputs, random bytes, a
/// real KV shape and Q·K.
#[test]
fn harness_covers_every_turbo_layout_and_codebook() {
    let rep = gpu::check(&mut CpuEmulation, &quick_opts()).unwrap();
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
    for ty in [TensorType::Turbo2, TensorType::Turbo3, TensorType::Turbo4] {
        let specs = gpu::turbo_specs(ty).unwrap();
        // turbo2/3: registry(=may=fork) and head-dim at 128, may=fork and head-dim at 64;
        // turbo4: registry(=may), fork(=head-dim: both Lloyd-Max for d = 128) at 128, and may,
        // fork, head-dim at 64.
        let want = if ty == TensorType::Turbo4 { 5 } else { 4 };
        assert_eq!(specs.len(), want, "{ty}: {specs:?}");
        for s in specs.iter().filter(|s| !s.is_stock()) {
            let label = format!("[{}]", s.label());
            for (kind, data) in [
                (KernelKind::Dequantize, "conformance inputs"),
                (KernelKind::QkDot, "conformance inputs"),
                (KernelKind::Dequantize, "random-bytes"),
                (KernelKind::Dequantize, "k_cache"),
                (KernelKind::QkDot, "k_cache"),
            ] {
                assert!(
                    rep.results.iter().any(|r| r.ty == ty
                        && r.kind == kind
                        && r.data.starts_with(&label)
                        && r.data.contains(data)),
                    "{ty} {label} {kind:?} {data}"
                );
            }
        }
    }
    let t4 = gpu::turbo_specs(TensorType::Turbo4).unwrap();
    assert!(t4
        .iter()
        .any(|s| s.layout.group == 128 && s.layout.block_bytes() == 66));
    assert!(t4
        .iter()
        .any(|s| s.layout.group == 64 && s.layout.block_bytes() == 34));
    assert!(rep
        .results
        .iter()
        .any(|r| r.data.contains("smollm2.k_cache") && r.data.contains("g64")));
}

/// The generalized packer reproduces the conformance bytes for the registry's layouts, and the
/// KV simulator's stored values for every layout and codebook.
#[test]
fn turbo_layouts_are_the_reference_and_the_simulator() {
    use tq::model::kv;
    let dir = conformance_dir();
    for ty in [TensorType::Turbo2, TensorType::Turbo3, TensorType::Turbo4] {
        let conf = gpu::load_conformance(&dir, ty).unwrap();
        let stock = TurboSpec::stock(ty).unwrap();
        let mut n = 0;
        for ((id, bytes), x) in conf.cases.iter().zip(&conf.inputs) {
            if x.iter().all(|v| v.is_finite()) {
                assert_eq!(&stock.quantize(x), bytes, "{ty} {id}");
                n += 1;
            }
        }
        assert!(n > 100, "{ty}: {n} cases");
        for spec in gpu::turbo_specs(ty).unwrap() {
            let g = spec.layout.group;
            let x: Vec<f32> = conf.inputs[0][..g].to_vec();
            let got = spec.reference(&spec.quantize(&x));
            let mut want = vec![0f32; g];
            kv::turbo_group_rotated(&x, &spec.codebook, &mut want);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{ty} {}",
                spec.label()
            );
        }
    }
    // Hostile layouts and shapes are errors, not panics or out-of-bounds reads.
    let mut bad = TurboSpec::stock(TensorType::Turbo3).unwrap();
    bad.codebook.pop();
    assert!(CpuEmulation.turbo_dequantize(&bad, &[0u8; 50]).is_err());
    let good = TurboSpec::stock(TensorType::Turbo3).unwrap();
    assert!(CpuEmulation.turbo_dequantize(&good, &[0u8; 49]).is_err());
    assert!(CpuEmulation
        .turbo_qk(&good, &[0u8; 50], 1, 64, &[0.0; 64])
        .is_err());
    assert!(CpuEmulation
        .turbo_dequantize(&good, &[])
        .unwrap()
        .is_empty());
}

/// A backend that is wrong in a chosen way, to show the harness fails it.
struct Broken {
    flip_one_bit: bool,
    dot_scale: f32,
    /// tq2_r: one bit of the whole-row rotation's output.
    flip_rotation: bool,
}

impl Default for Broken {
    fn default() -> Self {
        Broken {
            flip_one_bit: false,
            dot_scale: 1.0,
            flip_rotation: false,
        }
    }
}

fn flip_middle(v: &mut [f32]) {
    if !v.is_empty() {
        let i = v.len() / 2;
        v[i] = f32::from_bits(v[i].to_bits() ^ 1);
    }
}

impl Backend for Broken {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }
    fn device_name(&self) -> String {
        "broken".into()
    }
    fn dequantize(&mut self, ty: TensorType, blocks: &[u8]) -> tq::Result<Vec<f32>> {
        let mut v = CpuEmulation.dequantize(ty, blocks)?;
        if self.flip_one_bit {
            let i = v.len() / 2;
            v[i] = f32::from_bits(v[i].to_bits() ^ 1);
        }
        Ok(v)
    }
    fn matvec(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> tq::Result<Vec<f32>> {
        let v = CpuEmulation.matvec(ty, w, rows, cols, x)?;
        Ok(v.iter().map(|y| y * self.dot_scale).collect())
    }
    fn turbo_dequantize(&mut self, spec: &TurboSpec, blocks: &[u8]) -> tq::Result<Vec<f32>> {
        let mut v = CpuEmulation.turbo_dequantize(spec, blocks)?;
        if self.flip_one_bit {
            let i = v.len() / 2;
            v[i] = f32::from_bits(v[i].to_bits() ^ 1);
        }
        Ok(v)
    }
    fn turbo_qk(
        &mut self,
        spec: &TurboSpec,
        k: &[u8],
        rows: usize,
        cols: usize,
        q: &[f32],
    ) -> tq::Result<Vec<f32>> {
        let v = CpuEmulation.turbo_qk(spec, k, rows, cols, q)?;
        Ok(v.iter().map(|y| y * self.dot_scale).collect())
    }
    fn twobit_decode(&mut self, w: &TwoBit, original: bool) -> tq::Result<Vec<f32>> {
        let mut v = CpuEmulation.twobit_decode(w, original)?;
        if self.flip_one_bit || (original && w.rotated && self.flip_rotation) {
            flip_middle(&mut v);
        }
        Ok(v)
    }
    fn twobit_matvec(&mut self, w: &TwoBit, x: &[f32], pre: bool) -> tq::Result<Vec<f32>> {
        let v = CpuEmulation.twobit_matvec(w, x, pre)?;
        Ok(v.iter().map(|y| y * self.dot_scale).collect())
    }
    fn rotate_rows(
        &mut self,
        cols: usize,
        x: &[f32],
        inverse: bool,
        path: RotatePath,
    ) -> tq::Result<Vec<f32>> {
        let mut v = CpuEmulation.rotate_rows(cols, x, inverse, path)?;
        if self.flip_rotation {
            flip_middle(&mut v);
        }
        Ok(v)
    }
    fn time_dequantize(&mut self, _: TensorType, _: &[u8], _: usize) -> tq::Result<f64> {
        Ok(1.0)
    }
}

/// tq2_r: a one-bit error in the decode, the rotation (alone or inside the row decode), or a
/// dot off by 1e-4, each fails the checks of that kernel and only those.
#[test]
fn harness_fails_wrong_tq2r_kernels() {
    let opts = CheckOptions {
        types: vec![TensorType::TQ2R],
        ..quick_opts()
    };
    let failing = |b: Broken| failing_kinds(b, &opts);
    let k = failing(Broken {
        flip_one_bit: true,
        ..Broken::default()
    });
    assert!(k.contains(&KernelKind::Dequantize), "{k:?}");
    assert!(!k.contains(&KernelKind::MatVec) && !k.contains(&KernelKind::Rotate));
    let k = failing(Broken {
        flip_rotation: true,
        ..Broken::default()
    });
    assert!(k.contains(&KernelKind::Rotate) && k.contains(&KernelKind::RowDecode));
    assert!(!k.contains(&KernelKind::Dequantize) && !k.contains(&KernelKind::MatVec));
    let k = failing(Broken {
        dot_scale: 1.0 + 1e-4,
        ..Broken::default()
    });
    assert_eq!(k, [KernelKind::MatVec]);
}

/// Hostile 2-bit inputs are errors, not panics: wrong sizes, the design's rotation on a row that
/// is not a power of two, rows that are not whole blocks.
#[test]
fn tq2r_kernels_reject_bad_shapes() {
    fn w(layout: TwoBitLayout, data: &[u8], rows: usize, cols: usize, rotated: bool) -> TwoBit<'_> {
        TwoBit {
            layout,
            data,
            rows,
            cols,
            rotated,
        }
    }
    let mut b = CpuEmulation;
    let ten = [0u8; 10];
    assert!(b
        .twobit_decode(&w(TwoBitLayout::Tq2r, &ten, 1, 32, true), true)
        .is_ok());
    assert!(b
        .twobit_decode(&w(TwoBitLayout::Tq2r, &ten, 1, 48, true), false)
        .is_err());
    assert!(b
        .twobit_decode(&w(TwoBitLayout::Tq2r, &ten[..9], 1, 32, true), false)
        .is_err());
    assert!(b
        .twobit_decode(&w(TwoBitLayout::Seed, &ten, 1, 32, false), false)
        .is_err());
    let seed = [0u8; 36];
    assert!(b
        .twobit_decode(&w(TwoBitLayout::Seed, &seed, 1, 96, true), true)
        .is_err());
    assert!(b
        .twobit_decode(&w(TwoBitLayout::Seed, &seed, 1, 96, false), true)
        .is_ok());
    assert!(b
        .twobit_matvec(&w(TwoBitLayout::Tq2r, &ten, 1, 32, true), &[0.0; 16], false)
        .is_err());
    assert!(b
        .rotate_rows(576, &[0.0; 100], false, RotatePath::Auto)
        .is_err());
    assert!(b
        .rotate_rows(8192, &[0.0; 8192], false, RotatePath::SingleWorkgroup)
        .is_err());
    assert!(b
        .rotate_rows(48, &[0.0; 48], false, RotatePath::Auto)
        .is_err());
    assert!(b.matvec(TensorType::TQ2R, &ten, 2, 32, &[0.0; 32]).is_err());
    assert!(b.dequantize(TensorType::TQ2R, &ten[..7]).is_err());
}

#[test]
fn harness_fails_a_one_ulp_dequantize_error() {
    let opts = CheckOptions {
        types: vec![TensorType::TQ3_1S],
        ..quick_opts()
    };
    let mut b = Broken {
        flip_one_bit: true,
        ..Broken::default()
    };
    let rep = gpu::check(&mut b, &opts).unwrap();
    assert!(!rep.pass());
    let bad: Vec<_> = rep.results.iter().filter(|r| !r.pass).collect();
    assert!(bad.iter().all(|r| r.kind == KernelKind::Dequantize));
    assert!(bad.iter().any(|r| r.max_ulp == 1 || r.class_mismatch == 1));
    assert!(gpu::format_report(&rep).contains("FAIL"));
}

#[test]
fn harness_fails_a_dot_off_by_1e_minus_4() {
    let opts = CheckOptions {
        types: vec![TensorType::TQ4_1S, TensorType::Turbo3],
        ..quick_opts()
    };
    let mut b = Broken {
        dot_scale: 1.0 + 1e-4,
        ..Broken::default()
    };
    let rep = gpu::check(&mut b, &opts).unwrap();
    let bad: Vec<_> = rep.results.iter().filter(|r| !r.pass).collect();
    assert!(!bad.is_empty());
    assert!(bad.iter().all(|r| r.kind != KernelKind::Dequantize));
    assert!(bad.iter().any(|r| r.kind == KernelKind::MatVec));
    assert!(bad.iter().any(|r| r.kind == KernelKind::MatMul));
    assert!(bad.iter().any(|r| r.kind == KernelKind::QkDot));
}

/// The decimal codebook literals in the CUDA and Metal sources are the CPU reference's f32
/// values (C compilers round decimal literals correctly, as Rust's parser does).
#[test]
#[allow(clippy::excessive_precision)]
fn cuda_and_metal_tables_match_the_cpu_reference() {
    fn table(src: &str, name: &str) -> Vec<f32> {
        let at = src
            .find(&format!("{name}["))
            .unwrap_or_else(|| panic!("{name}"));
        let body = &src[at..];
        let open = body.find('{').unwrap();
        let close = body.find('}').unwrap();
        body[open + 1..close]
            .split(',')
            .map(|t| t.trim().trim_end_matches('f'))
            .filter(|t| !t.is_empty())
            .map(|t| t.parse::<f32>().unwrap())
            .collect()
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (tq, turbo_src) in [
        (gpu::sources::CUDA_TQ, gpu::sources::CUDA_TURBO),
        (gpu::sources::METAL_TQ, gpu::sources::METAL_TURBO),
    ] {
        assert_eq!(bits(&table(tq, "TQ_C4")), bits(&tqs::C4));
        assert_eq!(bits(&table(tq, "TQ_C3")), bits(&tqs::C3));
        // Turbo codebooks are passed by the host (any table), never hard-coded.
        assert!(!turbo_src.contains("TURBO_CB"));
        assert!(tq.contains("0.17677669529663688f"));
        assert_eq!(
            "0.17677669529663688".parse::<f32>().unwrap(),
            0.176_776_695_296_636_88f32
        );
    }
}

#[test]
fn cli_check_on_cpu_emulation() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args([
            "kernels",
            "check",
            "--backend",
            "cpu",
            "--quick",
            "--types",
            "tq4_1s,turbo2",
        ])
        .env("TQ_CONFORMANCE", conformance_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("backend cpu-emulation"), "{text}");
    assert!(text.contains("tq4_1s   dequantize conformance"), "{text}");
    assert!(text.contains(" 0 failed"), "{text}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(["kernels", "check", "--backend", "cpu", "--types", "q4_0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("has no GPU kernel"));
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_kernels_match_the_cpu_reference() {
    let mut b = match gpu::open_backend(BackendKind::Wgpu) {
        Ok(b) => b,
        Err(e) => {
            wgpu_not_open(&e);
            return;
        }
    };
    let opts = CheckOptions {
        conformance_dir: Some(conformance_dir()),
        ..Default::default()
    };
    let rep = gpu::check(b.as_mut(), &opts).unwrap();
    println!("{}", gpu::format_report(&rep));
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
}

/// `--backend wgpu`: a tiny TQ3_1S model (output projection TQ too) runs its linear layers
/// through the wgpu mat-mul kernels, and the run stays within the bound of the CPU run under
/// both numerics (scripts/ci-gpu.sh does the same on SmolLM2 with `tq validate`).
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_model_run_is_within_the_bound_of_the_cpu_run() {
    use tq::eval::{evaluate, Reference, Windows};
    use tq::model::{Model, Numerics};
    if let Err(e) = gpu::open_linear(BackendKind::Wgpu) {
        wgpu_not_open(&e);
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("tiny.gguf");
    std::fs::write(&src, fixtures::gguf_gen::tiny_llama(2, 64, 128, 100).bytes).unwrap();
    let art = d.path().join("tiny-tq3.gguf");
    let (code, _, err) = fixtures::tq(&[
        "convert",
        fixtures::s(&src),
        "--weights",
        "tq3_1s",
        "--recipe",
        "pure",
        "-q",
        "-o",
        fixtures::s(&art),
    ]);
    assert_eq!(code, 0, "{err}");
    let f = tq::gguf::GgufFile::open(&art).unwrap();
    let ids: Vec<u32> = (0..16 * 4).map(|i| (i * 37 + 11) % 100).collect();
    let win = Windows::new(&ids, 16, None, None).unwrap();
    for numerics in [Numerics::F32, Numerics::Ggml] {
        let mut m = Model::new(&f, numerics).unwrap();
        m.use_backend(BackendKind::Wgpu).unwrap();
        let r = evaluate(&m, &win, Reference::None, None, 4, &|_, _| {}).unwrap();
        let b = r.backend.unwrap();
        assert_eq!(b.on_backend["tq3_1s"], 15, "{b:?}");
        let c = b.comparison.unwrap();
        println!("wgpu {numerics:?}: {}", b_line(&c));
        assert!(c.within_bound, "{c:?}");
    }
}

#[cfg(feature = "wgpu")]
fn b_line(c: &tq::eval::backend::Comparison) -> String {
    format!(
        "KLD mean {:.3e}, max {:.3e}, max |dlogit| {:.3e}",
        c.kld.value, c.kld_max, c.max_abs_logit_diff
    )
}

/// `tq conformance --backend wgpu` runs the tq2_r kernels on the design's vectors and the
/// dequantize kernels on the fork's.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_conformance_backend() {
    let mut b = match gpu::open_backend(BackendKind::Wgpu) {
        Ok(b) => b,
        Err(e) => {
            wgpu_not_open(&e);
            return;
        }
    };
    for (file, ops) in [
        ("seed2bit.json", &["reconstruct[wgpu]", "matvec[wgpu]"][..]),
        ("tq4_1s.json", &["tq4_1s.dequantize[wgpu]"][..]),
        ("turbo2_0.json", &["turbo2.dequantize[wgpu]"][..]),
    ] {
        let rep =
            tq::conformance::run_file_on(&fixtures::conformance(file), Some(b.as_mut())).unwrap();
        assert!(rep.pass(), "{file}: {:?}", rep.failures);
        for op in ops {
            let o = rep.ops.iter().find(|o| o.op == *op).expect(op);
            assert!(o.total > 0 && o.pass == o.total, "{file} {op}");
        }
    }
}

/// A tq2_r kernel with one wrong operation (through `TQ_KERNELS_DIR`) fails `tq kernels check`:
/// the butterfly stage of the multi-pass rotation, the subnormal product of the decode, the GEMV.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_wrong_tq2r_kernels_fail() {
    if let Err(e) = gpu::open_backend(BackendKind::Wgpu) {
        wgpu_not_open(&e);
        return;
    }
    let edits = [
        (
            "dst[lo + step] = a - c;",
            "dst[lo + step] = a - c * 1.0001;",
            "multi-pass",
        ),
        (
            "mag = r + 0x800000u;",
            "mag = r + 0x800001u;",
            "design layout",
        ),
        (
            "acc = acc + bitcast<f32>(tq2r_scale_bits(gb, nblk)) * s;",
            "acc = acc + bitcast<f32>(tq2r_scale_bits(gb, nblk)) * s * 1.001;",
            "matvec",
        ),
    ];
    for (i, (from, to, shows)) in edits.into_iter().enumerate() {
        let (code, text) = check_with_edited_wgsl(&format!("tq2r-{i}"), from, to, "tq2_r");
        assert_eq!(code, Some(2), "{shows}: {text}");
        assert!(
            text.lines()
                .any(|l| l.contains("FAIL") && l.contains(shows)),
            "{shows}: {text}"
        );
    }
}

/// `tq kernels check --backend wgpu --quick --types TY` with the kernel sources of every language
/// copied to a temporary `TQ_KERNELS_DIR` and `from` replaced by `to` in tq2r.wgsl (the 2-bit
/// kernels' file): (exit code, stdout).
#[cfg(feature = "wgpu")]
fn check_with_edited_wgsl(tag: &str, from: &str, to: &str, ty: &str) -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(format!("tq-wrong-{tag}-{}", std::process::id()));
    for (lang, files) in [
        ("cuda", &["common.cuh", "tq.cu", "turbo.cu", "tq2r.cu"][..]),
        (
            "metal",
            &["common.metal", "tq.metal", "turbo.metal", "tq2r.metal"][..],
        ),
        (
            "wgsl",
            &["common.wgsl", "tq.wgsl", "turbo.wgsl", "tq2r.wgsl"][..],
        ),
    ] {
        std::fs::create_dir_all(dir.join(lang)).unwrap();
        for f in files {
            let mut text = gpu::sources::text(lang, f).unwrap();
            if *f == "tq2r.wgsl" {
                assert!(text.contains(from), "{from}");
                text = text.replace(from, to);
            }
            std::fs::write(dir.join(lang).join(f), text).unwrap();
        }
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args([
            "kernels",
            "check",
            "--backend",
            "wgpu",
            "--quick",
            "--types",
            ty,
        ])
        .env("TQ_CONFORMANCE", conformance_dir())
        .env("TQ_KERNELS_DIR", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_kernels_compile_with_nvrtc() {
    if !gpu::cuda::nvrtc_present() {
        if require_nvrtc() {
            panic!("TQ_REQUIRE_NVRTC=1 but libnvrtc was not found (LD_LIBRARY_PATH)");
        }
        // A missing library, not a missing device: a failure under TQ_REQUIRE_DATA=1.
        fixtures::not_run("libnvrtc not found (put the NVRTC lib directory on LD_LIBRARY_PATH)");
        return;
    }
    for arch in [None, Some("compute_80"), Some("compute_90")] {
        match gpu::cuda::compile_kernels(arch) {
            Ok(v) => assert_eq!(v.len(), gpu::cuda::KERNEL_FILES.len()),
            Err(e) => panic!("{arch:?}: {e}"),
        }
    }
    // What the backend loads on a GPU: SASS for the device's own architecture (no PTX JIT, so
    // an older driver than NVRTC still loads it). Every file: tq.cu, turbo.cu, tq2r.cu.
    for sm in ["sm_80", "sm_86", "sm_89", "sm_90"] {
        let v = gpu::cuda::compile_cubins(sm).unwrap_or_else(|e| panic!("{sm}: {e}"));
        assert_eq!(v.len(), 3, "{sm}");
        assert!(v.iter().all(|c| c.starts_with(b"\x7fELF")), "{sm}");
    }
}

/// Whether an NVIDIA device is visible: `Ok(what)` when `nvidia-smi -L` lists a GPU or when
/// libcuda loads and its driver counts a device (the backend's own test, `gpu::cuda`); `Err(why
/// not)` otherwise.
#[cfg(feature = "cuda")]
fn nvidia_device_visible() -> Result<String, String> {
    let smi = std::process::Command::new("nvidia-smi").arg("-L").output();
    if let Ok(o) = &smi {
        let out = String::from_utf8_lossy(&o.stdout);
        if let Some(l) = out.lines().find(|l| l.starts_with("GPU ")) {
            return Ok(format!("nvidia-smi: {l}"));
        }
    }
    let smi = match smi {
        Ok(o) => format!("nvidia-smi -L lists no GPU (exit {:?})", o.status.code()),
        Err(e) => format!("no nvidia-smi ({e})"),
    };
    if !gpu::cuda::libcuda_present() {
        return Err(format!("{smi}; libcuda not found"));
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(format!("libcuda: {n} device(s)")),
        Ok(_) => Err(format!("{smi}; libcuda: 0 devices")),
        Err(e) => Err(format!("{smi}; libcuda: {e:?}")),
    }
}

/// The CUDA kernels on a real GPU. Required wherever an NVIDIA device is visible (the backend
/// failing to open there, NVRTC missing included, fails the test); recorded as "not run: no
/// device" where none is.
#[cfg(feature = "cuda")]
#[test]
fn cuda_kernels_match_the_cpu_reference() {
    let mut b = match (
        gpu::open_backend(BackendKind::Cuda),
        nvidia_device_visible(),
    ) {
        (Ok(b), _) => b,
        (Err(e), Ok(dev)) => {
            panic!("an NVIDIA device is visible ({dev}) but the CUDA backend did not open: {e}")
        }
        (Err(e), Err(why)) => {
            assert!(e.is_absent(), "{e}");
            fixtures::no_device(&format!("{why}; {e}"));
            return;
        }
    };
    let rep = gpu::check(b.as_mut(), &quick_opts()).unwrap();
    println!("{}", gpu::format_report(&rep));
    assert!(rep.pass(), "{}", gpu::format_report(&rep));
}

/// A tq2_t kernel with one wrong operation (through `TQ_KERNELS_DIR`) fails `tq kernels check`:
/// the codeword's centring, the state's wrap-around, the GEMV's per-block scale.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_wrong_tq2t_kernels_fail() {
    if let Err(e) = gpu::open_backend(BackendKind::Wgpu) {
        wgpu_not_open(&e);
        return;
    }
    let edits = [
        (
            "return f32(i32(sum) - 510) * bitcast<f32>(TQ2T_INV_STD);",
            "return f32(i32(sum) - 509) * bitcast<f32>(TQ2T_INV_STD);",
            "dequantize random-bytes",
        ),
        (
            "(j + 64u - t) & 63u",
            "min(j + 64u - t, 127u) & 127u",
            "dequantize random-bytes",
        ),
        (
            "acc = acc + tq2t_scale(rd_byte(base)) * p;",
            "acc = acc + tq2t_scale(rd_byte(base)) * p * 1.001;",
            "matvec",
        ),
    ];
    for (i, (from, to, shows)) in edits.into_iter().enumerate() {
        let (code, text) = check_with_edited_wgsl(&format!("tq2t-{i}"), from, to, "tq2_t");
        assert_eq!(code, Some(2), "{shows}: {text}");
        assert!(
            text.lines()
                .any(|l| l.contains("FAIL") && l.contains("tq2_t") && l.contains(shows)),
            "{shows}: {text}"
        );
    }
}

/// The kernel sources of every language copied to a fresh temporary `TQ_KERNELS_DIR` with the
/// turbo files made invalid, then `tq kernels check --backend auto --quick --types turbo2` on
/// them: (exit code, stdout + stderr).
fn auto_check_with_broken_turbo_kernels() -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(format!("tq-broken-kernels-{}", std::process::id()));
    for (lang, files) in [
        ("cuda", ["common.cuh", "tq.cu", "turbo.cu", "tq2r.cu"]),
        (
            "metal",
            ["common.metal", "tq.metal", "turbo.metal", "tq2r.metal"],
        ),
        (
            "wgsl",
            ["common.wgsl", "tq.wgsl", "turbo.wgsl", "tq2r.wgsl"],
        ),
    ] {
        std::fs::create_dir_all(dir.join(lang)).unwrap();
        for f in files {
            let mut text = gpu::sources::text(lang, f).unwrap();
            if f.starts_with("turbo") {
                text.push_str("\nthis is not valid kernel code;\n");
            }
            std::fs::write(dir.join(lang).join(f), text).unwrap();
        }
    }
    let run = |kernels: Option<&std::path::Path>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_tq"));
        c.args([
            "kernels",
            "check",
            "--backend",
            "auto",
            "--quick",
            "--types",
            "turbo2",
        ])
        .env("TQ_CONFORMANCE", conformance_dir());
        if let Some(k) = kernels {
            c.env("TQ_KERNELS_DIR", k);
        }
        let o = c.output().unwrap();
        (
            o.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    let r = run(Some(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Built without a GPU backend (no `--features wgpu` / `cuda`), `--backend auto` has nothing to
/// compile the broken kernels with: every backend is absent and skipped with its reason (none
/// counted as failed), and the command says that no GPU backend is available. (The compile-error
/// test below needs a backend built in; scripts/ci-gpu.sh runs it with both.)
#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
#[test]
fn auto_without_gpu_backends_skips_them_all() {
    let (_, text) = auto_check_with_broken_turbo_kernels();
    assert!(!text.contains("FAILED"), "{text}");
    for b in ["cuda", "wgpu", "metal"] {
        assert!(text.contains(&format!("{b}: skipped")), "{b}: {text}");
    }
    assert!(text.contains("no GPU backend available"), "{text}");
}

/// `--backend auto` skips absent backends but counts a backend whose kernels do not compile as a
/// failure (exit 2, `FAILED`): a broken turbo kernel (through `TQ_KERNELS_DIR`) must not pass as
/// "skipped". Runs where a compiler is present: NVRTC (CUDA, even with no GPU) or a wgpu adapter;
/// without one it is recorded as not run (missing NVRTC: `fixtures::not_run`; only a missing wgpu
/// adapter: "no device").
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn auto_counts_kernel_compile_errors_as_failures() {
    let (code, text) = auto_check_with_broken_turbo_kernels();
    let compilers = text.contains("cuda: FAILED") || text.contains("wgpu: FAILED");
    if !compilers {
        // Neither NVRTC nor a wgpu adapter here: every backend is absent and skipped.
        assert!(!text.contains("FAILED"), "{text}");
        assert!(text.contains("skipped"), "{text}");
        if require_gpu() || require_nvrtc() {
            panic!("CI: a compiler was required but the broken kernels were not compiled:\n{text}");
        }
        let why = format!("no NVRTC and no wgpu adapter: {}", text.trim());
        if cfg!(feature = "cuda") {
            fixtures::not_run(&why);
        } else {
            fixtures::no_device(&why);
        }
        return;
    }
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("NVRTC rejected kernels/cuda/turbo.cu") || text.contains("turbo.wgsl"),
        "{text}"
    );
    assert!(
        !text.contains("cuda: skipped (libcuda not found; kernels compile"),
        "{text}"
    );
}

/// Absent backends are skipped, and the reason is printed: Metal off macOS, and a backend that is
/// not built in.
#[test]
fn auto_skips_absent_backends() {
    match gpu::open_backend(BackendKind::Metal) {
        Err(e) if !cfg!(target_os = "macos") => assert!(e.is_absent(), "{e}"),
        _ => {}
    }
    #[cfg(not(feature = "cuda"))]
    assert!(gpu::open_backend(BackendKind::Cuda)
        .err()
        .unwrap()
        .is_absent());
    #[cfg(not(feature = "wgpu"))]
    assert!(gpu::open_backend(BackendKind::Wgpu)
        .err()
        .unwrap()
        .is_absent());
}
