//! Q2_K: 16 groups of 16 two-bit values, 4-bit scales and mins, f16 `d`/`dmin` (84 bytes).

use super::search::make_qkx2_quants;
use super::{f16_at, nearest_int, pack_2bit, put_f16, Q2_K_BYTES, QK_K};

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
        levels_from_scales(x, sc, d, dmin, &mut l);
        pack_2bit(&l, &mut rest[..64]);
    }
}

/// The 2-bit levels of one super-block from its stored scales (`sc`: 4-bit scale | 4-bit min per
/// 16 values) and super-scales `d`, `dmin`, as ggml's q2_K quantizers finish; a group whose scale
/// is 0 keeps its levels.
pub(super) fn levels_from_scales(x: &[f32], sc: &[u8], d: f32, dmin: f32, l: &mut [u8; QK_K]) {
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
}
