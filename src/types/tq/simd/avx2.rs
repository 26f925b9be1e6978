//! The AVX2 lane backend (x86-64, 8 f32 lanes), used after run-time detection.

use super::{quantize_lanes, Lanes, LANES};
use crate::types::tq::{C3, C4, QK, T3, T4};
use std::arch::x86_64::*;

/// AVX2 backend (8 f32 lanes). Only constructed inside `#[target_feature(enable = "avx2")]`
/// functions, after run-time detection.
#[derive(Clone, Copy)]
pub(super) struct Avx2(__m256);

#[inline(always)]
unsafe fn nlt(v: __m256, t: __m256) -> __m256 {
    // !(v < t), true for unordered: the "step up" predicate of the index search.
    _mm256_cmp_ps::<_CMP_NLT_UQ>(v, t)
}

impl Lanes for Avx2 {
    type Idx = __m256i;
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Avx2(_mm256_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn load(p: &[f32; LANES]) -> Self {
        Avx2(_mm256_loadu_ps(p.as_ptr()))
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        Avx2(_mm256_add_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        Avx2(_mm256_sub_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        Avx2(_mm256_mul_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        Avx2(_mm256_div_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn sqrt(self) -> Self {
        Avx2(_mm256_sqrt_ps(self.0))
    }
    #[inline(always)]
    unsafe fn inv_guarded(self) -> Self {
        let ok = _mm256_cmp_ps::<_CMP_GT_OQ>(self.0, _mm256_set1_ps(1e-10));
        Avx2(_mm256_and_ps(
            ok,
            _mm256_div_ps(_mm256_set1_ps(1.0), self.0),
        ))
    }
    #[inline(always)]
    unsafe fn select_lt(a: Self, b: Self, x: Self, y: Self) -> Self {
        let m = _mm256_cmp_ps::<_CMP_LT_OQ>(a.0, b.0);
        Avx2(_mm256_blendv_ps(y.0, x.0, m))
    }
    #[inline(always)]
    unsafe fn select_gt(a: Self, b: Self, x: Self, y: Self) -> Self {
        let m = _mm256_cmp_ps::<_CMP_GT_OQ>(a.0, b.0);
        Avx2(_mm256_blendv_ps(y.0, x.0, m))
    }
    #[inline(always)]
    unsafe fn lookup4(self) -> (Self, Self::Idx) {
        // Branchless binary search over T4 (index bits 3, 2, 1, 0 in turn); the masks are
        // -1/0, so `k - mask` adds the bit.
        let v = self.0;
        let m3 = nlt(v, _mm256_set1_ps(T4[7]));
        let t2 = _mm256_blendv_ps(_mm256_set1_ps(T4[3]), _mm256_set1_ps(T4[11]), m3);
        let m2 = nlt(v, t2);
        let (b3, b2) = (_mm256_castps_si256(m3), _mm256_castps_si256(m2));
        // k1 = 2*bit3 + bit2 selects T4[1 + 4*k1].
        let k1 = _mm256_sub_epi32(_mm256_and_si256(b3, _mm256_set1_epi32(2)), b2);
        let tab1 = _mm256_setr_ps(T4[1], T4[5], T4[9], T4[13], 0.0, 0.0, 0.0, 0.0);
        let m1 = nlt(v, _mm256_permutevar8x32_ps(tab1, k1));
        // k0 = 4*bit3 + 2*bit2 + bit1 selects T4[2*k0].
        let k0 = _mm256_sub_epi32(_mm256_slli_epi32::<1>(k1), _mm256_castps_si256(m1));
        let tab0 = _mm256_setr_ps(T4[0], T4[2], T4[4], T4[6], T4[8], T4[10], T4[12], T4[14]);
        let m0 = nlt(v, _mm256_permutevar8x32_ps(tab0, k0));
        let i = _mm256_sub_epi32(_mm256_slli_epi32::<1>(k0), _mm256_castps_si256(m0));
        let lo = _mm256_setr_ps(C4[0], C4[1], C4[2], C4[3], C4[4], C4[5], C4[6], C4[7]);
        let hi = _mm256_setr_ps(C4[8], C4[9], C4[10], C4[11], C4[12], C4[13], C4[14], C4[15]);
        let c = _mm256_blendv_ps(
            _mm256_permutevar8x32_ps(lo, i),
            _mm256_permutevar8x32_ps(hi, i),
            m3,
        );
        (Avx2(c), i)
    }
    #[inline(always)]
    unsafe fn lookup3(self) -> (Self, Self::Idx) {
        let v = self.0;
        let m2 = nlt(v, _mm256_set1_ps(T3[3]));
        let t1 = _mm256_blendv_ps(_mm256_set1_ps(T3[1]), _mm256_set1_ps(T3[5]), m2);
        let m1 = nlt(v, t1);
        // k0 = 2*bit2 + bit1 selects T3[2*k0].
        let k0 = _mm256_sub_epi32(
            _mm256_and_si256(_mm256_castps_si256(m2), _mm256_set1_epi32(2)),
            _mm256_castps_si256(m1),
        );
        let tab0 = _mm256_setr_ps(T3[0], T3[2], T3[4], T3[6], 0.0, 0.0, 0.0, 0.0);
        let m0 = nlt(v, _mm256_permutevar8x32_ps(tab0, k0));
        let i = _mm256_sub_epi32(_mm256_slli_epi32::<1>(k0), _mm256_castps_si256(m0));
        let cb = _mm256_setr_ps(C3[0], C3[1], C3[2], C3[3], C3[4], C3[5], C3[6], C3[7]);
        (Avx2(_mm256_permutevar8x32_ps(cb, i)), i)
    }
    #[inline(always)]
    unsafe fn centroid4(self) -> Self {
        // As `lookup4`, but the centroid straight from the last level: C4[2*k0 + bit0].
        let v = self.0;
        let m3 = nlt(v, _mm256_set1_ps(T4[7]));
        let t2 = _mm256_blendv_ps(_mm256_set1_ps(T4[3]), _mm256_set1_ps(T4[11]), m3);
        let m2 = nlt(v, t2);
        let (b3, b2) = (_mm256_castps_si256(m3), _mm256_castps_si256(m2));
        let k1 = _mm256_sub_epi32(_mm256_and_si256(b3, _mm256_set1_epi32(2)), b2);
        let tab1 = _mm256_setr_ps(T4[1], T4[5], T4[9], T4[13], 0.0, 0.0, 0.0, 0.0);
        let m1 = nlt(v, _mm256_permutevar8x32_ps(tab1, k1));
        let k0 = _mm256_sub_epi32(_mm256_slli_epi32::<1>(k1), _mm256_castps_si256(m1));
        let tab0 = _mm256_setr_ps(T4[0], T4[2], T4[4], T4[6], T4[8], T4[10], T4[12], T4[14]);
        let m0 = nlt(v, _mm256_permutevar8x32_ps(tab0, k0));
        let ev = _mm256_setr_ps(C4[0], C4[2], C4[4], C4[6], C4[8], C4[10], C4[12], C4[14]);
        let od = _mm256_setr_ps(C4[1], C4[3], C4[5], C4[7], C4[9], C4[11], C4[13], C4[15]);
        Avx2(_mm256_blendv_ps(
            _mm256_permutevar8x32_ps(ev, k0),
            _mm256_permutevar8x32_ps(od, k0),
            m0,
        ))
    }
    #[inline(always)]
    unsafe fn load_transposed(x: &[f32; LANES * QK]) -> [Self; QK] {
        // Four 8x8 transposes (unpack, shuffle, swap 128-bit halves): data movement only.
        let mut out = [Avx2(_mm256_setzero_ps()); QK];
        let p = x.as_ptr();
        for c in 0..QK / 8 {
            let r: [__m256; 8] = std::array::from_fn(|l| _mm256_loadu_ps(p.add(l * QK + 8 * c)));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let o = &mut out[8 * c..8 * c + 8];
            o[0] = Avx2(_mm256_permute2f128_ps::<0x20>(s0, s4));
            o[1] = Avx2(_mm256_permute2f128_ps::<0x20>(s1, s5));
            o[2] = Avx2(_mm256_permute2f128_ps::<0x20>(s2, s6));
            o[3] = Avx2(_mm256_permute2f128_ps::<0x20>(s3, s7));
            o[4] = Avx2(_mm256_permute2f128_ps::<0x31>(s0, s4));
            o[5] = Avx2(_mm256_permute2f128_ps::<0x31>(s1, s5));
            o[6] = Avx2(_mm256_permute2f128_ps::<0x31>(s2, s6));
            o[7] = Avx2(_mm256_permute2f128_ps::<0x31>(s3, s7));
        }
        out
    }
    #[inline(always)]
    unsafe fn all_eq(a: &[Self], b: &[Self]) -> bool {
        let mut m = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        for (x, y) in a.iter().zip(b) {
            m = _mm256_and_ps(m, _mm256_cmp_ps::<_CMP_EQ_OQ>(x.0, y.0));
        }
        _mm256_movemask_ps(m) == 0xff
    }
    #[inline(always)]
    unsafe fn store_idx(i: Self::Idx, out: &mut [i32; LANES]) {
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, i);
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; LANES]) {
        _mm256_storeu_ps(out.as_mut_ptr(), self.0);
    }
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_tq4(src: &[f32], out: &mut [u8]) {
    quantize_lanes::<Avx2, true>(src, out)
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_tq3(src: &[f32], out: &mut [u8]) {
    quantize_lanes::<Avx2, false>(src, out)
}
