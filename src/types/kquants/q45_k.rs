//! Q4_K and Q5_K: 8 sub-blocks of 32 four- (five-) bit values, 6-bit scales and mins packed
//! as ggml's `get_scale_min_k4` reads them, f16 `d`/`dmin` (144 / 176 bytes).

use super::search::make_qkx2_quants;
use super::{f16_at, nearest_int, put_f16, Q4_K_BYTES, Q5_K_BYTES, QK_K};

/// ggml's `get_scale_min_k4`: scale and min `j` (0..8) of a Q4_K/Q5_K block.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
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

/// Pack the 8 six-bit scales and mins of a Q4_K/Q5_K block (inverse of `scale_min_k4`).
#[inline(always)]
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], q: &mut [u8]) {
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
    put_f16(y, 0, max_scale / 63.0);
    put_f16(y, 2, max_min / 63.0);
    requantize(x, y, nmax, l);
}

/// Every level recomputed from a block's stored (rounded) scales and mins, as ggml's quantizers
/// end: `round((x + dmin·m) / (d·sc))` clamped to `0..=nmax`; a sub-block whose scale decodes to
/// 0 keeps the levels its search found.
pub(super) fn requantize(x: &[f32], y: &[u8], nmax: i32, l: &mut [u8; QK_K]) {
    let d = f16_at(y, 0);
    let dmin = f16_at(y, 2);
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

/// Store 256 four-bit levels into a Q4_K block's `qs`.
pub(super) fn pack_q4_k(l: &[u8; QK_K], y: &mut [u8]) {
    let qs = &mut y[16..144];
    for j in (0..QK_K).step_by(64) {
        for k in 0..32 {
            qs[j / 2 + k] = l[j + k] | (l[j + k + 32] << 4);
        }
    }
}

/// Store 256 five-bit levels into a Q5_K block's `qh` and `qs`.
pub(super) fn pack_q5_k(l: &[u8; QK_K], y: &mut [u8]) {
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

pub fn quantize_q4_k(src: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q4_K_BYTES)) {
        q45_k_levels(x, y, 15, -1.0, 20, &mut l);
        pack_q4_k(&l, y);
    }
}

pub fn quantize_q5_k(src: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q5_K_BYTES)) {
        q45_k_levels(x, y, 31, -0.5, 15, &mut l);
        pack_q5_k(&l, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
