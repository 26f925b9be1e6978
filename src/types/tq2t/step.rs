//! One add-compare-select step of tq2_t's Viterbi search written for AVX2: the minimum over the
//! four predecessors of eight predecessor groups at once, each minimum broadcast to its four
//! successors in registers (one `vpermps` per eight successors) and added to their squared errors
//! computed in the same pass, the three comparisons of the four-way minimum stored as bitmaps
//! (the back pointers, decoded along the traced path only: `super::back`). The same
//! operations on every element as the portable step (`super::step_generic`, which a test holds it
//! to bit for bit): `min(b, a)` is `if b < a { b } else { a }`, the errors are `wi · (e · e)`
//! (the multiply by a unit weight is skipped: `1 · v` is `v`), the sum is `m + d`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Predecessor groups per iteration (four vectors of eight).
pub(super) const GROUP: usize = 32;

/// Bytes of one step's back pointers for `q` predecessor groups: three bitmaps of `q` bits (bit
/// `p` at byte `p / 8`, bit `p mod 8`), each the strict `<` of one comparison of the four-way
/// minimum: `cost[p + q] < cost[p]` (`k01`), `cost[p + 3q] < cost[p + 2q]` (`k23`), and the
/// minimum of the last two `<` the minimum of the first two (`km`). The kernels store their
/// comparison masks as they are; the back pointer is decoded only along the traced path.
pub(super) const fn bp_len(q: usize) -> usize {
    3 * q.div_ceil(8)
}

/// How the first and last states of a Viterbi pass are restricted.
#[derive(Clone, Copy, Debug)]
pub enum Ends {
    /// Any start, any end.
    Free,
    /// Tail-biting: the state's upper `l − 2` bits at step 0 and the lower `l − 2` bits at the
    /// last step are both `top` (the codes that wrap around).
    Wrap(u32),
    /// A window inside a block: the state's upper `l − 2` bits at step 0 are the first (the codes
    /// before the window), the lower `l − 2` bits at the last step the second (the window's last
    /// `l/2 − 1` codes, fixed as the codes after the part searched).
    Pinned(u32, u32),
}

/// The back pointer `t` of group `p` from one step's bitmaps: `km ? 2 + k23 : k01` (the lowest
/// `t` on ties, as the plain search's strict `<` in `t` order).
#[inline]
pub(super) fn back(bp: &[u8], q: usize, p: usize) -> u32 {
    let w = q.div_ceil(8);
    let bit = |k: usize| ((bp[k * w + p / 8] >> (p % 8)) & 1) as u32;
    if bit(2) == 1 {
        2 + bit(1)
    } else {
        bit(0)
    }
}

/// The predecessor groups step `i` must compute, widened to whole [`GROUP`]s: all of them,
/// except in the first `l/2 − 2` steps of a tail-biting pass, where only the states whose upper
/// bits continue the wrap start are finite (after step `i`, the `4^(i+1)` states
/// `(top mod 4^(l/2−1−i))·4^(i+1) + …`: 16, 64, 256, 1024 of 4096 at `l` = 12).
pub(super) fn reachable_groups(l: u32, ends: Ends, i: usize) -> std::ops::Range<usize> {
    let q = 1usize << (l - 2);
    let w = (l / 2 - 1) as usize;
    match ends {
        Ends::Wrap(top) | Ends::Pinned(top, _)
            if l.is_multiple_of(2) && i < w && q.is_multiple_of(GROUP) =>
        {
            let lo = (top as usize % (1 << (2 * (w - i)))) << (2 * i);
            let hi = lo + (1 << (2 * i));
            let g = GROUP;
            (lo / g * g)..hi.div_ceil(g) * g
        }
        _ => 0..q,
    }
}

/// Zero one step's back pointers (`bp_len(q)` bytes) outside the predecessor groups `groups`
/// (ends multiples of 8, as [`reachable_groups`] gives them): what the full step stores for
/// groups whose four predecessors are all unreachable (equal costs, back pointer 0).
pub(super) fn clear_unreached(bp: &mut [u8], groups: &std::ops::Range<usize>) {
    let w = bp.len() / 3;
    for k in 0..3 {
        bp[k * w..k * w + groups.start / 8].fill(0);
        bp[k * w + groups.end / 8..(k + 1) * w].fill(0);
    }
}

/// Whether [`step_avx512`] runs here (AVX-512F, BW and VL; `TQ_NO_AVX512=1` turns it off, for
/// timing the AVX2 step on the same machine). Read once.
#[cfg(all(target_arch = "x86_64", feature = "avx512"))]
pub(super) fn has_avx512() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::env::var_os("TQ_NO_AVX512").is_none_or(|v| v == "0")
    })
}

/// `next[4p + b] = min_t cost[p + t·q] + wi · (xi − dc[4p + b])²` and bit `p` of `bp`'s three
/// bitmaps (`bp_len`: the comparisons that give the lowest `t` reaching the minimum),
/// for `q = cost.len() / 4` a multiple of [`GROUP`] and the predecessor groups `p` in `groups`
/// (its ends multiples of [`GROUP`]; the rest of `next` and of the bitmaps is not written).
///
/// # Safety
/// The CPU must have AVX2; `cost`, `dc` and `next` must have the same length `4q`, `bp` at
/// least `bp_len(q)` bytes, and `q % GROUP == 0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn step_avx2(
    xi: f32,
    wi: f32,
    dc: &[f32],
    cost: &[f32],
    bp: &mut [u8],
    next: &mut [f32],
    groups: std::ops::Range<usize>,
) {
    let ns = cost.len();
    let q = ns / 4;
    assert!(dc.len() == ns && next.len() == ns && q.is_multiple_of(GROUP));
    assert!(bp.len() >= bp_len(q));
    assert!(
        groups.start.is_multiple_of(GROUP) && groups.end.is_multiple_of(GROUP) && groups.end <= q
    );
    let unit = wi == 1.0;
    let xv = _mm256_set1_ps(xi);
    let wv = _mm256_set1_ps(wi);
    let spread = [
        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
        _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
        _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5),
        _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7),
    ];
    let w = q / 8;
    let (cp, dp, np) = (cost.as_ptr(), dc.as_ptr(), next.as_mut_ptr());
    for p0 in groups.step_by(GROUP) {
        // The three comparisons' masks of the 32 groups, 8 bits per vector.
        let mut bits = [0u32; 3];
        for k in 0..4 {
            let p = p0 + 8 * k;
            // SAFETY (all loads and stores): p + 8 ≤ groups.end ≤ q, so p + 3q + 8 ≤ 4q = ns, and
            // 4p + 32 ≤ 4q = ns; the asserts above hold the lengths.
            let a = _mm256_loadu_ps(cp.add(p));
            let b = _mm256_loadu_ps(cp.add(p + q));
            let c = _mm256_loadu_ps(cp.add(p + 2 * q));
            let d = _mm256_loadu_ps(cp.add(p + 3 * q));
            let m01 = _mm256_min_ps(b, a);
            let k01 = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(b, a));
            let m23 = _mm256_min_ps(d, c);
            let k23 = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(d, c));
            let m = _mm256_min_ps(m23, m01);
            let km = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(m23, m01));
            for (v, kk) in bits.iter_mut().zip([k01, k23, km]) {
                *v |= (kk as u32) << (8 * k);
            }
            for (j, idx) in spread.iter().enumerate() {
                let s = 4 * p + 8 * j;
                let mj = _mm256_permutevar8x32_ps(m, *idx);
                let e = _mm256_sub_ps(xv, _mm256_loadu_ps(dp.add(s)));
                let e2 = _mm256_mul_ps(e, e);
                let dist = if unit { e2 } else { _mm256_mul_ps(wv, e2) };
                _mm256_storeu_ps(np.add(s), _mm256_add_ps(mj, dist));
            }
        }
        // Bits p0..p0 + 32 of each bitmap: four bytes at p0 / 8 (p0 is a multiple of 32).
        for (k, v) in bits.iter().enumerate() {
            // SAFETY: k·w + p0/8 + 4 ≤ 3w = bp_len(q) ≤ bp.len() (asserted above).
            std::ptr::write_unaligned(bp.as_mut_ptr().add(k * w + p0 / 8) as *mut u32, *v);
        }
    }
}

/// [`step2_avx512`] on 8-lane vectors (AVX2): chunks of 32 groups of the second step, each fed
/// by four 8-group iterations of the first step through a 512-byte buffer. The same values and
/// back pointers as [`step_avx2`] twice.
///
/// # Safety
/// The CPU must have AVX2; `cost`, `dc` and `next` must have the same length `4q`, `bpa` and
/// `bpb` at least `bp_len(q)` bytes, and `q % 32 == 0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn step2_avx2(
    (xa, wa): (f32, f32),
    (xb, wb): (f32, f32),
    dc: &[f32],
    cost: &[f32],
    bpa: &mut [u8],
    bpb: &mut [u8],
    next: &mut [f32],
) {
    let ns = cost.len();
    let q = ns / 4;
    assert!(dc.len() == ns && next.len() == ns);
    assert!(bpa.len() >= bp_len(q) && bpb.len() >= bp_len(q));
    assert!(q.is_multiple_of(32));
    let (ka, kb) = (Kernel256::new(xa, wa), Kernel256::new(xb, wb));
    let (cp, dp, np) = (cost.as_ptr(), dc.as_ptr(), next.as_mut_ptr());
    let (ba, bb) = (bpa.as_mut_ptr(), bpb.as_mut_ptr());
    // The first step's states P + t·q + u (u < 32) at tmp[32t + u].
    let mut tmp = [0f32; 128];
    let tp = tmp.as_mut_ptr();
    for pb in (0..q).step_by(32) {
        for t in 0..4 {
            let g = pb / 4 + t * (q / 4);
            // SAFETY: g + 8 ≤ q (pb/4 + 8 ≤ q/4), so g + 3q + 8 ≤ ns, 4g + 32 ≤ ns and the
            // bitmaps' 2q/8 + g/8 + 1 ≤ 3q/8 ≤ bpa.len() (g is a multiple of 8); tmp has
            // 32t + 32 ≤ 128 entries.
            ka.groups8(
                cp.add(g),
                q,
                dp.add(4 * g),
                tp.add(32 * t),
                ba.add(g / 8),
                q / 8,
            );
        }
        for u in 0..4 {
            let p = pb + 8 * u;
            // SAFETY: the predecessors of groups p..p+8 are tmp[8u + 32t ..], t < 4 (stride 32,
            // inside tmp); 4p + 32 ≤ ns and 2q/8 + p/8 + 1 ≤ 3q/8 ≤ bpb.len().
            kb.groups8(
                tp.add(8 * u),
                32,
                dp.add(4 * p),
                np.add(4 * p),
                bb.add(p / 8),
                q / 8,
            );
        }
    }
}

/// One step's constants for the 8-lane kernel.
#[cfg(target_arch = "x86_64")]
struct Kernel256 {
    xv: __m256,
    wv: __m256,
    unit: bool,
    spread: [__m256i; 4],
}

#[cfg(target_arch = "x86_64")]
impl Kernel256 {
    #[target_feature(enable = "avx2")]
    fn new(xi: f32, wi: f32) -> Kernel256 {
        Kernel256 {
            xv: _mm256_set1_ps(xi),
            wv: _mm256_set1_ps(wi),
            unit: wi == 1.0,
            spread: [
                _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5),
                _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7),
            ],
        }
    }

    /// Eight predecessor groups (the layout of `Kernel512::groups16`, one byte of each bitmap).
    ///
    /// # Safety
    /// The CPU must have AVX2; `c + 3·stride + 8`, `d + 32`, `n + 32` and `b + 2w + 1` must be
    /// in bounds of their arrays.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn groups8(
        &self,
        c: *const f32,
        stride: usize,
        d: *const f32,
        n: *mut f32,
        b: *mut u8,
        w: usize,
    ) {
        let pa = _mm256_loadu_ps(c);
        let pb = _mm256_loadu_ps(c.add(stride));
        let pc = _mm256_loadu_ps(c.add(2 * stride));
        let pd = _mm256_loadu_ps(c.add(3 * stride));
        let m01 = _mm256_min_ps(pb, pa);
        let k01 = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(pb, pa));
        let m23 = _mm256_min_ps(pd, pc);
        let k23 = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(pd, pc));
        let m = _mm256_min_ps(m23, m01);
        let km = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(m23, m01));
        *b = k01 as u8;
        *b.add(w) = k23 as u8;
        *b.add(2 * w) = km as u8;
        for (j, idx) in self.spread.iter().enumerate() {
            let mj = _mm256_permutevar8x32_ps(m, *idx);
            let e = _mm256_sub_ps(self.xv, _mm256_loadu_ps(d.add(8 * j)));
            let e2 = _mm256_mul_ps(e, e);
            let dist = if self.unit {
                e2
            } else {
                _mm256_mul_ps(self.wv, e2)
            };
            _mm256_storeu_ps(n.add(8 * j), _mm256_add_ps(mj, dist));
        }
    }
}

/// [`step_avx2`] on 16-lane vectors (AVX-512F/BW/VL): sixteen predecessor groups per compare,
/// the three comparisons into mask registers, stored as they are (16 bits of each bitmap), each
/// minimum spread to its four successors by one `vpermps` per sixteen successors.
/// The same operations on every element as the portable step (`vminps(b, a)` is
/// `if b < a { b } else { a }`), so the same bits (a test holds them equal).
///
/// # Safety
/// The CPU must have AVX-512F, AVX-512BW and AVX-512VL; the lengths as [`step_avx2`] requires.
#[cfg(all(target_arch = "x86_64", feature = "avx512"))]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn step_avx512(
    xi: f32,
    wi: f32,
    dc: &[f32],
    cost: &[f32],
    bp: &mut [u8],
    next: &mut [f32],
    groups: std::ops::Range<usize>,
) {
    let ns = cost.len();
    let q = ns / 4;
    assert!(dc.len() == ns && next.len() == ns && q.is_multiple_of(GROUP));
    assert!(bp.len() >= bp_len(q));
    assert!(
        groups.start.is_multiple_of(GROUP) && groups.end.is_multiple_of(GROUP) && groups.end <= q
    );
    let k = Kernel512::new(xi, wi);
    let (cp, dp, np, bq) = (
        cost.as_ptr(),
        dc.as_ptr(),
        next.as_mut_ptr(),
        bp.as_mut_ptr(),
    );
    for p in groups.step_by(16) {
        // SAFETY: p + 16 ≤ groups.end ≤ q, so p + 3q + 16 ≤ 4q = ns, 4p + 64 ≤ ns and
        // 2q/8 + p/8 + 2 ≤ 3q/8 ≤ bp.len(); the asserts above hold the lengths.
        k.groups16(
            cp.add(p),
            q,
            dp.add(4 * p),
            np.add(4 * p),
            bq.add(p / 8),
            q / 8,
        );
    }
}

/// Two steps at once, `cost → (xa, wa) → (xb, wb) → next`, every group of both: the same values
/// and back pointers as [`step_avx512`] twice (`bpa`, `bpb` the two steps' back pointers), but
/// the first step's results for the 64 predecessor groups of each chunk of the second step stay
/// in a 1 KB buffer (L1) instead of a 16 KB array: per two steps the state costs are read from
/// and written to L2 once, not twice (at L = 12 the three 16 KB arrays do not fit L1 together
/// and the single step waits on them).
///
/// Chunk `P` (64 groups of the second step, `P` a multiple of 64) reads the first step's states
/// `P + t·q .. + 64` (`t` = 0..4), which are the successors of the first step's groups
/// `(P + t·q) / 4 .. + 16`: one 16-group iteration each. The chunks cover each first-step group
/// once.
///
/// # Safety
/// The CPU must have AVX-512F, AVX-512BW and AVX-512VL; `cost`, `dc` and `next` must have the
/// same length `4q`, `bpa` and `bpb` at least `bp_len(q)` bytes, and `q % 64 == 0`.
#[cfg(all(target_arch = "x86_64", feature = "avx512"))]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn step2_avx512(
    (xa, wa): (f32, f32),
    (xb, wb): (f32, f32),
    dc: &[f32],
    cost: &[f32],
    bpa: &mut [u8],
    bpb: &mut [u8],
    next: &mut [f32],
) {
    let ns = cost.len();
    let q = ns / 4;
    assert!(dc.len() == ns && next.len() == ns);
    assert!(bpa.len() >= bp_len(q) && bpb.len() >= bp_len(q));
    assert!(q.is_multiple_of(64));
    let (ka, kb) = (Kernel512::new(xa, wa), Kernel512::new(xb, wb));
    let (cp, dp, np) = (cost.as_ptr(), dc.as_ptr(), next.as_mut_ptr());
    let (ba, bb) = (bpa.as_mut_ptr(), bpb.as_mut_ptr());
    // The first step's states P + t·q + u (u < 64) at tmp[64t + u].
    let mut tmp = [0f32; 256];
    let tp = tmp.as_mut_ptr();
    for pb in (0..q).step_by(64) {
        for t in 0..4 {
            let g = pb / 4 + t * (q / 4);
            // SAFETY: g + 16 ≤ q (pb/4 + 16 ≤ q/4), so g + 3q + 16 ≤ ns, 4g + 64 ≤ ns and the
            // bitmaps' 2q/8 + g/8 + 2 ≤ 3q/8 ≤ bpa.len(); tmp has 64t + 64 ≤ 256 entries.
            ka.groups16(
                cp.add(g),
                q,
                dp.add(4 * g),
                tp.add(64 * t),
                ba.add(g / 8),
                q / 8,
            );
        }
        for u in 0..4 {
            let p = pb + 16 * u;
            // SAFETY: the predecessors of groups p..p+16 are tmp[16u + 64t ..], t < 4 (stride 64,
            // inside tmp); 4p + 64 ≤ ns and 2q/8 + p/8 + 2 ≤ 3q/8 ≤ bpb.len().
            kb.groups16(
                tp.add(16 * u),
                64,
                dp.add(4 * p),
                np.add(4 * p),
                bb.add(p / 8),
                q / 8,
            );
        }
    }
}

/// One step's constants for the 16-lane kernel.
#[cfg(all(target_arch = "x86_64", feature = "avx512"))]
struct Kernel512 {
    xv: __m512,
    wv: __m512,
    unit: bool,
    spread: [__m512i; 4],
}

#[cfg(all(target_arch = "x86_64", feature = "avx512"))]
impl Kernel512 {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn new(xi: f32, wi: f32) -> Kernel512 {
        let spread: [__m512i; 4] = std::array::from_fn(|j| {
            let g = 4 * j as i32;
            _mm512_setr_epi32(
                g,
                g,
                g,
                g,
                g + 1,
                g + 1,
                g + 1,
                g + 1,
                g + 2,
                g + 2,
                g + 2,
                g + 2,
                g + 3,
                g + 3,
                g + 3,
                g + 3,
            )
        });
        Kernel512 {
            xv: _mm512_set1_ps(xi),
            wv: _mm512_set1_ps(wi),
            unit: wi == 1.0,
            spread,
        }
    }

    /// Sixteen predecessor groups: their predecessors at `c + t·stride` (`t` = 0..4, sixteen
    /// each), their 64 successors' codewords at `d`, the successors' costs to `n`, the three
    /// comparison masks (16 bits each) to `b`, `b + w` and `b + 2w` (the back pointers'
    /// bitmaps, `bp_len`).
    ///
    /// # Safety
    /// The CPU must have AVX-512F/BW/VL; `c + 3·stride + 16`, `d + 64`, `n + 64` and
    /// `b + 2w + 2` must be in bounds of their arrays.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn groups16(
        &self,
        c: *const f32,
        stride: usize,
        d: *const f32,
        n: *mut f32,
        b: *mut u8,
        w: usize,
    ) {
        let pa = _mm512_loadu_ps(c);
        let pb = _mm512_loadu_ps(c.add(stride));
        let pc = _mm512_loadu_ps(c.add(2 * stride));
        let pd = _mm512_loadu_ps(c.add(3 * stride));
        let m01 = _mm512_min_ps(pb, pa);
        let k01 = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(pb, pa);
        let m23 = _mm512_min_ps(pd, pc);
        let k23 = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(pd, pc);
        let m = _mm512_min_ps(m23, m01);
        let km = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(m23, m01);
        // The masks as they are (decoding t here costs more than the rest of the bookkeeping).
        b.cast::<u16>().write_unaligned(k01);
        b.add(w).cast::<u16>().write_unaligned(k23);
        b.add(2 * w).cast::<u16>().write_unaligned(km);
        for (j, idx) in self.spread.iter().enumerate() {
            let mj = _mm512_permutexvar_ps(*idx, m);
            let e = _mm512_sub_ps(self.xv, _mm512_loadu_ps(d.add(16 * j)));
            let e2 = _mm512_mul_ps(e, e);
            let dist = if self.unit {
                e2
            } else {
                _mm512_mul_ps(self.wv, e2)
            };
            _mm512_storeu_ps(n.add(16 * j), _mm512_add_ps(mj, dist));
        }
    }
}
