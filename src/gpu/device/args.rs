//! The arguments of one kernel launch, as every backend maps them to its binding scheme.

use super::super::TurboSpec;

/// A turbo layout as the kernels take it: CUDA arguments, Metal's `lay` buffer, WGSL params.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TurboParams {
    pub group: u32,
    pub bytes: u32,
    pub hdr: u32,
}

impl TurboParams {
    pub(super) fn of(spec: &TurboSpec) -> TurboParams {
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
    pub(super) fn new(out: &'a B, n: u32) -> Self {
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

pub(super) fn tq2r_args<'a, B>(
    signs: Option<&'a B>,
    mat: Option<&'a B>,
    p: Tq2rParams,
) -> Option<Tq2rArgs<'a, B>> {
    Some(Tq2rArgs { signs, mat, p })
}
