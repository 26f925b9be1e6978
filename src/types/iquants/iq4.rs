//! IQ4_NL / IQ4_XS encoders: every value is `scale · kvalues_iq4nl[c]`, a 4-bit index `c` into
//! the non-linear table, one f16 scale per 32 values (IQ4_NL), or an f16 super-scale `d` and a
//! 6-bit signed sub-scale `ls − 32` per 32 values of a 256-value super-block (IQ4_XS).
//!
//! [`quantize_iq4_nl`] / [`quantize_iq4_xs`] write what `llama-quantize` writes without an
//! importance matrix (ggml's `quantize_iq4_nl` / `quantize_iq4_xs`, whose per-32 scale search
//! runs with 7 tries and weights `x²`), byte for byte (`tests/kquants_llama.rs`). The search
//! ([`search_scale`]): with `m` the value of largest |x|, codes rounded at the inverse scale
//! `−127/m` give the weighted least-squares scale `Σ w x q / Σ w q²` (`q` the table values);
//! then each trial inverse scale `(k − 127)/m`, `k = −ntry..=ntry`, is rounded and kept when its
//! fit `(Σ w x q)² / Σ w q²` is larger. Codes are then re-rounded at the unrounded f32 scale (as
//! ggml does; the importance-weighted encoder in `types::grid` rounds onto the f16 grid instead).

use super::{IQ4_NL_BYTES, IQ4_XS_BYTES, KVALUES_IQ4NL, KV_F32, QK4_NL, QK_K};
use crate::types::kquants::{nearest_int, put_f16};

/// ggml's `GROUP_MAX_EPS`: a 32-value group whose largest |x| is below this gets scale 0.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Tries each side of the max-based scale in llama-quantize's search.
pub(crate) const NTRY: i32 = 7;

/// ggml's `best_index_int8` on `kvalues_iq4nl`: the nearest table index to `x`, ties (in f32)
/// going up, below/above the table clamped.
#[inline]
pub(crate) fn best_index(x: f32) -> u8 {
    let v = |i: usize| KVALUES_IQ4NL[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mid = (ml + mu) / 2;
        if x < v(mid) {
            mu = mid;
        } else {
            ml = mid;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The scale search of one 32-value group (module comment) with weights `w`; `anchors` are the
/// table values the group's largest-|x| value is mapped near (llama.cpp: `[−127]`; the grid
/// encoder also tries `113`, the table's other end). Returns the signed f32 scale (0 for a group
/// below [`GROUP_MAX_EPS`]). f32 arithmetic in ggml's order, so [`quantize_iq4_nl`] stays
/// byte-identical.
pub(crate) fn search_scale(x: &[f32], w: &[f32], ntry: i32, anchors: &[i32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let fit = |id: f32| {
        let (mut sqx, mut sq2) = (0f32, 0f32);
        for (&v, &wi) in x.iter().zip(w) {
            let q = KV_F32[best_index(id * v) as usize];
            sqx += wi * q * v;
            sq2 += wi * q * q;
        }
        (sqx, sq2)
    };
    let d0 = -max / KV_F32[0];
    let (sqx, sq2) = fit(1.0 / d0);
    let mut d = if sq2 > 0.0 { sqx / sq2 } else { 0.0 };
    let mut best = d * sqx;
    for &a in anchors {
        for k in -ntry..=ntry {
            let (sqx, sq2) = fit((k + a) as f32 / max);
            if sq2 > 0.0 && sqx * sqx > best * sq2 {
                d = sqx / sq2;
                best = d * sqx;
            }
        }
    }
    d
}

/// Pack 32 codes (`0..16`) as ggml: byte `j` holds codes `j` (low nibble) and `j + 16`.
#[inline]
pub(crate) fn pack32(codes: &[u8], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = codes[j] | (codes[j + 16] << 4);
    }
}

/// IQ4_XS: the super-block's f16 `d` and 6-bit sub-scales for the 8 group scales `scales`, as
/// ggml quantizes them (`d = −s_max/32` with `s_max` the scale of largest magnitude; sub-scale
/// `l = round(s/d)` in `−32..=31`), written into `b`. Returns the unrounded `d` and every `l`
/// (the decoded group scale is `f16(d) · l`).
pub(crate) fn xs_scales(scales: &[f32], b: &mut [u8]) -> (f32, [i32; 8]) {
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for &s in scales {
        if s.abs() > amax {
            amax = s.abs();
            max_scale = s;
        }
    }
    let d = -max_scale / 32.0;
    put_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut ls = [0i32; 8];
    let (mut sh, mut sl) = (0u16, [0u8; 4]);
    for (ib, (&s, l)) in scales.iter().zip(ls.iter_mut()).enumerate() {
        *l = nearest_int(id * s).clamp(-32, 31);
        let u = (*l + 32) as u8;
        sl[ib / 2] |= (u & 0x0F) << (4 * (ib % 2));
        sh |= ((u >> 4) as u16) << (2 * ib);
    }
    b[2..4].copy_from_slice(&sh.to_le_bytes());
    b[4..8].copy_from_slice(&sl);
    (d, ls)
}

/// IQ4_NL blocks as `llama-quantize` writes them without an imatrix.
pub fn quantize_iq4_nl(src: &[f32], out: &mut [u8]) {
    let mut w = [0f32; QK4_NL];
    let mut l = [0u8; QK4_NL];
    for (x, b) in src
        .chunks_exact(QK4_NL)
        .zip(out.chunks_exact_mut(IQ4_NL_BYTES))
    {
        for (wi, &v) in w.iter_mut().zip(x) {
            *wi = v * v;
        }
        let d = search_scale(x, &w, NTRY, &[KVALUES_IQ4NL[0] as i32]);
        put_f16(b, 0, d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (c, &v) in l.iter_mut().zip(x) {
            *c = best_index(id * v);
        }
        pack32(&l, &mut b[2..18]);
    }
}

/// IQ4_XS super-blocks as `llama-quantize` writes them without an imatrix.
pub fn quantize_iq4_xs(src: &[f32], out: &mut [u8]) {
    let mut w = [0f32; 32];
    let mut l = [0u8; 32];
    let mut scales = [0f32; QK_K / 32];
    for (x, b) in src
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(IQ4_XS_BYTES))
    {
        for (s, xb) in scales.iter_mut().zip(x.chunks_exact(32)) {
            for (wi, &v) in w.iter_mut().zip(xb) {
                *wi = v * v;
            }
            *s = search_scale(xb, &w, NTRY, &[KVALUES_IQ4NL[0] as i32]);
        }
        let (d, ls) = xs_scales(&scales, b);
        for (ib, xb) in x.chunks_exact(32).enumerate() {
            let dl = d * ls[ib] as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for (c, &v) in l.iter_mut().zip(xb) {
                *c = best_index(idl * v);
            }
            pack32(&l, &mut b[8 + 16 * ib..8 + 16 * ib + 16]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `best_index` is the nearest table entry (ties up), and clamps outside the table.
    #[test]
    fn best_index_is_the_nearest_entry() {
        for i in -20_000..20_000 {
            let x = i as f32 * 0.01;
            let c = best_index(x) as usize;
            let e = (x - KV_F32[c]).abs();
            for (k, &v) in KV_F32.iter().enumerate() {
                assert!(e <= (x - v).abs(), "{x}: {c} vs {k}");
                if e == (x - v).abs() && k != c {
                    assert!(k < c, "{x}: a tie goes to the larger index");
                }
            }
        }
        assert_eq!(best_index(-1e30), 0);
        assert_eq!(best_index(1e30), 15);
    }

    /// Round trip through the registry's decoders: the error of every value is within half a
    /// table gap of its block's scale (plus the f16 rounding of the scale), and blocks of zeros
    /// decode to zero.
    #[test]
    fn round_trip_error_is_bounded() {
        let x: Vec<f32> = (0..64 * QK_K)
            .map(|i| ((i as f32 * 0.618).sin() * 3.0 + (i as f32 * 0.1).cos()) * 0.01)
            .collect();
        for (ty, q) in [
            (
                crate::types::TensorType::IQ4NL,
                quantize_iq4_nl as fn(&[f32], &mut [u8]),
            ),
            (crate::types::TensorType::IQ4XS, quantize_iq4_xs),
        ] {
            let mut b = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
            q(&x, &mut b);
            let mut y = vec![0f32; x.len()];
            crate::types::dequantize(ty, &b, &mut y, "t").unwrap();
            for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (a, b) in xb.iter().zip(yb) {
                    // Largest half-gap of the table is 12, its range 240: ~amax·12/113 plus the
                    // 6-bit sub-scale rounding for IQ4_XS.
                    assert!(
                        (a - b).abs() <= 0.2 * amax,
                        "{ty}: {a} -> {b} (amax {amax})"
                    );
                }
            }
            let z = vec![0f32; QK_K];
            let mut bz = vec![0u8; ty.bytes_for(QK_K as u64).unwrap() as usize];
            q(&z, &mut bz);
            crate::types::dequantize(ty, &bz, &mut y[..QK_K], "t").unwrap();
            assert!(y[..QK_K].iter().all(|&v| v == 0.0), "{ty}");
        }
    }

    /// A length that is not a whole number of blocks is the registry's one-line error naming
    /// the tensor, for both types.
    #[test]
    fn partial_block_is_a_clear_error() {
        use crate::types::TensorType::{IQ4NL, IQ4XS};
        let x = vec![0.5f32; 48];
        for (ty, bytes) in [(IQ4NL, 27), (IQ4XS, 25)] {
            let mut out = vec![0u8; bytes];
            let e = crate::types::quantize(ty, &x, &mut out, "blk.0.attn_q.weight").unwrap_err();
            let m = e.to_string();
            assert!(m.contains("blk.0.attn_q.weight"), "{m}");
            assert!(m.contains(&format!("whole number of {ty} blocks")), "{m}");
        }
        let e = crate::types::quantize_rows(IQ4XS, &vec![0f32; 576], &mut [0u8; 306], 576, "t");
        assert!(e.is_err());
    }
}
