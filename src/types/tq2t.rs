//! `tq2_t`: trellis-coded 2-bit weights (issue 19) on the whole-row rotation of `tq2_r`.
//!
//! Block (17 bytes per 64 values, 2.125 bpw): `e` (one byte, the scale, see [`scale_of`]) then
//! `qs[16]`, 2-bit code `b_j` of the block at bits `2·(j mod 4)` of byte `j / 4`. The 64 values
//! are consecutive elements of the rotated row `R·w` (`R` exactly as tq2_r's, [`tq2r::rotation`]).
//!
//! Decoding is a **tail-biting bitshift trellis** with an `L = 12`-bit state: value `j` reads the
//! state `s_j = Σ_{t<6} b_{(j−t) mod 64} << 2t` (its own code in the low bits, the five before it
//! above, wrapping inside the block) and is `d · c(s_j)`, where `c` is a computed pseudo-Gaussian
//! codebook ([`codeword`]: one multiply-add on the state, the sum of the four bytes of the result —
//! QTIP's "1MAD" construction — centred and scaled to unit variance). Every value depends on its
//! block only, so a decoder needs no table and can start anywhere.
//!
//! Encoding is Viterbi search over the 4096 states per value ([`viterbi_ref`] is the plain
//! definition, [`viterbi`] the restructured one that runs ~4× fewer compares and vectorizes; a test
//! holds them bit-identical). Tail-biting is handled QTIP's way: one free-start pass over the block
//! rotated by half its length fixes the five codes that wrap around, a second pass constrained to
//! start and end on them gives the codes. Then the scale is refit by least squares on the chosen
//! codewords and the search rerun with it; the better of the two is kept.
//!
//! This file is the format: its layout, the codebook, the round-to-nearest encoder of a block and
//! a row, and the decoders. The Hessian-aware search of block-LDLQ (per-survivor Viterbi, beam
//! search, coordinate descent of the codes on a block's quadratic form) is an algorithm over the
//! format and lives with LDLQ in `quant::ldlq::trellis` / `quant::ldlq::psp`.

use super::tq2r;

mod step;
use crate::error::Result;

/// Values per block (one tail-biting trellis, one scale).
pub const QK: usize = 64;
/// Bytes per block: scale byte + 64 two-bit codes.
pub const TQ2T_BYTES: usize = 1 + QK / 4;
const _: () = assert!(TQ2T_BYTES == 17);
/// Trellis state bits of the format.
pub const L: u32 = 12;

/// The 1MAD multiplier and increment (QTIP, "1MAD" codebook).
pub(crate) const MAD_A: u32 = 34_038_481;
pub(crate) const MAD_B: u32 = 76_625_530;
/// Four uniform bytes sum to mean 510 and variance 4·(256²−1)/12 = 21845.
pub(crate) const MAD_MEAN: i32 = 510;
/// The GPU kernels write it as its f32 bits (a test holds them to it).
pub(crate) const MAD_INV_STD: f32 = 1.0 / 147.800_54;

/// Codeword of state `s`: `(Σ bytes of (A·s + B mod 2³²) − 510) / 147.8`, ≈ N(0, 1) over the states.
#[inline]
pub fn codeword(s: u32) -> f32 {
    let x = MAD_A.wrapping_mul(s).wrapping_add(MAD_B);
    let sum = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24);
    (sum as i32 - MAD_MEAN) as f32 * MAD_INV_STD
}

/// The codebook of an `l`-bit trellis.
pub fn codebook(l: u32) -> Vec<f32> {
    (0..1u32 << l).map(codeword).collect()
}

/// The format's codebook ([`codebook`] of [`L`]), built once.
pub(crate) fn format_codebook() -> &'static [f32] {
    static CB: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    CB.get_or_init(|| codebook(L))
}

/// The scale byte's value: 0 is zero, else `(8 + m) · 2^(E − 27)` with `E = e >> 3`, `m = e & 7`
/// (a 5-bit exponent, 3-bit mantissa float: ≤ 6.25% from any scale in [6e-8, 240], exact in f32).
#[inline]
pub fn scale_of(e: u8) -> f32 {
    if e == 0 {
        return 0.0;
    }
    let (ex, m) = ((e >> 3) as i32, (e & 7) as i32);
    (8 + m) as f32 * f32::from_bits(((ex - 27 + 127) as u32) << 23)
}

/// The nearest scale byte to `d` (≥ 0), saturating at the largest.
pub fn nearest_scale(d: f32) -> u8 {
    if !(d > 0.0) {
        return 0;
    }
    // scale_of is increasing in e: binary search the first e with scale_of(e) >= d.
    let (mut lo, mut hi) = (1u16, 255u16);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if scale_of(mid as u8) >= d {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let e = lo as u8;
    if e > 1 && (d - scale_of(e - 1)) <= (scale_of(e) - d) {
        e - 1
    } else {
        e
    }
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

/// Work space of a Viterbi pass, reused across blocks.
pub struct Scratch {
    cost: Vec<f32>,
    next: Vec<f32>,
    dist: Vec<f32>,
    min: Vec<f32>,
    /// Back pointers: for step `i` and predecessor group `p = s' >> 2`, which `t` (the dropped
    /// top code) the best path came from, as the step's three comparisons ([`bp_len`] bytes per
    /// step, read by [`back`]).
    bp: Vec<u8>,
}

impl Scratch {
    pub fn new(l: u32, n: usize) -> Scratch {
        let ns = 1usize << l;
        Scratch {
            cost: vec![0.0; ns],
            next: vec![0.0; ns],
            dist: vec![0.0; ns],
            min: vec![0.0; ns / 4],
            bp: vec![0; n * bp_len(ns / 4)],
        }
    }
}

/// Bytes of one step's back pointers for `q` predecessor groups: three bitmaps of `q` bits (bit
/// `p` at byte `p / 8`, bit `p mod 8`), each the strict `<` of one comparison of the four-way
/// minimum: `cost[p + q] < cost[p]` (`k01`), `cost[p + 3q] < cost[p + 2q]` (`k23`), and the
/// minimum of the last two `<` the minimum of the first two (`km`). The kernels store their
/// comparison masks as they are; the back pointer is decoded only along the traced path.
pub(super) const fn bp_len(q: usize) -> usize {
    3 * q.div_ceil(8)
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

fn init_costs(x0: f32, w0: f32, dc: &[f32], l: u32, ends: Ends, cost: &mut [f32]) {
    debug_assert_eq!(dc.len(), 1 << l);
    let first = |c: &mut f32, d: f32| {
        let e = x0 - d;
        *c = w0 * (e * e);
    };
    match ends {
        Ends::Free => cost.iter_mut().zip(dc).for_each(|(c, &d)| first(c, d)),
        Ends::Wrap(top) | Ends::Pinned(top, _) => {
            // Only the four states whose upper bits are the wrap start finite.
            cost.fill(f32::INFINITY);
            let s0 = (top as usize) << 2;
            for s in s0..s0 + 4 {
                first(&mut cost[s], dc[s]);
            }
        }
    }
}

/// Best final state (lowest index on ties) and the trace back to the codes (the fast search's;
/// [`viterbi_ref`] spells out the plain definition).
fn trace(cost: &[f32], bp: &[u8], n: usize, l: u32, ends: Ends, codes: &mut [u8]) -> f32 {
    let q = cost.len() / 4;
    let mut best = (f32::INFINITY, 0u32);
    // In increasing state order with a strict `<`: the lowest index wins ties.
    let mut consider = |s: usize| {
        if cost[s] < best.0 {
            best = (cost[s], s as u32);
        }
    };
    match ends {
        // The first state holding the minimum is what the strict-`<` scan picks (lane-wise
        // minima, then the first match: no serial chain through 4096 compares).
        Ends::Free => {
            let mut lanes = [f32::INFINITY; 8];
            for c in cost.chunks_exact(8) {
                for (m, &v) in lanes.iter_mut().zip(c) {
                    *m = if v < *m { v } else { *m };
                }
            }
            let rest = cost.chunks_exact(8).remainder();
            let m = lanes
                .iter()
                .chain(rest)
                .fold(f32::INFINITY, |a, &v| if v < a { v } else { a });
            if m < f32::INFINITY {
                // The first chunk holding it (a branch-free test per chunk), then its place.
                let k = cost
                    .chunks(16)
                    .position(|c| c.iter().fold(false, |a, &v| a | (v == m)))
                    .expect("the minimum is present");
                let j = cost[16 * k..]
                    .iter()
                    .position(|&c| c == m)
                    .expect("the minimum is present");
                consider(16 * k + j);
            }
        }
        // Tail-biting: the four states whose lower bits are the wrap.
        Ends::Wrap(top) | Ends::Pinned(_, top) => {
            (0..4).for_each(|t| consider(top as usize + t * q))
        }
    }
    let mut s = best.1;
    for i in (0..n).rev() {
        codes[i] = (s & 3) as u8;
        if i > 0 {
            let p = (s >> 2) as usize;
            let b = bp_len(q);
            s = (s >> 2) | (back(&bp[i * b..(i + 1) * b], q, p) << (l - 2));
        }
    }
    best.0
}

/// The plain Viterbi search: for every state `s'` of every step, the best of its four predecessors
/// `(s' >> 2) | t << (l−2)` plus `wt_i · (x − dc[s'])²`. Returns the path's weighted squared error;
/// `codes` gets the 2-bit code of every step (the low bits of its state). Weights of 1 give the
/// plain squared error bit for bit (`1 · e` is `e`).
pub fn viterbi_ref(x: &[f32], wt: &[f32], dc: &[f32], l: u32, ends: Ends, codes: &mut [u8]) -> f32 {
    let (n, ns) = (x.len(), 1usize << l);
    let q = ns / 4;
    let lowmask = (1u32 << (l - 2)) - 1;
    let mut cost = vec![0f32; ns];
    let mut next = vec![0f32; ns];
    let mut bp = vec![0u8; n * q];
    for (s, c) in cost.iter_mut().enumerate() {
        let ok = match ends {
            Ends::Free => true,
            Ends::Wrap(top) | Ends::Pinned(top, _) => (s >> 2) as u32 == top,
        };
        let e = x[0] - dc[s];
        *c = if ok { wt[0] * (e * e) } else { f32::INFINITY };
    }
    for i in 1..n {
        for s in 0..ns {
            let p = s >> 2;
            let (mut m, mut bt) = (cost[p], 0u8);
            for t in 1..4 {
                if cost[p + t * q] < m {
                    m = cost[p + t * q];
                    bt = t as u8;
                }
            }
            bp[i * q + p] = bt;
            let e = x[i] - dc[s];
            next[s] = m + wt[i] * (e * e);
        }
        std::mem::swap(&mut cost, &mut next);
    }
    let mut best = (f32::INFINITY, 0u32);
    for (s, &c) in cost.iter().enumerate() {
        let ok = match ends {
            Ends::Free => true,
            Ends::Wrap(top) | Ends::Pinned(_, top) => (s as u32 & lowmask) == top,
        };
        if ok && c < best.0 {
            best = (c, s as u32);
        }
    }
    let mut s = best.1;
    for i in (0..n).rev() {
        codes[i] = (s & 3) as u8;
        if i > 0 {
            s = (s >> 2) | ((bp[i * q + (s >> 2) as usize] as u32) << (l - 2));
        }
    }
    best.0
}

/// The same search restructured: the four states `4p + b` share their predecessors, so the
/// minimum over the four is taken once per `p` (contiguous, vectorizable), and the squared errors
/// are one contiguous pass. Bit-identical to [`viterbi_ref`] (same operations on every element).
pub fn viterbi(
    x: &[f32],
    wt: &[f32],
    dc: &[f32],
    l: u32,
    ends: Ends,
    sc: &mut Scratch,
    codes: &mut [u8],
) -> f32 {
    let (n, ns) = (x.len(), 1usize << l);
    let q = ns / 4;
    let bs = bp_len(q);
    debug_assert!(sc.cost.len() == ns && sc.bp.len() >= n * bs);
    init_costs(x[0], wt[0], dc, l, ends, &mut sc.cost);
    // The states each buffer may hold finite values in (+∞ elsewhere); `next` holds whatever the
    // last search left.
    let mut stale_cost = match ends {
        Ends::Free => 0..ns,
        Ends::Wrap(top) | Ends::Pinned(top, _) => 4 * top as usize..4 * top as usize + 4,
    };
    let mut stale_next = 0..ns;
    let mut i = 1;
    while i < n {
        let groups = reachable_groups(l, ends, i);
        // Two whole steps at once where the fused kernel runs (the restricted steps are the
        // first ones, so the step after a whole one is whole too).
        if groups.len() == q && i + 1 < n {
            let (bpa, bpb) = sc.bp[i * bs..(i + 2) * bs].split_at_mut(bs);
            if step2(
                (x[i], wt[i]),
                (x[i + 1], wt[i + 1]),
                dc,
                &sc.cost,
                bpa,
                bpb,
                &mut sc.next,
            ) {
                std::mem::swap(&mut sc.cost, &mut sc.next);
                (stale_cost, stale_next) = (0..ns, 0..ns);
                i += 2;
                continue;
            }
        }
        let bp = &mut sc.bp[i * bs..(i + 1) * bs];
        let reach = 4 * groups.start..4 * groups.end;
        if groups.len() < q {
            // Every other state is unreachable: infinite in the full step as well (all four
            // predecessors infinite), with back pointer 0 (the first of four equal minima).
            // Only what may be finite from before needs the fill.
            let st = &stale_next;
            sc.next[st.start..st.end.min(reach.start).max(st.start)].fill(f32::INFINITY);
            sc.next[reach.end.max(st.start).min(st.end)..st.end].fill(f32::INFINITY);
            // (`groups`' ends are multiples of 32 groups: whole bytes of each bitmap.)
            let w = bs / 3;
            for k in 0..3 {
                bp[k * w..k * w + groups.start / 8].fill(0);
                bp[k * w + groups.end / 8..(k + 1) * w].fill(0);
            }
        }
        step(
            x[i],
            wt[i],
            dc,
            &sc.cost,
            &mut sc.dist,
            &mut sc.min,
            bp,
            &mut sc.next,
            groups,
        );
        std::mem::swap(&mut sc.cost, &mut sc.next);
        (stale_cost, stale_next) = (reach, stale_cost);
        i += 1;
    }
    trace(&sc.cost, &sc.bp, n, l, ends, codes)
}

/// Two whole trellis steps, `cost → (xa, wa) → (xb, wb) → next`, with the fused kernel
/// ([`step::step2_avx512`]) where the CPU has AVX-512 and the trellis at least 256 states, else
/// [`step::step2_avx2`] where it has AVX2 and at least 128 states;
/// returns false (nothing written) elsewhere, for the caller to take two single steps. The same
/// values and back pointers as two [`step`]s (a test holds them equal).
fn step2(
    a: (f32, f32),
    b: (f32, f32),
    dc: &[f32],
    cost: &[f32],
    bpa: &mut [u8],
    bpb: &mut [u8],
    next: &mut [f32],
) -> bool {
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    if (cost.len() / 4).is_multiple_of(64) && step::has_avx512() {
        // SAFETY: the CPU has AVX-512F/BW/VL and q is a multiple of 64 (checked above);
        // `viterbi` passes equal lengths for cost, dc and next and q back pointers per step.
        unsafe { step::step2_avx512(a, b, dc, cost, bpa, bpb, next) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if (cost.len() / 4).is_multiple_of(32) && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 and q is a multiple of 32 (checked above); the lengths as
        // above.
        unsafe { step::step2_avx2(a, b, dc, cost, bpa, bpb, next) };
        return true;
    }
    let _ = (a, b, dc, cost, bpa, bpb, next);
    false
}

/// The predecessor groups step `i` must compute, widened to whole [`step::GROUP`]s: all of them,
/// except in the first `l/2 − 2` steps of a tail-biting pass, where only the states whose upper
/// bits continue the wrap start are finite (after step `i`, the `4^(i+1)` states
/// `(top mod 4^(l/2−1−i))·4^(i+1) + …`: 16, 64, 256, 1024 of 4096 at `l` = 12).
fn reachable_groups(l: u32, ends: Ends, i: usize) -> std::ops::Range<usize> {
    let q = 1usize << (l - 2);
    let w = (l / 2 - 1) as usize;
    match ends {
        Ends::Wrap(top) | Ends::Pinned(top, _)
            if l.is_multiple_of(2) && i < w && q.is_multiple_of(step::GROUP) =>
        {
            let lo = (top as usize % (1 << (2 * (w - i)))) << (2 * i);
            let hi = lo + (1 << (2 * i));
            let g = step::GROUP;
            (lo / g * g)..hi.div_ceil(g) * g
        }
        _ => 0..q,
    }
}

/// One trellis step over the predecessor groups `groups`: the fused AVX2 kernel
/// ([`step::step_avx2`]) when the CPU has AVX2 and the trellis has at least 128 states, else the
/// portable [`step_generic`]; the same operations on every element either way, so the same bits
/// (a test holds them equal).
#[allow(clippy::too_many_arguments)]
fn step(
    xi: f32,
    wi: f32,
    dc: &[f32],
    cost: &[f32],
    dist: &mut [f32],
    min: &mut [f32],
    bp: &mut [u8],
    next: &mut [f32],
    groups: std::ops::Range<usize>,
) {
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    if (cost.len() / 4).is_multiple_of(step::GROUP) && step::has_avx512() {
        // SAFETY: the CPU has AVX-512F/BW/VL and q is a multiple of the kernel's group (checked
        // above), as are the ends of `groups`; `viterbi` passes equal lengths for cost, dc and
        // next and q back pointers.
        unsafe { step::step_avx512(xi, wi, dc, cost, bp, next, groups) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if (cost.len() / 4).is_multiple_of(step::GROUP) && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 and q is a multiple of the kernel's group (checked above), as
        // are the ends of `groups` (`reachable_groups`); `viterbi` passes equal lengths for cost,
        // dc and next and q back pointers.
        unsafe { step::step_avx2(xi, wi, dc, cost, bp, next, groups) };
        return;
    }
    // The portable step computes every group: the same values outside `groups` as the fill.
    let _ = groups;
    step_generic(xi, wi, dc, cost, dist, min, bp, next)
}

/// The portable step: the squared errors, the minimum per predecessor group, the sums, each a
/// contiguous pass the compiler vectorizes.
#[allow(clippy::too_many_arguments)]
fn step_generic(
    xi: f32,
    wi: f32,
    dc: &[f32],
    cost: &[f32],
    dist: &mut [f32],
    min: &mut [f32],
    bp: &mut [u8],
    next: &mut [f32],
) {
    let q = cost.len() / 4;
    for (d, &c) in dist.iter_mut().zip(dc) {
        let e = xi - c;
        *d = wi * (e * e);
    }
    let (c0, rest) = cost.split_at(q);
    let (c1, rest) = rest.split_at(q);
    let (c2, c3) = rest.split_at(q);
    // Strict `<` in t order keeps the lowest t on ties, as the reference does; the three
    // comparisons go to the back pointers' bitmaps ([`bp_len`]).
    let w = q.div_ceil(8);
    bp[..3 * w].fill(0);
    for p in 0..q {
        let (a, b, c, d) = (c0[p], c1[p], c2[p], c3[p]);
        let k01 = b < a;
        let m01 = if k01 { b } else { a };
        let k23 = d < c;
        let m23 = if k23 { d } else { c };
        let km = m23 < m01;
        min[p] = if km { m23 } else { m01 };
        let (byte, bit) = (p / 8, p % 8);
        bp[byte] |= (k01 as u8) << bit;
        bp[w + byte] |= (k23 as u8) << bit;
        bp[2 * w + byte] |= (km as u8) << bit;
    }
    for ((nx, d), &m) in next
        .chunks_exact_mut(4)
        .zip(dist.chunks_exact(4))
        .zip(&*min)
    {
        nx[0] = m + d[0];
        nx[1] = m + d[1];
        nx[2] = m + d[2];
        nx[3] = m + d[3];
    }
}

/// Tail-biting search of one block: a free pass on the block rotated by half fixes the `l/2 − 1`
/// codes that wrap, a pass constrained to them gives the codes. Returns the (weighted) squared error.
pub fn encode_tail_biting(
    x: &[f32],
    wt: &[f32],
    dc: &[f32],
    l: u32,
    sc: &mut Scratch,
    codes: &mut [u8],
) -> f32 {
    let n = x.len();
    let h = n / 2;
    let w = (l / 2 - 1) as usize;
    let (y, yw) = (rotated(x, h), rotated(wt, h));
    viterbi(&y, &yw, dc, l, Ends::Free, sc, codes);
    // Original position n − t sits at n − t − h of the rotated sequence.
    let mut top = 0u32;
    for t in 1..=w {
        top |= (codes[n - t - h] as u32) << (2 * (t - 1));
    }
    viterbi(x, wt, dc, l, Ends::Wrap(top), sc, codes)
}

/// `v` rotated left by `h`: the block seen from its middle (the free pass's order).
fn rotated(v: &[f32], h: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(v.len());
    y.extend_from_slice(&v[h..]);
    y.extend_from_slice(&v[..h]);
    y
}

/// Tail-biting search of one block with a cheaper second pass: the free pass of
/// [`encode_tail_biting`] on the block rotated by half, its codes put back in place (any 64 codes
/// are a tail-biting block; these were searched without their real neighbours only across the
/// seam, the middle of the block, where the rotated pass started and ended), then the codes
/// around the seam searched again with the others fixed: the `l/2 − 1` codes on either side of
/// it and `ctx` more, from the codes before them to the codes after them ([`Ends::Pinned`]), a
/// window of `3(l/2 − 1) + 2·ctx` values instead of the block. Returns the block's (weighted)
/// squared error as it decodes.
pub fn encode_tail_biting_seam(
    x: &[f32],
    wt: &[f32],
    dc: &[f32],
    l: u32,
    ctx: usize,
    sc: &mut Scratch,
    codes: &mut [u8],
) -> f32 {
    let n = x.len();
    let (h, w) = (n / 2, (l / 2 - 1) as usize);
    let ctx = ctx.min(h.saturating_sub(2 * w));
    if h < 2 * w {
        return encode_tail_biting(x, wt, dc, l, sc, codes);
    }
    let (y, yw) = (rotated(x, h), rotated(wt, h));
    viterbi(&y, &yw, dc, l, Ends::Free, sc, codes);
    codes.rotate_right(h);
    // Codes a..b searched again; a − w..a and b..b + w pinned (all inside the block).
    let (a, b) = (h - w - ctx, h + w + ctx);
    let start = (1..=w).fold(0u32, |s, t| s | (codes[a - t] as u32) << (2 * (t - 1)));
    let end = (0..w).fold(0u32, |s, t| s | (codes[b + w - 1 - t] as u32) << (2 * t));
    let mut win = vec![0u8; b + w - a];
    let m = b + w - a;
    viterbi(
        &x[a..b + w],
        &wt[a..b + w],
        dc,
        l,
        Ends::Pinned(start, end),
        sc,
        &mut win[..m],
    );
    codes[a..b].copy_from_slice(&win[..b - a]);
    x.iter()
        .zip(wt)
        .zip(block_states(codes, l))
        .map(|((&v, &w), s)| {
            let e = v - dc[s as usize];
            w * (e * e)
        })
        .sum()
}

/// The wrap of a block's codes: its last `l/2 − 1` codes as [`Ends::Wrap`] takes them.
fn wrap_of(codes: &[u8], l: u32) -> u32 {
    let n = codes.len();
    (1..=(l / 2 - 1) as usize).fold(0, |top, t| top | (codes[n - t] as u32) << (2 * (t - 1)))
}

/// State of value `j` of a block of `codes` in an `l`-bit tail-biting trellis.
#[inline]
pub fn state_at(codes: &[u8], j: usize, l: u32) -> u32 {
    let n = codes.len();
    (0..(l / 2) as usize).fold(0u32, |s, t| s | (codes[(j + n - t) % n] as u32) << (2 * t))
}

/// The states of values `0..n` of a block of `codes` ([`state_at`] of each, a test holds them
/// equal): a shift register primed with the codes that wrap, as the fast decoder reads them.
fn block_states(codes: &[u8], l: u32) -> impl Iterator<Item = u32> + '_ {
    let (n, mask) = (codes.len(), (1u32 << l) - 1);
    let mut s = (n + 1 - (l / 2) as usize..n).fold(0u32, |s, j| (s << 2) | codes[j] as u32);
    codes.iter().map(move |&c| {
        s = ((s << 2) | c as u32) & mask;
        s
    })
}

/// Encoder settings (the format's are [`Settings::FORMAT`]; others are for measurements).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub l: u32,
    /// Initial scale = `alpha · rms` of the block.
    pub alpha: f32,
    /// Refit the scale by least squares and search again.
    pub refit: bool,
    /// Tail-biting (two passes); else a free start and the wrap ignored (measurement only: the
    /// decoder always wraps).
    pub tail_biting: bool,
    /// The refit's search keeps the first search's wrap codes (one pass, the wrapped one)
    /// instead of finding its own with a free pass first (tail-biting only).
    pub refit_keeps_wrap: bool,
    /// 0: tail-biting's second pass over the whole block; `k > 0`: over the seam of the first
    /// pass only, with `k − 1` codes of context ([`encode_tail_biting_seam`]).
    pub seam: usize,
}

impl Settings {
    pub const FORMAT: Settings = Settings {
        l: L,
        alpha: 0.95,
        refit: true,
        tail_biting: true,
        refit_keeps_wrap: false,
        seam: 0,
    };

    /// The round-to-nearest encoder's settings: [`Settings::FORMAT`], or with
    /// `TQ_TQ2T_REFIT_WRAP=1` the refit keeping the first search's wrap (measurements). Read once.
    pub(crate) fn rtn() -> Settings {
        static ST: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
        *ST.get_or_init(|| Settings {
            refit_keeps_wrap: std::env::var_os("TQ_TQ2T_REFIT_WRAP").is_some_and(|v| v == "1"),
            ..Settings::FORMAT
        })
    }
}

/// Encode one block of rotated values with a float scale (measurements: any `l`, no scale
/// rounding) or the format's byte scale. Returns (scale byte or 0, decoded values' squared error).
pub fn encode_block(
    x: &[f32],
    cb: &[f32],
    st: Settings,
    byte_scale: bool,
    sc: &mut Scratch,
    codes: &mut [u8],
    out: &mut [f32],
) -> (u8, f32) {
    let ones = vec![1f32; x.len()];
    encode_block_weighted(x, &ones, cb, st, byte_scale, sc, codes, out)
}

/// [`encode_block`] minimizing `Σ wt_j (x_j − x̂_j)²` (the search and the scale refit both
/// weighted); all-ones weights give `encode_block`'s bytes exactly.
#[allow(clippy::too_many_arguments)]
pub fn encode_block_weighted(
    x: &[f32],
    wt: &[f32],
    cb: &[f32],
    st: Settings,
    byte_scale: bool,
    sc: &mut Scratch,
    codes: &mut [u8],
    out: &mut [f32],
) -> (u8, f32) {
    let n = x.len();
    let rms = (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64).sqrt() as f32;
    let quant = |d: f32| -> (u8, f32) {
        if byte_scale {
            let e = nearest_scale(d);
            (e, scale_of(e))
        } else {
            (0, d)
        }
    };
    // `wrap`: the wrap codes to keep (the refit's search with `refit_keeps_wrap`).
    let run = |d: f32, wrap: Option<u32>, sc: &mut Scratch, codes: &mut [u8]| -> f32 {
        let dc: Vec<f32> = cb.iter().map(|&c| d * c).collect();
        match wrap {
            Some(top) => viterbi(x, wt, &dc, st.l, Ends::Wrap(top), sc, codes),
            None if st.tail_biting && st.seam > 0 => {
                encode_tail_biting_seam(x, wt, &dc, st.l, st.seam - 1, sc, codes)
            }
            None if st.tail_biting => encode_tail_biting(x, wt, &dc, st.l, sc, codes),
            None => viterbi(x, wt, &dc, st.l, Ends::Free, sc, codes),
        }
    };
    let (mut e, mut d) = quant(st.alpha * rms);
    if d == 0.0 {
        codes.fill(0);
        out.fill(0.0);
        return (0, x.iter().zip(wt).map(|(v, w)| w * (v * v)).sum());
    }
    let mut err = run(d, None, sc, codes);
    if st.refit {
        let (mut sxc, mut scc) = (0f64, 0f64);
        for ((&v, &w), s) in x.iter().zip(wt).zip(block_states(codes, st.l)) {
            let c = cb[s as usize] as f64;
            sxc += w as f64 * (v as f64 * c);
            scc += w as f64 * (c * c);
        }
        if scc > 0.0 && sxc > 0.0 {
            let (e2, d2) = quant((sxc / scc) as f32);
            if d2 != d && d2 > 0.0 {
                let mut c2 = vec![0u8; n];
                let wrap = (st.tail_biting && st.refit_keeps_wrap).then(|| wrap_of(codes, st.l));
                let err2 = run(d2, wrap, sc, &mut c2);
                if err2 < err {
                    (e, d, err) = (e2, d2, err2);
                    codes.copy_from_slice(&c2);
                }
            }
        }
    }
    for (o, s) in out.iter_mut().zip(block_states(codes, st.l)) {
        *o = d * cb[s as usize];
    }
    (e, err)
}

/// Pack a block: the scale byte `e`, then the 2-bit codes.
pub(crate) fn pack(e: u8, codes: &[u8], b: &mut [u8]) {
    b[0] = e;
    b[1..].fill(0);
    for (j, &c) in codes.iter().enumerate() {
        b[1 + j / 4] |= c << (2 * (j % 4));
    }
}

/// Encode rotated values (whole blocks): the registry's per-block quantizer.
pub fn quantize_tq2t_rotated(src: &[f32], out: &mut [u8]) {
    let cb = format_codebook();
    let mut sc = Scratch::new(L, QK);
    let (mut codes, mut y) = ([0u8; QK], [0f32; QK]);
    for (x, b) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ2T_BYTES)) {
        let (e, _) = encode_block(x, cb, Settings::rtn(), true, &mut sc, &mut codes, &mut y);
        pack(e, &codes, b);
    }
}

/// Quantize one block of rotated values (LDLQ's vector quantizer); `out` gets the decoded values.
pub(crate) fn quantize_block(x: &[f32], sc: &mut Scratch, b: &mut [u8], out: &mut [f32]) {
    let mut codes = [0u8; QK];
    let (e, _) = encode_block(
        x,
        format_codebook(),
        Settings::FORMAT,
        true,
        sc,
        &mut codes,
        out,
    );
    pack(e, &codes, b);
}

fn code(b: &[u8], j: usize) -> u32 {
    ((b[1 + j / 4] >> (2 * (j % 4))) & 3) as u32
}

/// Reference decoder: every value's state read from its block's codes independently (what a GPU
/// thread per value does).
pub fn dequantize_tq2t_rotated_ref(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(TQ2T_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = scale_of(b[0]);
        for (j, v) in y.iter_mut().enumerate() {
            let s =
                (0..(L / 2) as usize).fold(0u32, |s, t| s | code(b, (j + QK - t) % QK) << (2 * t));
            *v = d * codeword(s);
        }
    }
}

/// Fast decoder: the state shifted in code by code (primed with the wrapped codes), the codebook
/// from the table. Bit-identical to [`dequantize_tq2t_rotated_ref`].
pub fn dequantize_tq2t_rotated(blocks: &[u8], out: &mut [f32]) {
    let cb = format_codebook();
    let mask = (1u32 << L) - 1;
    for (b, y) in blocks
        .chunks_exact(TQ2T_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = scale_of(b[0]);
        let mut s = 0u32;
        for j in QK - (L / 2) as usize + 1..QK {
            s = (s << 2) | code(b, j);
        }
        for (j, v) in y.iter_mut().enumerate() {
            s = ((s << 2) | code(b, j)) & mask;
            *v = d * cb[s as usize];
        }
    }
}

/// Quantize one row (length a multiple of 64): tq2_r's rotation, then the blocks.
pub fn quantize_row(src: &[f32], out: &mut [u8]) -> Result<()> {
    check_len(src.len())?;
    let r = tq2r::rotation(src.len())?;
    quantize_tq2t_rotated(&r.forward(src), out);
    Ok(())
}

/// Dequantize one row: the blocks, then `Rᵀ`.
pub fn dequantize_row(blocks: &[u8], out: &mut [f32]) -> Result<()> {
    check_len(out.len())?;
    let r = tq2r::rotation(out.len())?;
    let mut y = vec![0f32; out.len()];
    dequantize_tq2t_rotated(blocks, &mut y);
    out.copy_from_slice(&r.inverse(&y));
    Ok(())
}

fn check_len(k: usize) -> Result<()> {
    if k == 0 || !k.is_multiple_of(QK) {
        return Err(crate::error::Error::Unsupported(format!(
            "tq2_t: row length {k} is not a positive multiple of {QK}; keep this tensor in another type (e.g. --weights tq2_r or q4_K)"
        )));
    }
    Ok(())
}

/// Reference mat-vec: dequantize every row to the original basis and dot with `x` (f64 sums).
pub fn matvec_ref(blocks: &[u8], x: &[f32], y: &mut [f32]) -> Result<()> {
    tq2r::matvec_ref_by(blocks, x, y, x.len() / QK * TQ2T_BYTES, dequantize_row)
}

/// Fast mat-vec: rotate the activation once (`w·x = (R·w)·(R·x)`), then decode each block's
/// rotated values and dot them with `x'`, never forming the weights in the original basis.
pub fn matvec(blocks: &[u8], x: &[f32], y: &mut [f32]) -> Result<()> {
    let k = x.len();
    check_len(k)?;
    let xr = tq2r::rotation(k)?.forward(x);
    let row_bytes = k / QK * TQ2T_BYTES;
    let mut v = [0f32; QK];
    for (yn, row) in y.iter_mut().zip(blocks.chunks_exact(row_bytes)) {
        let mut acc = 0f32;
        for (b, xs) in row.chunks_exact(TQ2T_BYTES).zip(xr.chunks_exact(QK)) {
            dequantize_tq2t_rotated(b, &mut v);
            acc += v.iter().zip(xs).map(|(a, b)| a * b).sum::<f32>();
        }
        *yn = acc;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::splitmix::SplitMix64;

    fn gauss(n: usize, seed: u64) -> Vec<f32> {
        let mut g = SplitMix64::new(seed);
        (0..n).map(|_| g.gauss() as f32).collect()
    }

    /// The restructured Viterbi is the plain one, bit for bit, for free and tail-biting ends and
    /// several state sizes, including ties (a codebook with repeated words).
    #[test]
    fn fast_viterbi_equals_reference() {
        for (l, seed) in [(6u32, 1u64), (8, 2), (12, 3)] {
            let x = gauss(64, seed);
            let mut cb = codebook(l);
            if l == 6 {
                // Force ties: every codeword repeated in pairs.
                for s in (0..cb.len()).step_by(2) {
                    cb[s + 1] = cb[s];
                }
            }
            let dc: Vec<f32> = cb.iter().map(|c| 0.9 * c).collect();
            let mut sc = Scratch::new(l, 64);
            // Weighted too (the block-LDLQ search): positive weights spread over two decades.
            let wt: Vec<f32> = if l == 8 {
                gauss(64, 40).iter().map(|g| (1.5 * g).exp()).collect()
            } else {
                vec![1.0; 64]
            };
            let top = (1 << (l - 2)) - 1;
            let all = [
                Ends::Free,
                Ends::Wrap(5),
                Ends::Wrap(top),
                Ends::Pinned(5, 9),
                Ends::Pinned(top, 0),
            ];
            // The whole block, and a window as the seam's search takes one.
            for (m, ends) in all.iter().flat_map(|&e| [(64, e), (31, e)]) {
                let (mut a, mut b) = (vec![0u8; m], vec![0u8; m]);
                let ea = viterbi_ref(&x[..m], &wt[..m], &dc, l, ends, &mut a);
                let eb = viterbi(&x[..m], &wt[..m], &dc, l, ends, &mut sc, &mut b);
                assert_eq!(a, b, "l={l} {ends:?} n={m}");
                assert_eq!(ea.to_bits(), eb.to_bits(), "l={l} {ends:?} n={m}");
            }
        }
    }

    /// The fused AVX2 step is the portable step bit for bit (costs, back pointers) on random
    /// costs with exact ties between predecessors, infinite costs (the wrapped start), unit and
    /// non-unit weights, for every state size it runs at.
    /// The tail-biting pass computes only the reachable groups in its first steps
    /// (`reachable_groups`): the whole search still equals the plain definition bit for bit, for
    /// many wrap values (aligned to a kernel group or not) at L = 10 and 12, unit and non-unit
    /// weights.
    #[test]
    fn wrap_pass_from_reachable_states_equals_reference() {
        let x = gauss(64, 31);
        let wt: Vec<f32> = (0..64).map(|j| 0.5 + (j % 5) as f32 * 0.3).collect();
        let ones = vec![1f32; 64];
        let mut s = 99u64;
        for l in [10u32, 12] {
            let dc: Vec<f32> = codebook(l).iter().map(|&c| 0.9 * c).collect();
            let mut sc = Scratch::new(l, 64);
            for k in 0..40 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let top = ((s >> 33) as u32) & ((1 << (l - 2)) - 1);
                let w = if k % 2 == 0 { &ones } else { &wt };
                let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
                let ea = viterbi(&x, w, &dc, l, Ends::Wrap(top), &mut sc, &mut a);
                let eb = viterbi_ref(&x, w, &dc, l, Ends::Wrap(top), &mut b);
                assert_eq!((ea.to_bits(), &a), (eb.to_bits(), &b), "l {l} top {top}");
            }
        }
    }

    #[test]
    fn avx2_step_equals_portable_step() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut g = SplitMix64::new(77);
            for l in [7u32, 10, 12] {
                let ns = 1usize << l;
                let q = ns / 4;
                let mut sc = Scratch::new(l, 1);
                let dc: Vec<f32> = codebook(l).iter().map(|c| 0.7 * c).collect();
                for trial in 0..20 {
                    let mut cost: Vec<f32> = (0..ns).map(|_| (g.gauss() as f32).abs()).collect();
                    for p in 0..q {
                        match g.next_u64() % 5 {
                            // Ties: some predecessors equal, in every position pattern.
                            0 => cost[p + q] = cost[p],
                            1 => cost[p + 3 * q] = cost[p + 2 * q],
                            2 => cost[p + 2 * q] = cost[p + q],
                            3 => (1..4).for_each(|t| cost[p + t * q] = f32::INFINITY),
                            _ => (0..4).for_each(|t| cost[p + t * q] = f32::INFINITY),
                        }
                    }
                    let xi = g.gauss() as f32;
                    let wi = if trial % 2 == 0 {
                        1.0
                    } else {
                        (g.gauss() as f32).exp()
                    };
                    let (mut n1, mut n2) = (vec![0f32; ns], vec![0f32; ns]);
                    let bl = bp_len(q);
                    let (mut b1, mut b2) = (vec![9u8; bl], vec![7u8; bl]);
                    step_generic(
                        xi,
                        wi,
                        &dc,
                        &cost,
                        &mut sc.dist,
                        &mut sc.min,
                        &mut b1,
                        &mut n1,
                    );
                    // SAFETY: AVX2 checked above, lengths as the kernel requires.
                    unsafe {
                        step::step_avx2(xi, wi, &dc, &cost, &mut b2, &mut n2, 0..cost.len() / 4)
                    };
                    assert_eq!(b1, b2, "l={l} trial {trial}");
                    // The bitmaps decode to the plain search's back pointer: the lowest t
                    // reaching the minimum.
                    for p in 0..q {
                        let mut bt = 0;
                        for t in 1..4 {
                            if cost[p + t * q] < cost[p + bt * q] {
                                bt = t;
                            }
                        }
                        assert_eq!(back(&b1, q, p), bt as u32, "l={l} trial {trial} p {p}");
                    }
                    assert!(
                        n1.iter().zip(&n2).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "l={l} trial {trial}"
                    );
                    // The AVX-512 step, where the CPU has it (and on a sub-range of groups).
                    #[cfg(feature = "avx512")]
                    if step::has_avx512() && q.is_multiple_of(step::GROUP) {
                        let (mut n3, mut b3) = (vec![0f32; ns], vec![5u8; bl]);
                        // SAFETY: AVX-512F/BW/VL checked, lengths as the kernel requires.
                        unsafe { step::step_avx512(xi, wi, &dc, &cost, &mut b3, &mut n3, 0..q) };
                        assert_eq!(b1, b3, "avx512 l={l} trial {trial}");
                        assert!(
                            n1.iter().zip(&n3).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "avx512 l={l} trial {trial}"
                        );
                        let g = step::GROUP..q - step::GROUP;
                        if !g.is_empty() {
                            let (mut n4, mut b4) = (vec![-1f32; ns], vec![9u8; bl]);
                            // SAFETY: as above; the range's ends are multiples of GROUP.
                            unsafe {
                                step::step_avx512(xi, wi, &dc, &cost, &mut b4, &mut n4, g.clone())
                            };
                            for p in g.clone() {
                                assert_eq!(back(&b1, q, p), back(&b4, q, p), "avx512 range l={l}");
                            }
                            let w = bl / 3;
                            for k in 0..3 {
                                let out = b4[k * w..k * w + g.start / 8]
                                    .iter()
                                    .chain(&b4[k * w + g.end / 8..(k + 1) * w]);
                                assert!(out.into_iter().all(|&v| v == 9), "wrote outside");
                            }
                            assert!(n4[4 * g.end..].iter().all(|&v| v == -1.0), "wrote outside");
                            assert!(n1[4 * g.start..4 * g.end]
                                .iter()
                                .zip(&n4[4 * g.start..4 * g.end])
                                .all(|(a, b)| a.to_bits() == b.to_bits()));
                        }
                    } else if trial == 0 && l == 12 {
                        eprintln!("NOT RUN: the AVX-512 step: the CPU has no AVX-512F/BW/VL");
                    }
                }
            }
        } else {
            eprintln!("NOT RUN: avx2_step_equals_portable_step: the CPU has no AVX2");
        }
    }

    /// The fused two-step kernel is two portable steps bit for bit: both steps' back pointers
    /// and the final costs, with ties between predecessors in every pattern and infinite costs
    /// at the input, ties in the middle (a codebook with repeated words: equal successors), unit
    /// and non-unit weights in either step, at every state size it runs at.
    #[test]
    fn fused_two_steps_equal_two_portable_steps() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut g = SplitMix64::new(91);
            for l in [8u32, 10, 12] {
                let ns = 1usize << l;
                let q = ns / 4;
                let mut sc = Scratch::new(l, 1);
                for trial in 0..24 {
                    let mut cb = codebook(l);
                    if trial % 3 == 0 {
                        for s in (0..ns).step_by(2) {
                            cb[s + 1] = cb[s];
                        }
                    }
                    let dc: Vec<f32> = cb.iter().map(|c| 0.8 * c).collect();
                    let mut cost: Vec<f32> = (0..ns).map(|_| (g.gauss() as f32).abs()).collect();
                    for p in 0..q {
                        match g.next_u64() % 6 {
                            0 => cost[p + q] = cost[p],
                            1 => cost[p + 3 * q] = cost[p + 2 * q],
                            2 => cost[p + 2 * q] = cost[p + q],
                            3 => (1..4).for_each(|t| cost[p + t * q] = f32::INFINITY),
                            4 => (0..4).for_each(|t| cost[p + t * q] = f32::INFINITY),
                            _ => {}
                        }
                    }
                    let w = |k: usize, g: &mut SplitMix64| {
                        if (trial >> k) % 2 == 0 {
                            1.0
                        } else {
                            (g.gauss() as f32).exp()
                        }
                    };
                    let a = (g.gauss() as f32, w(0, &mut g));
                    let b = (g.gauss() as f32, w(1, &mut g));
                    let (mut mid, mut n1) = (vec![0f32; ns], vec![0f32; ns]);
                    let bl = bp_len(q);
                    let (mut a1, mut b1) = (vec![9u8; bl], vec![9u8; bl]);
                    let (sd, sm) = (&mut sc.dist, &mut sc.min);
                    step_generic(a.0, a.1, &dc, &cost, sd, sm, &mut a1, &mut mid);
                    step_generic(b.0, b.1, &dc, &mid, sd, sm, &mut b1, &mut n1);
                    let (mut n3, mut a3, mut b3) = (vec![0f32; ns], vec![5u8; bl], vec![5u8; bl]);
                    // SAFETY: AVX2 checked, lengths as the kernel requires (q ≥ 32).
                    unsafe { step::step2_avx2(a, b, &dc, &cost, &mut a3, &mut b3, &mut n3) };
                    assert_eq!((&a1, &b1), (&a3, &b3), "avx2 l={l} trial {trial}");
                    assert!(
                        n1.iter().zip(&n3).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "avx2 l={l} trial {trial}"
                    );
                    #[cfg(feature = "avx512")]
                    if step::has_avx512() {
                        let (mut n2, mut a2, mut b2) =
                            (vec![0f32; ns], vec![7u8; bl], vec![7u8; bl]);
                        // SAFETY: AVX-512F/BW/VL checked, lengths as the kernel requires.
                        unsafe { step::step2_avx512(a, b, &dc, &cost, &mut a2, &mut b2, &mut n2) };
                        assert_eq!((&a1, &b1), (&a2, &b2), "l={l} trial {trial}");
                        assert!(
                            n1.iter().zip(&n2).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "l={l} trial {trial}"
                        );
                    } else if trial == 0 && l == 12 {
                        eprintln!("NOT RUN: the fused AVX-512 step: no AVX-512F/BW/VL");
                    }
                }
            }
        } else {
            eprintln!("NOT RUN: fused_two_steps_equal_two_portable_steps: the CPU has no AVX2");
        }
    }

    /// The whole-block encoder (the dispatching search) gives the reference search's bytes on
    /// Gaussian and heavy-tailed rows and on a codebook with repeated words (ties), weighted
    /// and not: encode with the reference search spliced in must give the same block.
    #[test]
    fn fast_viterbi_equals_reference_at_the_format_size() {
        let mut g = SplitMix64::new(12);
        let mut cb = codebook(L);
        let tied = {
            let mut t = cb.clone();
            for s in (0..t.len() - 1).step_by(3) {
                t[s + 1] = t[s];
            }
            t
        };
        let mut sc = Scratch::new(L, QK);
        for trial in 0..6 {
            if trial >= 3 {
                cb = tied.clone();
            }
            let x: Vec<f32> = (0..QK)
                .map(|_| {
                    let v = g.gauss() as f32;
                    if trial % 2 == 1 {
                        v * v * v
                    } else {
                        v
                    }
                })
                .collect();
            let wt: Vec<f32> = if trial % 3 == 2 {
                (0..QK).map(|_| (g.gauss() as f32).exp()).collect()
            } else {
                vec![1.0; QK]
            };
            let dc: Vec<f32> = cb.iter().map(|c| 0.8 * c).collect();
            for ends in [Ends::Free, Ends::Wrap(0), Ends::Wrap(777)] {
                let (mut a, mut b) = (vec![0u8; QK], vec![0u8; QK]);
                let ea = viterbi_ref(&x, &wt, &dc, L, ends, &mut a);
                let eb = viterbi(&x, &wt, &dc, L, ends, &mut sc, &mut b);
                assert_eq!(a, b, "trial {trial} {ends:?}");
                assert_eq!(ea.to_bits(), eb.to_bits(), "trial {trial} {ends:?}");
            }
        }
    }

    /// The returned error is the squared error of the decoded path, and the wrapped path is a
    /// valid tail-biting path (its states read back circularly give that error).
    #[test]
    fn tail_biting_path_decodes_to_its_error() {
        let l = 10;
        let cb = codebook(l);
        let x = gauss(64, 11);
        let mut sc = Scratch::new(l, 64);
        let mut codes = vec![0u8; 64];
        let err = encode_tail_biting(&x, &[1.0; 64], &cb, l, &mut sc, &mut codes);
        let direct: f32 = (0..64)
            .map(|j| (x[j] - cb[state_at(&codes, j, l) as usize]).powi(2))
            .sum();
        assert!((err - direct).abs() <= 1e-4 * direct, "{err} vs {direct}");
        // And it is at least as good as any of 200 random paths.
        let mut g = SplitMix64::new(3);
        for _ in 0..200 {
            let c: Vec<u8> = (0..64).map(|_| (g.next_u64() & 3) as u8).collect();
            let e: f32 = (0..64)
                .map(|j| (x[j] - cb[state_at(&c, j, l) as usize]).powi(2))
                .sum();
            assert!(err <= e);
        }
    }

    /// The seam's search ([`encode_tail_biting_seam`]) keeps the free pass's codes outside its
    /// window, returns the error its codes decode to, is never worse than the free pass's codes
    /// (they are one of the paths the window's search compares), and on 40 blocks is within 8%
    /// of the full second pass (unit and non-unit weights, the format's trellis).
    #[test]
    fn seam_search_keeps_the_free_codes_and_never_loses_to_them() {
        let l = L;
        let cb = format_codebook();
        let mut sc = Scratch::new(l, QK);
        let decode_err = |x: &[f32], wt: &[f32], dc: &[f32], c: &[u8]| -> f64 {
            (0..QK)
                .map(|j| {
                    let e = (x[j] - dc[state_at(c, j, l) as usize]) as f64;
                    wt[j] as f64 * e * e
                })
                .sum()
        };
        for weighted in [false, true] {
            let (mut sum_seam, mut sum_full) = (0f64, 0f64);
            for seed in 0..40u64 {
                let x = gauss(QK, 100 + seed);
                let wt: Vec<f32> = if weighted {
                    gauss(QK, 300 + seed)
                        .iter()
                        .map(|g| (0.7 * g).exp())
                        .collect()
                } else {
                    vec![1.0; QK]
                };
                let dc: Vec<f32> = cb.iter().map(|c| 0.95 * c).collect();
                // The free pass's codes, from the plain definition.
                let h = QK / 2;
                let y: Vec<f32> = (0..QK).map(|i| x[(h + i) % QK]).collect();
                let yw: Vec<f32> = (0..QK).map(|i| wt[(h + i) % QK]).collect();
                let mut free = vec![0u8; QK];
                viterbi_ref(&y, &yw, &dc, l, Ends::Free, &mut free);
                free.rotate_right(h);
                let ctx = 8;
                let mut codes = vec![0u8; QK];
                let err = encode_tail_biting_seam(&x, &wt, &dc, l, ctx, &mut sc, &mut codes);
                let w = (l / 2 - 1) as usize;
                let (a, b) = (h - w - ctx, h + w + ctx);
                assert_eq!(codes[..a], free[..a], "seed {seed}");
                assert_eq!(codes[b..], free[b..], "seed {seed}");
                let direct = decode_err(&x, &wt, &dc, &codes);
                assert!(
                    (err as f64 - direct).abs() <= 1e-5 * direct,
                    "{err} vs {direct}"
                );
                let ef = decode_err(&x, &wt, &dc, &free);
                assert!(
                    direct <= ef * (1.0 + 1e-6),
                    "seed {seed}: {direct} vs free {ef}"
                );
                let mut full = vec![0u8; QK];
                encode_tail_biting(&x, &wt, &dc, l, &mut sc, &mut full);
                sum_seam += direct;
                sum_full += decode_err(&x, &wt, &dc, &full);
            }
            // Alone (no later search to repair it) the window's 31 values measured +4.2% unit
            // weights; paths merge slower than the window's 8 codes of context.
            eprintln!("weighted {weighted}: seam {sum_seam} vs full {sum_full}");
            assert!(
                sum_seam <= 1.08 * sum_full,
                "weighted {weighted}: seam {sum_seam} vs full {sum_full}"
            );
        }
    }

    /// The shift register's states are the definition's, for every code pattern tried, at
    /// several state sizes and block lengths.
    #[test]
    fn block_states_equal_state_at() {
        let mut g = SplitMix64::new(17);
        for (l, n) in [(12u32, 64usize), (10, 64), (8, 16), (12, 6)] {
            for _ in 0..20 {
                let c: Vec<u8> = (0..n).map(|_| (g.next_u64() & 3) as u8).collect();
                let a: Vec<u32> = block_states(&c, l).collect();
                let b: Vec<u32> = (0..n).map(|j| state_at(&c, j, l)).collect();
                assert_eq!(a, b, "l {l} n {n}");
            }
        }
    }

    #[test]
    fn codebook_is_unit_gaussian_like() {
        let cb = codebook(L);
        let n = cb.len() as f64;
        let mean = cb.iter().map(|&c| c as f64).sum::<f64>() / n;
        let var = cb.iter().map(|&c| (c as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(
            mean.abs() < 0.05 && (var - 1.0).abs() < 0.08,
            "{mean} {var}"
        );
    }

    #[test]
    fn scale_byte_round_trips() {
        for e in 1..=255u8 {
            assert_eq!(nearest_scale(scale_of(e)), e);
            assert!(scale_of(e) > scale_of(e - 1));
        }
        assert_eq!(nearest_scale(0.0), 0);
        assert_eq!(nearest_scale(1e9), 255);
        for d in [1e-5f32, 0.013, 0.5, 3.0, 100.0] {
            let r = scale_of(nearest_scale(d));
            assert!((r - d).abs() <= 0.0625 * d, "{d} -> {r}");
        }
    }

    #[test]
    fn fast_decoder_equals_reference() {
        let w = gauss(5 * QK, 4);
        let mut b = vec![0u8; 5 * TQ2T_BYTES];
        quantize_tq2t_rotated(&w, &mut b);
        // And some arbitrary bytes too: every code pattern decodes the same both ways.
        let mut g = SplitMix64::new(8);
        b.extend(g.bytes(3 * TQ2T_BYTES));
        let n = b.len() / TQ2T_BYTES * QK;
        let (mut a, mut c) = (vec![0f32; n], vec![0f32; n]);
        dequantize_tq2t_rotated_ref(&b, &mut a);
        dequantize_tq2t_rotated(&b, &mut c);
        assert!(a.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    /// i.i.d. Gaussian blocks: the format's normalized error is well under the scalar 4-level
    /// grid's 0.1175 (the goal is ≤ 0.075; docs/bench/two-bit.md has the measured table).
    #[test]
    fn gaussian_mse_beats_the_scalar_grid() {
        let n = 64 * QK;
        let w = gauss(n, 21);
        let mut b = vec![0u8; n / QK * TQ2T_BYTES];
        quantize_tq2t_rotated(&w, &mut b);
        let mut y = vec![0f32; n];
        dequantize_tq2t_rotated(&b, &mut y);
        let e: f64 = w
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let s: f64 = w.iter().map(|v| (*v as f64).powi(2)).sum();
        let nmse = e / s;
        assert!(nmse < 0.085, "nmse {nmse}");
    }

    #[test]
    fn fast_matvec_equals_reference_and_rows_round_trip() {
        for (rows, k) in [(5, 576), (3, 1536), (2, 256)] {
            let w = gauss(rows * k, 1 + k as u64);
            let x = gauss(k, 99);
            let rb = k / QK * TQ2T_BYTES;
            let mut b = vec![0u8; rows * rb];
            for (r, o) in w.chunks_exact(k).zip(b.chunks_exact_mut(rb)) {
                quantize_row(r, o).unwrap();
            }
            let (mut y0, mut y1) = (vec![0f32; rows], vec![0f32; rows]);
            matvec_ref(&b, &x, &mut y0).unwrap();
            matvec(&b, &x, &mut y1).unwrap();
            let scale = (k as f32).sqrt();
            for (a, c) in y0.iter().zip(&y1) {
                assert!((a - c).abs() <= 2e-5 * scale, "K={k}: {a} vs {c}");
            }
            let mut back = vec![0f32; k];
            dequantize_row(&b[..rb], &mut back).unwrap();
            let e: f32 = back.iter().zip(&w).map(|(a, b)| (a - b).powi(2)).sum();
            let s: f32 = w[..k].iter().map(|v| v * v).sum();
            assert!(e / s < 0.09, "K={k}: {}", e / s);
        }
    }

    #[test]
    fn zero_rows_huge_values_and_bad_lengths() {
        let mut b = vec![0u8; TQ2T_BYTES * 2];
        quantize_row(&[0.0; 128], &mut b).unwrap();
        let mut out = vec![1f32; 128];
        dequantize_row(&b, &mut out).unwrap();
        assert!(out.iter().all(|v| *v == 0.0));
        quantize_row(&[1e30; 128], &mut b).unwrap();
        dequantize_row(&b, &mut out).unwrap();
        assert!(out.iter().all(|v| v.is_finite()));
        let e = quantize_row(&[0.0; 96], &mut b).unwrap_err();
        assert!(e.to_string().contains("multiple of 64"), "{e}");
    }
}
