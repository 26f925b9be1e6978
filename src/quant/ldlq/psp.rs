//! The per-survivor Viterbi searches of tq2_t's trellis on one block's LDLQ sweep cost (the
//! inner search of block-LDLQ, [`super::trellis`]): every survivor path carries the error
//! feedback of its own decisions. [`viterbi_psp`] searches every state (its definition:
//! [`viterbi_psp_ref`]), [`viterbi_beam`] the best `k` paths per step. [`quad_cost`] is the
//! block's quadratic form they are held to.

use crate::types::tq2t::{format_codebook, state_at, L, QK};

/// The quadratic cost `(x − x̂)ᵀ A (x − x̂)` of one block (`a` 64×64 row-major, symmetric) whose
/// decoded values are `d · c(s_j)` for the states of `codes`.
pub(crate) fn quad_cost(x: &[f64], a: &[f64], d: f32, codes: &[u8]) -> f64 {
    let cb = format_codebook();
    let r: Vec<f64> = (0..QK)
        .map(|j| x[j] - (d * cb[state_at(codes, j, L) as usize]) as f64)
        .collect();
    (0..QK)
        .map(|i| r[i] * (0..QK).map(|k| a[i * QK + k] * r[k]).sum::<f64>())
        .sum()
}

/// Work space of [`viterbi_psp`], reused across blocks.
pub(crate) struct PspScratch {
    /// Searches per block: the first at the best scale so far, then at the least-squares scale
    /// (under the block's form) of the last one's codes while that moves.
    pub(super) tries: usize,
    cost: Vec<f32>,
    next: Vec<f32>,
    /// Per state, the feedback its path leaves on every later column of the block (row stride
    /// `QK`, absolute column index; columns ≤ the current step are stale).
    fb: Vec<f32>,
    nfb: Vec<f32>,
    /// The feedback on the current column, per state (gathered from `fb`: contiguous).
    head: Vec<f32>,
    /// Per successor code `b`, per predecessor group `p`: best cost, its `t`, its `z`.
    best: Vec<f32>,
    bt: Vec<u8>,
    bz: Vec<f32>,
    /// The scaled codebook split by low code: `dcb[b·q + p] = dc[4p + b]`.
    dcb: Vec<f32>,
    /// Back pointers, one per step and *successor* state (each state picks its own predecessor:
    /// its error depends on the predecessor's feedback).
    bp: Vec<u8>,
    /// Beam width (0: the full search, [`viterbi_psp`]; else [`viterbi_beam`]).
    pub(super) beam: usize,
    pub(super) bs: BeamScratch,
}

impl PspScratch {
    pub(crate) fn new(tries: usize, beam: usize) -> PspScratch {
        let ns = 1usize << L;
        // The full search's buffers only when it runs (2.3 MB).
        let ns = if beam > 0 { 0 } else { ns };
        PspScratch {
            beam,
            bs: BeamScratch::default(),
            tries: tries.max(1),
            cost: vec![0.0; ns],
            next: vec![0.0; ns],
            fb: vec![0.0; ns * QK],
            nfb: vec![0.0; ns * QK],
            head: vec![0.0; ns],
            best: vec![0.0; ns],
            bt: vec![0; ns],
            bz: vec![0.0; ns],
            dcb: vec![0.0; ns],
            bp: vec![0; QK * ns],
        }
    }
}

/// Viterbi search of one tail-biting block (wrap codes `top`, as `tq2t::Ends::Wrap`) on the block's
/// own LDLQ sweep cost: every survivor path carries the error feedback of its own earlier
/// decisions (per-survivor processing), so value `j` of a path is compared with its target
/// `x_j − Σ_{i<j} z_i U_ij` (`z_i = e_i / U_ii`) and charged `z_j²`, which sums to exactly the
/// `rᵀ (U_bbᵀ U_bb)⁻¹ r` block-LDLQ charges for the path. (Still not the optimum: a survivor is
/// chosen per state before its feedback's later cost is known.) `ub` is the block of `U` (64×64,
/// row-major), `dc` the scaled codebook. Returns the path metric; `codes` gets the codes.
/// [`viterbi_psp_ref`] is the definition; this one is laid out to vectorize, bit-identical.
pub(crate) fn viterbi_psp(
    x: &[f32],
    ub: &[f64],
    dc: &[f32],
    top: u32,
    sc: &mut PspScratch,
    codes: &mut [u8],
) -> f32 {
    let (n, ns) = (QK, 1usize << L);
    let q = ns / 4;
    let uf: Vec<f32> = ub.iter().map(|&v| v as f32).collect();
    let inv: [f32; QK] = std::array::from_fn(|j| (1.0 / ub[j * QK + j]) as f32);
    for p in 0..q {
        for b in 0..4 {
            sc.dcb[b * q + p] = dc[4 * p + b];
        }
    }
    for s in 0..ns {
        let fb = &mut sc.fb[s * QK..(s + 1) * QK];
        if (s >> 2) as u32 == top {
            let z = (x[0] - dc[s]) * inv[0];
            sc.cost[s] = z * z;
            for (f, &u) in fb[1..].iter_mut().zip(&uf[1..QK]) {
                *f = z * u;
            }
        } else {
            sc.cost[s] = f32::INFINITY;
            fb.fill(0.0);
        }
    }
    for j in 1..n {
        psp_step(x[j], inv[j], &uf[j * QK..(j + 1) * QK], j, sc);
        std::mem::swap(&mut sc.cost, &mut sc.next);
        std::mem::swap(&mut sc.fb, &mut sc.nfb);
    }
    psp_trace(&sc.cost, &sc.bp, top, codes)
}

/// One step of [`viterbi_psp`]: AVX2 when the CPU has it (same operations, so the same bits).
fn psp_step(xj: f32, ij: f32, uj: &[f32], j: usize, sc: &mut PspScratch) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above); the function is safe code otherwise.
        unsafe { psp_step_avx2(xj, ij, uj, j, sc) };
        return;
    }
    psp_step_generic(xj, ij, uj, j, sc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn psp_step_avx2(xj: f32, ij: f32, uj: &[f32], j: usize, sc: &mut PspScratch) {
    psp_step_generic(xj, ij, uj, j, sc)
}

#[inline(always)]
fn psp_step_generic(xj: f32, ij: f32, uj: &[f32], j: usize, sc: &mut PspScratch) {
    let ns = sc.cost.len();
    let q = ns / 4;
    for (h, row) in sc.head.iter_mut().zip(sc.fb.chunks_exact(QK)) {
        *h = row[j];
    }
    // Predecessors of state 4p + b are p + t·q, t = 0..4; strict `<` in t order keeps the
    // lowest t on ties, as the reference does.
    for b in 0..4 {
        let dcb = &sc.dcb[b * q..(b + 1) * q];
        let best = &mut sc.best[b * q..(b + 1) * q];
        let bt = &mut sc.bt[b * q..(b + 1) * q];
        let bz = &mut sc.bz[b * q..(b + 1) * q];
        for t in 0..4 {
            let hd = &sc.head[t * q..(t + 1) * q];
            let co = &sc.cost[t * q..(t + 1) * q];
            for p in 0..q {
                let z = ((xj - hd[p]) - dcb[p]) * ij;
                let c = co[p] + z * z;
                if t == 0 || c < best[p] {
                    best[p] = c;
                    bt[p] = t as u8;
                    bz[p] = z;
                }
            }
        }
    }
    let bp = &mut sc.bp[j * ns..(j + 1) * ns];
    let cols = j + 1..QK;
    let uj = &uj[cols.clone()];
    for p in 0..q {
        for b in 0..4 {
            let s2 = 4 * p + b;
            let (t, z) = (sc.bt[b * q + p], sc.bz[b * q + p]);
            sc.next[s2] = sc.best[b * q + p];
            bp[s2] = t;
            let src = p + t as usize * q;
            let src = &sc.fb[src * QK..(src + 1) * QK][cols.clone()];
            let dst = &mut sc.nfb[s2 * QK..(s2 + 1) * QK][cols.clone()];
            for ((d, &f), &u) in dst.iter_mut().zip(src).zip(uj) {
                *d = f + z * u;
            }
        }
    }
}

/// Work space of [`viterbi_beam`].
#[derive(Default)]
pub(crate) struct BeamScratch {
    /// Survivors: state, cost, feedback row (stride `QK`, absolute columns).
    st: Vec<u32>,
    cost: Vec<f32>,
    fb: Vec<f32>,
    nst: Vec<u32>,
    ncost: Vec<f32>,
    nfb: Vec<f32>,
    /// Per step, per kept survivor: index of its parent in the step before.
    par: Vec<u16>,
    /// Per step, per kept survivor: its state.
    hst: Vec<u16>,
    /// Per candidate (survivor `i`, successor code `b` at `4i + b`): cost, `z`, parent survivor.
    cc: Vec<f32>,
    zz: Vec<f32>,
    cp: Vec<u16>,
    /// Survivors merged into another of their group this step.
    dead: Vec<bool>,
    /// Per predecessor group (state `& 1023`: survivors with the same successors): the first
    /// survivor of the group this step, valid where `gmark` is the step number.
    gmark: Vec<u32>,
    gidx: Vec<u16>,
    keys: Vec<u64>,
}

/// [`viterbi_psp`] restricted to the `k` best paths per step (beam search, ties broken by
/// state): each survivor carries its whole feedback, candidates reaching the same state merge
/// as in the full search (lowest cost, then lowest predecessor top code), the `k` of lowest
/// (cost, state) go on. `k ≥ 4096` is the full search, path for path.
pub(crate) fn viterbi_beam(
    x: &[f32],
    ub: &[f64],
    dc: &[f32],
    top: u32,
    k: usize,
    bs: &mut BeamScratch,
    codes: &mut [u8],
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above); the body is safe code.
        return unsafe { viterbi_beam_avx2(x, ub, dc, top, k, bs, codes) };
    }
    viterbi_beam_body(x, ub, dc, top, k, bs, codes)
}

/// [`viterbi_beam`] compiled for AVX2 (wider vectors for the same operations: the same bits; a test
/// holds it to the baseline build).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn viterbi_beam_avx2(
    x: &[f32],
    ub: &[f64],
    dc: &[f32],
    top: u32,
    k: usize,
    bs: &mut BeamScratch,
    codes: &mut [u8],
) -> f32 {
    viterbi_beam_body(x, ub, dc, top, k, bs, codes)
}

/// The search itself (both builds). Candidates are laid out per survivor (its four successors
/// are the four consecutive states `4·(s & 1023) + b`, so their scaled code values are one
/// contiguous load); survivors whose successors coincide (same `s & 1023`, at most four) are
/// found through a 1024-entry group table and merged lane by lane, lowest (cost, predecessor
/// top code) first, as the full search merges. Then the `k` of lowest (cost, state) go on. The
/// codes and metric are those of the definition (`viterbi_beam_ref` in the tests) bit for bit:
/// the same candidates, the same arithmetic per candidate, the same merge and selection order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn viterbi_beam_body(
    x: &[f32],
    ub: &[f64],
    dc: &[f32],
    top: u32,
    k: usize,
    bs: &mut BeamScratch,
    codes: &mut [u8],
) -> f32 {
    let ns = 1usize << L;
    let gmask = (ns / 4 - 1) as u32;
    let lowmask = (1u32 << (L - 2)) - 1;
    let k = k.clamp(4, ns);
    let uf: Vec<f32> = ub.iter().map(|&v| v as f32).collect();
    let inv: [f32; QK] = std::array::from_fn(|j| (1.0 / ub[j * QK + j]) as f32);
    bs.st.clear();
    bs.cost.clear();
    bs.fb.clear();
    bs.par.clear();
    bs.par.resize(QK * k, 0);
    bs.hst.clear();
    bs.hst.resize(QK * k, 0);
    bs.gmark.clear();
    bs.gmark.resize(ns / 4, u32::MAX);
    bs.gidx.resize(ns / 4, 0);
    for b in 0..4u32 {
        let s = top << 2 | b;
        let z = (x[0] - dc[s as usize]) * inv[0];
        bs.hst[b as usize] = s as u16;
        bs.st.push(s);
        bs.cost.push(z * z);
        bs.fb.push(0.0);
        bs.fb.extend(uf[1..QK].iter().map(|&u| z * u));
    }
    for j in 1..QK {
        let (xj, ij) = (x[j], inv[j]);
        let m = bs.st.len();
        bs.cc.resize(4 * m, 0.0);
        bs.zz.resize(4 * m, 0.0);
        bs.cp.resize(4 * m, 0);
        bs.dead.clear();
        bs.dead.resize(m, false);
        // Every candidate's cost (branch-free, four lanes per survivor).
        for (i, ((&s, &c), (cc, zz))) in bs
            .st
            .iter()
            .zip(&bs.cost)
            .zip(bs.cc.chunks_exact_mut(4).zip(bs.zz.chunks_exact_mut(4)))
            .enumerate()
        {
            let tj = xj - bs.fb[i * QK + j];
            let base = 4 * (s & gmask) as usize;
            let d4 = &dc[base..base + 4];
            for b in 0..4 {
                let z = (tj - d4[b]) * ij;
                zz[b] = z;
                cc[b] = c + z * z;
            }
        }
        for (i, cp) in bs.cp.chunks_exact_mut(4).enumerate() {
            cp.fill(i as u16);
        }
        // Merge survivors with the same successors (rare: at most four per group).
        for i in 0..m {
            let g = (bs.st[i] & gmask) as usize;
            if bs.gmark[g] != j as u32 {
                bs.gmark[g] = j as u32;
                bs.gidx[g] = i as u16;
                continue;
            }
            let i0 = bs.gidx[g] as usize;
            let ti = bs.st[i] >> (L - 2);
            for b in 0..4 {
                let (ci, c0) = (bs.cc[4 * i + b], bs.cc[4 * i0 + b]);
                let th = bs.st[bs.cp[4 * i0 + b] as usize] >> (L - 2);
                if ci < c0 || (ci == c0 && ti < th) {
                    bs.cc[4 * i0 + b] = ci;
                    bs.zz[4 * i0 + b] = bs.zz[4 * i + b];
                    bs.cp[4 * i0 + b] = i as u16;
                }
            }
            bs.dead[i] = true;
        }
        // Lanes that cannot go on are NaN (dropped below): merged survivors' and, in the
        // last five steps, the codes other than the wrap's (only paths that can end on it go on).
        let only = (j + 5 >= QK).then(|| (top >> (2 * (QK - 1 - j))) & 3);
        for (cc, &dead) in bs.cc.chunks_exact_mut(4).zip(&bs.dead) {
            for (b, c) in cc.iter_mut().enumerate() {
                if dead || only.is_some_and(|w| w != b as u32) {
                    *c = f32::NAN;
                }
            }
        }
        // (cost, state, candidate) as one integer: costs are ≥ 0 (or +inf), whose bits order as
        // the values do; states are distinct, so the candidate index never decides.
        bs.keys.clear();
        for (i, (cc, &s)) in bs.cc.chunks_exact(4).zip(&bs.st).enumerate() {
            let s0 = (s & gmask) << 2;
            for (b, &c) in cc.iter().enumerate() {
                if !c.is_nan() {
                    bs.keys.push(
                        (c.to_bits() as u64) << 32
                            | ((s0 | b as u32) as u64) << 14
                            | (4 * i + b) as u64,
                    );
                }
            }
        }
        if bs.keys.len() > k {
            bs.keys.select_nth_unstable(k - 1);
            bs.keys.truncate(k);
        }
        bs.nst.clear();
        bs.ncost.clear();
        // Rows hold columns > j only (the rest is stale and never read).
        if bs.nfb.len() < k * QK {
            bs.nfb.resize(k * QK, 0.0);
        }
        let uj = &uf[j * QK + j + 1..(j + 1) * QK];
        for (n, &key) in bs.keys.iter().enumerate() {
            let c = (key & 0x3fff) as usize;
            let s2 = ((key >> 14) as u32) & (ns as u32 - 1);
            let (i, z) = (bs.cp[c] as usize, bs.zz[c]);
            bs.nst.push(s2);
            bs.ncost.push(bs.cc[c]);
            bs.par[j * k + n] = i as u16;
            bs.hst[j * k + n] = s2 as u16;
            let src = &bs.fb[i * QK + j + 1..(i + 1) * QK];
            let dst = &mut bs.nfb[n * QK + j + 1..(n + 1) * QK];
            for ((d, &f), &u) in dst.iter_mut().zip(src).zip(uj) {
                *d = f + z * u;
            }
        }
        std::mem::swap(&mut bs.st, &mut bs.nst);
        std::mem::swap(&mut bs.cost, &mut bs.ncost);
        std::mem::swap(&mut bs.fb, &mut bs.nfb);
    }
    let mut best = (f32::INFINITY, u32::MAX, 0usize);
    for (i, (&s, &c)) in bs.st.iter().zip(&bs.cost).enumerate() {
        if (s & lowmask) == top && (c < best.0 || (c == best.0 && s < best.1)) {
            best = (c, s, i);
        }
    }
    if best.1 == u32::MAX {
        // No survivor ends on the wrap (the beam dropped them all): signal "no candidate".
        return f32::INFINITY;
    }
    let mut i = best.2;
    for j in (0..QK).rev() {
        codes[j] = (bs.hst[j * k + i] & 3) as u8;
        i = bs.par[j * k + i] as usize;
    }
    best.0
}

/// Best final state of a wrapped search (lowest index on ties) and the trace back to its codes
/// (back pointers per step and successor state).
fn psp_trace(cost: &[f32], bp: &[u8], top: u32, codes: &mut [u8]) -> f32 {
    let ns = cost.len();
    let lowmask = (1u32 << (L - 2)) - 1;
    let mut best = (f32::INFINITY, 0u32);
    for (s, &c) in cost.iter().enumerate() {
        if (s as u32 & lowmask) == top && c < best.0 {
            best = (c, s as u32);
        }
    }
    let mut s = best.1;
    for j in (0..QK).rev() {
        codes[j] = (s & 3) as u8;
        if j > 0 {
            s = (s >> 2) | ((bp[j * ns + s as usize] as u32) << (L - 2));
        }
    }
    best.0
}

/// The definition of [`viterbi_psp`]: state by state, each path's feedback kept as the vector of
/// its pending corrections to the columns after the current one.
#[cfg(test)]
pub(crate) fn viterbi_psp_ref(
    x: &[f32],
    ub: &[f64],
    dc: &[f32],
    top: u32,
    codes: &mut [u8],
) -> f32 {
    let (n, ns) = (QK, 1usize << L);
    let q = ns / 4;
    let w = n - 1;
    // uw[j][k] = U_{j, j+1+k} (0 past the block), inv[j] = 1 / U_jj.
    let mut uw = vec![0f32; n * w];
    let mut inv = [0f32; QK];
    for j in 0..n {
        inv[j] = (1.0 / ub[j * QK + j]) as f32;
        for k in 0..n - 1 - j {
            uw[j * w + k] = ub[j * QK + j + 1 + k] as f32;
        }
    }
    let mut cost = vec![f32::INFINITY; ns];
    let mut fb = vec![0f32; ns * w];
    for s in 0..ns {
        if (s >> 2) as u32 == top {
            let z = (x[0] - dc[s]) * inv[0];
            cost[s] = z * z;
            for k in 0..w {
                fb[s * w + k] = z * uw[k];
            }
        }
    }
    let mut bp = vec![0u8; n * ns];
    for j in 1..n {
        let mut next = vec![0f32; ns];
        let mut nfb = vec![0f32; ns * w];
        for s2 in 0..ns {
            let (mut best, mut bt, mut bz) = (f32::INFINITY, 0usize, 0f32);
            for t in 0..4 {
                let pr = (s2 >> 2) + t * q;
                let tj = x[j] - fb[pr * w];
                let z = (tj - dc[s2]) * inv[j];
                let c = cost[pr] + z * z;
                if t == 0 || c < best {
                    (best, bt, bz) = (c, t, z);
                }
            }
            next[s2] = best;
            bp[j * ns + s2] = bt as u8;
            let pr = (s2 >> 2) + bt * q;
            for k in 0..w - 1 {
                nfb[s2 * w + k] = fb[pr * w + k + 1] + bz * uw[j * w + k];
            }
        }
        cost = next;
        fb = nfb;
    }
    psp_trace(&cost, &bp, top, codes)
}

/// The wrap codes of a block (its last five codes, as `tq2t::Ends::Wrap` reads them).
pub(super) fn wrap_of(codes: &[u8]) -> u32 {
    (1..(L / 2) as usize).fold(0u32, |top, t| top | (codes[QK - t] as u32) << (2 * (t - 1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::splitmix::SplitMix64;
    use crate::types::tq2t::{encode_block, scale_of, Scratch, Settings};

    use crate::math::splitmix::gauss_f32 as gauss;

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
        // V = U⁻¹ by back substitution, A = V Vᵀ.
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

    /// Work space of [`viterbi_beam_ref`].
    #[derive(Default)]
    struct RefScratch {
        /// Survivors: state, cost, feedback row (stride `QK`, absolute columns).
        st: Vec<u32>,
        cost: Vec<f32>,
        fb: Vec<f32>,
        nst: Vec<u32>,
        ncost: Vec<f32>,
        nfb: Vec<f32>,
        /// Per step, per kept survivor: index of its parent in the step before.
        par: Vec<u16>,
        /// Per step, per kept survivor: its state.
        hst: Vec<u16>,
        /// Per state: best candidate of this step (cost, top code of its predecessor, parent, z),
        /// valid where `mark` is the step number.
        slot: Vec<(f32, u8, u16, f32)>,
        mark: Vec<u32>,
        cand: Vec<u32>,
        keys: Vec<u64>,
    }

    /// The definition of [`viterbi_beam`] (the beam before its candidate layout: a 4096-entry
    /// slot table per state, candidates merged as they arrive).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn viterbi_beam_ref(
        x: &[f32],
        ub: &[f64],
        dc: &[f32],
        top: u32,
        k: usize,
        bs: &mut RefScratch,
        codes: &mut [u8],
    ) -> f32 {
        let ns = 1usize << L;
        let mask = ns as u32 - 1;
        let lowmask = (1u32 << (L - 2)) - 1;
        let k = k.clamp(4, ns);
        let uf: Vec<f32> = ub.iter().map(|&v| v as f32).collect();
        let inv: [f32; QK] = std::array::from_fn(|j| (1.0 / ub[j * QK + j]) as f32);
        bs.st.clear();
        bs.cost.clear();
        bs.fb.clear();
        bs.par.clear();
        bs.par.resize(QK * k, 0);
        bs.hst.clear();
        bs.hst.resize(QK * k, 0);
        bs.slot.resize(ns, (0.0, 0, 0, 0.0));
        bs.mark.clear();
        bs.mark.resize(ns, u32::MAX);
        for b in 0..4u32 {
            let s = top << 2 | b;
            let z = (x[0] - dc[s as usize]) * inv[0];
            bs.hst[b as usize] = s as u16;
            bs.st.push(s);
            bs.cost.push(z * z);
            bs.fb.push(0.0);
            bs.fb.extend(uf[1..QK].iter().map(|&u| z * u));
        }
        for j in 1..QK {
            let (xj, ij) = (x[j], inv[j]);
            bs.cand.clear();
            for (i, (&s, &c)) in bs.st.iter().zip(&bs.cost).enumerate() {
                let tj = xj - bs.fb[i * QK + j];
                let t = (s >> (L - 2)) as u8;
                for b in 0..4u32 {
                    // The last five codes are the wrap's: only paths that can end on it go on.
                    if j + 5 >= QK && b != (top >> (2 * (QK - 1 - j))) & 3 {
                        continue;
                    }
                    let s2 = ((s << 2) | b) & mask;
                    let z = (tj - dc[s2 as usize]) * ij;
                    let c2 = c + z * z;
                    let sl = &mut bs.slot[s2 as usize];
                    if bs.mark[s2 as usize] != j as u32 {
                        bs.mark[s2 as usize] = j as u32;
                        *sl = (c2, t, i as u16, z);
                        bs.cand.push(s2);
                    } else if c2 < sl.0 || (c2 == sl.0 && t < sl.1) {
                        *sl = (c2, t, i as u16, z);
                    }
                }
            }
            if bs.cand.len() > k {
                // (cost, state) as one integer: costs are ≥ 0 (or +inf), whose bits order as the
                // values do. The order of the kept ones does not matter (merges break ties by `t`).
                bs.keys.clear();
                let slot = &bs.slot;
                bs.keys.extend(
                    bs.cand
                        .iter()
                        .map(|&s| (slot[s as usize].0.to_bits() as u64) << 32 | s as u64),
                );
                bs.keys.select_nth_unstable(k - 1);
                bs.cand.clear();
                bs.cand.extend(bs.keys[..k].iter().map(|&v| v as u32));
            }
            bs.nst.clear();
            bs.ncost.clear();
            // Rows hold columns > j only (the rest is stale and never read).
            if bs.nfb.len() < k * QK {
                bs.nfb.resize(k * QK, 0.0);
            }
            let uj = &uf[j * QK + j + 1..(j + 1) * QK];
            for (n, &s2) in bs.cand.iter().enumerate() {
                let (c2, _, i, z) = bs.slot[s2 as usize];
                bs.nst.push(s2);
                bs.ncost.push(c2);
                bs.par[j * k + n] = i;
                bs.hst[j * k + n] = s2 as u16;
                let src = &bs.fb[i as usize * QK + j + 1..(i as usize + 1) * QK];
                let dst = &mut bs.nfb[n * QK + j + 1..(n + 1) * QK];
                for ((d, &f), &u) in dst.iter_mut().zip(src).zip(uj) {
                    *d = f + z * u;
                }
            }
            std::mem::swap(&mut bs.st, &mut bs.nst);
            std::mem::swap(&mut bs.cost, &mut bs.ncost);
            std::mem::swap(&mut bs.fb, &mut bs.nfb);
        }
        let mut best = (f32::INFINITY, u32::MAX, 0usize);
        for (i, (&s, &c)) in bs.st.iter().zip(&bs.cost).enumerate() {
            if (s & lowmask) == top && (c < best.0 || (c == best.0 && s < best.1)) {
                best = (c, s, i);
            }
        }
        if best.1 == u32::MAX {
            // No survivor ends on the wrap (the beam dropped them all): signal "no candidate".
            return f32::INFINITY;
        }
        let mut i = best.2;
        for j in (0..QK).rev() {
            codes[j] = (bs.hst[j * k + i] & 3) as u8;
            i = bs.par[j * k + i] as usize;
        }
        best.0
    }

    /// The beam with its per-survivor candidate layout and group merge is its definition bit for
    /// bit (codes and metric) at every width, on random blocks and on blocks full of exact ties
    /// (a codebook and targets on a half-integer grid, `U = I`: many equal costs and merges).
    #[test]
    fn beam_equals_reference() {
        let cb = format_codebook();
        let mut bs = BeamScratch::default();
        let mut rs = RefScratch::default();
        let mut eye = vec![0f64; QK * QK];
        (0..QK).for_each(|i| eye[i * QK + i] = 1.0);
        let mut cases = 0;
        for seed in 0..6u64 {
            let tie = seed >= 4;
            let (u, _) = upper_and_form(700 + seed);
            let u = if tie { eye.clone() } else { u };
            let mut xf = gauss(QK, 800 + seed);
            let d = 0.5 + 0.1 * seed as f32;
            let mut dc: Vec<f32> = cb.iter().map(|&c| d * c).collect();
            if tie {
                dc.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0);
                xf.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0);
            }
            for top in [0u32, 1023, (seed as u32 * 401) & 1023] {
                for k in [4, 16, 128, 300, 1 << L] {
                    let (mut c1, mut c2) = ([0u8; QK], [0u8; QK]);
                    let m1 = viterbi_beam(&xf, &u, &dc, top, k, &mut bs, &mut c1);
                    let m2 = viterbi_beam_ref(&xf, &u, &dc, top, k, &mut rs, &mut c2);
                    assert_eq!(
                        (c1, m1.to_bits()),
                        (c2, m2.to_bits()),
                        "seed {seed} top {top} k {k}"
                    );
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 6 * 3 * 5);
    }

    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn beam_ref_avx2(
        x: &[f32],
        ub: &[f64],
        dc: &[f32],
        top: u32,
        k: usize,
        bs: &mut RefScratch,
        codes: &mut [u8],
    ) -> f32 {
        viterbi_beam_ref(x, ub, dc, top, k, bs, codes)
    }

    /// Timing (not CI): the beam against its definition on the same blocks, alternated, thread
    /// CPU per call. `TQ_BEAM_K` (default 128).
    /// `cargo test --release --lib beam_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn beam_speed() {
        let k: usize = std::env::var("TQ_BEAM_K").map_or(128, |v| v.parse().unwrap());
        let cb = format_codebook();
        let blocks: Vec<_> = (0..20u64)
            .map(|s| {
                let (u, _) = upper_and_form(900 + s);
                let dc: Vec<f32> = cb.iter().map(|&c| 0.6 * c).collect();
                (u, gauss(QK, 950 + s), dc, (s as u32 * 97) & 1023)
            })
            .collect();
        let mut bs = BeamScratch::default();
        let mut rs = RefScratch::default();
        let mut c = [0u8; QK];
        for round in 0..3 {
            for new in [false, true] {
                let t0 = crate::quant::ldlq::prof::thread_cpu_ns() as f64 * 1e-9;
                for _ in 0..10 {
                    for (u, x, dc, top) in &blocks {
                        if new {
                            viterbi_beam(x, u, dc, *top, k, &mut bs, &mut c);
                        } else {
                            // SAFETY: timing only on AVX2 machines (the old beam's dispatch).
                            unsafe { beam_ref_avx2(x, u, dc, *top, k, &mut rs, &mut c) };
                        }
                    }
                }
                let us =
                    (crate::quant::ldlq::prof::thread_cpu_ns() as f64 * 1e-9 - t0) * 1e6 / 200.0;
                eprintln!(
                    "round {round} k {k} {}: {us:.1} µs per block",
                    ["reference", "new"][new as usize]
                );
            }
        }
    }

    /// The AVX2 build of the beam search gives the baseline build's codes and metric bit for
    /// bit, at the format's beam and a narrow one.
    #[test]
    fn beam_avx2_build_equals_baseline_build() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let cb = format_codebook();
            for seed in 0..4u64 {
                let (u, _) = upper_and_form(500 + seed);
                let xf = gauss(QK, 600 + seed);
                let dc: Vec<f32> = cb.iter().map(|&c| (0.6 + 0.1 * seed as f32) * c).collect();
                let top = (seed as u32 * 337) & 1023;
                for k in [16, 128] {
                    let (mut c1, mut c2) = ([0u8; QK], [0u8; QK]);
                    let mut bs = BeamScratch::default();
                    let m1 = viterbi_beam_body(&xf, &u, &dc, top, k, &mut bs, &mut c1);
                    // SAFETY: AVX2 checked above.
                    let m2 = unsafe { viterbi_beam_avx2(&xf, &u, &dc, top, k, &mut bs, &mut c2) };
                    assert_eq!((c1, m1.to_bits()), (c2, m2.to_bits()), "seed {seed} k {k}");
                }
            }
        } else {
            eprintln!("NOT RUN: beam_avx2_build_equals_baseline_build: the CPU has no AVX2");
        }
    }

    /// The per-survivor search equals its definition bit for bit (codes and metric), its metric
    /// is the block's quadratic form of its codes (an independent computation: `rᵀ (UᵀU)⁻¹ r`),
    /// and it keeps the wrap it was given.
    #[test]
    fn psp_viterbi_equals_reference_and_charges_the_form() {
        let cb = format_codebook();
        let mut sc = Scratch::new(L, QK);
        let mut ps = PspScratch::new(1, 0);
        for seed in 0..3u64 {
            let (u, a) = upper_and_form(300 + seed);
            let xf = gauss(QK, 400 + seed);
            let x: Vec<f64> = xf.iter().map(|&v| v as f64).collect();
            let (mut codes, mut y) = ([0u8; QK], [0f32; QK]);
            let (e, _) = encode_block(&xf, cb, Settings::FORMAT, true, &mut sc, &mut codes, &mut y);
            let d = scale_of(e);
            let dc: Vec<f32> = cb.iter().map(|&c| d * c).collect();
            let top = wrap_of(&codes);
            let (mut c1, mut c2) = ([0u8; QK], [0u8; QK]);
            let m1 = viterbi_psp(&xf, &u, &dc, top, &mut ps, &mut c1);
            let m2 = viterbi_psp_ref(&xf, &u, &dc, top, &mut c2);
            assert_eq!(c1, c2, "seed {seed}");
            assert_eq!(m1.to_bits(), m2.to_bits(), "seed {seed}");
            // A beam as wide as the trellis is the full search, path for path.
            let mut c3 = [0u8; QK];
            let m3 = viterbi_beam(
                &xf,
                &u,
                &dc,
                top,
                1 << L,
                &mut BeamScratch::default(),
                &mut c3,
            );
            assert_eq!((c3, m3.to_bits()), (c1, m1.to_bits()), "seed {seed}");
            // A narrow beam still ends on the wrap and charges the form.
            let m4 = viterbi_beam(&xf, &u, &dc, top, 64, &mut BeamScratch::default(), &mut c3);
            assert_eq!(wrap_of(&c3), top);
            let e4 = quad_cost(&x, &a, d, &c3);
            assert!(
                (m4 as f64 - e4).abs() <= 1e-4 * e4,
                "seed {seed}: {m4} vs {e4}"
            );
            assert_eq!(wrap_of(&c1), top);
            let exact = quad_cost(&x, &a, d, &c1);
            assert!(
                (m1 as f64 - exact).abs() <= 1e-4 * exact,
                "seed {seed}: metric {m1} vs form {exact}"
            );
            // It searches the form the plain search ignores: lower on it.
            assert!(exact < quad_cost(&x, &a, d, &codes), "seed {seed}");
        }
    }
}
