//! `--target-bpw` / `--target-size`: one type per tensor (or per group of tensors that must
//! share a type) chosen to minimize the predicted output error under a byte budget.
//!
//! The choice is an exact multiple-choice knapsack solved by dynamic programming over a byte
//! grid: each item's bytes above its cheapest option are rounded *up* to whole grid cells, so a
//! solution is always within the budget, and it is optimal for the rounded sizes. The bytes
//! given away by rounding are at most `items × (grid − 1)` (reported as `slack`). The DP is one
//! thread, with ties broken by the first option in the caller's order: the plan does not depend
//! on the thread count.

use super::{fits, row_len, Plan, PlanEntry};

mod measure;
use crate::arch::{attention_group, classify, Role};
use crate::error::{Error, Result};
use crate::types::profile::Profile;
use crate::types::TensorType;
pub use measure::{
    has_weights, measure, Calibration, ExactBlocks, Measurer, Table, CHUNK, EXACT_BLOCKS, NARROW,
    WIDE,
};

/// Default number of grid cells the budget above the cheapest mix is divided into.
pub const GRID_CELLS: u64 = 1 << 18;

/// The DP's answer: one option index per item.
#[derive(Clone, Debug, PartialEq)]
pub struct Solution {
    pub choice: Vec<usize>,
    pub bytes: u64,
    pub cost: f64,
    /// Bytes per grid cell.
    pub grid: u64,
    /// Worst-case bytes lost to rounding sizes up to the grid: `items × (grid − 1)`.
    pub slack: u64,
}

/// The cheapest bytes of `items` (each item's smallest option); `u64::MAX` when that does not
/// fit in 64 bits (never within a budget).
pub fn min_bytes(items: &[Vec<(u64, f64)>]) -> u64 {
    items
        .iter()
        .map(|o| o.iter().map(|x| x.0).min().unwrap_or(0))
        .fold(0u64, u64::saturating_add)
}

/// Minimize `Σ cost` subject to `Σ bytes ≤ budget`, one option `(bytes, cost)` per item, with the
/// budget above the cheapest mix split into at most `cells` grid cells. `None`: even the cheapest
/// mix is over the budget (or an item has no option). A cost that is not a number counts as
/// infinite (an option never preferred); at most 255 options per item.
pub fn solve(items: &[Vec<(u64, f64)>], budget: u64, cells: u64) -> Option<Solution> {
    if items.iter().any(|o| o.is_empty()) {
        return None;
    }
    let base = min_bytes(items);
    if base > budget || base == u64::MAX {
        return None;
    }
    let room = budget - base;
    let grid = room.div_ceil(cells.max(1)).max(1);
    let cap = (room / grid) as usize;
    // Cells of each option above its item's cheapest (rounded up: never over the budget).
    let w: Vec<Vec<usize>> = items
        .iter()
        .map(|o| {
            let lo = o.iter().map(|x| x.0).min().unwrap_or(0);
            o.iter()
                .map(|x| ((x.0 - lo).div_ceil(grid)).min(cap as u64 + 1) as usize)
                .collect()
        })
        .collect();
    // dp[c]: least cost of the items so far in at most c cells.
    let mut dp = vec![0f64; cap + 1];
    let mut next = vec![f64::INFINITY; cap + 1];
    let mut pick: Vec<Vec<u8>> = Vec::with_capacity(items.len());
    for (o, wo) in items.iter().zip(&w) {
        assert!(o.len() <= 255, "at most 255 options per item");
        let mut p = vec![u8::MAX; cap + 1];
        next.fill(f64::INFINITY);
        for (k, (&(_, cost), &wk)) in o.iter().zip(wo).enumerate() {
            if wk > cap {
                continue;
            }
            let cost = if cost.is_nan() { f64::INFINITY } else { cost };
            for c in wk..=cap {
                let v = dp[c - wk] + cost;
                // The first option that fits is taken even at an infinite cost: every cell
                // gets a pick (the cheapest option always fits, in 0 cells).
                if v < next[c] || p[c] == u8::MAX {
                    next[c] = v;
                    p[c] = k as u8;
                }
            }
        }
        std::mem::swap(&mut dp, &mut next);
        pick.push(p);
    }
    // dp is non-increasing in c (at most c cells), so the whole budget is the best.
    let mut c = cap;
    let mut choice = vec![0usize; items.len()];
    for i in (0..items.len()).rev() {
        let k = pick[i][c] as usize;
        choice[i] = k;
        c -= w[i][k];
    }
    let bytes = items.iter().zip(&choice).map(|(o, &k)| o[k].0).sum();
    let cost = items.iter().zip(&choice).map(|(o, &k)| o[k].1).sum();
    Some(Solution {
        choice,
        bytes,
        cost,
        grid,
        slack: (items.len() as u64).saturating_mul(grid - 1),
    })
}

/// The stock and TQ types tq can write that `profile` loads: the default candidates of a mix
/// (`--types` replaces them). Stock only for an engine without TQ weights (`upstream`). iq4_nl's
/// 32-value blocks fit rows that no k-quant or iq4_xs fits (SmolLM2's 576 columns) at 4.5 bpw.
/// The i-quants below 4 bpw (iq1_s 1.56 … iq3_s 3.44) take rows of 256-value superblocks, as
/// the k-quants do ([`candidates_for`] drops them elsewhere): with them a 4096-wide model reaches
/// the 2–3 bpw of llama.cpp's IQ1/IQ2/IQ3 presets. q4_1 and q5_1 (legacy, with a per-block
/// minimum) rarely win per byte, but they are llama.cpp presets, and a model published from such
/// a file re-hits its source grid with them; without them a preset's own plan could not be
/// improved by the knapsack (`best::upgrade` keeps a type that is not a candidate).
pub fn default_candidates(profile: &Profile) -> Vec<TensorType> {
    use TensorType::*;
    let mut v = vec![
        IQ1S, IQ1M, IQ2XXS, IQ2XS, IQ2S, Q2K, IQ3XXS, IQ3S, Q3K, IQ4XS, Q4_0, Q4_1, IQ4NL, Q4K,
        Q5_0, Q5_1, Q5K, Q6K, Q8_0, F16,
    ];
    if profile.tq_weights {
        v.extend([TQ3_1S, TQ4_1S]);
    }
    v.retain(|t| profile.id_of(*t).is_some());
    v
}

/// Parse `--types a,b,c`; a type the target engine cannot load, or tq cannot write, is a usage
/// error naming it.
pub fn parse_types(list: &str, profile: &Profile) -> Result<Vec<TensorType>> {
    let mut v = vec![];
    for s in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let t = TensorType::parse(s).map_err(|e| Error::Usage(format!("--types: {e}")))?;
        if profile.id_of(t).is_none() {
            return Err(Error::Usage(format!(
                "--types: type {t} does not load in target profile '{}'; choose another --target or drop it",
                profile.name
            )));
        }
        if t.info().quantize.is_none() {
            return Err(Error::Usage(format!(
                "--types: tq cannot write type {t}; drop it"
            )));
        }
        if !v.contains(&t) {
            v.push(t);
        }
    }
    if v.is_empty() {
        return Err(Error::Usage("--types: give at least one type".into()));
    }
    Ok(v)
}

/// The candidates a tensor can take: its row holds whole blocks, a token embedding is never a
/// TQ or row-rotated type (the fork's get_rows lacks them), and the source can be decoded.
pub fn candidates_for(e: &PlanEntry, types: &[TensorType]) -> Vec<TensorType> {
    let row = row_len(&e.dims);
    let embd = classify(&e.name).0 == Role::TokenEmbd;
    types
        .iter()
        .copied()
        .filter(|&t| fits(t, row))
        .filter(|&t| !(embd && (t.is_tq_weight() || t.rotates_rows())))
        .filter(|&t| t == e.src || e.src.info().dequantize.is_some())
        .collect()
}

/// Plan entries the mix chooses a type for: the matrices (2-D or more) tq can decode. Vectors
/// (norms, biases) and MoE routers (as llama-quantize) keep the planner's f32.
pub fn mixable(e: &PlanEntry) -> bool {
    e.dims.iter().filter(|&&d| d > 1).count() >= 2
        && e.src.info().dequantize.is_some()
        && classify(&e.name).0 != Role::Router
}

/// The mix's items: plan entry indices chosen together, and the types each may take. Under a
/// profile with [`Profile::unify_attention_tq`] (the fork's) a layer's attention q/k/v/o are one
/// item: the fork's Metal kernels for TQ weights rotate the shared activation in place, so a
/// group holding a TQ type must be all that type ([`assignments`]); without it (upstream) every
/// tensor is its own item.
pub fn items(
    plan: &Plan,
    types: &[TensorType],
    profile: &Profile,
) -> Vec<(Vec<usize>, Vec<TensorType>)> {
    let mut out: Vec<(Vec<usize>, Vec<TensorType>)> = vec![];
    let mut group_of: std::collections::BTreeMap<u32, usize> = Default::default();
    for (i, e) in plan.entries.iter().enumerate() {
        if !mixable(e) {
            continue;
        }
        let c = candidates_for(e, types);
        let grp = profile
            .unify_attention_tq
            .then(|| attention_group(&e.name))
            .flatten();
        match grp.and_then(|g| group_of.get(&g).copied()) {
            Some(k) => {
                out[k].0.push(i);
                out[k].1.retain(|t| c.contains(t));
            }
            None => {
                if let Some(g) = grp {
                    group_of.insert(g, out.len());
                }
                out.push((vec![i], c));
            }
        }
    }
    out
}

/// The assignments an item of `members` tensors may take, each one index into `tys` per member:
/// every member the same type, and for a group also every combination of types none of which is
/// a TQ weight type (those rotate the activation in place on the fork's Metal backend, so their
/// group must share one type; stock types have no such constraint).
pub fn assignments(tys: &[TensorType], members: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = (0..tys.len()).map(|k| vec![k; members]).collect();
    let free: Vec<usize> = (0..tys.len()).filter(|&k| !tys[k].is_tq_weight()).collect();
    if members < 2 || free.len() < 2 {
        return out;
    }
    let mut pos = vec![0usize; members];
    loop {
        let pick: Vec<usize> = pos.iter().map(|&p| free[p]).collect();
        if pick.iter().any(|&k| k != pick[0]) {
            out.push(pick);
        }
        let mut m = 0;
        loop {
            if m == members {
                return out;
            }
            pos[m] += 1;
            if pos[m] < free.len() {
                break;
            }
            pos[m] = 0;
            m += 1;
        }
    }
}

/// One option of an item: its bytes, its cost and the type (index into the item's types) of
/// each member.
#[derive(Clone, Debug, PartialEq)]
pub struct Opt {
    pub bytes: u64,
    pub cost: f64,
    pub pick: Vec<usize>,
}

/// The most options an item keeps (the DP stores one byte per cell for the pick).
const MAX_OPTIONS: usize = 255;

/// The options worth keeping: sorted by bytes, each strictly cheaper in cost than every smaller
/// one (the rest can never be chosen by a minimum-cost knapsack), thinned evenly to at most
/// [`MAX_OPTIONS`] with both ends kept. Deterministic: ties go to the first in `v`'s order.
pub fn pareto(v: Vec<Opt>) -> Vec<Opt> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| {
        v[a].bytes
            .cmp(&v[b].bytes)
            .then(v[a].cost.total_cmp(&v[b].cost))
            .then(a.cmp(&b))
    });
    let mut keep: Vec<usize> = vec![];
    for i in order {
        if keep.last().is_none_or(|&l| v[i].cost < v[l].cost) {
            keep.push(i);
        }
    }
    if keep.len() > MAX_OPTIONS {
        let n = keep.len();
        keep = (0..MAX_OPTIONS)
            .map(|j| keep[j * (n - 1) / (MAX_OPTIONS - 1)])
            .collect();
    }
    keep.into_iter().map(|i| v[i].clone()).collect()
}

/// Set the chosen types on the plan (bytes, action and reasons), as the planner would have:
/// `picks[item][member]` indexes the item's types.
pub fn apply(
    plan: &mut Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    picks: &[&[usize]],
    why: &str,
) -> Result<()> {
    for ((idx, tys), pick) in items.iter().zip(picks) {
        for (&i, &k) in idx.iter().zip(pick.iter()) {
            let e = &mut plan.entries[i];
            e.dst = tys[k];
            e.fallback = false;
            e.reasons = vec![format!("{why}: {}", tys[k])];
            e.action = if e.dst == e.src {
                super::Action::Copy
            } else if e.src.is_float() {
                super::Action::Quantize
            } else {
                super::Action::Requantize
            };
            let n: u64 = e.dims.iter().product();
            e.bytes = e.dst.bytes_for(n).ok_or_else(|| {
                Error::Unsupported(format!("{}: {n} elements do not fit {}", e.name, e.dst))
            })?;
        }
    }
    Ok(())
}

/// A tensor's role for the KLD fit: its name without the block prefix (`attn_v.weight`).
pub fn role_of(name: &str) -> &str {
    match name.strip_prefix("blk.") {
        Some(r) => r.split_once('.').map_or(r, |(_, rest)| rest),
        None => name,
    }
}

/// Each item's options ([`assignments`], Pareto-pruned): the members' bytes and their errors,
/// each times the `alpha` of its tensor, summed. An item with `direct` KLDs (one per type,
/// measured on the whole item) takes one type for all members at that cost.
pub fn options(
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    table: &Table,
    direct: &[Option<Vec<f64>>],
    alpha: &dyn Fn(&str) -> f64,
) -> Vec<Vec<Opt>> {
    items
        .iter()
        .zip(table)
        .zip(direct)
        .map(|(((idx, tys), per), d)| {
            let bytes_of = |i: usize, k: usize| {
                tys[k]
                    .bytes_for(plan.entries[i].dims.iter().product())
                    .unwrap_or(u64::MAX / 64)
            };
            let all = match d {
                Some(d) => (0..tys.len())
                    .map(|k| Opt {
                        bytes: idx.iter().map(|&i| bytes_of(i, k)).sum(),
                        // Not measured (NaN): never taken while another option fits.
                        cost: if d[k].is_nan() { f64::INFINITY } else { d[k] },
                        pick: vec![k; idx.len()],
                    })
                    .collect(),
                None => assignments(tys, idx.len())
                    .into_iter()
                    .map(|pick| Opt {
                        bytes: idx.iter().zip(&pick).map(|(&i, &k)| bytes_of(i, k)).sum(),
                        cost: per
                            .iter()
                            .zip(idx)
                            .zip(&pick)
                            .map(|((m, &i), &k)| alpha(&plan.entries[i].name) * m[k].err)
                            .sum(),
                        pick,
                    })
                    .collect(),
            };
            pareto(all)
        })
        .collect()
}

/// The `(bytes, cost)` pairs [`solve`] takes.
pub fn costs(opts: &[Vec<Opt>]) -> Vec<Vec<(u64, f64)>> {
    opts.iter()
        .map(|o| o.iter().map(|x| (x.bytes, x.cost)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(s: &mut u64) -> u64 {
        *s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *s >> 33
    }

    fn brute(items: &[Vec<(u64, f64)>], budget: u64) -> Option<f64> {
        let mut best: Option<f64> = None;
        let mut idx = vec![0usize; items.len()];
        loop {
            let b: u64 = items.iter().zip(&idx).map(|(o, &k)| o[k].0).sum();
            let c: f64 = items.iter().zip(&idx).map(|(o, &k)| o[k].1).sum();
            if b <= budget && best.is_none_or(|x| c < x) {
                best = Some(c);
            }
            let mut i = 0;
            loop {
                if i == items.len() {
                    return best;
                }
                idx[i] += 1;
                if idx[i] < items[i].len() {
                    break;
                }
                idx[i] = 0;
                i += 1;
            }
        }
    }

    fn random(s: &mut u64, max_bytes: u64) -> Vec<Vec<(u64, f64)>> {
        let n = 2 + lcg(s) as usize % 5;
        (0..n)
            .map(|_| {
                let k = 1 + lcg(s) as usize % 4;
                (0..k)
                    .map(|_| (1 + lcg(s) % max_bytes, (lcg(s) % 1000) as f64 / 7.0))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn dp_is_optimal_against_brute_force() {
        let mut s = 7u64;
        for _ in 0..500 {
            let items = random(&mut s, 40);
            let total: u64 = items
                .iter()
                .map(|o| o.iter().map(|x| x.0).max().unwrap())
                .sum();
            let budget = lcg(&mut s) % (total + 5);
            let want = brute(&items, budget);
            // Cells ≥ bytes: the grid is 1 byte, so the DP is exact.
            let got = solve(&items, budget, 1 << 20);
            match (want, got) {
                (None, None) => {}
                (Some(w), Some(g)) => {
                    assert_eq!(g.grid, 1);
                    assert!(g.bytes <= budget);
                    assert!(
                        (g.cost - w).abs() < 1e-9,
                        "{items:?} budget {budget}: {} vs {w}",
                        g.cost
                    );
                }
                (w, g) => panic!("{items:?} budget {budget}: brute {w:?}, dp {g:?}"),
            }
        }
    }

    #[test]
    fn coarse_grid_stays_in_budget_and_within_slack_of_optimal() {
        let mut s = 11u64;
        for _ in 0..300 {
            let items = random(&mut s, 10_000);
            let total: u64 = items
                .iter()
                .map(|o| o.iter().map(|x| x.0).max().unwrap())
                .sum();
            let budget = min_bytes(&items) + lcg(&mut s) % (total - min_bytes(&items) + 1);
            let g = solve(&items, budget, 16).unwrap();
            assert!(g.bytes <= budget, "over budget");
            // Optimal at the full budget is at least as good; optimal with the slack removed is no better.
            let best = brute(&items, budget).unwrap();
            assert!(g.cost >= best - 1e-9);
            let inner = budget.saturating_sub(g.slack).max(min_bytes(&items));
            if let Some(b) = brute(&items, inner) {
                assert!(
                    g.cost <= b + 1e-9,
                    "worse than the optimum of budget - slack"
                );
            }
        }
    }

    #[test]
    fn assignments_share_only_tq_types() {
        use TensorType::*;
        let tys = [Q4_0, TQ4_1S, Q8_0];
        // One member: one option per type.
        assert_eq!(assignments(&tys, 1), vec![vec![0], vec![1], vec![2]]);
        let a = assignments(&tys, 4);
        // Uniform for every type, then every mixed combination of the two stock types.
        assert_eq!(a.len(), 3 + (2usize.pow(4) - 2));
        for p in &a {
            if p.iter().any(|&k| tys[k].is_tq_weight()) {
                assert!(p.iter().all(|&k| k == p[0]), "{p:?}");
            }
        }
        let mut uniq = a.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), a.len(), "duplicates");
    }

    #[test]
    fn pareto_keeps_exactly_the_undominated() {
        let mut s = 5u64;
        for _ in 0..200 {
            let v: Vec<Opt> = (0..1 + lcg(&mut s) % 40)
                .map(|k| Opt {
                    bytes: lcg(&mut s) % 20,
                    cost: (lcg(&mut s) % 20) as f64,
                    pick: vec![k as usize],
                })
                .collect();
            let kept = pareto(v.clone());
            // Every option is matched or beaten by a kept one no larger; kept ones beat each other.
            for o in &v {
                assert!(kept.iter().any(|k| k.bytes <= o.bytes && k.cost <= o.cost));
            }
            for w in kept.windows(2) {
                assert!(w[0].bytes < w[1].bytes && w[0].cost > w[1].cost);
            }
            // The knapsack over the kept options is as good as over all of them.
            let budget = lcg(&mut s) % 25;
            let all = solve(
                &[v.iter().map(|o| (o.bytes, o.cost)).collect()],
                budget,
                1 << 10,
            );
            let few = solve(
                &[kept.iter().map(|o| (o.bytes, o.cost)).collect()],
                budget,
                1 << 10,
            );
            assert_eq!(all.map(|x| x.cost), few.map(|x| x.cost));
        }
    }

    #[test]
    fn roles() {
        assert_eq!(role_of("blk.12.attn_v.weight"), "attn_v.weight");
        assert_eq!(role_of("token_embd.weight"), "token_embd.weight");
    }

    #[test]
    fn infeasible_and_deterministic() {
        let items = vec![vec![(10, 1.0), (5, 2.0)], vec![(7, 0.0)]];
        assert!(solve(&items, 11, 100).is_none());
        assert_eq!(min_bytes(&items), 12);
        let a = solve(&items, 12, 100).unwrap();
        assert_eq!(a.choice, vec![1, 0]);
        // Ties: the first option in order wins.
        let tie = vec![vec![(5, 1.0), (5, 1.0)]];
        assert_eq!(solve(&tie, 5, 100).unwrap().choice, vec![0]);
        assert_eq!(solve(&items, 1000, 3), solve(&items, 1000, 3));
    }
}
