//! The portable lane backend: plain `[f32; LANES]` loops the compiler vectorizes for the
//! baseline target.

use super::{Lanes, LANES};
use crate::types::tq::{inv_of, C3, C4, T3, T4};

/// Portable backend: plain lane loops.
#[derive(Clone, Copy)]
pub(super) struct Portable(pub(super) [f32; LANES]);

impl Portable {
    #[inline(always)]
    fn map2(self, o: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        Portable(std::array::from_fn(|l| f(self.0[l], o.0[l])))
    }

    /// Linear compare/select chain; for sorted `t` equal to the binary search and to
    /// `tq_index`: the index is the number of `k` with `!(v < t[k])` (all of them for NaN).
    /// Written with masks and bit selects so that it vectorizes (no branches).
    #[inline(always)]
    fn lookup_chain(self, c: &[f32], t: &[f32]) -> (Self, [i32; LANES]) {
        let mut cv = [c[0].to_bits(); LANES];
        let mut iv = [0i32; LANES];
        for k in 0..t.len() {
            let (tk, ck) = (t[k], c[k + 1].to_bits());
            for l in 0..LANES {
                // All ones where `!(v < t[k])`.
                let up = ((self.0[l] < tk) as u32).wrapping_sub(1);
                cv[l] = (ck & up) | (cv[l] & !up);
                iv[l] -= up as i32;
            }
        }
        (Portable(cv.map(f32::from_bits)), iv)
    }
}

impl Lanes for Portable {
    type Idx = [i32; LANES];
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Portable([v; LANES])
    }
    #[inline(always)]
    unsafe fn load(p: &[f32; LANES]) -> Self {
        Portable(*p)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        self.map2(o, |a, b| a + b)
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        self.map2(o, |a, b| a - b)
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        self.map2(o, |a, b| a * b)
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        self.map2(o, |a, b| a / b)
    }
    #[inline(always)]
    unsafe fn sqrt(self) -> Self {
        Portable(self.0.map(f32::sqrt))
    }
    #[inline(always)]
    unsafe fn inv_guarded(self) -> Self {
        Portable(self.0.map(inv_of))
    }
    #[inline(always)]
    unsafe fn select_lt(a: Self, b: Self, x: Self, y: Self) -> Self {
        Portable(std::array::from_fn(|l| {
            if a.0[l] < b.0[l] {
                x.0[l]
            } else {
                y.0[l]
            }
        }))
    }
    #[inline(always)]
    unsafe fn select_gt(a: Self, b: Self, x: Self, y: Self) -> Self {
        Portable(std::array::from_fn(|l| {
            if a.0[l] > b.0[l] {
                x.0[l]
            } else {
                y.0[l]
            }
        }))
    }
    #[inline(always)]
    unsafe fn lookup4(self) -> (Self, Self::Idx) {
        self.lookup_chain(&C4, &T4)
    }
    #[inline(always)]
    unsafe fn lookup3(self) -> (Self, Self::Idx) {
        self.lookup_chain(&C3, &T3)
    }
    #[inline(always)]
    unsafe fn all_eq(a: &[Self], b: &[Self]) -> bool {
        let mut same = true;
        for (x, y) in a.iter().zip(b) {
            for l in 0..LANES {
                same &= x.0[l] == y.0[l];
            }
        }
        same
    }
    #[inline(always)]
    unsafe fn store_idx(i: Self::Idx, out: &mut [i32; LANES]) {
        *out = i;
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; LANES]) {
        *out = self.0;
    }
}
