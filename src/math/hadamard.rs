//! Fast Walsh–Hadamard transform (unnormalized Sylvester butterfly).

/// In-place unnormalized FWHT, scalar reference. `x.len()` must be a power of two.
/// Butterfly order is the engines' (`step = 1, 2, 4, ...`), so f32 results are bit-exact with them.
pub fn fwht_scalar(x: &mut [f32]) {
    let n = x.len();
    assert!(n.is_power_of_two(), "FWHT length {n} is not a power of two");
    let mut step = 1;
    while step < n {
        let mut i = 0;
        while i < n {
            for j in i..i + step {
                let a = x[j];
                let c = x[j + step];
                x[j] = a + c;
                x[j + step] = a - c;
            }
            i += 2 * step;
        }
        step *= 2;
    }
}

/// In-place unnormalized FWHT, optimized: the first three stages fused in registers per
/// 8-element chunk, then pairs of stages fused (radix 4) in loops the compiler vectorizes.
/// Every element sees the same additions in the same order as [`fwht_scalar`], so the results
/// are bit-identical. `x.len()` must be a power of two.
pub fn fwht(x: &mut [f32]) {
    let n = x.len();
    assert!(n.is_power_of_two(), "FWHT length {n} is not a power of two");
    if n < 8 {
        fwht_scalar(x);
        return;
    }
    for c in x.chunks_exact_mut(8) {
        let (a0, a1, a2, a3) = (c[0] + c[1], c[0] - c[1], c[2] + c[3], c[2] - c[3]);
        let (a4, a5, a6, a7) = (c[4] + c[5], c[4] - c[5], c[6] + c[7], c[6] - c[7]);
        let (b0, b1, b2, b3) = (a0 + a2, a1 + a3, a0 - a2, a1 - a3);
        let (b4, b5, b6, b7) = (a4 + a6, a5 + a7, a4 - a6, a5 - a7);
        c[0] = b0 + b4;
        c[1] = b1 + b5;
        c[2] = b2 + b6;
        c[3] = b3 + b7;
        c[4] = b0 - b4;
        c[5] = b1 - b5;
        c[6] = b2 - b6;
        c[7] = b3 - b7;
    }
    let mut step = 8;
    while step * 4 <= n {
        for blk in x.chunks_exact_mut(4 * step) {
            let (q01, q23) = blk.split_at_mut(2 * step);
            let (q0, q1) = q01.split_at_mut(step);
            let (q2, q3) = q23.split_at_mut(step);
            for (((p0, p1), p2), p3) in q0
                .iter_mut()
                .zip(q1.iter_mut())
                .zip(q2.iter_mut())
                .zip(q3.iter_mut())
            {
                let (b0, b1) = (*p0 + *p1, *p0 - *p1);
                let (b2, b3) = (*p2 + *p3, *p2 - *p3);
                *p0 = b0 + b2;
                *p1 = b1 + b3;
                *p2 = b0 - b2;
                *p3 = b1 - b3;
            }
        }
        step *= 4;
    }
    if step < n {
        for blk in x.chunks_exact_mut(2 * step) {
            let (lo, hi) = blk.split_at_mut(step);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let t = *a;
                *a = t + *b;
                *b = t - *b;
            }
        }
    }
}

/// In-place unnormalized FWHT in f64, the butterfly order of [`fwht_scalar`] (references that
/// must be more exact than the f32 transforms they check). `x.len()` must be a power of two.
pub fn fwht_f64(x: &mut [f64]) {
    let n = x.len();
    assert!(n.is_power_of_two(), "FWHT length {n} is not a power of two");
    let mut step = 1;
    while step < n {
        for blk in x.chunks_exact_mut(2 * step) {
            let (lo, hi) = blk.split_at_mut(step);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let t = *a;
                *a = t + *b;
                *b = t - *b;
            }
        }
        step *= 2;
    }
}

/// `1/√n` as the f32 constant the engines use.
pub fn inv_sqrt_len(n: usize) -> f32 {
    (1.0 / (n as f64).sqrt()) as f32
}

/// Randomized Hadamard transform in place: `x ← (1/√n)·H·diag(s)·x`
/// (multiply by the signs, butterfly, scale: the order of the TQ block rotation).
pub fn rht_forward(x: &mut [f32], signs: &[f32]) {
    assert_eq!(x.len(), signs.len(), "RHT: data and sign lengths differ");
    for (v, s) in x.iter_mut().zip(signs) {
        *v *= s;
    }
    fwht(x);
    let k = inv_sqrt_len(x.len());
    for v in x.iter_mut() {
        *v *= k;
    }
}

/// Inverse of [`rht_forward`]: `x ← diag(s)·(1/√n)·H·x` (butterfly, then one product `(1/√n)·s`).
pub fn rht_inverse(x: &mut [f32], signs: &[f32]) {
    assert_eq!(x.len(), signs.len(), "RHT: data and sign lengths differ");
    fwht(x);
    let k = inv_sqrt_len(x.len());
    for (v, s) in x.iter_mut().zip(signs) {
        *v *= k * s;
    }
}

/// Two-sided randomized Hadamard of the turbo KV types: `y = s2 ⊙ ((1/√n)·H·(s1 ⊙ x))`.
/// The inverse is the same transform with `s1` and `s2` swapped.
pub fn rht2_forward(x: &mut [f32], s1: &[f32], s2: &[f32]) {
    rht_forward(x, s1);
    for (v, s) in x.iter_mut().zip(s2) {
        *v *= s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg_data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect()
    }

    #[test]
    fn optimized_fwht_is_bit_identical_to_scalar() {
        for log in 0..=14 {
            let n = 1usize << log;
            let x = lcg_data(n, log as u64 + 1);
            let mut a = x.clone();
            let mut b = x.clone();
            fwht_scalar(&mut a);
            fwht(&mut b);
            assert!(
                a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                "n = {n}"
            );
        }
    }

    #[test]
    fn fwht_matches_the_matrix_definition() {
        // H[i][j] = (-1)^popcount(i & j) for the Sylvester order used by the butterfly.
        let n = 16;
        let x = lcg_data(n, 7);
        let mut y = x.clone();
        fwht(&mut y);
        for i in 0..n {
            let want: f64 = (0..n)
                .map(|j| {
                    if (i & j).count_ones() % 2 == 0 {
                        x[j] as f64
                    } else {
                        -(x[j] as f64)
                    }
                })
                .sum();
            assert!((y[i] as f64 - want).abs() < 1e-5);
        }
    }

    #[test]
    fn rht_inverse_is_identity() {
        for n in [32usize, 128, 4096] {
            let x = lcg_data(n, n as u64);
            let s = crate::math::pcg64::row_signs(1, n);
            let mut y = x.clone();
            rht_forward(&mut y, &s);
            let e_in: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
            let e_out: f64 = y.iter().map(|v| (*v as f64).powi(2)).sum();
            assert!((e_in - e_out).abs() < 1e-5 * e_in, "orthonormal");
            rht_inverse(&mut y, &s);
            let scale = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= 4.0 * f32::EPSILON * scale * (n as f32).log2());
            }
        }
    }

    #[test]
    fn rht2_inverse_swaps_signs() {
        let s1: Vec<f32> = crate::math::signs::TURBO_S1
            .iter()
            .map(|&v| v as f32)
            .collect();
        let s2: Vec<f32> = crate::math::signs::TURBO_S2
            .iter()
            .map(|&v| v as f32)
            .collect();
        let x = lcg_data(128, 3);
        let mut y = x.clone();
        rht2_forward(&mut y, &s1, &s2);
        rht2_forward(&mut y, &s2, &s1);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}
