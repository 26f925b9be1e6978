//! The scalar reference TQ4_1S / TQ3_1S encoder and decoder: the fork's
//! `quantize_row_tq*_1s_ref` / `dequantize_row_tq*_1s` in f32, operation by operation (every op
//! rounded on its own, same order). The conformance vectors pin these bytes; every faster path
//! in `super` and `super::simd` is tested bit-equal to them.

use super::{
    forward_rotate, get_scales, inv_of, inverse_rotate, pack_tq3, pack_tq4, tq_index, unpack_tq3,
    unpack_tq4, BlockQ, C3, C4, MULTS, QK, REFINE_ROUNDS, T3, T4, TQ3_BYTES, TQ4_BYTES,
};

/// The scalar reference quantizer for one block (`x.len() >= 32`; `c`, `t`: codebook and its
/// hard-coded thresholds). Operation order follows the fork's `quantize_row_tq*_1s_ref`.
pub fn quantize_block_ref(x: &[f32], c: &[f32], t: &[f32]) -> BlockQ {
    let mut buf = [0f32; QK];
    buf.copy_from_slice(&x[..QK]);
    forward_rotate(&mut buf);

    // Per-half RMS.
    let mut rms = [0f32; 2];
    for h in 0..2 {
        let mut s = 0f32;
        for v in &buf[h * 16..h * 16 + 16] {
            s += v * v;
        }
        rms[h] = (s / 16.0).sqrt();
    }

    // Scale search: one multiplier for both halves, error over all 32 values.
    let mut best = rms;
    let mut best_err = 1e30f32;
    for &m in MULTS.iter() {
        let d = [rms[0] * m, rms[1] * m];
        let inv = [inv_of(d[0]), inv_of(d[1])];
        let mut err = 0f32;
        for j in 0..QK {
            let h = j / 16;
            let i = tq_index(buf[j] * inv[h], t);
            let diff = buf[j] - c[i] * d[h];
            err += diff * diff;
        }
        if err < best_err {
            best_err = err;
            best = d;
        }
    }

    // Refinement: least-squares scale for the current indices, per half.
    let mut d = best;
    for _ in 0..REFINE_ROUNDS {
        for h in 0..2 {
            let inv = inv_of(d[h]);
            let mut sxc = 0f32;
            let mut scc = 0f32;
            for v in &buf[h * 16..h * 16 + 16] {
                let cv = c[tq_index(v * inv, t)];
                sxc += v * cv;
                scc += cv * cv;
            }
            if scc > 1e-10 {
                d[h] = sxc / scc;
            }
        }
    }

    // Final indices from the f32 scales.
    let mut idx = [0u8; QK];
    for j in 0..QK {
        let h = j / 16;
        idx[j] = tq_index(buf[j] * inv_of(d[h]), t) as u8;
    }
    BlockQ { d, idx }
}

fn dequantize_block(b: &[u8], idx: &[u8; QK], c: &[f32], out: &mut [f32]) {
    let d = get_scales(b);
    let mut buf = [0f32; QK];
    for j in 0..QK {
        buf[j] = c[idx[j] as usize] * d[j / 16];
    }
    inverse_rotate(&mut buf);
    out[..QK].copy_from_slice(&buf);
}

/// Scalar reference TQ4_1S quantizer (whole blocks).
pub fn quantize_tq4_1s_ref(src: &[f32], out: &mut [u8]) {
    for (x, o) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ4_BYTES)) {
        pack_tq4(&quantize_block_ref(x, &C4, &T4), o);
    }
}

/// Scalar reference TQ4_1S dequantizer (whole blocks).
pub fn dequantize_tq4_1s_ref(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ4_BYTES).zip(out.chunks_exact_mut(QK)) {
        dequantize_block(b, &unpack_tq4(b), &C4, o);
    }
}

/// Scalar reference TQ3_1S quantizer (whole blocks).
pub fn quantize_tq3_1s_ref(src: &[f32], out: &mut [u8]) {
    for (x, o) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ3_BYTES)) {
        pack_tq3(&quantize_block_ref(x, &C3, &T3), o);
    }
}

/// Scalar reference TQ3_1S dequantizer (whole blocks).
pub fn dequantize_tq3_1s_ref(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(TQ3_BYTES).zip(out.chunks_exact_mut(QK)) {
        dequantize_block(b, &unpack_tq3(b), &C3, o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::tq::testutil::{next_down, next_up, pack3, pack4, q3, q4, varied_block, Rng};

    #[derive(Clone, Copy)]
    enum Cmp {
        Lt,
        Le,
    }

    /// A parameterized copy of the reference quantizer: refinement rounds, the threshold
    /// table and the comparison are knobs. With (6, hard-coded table, `<`) it must equal the
    /// reference (checked by `model_equals_reference`).
    fn model(x: &[f32], c: &[f32], t: &[f32], rounds: usize, cmp: Cmp) -> BlockQ {
        let index = |v: f32| -> usize {
            for (i, &th) in t.iter().enumerate() {
                let below = match cmp {
                    Cmp::Lt => v < th,
                    Cmp::Le => v <= th,
                };
                if below {
                    return i;
                }
            }
            t.len()
        };
        let mut buf = [0f32; QK];
        buf.copy_from_slice(&x[..QK]);
        forward_rotate(&mut buf);
        let mut rms = [0f32; 2];
        for h in 0..2 {
            let mut s = 0f32;
            for v in &buf[h * 16..h * 16 + 16] {
                s += v * v;
            }
            rms[h] = (s / 16.0).sqrt();
        }
        let mut best = rms;
        let mut best_err = 1e30f32;
        for &m in MULTS.iter() {
            let d = [rms[0] * m, rms[1] * m];
            let inv = [inv_of(d[0]), inv_of(d[1])];
            let mut err = 0f32;
            for j in 0..QK {
                let h = j / 16;
                let diff = buf[j] - c[index(buf[j] * inv[h])] * d[h];
                err += diff * diff;
            }
            if err < best_err {
                best_err = err;
                best = d;
            }
        }
        let mut d = best;
        for _ in 0..rounds {
            for h in 0..2 {
                let inv = inv_of(d[h]);
                let (mut sxc, mut scc) = (0f32, 0f32);
                for v in &buf[h * 16..h * 16 + 16] {
                    let cv = c[index(v * inv)];
                    sxc += v * cv;
                    scc += cv * cv;
                }
                if scc > 1e-10 {
                    d[h] = sxc / scc;
                }
            }
        }
        let mut idx = [0u8; QK];
        for j in 0..QK {
            idx[j] = index(buf[j] * inv_of(d[j / 16])) as u8;
        }
        BlockQ { d, idx }
    }

    /// Computed midpoints `(c[i] + c[i+1]) * 0.5` (what the hard-coded tables are *not*).
    fn midpoints(c: &[f32]) -> Vec<f32> {
        c.windows(2).map(|w| (w[0] + w[1]) * 0.5).collect()
    }

    /// Rotated-domain value the quantizer compares for element `j` under its final scale.
    fn final_ratio(x: &[f32; QK], q: &BlockQ, j: usize) -> f32 {
        let mut buf = *x;
        forward_rotate(&mut buf);
        buf[j] * inv_of(q.d[j / 16])
    }

    #[test]
    fn model_equals_reference() {
        let mut r = Rng(1);
        for _ in 0..3000 {
            let x = varied_block(&mut r);
            assert_eq!(
                model(&x, &C4, &T4, 6, Cmp::Lt),
                quantize_block_ref(&x, &C4, &T4)
            );
            assert_eq!(
                model(&x, &C3, &T3, 6, Cmp::Lt),
                quantize_block_ref(&x, &C3, &T3)
            );
        }
    }

    /// `index = first i with v < T[i]`: a value exactly on a threshold goes to the upper index.
    #[test]
    fn value_on_threshold_goes_up() {
        for (i, &t) in T4.iter().enumerate() {
            assert_eq!(tq_index(t, &T4), i + 1);
            assert_eq!(tq_index(next_down(t), &T4), i);
        }
        for (i, &t) in T3.iter().enumerate() {
            assert_eq!(tq_index(t, &T3), i + 1);
            assert_eq!(tq_index(next_down(t), &T3), i);
        }
        // End to end: 0 lies on T4[7], so an all-zero block is all index 8 (0x88), both ±0;
        // a `<=` quantizer would write 0x77.
        for z in [0.0f32, -0.0] {
            let x = [z; QK];
            let got = q4(&x);
            assert_eq!(got[..4], [0, 0, 0, 0]);
            assert!(got[4..].iter().all(|&b| b == 0x88), "{got:02x?}");
            assert_ne!(pack4(&model(&x, &C4, &T4, 6, Cmp::Le)), got);
            // TQ3: index 4 everywhere -> each 3-byte group is 24 49 92.
            assert_eq!(
                q3(&x)[4..],
                [0x24, 0x49, 0x92, 0x24, 0x49, 0x92, 0x24, 0x49, 0x92, 0x24, 0x49, 0x92]
            );
        }
    }

    /// End to end for TQ3, where 0 is not a threshold: find a block in which some element's final
    /// ratio lies exactly on a threshold and check it took the upper index (and that `<=` differs).
    #[test]
    fn tq3_value_exactly_on_threshold_end_to_end() {
        let (x, j, i) = scan_for_ratio(&C3, &T3, |v, t| v == t, 11).expect("no block found");
        let q = quantize_block_ref(&x, &C3, &T3);
        assert_eq!(final_ratio(&x, &q, j), T3[i]);
        assert_eq!(q.idx[j] as usize, i + 1);
        assert_ne!(pack3(&model(&x, &C3, &T3, 6, Cmp::Le)), q3(&x));
    }

    /// TQ3's threshold -0.008701 is asymmetric: values in [-0.008701, 0) pick the *positive*
    /// centroid (index 4, +0.230106).
    #[test]
    fn tq3_asymmetric_threshold() {
        let t = T3[3];
        assert_eq!(t, -0.008701f32);
        for v in [t, next_up(t), -0.005, -1e-6, -f32::from_bits(1), -0.0, 0.0] {
            assert_eq!(tq_index(v, &T3), 4, "v = {v:e}");
        }
        assert_eq!(tq_index(next_down(t), &T3), 3);
        const { assert!(C3[4] > 0.0 && C3[3] < 0.0) };
        // End to end: a random block with an element whose final ratio is in [T3[3], 0).
        let mut r = Rng(5);
        let mut found = 0;
        for _ in 0..2000 {
            let x = r.block(1.0);
            let q = quantize_block_ref(&x, &C3, &T3);
            for j in 0..QK {
                let v = final_ratio(&x, &q, j);
                if v >= t && v < 0.0 {
                    assert_eq!(q.idx[j], 4, "element {j}, ratio {v:e}");
                    assert_eq!(unpack_tq3(&q3(&x))[j], 4);
                    found += 1;
                }
            }
        }
        assert!(found > 10, "only {found} elements in [-0.008701, 0)");
    }

    /// Build a block whose final rotated ratio for some element is placed where `pred(v, T[i])`
    /// holds, by scanning that element's rotated value ulp by ulp around `T[i] * d`.
    fn scan_for_ratio(
        c: &[f32],
        t: &[f32],
        pred: impl Fn(f32, f32) -> bool,
        seed: u64,
    ) -> Option<([f32; QK], usize, usize)> {
        let mut r = Rng(seed);
        for attempt in 0..200 {
            let i = attempt % t.len();
            let j = (attempt * 7) % QK;
            let mut rot = r.block(1.0);
            let mut base = rot[j];
            for _ in 0..4 {
                let mut x = rot;
                inverse_rotate(&mut x);
                let q = quantize_block_ref(&x, c, t);
                base = t[i] * q.d[j / 16];
                rot[j] = base;
            }
            let mut v = base;
            for _ in 0..64 {
                v = next_down(v);
            }
            for _ in 0..128 {
                rot[j] = v;
                let mut x = rot;
                inverse_rotate(&mut x);
                let q = quantize_block_ref(&x, c, t);
                if pred(final_ratio(&x, &q, j), t[i]) {
                    return Some((x, j, i));
                }
                v = next_up(v);
            }
        }
        None
    }

    /// The comparison points are the hard-coded tables, which differ from the f32 midpoints of
    /// the codebooks by 1 to 17 ulps (except T4[7] = 0 and T3[4], T3[6]).
    #[test]
    fn thresholds_are_hardcoded_not_midpoints() {
        for (c, t) in [(&C4[..], &T4[..]), (&C3[..], &T3[..])] {
            let mid = midpoints(c);
            let mut differ = 0;
            for i in 0..t.len() {
                if t[i] == mid[i] {
                    continue;
                }
                differ += 1;
                // A value between the two (inclusive where the rules disagree).
                let v = if t[i] < mid[i] { t[i] } else { mid[i] };
                assert_ne!(tq_index(v, t), tq_index(v, &mid), "i = {i}");
                assert_eq!(tq_index(v, t), if t[i] < mid[i] { i + 1 } else { i });
            }
            assert!(differ >= 5);
        }
        // End to end: a TQ4 block with a final ratio in the gap between T4[i] and the midpoint.
        let mid = midpoints(&C4);
        let in_gap = |v: f32, ti: f32| {
            let i = T4.iter().position(|&x| x == ti).unwrap();
            let (lo, hi) = if T4[i] < mid[i] {
                (T4[i], mid[i])
            } else {
                (mid[i], T4[i])
            };
            lo != hi && v >= lo && v < hi
        };
        let (x, j, i) = scan_for_ratio(&C4, &T4, in_gap, 12).expect("no block found");
        let q = quantize_block_ref(&x, &C4, &T4);
        let expect = if T4[i] < mid[i] { i + 1 } else { i };
        assert_eq!(q.idx[j] as usize, expect);
        assert_eq!(q4(&x), pack4(&q));
        assert_ne!(pack4(&model(&x, &C4, &mid, 6, Cmp::Lt)), q4(&x));
    }

    /// Search random blocks until one where 5, 6 and 7 refinement rounds give different bytes
    /// from 6 (the fork's count); return it.
    fn find_rounds_block(c: &[f32], t: &[f32], seed: u64) -> Option<[f32; QK]> {
        let mut r = Rng(seed);
        for _ in 0..200_000 {
            let x = varied_block(&mut r);
            let q6 = model(&x, c, t, 6, Cmp::Lt);
            let q5 = model(&x, c, t, 5, Cmp::Lt);
            let q7 = model(&x, c, t, 7, Cmp::Lt);
            let bytes = |q: &BlockQ| {
                let mut o = [0u8; TQ4_BYTES];
                if c.len() == 16 {
                    pack_tq4(q, &mut o)
                } else {
                    pack_tq3(q, &mut o[..TQ3_BYTES])
                }
                o
            };
            if bytes(&q6) != bytes(&q5) && bytes(&q6) != bytes(&q7) {
                return Some(x);
            }
        }
        None
    }

    #[test]
    fn six_refinement_rounds_tq4() {
        let x = find_rounds_block(&C4, &T4, 6).expect("no block where 5/6/7 rounds differ");
        let got = q4(&x);
        assert_eq!(got, pack4(&model(&x, &C4, &T4, 6, Cmp::Lt)));
        assert_ne!(got, pack4(&model(&x, &C4, &T4, 5, Cmp::Lt)));
        assert_ne!(got, pack4(&model(&x, &C4, &T4, 7, Cmp::Lt)));
        let mut b = [0u8; TQ4_BYTES];
        quantize_tq4_1s_ref(&x, &mut b);
        assert_eq!(got, b);
    }

    #[test]
    fn six_refinement_rounds_tq3() {
        let x = find_rounds_block(&C3, &T3, 7).expect("no block where 5/6/7 rounds differ");
        let got = q3(&x);
        assert_eq!(got, pack3(&model(&x, &C3, &T3, 6, Cmp::Lt)));
        assert_ne!(got, pack3(&model(&x, &C3, &T3, 5, Cmp::Lt)));
        assert_ne!(got, pack3(&model(&x, &C3, &T3, 7, Cmp::Lt)));
    }

    /// Negative scales stick, and the f16 rounding happens after the final indices.
    #[test]
    fn scale_edge_behaviour() {
        // Sum of squares overflows f32 -> inv = 0 -> all index 8 -> refined scale may be negative.
        let x: [f32; QK] = std::array::from_fn(|i| if i % 2 == 0 { 1e20 } else { -3e19 });
        let q = quantize_block_ref(&x, &C4, &T4);
        assert_eq!(q4(&x), pack4(&q));
        // f16 overflow to inf.
        let x = [6e4f32; QK];
        let b = q4(&x);
        let d0 = u16::from_le_bytes([b[0], b[1]]);
        assert_eq!(d0 & 0x7fff, 0x7c00);
    }
}
