//! The kernel-entry table: for every (type, operation) the entry point, the source file that
//! holds it and its launch geometry. It is the one place that knows these; every backend (CUDA,
//! Metal, wgpu and the CPU emulation) reads it through [`kernel`], and the operations built on it
//! (`gpu/device.rs`) compute each launch's grid from it. The entry names are the same in the three
//! kernel languages (a test checks each is defined in every source).

use crate::error::{Error, Result};
use crate::types::TensorType;

/// Threads per key row of the turbo Q·K kernels in every backend. The CUDA and Metal kernels
/// reduce through `part[4]`, one partial per 32-wide warp/SIMD group, so they must be launched
/// with exactly this many threads (CUDA also declares `__launch_bounds__(128)`); WGSL's
/// `@workgroup_size(128)` fixes it in the source.
pub const TURBO_QK_THREADS: usize = 128;
const _: () = assert!(
    TURBO_QK_THREADS == 128,
    "part[4]: one partial per 32-lane warp"
);

/// What a kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Whole blocks to f32 (TQ: original domain; turbo: rotated domain).
    Dequantize,
    /// Forward rotation of each 32-block of an activation: the mat-vec's first launch.
    Prerotate,
    /// `y[r] = W[r]·x̂` over the pre-rotated activation (TQ weights).
    MatVec,
    /// `Y[t][r] = W[r]·X̂[t]` for many pre-rotated activation rows at once (TQ weights; the model
    /// runtime's `--backend`).
    MatMul,
    /// `score[r] = q̂ · K[r]` over a pre-rotated query (turbo keys).
    TurboQk,
    /// tq2_r's whole-row rotation `R·x` (or `Rᵀ·y`) of rows of at most [`ROTATE_MAX`] values,
    /// one workgroup per row, the row in workgroup memory (the design's input rotation).
    Rotate,
    /// Rows longer than [`ROTATE_MAX`], first launch: signs and the butterfly stages inside
    /// sub-blocks of at most [`ROTATE_MAX`] values, into a scratch vector.
    RotateLocal,
    /// Rows longer than [`ROTATE_MAX`]: one butterfly stage on the scratch vector, in place.
    RotateStage,
    /// Rows longer than [`ROTATE_MAX`], last launch: the dense factor and the scale (inverse:
    /// and the signs), scratch → output.
    RotateMix,
}

/// The longest row [`Op::Rotate`] takes, and the longest sub-block of [`Op::RotateLocal`]: 4096
/// f32 in workgroup memory, 16 KiB (WebGPU's default limit; CUDA and Metal allow more).
pub const ROTATE_MAX: usize = 4096;

/// The kernel file an entry point is in; each backend compiles both when it opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Module {
    /// `kernels/<lang>/tq.*`
    Tq,
    /// `kernels/<lang>/turbo.*`
    Turbo,
    /// `kernels/<lang>/tq2r.*`
    Tq2r,
}

/// What a kernel's work items are: what [`Geometry::per_group`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Packed blocks (TQ dequantize) or 32-value blocks of the activation (prerotate).
    Block,
    /// Output values (turbo dequantize, tq2_r mix) or butterfly pairs (tq2_r stage): one thread
    /// each, any number per workgroup.
    Value,
    /// Matrix or key rows (mat-vec, Q·K), or rows of the tq2_r rotation.
    Row,
    /// Matrix rows × tiles of [`MATMUL_TOKENS`] activation rows (mat-mul): `per_group` rows per
    /// workgroup, one workgroup per (row group, token tile).
    RowTokens,
}

/// Activation rows (tokens) each mat-mul work item multiplies: `MM_TOKENS` / `TQ_MM_TOKENS` in
/// every kernel language (a test checks them). The host pads the activation to a multiple.
pub const MATMUL_TOKENS: usize = 8;

/// Which geometry column of the table a backend launches with: the two kernel styles differ for
/// the mat-vec only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// CUDA and Metal: warp / SIMD-group shuffles over 32 lanes.
    #[allow(dead_code)] // constructed by the feature-gated CUDA and Metal backends only
    Simt,
    /// WGSL: reductions through workgroup memory (also the order the CPU emulation sums in).
    Wgsl,
}

/// Threads per workgroup (CUDA block, Metal threadgroup) and the work items each covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub threads: u32,
    pub per_group: usize,
}

/// One kernel entry point.
#[derive(Debug)]
pub(crate) struct Kernel {
    /// The type it decodes; `None` for the type-independent prerotate.
    pub ty: Option<TensorType>,
    pub op: Op,
    pub entry: &'static str,
    #[allow(dead_code)] // read by the feature-gated GPU backends only
    pub module: Module,
    pub unit: Unit,
    pub simt: Geometry,
    pub wgsl: Geometry,
}

impl Kernel {
    pub fn geometry(&self, d: Dialect) -> Geometry {
        match d {
            Dialect::Simt => self.simt,
            Dialect::Wgsl => self.wgsl,
        }
    }
}

const fn geo(threads: u32, per_group: usize) -> Geometry {
    Geometry { threads, per_group }
}

const fn k(
    ty: Option<TensorType>,
    op: Op,
    entry: &'static str,
    module: Module,
    unit: Unit,
    simt: Geometry,
    wgsl: Geometry,
) -> Kernel {
    Kernel {
        ty,
        op,
        entry,
        module,
        unit,
        simt,
        wgsl,
    }
}

const TQ4: Option<TensorType> = Some(TensorType::TQ4_1S);
const TQ3: Option<TensorType> = Some(TensorType::TQ3_1S);
const T2: Option<TensorType> = Some(TensorType::Turbo2);
const T3: Option<TensorType> = Some(TensorType::Turbo3);
const T4: Option<TensorType> = Some(TensorType::Turbo4);
const TQ2R: Option<TensorType> = Some(TensorType::TQ2R);
const TQ2T: Option<TensorType> = Some(TensorType::TQ2T);
const QK_GEO: Geometry = geo(TURBO_QK_THREADS as u32, 1);

/// Every kernel. Dequantize: 256 threads = 8 blocks of 32 (TQ, tq2_r), or one thread per value,
/// 128 per group (turbo). Prerotate: 8 blocks of 32 per 256 threads (CUDA, Metal), or one thread
/// per block, 64 per workgroup, no barriers (WGSL). Mat-vec: one 32-lane warp/SIMD group per row,
/// 4 rows per 128 threads (CUDA, Metal), or one 64-thread workgroup per row (WGSL TQ) or 32 lanes
/// per row, 8 rows per 256 threads (WGSL tq2_r). Mat-mul: per token tile, one warp per row, 4 rows
/// per 128 threads (CUDA, Metal), or one thread per 2 rows, 128 rows per workgroup (WGSL). Q·K:
/// one 128-thread workgroup per key row ([`TURBO_QK_THREADS`]). tq2_r rotation: one 256-thread
/// workgroup per row (≤ [`ROTATE_MAX`]) or per sub-block, then one thread per butterfly pair /
/// output value. tq2_t (in the tq2_r files: same bindings and scalars, and it rotates with tq2_r's
/// rotation kernels): decode one thread per value, 256 threads = 4 blocks of 64; mat-vec one warp /
/// 32 lanes per row, as tq2_r's.
#[rustfmt::skip]
pub(crate) static KERNELS: [Kernel; 21] = [
    //  type  op              entry             module          unit         simt            wgsl
    k(TQ4,  Op::Dequantize, "tq4_dequant",    Module::Tq,    Unit::Block, geo(256, 8),    geo(256, 8)),
    k(TQ3,  Op::Dequantize, "tq3_dequant",    Module::Tq,    Unit::Block, geo(256, 8),    geo(256, 8)),
    k(None, Op::Prerotate,  "tq_prerotate",   Module::Tq,    Unit::Block, geo(256, 8),    geo(64, 64)),
    k(TQ4,  Op::MatVec,     "tq4_matvec",     Module::Tq,    Unit::Row,   geo(128, 4),    geo(64, 1)),
    k(TQ3,  Op::MatVec,     "tq3_matvec",     Module::Tq,    Unit::Row,   geo(128, 4),    geo(64, 1)),
    k(TQ4,  Op::MatMul,     "tq4_matmul",     Module::Tq,    Unit::RowTokens, geo(128, 4), geo(64, 128)),
    k(TQ3,  Op::MatMul,     "tq3_matmul",     Module::Tq,    Unit::RowTokens, geo(128, 4), geo(64, 128)),
    k(T2,   Op::Dequantize, "turbo2_dequant", Module::Turbo, Unit::Value, geo(128, 128),  geo(128, 128)),
    k(T3,   Op::Dequantize, "turbo3_dequant", Module::Turbo, Unit::Value, geo(128, 128),  geo(128, 128)),
    k(T4,   Op::Dequantize, "turbo4_dequant", Module::Turbo, Unit::Value, geo(128, 128),  geo(128, 128)),
    k(T2,   Op::TurboQk,    "turbo2_qk",      Module::Turbo, Unit::Row,   QK_GEO,         QK_GEO),
    k(T3,   Op::TurboQk,    "turbo3_qk",      Module::Turbo, Unit::Row,   QK_GEO,         QK_GEO),
    k(T4,   Op::TurboQk,    "turbo4_qk",      Module::Turbo, Unit::Row,   QK_GEO,         QK_GEO),
    k(TQ2R, Op::Dequantize, "tq2r_dequant",   Module::Tq2r,  Unit::Block, geo(256, 8),    geo(256, 8)),
    k(TQ2R, Op::MatVec,     "tq2r_matvec",    Module::Tq2r,  Unit::Row,   geo(128, 4),    geo(256, 8)),
    k(TQ2R, Op::Rotate,     "tq2r_rotate",    Module::Tq2r,  Unit::Row,   geo(256, 1),    geo(256, 1)),
    k(TQ2R, Op::RotateLocal,"tq2r_rot_local", Module::Tq2r,  Unit::Block, geo(256, 1),    geo(256, 1)),
    k(TQ2R, Op::RotateStage,"tq2r_rot_stage", Module::Tq2r,  Unit::Value, geo(256, 256),  geo(256, 256)),
    k(TQ2R, Op::RotateMix,  "tq2r_rot_mix",   Module::Tq2r,  Unit::Value, geo(256, 256),  geo(256, 256)),
    k(TQ2T, Op::Dequantize, "tq2t_dequant",   Module::Tq2r,  Unit::Block, geo(256, 4),    geo(256, 4)),
    k(TQ2T, Op::MatVec,     "tq2t_matvec",    Module::Tq2r,  Unit::Row,   geo(128, 4),    geo(256, 8)),
];

/// The kernel for `op` on `ty` (`ty` is ignored for the prerotate), or why there is none.
pub(crate) fn kernel(ty: TensorType, op: Op) -> Result<&'static Kernel> {
    KERNELS
        .iter()
        .find(|k| k.op == op && (op == Op::Prerotate || k.ty == Some(ty)))
        .ok_or_else(|| {
            Error::Unsupported(match op {
                Op::Dequantize => format!("{ty}: no GPU kernel"),
                Op::MatVec => format!("{ty}: no mat-vec kernel"),
                Op::MatMul => format!("{ty}: no mat-mul kernel"),
                Op::TurboQk => format!("{ty}: no Q·K kernel"),
                Op::Rotate | Op::RotateLocal | Op::RotateStage | Op::RotateMix => {
                    format!("{ty}: no whole-row rotation kernel")
                }
                Op::Prerotate => unreachable!("the table has a prerotate"),
            })
        })
}

/// Whether `ty` has a mat-mul kernel: the weights the model runtime can run through a backend.
pub fn has_matmul(ty: TensorType) -> bool {
    kernel(ty, Op::MatMul).is_ok()
}

/// The prerotate kernel of the TQ mat-vec.
pub(crate) fn prerotate() -> &'static Kernel {
    kernel(TensorType::TQ4_1S, Op::Prerotate).expect("the table has a prerotate")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{sources, KERNEL_TYPES};

    /// Every kernel type has a dequantize and its dot kernel, and nothing else is in the table.
    #[test]
    fn table_covers_the_kernel_types() {
        for ty in KERNEL_TYPES {
            assert!(kernel(ty, Op::Dequantize).is_ok(), "{ty}");
            let (tq, rr) = (ty.is_tq_weight(), ty.is_row_rotated());
            assert_eq!(
                kernel(ty, Op::MatVec).is_ok(),
                tq || ty.rotates_rows(),
                "{ty}"
            );
            assert_eq!(kernel(ty, Op::MatMul).is_ok(), tq, "{ty}");
            assert_eq!(has_matmul(ty), tq, "{ty}");
            assert_eq!(kernel(ty, Op::TurboQk).is_ok(), ty.is_turbo(), "{ty}");
            // tq2_t rotates with tq2_r's kernels (the same R).
            for op in [Op::Rotate, Op::RotateLocal, Op::RotateStage, Op::RotateMix] {
                assert_eq!(kernel(ty, op).is_ok(), rr, "{ty} {op:?}");
            }
        }
        for k in &KERNELS {
            assert!(
                k.ty.is_none_or(|t| KERNEL_TYPES.contains(&t)),
                "{}",
                k.entry
            );
            assert!((k.simt.threads as usize).is_multiple_of(32) && k.wgsl.threads > 0);
        }
        assert!(kernel(TensorType::Q4_0, Op::Dequantize).is_err());
        assert_eq!(prerotate().entry, "tq_prerotate");
    }

    /// The mat-mul's token tile is the same number in the table and every kernel language.
    #[test]
    fn matmul_token_tile_is_the_same_everywhere() {
        let n = MATMUL_TOKENS;
        assert!(sources::WGSL_TQ.contains(&format!("const MM_TOKENS: u32 = {n}u;")));
        assert!(sources::CUDA_TQ.contains(&format!("#define TQ_MM_TOKENS {n}\n")));
        assert!(sources::METAL_TQ.contains(&format!("#define TQ_MM_TOKENS {n}\n")));
    }

    /// Each entry point is defined in its module in every language (WGSL with the table's size).
    #[test]
    fn entries_exist_in_every_language() {
        for k in &KERNELS {
            let (cuda, metal, wgsl) = match k.module {
                Module::Tq => (sources::CUDA_TQ, sources::METAL_TQ, sources::WGSL_TQ),
                Module::Tq2r => (sources::CUDA_TQ2R, sources::METAL_TQ2R, sources::WGSL_TQ2R),
                Module::Turbo => (
                    sources::CUDA_TURBO,
                    sources::METAL_TURBO,
                    sources::WGSL_TURBO,
                ),
            };
            // The turbo kernels are defined through macros: `TURBO_QK(turbo2_qk, ...)`.
            let defined = |src: &str, forms: &[String]| forms.iter().any(|f| src.contains(f));
            let e = k.entry;
            let macro_use = format!("({e},");
            assert!(
                defined(cuda, &[format!("void {e}("), macro_use.clone()]),
                "cuda {e}"
            );
            assert!(
                defined(metal, &[format!("void {e}("), macro_use.clone()]),
                "metal {e}"
            );
            // WGSL fixes the workgroup size in the source: it must be the table's.
            let wgsl_def = format!("@workgroup_size({})\nfn {e}(", k.wgsl.threads);
            assert!(wgsl.contains(&wgsl_def), "wgsl {e}: {wgsl_def}");
        }
    }
}
