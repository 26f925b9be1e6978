//! Test inputs shared by the TQ tests: a seeded Gaussian generator, varied and mixed blocks
//! (scales over many decades, zeros, repeats, subnormals), ulp steps, and one-block wrappers
//! of the registry quantizers.

use super::{
    pack_tq3, pack_tq4, quantize_tq3_1s, quantize_tq4_1s, BlockQ, QK, TQ3_BYTES, TQ4_BYTES,
};
use crate::math::splitmix::SplitMix64;

/// The crate's SplitMix64 (`math::splitmix`) over a bare state, with Gaussian blocks.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    fn draw<T>(&mut self, f: impl FnOnce(&mut SplitMix64) -> T) -> T {
        let mut g = SplitMix64(self.0);
        let v = f(&mut g);
        self.0 = g.0;
        v
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.draw(SplitMix64::next_u64)
    }
    /// Uniform on (0, 1].
    pub(crate) fn uniform(&mut self) -> f64 {
        self.draw(SplitMix64::uniform)
    }
    pub(crate) fn gauss(&mut self) -> f64 {
        self.draw(SplitMix64::gauss)
    }
    pub(crate) fn block(&mut self, sigma: f64) -> [f32; QK] {
        std::array::from_fn(|_| (self.gauss() * sigma) as f32)
    }
}

/// A varied random block: Gaussian with a log-uniform sigma, sometimes heavy-tailed, with
/// zeroed or repeated values, a zero half, or denormal-scale values.
pub(crate) fn varied_block(r: &mut Rng) -> [f32; QK] {
    let sigma = 10f64.powf(-12.0 + 18.0 * r.uniform());
    let mut x = r.block(sigma);
    match r.next() % 8 {
        0 => {
            for v in x.iter_mut() {
                if r.uniform() < 0.05 {
                    *v *= 30.0;
                }
            }
        }
        1 => x[..16].fill(0.0),
        2 => {
            let k = (r.next() % 32) as usize;
            x[k] = 0.0;
            x[(k + 7) % 32] = x[(k + 3) % 32];
        }
        3 => x = std::array::from_fn(|i| ((i as f32) - 15.5) * sigma as f32),
        4 => x = [0.0; QK],
        5 => {
            let c = (r.gauss() * sigma) as f32;
            x = [c; QK];
        }
        _ => {}
    }
    x
}

pub(crate) fn pack4(q: &BlockQ) -> [u8; TQ4_BYTES] {
    let mut o = [0u8; TQ4_BYTES];
    pack_tq4(q, &mut o);
    o
}

pub(crate) fn pack3(q: &BlockQ) -> [u8; TQ3_BYTES] {
    let mut o = [0u8; TQ3_BYTES];
    pack_tq3(q, &mut o);
    o
}

pub(crate) fn q4(x: &[f32; QK]) -> [u8; TQ4_BYTES] {
    let mut o = [0u8; TQ4_BYTES];
    quantize_tq4_1s(x, &mut o);
    o
}

pub(crate) fn q3(x: &[f32; QK]) -> [u8; TQ3_BYTES] {
    let mut o = [0u8; TQ3_BYTES];
    quantize_tq3_1s(x, &mut o);
    o
}

pub(crate) fn next_up(v: f32) -> f32 {
    assert!(v.is_finite());
    if v == 0.0 {
        return f32::from_bits(1);
    }
    f32::from_bits(if v > 0.0 {
        v.to_bits() + 1
    } else {
        v.to_bits() - 1
    })
}

pub(crate) fn next_down(v: f32) -> f32 {
    -next_up(-v)
}

/// A block for the cross-block equivalence tests: one of many shapes, at a per-block scale
/// log-uniform in 1e-30..1e30 (so some sums of squares overflow and some underflow).
pub(crate) fn mixed_block(r: &mut Rng) -> [f32; QK] {
    let scale = 10f64.powf(-30.0 + 60.0 * r.uniform());
    let mut x = r.block(scale);
    match r.next() % 12 {
        0 => {
            // Heavy-tailed (Student-t-like: Gaussian over sqrt of a uniform).
            for v in x.iter_mut() {
                *v = (r.gauss() * scale / r.uniform().sqrt()) as f32;
            }
        }
        1 => x = [0.0; QK],
        2 => {
            // Subnormals and the smallest normals.
            for v in x.iter_mut() {
                *v = (r.gauss() * 1e-39 * (r.next() % 300) as f64) as f32;
            }
        }
        3 => x[(r.next() % 2) as usize * 16..][..16].fill(0.0),
        4 => x = [(r.gauss() * scale) as f32; QK],
        5 => {
            // Sparse: a few large values in zeros.
            let mut y = [0f32; QK];
            for _ in 0..(1 + r.next() % 4) {
                y[(r.next() % 32) as usize] = (r.gauss() * scale) as f32;
            }
            x = y;
        }
        6 => {
            // Per-element scales over 60 decades.
            for v in x.iter_mut() {
                *v = (r.gauss() * 10f64.powf(-30.0 + 60.0 * r.uniform())) as f32;
            }
        }
        7 => x = std::array::from_fn(|i| ((i as f32) - 15.5) * scale as f32),
        8 => {
            for v in x.iter_mut() {
                *v = *v * 0.0 + (-0.0f32).copysign(*v);
            }
        }
        9 => x = varied_block(r),
        10 => {
            // Repeated values and sign flips.
            for i in 0..QK {
                if r.next().is_multiple_of(3) {
                    x[i] = -x[(i * 7) % QK];
                }
            }
        }
        _ => {}
    }
    x
}
