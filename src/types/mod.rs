//! The tensor-type registry: one row per type, like ggml's `type_traits`. Every other part of
//! `tq` (reader, writer, planner, runtime, validator) asks this table instead of matching on
//! names. Type *ids* are not here: they depend on the target engine and live in [`profile`].
//!
//! Adding a type = one enum variant + one row in [`TYPES`] (+ its kernels in a module of its own).

mod carried;
pub mod float;
pub(crate) mod fp4;
pub(crate) mod grid;
pub(crate) mod iquants;
pub(crate) mod kquants;
pub(crate) mod legacy;
mod parse;
pub mod profile;
pub mod seed2bit;
pub(crate) mod ternary;
pub mod tq;
pub mod tq2r;
pub mod tq2t;
pub mod turbo;

use crate::error::{Error, Result};

/// Decode `blocks` (a whole number of blocks) into `out` (`blocks.len() / block_bytes * block_size`
/// values).
pub type DequantizeFn = fn(blocks: &[u8], out: &mut [f32]);
/// Encode `src` (a whole number of blocks) into `out` (`src.len() / block_size * block_bytes` bytes).
pub type QuantizeFn = fn(src: &[f32], out: &mut [u8]);

/// Every tensor type `tq` knows, stock ggml and TurboQuant. The discriminant is an index into
/// [`TYPES`], not a GGUF type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
    // TurboQuant (ids assigned by a target profile)
    TQ3_1S,
    TQ4_1S,
    Turbo2,
    Turbo3,
    Turbo4,
    // tq's own (id assigned by a target profile)
    TQ2R,
    TQ2T,
}

/// Where a type comes from, which decides whether it has a fixed GGUF id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Upstream ggml; the id is the same in every engine.
    Stock(u32),
    /// TurboQuant fork type; the id comes from the target profile.
    TurboQuant,
}

/// What kind of format a type is. Callers ask the family (through [`TensorType::is_float`],
/// [`TensorType::is_quantized`], [`TensorType::is_tq_weight`], [`TensorType::is_turbo`]) instead
/// of listing types, so a new type needs only its row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// f32, f16, bf16: the float formats weights arrive in and that `tq` quantizes from.
    Float,
    /// Integer tensors and f64: carried as they are, never quantized.
    Raw,
    /// ggml's scale + bits blocks: Q4_0 … Q8_1, and the newer Q1_0 / Q2_0.
    Legacy,
    /// ggml's 256-value super-blocks: Q2_K … Q8_K.
    KQuant,
    /// ggml's grid and non-linear formats: IQ1_S … IQ4_XS.
    IQuant,
    /// ggml's ternary TQ1_0 / TQ2_0 (not TurboQuant).
    Ternary,
    /// Micro-scaled 4-bit floats: MXFP4, NVFP4.
    Fp4,
    /// TurboQuant weight blocks: TQ3_1S, TQ4_1S (rotated 32-value blocks).
    TqWeight,
    /// TurboQuant KV-cache blocks: turbo2, turbo3, turbo4.
    TurboKv,
    /// Blocks of a whole-row rotated row (tq2_r): the registry's block functions are the
    /// rotated-domain codec; [`quantize_rows`] / [`dequantize_rows`] add the row rotation.
    RowRotated,
    /// Trellis-coded blocks of a whole-row rotated row (tq2_t): read and written by rows like
    /// [`Family::RowRotated`], with its own codec (no GPU kernels yet).
    RowTrellis,
}

/// Encode one row (its length a whole number of blocks) into `out`.
pub type QuantizeRowFn = fn(src: &[f32], out: &mut [u8]) -> Result<()>;
/// Decode one row of blocks into `out` (the row's values).
pub type DequantizeRowFn = fn(blocks: &[u8], out: &mut [f32]) -> Result<()>;

/// A type whose blocks hold a transform of the *whole row* (tq2_r, tq2_t): the block functions of
/// [`TypeInfo`] are the transformed-domain codec, these take a row in the original basis (the
/// row transform included). [`quantize_rows`] / [`dequantize_rows`] go through them.
#[derive(Clone, Copy)]
pub struct RowCodec {
    pub quantize_row: QuantizeRowFn,
    pub dequantize_row: DequantizeRowFn,
}

/// Which LDLQ sweep (`quant::ldlq`) rounds a type ([`TensorType::ldlq`]), read from its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LdlqKind {
    /// TQ weights: the sweep in the 32-block rotated domain, one scale per half-block.
    Rotated,
    /// Stock types with a fixed-grid encoder (`grid`): in the weights' own basis, act-order.
    Stock,
    /// tq2_r: the sweep in the whole-row rotated domain.
    RowRotated,
    /// tq2_t: block-LDLQ in the whole-row rotated domain, the trellis as each block's quantizer.
    Trellis,
    /// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: in the weights' own basis, natural order, 4- or 8-value
    /// grid rows as the sweep's vector quantizer (scales from llama.cpp's weighted encoder).
    Lattice,
    /// The IQ2 grid types: in the weights' own basis and natural order, the block scales fixed by
    /// the importance-weighted encoder, each 8-value group rounded to a grid row and signs.
    IqGrid,
}

pub struct TypeInfo {
    pub ty: TensorType,
    /// Lower-case name as llama.cpp / gguf-py print it (`q4_0`, `q4_K`, `tq4_1s`).
    pub name: &'static str,
    pub origin: Origin,
    pub family: Family,
    pub block_size: usize,
    pub block_bytes: usize,
    pub dequantize: Option<DequantizeFn>,
    pub quantize: Option<QuantizeFn>,
    /// Whole rows in the original basis, for types that transform whole rows (`None`: a row is
    /// its blocks).
    pub row: Option<RowCodec>,
}

macro_rules! row {
    ($ty:ident, $name:literal, $origin:expr, $family:ident, $bs:expr, $bb:expr, $deq:expr, $q:expr) => {
        row!($ty, $name, $origin, $family, $bs, $bb, $deq, $q, None)
    };
    ($ty:ident, $name:literal, $origin:expr, $family:ident, $bs:expr, $bb:expr, $deq:expr, $q:expr; rows: $qr:expr, $dr:expr) => {
        row!(
            $ty,
            $name,
            $origin,
            $family,
            $bs,
            $bb,
            $deq,
            $q,
            Some(RowCodec {
                quantize_row: $qr,
                dequantize_row: $dr
            })
        )
    };
    ($ty:ident, $name:literal, $origin:expr, $family:ident, $bs:expr, $bb:expr, $deq:expr, $q:expr, $row:expr) => {
        TypeInfo {
            ty: TensorType::$ty,
            name: $name,
            origin: $origin,
            family: Family::$family,
            block_size: $bs,
            block_bytes: $bb,
            dequantize: $deq,
            quantize: $q,
            row: $row,
        }
    };
}

use carried as c;
use Origin::{Stock, TurboQuant};

/// The registry. Order matches [`TensorType`] (checked by a test). Sizes come from each format's
/// layout constants, which compile-time asserts tie to the block's field arithmetic; stock sizes
/// follow ggml's `type_traits` (gguf-py's table is checked against this one in tests; note
/// gguf-py still lists Q8_1 as 40 bytes, ggml's `block_q8_1` is 36 since its scales became f16).
#[rustfmt::skip]
pub static TYPES: &[TypeInfo] = &[
    //   type     name        origin       family     values per block  bytes per block         dequantize                         quantize
    row!(F32,     "f32",      Stock(0),    Float,     1,                size_of::<f32>(),       Some(float::dequantize_f32),       Some(float::quantize_f32)),
    row!(F16,     "f16",      Stock(1),    Float,     1,                size_of::<u16>(),       Some(float::dequantize_f16),       Some(float::quantize_f16)),
    row!(Q4_0,    "q4_0",     Stock(2),    Legacy,    legacy::QK,       legacy::Q4_0_BYTES,     Some(legacy::dequantize_q4_0),     Some(legacy::quantize_q4_0)),
    row!(Q4_1,    "q4_1",     Stock(3),    Legacy,    legacy::QK,       legacy::Q4_1_BYTES,     Some(legacy::dequantize_q4_1),     Some(legacy::quantize_q4_1)),
    row!(Q5_0,    "q5_0",     Stock(6),    Legacy,    legacy::QK,       legacy::Q5_0_BYTES,     Some(legacy::dequantize_q5_0),     Some(legacy::quantize_q5_0)),
    row!(Q5_1,    "q5_1",     Stock(7),    Legacy,    legacy::QK,       legacy::Q5_1_BYTES,     Some(legacy::dequantize_q5_1),     Some(legacy::quantize_q5_1)),
    row!(Q8_0,    "q8_0",     Stock(8),    Legacy,    legacy::QK,       legacy::Q8_0_BYTES,     Some(legacy::dequantize_q8_0),     Some(legacy::quantize_q8_0)),
    row!(Q8_1,    "q8_1",     Stock(9),    Legacy,    c::QK8_1,         c::Q8_1_BYTES,          None,                              None),
    row!(Q2K,     "q2_K",     Stock(10),   KQuant,    kquants::QK_K,    kquants::Q2_K_BYTES,    Some(kquants::dequantize_q2_k),    Some(kquants::quantize_q2_k)),
    row!(Q3K,     "q3_K",     Stock(11),   KQuant,    kquants::QK_K,    kquants::Q3_K_BYTES,    Some(kquants::dequantize_q3_k),    Some(kquants::quantize_q3_k)),
    row!(Q4K,     "q4_K",     Stock(12),   KQuant,    kquants::QK_K,    kquants::Q4_K_BYTES,    Some(kquants::dequantize_q4_k),    Some(kquants::quantize_q4_k)),
    row!(Q5K,     "q5_K",     Stock(13),   KQuant,    kquants::QK_K,    kquants::Q5_K_BYTES,    Some(kquants::dequantize_q5_k),    Some(kquants::quantize_q5_k)),
    row!(Q6K,     "q6_K",     Stock(14),   KQuant,    kquants::QK_K,    kquants::Q6_K_BYTES,    Some(kquants::dequantize_q6_k),    Some(kquants::quantize_q6_k)),
    row!(Q8K,     "q8_K",     Stock(15),   KQuant,    kquants::QK_K,    c::Q8_K_BYTES,          None,                              None),
    row!(IQ2XXS,  "iq2_xxs",  Stock(16),   IQuant,    kquants::QK_K,    iquants::IQ2_XXS_BYTES, Some(iquants::dequantize_iq2_xxs), Some(iquants::quantize_iq2_xxs)),
    row!(IQ2XS,   "iq2_xs",   Stock(17),   IQuant,    kquants::QK_K,    iquants::IQ2_XS_BYTES,  Some(iquants::dequantize_iq2_xs),  Some(iquants::quantize_iq2_xs)),
    row!(IQ3XXS,  "iq3_xxs",  Stock(18),   IQuant,    kquants::QK_K,    iquants::IQ3_XXS_BYTES, Some(iquants::dequantize_iq3_xxs), Some(iquants::quantize_iq3_xxs)),
    row!(IQ1S,    "iq1_s",    Stock(19),   IQuant,    kquants::QK_K,    iquants::IQ1_S_BYTES,   Some(iquants::dequantize_iq1_s),   Some(iquants::quantize_iq1_s)),
    row!(IQ4NL,   "iq4_nl",   Stock(20),   IQuant,    iquants::QK4_NL,  iquants::IQ4_NL_BYTES,  Some(iquants::dequantize_iq4_nl),  Some(iquants::quantize_iq4_nl)),
    row!(IQ3S,    "iq3_s",    Stock(21),   IQuant,    kquants::QK_K,    iquants::IQ3_S_BYTES,   Some(iquants::dequantize_iq3_s),   Some(iquants::quantize_iq3_s)),
    row!(IQ2S,    "iq2_s",    Stock(22),   IQuant,    kquants::QK_K,    iquants::IQ2_S_BYTES,   Some(iquants::dequantize_iq2_s),   Some(iquants::quantize_iq2_s)),
    row!(IQ4XS,   "iq4_xs",   Stock(23),   IQuant,    iquants::QK_K,    iquants::IQ4_XS_BYTES,  Some(iquants::dequantize_iq4_xs),  Some(iquants::quantize_iq4_xs)),
    row!(I8,      "i8",       Stock(24),   Raw,       1,                size_of::<i8>(),        None,                              None),
    row!(I16,     "i16",      Stock(25),   Raw,       1,                size_of::<i16>(),       None,                              None),
    row!(I32,     "i32",      Stock(26),   Raw,       1,                size_of::<i32>(),       None,                              None),
    row!(I64,     "i64",      Stock(27),   Raw,       1,                size_of::<i64>(),       None,                              None),
    row!(F64,     "f64",      Stock(28),   Raw,       1,                size_of::<f64>(),       None,                              None),
    row!(IQ1M,    "iq1_m",    Stock(29),   IQuant,    kquants::QK_K,    iquants::IQ1_M_BYTES,   Some(iquants::dequantize_iq1_m),   Some(iquants::quantize_iq1_m)),
    row!(BF16,    "bf16",     Stock(30),   Float,     1,                size_of::<u16>(),       Some(float::dequantize_bf16),      Some(float::quantize_bf16)),
    row!(TQ1_0,   "tq1_0",    Stock(34),   Ternary,   kquants::QK_K,    ternary::TQ1_0_BYTES,   Some(ternary::dequantize_tq1_0),   Some(ternary::quantize_tq1_0)),
    row!(TQ2_0,   "tq2_0",    Stock(35),   Ternary,   kquants::QK_K,    ternary::TQ2_0_BYTES,   Some(ternary::dequantize_tq2_0),   Some(ternary::quantize_tq2_0)),
    row!(MXFP4,   "mxfp4",    Stock(39),   Fp4,       fp4::QK_MXFP4,    fp4::MXFP4_BYTES,       Some(fp4::dequantize_mxfp4),       Some(fp4::quantize_mxfp4)),
    row!(NVFP4,   "nvfp4",    Stock(40),   Fp4,       fp4::QK_NVFP4,    fp4::NVFP4_BYTES,       Some(fp4::dequantize_nvfp4),       None),
    row!(Q1_0,    "q1_0",     Stock(41),   Legacy,    legacy::QK1_0,    legacy::Q1_0_BYTES,     Some(legacy::dequantize_q1_0),     None),
    row!(Q2_0,    "q2_0",     Stock(42),   Legacy,    legacy::QK2_0,    legacy::Q2_0_BYTES,     Some(legacy::dequantize_q2_0),     None),
    row!(TQ3_1S,  "tq3_1s",   TurboQuant,  TqWeight,  tq::QK,           tq::TQ3_BYTES,          Some(tq::dequantize_tq3_1s),       Some(tq::quantize_tq3_1s)),
    row!(TQ4_1S,  "tq4_1s",   TurboQuant,  TqWeight,  tq::QK,           tq::TQ4_BYTES,          Some(tq::dequantize_tq4_1s),       Some(tq::quantize_tq4_1s)),
    row!(Turbo2,  "turbo2",   TurboQuant,  TurboKv,   turbo::QK_TURBO,  turbo::TURBO2_BYTES,    Some(turbo::dequantize_turbo2),    Some(turbo::quantize_turbo2)),
    row!(Turbo3,  "turbo3",   TurboQuant,  TurboKv,   turbo::QK_TURBO,  turbo::TURBO3_BYTES,    Some(turbo::dequantize_turbo3),    Some(turbo::quantize_turbo3)),
    row!(Turbo4,  "turbo4",   TurboQuant,  TurboKv,   turbo::QK_TURBO,  turbo::TURBO4_BYTES,    Some(turbo::dequantize_turbo4),    Some(turbo::quantize_turbo4)),
    row!(TQ2R,    "tq2_r",    TurboQuant,  RowRotated, tq2r::QK,        tq2r::TQ2R_BYTES,       Some(tq2r::dequantize_tq2r_rotated), Some(tq2r::quantize_tq2r_rotated);
         rows: tq2r::quantize_row, tq2r::dequantize_row),
    row!(TQ2T,    "tq2_t",    TurboQuant,  RowTrellis, tq2t::QK,        tq2t::TQ2T_BYTES,       Some(tq2t::dequantize_tq2t_rotated), Some(tq2t::quantize_tq2t_rotated);
         rows: tq2t::quantize_row, tq2t::dequantize_row),
];

impl TensorType {
    pub fn info(self) -> &'static TypeInfo {
        &TYPES[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Case-insensitive lookup by name (`Q4_K`, `q4_k`, `tq4_1s`, `turbo3_0` also accepted).
    pub fn from_name(name: &str) -> Option<TensorType> {
        let n = name.to_ascii_lowercase();
        let n = n
            .strip_suffix("_0")
            .filter(|s| s.starts_with("turbo"))
            .unwrap_or(&n);
        TYPES
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(n))
            .map(|t| t.ty)
    }

    /// The stock ggml id, if any (TurboQuant types get theirs from a profile).
    pub fn stock_id(self) -> Option<u32> {
        match self.info().origin {
            Origin::Stock(id) => Some(id),
            Origin::TurboQuant => None,
        }
    }

    pub fn family(self) -> Family {
        self.info().family
    }

    /// f32, f16 or bf16: a float format `tq` quantizes from (not f64, which is carried raw).
    pub fn is_float(self) -> bool {
        self.family() == Family::Float
    }

    /// A block-quantized format (neither a float nor a raw integer/f64 type).
    pub fn is_quantized(self) -> bool {
        !matches!(self.family(), Family::Float | Family::Raw)
    }

    /// A TurboQuant weight type (TQ3_1S, TQ4_1S).
    pub fn is_tq_weight(self) -> bool {
        self.family() == Family::TqWeight
    }

    /// A TurboQuant KV-cache type (turbo2, turbo3, turbo4).
    pub fn is_turbo(self) -> bool {
        self.family() == Family::TurboKv
    }

    /// Banded LDLQ can round this type (`quant::ldlq`): the TQ weights and the row-rotated types
    /// (in their rotated domain), and the stock types with a fixed-grid encoder ([`grid`]:
    /// q8_0, q4_0, q4_1, q5_0, q5_1, q2_K … q6_K, iq4_nl, iq4_xs; no rotation, ordinary blocks), and the
    /// i-quant grid types: iq3_xxs, iq3_s, iq1_s, iq1_m (their grid rows as the sweep's vector
    /// quantizer) and the IQ2 types group by group.
    pub fn has_ldlq(self) -> bool {
        self.ldlq().is_some()
    }

    /// Which LDLQ sweep rounds this type, if any: read from the family (the TQ weights, tq2_r,
    /// tq2_t) or, for stock types, from whether `grid` has a fixed-grid encoder for it.
    pub fn ldlq(self) -> Option<LdlqKind> {
        match self.family() {
            Family::TqWeight => Some(LdlqKind::Rotated),
            Family::RowRotated => Some(LdlqKind::RowRotated),
            Family::RowTrellis => Some(LdlqKind::Trellis),
            _ if grid::supports(self) => Some(LdlqKind::Stock),
            _ if iquants::iq3_quant::has_lattice_ldlq(self) => Some(LdlqKind::Lattice),
            _ if iquants::iq2_groups::supports(self) => Some(LdlqKind::IqGrid),
            _ => None,
        }
    }

    /// LDLQ rounds this type in the weights' own basis (a stock type: engines do not rotate).
    pub fn ldlq_unrotated(self) -> bool {
        self.ldlq() == Some(LdlqKind::Stock)
    }

    /// An importance matrix (`--imatrix`) weights this type's encoder: the stock types with a
    /// fixed-grid encoder ([`grid`]) and the i-quants encoded as llama-quantize does with one
    /// (`iquants::weighted_encoder`).
    pub fn imatrix_weighted(self) -> bool {
        self.ldlq_unrotated() || weighted_encoder(self).is_some()
    }

    /// Blocks hold tq2_r's whole-row rotated row (tq2_r, tq2_t; the registry gives them a
    /// [`RowCodec`]): rows go through [`quantize_rows`] / [`dequantize_rows`] and the file
    /// records the rotation (`tq2r::META_ROTATION`).
    pub fn rotates_rows(self) -> bool {
        self.info().row.is_some()
    }

    /// Blocks hold a whole-row rotated row (tq2_r): rows go through [`quantize_rows`] /
    /// [`dequantize_rows`], and the file records the rotation (`tq2r::META_ROTATION`).
    pub fn is_row_rotated(self) -> bool {
        self.family() == Family::RowRotated
    }

    pub fn block_size(self) -> usize {
        self.info().block_size
    }

    pub fn block_bytes(self) -> usize {
        self.info().block_bytes
    }

    /// Bytes of `n` values of this type, or `None` when `n` is not a whole number of blocks or
    /// the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.block_bytes() as u64)
    }

    /// Bits per weight of the format itself.
    pub fn bpw(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / self.block_size() as f64
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The types whose importance-weighted encoder is llama.cpp's own, byte for byte with
/// `llama-quantize --imatrix` (`Encoder::Weighted` uses it in place of [`grid`]'s fit): Q4_0,
/// Q4_1, Q5_0, Q5_1 and Q8_0 (`legacy`; Q8_0's ignores the importance, as ggml's does), the
/// k-quants (`kquants`), and the i-quants of [`iquants::weighted_encoder`].
pub(crate) fn weighted_encoder(ty: TensorType) -> Option<iquants::WeightedFn> {
    match ty {
        TensorType::Q4_0 => Some(legacy::quantize_q4_0_imatrix),
        TensorType::Q4_1 => Some(legacy::quantize_q4_1_imatrix),
        TensorType::Q5_0 => Some(legacy::quantize_q5_0_imatrix),
        TensorType::Q5_1 => Some(legacy::quantize_q5_1_imatrix),
        TensorType::Q8_0 => Some(legacy::quantize_q8_0_imatrix),
        TensorType::Q2K => Some(kquants::quantize_q2_k_imatrix),
        TensorType::Q4K => Some(kquants::quantize_q4_k_imatrix),
        TensorType::Q5K => Some(kquants::quantize_q5_k_imatrix),
        TensorType::Q3K => Some(kquants::quantize_q3_k_imatrix),
        TensorType::Q6K => Some(kquants::quantize_q6_k_imatrix),
        _ => iquants::weighted_encoder(ty),
    }
}

/// Decode `data` (whole blocks of `ty`) to f32. `what` names the tensor for the error message.
/// Row-rotated types need the row length: [`dequantize_rows`].
pub fn dequantize(ty: TensorType, data: &[u8], out: &mut [f32], what: &str) -> Result<()> {
    let info = ty.info();
    if ty.rotates_rows() {
        return Err(Error::Unsupported(format!(
            "{what}: {} rotates whole rows; tq reads it by rows (dequantize_rows)",
            info.name
        )));
    }
    let f = info.dequantize.ok_or_else(|| {
        Error::Unsupported(format!(
            "{what}: dequantization of {} is not supported by tq (convert the tensor with llama.cpp first, or keep it as is)",
            info.name
        ))
    })?;
    check_sizes(ty, data.len(), out.len(), what)?;
    f(data, out);
    Ok(())
}

/// Encode `src` (whole blocks of `ty`) into `out`. Rejects NaN/Inf with the tensor named.
/// Row-rotated types need the row length: [`quantize_rows`].
pub fn quantize(ty: TensorType, src: &[f32], out: &mut [u8], what: &str) -> Result<()> {
    let info = ty.info();
    if ty.rotates_rows() {
        return Err(Error::Unsupported(format!(
            "{what}: {} rotates whole rows; tq writes it by rows (quantize_rows)",
            info.name
        )));
    }
    let f = info.quantize.ok_or_else(|| {
        Error::Unsupported(format!(
            "{what}: quantization to {} is not supported by tq",
            info.name
        ))
    })?;
    check_sizes(ty, out.len(), src.len(), what)?;
    if let Some(i) = src.iter().position(|v| !v.is_finite()) {
        return Err(Error::Unsupported(format!(
            "{what}: non-finite value {} at element {i}; fix the source weights (NaN/Inf cannot be quantized)",
            src[i]
        )));
    }
    f(src, out);
    Ok(())
}

/// Decode whole rows of `row_len` values: the one entry point for reading a tensor, whatever its
/// type (row-rotated types get their inverse rotation here, and nowhere else).
pub fn dequantize_rows(
    ty: TensorType,
    data: &[u8],
    out: &mut [f32],
    row_len: usize,
    what: &str,
) -> Result<()> {
    let Some(codec) = ty.info().row else {
        return dequantize(ty, data, out, what);
    };
    check_sizes(ty, data.len(), out.len(), what)?;
    let rb = check_rows(ty, out.len(), row_len, what)?;
    for (b, o) in data.chunks_exact(rb).zip(out.chunks_exact_mut(row_len)) {
        (codec.dequantize_row)(b, o).map_err(|e| Error::Unsupported(format!("{what}: {e}")))?;
    }
    Ok(())
}

/// Encode whole rows of `row_len` values (NaN/Inf rejected): the one entry point for writing a
/// tensor; row-rotated types are rotated here.
pub fn quantize_rows(
    ty: TensorType,
    src: &[f32],
    out: &mut [u8],
    row_len: usize,
    what: &str,
) -> Result<()> {
    let Some(codec) = ty.info().row else {
        return quantize(ty, src, out, what);
    };
    check_sizes(ty, out.len(), src.len(), what)?;
    let rb = check_rows(ty, src.len(), row_len, what)?;
    if let Some(i) = src.iter().position(|v| !v.is_finite()) {
        return Err(Error::Unsupported(format!(
            "{what}: non-finite value {} at element {i}; fix the source weights (NaN/Inf cannot be quantized)",
            src[i]
        )));
    }
    for (x, o) in src.chunks_exact(row_len).zip(out.chunks_exact_mut(rb)) {
        (codec.quantize_row)(x, o).map_err(|e| Error::Unsupported(format!("{what}: {e}")))?;
    }
    Ok(())
}

/// Bytes per row, when `values` is a whole number of rows of whole blocks.
fn check_rows(ty: TensorType, values: usize, row_len: usize, what: &str) -> Result<usize> {
    match ty.bytes_for(row_len as u64) {
        Some(rb) if row_len > 0 && values.is_multiple_of(row_len) => Ok(rb as usize),
        _ => Err(Error::Unsupported(format!(
            "{what}: rows of {row_len} values do not fit {} (blocks of {})",
            ty.name(),
            ty.block_size()
        ))),
    }
}

fn check_sizes(ty: TensorType, bytes: usize, values: usize, what: &str) -> Result<()> {
    let info = ty.info();
    if !values.is_multiple_of(info.block_size)
        || bytes != values / info.block_size * info.block_bytes
    {
        return Err(Error::Unsupported(format!(
            "{what}: {values} values / {bytes} bytes is not a whole number of {} blocks ({} values, {} bytes each)",
            info.name, info.block_size, info.block_bytes
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_order_matches_enum() {
        for (i, t) in TYPES.iter().enumerate() {
            assert_eq!(t.ty as usize, i, "row {i} ({}) out of order", t.name);
        }
    }

    #[test]
    fn names_round_trip() {
        for t in TYPES {
            assert_eq!(TensorType::from_name(t.name), Some(t.ty));
            assert_eq!(TensorType::from_name(&t.name.to_uppercase()), Some(t.ty));
        }
        assert_eq!(TensorType::from_name("turbo3_0"), Some(TensorType::Turbo3));
        assert_eq!(TensorType::from_name("q4_0"), Some(TensorType::Q4_0));
        assert_eq!(TensorType::from_name("nope"), None);
    }

    #[test]
    fn stock_ids_unique() {
        let mut ids: Vec<u32> = TYPES.iter().filter_map(|t| t.ty.stock_id()).collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }

    /// The newest ids, checked against ggml's block structs: block_nvfp4 (64 values: 4 e4m3
    /// scales + 32 nibble bytes), block_q1_0 (f16 d + 128 sign bits), block_q2_0 (f16 d + 64
    /// two-bit values). gguf-py 0.19 knows 40 and 41 (tests/quants_oracle.rs) but not 42.
    #[test]
    fn ids_past_gguf_py_match_ggml() {
        for (id, name, bs, bytes) in [
            (40, "nvfp4", 64, 36),
            (41, "q1_0", 128, 18),
            (42, "q2_0", 64, 18),
        ] {
            let t = TYPES
                .iter()
                .find(|t| t.ty.stock_id() == Some(id))
                .unwrap_or_else(|| panic!("stock id {id} missing"));
            assert_eq!((t.name, t.block_size, t.block_bytes), (name, bs, bytes));
        }
        // The upstream profile reads id 42 as q2_0; the fork profile gives it to turbo2.
        let up = profile::Profile::built_in("upstream").unwrap();
        assert_eq!(up.type_of(42), Some(TensorType::Q2_0));
        assert_eq!(profile::Profile::default().id_of(TensorType::Q2_0), None);
    }

    /// The families the predicates read: exactly the types callers used to list by hand.
    #[test]
    fn families_hold_the_listed_types() {
        use TensorType::*;
        let of = |f: Family| {
            TYPES
                .iter()
                .filter(|t| t.family == f)
                .map(|t| t.ty)
                .collect::<Vec<_>>()
        };
        assert_eq!(of(Family::Float), [F32, F16, BF16]);
        assert_eq!(of(Family::Raw), [I8, I16, I32, I64, F64]);
        assert_eq!(of(Family::TqWeight), [TQ3_1S, TQ4_1S]);
        assert_eq!(of(Family::TurboKv), [Turbo2, Turbo3, Turbo4]);
        assert_eq!(of(Family::RowRotated), [TQ2R]);
        assert_eq!(of(Family::RowTrellis), [TQ2T]);
        // The row codecs are exactly the whole-row families'; LDLQ kinds follow the families.
        let with_rows: Vec<TensorType> = TYPES
            .iter()
            .filter(|t| t.row.is_some())
            .map(|t| t.ty)
            .collect();
        assert_eq!(with_rows, [TQ2R, TQ2T]);
        let kinds = |k: LdlqKind| {
            TYPES
                .iter()
                .filter(|t| t.ty.ldlq() == Some(k))
                .map(|t| t.ty)
                .collect::<Vec<_>>()
        };
        assert_eq!(kinds(LdlqKind::Rotated), [TQ3_1S, TQ4_1S]);
        assert_eq!(kinds(LdlqKind::RowRotated), [TQ2R]);
        assert_eq!(kinds(LdlqKind::Trellis), [TQ2T]);
        assert_eq!(kinds(LdlqKind::Lattice), [IQ3XXS, IQ1S, IQ3S, IQ1M]);
        assert_eq!(kinds(LdlqKind::IqGrid), [IQ2XXS, IQ2XS, IQ2S]);
        assert_eq!(
            kinds(LdlqKind::Stock),
            [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS]
        );
        for t in TYPES {
            assert_eq!(
                t.ty.is_quantized(),
                !t.ty.is_float() && t.family != Family::Raw
            );
        }
    }

    #[test]
    fn unsupported_dequant_is_an_error() {
        let mut out = vec![0f32; 256];
        let e = dequantize(TensorType::Q8K, &[0u8; 292], &mut out, "blk.0.x").unwrap_err();
        assert!(
            e.to_string()
                .contains("dequantization of q8_K is not supported"),
            "{e}"
        );
    }
}
