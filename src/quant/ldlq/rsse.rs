//! A reduced-state per-survivor search of tq2_t's trellis on one block's LDLQ sweep cost (issue
//! 32), screened as block-LDLQ's inner search ([`super::trellis`]) in place of the 128-path
//! beam and not used: at equal width it is worse on the block form and no cheaper
//! (`rsse_screen`; docs/bench/speed.md, "The beam: candidate layout, reduced states").
//!
//! The trellis's 4096 states are merged into `H = 4^m` hyper-states by their last `m` codes
//! (`h = s mod H`); each hyper-state keeps one survivor path: its full state (which the codebook
//! reads), its cost and the feedback its own decisions leave on the block's later columns
//! (per-survivor processing, as [`super::psp::viterbi_psp`]). A hyper-state's successors are
//! `4h + b mod H`, so a step is the add-compare-select of an `H`-state trellis (four
//! predecessors per hyper-state, no candidate table, no selection), plus the survivors'
//! feedback rows. `H = 4096` is the full per-survivor search, path for path (a test holds it).

use crate::types::tq2t::{L, QK};

/// Work space of [`viterbi_rsse`], reused across blocks (sized for the largest `H` used).
#[derive(Default)]
pub(crate) struct RsseScratch {
    /// Per hyper-state: cost, full state of its survivor, feedback row (stride `QK`, absolute
    /// columns; columns ≤ the current step are stale).
    cost: Vec<f32>,
    next: Vec<f32>,
    st: Vec<u16>,
    nst: Vec<u16>,
    fb: Vec<f32>,
    nfb: Vec<f32>,
    /// The feedback on the current column, per hyper-state (gathered: contiguous).
    head: Vec<f32>,
    /// Per successor code `b`, per hyper-state `h`: the scaled code value its survivor reaches
    /// with `b` (`dc[4·(st[h] mod 1024) + b]`), laid out `b·H + h`.
    d4: Vec<f32>,
    /// Per successor code `b`, per predecessor group `p`: best cost, its `t`, its `z`.
    best: Vec<f32>,
    bt: Vec<u8>,
    bz: Vec<f32>,
    /// Back pointers (`t`), per step and successor hyper-state.
    bp: Vec<u8>,
}

/// The search over `4^m` hyper-states (`hbits = 2m`, 2 ≤ `hbits` ≤ [`L`]) of one tail-biting
/// block (wrap codes `top`): `x` the targets, `ub` the block of `U` (64×64, row-major), `dc` the
/// scaled codebook. Returns the path metric (`+∞` if no path ends on the wrap); `codes` gets the
/// codes. Ties go to the lowest predecessor `t`, then at the end to the lowest hyper-state.
pub(crate) fn viterbi_rsse(
    x: &[f32],
    ub: &[f64],
    dc: &[f32],
    top: u32,
    hbits: u32,
    sc: &mut RsseScratch,
    codes: &mut [u8],
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above); the body is safe code.
        return unsafe { viterbi_rsse_avx2(x, ub, dc, top, hbits, sc, codes) };
    }
    viterbi_rsse_body(x, ub, dc, top, hbits, sc, codes)
}

/// [`viterbi_rsse`] compiled for AVX2 (wider vectors for the same operations: the same bits; a
/// test holds it to the baseline build).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn viterbi_rsse_avx2(
    x: &[f32],
    ub: &[f64],
    dc: &[f32],
    top: u32,
    hbits: u32,
    sc: &mut RsseScratch,
    codes: &mut [u8],
) -> f32 {
    viterbi_rsse_body(x, ub, dc, top, hbits, sc, codes)
}

#[inline(always)]
fn viterbi_rsse_body(
    x: &[f32],
    ub: &[f64],
    dc: &[f32],
    top: u32,
    hbits: u32,
    sc: &mut RsseScratch,
    codes: &mut [u8],
) -> f32 {
    let hbits = hbits.clamp(2, L) & !1;
    let (nh, smask) = (1usize << hbits, (1u32 << L) - 1);
    let q = nh / 4;
    let uf: Vec<f32> = ub.iter().map(|&v| v as f32).collect();
    let inv: [f32; QK] = std::array::from_fn(|j| (1.0 / ub[j * QK + j]) as f32);
    for v in [
        &mut sc.cost,
        &mut sc.next,
        &mut sc.head,
        &mut sc.best,
        &mut sc.bz,
    ] {
        v.resize(nh, 0.0);
    }
    sc.d4.resize(4 * nh, 0.0);
    sc.st.resize(nh, 0);
    sc.nst.resize(nh, 0);
    sc.bt.resize(nh, 0);
    sc.fb.resize(nh * QK, 0.0);
    sc.nfb.resize(nh * QK, 0.0);
    sc.bp.resize(QK * nh, 0);
    sc.cost.fill(f32::INFINITY);
    sc.st.fill(0);
    for b in 0..4u32 {
        let s = (top << 2 | b) & smask;
        let h = s as usize & (nh - 1);
        let z = (x[0] - dc[s as usize]) * inv[0];
        sc.cost[h] = z * z;
        sc.st[h] = s as u16;
        let fb = &mut sc.fb[h * QK..(h + 1) * QK];
        for (f, &u) in fb[1..].iter_mut().zip(&uf[1..QK]) {
            *f = z * u;
        }
    }
    for j in 1..QK {
        let (xj, ij) = (x[j], inv[j]);
        for (h, (hd, &s)) in sc.head.iter_mut().zip(&sc.st).enumerate() {
            *hd = sc.fb[h * QK + j];
            let base = 4 * (s as usize & 1023);
            for b in 0..4 {
                sc.d4[b * nh + h] = dc[base + b];
            }
        }
        // Predecessors of hyper-state 4p + b are p + t·q, t = 0..4; strict `<` in t order keeps
        // the lowest t on ties. Unreached hyper-states carry +∞ (never `<`; t = 0 keeps ∞).
        for b in 0..4 {
            let best = &mut sc.best[b * q..(b + 1) * q];
            let bt = &mut sc.bt[b * q..(b + 1) * q];
            let bz = &mut sc.bz[b * q..(b + 1) * q];
            for t in 0..4 {
                let hd = &sc.head[t * q..(t + 1) * q];
                let co = &sc.cost[t * q..(t + 1) * q];
                let d4 = &sc.d4[b * nh + t * q..b * nh + (t + 1) * q];
                for p in 0..q {
                    let z = ((xj - hd[p]) - d4[p]) * ij;
                    let c = co[p] + z * z;
                    if t == 0 || c < best[p] {
                        best[p] = c;
                        bt[p] = t as u8;
                        bz[p] = z;
                    }
                }
            }
        }
        // The last five codes are the wrap's: only paths that can end on it go on.
        let only = (j + 5 >= QK).then(|| (top >> (2 * (QK - 1 - j))) as usize & 3);
        let bp = &mut sc.bp[j * nh..(j + 1) * nh];
        let uj = &uf[j * QK + j + 1..(j + 1) * QK];
        for p in 0..q {
            for b in 0..4 {
                let h2 = 4 * p + b;
                let (t, z) = (sc.bt[b * q + p], sc.bz[b * q + p]);
                let src = p + t as usize * q;
                sc.next[h2] = if only.is_some_and(|w| w != b) {
                    f32::INFINITY
                } else {
                    sc.best[b * q + p]
                };
                bp[h2] = t;
                sc.nst[h2] = (((sc.st[src] as u32) << 2 | b as u32) & smask) as u16;
                let fsrc = &sc.fb[src * QK + j + 1..(src + 1) * QK];
                let dst = &mut sc.nfb[h2 * QK + j + 1..(h2 + 1) * QK];
                for ((d, &f), &u) in dst.iter_mut().zip(fsrc).zip(uj) {
                    *d = f + z * u;
                }
            }
        }
        std::mem::swap(&mut sc.cost, &mut sc.next);
        std::mem::swap(&mut sc.st, &mut sc.nst);
        std::mem::swap(&mut sc.fb, &mut sc.nfb);
    }
    // The wrap forced the last five codes: every finite survivor ends on it.
    let lowmask = (1u32 << (L - 2)) - 1;
    let mut best = (f32::INFINITY, usize::MAX);
    for (h, (&c, &s)) in sc.cost.iter().zip(&sc.st).enumerate() {
        if (s as u32 & lowmask) == top && c < best.0 {
            best = (c, h);
        }
    }
    if best.1 == usize::MAX {
        return f32::INFINITY;
    }
    let mut h = best.1;
    for j in (0..QK).rev() {
        codes[j] = (h & 3) as u8;
        if j > 0 {
            h = (h >> 2) | ((sc.bp[j * nh + h] as usize) * q);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::super::psp::{quad_cost, viterbi_beam, viterbi_psp, wrap_of, PspScratch};
    use super::*;
    use crate::math::splitmix::SplitMix64;
    use crate::types::tq2t::format_codebook;

    fn gauss(n: usize, seed: u64) -> Vec<f32> {
        let mut g = SplitMix64::new(seed);
        (0..n).map(|_| g.gauss() as f32).collect()
    }

    /// A random upper-triangular `U` (positive diagonal) and its block form `A = (UᵀU)⁻¹`.
    fn upper_and_form(seed: u64) -> (Vec<f64>, Vec<f64>) {
        let mut g = SplitMix64::new(seed);
        let mut u = vec![0f64; QK * QK];
        for i in 0..QK {
            u[i * QK + i] = 0.5 + g.gauss().abs();
            for k in i + 1..QK {
                u[i * QK + k] = 0.25 * g.gauss();
            }
        }
        let mut v = vec![0f64; QK * QK];
        for c in 0..QK {
            for i in (0..=c).rev() {
                let mut s = if i == c { 1.0 } else { 0.0 };
                for k in i + 1..=c {
                    s -= u[i * QK + k] * v[k * QK + c];
                }
                v[i * QK + c] = s / u[i * QK + i];
            }
        }
        let a = (0..QK * QK)
            .map(|ik| {
                (0..QK)
                    .map(|m| v[ik / QK * QK + m] * v[ik % QK * QK + m])
                    .sum()
            })
            .collect();
        (u, a)
    }

    /// At 4096 hyper-states the reduced search is the full per-survivor search (an independent
    /// implementation: state-indexed, with its own definition held to it), codes and metric bit
    /// for bit; at every size it ends on the wrap and its metric is the block's quadratic form of
    /// its codes (computed from scratch); and the AVX2 build equals the baseline build.
    #[test]
    fn rsse_is_psp_at_full_size_and_charges_the_form() {
        let cb = format_codebook();
        let mut rs = RsseScratch::default();
        let mut ps = PspScratch::new(1, 0);
        for seed in 0..3u64 {
            let (u, a) = upper_and_form(40 + seed);
            let xf = gauss(QK, 50 + seed);
            let x: Vec<f64> = xf.iter().map(|&v| v as f64).collect();
            let d = 0.5 + 0.1 * seed as f32;
            let dc: Vec<f32> = cb.iter().map(|&c| d * c).collect();
            for top in [0u32, 1023, (seed as u32 * 613) & 1023] {
                let (mut c1, mut c2) = ([0u8; QK], [0u8; QK]);
                let m1 = viterbi_rsse(&xf, &u, &dc, top, L, &mut rs, &mut c1);
                let m2 = viterbi_psp(&xf, &u, &dc, top, &mut ps, &mut c2);
                assert_eq!(
                    (c1, m1.to_bits()),
                    (c2, m2.to_bits()),
                    "seed {seed} top {top}"
                );
                for hbits in [2, 4, 6, 8, 10] {
                    let m = viterbi_rsse(&xf, &u, &dc, top, hbits, &mut rs, &mut c1);
                    assert_eq!(wrap_of(&c1), top, "seed {seed} hbits {hbits}");
                    let e = quad_cost(&x, &a, d, &c1);
                    assert!(
                        (m as f64 - e).abs() <= 1e-4 * e,
                        "seed {seed} hbits {hbits}: {m} vs {e}"
                    );
                    let mut c3 = [0u8; QK];
                    let m3 = viterbi_rsse_body(&xf, &u, &dc, top, hbits, &mut rs, &mut c3);
                    assert_eq!((c3, m3.to_bits()), (c1, m.to_bits()), "baseline build");
                }
            }
        }
    }

    /// Screening (not CI): the reduced search against the beam on the same random blocks, the
    /// summed block form of the codes and the thread CPU per block.
    /// `cargo test --release --lib rsse_screen -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn rsse_screen() {
        let cb = format_codebook();
        let mut rs = RsseScratch::default();
        let mut bs = Default::default();
        let runs = [
            ("beam", 32u32),
            ("beam", 128),
            ("beam", 512),
            ("rsse", 6),
            ("rsse", 8),
            ("rsse", 10),
            ("rsse", 12),
        ];
        let (mut tot, mut ns) = ([0f64; 7], [0u64; 7]);
        for seed in 0..40u64 {
            let (u, a) = upper_and_form(60 + seed);
            let xf = gauss(QK, 70 + seed);
            let x: Vec<f64> = xf.iter().map(|&v| v as f64).collect();
            let dc: Vec<f32> = cb.iter().map(|&c| 0.6 * c).collect();
            let top = (seed as u32 * 211) & 1023;
            let mut c = [0u8; QK];
            for (i, &(kind, v)) in runs.iter().enumerate() {
                let t0 = crate::quant::ldlq::prof::thread_cpu_ns();
                if kind == "beam" {
                    viterbi_beam(&xf, &u, &dc, top, v as usize, &mut bs, &mut c);
                } else {
                    viterbi_rsse(&xf, &u, &dc, top, v, &mut rs, &mut c);
                }
                ns[i] += crate::quant::ldlq::prof::thread_cpu_ns() - t0;
                tot[i] += quad_cost(&x, &a, 0.6, &c);
            }
        }
        for (i, &(kind, v)) in runs.iter().enumerate() {
            let width = if kind == "beam" { v as usize } else { 1 << v };
            eprintln!(
                "{kind} {width}: form {:.2} ({:.3}x beam 128), {:.0} µs per block",
                tot[i],
                tot[i] / tot[1],
                ns[i] as f64 / 40e3
            );
        }
    }
}
