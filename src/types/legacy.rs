//! Legacy ggml block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 values per block), and the newer
//! one-scale Q1_0 / Q2_0 (dequantization only).
//!
//! Block layouts (little-endian, as ggml's `block_q*` structs):
//!
//! | type | bytes | layout |
//! |---|---|---|
//! | Q4_0 | 18 | `d: f16`, `qs[16]` (low nibbles = values 0..16, high nibbles = values 16..32) |
//! | Q4_1 | 20 | `d: f16`, `m: f16`, `qs[16]` |
//! | Q5_0 | 22 | `d: f16`, `qh: u32` (bit j = 5th bit of value j), `qs[16]` |
//! | Q5_1 | 24 | `d: f16`, `m: f16`, `qh: u32`, `qs[16]` |
//! | Q8_0 | 34 | `d: f16`, `qs: [i8; 32]` |
//! | Q1_0 | 18 | `d: f16`, `qs[16]`: 128 values, bit j (LSB first) = value j is `+d` (1) or `−d` (0) |
//! | Q2_0 | 18 | `d: f16`, `qs[16]`: 64 values, 2 bits each (LSB first), value `(q − 1) · d` |
//!
//! Q1_0 / Q2_0 follow ggml's `block_q1_0` / `block_q2_0` and `dequantize_row_q1_0` /
//! `dequantize_row_q2_0` (ggml-org/ggml `ggml-common.h`, `ggml-quants.c`); gguf-py 0.19 has no
//! decoder for them, so they are held to hand-made blocks below.
//!
//! The kernels reproduce ggml's scalar reference code (`dequantize_row_q*`,
//! `quantize_row_q*_ref`) operation by operation in f32, each operation rounded on its own (Rust
//! never contracts `a*b + c` into an FMA), so the results are bit- and byte-identical with it.

use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};

/// Values per block of every legacy type.
pub const QK: usize = 32;
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const Q8_0_BYTES: usize = 34;

// Layouts (the table above): f16 scales, then `qh: u32` for the 5-bit types, then `qs`.
const F16: usize = size_of::<u16>();
const _: () = assert!(Q4_0_BYTES == F16 + QK / 2);
const _: () = assert!(Q4_1_BYTES == 2 * F16 + QK / 2);
const _: () = assert!(Q5_0_BYTES == F16 + size_of::<u32>() + QK / 2);
const _: () = assert!(Q5_1_BYTES == 2 * F16 + size_of::<u32>() + QK / 2);
const _: () = assert!(Q8_0_BYTES == F16 + QK);

pub(crate) const QK1_0: usize = 128;
pub(crate) const Q1_0_BYTES: usize = 18;
const _: () = assert!(Q1_0_BYTES == F16 + QK1_0 / 8);
pub(crate) const QK2_0: usize = 64;
pub(crate) const Q2_0_BYTES: usize = 18;
const _: () = assert!(Q2_0_BYTES == F16 + QK2_0 / 4);

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

#[inline(always)]
fn put_f16(b: &mut [u8], i: usize, v: f32) {
    b[i..i + 2].copy_from_slice(&f32_to_f16_bits(v).to_le_bytes());
}

// ---------------------------------------------------------------------------------------------
// Dequantization

pub fn dequantize_q4_0(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q4_0_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16_at(b, 0);
        let qs = &b[2..18];
        for j in 0..QK / 2 {
            let x0 = (qs[j] & 0x0F) as i32 - 8;
            let x1 = (qs[j] >> 4) as i32 - 8;
            y[j] = x0 as f32 * d;
            y[j + QK / 2] = x1 as f32 * d;
        }
    }
}

pub fn dequantize_q4_1(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q4_1_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let qs = &b[4..20];
        for j in 0..QK / 2 {
            let x0 = (qs[j] & 0x0F) as f32;
            let x1 = (qs[j] >> 4) as f32;
            y[j] = x0 * d + m;
            y[j + QK / 2] = x1 * d + m;
        }
    }
}

pub fn dequantize_q5_0(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q5_0_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[6..22];
        for j in 0..QK / 2 {
            let xh0 = (((qh >> j) << 4) & 0x10) as i32;
            let xh1 = ((qh >> (j + 12)) & 0x10) as i32;
            let x0 = ((qs[j] & 0x0F) as i32 | xh0) - 16;
            let x1 = ((qs[j] >> 4) as i32 | xh1) - 16;
            y[j] = x0 as f32 * d;
            y[j + QK / 2] = x1 as f32 * d;
        }
    }
}

pub fn dequantize_q5_1(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q5_1_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let qs = &b[8..24];
        for j in 0..QK / 2 {
            let xh0 = ((qh >> j) << 4) & 0x10;
            let xh1 = (qh >> (j + 12)) & 0x10;
            let x0 = (qs[j] & 0x0F) as u32 | xh0;
            let x1 = (qs[j] >> 4) as u32 | xh1;
            y[j] = x0 as f32 * d + m;
            y[j + QK / 2] = x1 as f32 * d + m;
        }
    }
}

pub fn dequantize_q8_0(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q8_0_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[2..34]) {
            *o = (q as i8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q1_0(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q1_0_BYTES)
        .zip(out.chunks_exact_mut(QK1_0))
    {
        let d = f16_at(b, 0);
        for (j, o) in y.iter_mut().enumerate() {
            *o = if (b[F16 + j / 8] >> (j % 8)) & 1 != 0 {
                d
            } else {
                -d
            };
        }
    }
}

pub(crate) fn dequantize_q2_0(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q2_0_BYTES)
        .zip(out.chunks_exact_mut(QK2_0))
    {
        let d = f16_at(b, 0);
        for (j, o) in y.iter_mut().enumerate() {
            let q = (b[F16 + j / 4] >> (2 * (j % 4))) & 3;
            *o = (q as i32 - 1) as f32 * d;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Quantization (ggml's `quantize_row_q*_ref`)

/// The value of largest magnitude, sign kept; the first one wins ties; 0.0 for an all-zero block
/// (as ggml: `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` from `amax = max = 0`).
#[inline(always)]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `(min, max)` as ggml scans them from `FLT_MAX` / `-FLT_MAX` with strict comparisons.
#[inline(always)]
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// C's `(int8_t)f` as compilers emit it on x86 (`cvttss2si` to i32, keep the low byte):
/// truncation toward zero, and NaN or values outside the i32 range give `i32::MIN`, whose low
/// byte is 0. Ordinary blocks never leave [-1, 33); this matters only for blocks so tiny that
/// `1/d` overflows to infinity (|max| below ~2e-38), where ggml (and numpy) then store 0.
#[inline(always)]
fn trunc_i8(f: f32) -> i8 {
    if (-2147483648.0..2147483648.0).contains(&f) {
        // SAFETY: `f` is finite and within the i32 range.
        (unsafe { f.to_int_unchecked::<i32>() }) as i8
    } else {
        0
    }
}

/// `(int8_t)roundf(f)` (half away from zero, then `trunc_i8`), without a libm call so that it
/// vectorizes on baseline x86-64: for in-range `f`, `i = trunc(f)` and `f - i` are exact.
#[inline(always)]
fn round_i8(f: f32) -> i8 {
    if (-2147483648.0..2147483648.0).contains(&f) {
        // SAFETY: `f` is finite and within the i32 range.
        let i = unsafe { f.to_int_unchecked::<i32>() };
        let frac = f - i as f32;
        (i + (frac >= 0.5) as i32 - (frac <= -0.5) as i32) as i8
    } else {
        0
    }
}

pub fn quantize_q4_0(src: &[f32], out: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let max = signed_absmax(x);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        for j in 0..QK / 2 {
            let x0 = x[j] * id;
            let x1 = x[j + QK / 2] * id;
            let xi0 = trunc_i8(x0 + 8.5).min(15) as u8;
            let xi1 = trunc_i8(x1 + 8.5).min(15) as u8;
            b[2 + j] = xi0 | (xi1 << 4);
        }
    }
}

pub fn quantize_q4_1(src: &[f32], out: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(out.chunks_exact_mut(Q4_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        put_f16(b, 2, min);
        for j in 0..QK / 2 {
            let x0 = (x[j] - min) * id;
            let x1 = (x[j + QK / 2] - min) * id;
            let xi0 = trunc_i8(x0 + 0.5).min(15) as u8;
            let xi1 = trunc_i8(x1 + 0.5).min(15) as u8;
            b[4 + j] = xi0 | (xi1 << 4);
        }
    }
}

pub fn quantize_q5_0(src: &[f32], out: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(out.chunks_exact_mut(Q5_0_BYTES)) {
        let max = signed_absmax(x);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = x[j] * id;
            let x1 = x[j + QK / 2] * id;
            let xi0 = trunc_i8(x0 + 16.5).min(31) as u8;
            let xi1 = trunc_i8(x1 + 16.5).min(31) as u8;
            b[6 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        b[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

pub fn quantize_q5_1(src: &[f32], out: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(out.chunks_exact_mut(Q5_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        put_f16(b, 2, min);
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let x0 = (x[j] - min) * id;
            let x1 = (x[j + QK / 2] - min) * id;
            let xi0 = trunc_i8(x0 + 0.5).min(31) as u8;
            let xi1 = trunc_i8(x1 + 0.5).min(31) as u8;
            b[8 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        b[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

pub fn quantize_q8_0(src: &[f32], out: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let mut amax = 0.0f32;
        for &v in x {
            // C's MAX(a, b) is `a > b ? a : b`.
            let a = v.abs();
            amax = if amax > a { amax } else { a };
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        for (q, &v) in b[2..34].iter_mut().zip(x) {
            // `qs[j] = roundf(x0)`: round half away from zero, implicit conversion to int8_t.
            *q = round_i8(v * id) as u8;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Importance-weighted Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 (`llama-quantize --imatrix`)

/// Q4_1 rows weighted by an importance matrix, as `llama-quantize --imatrix` writes them
/// (ggml's `quantize_row_q4_1_impl`): `src` is whole rows of `imp.len()` values, `imp` one
/// importance per column. Per block the weights are `imp[j]·sqrt(σ² + x[j]²)` (σ² the row's mean
/// square) and the scale and min come from ggml's `make_qkx3_quants` search (nmax 15, 37 trial
/// inverse scales `(−0.9 + 0.05·k + nmax)/(max − min)`, each refined by weighted least squares),
/// whose codes are stored as found.
pub(crate) fn quantize_q4_1_imatrix(src: &[f32], imp: &[f32], out: &mut [u8]) {
    weighted_rows::<Q4_1_BYTES>(src, imp, out, 15)
}

/// Q5_1 rows weighted by an importance matrix (ggml's `quantize_row_q5_1_impl`): as
/// [`quantize_q4_1_imatrix`] with nmax 31.
pub(crate) fn quantize_q5_1_imatrix(src: &[f32], imp: &[f32], out: &mut [u8]) {
    weighted_rows::<Q5_1_BYTES>(src, imp, out, 31)
}

/// Q4_0 rows weighted by an importance matrix, as `llama-quantize --imatrix` writes them
/// (ggml's `quantize_row_q4_0_impl`): per block the weights `imp[j]·sqrt(σ² + x[j]²)` as for
/// Q4_1, and the scale from ggml's `make_qx_quants` with `rmse_type = 1` under those weights
/// (levels `-8..7` from `-(8 + 0.1·k)/max`, k = −9..9, each scored by weighted least squares); its
/// codes (`level + 8`) are stored as found.
pub(crate) fn quantize_q4_0_imatrix(src: &[f32], imp: &[f32], out: &mut [u8]) {
    symmetric_rows::<Q4_0_BYTES>(src, imp, out, 8)
}

/// Q5_0 rows weighted by an importance matrix (ggml's `quantize_row_q5_0_impl`): as
/// [`quantize_q4_0_imatrix`] with nmax 16 (levels `-16..15`, codes `level + 16`).
pub(crate) fn quantize_q5_0_imatrix(src: &[f32], imp: &[f32], out: &mut [u8]) {
    symmetric_rows::<Q5_0_BYTES>(src, imp, out, 16)
}

/// Q8_0 with an importance matrix: llama-quantize ignores it (ggml's `quantize_q8_0` calls the
/// reference quantizer whatever the weights), so this is [`quantize_q8_0`] and `--imatrix`
/// writes the same bytes as llama-quantize with or without one.
pub(crate) fn quantize_q8_0_imatrix(src: &[f32], _imp: &[f32], out: &mut [u8]) {
    quantize_q8_0(src, out)
}

fn symmetric_rows<const BYTES: usize>(src: &[f32], imp: &[f32], out: &mut [u8], nmax: i32) {
    let n = imp.len();
    let row_bytes = n / QK * BYTES;
    let mut w = [0f32; QK];
    let mut l = [0i8; QK];
    for (row, ob) in src.chunks_exact(n).zip(out.chunks_exact_mut(row_bytes)) {
        let sigma2 = row_sigma2(row);
        for ((x, qw), b) in row
            .chunks_exact(QK)
            .zip(imp.chunks_exact(QK))
            .zip(ob.chunks_exact_mut(BYTES))
        {
            imatrix_block_weights(x, qw, sigma2, &mut w);
            let x: &[f32; QK] = x.try_into().expect("a 32-value block");
            let d = crate::types::kquants::make_qx_quants_rmse1::<QK>(nmax, x, Some(&w), &mut l);
            put_f16(b, 0, d);
            let codes: [u8; QK] = std::array::from_fn(|j| l[j] as u8);
            pack_0(&codes, b);
        }
    }
}

/// Store the codes (`0..=15` for Q4_0, `0..=31` for Q5_0, chosen by the block's size) of one
/// block whose `d` is written.
fn pack_0(l: &[u8; QK], b: &mut [u8]) {
    pack_codes(l, b, 2)
}

/// Store the codes of one block after its `head` bytes of parameters (`d`, and `m` for the
/// `_1` types): 4-bit codes when the block has room for only those (low nibbles hold values
/// `0..16`, high nibbles `16..32`), else 5-bit with the fifth bits in a 32-bit `qh` first.
fn pack_codes(l: &[u8; QK], b: &mut [u8], head: usize) {
    if b.len() == head + QK / 2 {
        for j in 0..QK / 2 {
            b[head + j] = l[j] | (l[j + QK / 2] << 4);
        }
        return;
    }
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (x0, x1) = (l[j], l[j + QK / 2]);
        b[head + 4 + j] = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
        qh |= (((x0 & 0x10) >> 4) as u32) << j;
        qh |= (((x1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    b[head..head + 4].copy_from_slice(&qh.to_le_bytes());
}

/// The importance weights of one block as ggml forms them: `qw[j]·sqrt(σ² + x[j]²)`.
pub(crate) fn imatrix_block_weights(x: &[f32], qw: &[f32], sigma2: f32, w: &mut [f32; QK]) {
    for ((o, &q), &v) in w.iter_mut().zip(qw).zip(x) {
        *o = q * (sigma2 + v * v).sqrt();
    }
}

/// A row's mean square, summed in f32 in index order (ggml's `sigma2`).
pub(crate) fn row_sigma2(row: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in row {
        s += v * v;
    }
    s / row.len() as f32
}

/// ggml's `make_qkx3_quants` for one 32-value block with weights (the search `_impl` calls):
/// `(scale, offset, codes)`, the decoded value `scale·c + offset` (offset <= 0). With weights
/// given it is `make_qkx2_quants` step for step (the two differ only in their weightless
/// defaults and in testing `max <= min` for `max == min`, equal after `min` is clamped to <= 0).
pub(crate) fn qkx3_block(x: &[f32], w: &[f32; QK], nmax: i32) -> (f32, f32, [u8; QK]) {
    let (mut l, mut laux) = ([0u8; QK], [0u8; QK]);
    let (d, the_min) = crate::types::kquants::make_qkx2_quants::<QK>(
        nmax,
        x.try_into().expect("a 32-value block"),
        w,
        &mut l,
        &mut laux,
        -0.9,
        0.05,
        36,
        false,
    );
    (d, -the_min, l)
}

fn weighted_rows<const BYTES: usize>(src: &[f32], imp: &[f32], out: &mut [u8], nmax: i32) {
    let n = imp.len();
    let row_bytes = n / QK * BYTES;
    let mut w = [0f32; QK];
    for (row, ob) in src.chunks_exact(n).zip(out.chunks_exact_mut(row_bytes)) {
        let sigma2 = row_sigma2(row);
        for ((x, qw), b) in row
            .chunks_exact(QK)
            .zip(imp.chunks_exact(QK))
            .zip(ob.chunks_exact_mut(BYTES))
        {
            imatrix_block_weights(x, qw, sigma2, &mut w);
            let (d, m, l) = qkx3_block(x, &w, nmax);
            crate::types::kquants::put_f16(b, 0, d);
            crate::types::kquants::put_f16(b, 2, m);
            pack_1(&l, b);
        }
    }
}

/// Store the codes (`0..=15` for Q4_1, `0..=31` for Q5_1, chosen by the block's size) of one
/// block whose `d` and `m` are written.
pub(crate) fn pack_1(l: &[u8; QK], b: &mut [u8]) {
    pack_codes(l, b, 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn data(n: usize) -> Vec<f32> {
        let mut s = 42u64;
        (0..n)
            .map(|i| lcg(&mut s) * (1.0 + (i / 32) as f32 * 0.37))
            .collect()
    }

    type Q = fn(&[f32], &mut [u8]);
    type D = fn(&[u8], &mut [f32]);

    /// Quantize then dequantize; the error of every value is bounded by `tol` block steps.
    fn round_trip(q: Q, dq: D, bytes: usize, levels: f32, tol: f32) {
        let x = data(QK * 64);
        let mut b = vec![0u8; x.len() / QK * bytes];
        q(&x, &mut b);
        let mut y = vec![0f32; x.len()];
        dq(&b, &mut y);
        for (xb, yb) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let step = 2.0 * amax / levels;
            for (a, b) in xb.iter().zip(yb) {
                assert!(
                    (a - b).abs() <= step * tol + 1e-3 * amax,
                    "{a} vs {b} (step {step})"
                );
            }
        }
    }

    #[test]
    fn round_trips() {
        // Q4_0/Q5_0 put the max at -8/-16 steps; values of the other sign clamp at +7/+15 and
        // may lose up to a whole step.
        round_trip(quantize_q4_0, dequantize_q4_0, Q4_0_BYTES, 16.0, 1.01);
        round_trip(quantize_q4_1, dequantize_q4_1, Q4_1_BYTES, 15.0, 0.51);
        round_trip(quantize_q5_0, dequantize_q5_0, Q5_0_BYTES, 32.0, 1.01);
        round_trip(quantize_q5_1, dequantize_q5_1, Q5_1_BYTES, 31.0, 0.51);
        round_trip(quantize_q8_0, dequantize_q8_0, Q8_0_BYTES, 254.0, 0.51);
    }

    #[test]
    fn zero_block() {
        let x = [0f32; QK];
        let mut b = [0xAAu8; Q4_0_BYTES];
        quantize_q4_0(&x, &mut b);
        // d = 0.0 / -8 = -0.0 (ggml starts from max = +0.0); every index is 8.
        assert_eq!(&b[..2], &[0x00, 0x80]);
        assert!(b[2..].iter().all(|&q| q == 0x88));
        let mut b = [0xAAu8; Q8_0_BYTES];
        quantize_q8_0(&x, &mut b);
        assert!(b.iter().all(|&q| q == 0));
    }

    #[test]
    fn round_i8_is_roundf_then_cast() {
        let reference = |f: f32| trunc_i8(f.round());
        let mut vals = vec![
            0.5f32, -0.5, 1.5, -1.5, 2.5, 126.5, -127.5, 127.49999, 0.49999997,
        ];
        vals.extend([
            -0.49999997,
            1e-45,
            3e9,
            -3e9,
            2147483520.0,
            -2147483648.0,
            8388609.0,
        ]);
        vals.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            16777217.0,
            300.5,
            -300.5,
        ]);
        let mut s = 7u64;
        for _ in 0..200_000 {
            vals.push(lcg(&mut s) * 140.0);
            vals.push((lcg(&mut s) * 280.0).round() * 0.5);
        }
        for v in vals {
            assert_eq!(round_i8(v), reference(v), "{v:e}");
        }
    }

    #[test]
    fn tiny_blocks_follow_x86_casts() {
        // |max| so small that 1/d overflows: x*id is ±inf or NaN, the int8 casts give 0 (as
        // ggml on x86 and gguf-py: e.g. q4_0 "0080" + 16 zero bytes).
        let mut x = [0f32; QK];
        x[..8].copy_from_slice(&[1e-39, -2e-39, 5e-40, 0.0, 1e-45, -1e-45, 3e-39, -1e-39]);
        let cases: [(Q, usize, &[u8]); 5] = [
            (quantize_q4_0, Q4_0_BYTES, &[0x00, 0x80]),
            (quantize_q4_1, Q4_1_BYTES, &[0x00, 0x00, 0x00, 0x80]),
            (quantize_q5_0, Q5_0_BYTES, &[0x00, 0x80]),
            (quantize_q5_1, Q5_1_BYTES, &[0x00, 0x00, 0x00, 0x80]),
            (quantize_q8_0, Q8_0_BYTES, &[0x00, 0x00]),
        ];
        for (q, bytes, head) in cases {
            let mut b = vec![0xAAu8; bytes];
            q(&x, &mut b);
            assert_eq!(&b[..head.len()], head);
            assert!(b[head.len()..].iter().all(|&v| v == 0), "{b:02x?}");
        }
    }

    #[test]
    fn q4_0_known_block() {
        // max magnitude -4 at index 3: d = 0.5, id = 2; x*2 + 8.5 truncated, clamped to 15.
        let mut x = [0f32; QK];
        x[3] = -4.0;
        x[0] = 3.9;
        x[16] = 1.0;
        let mut b = [0u8; Q4_0_BYTES];
        quantize_q4_0(&x, &mut b);
        assert_eq!(f16_at(&b, 0), 0.5);
        assert_eq!(b[2 + 3] & 0xF, 0); // -4 * 2 + 8.5 = 0.5 -> 0
        let mut y = [0f32; QK];
        dequantize_q4_0(&b, &mut y);
        assert_eq!(y[3], -4.0);
        assert_eq!(y[0], 3.5); // 3.9*2 + 8.5 = 16.3 -> 16 -> clamped 15 -> (15-8)*0.5
        assert_eq!(y[16], 1.0);
    }

    /// Q1_0 by hand (ggml: bit set → d, clear → −d, LSB first): d = −1.5, bytes 0x01 and 0x80.
    #[test]
    fn q1_0_hand_block() {
        let mut b = [0u8; Q1_0_BYTES];
        b[0..2].copy_from_slice(&f32_to_f16_bits(-1.5).to_le_bytes());
        b[2] = 0x01; // value 0
        b[17] = 0x80; // value 127
        let mut y = [0f32; QK1_0];
        dequantize_q1_0(&b, &mut y);
        assert_eq!((y[0], y[1], y[126], y[127]), (-1.5, 1.5, 1.5, -1.5));
        assert_eq!(y.iter().filter(|&&v| v == 1.5).count(), 126);
    }

    /// Q2_0 by hand: q = 0, 1, 2, 3 in byte 0 (LSB first) → −d, 0, d, 2d with d = 0.25; the next
    /// byte all 3s; the other bytes 0 (−d).
    #[test]
    fn q2_0_hand_block() {
        let mut b = [0u8; Q2_0_BYTES];
        b[0..2].copy_from_slice(&0x3400u16.to_le_bytes()); // 0.25
        b[2] = 0b11_10_01_00;
        b[3] = 0xFF;
        let mut y = [0f32; QK2_0];
        dequantize_q2_0(&b, &mut y);
        assert_eq!(y[..8], [-0.25, 0.0, 0.25, 0.5, 0.5, 0.5, 0.5, 0.5]);
        assert!(y[8..].iter().all(|&v| v == -0.25));
        // Two blocks decode independently, each with its own scale.
        let mut two = [b, b].concat();
        two[18..20].copy_from_slice(&0x4000u16.to_le_bytes()); // 2.0
        let mut y2 = [0f32; 2 * QK2_0];
        dequantize_q2_0(&two, &mut y2);
        assert_eq!(y2[..QK2_0], y);
        assert_eq!((y2[64], y2[67], y2[127]), (-2.0, 4.0, -2.0));
    }
}
