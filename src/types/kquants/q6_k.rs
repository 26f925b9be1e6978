//! Q6_K: 16 groups of 16 six-bit values (low nibbles in `ql`, high 2 bits in `qh`), signed
//! 8-bit scales, f16 `d` (210 bytes).

use super::search::make_qx_quants_rmse1;
use super::{f16_at, nearest_int, put_f16, GROUP_MAX_EPS, Q6_K_BYTES, QK_K};

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

pub fn quantize_q6_k(src: &[f32], out: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q6_K_BYTES)) {
        q6_k_block(x, None, y);
    }
}

/// Q6_K rows weighted by an importance matrix, as `llama-quantize --imatrix` writes them
/// (ggml's `quantize_row_q6_K_impl`): `make_qx_quants` per 16-value group under the raw
/// importances `imp` (no `sqrt(σ² + x²)` factor: ggml's has it commented out), the rest as the
/// reference quantizer. `src` is whole rows of `imp.len()` values.
pub(crate) fn quantize_q6_k_imatrix(src: &[f32], imp: &[f32], out: &mut [u8]) {
    let n = imp.len();
    for (row, ob) in src
        .chunks_exact(n)
        .zip(out.chunks_exact_mut(n / QK_K * Q6_K_BYTES))
    {
        for ((x, qw), y) in row
            .chunks_exact(QK_K)
            .zip(imp.chunks_exact(QK_K))
            .zip(ob.chunks_exact_mut(Q6_K_BYTES))
        {
            q6_k_block(x, Some(qw), y);
        }
    }
}

/// One super-block: group scales by `make_qx_quants` (weights `qw`, or `x²`), i8 scales over
/// `max/−128`, levels recomputed from the stored scales, packed.
fn q6_k_block(x: &[f32], qw: Option<&[f32]>, y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let r = 16 * ib..16 * ib + 16;
        let scale = make_qx_quants_rmse1::<16>(
            32,
            x[r.clone()].try_into().unwrap(),
            qw.map(|q| q[r.clone()].try_into().unwrap()),
            (&mut l[r]).try_into().unwrap(),
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
        return;
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
            qh[k] = (v(0) >> 4) | ((v(32) >> 4) << 2) | ((v(64) >> 4) << 4) | ((v(96) >> 4) << 6);
        }
    }
}
