//! k-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-value super-blocks).
//!
//! Block layouts (little-endian, as ggml's `block_q*_K` structs, `QK_K = 256`):
//!
//! | type | bytes | layout |
//! |---|---|---|
//! | Q2_K | 84 | `scales[16]` (lo nibble scale, hi nibble min), `qs[64]`, `d: f16`, `dmin: f16` |
//! | Q3_K | 110 | `hmask[32]`, `qs[64]`, `scales[12]` (16 packed 6-bit), `d: f16` |
//! | Q4_K | 144 | `d: f16`, `dmin: f16`, `scales[12]` (8 scales + 8 mins, 6-bit), `qs[128]` |
//! | Q5_K | 176 | `d: f16`, `dmin: f16`, `scales[12]`, `qh[32]`, `qs[128]` |
//! | Q6_K | 210 | `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d: f16` |
//!
//! Each kernel follows ggml's `dequantize_row_q*_K` in f32 operation by operation: the sub-block
//! factor is formed first (`d * sc`, `dmin * m`), then `factor * q - min`, no fused multiply-add.
//!
//! The quantizers reproduce ggml's `quantize_row_q*_K_ref` — what `llama-quantize` runs when no
//! importance matrix is given — byte for byte: the same searches (`make_qkx2_quants` for
//! Q2_K/Q4_K/Q5_K, `make_qx_quants` for Q6_K, `make_q3_quants` for Q3_K) with the same
//! parameters, every f32 operation in the C evaluation order (Rust never contracts `a*b + c` into
//! an FMA, and ggml-base is compiled for baseline x86-64 without FMA either), `nearest_int`'s
//! magic-number rounding, C's integer narrowing (`as u8` / `as i8` wrap like gcc's conversions) and
//! ggml's f32 → f16 rounding of the super-block scales. Checked against llama-quantize's output in
//! `tests/kquants_llama.rs`.

use crate::types::float::{f16_bits_to_f32, f32_to_f16_bits};

/// Values per super-block.
pub const QK_K: usize = 256;
pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

pub fn dequantize_q2_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q2_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let scales = &b[0..16];
        let d = f16_at(b, 80);
        let min = f16_at(b, 82);
        // 16 groups of 16 values, each with its own scale byte (lo nibble scale, hi nibble min).
        // Group k: 128-value half k/8 (32 qs bytes), 2-bit field (k%8)/2, byte range 16*(k%2).
        for (k, y) in y.chunks_exact_mut(16).enumerate() {
            let q0 = 16 + 32 * (k / 8) + 16 * (k % 2);
            let q = &b[q0..q0 + 16];
            let shift = 2 * ((k % 8) / 2);
            let sc = scales[k];
            let dl = d * (sc & 0x0F) as f32;
            let ml = min * (sc >> 4) as f32;
            for (o, &ql) in y.iter_mut().zip(q) {
                *o = dl * ((ql >> shift) & 3) as f32 - ml;
            }
        }
    }
}

/// The 16 signed 6-bit scales of a Q3_K block: low 4 bits from `s[k % 8]` (low nibble for
/// k < 8, high nibble after), high 2 bits from `s[8 + k % 4]` at bit `2 * (k / 4)`, minus 32.
#[inline(always)]
fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let lo = if k < 8 { s[k] & 0x0F } else { s[k - 8] >> 4 };
        let hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        *o = (lo | (hi << 4)) as i32 - 32;
    }
    out
}

pub fn dequantize_q3_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q3_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let hmask = &b[0..32];
        let scales = q3_k_scales(&b[96..108]);
        let d_all = f16_at(b, 108);
        // Group k of 16 values: as Q2_K for the low 2 bits; the high bit is bit (k/2) of the
        // hmask bytes 16*(k%2)..; a clear bit subtracts 4.
        for (k, y) in y.chunks_exact_mut(16).enumerate() {
            let q0 = 32 + 32 * (k / 8) + 16 * (k % 2);
            let q = &b[q0..q0 + 16];
            let hm = &hmask[16 * (k % 2)..16 * (k % 2) + 16];
            let shift = 2 * ((k % 8) / 2);
            let m = 1u8 << (k / 2);
            let dl = d_all * scales[k] as f32;
            for ((o, &ql), &h) in y.iter_mut().zip(q).zip(hm) {
                let v = ((ql >> shift) & 3) as i32 - if h & m != 0 { 0 } else { 4 };
                *o = dl * v as f32;
            }
        }
    }
}

/// ggml's `get_scale_min_k4`: scale and min `j` (0..8) of a Q4_K/Q5_K block.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub fn dequantize_q4_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q4_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        for (g, y) in y.chunks_exact_mut(64).enumerate() {
            let q = &b[16 + 32 * g..16 + 32 * g + 32];
            let (sc, m) = scale_min_k4(2 * g, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = scale_min_k4(2 * g + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0x0F) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

pub fn dequantize_q5_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q5_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        let qh = &b[16..48];
        for (g, y) in y.chunks_exact_mut(64).enumerate() {
            let ql = &b[48 + 32 * g..48 + 32 * g + 32];
            let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
            let (sc, m) = scale_min_k4(2 * g, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = scale_min_k4(2 * g + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                let v1 = (ql[l] & 0x0F) + if qh[l] & u1 != 0 { 16 } else { 0 };
                let v2 = (ql[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * v1 as f32 - m1;
                y[l + 32] = d2 * v2 as f32 - m2;
            }
        }
    }
}

pub fn dequantize_q6_k(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(Q6_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 208);
        for (h, y) in y.chunks_exact_mut(128).enumerate() {
            let ql = &b[64 * h..64 * h + 64];
            let qh = &b[128 + 32 * h..128 + 32 * h + 32];
            let sc = &b[192 + 8 * h..192 + 8 * h + 8];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                // `d * sc[is] * q` in C: (d * sc) first, then * q.
                y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Quantization (ggml's `quantize_row_q*_K_ref`)

/// ggml's `GROUP_MAX_EPS`: groups whose largest |x| is below this are all-zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: add 1.5 * 2^23 so the FPU rounds to nearest-even into the low mantissa
/// bits, then read them back. Exact for |v| <= 2^22 - 1; outside that range it returns the same
/// (meaningless) bits as the C code does, so even degenerate inputs stay byte-identical.
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0f32;
    (t.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `GGML_FP32_TO_FP16` (round to nearest-even; NaN becomes sign | 0x7E00).
#[inline(always)]
fn f16_ggml(v: f32) -> u16 {
    if v.is_nan() {
        ((v.to_bits() >> 16) as u16 & 0x8000) | 0x7E00
    } else {
        f32_to_f16_bits(v)
    }
}

/// Write `v` as ggml's f16 at `b[i..i+2]` and return the f32 it decodes to (what the C code reads
/// back with `GGML_FP16_TO_FP32(y[i].d)`).
#[inline(always)]
fn put_f16(b: &mut [u8], i: usize, v: f32) -> f32 {
    let h = f16_ggml(v);
    b[i..i + 2].copy_from_slice(&h.to_le_bytes());
    f16_bits_to_f32(h)
}

/// ggml's `make_qkx2_quants`: asymmetric `scale * l - min` quantization of `x` to `0..=nmax`
/// with per-value `weights`, refining the scale over `nstep + 1` trial inverse scales
/// `(rmin + rdelta * is + nmax) / (max - min)` by weighted least squares, keeping the trial with
/// the smallest weighted error (absolute if `use_mad`, squared otherwise). Returns
/// `(scale, the_min)` with the levels in `l`; `the_min` is `-min` (>= 0).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn make_qkx2_quants<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    weights: &[f32; N],
    l_out: &mut [u8; N],
    laux: &mut [u8; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..N {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    // Each pass first computes all levels (independent per value, so it vectorizes), then runs the
    // f32 accumulations strictly in index order as the C loop does.
    let mut xm = [0f32; N];
    for i in 0..N {
        xm[i] = x[i] - min;
    }
    for i in 0..N {
        l_out[i] = nearest_int(iscale * xm[i]).clamp(0, nmax) as u8;
    }
    for i in 0..N {
        let mut diff = scale * l_out[i] as f32 + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax_f) / (max - min);
        for i in 0..N {
            laux[i] = nearest_int(iscale * xm[i]).clamp(0, nmax) as u8;
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..N {
            let w = weights[i];
            let lf = laux[i] as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut diffs = [0f32; N];
            for i in 0..N {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                diffs[i] = weights[i] * if use_mad { diff.abs() } else { diff * diff };
            }
            let mut cur_error = 0.0f32;
            for v in diffs {
                cur_error += v;
            }
            if cur_error < best_error {
                *l_out = *laux;
                best_error = cur_error;
                scale = this_scale;
                // Later trials use the new min, in `x - min` and in `max - min` (as in C).
                min = this_min;
                for i in 0..N {
                    xm[i] = x[i] - min;
                }
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights (weights `x^2`), the
/// only form the reference quantizers use: symmetric levels `-nmax..nmax-1` stored `+ nmax` in
/// `l_out`, the sign of the scale chosen so the largest |x| maps to `-nmax`, then 18 trial
/// inverse scales `-(nmax + 0.1 * is) / max` scored by `sumlx^2 / suml2`.
#[inline(always)]
fn make_qx_quants_rmse1<const N: usize>(nmax: i32, x: &[f32; N], l_out: &mut [i8; N]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    // w = x^2 and w * x, as the C code forms them before multiplying by the level.
    let mut w = [0f32; N];
    let mut wx = [0f32; N];
    for i in 0..N {
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];
    }
    let nmax_f = nmax as f32;
    let mut iscale = -nmax_f / max;
    let mut l = [0i32; N];
    for i in 0..N {
        l[i] = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l[i] + nmax) as i8;
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..N {
        let lf = l[i] as f32;
        sumlx += wx[i] * lf;
        suml2 += w[i] * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax_f + 0.1f32 * is as f32) / max;
        for i in 0..N {
            l[i] = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        }
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..N {
            let lf = l[i] as f32;
            sumlx += wx[i] * lf;
            suml2 += w[i] * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..N {
                l_out[i] = (nmax + l[i]) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse = true`: symmetric levels `-nmax..nmax-1` from
/// `-nmax / max`, then up to 5 sweeps of coordinate descent on the weighted (`x^2`) least-squares
/// fit, each value moved to its best level given the others. Levels stored `+ nmax`.
#[inline(always)]
fn make_q3_quants_rmse(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = l as i8;
        let w = x[i] * x[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l_out[i] as i32 {
                    let nf = new_l as f32;
                    slx += w * x[i] * nf;
                    sl2 += w * nf * nf;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in l_out[..n].iter_mut() {
        *l = (*l as i32 + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Pack 256 2-bit levels as ggml: byte `j/4 + l` of each 128-value half holds values
/// `j + l`, `j + l + 32`, `j + l + 64`, `j + l + 96` in bits 0-1, 2-3, 4-5, 6-7.
#[inline(always)]
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            qs[j / 4 + k] =
                l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

pub fn quantize_q2_k(src: &[f32], out: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q2_K_BYTES)) {
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants::<16>(
                3,
                xs.try_into().unwrap(),
                &weights,
                (&mut l[16 * j..16 * j + 16]).try_into().unwrap(),
                &mut laux,
                -0.5,
                0.1,
                15,
                true,
            );
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let (sc, rest) = y.split_at_mut(16);
        let d = if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                sc[j] = nearest_int(iscale * scales[j]) as u8;
            }
            put_f16(rest, 64, max_scale / Q4SCALE)
        } else {
            sc.fill(0);
            put_f16(rest, 64, 0.0)
        };
        let dmin = if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                let li = nearest_int(iscale * mins[j]);
                sc[j] |= (li << 4) as u8;
            }
            put_f16(rest, 66, max_min / Q4SCALE)
        } else {
            put_f16(rest, 66, 0.0)
        };
        for j in 0..QK_K / 16 {
            let dj = d * (sc[j] & 0x0F) as f32;
            if dj == 0.0 {
                continue;
            }
            let dm = dmin * (sc[j] >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + dm) / dj);
                l[16 * j + ii] = q.clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut rest[..64]);
    }
}

pub fn quantize_q3_k(src: &[f32], out: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q3_K_BYTES)) {
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..QK_K / 16 {
            scales[j] =
                make_q3_quants_rmse(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        let sc = &mut y[96..108];
        sc.fill(0);
        // `if (max_scale)`: true for any non-zero value, NaN included.
        let d = if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            for j in 0..QK_K / 16 {
                let li = nearest_int(iscale * scales[j]) as i8;
                let li = (li as i32).clamp(-32, 31) + 32;
                if j < 8 {
                    sc[j] = (li & 0x0F) as u8;
                } else {
                    sc[j - 8] |= ((li & 0x0F) << 4) as u8;
                }
                sc[8 + j % 4] |= ((li >> 4) << (2 * (j / 4))) as u8;
            }
            put_f16(y, 108, 1.0 / iscale)
        } else {
            put_f16(y, 108, 0.0)
        };
        let s = q3_k_scales(&y[96..108]);
        for j in 0..QK_K / 16 {
            let dj = d * s[j] as f32;
            if dj == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / dj).clamp(-4, 3);
                l[16 * j + ii] = (q + 4) as i8;
            }
        }
        // High bit of value j goes to bit j / 32 of hmask[j % 32].
        let mut lu = [0u8; QK_K];
        let (hmask, rest) = y.split_at_mut(32);
        hmask.fill(0);
        for j in 0..QK_K {
            let mut v = l[j];
            if v > 3 {
                hmask[j % 32] |= 1 << (j / 32);
                v -= 4;
            }
            lu[j] = v as u8;
        }
        pack_2bit(&lu, &mut rest[..64]);
    }
}

/// Pack the 8 six-bit scales and mins of a Q4_K/Q5_K block (inverse of `scale_min_k4`).
#[inline(always)]
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], q: &mut [u8]) {
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0x0F) | ((lm[j] & 0x0F) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// The shared front half of Q4_K and Q5_K: per 32-value sub-block `make_qkx2_quants` with
/// weights `sqrt(mean(x^2)) + |x|`, the 6-bit scales/mins and the f16 `d`/`dmin` written into
/// `y[0..16]`, then every level recomputed from the stored (rounded) scales. Returns the levels.
#[inline(always)]
fn q45_k_levels(x: &[f32], y: &mut [u8], nmax: i32, rmin: f32, nstep: i32, l: &mut [u8; QK_K]) {
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants::<32>(
            nmax,
            xs.try_into().unwrap(),
            &weights,
            (&mut l[32 * j..32 * j + 32]).try_into().unwrap(),
            &mut laux,
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..QK_K / 32 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scale_min_k4(&ls, &lm, &mut y[4..16]);
    let d = put_f16(y, 0, max_scale / 63.0);
    let dmin = put_f16(y, 2, max_min / 63.0);
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, &y[4..16]);
        let dj = d * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / dj);
            l[32 * j + ii] = q.clamp(0, nmax) as u8;
        }
    }
}

pub fn quantize_q4_k(src: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q4_K_BYTES)) {
        q45_k_levels(x, y, 15, -1.0, 20, &mut l);
        let qs = &mut y[16..144];
        for j in (0..QK_K).step_by(64) {
            for k in 0..32 {
                qs[j / 2 + k] = l[j + k] | (l[j + k + 32] << 4);
            }
        }
    }
}

pub fn quantize_q5_k(src: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q5_K_BYTES)) {
        q45_k_levels(x, y, 31, -0.5, 15, &mut l);
        let (qh, ql) = y[16..176].split_at_mut(32);
        qh.fill(0);
        // Sub-block pair g (values 64g..64g+64): low nibbles in ql[32g..], 5th bits in qh bits
        // 2g (first 32 values) and 2g + 1 (next 32).
        for g in 0..4 {
            let (m1, m2) = (1u8 << (2 * g), 2u8 << (2 * g));
            for k in 0..32 {
                let mut l1 = l[64 * g + k];
                if l1 > 15 {
                    l1 -= 16;
                    qh[k] |= m1;
                }
                let mut l2 = l[64 * g + k + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[k] |= m2;
                }
                ql[32 * g + k] = l1 | (l2 << 4);
            }
        }
    }
}

pub fn quantize_q6_k(src: &[f32], out: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q6_K_BYTES)) {
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants_rmse1::<16>(
                32,
                x[16 * ib..16 * ib + 16].try_into().unwrap(),
                (&mut l[16 * ib..16 * ib + 16]).try_into().unwrap(),
            );
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            y.fill(0);
            put_f16(y, 208, 0.0);
            continue;
        }
        let iscale = -128.0f32 / max_scale;
        let d = put_f16(y, 208, 1.0 / iscale);
        for ib in 0..QK_K / 16 {
            y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }
        for j in 0..QK_K / 16 {
            let dj = d * (y[192 + j] as i8) as f32;
            if dj == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / dj).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        let (ql, rest) = y.split_at_mut(128);
        let qh = &mut rest[..64];
        for h in 0..2 {
            let (j, ql, qh) = (
                128 * h,
                &mut ql[64 * h..64 * h + 64],
                &mut qh[32 * h..32 * h + 32],
            );
            for k in 0..32 {
                let v = |o: usize| l[j + k + o] as u8;
                ql[k] = (v(0) & 0x0F) | ((v(64) & 0x0F) << 4);
                ql[k + 32] = (v(32) & 0x0F) | ((v(96) & 0x0F) << 4);
                qh[k] =
                    (v(0) >> 4) | ((v(32) >> 4) << 2) | ((v(64) >> 4) << 4) | ((v(96) >> 4) << 6);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q3_k_scale_unpacking_matches_ggml_aux_trick() {
        // ggml unpacks the 12 bytes with four u32 words and masks; check our per-index formula
        // against that word arithmetic on a few byte patterns.
        for seed in 0u32..64 {
            let s: Vec<u8> = (0..12u32)
                .map(|i| (i.wrapping_mul(97) ^ seed.wrapping_mul(131)) as u8)
                .collect();
            let mut aux = [0u32; 4];
            for k in 0..3 {
                aux[k] = u32::from_le_bytes([s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]]);
            }
            let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
            let tmp = aux[2];
            aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
            aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
            aux[0] = (aux[0] & k2) | ((tmp & k1) << 4);
            aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
            let bytes: Vec<i32> = aux
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .map(|b| b as i8 as i32 - 32)
                .collect();
            assert_eq!(q3_k_scales(&s).to_vec(), bytes);
        }
    }

    type Kernels = (
        &'static str,
        fn(&[f32], &mut [u8]),
        fn(&[u8], &mut [f32]),
        usize,
    );

    const ALL: [Kernels; 5] = [
        ("q2_K", quantize_q2_k, dequantize_q2_k, Q2_K_BYTES),
        ("q3_K", quantize_q3_k, dequantize_q3_k, Q3_K_BYTES),
        ("q4_K", quantize_q4_k, dequantize_q4_k, Q4_K_BYTES),
        ("q5_K", quantize_q5_k, dequantize_q5_k, Q5_K_BYTES),
        ("q6_K", quantize_q6_k, dequantize_q6_k, Q6_K_BYTES),
    ];

    /// Deterministic roughly-Gaussian values (sum of 4 uniforms, SplitMix64).
    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed;
        let mut u = || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
        };
        (0..n)
            .map(|_| (u() + u() + u() + u() - 2.0) * 1.7)
            .collect()
    }

    fn round_trip(
        q: fn(&[f32], &mut [u8]),
        dq: fn(&[u8], &mut [f32]),
        bb: usize,
        x: &[f32],
    ) -> (Vec<u8>, Vec<f32>) {
        let mut b = vec![0u8; x.len() / QK_K * bb];
        q(x, &mut b);
        let mut y = vec![0f32; x.len()];
        dq(&b, &mut y);
        (b, y)
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for i in -40_000..40_000 {
            let v = i as f32 * 0.25;
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        assert_eq!(nearest_int(-4_194_303.0), -4_194_303);
        assert_eq!(nearest_int(-0.0), 0);
        assert_eq!(nearest_int(0.49999997), 0);
    }

    #[test]
    fn f16_scale_rounding_matches_ggml_bit_trick() {
        // ggml's branch-free fp32 -> fp16 (FP16 library), written out here as an independent
        // check of the `half` + NaN path used for d/dmin.
        fn ggml(f: f32) -> u16 {
            let base = (f.abs() * f32::from_bits(0x7780_0000)) * f32::from_bits(0x0880_0000);
            let w = f.to_bits();
            let shl1_w = w.wrapping_add(w);
            let sign = w & 0x8000_0000;
            let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
            let base = f32::from_bits((bias >> 1) + 0x0780_0000) + base;
            let bits = base.to_bits();
            let nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
            ((sign >> 16)
                | if shl1_w > 0xFF00_0000 {
                    0x7E00
                } else {
                    nonsign
                }) as u16
        }
        let mut s = 1u32;
        for i in 0..2_000_000u32 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            // Every exponent, random mantissas; plus a sweep of the f16 subnormal/overflow edges.
            let v = if i % 2 == 0 {
                f32::from_bits(s)
            } else {
                f32::from_bits(0x3300_0000 + (i >> 1) * 97)
            };
            let (a, b) = (f16_ggml(v), ggml(v));
            assert_eq!(a, b, "{v:e} ({:#010x})", v.to_bits());
        }
        for v in [
            0.0f32,
            -0.0,
            65504.0,
            65519.996,
            65520.0,
            f32::INFINITY,
            f32::NAN,
            -f32::NAN,
        ] {
            assert_eq!(f16_ggml(v), ggml(v), "{v}");
        }
    }

    #[test]
    fn zero_blocks_encode_to_zero() {
        let x = vec![0f32; 2 * QK_K];
        for (name, q, dq, bb) in ALL {
            let (b, y) = round_trip(q, dq, bb, &x);
            assert!(b.iter().all(|&v| v == 0), "{name}: {b:?}");
            assert!(y.iter().all(|&v| v == 0.0), "{name}");
        }
    }

    #[test]
    fn round_trip_error_is_within_format_bounds() {
        // Relative RMS error on Gaussian-like data, upper bounds ~1.2x what the reference
        // algorithm achieves (measured 0.287, 0.147, 0.0695, 0.0351, 0.0170; --nocapture).
        let bounds = [
            ("q2_K", 0.34),
            ("q3_K", 0.18),
            ("q4_K", 0.085),
            ("q5_K", 0.042),
            ("q6_K", 0.021),
        ];
        let x = noise(7, 64 * QK_K);
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
        for ((name, q, dq, bb), (bname, bound)) in ALL.into_iter().zip(bounds) {
            assert_eq!(name, bname);
            let (_, y) = round_trip(q, dq, bb, &x);
            let err = (x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                / x.len() as f32)
                .sqrt();
            let rel = err / rms;
            println!("{name}: relative RMS error {rel:.4}");
            assert!(rel < bound, "{name}: relative RMS error {rel} >= {bound}");
            // Scale invariance by powers of two (away from f16 range limits): every operation is
            // exact under a 2^k scaling, so the levels and scales codes are identical.
            let x4: Vec<f32> = x.iter().map(|v| v * 4.0).collect();
            let (b1, _) = round_trip(q, dq, bb, &x);
            let (b4, y4) = round_trip(q, dq, bb, &x4);
            for (blk, (c1, c4)) in b1.chunks(bb).zip(b4.chunks(bb)).enumerate() {
                assert_eq!(
                    codes_only(name, c1),
                    codes_only(name, c4),
                    "{name} block {blk}"
                );
            }
            for (a, b) in y.iter().zip(&y4) {
                assert_eq!(a * 4.0, *b, "{name}");
            }
        }
    }

    /// A block with its f16 super-scales zeroed (what remains must not depend on a 2^k scaling).
    fn codes_only(name: &str, b: &[u8]) -> Vec<u8> {
        let mut c = b.to_vec();
        let r = match name {
            "q2_K" => 80..84,
            "q3_K" => 108..110,
            "q6_K" => 208..210,
            _ => 0..4,
        };
        c[r].fill(0);
        c
    }

    #[test]
    fn requantizing_is_stable() {
        // Quantizing the dequantized values again must reproduce them closely: the decoded grid
        // is (nearly) representable, so the second pass loses (almost) nothing more.
        let x = noise(11, 16 * QK_K);
        for (name, q, dq, bb) in ALL {
            let (_, y1) = round_trip(q, dq, bb, &x);
            let (_, y2) = round_trip(q, dq, bb, &y1);
            let e1 = x
                .iter()
                .zip(&y1)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>();
            let e12 = y1
                .iter()
                .zip(&y2)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>();
            println!("{name}: first-pass error {e1:.4}, second pass moves {e12:.4}");
            assert!(e12 < 0.1 * e1, "{name}: {e12} vs {e1}");
        }
    }

    #[test]
    fn q6_k_and_q3_k_scale_codes_are_packed_as_ggml_reads_them() {
        // The largest |scale| sub-block gets code -128 (Q6_K) / -32 (Q3_K) relative to d's sign.
        let mut x = noise(3, QK_K);
        for v in &mut x[32..48] {
            *v *= 8.0;
        }
        let (b, _) = round_trip(quantize_q6_k, dequantize_q6_k, Q6_K_BYTES, &x);
        assert_eq!(b[192 + 2] as i8, -128);
        let (b, _) = round_trip(quantize_q3_k, dequantize_q3_k, Q3_K_BYTES, &x);
        assert_eq!(q3_k_scales(&b[96..108])[2], -32);
    }

    #[test]
    fn q4_k_scale_min_packing_round_trips() {
        for seed in 0..50u32 {
            let mut ls = [0u8; 8];
            let mut lm = [0u8; 8];
            for j in 0..8 {
                ls[j] = ((seed * 37 + j as u32 * 11) % 64) as u8;
                lm[j] = ((seed * 53 + j as u32 * 29 + 5) % 64) as u8;
            }
            let mut q = [0u8; 12];
            pack_scale_min_k4(&ls, &lm, &mut q);
            for j in 0..8 {
                assert_eq!(scale_min_k4(j, &q), (ls[j], lm[j]));
            }
        }
    }

    #[test]
    fn q4_k_simple_block() {
        // d = 1, dmin = 0.5, scale 0 = 2, min 0 = 1, all nibbles 3 -> first 32 values 2*3 - 0.5.
        let mut b = [0u8; Q4_K_BYTES];
        b[0..2].copy_from_slice(&0x3C00u16.to_le_bytes());
        b[2..4].copy_from_slice(&0x3800u16.to_le_bytes());
        b[4] = 2;
        b[8] = 1;
        for q in &mut b[16..] {
            *q = 0x33;
        }
        let mut y = [0f32; QK_K];
        dequantize_q4_k(&b, &mut y);
        assert!(y[..32].iter().all(|&v| v == 5.5));
        assert!(y[32..].iter().all(|&v| v == 0.0));
    }
}
