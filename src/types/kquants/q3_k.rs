//! Q3_K: 16 groups of 16 three-bit values (2 low bits in `qs`, the high bit in `hmask`),
//! 6-bit signed scales, f16 `d` (110 bytes).

use super::search::{make_q3_quants_rmse, make_qx_quants_rmse1};
use super::{f16_at, nearest_int, pack_2bit, put_f16, Q3_K_BYTES, QK_K};

/// The 16 signed 6-bit scales of a Q3_K block: low 4 bits from `s[k % 8]` (low nibble for
/// k < 8, high nibble after), high 2 bits from `s[8 + k % 4]` at bit `2 * (k / 4)`, minus 32.
#[inline(always)]
pub(crate) fn q3_k_scales(s: &[u8]) -> [i32; 16] {
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
                pack_scale(sc, j, (li as i32).clamp(-32, 31) + 32);
            }
            put_f16(y, 108, 1.0 / iscale)
        } else {
            put_f16(y, 108, 0.0)
        };
        levels_pack(x, y, d, &mut l);
    }
}

/// Q3_K rows weighted by an importance matrix, as `llama-quantize --imatrix` writes them
/// (ggml's `quantize_row_q3_K_impl`): weights `imp·sqrt(σ² + x²)` (`σ² = 2·Σx²/256` of the
/// super-block), `make_qx_quants` (nmax 4) per 16-value group under them, then the 16 group
/// scales themselves by `make_qx_quants` (nmax 32) weighted by each group's weight sum, stored
/// as found (6-bit, `+ 32`) with their scale as `d`. `src` is whole rows of `imp.len()` values.
pub(crate) fn quantize_q3_k_imatrix(src: &[f32], imp: &[f32], out: &mut [u8]) {
    let n = imp.len();
    let mut l = [0i8; QK_K];
    let mut w = [0f32; 16];
    for (row, ob) in src
        .chunks_exact(n)
        .zip(out.chunks_exact_mut(n / QK_K * Q3_K_BYTES))
    {
        for ((x, qw), y) in row
            .chunks_exact(QK_K)
            .zip(imp.chunks_exact(QK_K))
            .zip(ob.chunks_exact_mut(Q3_K_BYTES))
        {
            let mut sumx2 = 0f32;
            for v in x {
                sumx2 += v * v;
            }
            let sigma2 = 2.0 * sumx2 / QK_K as f32;
            let mut scales = [0f32; QK_K / 16];
            let mut sw = [0f32; QK_K / 16];
            for j in 0..QK_K / 16 {
                let r = 16 * j..16 * j + 16;
                for ((o, &q), &v) in w.iter_mut().zip(&qw[r.clone()]).zip(&x[r.clone()]) {
                    *o = q * (sigma2 + v * v).sqrt();
                }
                let mut sumw = 0f32;
                for &v in &w {
                    sumw += v;
                }
                sw[j] = sumw;
                scales[j] = make_qx_quants_rmse1::<16>(
                    4,
                    x[r.clone()].try_into().unwrap(),
                    Some(&w),
                    (&mut l[r]).try_into().unwrap(),
                );
            }
            let mut ls = [0i8; 16];
            let d_block = make_qx_quants_rmse1::<16>(32, &scales, Some(&sw), &mut ls);
            let sc = &mut y[96..108];
            sc.fill(0);
            for (j, &li) in ls.iter().enumerate() {
                pack_scale(sc, j, li as i32);
            }
            let d = put_f16(y, 108, d_block);
            levels_pack(x, y, d, &mut l);
        }
    }
}

/// Store scale `j`'s 6-bit code `li` (`0..=63`, the scale `+ 32`) in the 12 scale bytes.
fn pack_scale(sc: &mut [u8], j: usize, li: i32) {
    if j < 8 {
        sc[j] = (li & 0x0F) as u8;
    } else {
        sc[j - 8] |= ((li & 0x0F) << 4) as u8;
    }
    sc[8 + j % 4] |= ((li >> 4) << (2 * (j / 4))) as u8;
}

/// Every level recomputed from the stored scales (`d` the decoded f16; a group whose scale
/// decodes to 0 keeps the levels its search found, stored `+ 4`), then packed.
fn levels_pack(x: &[f32], y: &mut [u8], d: f32, l: &mut [i8; QK_K]) {
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
}
