//! tq2_t's Viterbi search on 16-bit integer path costs: twice the states per vector of the f32
//! search and a third of its memory (cost, next and codewords 8 KB each at `l` = 12, inside L1).
//!
//! A pass maps its targets and codewords onto one fixed-point grid (`S = 16383 / r` weighted,
//! twice that with unit weights, `r` the largest magnitude among them), the weights onto Q15
//! square roots of `w / max w`, and charges each step `((x − c)·√w)²` in units of `1/(S²·2¹⁵)`
//! (two rounding multiplies, `mulhrs`). Path costs add with saturation at `i16::MAX`, which also
//! stands for the unreachable states; a path's cost only grows, so when the best final cost is
//! below [`TRUST`] no state on the best path was ever clamped and the search is exact for the
//! rounded step costs. Otherwise (and for weights spread wider than [`SPREAD`], non-finite
//! values) the caller falls back to the f32 search. The rounding is ≈ rms²/1000 per step against
//! ≈ rms²/14 of error per value on Gaussian blocks, so the path found is the f32 search's or one
//! within that noise (measured: the same total error to 10⁻⁴, `bench_fixed_search`); the
//! returned cost is the path's f32 cost, summed as the f32 search sums it.
//!
//! [`step_generic`] is the definition (plain loops); `step_avx2` computes the same integers (a
//! test holds them equal, back pointers included).

use super::step::{back, bp_len, clear_unreached, reachable_groups, Ends};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The largest best final cost trusted: above it a clamped state may have hidden the best path.
const TRUST: i16 = 30_000;
/// An unreachable state's cost (the saturated sum).
const INF: i16 = i16::MAX;
/// The fixed-point grid's largest magnitude: `x − c` stays inside `i16`.
const GRID: f32 = 16383.0;
/// The best path's cost the grid aims at (about a quarter of [`TRUST`]).
const EXPECT: f64 = 8000.0;
/// Weights spread wider than this (largest / mean) are left to the f32 search: the steps are
/// charged relative to the largest weight, so the rounding grows against the typical step.
const SPREAD: f64 = 16.0;

/// The 16-bit search's work space (the back pointers are the f32 search's).
pub struct Fixed {
    cost: Vec<i16>,
    next: Vec<i16>,
    dc: Vec<i16>,
    xq: Vec<i16>,
    sw: Vec<i16>,
}

impl Fixed {
    pub fn new(l: u32, n: usize) -> Fixed {
        let ns = 1usize << l;
        Fixed {
            cost: vec![0; ns],
            next: vec![0; ns],
            dc: vec![0; ns],
            xq: vec![0; n],
            sw: vec![0; n],
        }
    }
}

/// `(a·b + 2¹⁴) >> 15`, as `vpmulhrsw` computes it (never both −2¹⁵ here: [`charge`]).
#[inline]
fn mulhrs(a: i16, b: i16) -> i16 {
    ((a as i32 * b as i32 + 0x4000) >> 15) as i16
}

/// One step's charge for target `x` and codeword `c` (`sw` = None for unit weights).
#[inline]
fn charge(x: i16, c: i16, sw: Option<i16>) -> i16 {
    // −2¹⁵ would square to −2¹⁵ in `mulhrs`.
    let e = x.saturating_sub(c).max(-32767);
    let t = sw.map_or(e, |w| mulhrs(e, w));
    mulhrs(t, t)
}

/// The plain step: `next[4p + b] = min_t cost[p + t·q] ⊕ charge(x, dc[4p + b])` (saturating),
/// the three comparisons of the four-way minimum into `bp`'s bitmaps as the f32 step stores them
/// (strict `<`, the lowest `t` on ties).
pub(super) fn step_generic(
    x: i16,
    sw: Option<i16>,
    dc: &[i16],
    cost: &[i16],
    bp: &mut [u8],
    next: &mut [i16],
) {
    let q = cost.len() / 4;
    let w = q.div_ceil(8);
    bp[..3 * w].fill(0);
    for p in 0..q {
        let (a, b, c, d) = (cost[p], cost[p + q], cost[p + 2 * q], cost[p + 3 * q]);
        let k01 = b < a;
        let m01 = if k01 { b } else { a };
        let k23 = d < c;
        let m23 = if k23 { d } else { c };
        let km = m23 < m01;
        let m = if km { m23 } else { m01 };
        let (byte, bit) = (p / 8, p % 8);
        bp[byte] |= (k01 as u8) << bit;
        bp[w + byte] |= (k23 as u8) << bit;
        bp[2 * w + byte] |= (km as u8) << bit;
        for s in 4 * p..4 * p + 4 {
            next[s] = m.saturating_add(charge(x, dc[s], sw));
        }
    }
}

/// [`step_generic`] on 16-lane vectors for the predecessor groups in `groups` (ends multiples of
/// 32; the rest of `next` and of the bitmaps is not written): 32 groups per iteration, each
/// group's minimum spread to its four successors by a quadword broadcast and a byte shuffle.
///
/// # Safety
/// The CPU must have AVX2; `cost`, `dc` and `next` the same length `4q` with `q % 32 == 0`, `bp`
/// at least `bp_len(q)` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn step_avx2(
    x: i16,
    sw: Option<i16>,
    dc: &[i16],
    cost: &[i16],
    bp: &mut [u8],
    next: &mut [i16],
    groups: std::ops::Range<usize>,
) {
    let ns = cost.len();
    let q = ns / 4;
    assert!(dc.len() == ns && next.len() == ns && q.is_multiple_of(32));
    assert!(bp.len() >= bp_len(q));
    assert!(groups.start.is_multiple_of(32) && groups.end.is_multiple_of(32) && groups.end <= q);
    let w = q / 8;
    let k = Charge {
        xv: _mm256_set1_epi16(x),
        floor: _mm256_set1_epi16(-32767),
        wv: _mm256_set1_epi16(sw.unwrap_or(0)),
        unit: sw.is_none(),
    };
    let (cp, dp, np) = (cost.as_ptr(), dc.as_ptr(), next.as_mut_ptr());
    for p0 in groups.step_by(32) {
        let mut masks = [[_mm256_setzero_si256(); 2]; 3];
        for h in 0..2 {
            let p = p0 + 16 * h;
            // SAFETY (loads): p + 16 ≤ q, so p + 3q + 16 ≤ ns.
            let a = _mm256_loadu_si256(cp.add(p) as *const __m256i);
            let b = _mm256_loadu_si256(cp.add(p + q) as *const __m256i);
            let c = _mm256_loadu_si256(cp.add(p + 2 * q) as *const __m256i);
            let d = _mm256_loadu_si256(cp.add(p + 3 * q) as *const __m256i);
            let m01 = _mm256_min_epi16(a, b);
            let m23 = _mm256_min_epi16(c, d);
            masks[0][h] = _mm256_cmpgt_epi16(a, b);
            masks[1][h] = _mm256_cmpgt_epi16(c, d);
            masks[2][h] = _mm256_cmpgt_epi16(m01, m23);
            // SAFETY: 4p + 64 ≤ 4q = ns.
            k.emit(_mm256_min_epi16(m01, m23), dp.add(4 * p), np.add(4 * p));
        }
        for (j, [lo, hi]) in masks.into_iter().enumerate() {
            // Bytes lo0-7, hi0-7 | lo8-15, hi8-15 → lo0-15, hi0-15: bit u is group p0 + u.
            let packed = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi16(lo, hi));
            let bits = _mm256_movemask_epi8(packed) as u32;
            // SAFETY: j·w + p0/8 + 4 ≤ 3w = bp_len(q) ≤ bp.len().
            std::ptr::write_unaligned(bp.as_mut_ptr().add(j * w + p0 / 8) as *mut u32, bits);
        }
    }
}

/// One step's target and weight for [`step_avx2`].
#[cfg(target_arch = "x86_64")]
struct Charge {
    xv: __m256i,
    floor: __m256i,
    wv: __m256i,
    unit: bool,
}

#[cfg(target_arch = "x86_64")]
impl Charge {
    /// Sixteen groups' minima `m` added to their 64 successors' charges: `next[0..64]` from
    /// `dc[0..64]`, successor `4u + b` of group `u`.
    ///
    /// # Safety
    /// AVX2; `dc` and `next` valid for 64 values.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn emit(&self, m: __m256i, dc: *const i16, next: *mut i16) {
        // Within each 128-bit half: words 0,1 (low half) or 2,3 (high half) of the broadcast
        // quadword, each four times.
        let spread = _mm256_setr_epi8(
            0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6,
            7, 6, 7,
        );
        let quads = [
            _mm256_permute4x64_epi64::<0x00>(m),
            _mm256_permute4x64_epi64::<0x55>(m),
            _mm256_permute4x64_epi64::<0xAA>(m),
            _mm256_permute4x64_epi64::<0xFF>(m),
        ];
        for (j, qd) in quads.into_iter().enumerate() {
            let mj = _mm256_shuffle_epi8(qd, spread);
            let c = _mm256_loadu_si256(dc.add(16 * j) as *const __m256i);
            let e = _mm256_max_epi16(_mm256_subs_epi16(self.xv, c), self.floor);
            let t = if self.unit {
                e
            } else {
                _mm256_mulhrs_epi16(e, self.wv)
            };
            let d = _mm256_mulhrs_epi16(t, t);
            _mm256_storeu_si256(next.add(16 * j) as *mut __m256i, _mm256_adds_epi16(mj, d));
        }
    }
}

/// One step over the predecessor groups `groups` (where the AVX2 kernel runs; the others hold
/// only unreachable states, whose outcome the caller fills in), else the plain step over all.
#[allow(clippy::too_many_arguments)]
fn step(
    x: i16,
    sw: Option<i16>,
    dc: &[i16],
    cost: &[i16],
    bp: &mut [u8],
    next: &mut [i16],
    groups: std::ops::Range<usize>,
    plain: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if !plain && (cost.len() / 4).is_multiple_of(32) && std::arch::is_x86_feature_detected!("avx2")
    {
        // SAFETY: AVX2 is present and q is a multiple of 32 (checked), as are the ends of
        // `groups` (`reachable_groups`); `viterbi_fixed` passes equal lengths and a whole step's
        // back pointers.
        unsafe { step_avx2(x, sw, dc, cost, bp, next, groups) };
        return;
    }
    let _ = groups;
    step_generic(x, sw, dc, cost, bp, next)
}

/// The Viterbi search of `viterbi::viterbi` on 16-bit costs: the codes into `codes` and the
/// path's f32 weighted squared error, or None (nothing to rely on in `codes`) when the grid
/// cannot hold the pass (non-finite or all-zero values, non-positive weights or weights spread
/// wider than [`SPREAD`]) or the best final cost reached [`TRUST`]; the caller then runs the f32
/// search. `bp` is the f32 search's back pointer space (`bp_len(q)` bytes per step). `plain`:
/// every step the plain one (the tests' reference for the vector step).
#[allow(clippy::too_many_arguments)]
pub(super) fn viterbi_fixed(
    x: &[f32],
    wt: &[f32],
    dc: &[f32],
    l: u32,
    ends: Ends,
    fx: &mut Fixed,
    bp: &mut [u8],
    codes: &mut [u8],
    plain: bool,
) -> Option<f32> {
    let (n, ns) = (x.len(), 1usize << l);
    let q = ns / 4;
    let bs = bp_len(q);
    if n == 0 || fx.cost.len() != ns || fx.xq.len() < n || bp.len() < n * bs {
        return None;
    }
    // The largest magnitude by its bits (integer maxima vectorize; NaN and ∞ sort above every
    // finite value).
    let amax = |v: &[f32]| v.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7fff_ffff));
    let bits = amax(x).max(amax(dc));
    let wmax = wt[..n].iter().fold(0f32, |m, &v| if v > m { v } else { m });
    let wsum: f64 = wt[..n].iter().map(|&v| v as f64).sum();
    if bits == 0
        || bits >= 0x7f80_0000
        || !(wmax.is_finite() && wmax > 0.0)
        || wt[..n].iter().any(|&v| v.is_nan() || v <= 0.0)
        || wmax as f64 > SPREAD * wsum / n as f64
    {
        return None;
    }
    // The grid: weighted, as fine as keeps `x − c` inside i16 (`GRID / r`: a saturated
    // difference would be under-charged on a light step); unit weights, twice that (`x − c`
    // saturates only for errors beyond `r`, whose charge then saturates too, so such a path is
    // never mistaken for a good one). And no finer than puts the expected best path (≈ 0.074 of
    // the weighted energy: tq2_t's Gaussian error) near `EXPECT`, well below `TRUST`.
    let energy: f64 = x
        .iter()
        .zip(wt)
        .map(|(&v, &w)| w as f64 * (v as f64 * v as f64))
        .sum();
    let unit = wt[..n].iter().all(|&v| v == wmax);
    let fine = if unit { 2.0 } else { 1.0 } * GRID as f64 / f32::from_bits(bits) as f64;
    let aim = (EXPECT * 32768.0 * wmax as f64 / (0.074 * energy)).sqrt();
    let s = if aim.is_finite() { aim.min(fine) } else { fine } as f32;
    // Half away from zero; `y` is finite and inside ±2·GRID, so the unchecked conversion is
    // exact truncation (and the loop vectorizes, unlike a saturating `as`).
    let grid = |v: f32| {
        let y = (v * s).clamp(-2.0 * GRID, 2.0 * GRID);
        // SAFETY: |y + 0.5| < 2³¹ and y is not NaN (checked above: every value finite).
        unsafe { (y + if y < 0.0 { -0.5 } else { 0.5 }).to_int_unchecked::<i32>() as i16 }
    };
    for (o, &v) in fx.dc.iter_mut().zip(dc) {
        *o = grid(v);
    }
    for (o, &v) in fx.xq.iter_mut().zip(x) {
        *o = grid(v);
    }
    for (o, &v) in fx.sw.iter_mut().zip(wt) {
        *o = (32767.0 * (v / wmax).sqrt()).round() as i16;
    }
    let sw = |i: usize| (!unit).then_some(fx.sw[i]);
    let (start, end) = match ends {
        Ends::Free => (None, None),
        Ends::Wrap(top) => (Some(top), Some(top)),
        Ends::Pinned(a, b) => (Some(a), Some(b)),
    };
    // The first step: every state's charge, or only the four the start allows.
    let x0 = fx.xq[0];
    match (start, sw(0)) {
        (Some(top), w0) => {
            fx.cost.fill(INF);
            let s0 = (top as usize) << 2;
            for st in s0..s0 + 4 {
                fx.cost[st] = charge(x0, fx.dc[st], w0);
            }
        }
        (None, None) => {
            for (c, &d) in fx.cost.iter_mut().zip(&fx.dc) {
                *c = charge(x0, d, None);
            }
        }
        (None, Some(w0)) => {
            for (c, &d) in fx.cost.iter_mut().zip(&fx.dc) {
                *c = charge(x0, d, Some(w0));
            }
        }
    }
    for i in 1..n {
        let groups = reachable_groups(l, ends, i);
        let bp = &mut bp[i * bs..(i + 1) * bs];
        if groups.len() < q {
            // The first steps of a pinned start: every other group's four predecessors are
            // unreachable, so its successors stay at INF with back pointer 0 (what the full
            // step computes for them).
            fx.next[..4 * groups.start].fill(INF);
            fx.next[4 * groups.end..].fill(INF);
            clear_unreached(bp, &groups);
        }
        step(
            fx.xq[i],
            sw(i),
            &fx.dc,
            &fx.cost,
            bp,
            &mut fx.next,
            groups,
            plain,
        );
        std::mem::swap(&mut fx.cost, &mut fx.next);
    }
    // The best final state, the lowest index on ties.
    let best = match end {
        None => {
            let m = fx.cost.iter().copied().min().unwrap_or(INF);
            let at = fx.cost.iter().position(|&c| c == m).unwrap_or(0);
            (m, at as u32)
        }
        Some(top) => (0..4).fold((INF, 0u32), |b, t| {
            let st = top as usize + t * q;
            if fx.cost[st] < b.0 {
                (fx.cost[st], st as u32)
            } else {
                b
            }
        }),
    };
    if best.0 >= TRUST {
        return None;
    }
    let mut st = best.1;
    for i in (0..n).rev() {
        codes[i] = (st & 3) as u8;
        if i > 0 {
            st = (st >> 2) | (back(&bp[i * bs..(i + 1) * bs], q, (st >> 2) as usize) << (l - 2));
        }
    }
    Some(path_cost(x, wt, dc, l, codes, st))
}

/// The f32 weighted squared error of the path from state `s0` through `codes[1..]`, summed in
/// step order as the f32 search sums a path (`w·(e·e)`, the first step's charge, then one
/// addition per step).
pub(super) fn path_cost(x: &[f32], wt: &[f32], dc: &[f32], l: u32, codes: &[u8], s0: u32) -> f32 {
    let mask = (1u32 << l) - 1;
    let mut st = s0;
    let mut total = 0f32;
    for (i, ((&v, &w), &c)) in x.iter().zip(wt).zip(codes).enumerate() {
        if i > 0 {
            st = ((st << 2) | c as u32) & mask;
        }
        let e = v - dc[st as usize];
        let d = w * (e * e);
        total = if i == 0 { d } else { total + d };
    }
    total
}

#[cfg(test)]
mod tests {
    use super::super::codebook;
    use super::*;
    use crate::math::splitmix::SplitMix64;

    use crate::math::splitmix::gauss_f32 as gauss;

    /// The AVX2 step computes the plain step's integers and back pointers, on random costs with
    /// ties, saturated (unreachable) states and extreme charges, unit and non-unit weights.
    #[test]
    fn avx2_step_equals_plain_step() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut g = SplitMix64::new(5);
            for l in [8u32, 10, 12] {
                let ns = 1usize << l;
                let q = ns / 4;
                for trial in 0..30 {
                    let mut rnd = |m: u64| (g.next_u64() % m) as i16;
                    let cost: Vec<i16> = (0..ns)
                        .map(|_| match rnd(8) {
                            0 => INF,
                            1 => 30_000 + rnd(2767),
                            2 => 100, // ties
                            _ => rnd(20_000),
                        })
                        .collect();
                    let dc: Vec<i16> = (0..ns).map(|_| rnd(32767) - 16383).collect();
                    let x = rnd(32767) - 16383;
                    let sw = (trial % 2 == 1).then(|| rnd(32767) + 1);
                    let (mut ba, mut bb) = (vec![0u8; bp_len(q)], vec![0u8; bp_len(q)]);
                    let (mut na, mut nb) = (vec![0i16; ns], vec![0i16; ns]);
                    step_generic(x, sw, &dc, &cost, &mut ba, &mut na);
                    // SAFETY: AVX2 present, q a multiple of 32, equal lengths.
                    unsafe { step_avx2(x, sw, &dc, &cost, &mut bb, &mut nb, 0..q) };
                    assert_eq!(na, nb, "l {l} trial {trial}");
                    assert_eq!(ba, bb, "l {l} trial {trial}");
                }
            }
        }
    }

    /// The whole search with the vector step (the first steps of a pinned start restricted to
    /// the reachable groups) gives the plain steps' codes and cost, for many starts and ends,
    /// unit and spread weights, at L = 10 and 12.
    #[test]
    fn vector_search_equals_plain_search() {
        let mut g = SplitMix64::new(11);
        for l in [10u32, 12] {
            let q = 1usize << (l - 2);
            let dc: Vec<f32> = codebook(l).iter().map(|c| 0.9 * c).collect();
            let mut fx = Fixed::new(l, 64);
            let mut bp = vec![0u8; 64 * bp_len(q)];
            for k in 0..24u64 {
                let x = gauss(64, 300 + k);
                let wt: Vec<f32> = if k % 2 == 0 {
                    vec![1.0; 64]
                } else {
                    gauss(64, 600 + k).iter().map(|v| (1.2 * v).exp()).collect()
                };
                let (a, b) = (
                    (g.next_u64() % q as u64) as u32,
                    (g.next_u64() % q as u64) as u32,
                );
                for ends in [Ends::Free, Ends::Wrap(a), Ends::Pinned(a, b)] {
                    let (mut ca, mut cb) = (vec![0u8; 64], vec![0u8; 64]);
                    let ea = viterbi_fixed(&x, &wt, &dc, l, ends, &mut fx, &mut bp, &mut ca, true);
                    let eb = viterbi_fixed(&x, &wt, &dc, l, ends, &mut fx, &mut bp, &mut cb, false);
                    assert_eq!(ea.map(f32::to_bits), eb.map(f32::to_bits), "l {l} {ends:?}");
                    assert_eq!(ca, cb, "l {l} {ends:?}");
                }
            }
        }
    }

    /// What the grid cannot hold is refused (the caller falls back), not searched.
    #[test]
    fn unusable_passes_are_refused() {
        let l = 8;
        let dc: Vec<f32> = codebook(l).to_vec();
        let mut fx = Fixed::new(l, 4);
        let mut bp = vec![0u8; 4 * bp_len(1 << (l - 2))];
        let mut codes = [0u8; 4];
        let ones = [1f32; 4];
        let mut run = |x: &[f32], w: &[f32]| {
            viterbi_fixed(
                x,
                w,
                &dc,
                l,
                Ends::Free,
                &mut fx,
                &mut bp,
                &mut codes,
                false,
            )
        };
        assert!(run(&[f32::NAN, 0.0, 1.0, 2.0], &ones).is_none());
        assert!(run(&[0.5, 0.0, 1.0, 2.0], &[1.0, 0.0, 1.0, 1.0]).is_none());
        // An ordinary pass is held; one whose best path saturates the costs is refused.
        assert!(run(&[0.5, 0.1, -0.3, 0.2], &ones).is_some());
        assert!(run(&[1e30, -1e30, 1e30, -1e30], &ones).is_none());
    }
}
