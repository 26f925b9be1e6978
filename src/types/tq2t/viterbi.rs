//! tq2_t's Viterbi search over the trellis: the pass's ends ([`Ends`]), its work space
//! ([`Scratch`]), the plain definition ([`viterbi_ref`]) and the restructured pass ([`viterbi`])
//! whose add-compare-select step runs portable ([`step_generic`]) or vectorized (`super::step`),
//! held bit-identical by tests. The block encoders (`super`) call it.

use super::fixed::{viterbi_fixed, Fixed};
use super::step::{self, back, bp_len, reachable_groups, Ends};

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
    /// With it, [`viterbi`] searches on 16-bit costs first (`super::fixed`).
    fixed: Option<Box<Fixed>>,
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
            fixed: None,
        }
    }

    /// A work space whose [`viterbi`] passes run on 16-bit path costs (`super::fixed`: twice
    /// the states per vector; the path found is the f32 search's or one within the costs'
    /// rounding), falling back to f32 for a pass the 16-bit grid cannot hold.
    pub fn fixed_point(l: u32, n: usize) -> Scratch {
        Scratch {
            fixed: Some(Box::new(Fixed::new(l, n))),
            ..Scratch::new(l, n)
        }
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
    if let Some(fx) = sc.fixed.as_deref_mut() {
        if let Some(cost) = viterbi_fixed(x, wt, dc, l, ends, fx, &mut sc.bp, codes, false) {
            return cost;
        }
    }
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
            step::clear_unreached(bp, &groups);
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
pub(super) fn step_generic(
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

#[cfg(test)]
pub(super) mod tests {
    use super::super::fixed::{path_cost, viterbi_fixed, Fixed};
    use super::super::*;
    use super::*;
    use crate::math::splitmix::SplitMix64;

    use crate::math::splitmix::gauss_f32 as gauss;

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
                    let cost = tied_costs(&mut g, ns, 5);
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

    /// Costs of `ns` states for a step's tests: |Gaussian|, and per predecessor group one of
    /// `cases` patterns drawn from `g`: ties between predecessors in every position pattern (0–2),
    /// three or all four predecessors infinite (3, 4), untouched (5 and up).
    fn tied_costs(g: &mut SplitMix64, ns: usize, cases: u64) -> Vec<f32> {
        let q = ns / 4;
        let mut cost: Vec<f32> = (0..ns).map(|_| (g.gauss() as f32).abs()).collect();
        for p in 0..q {
            match g.next_u64() % cases {
                0 => cost[p + q] = cost[p],
                1 => cost[p + 3 * q] = cost[p + 2 * q],
                2 => cost[p + 2 * q] = cost[p + q],
                3 => (1..4).for_each(|t| cost[p + t * q] = f32::INFINITY),
                4 => (0..4).for_each(|t| cost[p + t * q] = f32::INFINITY),
                _ => {}
            }
        }
        cost
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
                    let cost = tied_costs(&mut g, ns, 6);
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

    /// On Gaussian blocks, free and tail-biting, unit and spread weights: the 16-bit search's
    /// path is a valid one for the ends (its reported cost is that path's f32 cost) and within
    /// 0.5% of the f32 search's optimum in total (each block within 3%).
    #[test]
    fn fixed_search_is_near_the_f32_optimum() {
        let l = 12;
        let cb = codebook(l);
        let mut sc = Scratch::new(l, 64);
        let mut fx = Fixed::new(l, 64);
        let mut bp = vec![0u8; 64 * bp_len(1 << (l - 2))];
        let (mut sum_f, mut sum_x) = (0f64, 0f64);
        for k in 0..40u64 {
            let x = gauss(64, 100 + k);
            let wt: Vec<f32> = if k % 2 == 0 {
                vec![1.0; 64]
            } else {
                gauss(64, 900 + k).iter().map(|g| (0.8 * g).exp()).collect()
            };
            let dc: Vec<f32> = cb.iter().map(|c| 0.95 * c).collect();
            let top = (k as u32 * 37) % 1024;
            for ends in [Ends::Free, Ends::Wrap(top), Ends::Pinned(top, 1023 - top)] {
                let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
                let ef = viterbi(&x, &wt, &dc, l, ends, &mut sc, &mut a);
                let ex = viterbi_fixed(&x, &wt, &dc, l, ends, &mut fx, &mut bp, &mut b, false)
                    .expect("a Gaussian block fits the grid");
                if let Ends::Wrap(t) | Ends::Pinned(t, _) = ends {
                    let s0 = t << 2 | b[0] as u32;
                    assert_eq!(ex.to_bits(), path_cost(&x, &wt, &dc, l, &b, s0).to_bits());
                }
                if let Ends::Wrap(t) | Ends::Pinned(_, t) = ends {
                    // The last state's lower bits: the last code lowest.
                    let last = (0..5).fold(0u32, |s, j| s | (b[63 - j] as u32) << (2 * j));
                    assert_eq!(last, t, "{ends:?}");
                }
                assert!(
                    ex >= ef * (1.0 - 1e-6),
                    "{ends:?}: {ex} below the optimum {ef}"
                );
                assert!(ex <= ef * 1.03, "{ends:?}: {ex} vs {ef}");
                sum_f += ef as f64;
                sum_x += ex as f64;
            }
        }
        assert!(sum_x <= sum_f * 1.005, "{sum_x} vs {sum_f}");
    }

    /// Speed and error of the 16-bit search against the f32 one on the same Gaussian blocks
    /// (tail-biting passes; unit weights and LDLQ-like spread weights), one thread:
    /// `cargo test --release --lib bench_fixed_search -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn bench_fixed_search() {
        let l = 12;
        let blocks: usize = std::env::var("TQ_BENCH_BLOCKS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4000);
        let dc: Vec<f32> = codebook(l).iter().map(|c| 0.95 * c).collect();
        let xs: Vec<Vec<f32>> = (0..blocks).map(|k| gauss(64, 7 + k as u64)).collect();
        for weighted in [false, true] {
            let ws: Vec<Vec<f32>> = (0..blocks)
                .map(|k| {
                    if weighted {
                        gauss(64, 90_000 + k as u64)
                            .iter()
                            .map(|g| (0.8 * g).exp())
                            .collect()
                    } else {
                        vec![1.0; 64]
                    }
                })
                .collect();
            let mut res = Vec::new();
            for fixed in [false, true] {
                let mut sc = if fixed {
                    Scratch::fixed_point(l, 64)
                } else {
                    Scratch::new(l, 64)
                };
                let mut codes = [0u8; 64];
                let t = std::time::Instant::now();
                let mut total = 0f64;
                for (k, (x, w)) in xs.iter().zip(&ws).enumerate() {
                    let top = (k as u32 * 37) % 1024;
                    total += viterbi(x, w, &dc, l, Ends::Wrap(top), &mut sc, &mut codes) as f64;
                }
                res.push((t.elapsed().as_secs_f64(), total));
            }
            let vals = (blocks * 64) as f64;
            println!(
                "weighted {weighted}: f32 {:.3} M values/s, 16-bit {:.3} M values/s ({:.2}x); error 16-bit / f32 = {:.5}",
                vals / res[0].0 / 1e6,
                vals / res[1].0 / 1e6,
                res[0].0 / res[1].0,
                res[1].1 / res[0].1
            );
        }
    }
}
