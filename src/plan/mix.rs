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
use crate::arch::{attention_group, classify, Role};
use crate::error::{Error, Result};
use crate::types::profile::Profile;
use crate::types::TensorType;

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

/// Where the error weights come from (and with them how convert will quantize).
#[derive(Clone, Copy)]
pub enum Calibration<'a> {
    /// Hessians in a file from `tq calib`, read one group at a time.
    File(&'a crate::quant::HessianFile),
    /// Hessians in memory: all of them, or (inside a streamed pass) one block's.
    Memory(&'a crate::quant::Hessians),
    /// `--calib TEXT` streamed: the index of the groups a calibration will produce (shapes, no
    /// data; [`crate::calib::stream::expected`]). The passes that need a Hessian's data
    /// calibrate block by block and measure each block with [`Calibration::Memory`] of that
    /// block's groups ([`Measurer::item`]); asked for data, this answers an internal error.
    Stream(&'a crate::quant::Hessians),
    /// `--imatrix`: per-column importance by tensor name.
    Imatrix(&'a std::collections::BTreeMap<String, Vec<f32>>),
    /// Nothing: plain squared error.
    None,
}

/// Per item, per member, per candidate: the tensor's weighted error estimate.
pub type Table = Vec<Vec<Vec<crate::quant::sensitivity::Estimate>>>;

/// Measure every item's members under every candidate (rows sampled: `sample.rows` per tensor,
/// fewer for rows over 4096 wide: [`crate::quant::sensitivity::rows_for`]; `sample.exact` of them
/// quantized with LDLQ: [`crate::quant::sensitivity::errors`]).
/// A token embedding (no Hessian: its input is one token) is weighted by its mean row error, one
/// token's worth; a tensor without calibration data by its plain squared error.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    src: &dyn crate::source::TensorSource,
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    calib: &Calibration,
    sample: crate::quant::sensitivity::Sample,
    blocks: ExactBlocks,
    progress: &dyn Fn(usize, usize),
) -> Result<Table> {
    let mut m = Measurer::new(blocks);
    let mut table = Vec::with_capacity(items.len());
    for (it, (idx, tys)) in items.iter().enumerate() {
        progress(it, items.len());
        table.push(m.item(it, src, plan, idx, tys, calib, sample)?);
    }
    m.finish(&mut table);
    progress(items.len(), items.len());
    Ok(table)
}

/// The default of `--mix-exact-blocks`: 8 blocks measured with LDLQ (on models wider than
/// [`NARROW`]).
pub const EXACT_BLOCKS: usize = 8;

/// Rows up to this wide: every block measured whatever `--mix-exact-blocks` says. There the LDLQ
/// factors cost little and the estimate saves little (SmolLM2, 576 wide: 0.74× the
/// sensitivity's CPU at 8 of 30 blocks), while the measurement is exact.
pub const NARROW: u64 = 2048;

/// Which blocks the sensitivity measures as convert quantizes (LDLQ with each type's factor):
/// `count` evenly spaced blocks of `n_layer`, the first and the last among them
/// (`--mix-exact-blocks`; 0, or at least `n_layer`: every block). The other blocks' tensors
/// are estimated from LDLQ under the Hessian's diagonal blocks of at most `chunk` columns
/// ([`Measurer`]): factors of `chunk²` instead of one factorization of the whole Hessian per
/// factor key (a 7B `ffn_down`: 11,008² f64, three keys), and sweeps of `chunk` instead of `n`
/// columns per row (≈ 5× less CPU per 7B block, measured). Tensors outside the blocks
/// (token_embd, output) and expert tensors are always measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactBlocks {
    pub count: usize,
    pub n_layer: usize,
    /// The estimate's diagonal blocks, at most this many columns
    /// ([`crate::quant::sensitivity::chunk_width`]).
    pub chunk: usize,
}

/// [`ExactBlocks::chunk`]'s default: 512 columns (a 7B row of 4096 in 8 blocks).
pub const CHUNK: usize = 512;

impl ExactBlocks {
    /// Every block measured.
    pub const ALL: ExactBlocks = ExactBlocks {
        count: 0,
        n_layer: 0,
        chunk: CHUNK,
    };

    /// `count` exact blocks of the plan's blocks (`n_layer`: one past the highest `blk.N`); every
    /// block when no block tensor's rows are wider than [`NARROW`] (factors are cheap there).
    pub fn of_plan(count: usize, plan: &Plan) -> ExactBlocks {
        let in_blocks = || {
            plan.entries
                .iter()
                .filter(|e| e.dims.len() >= 2)
                .filter_map(|e| crate::arch::layer_of(&e.name).map(|l| (l as usize, e)))
        };
        let n_layer = in_blocks().map(|(l, _)| l + 1).max().unwrap_or(0);
        let widest = in_blocks()
            .map(|(_, e)| row_len(&e.dims))
            .max()
            .unwrap_or(0);
        ExactBlocks {
            count: if widest <= NARROW { 0 } else { count },
            n_layer,
            chunk: CHUNK,
        }
    }

    /// The blocks measured, for the report.
    pub fn list(&self) -> Vec<usize> {
        (0..self.n_layer).filter(|&l| self.exact(l)).collect()
    }

    /// Whether every block is measured.
    pub fn all(&self) -> bool {
        self.count == 0 || self.count >= self.n_layer
    }

    /// Whether block `l` is measured.
    pub fn exact(&self, l: usize) -> bool {
        if self.all() {
            return true;
        }
        if self.count == 1 {
            return l == self.n_layer / 2;
        }
        let (c, last) = (self.count - 1, self.n_layer - 1);
        // Block j·last/c rounded to nearest, j = 0..=c: 0 and last always among them.
        (0..=c).any(|j| (2 * j * last + c) / (2 * c) == l)
    }
}

/// The sensitivity pass's state from item to item: the Hessian group last measured under (from a
/// file, its matrix) and its LDLQ factors by type family, reused while consecutive tensors share
/// the group (a layer's q/k/v, gate/up). The estimates do not depend on it: a factor is a
/// function of its Hessian and type family, computed again when the group changes.
///
/// With [`ExactBlocks`] short of every block, a dense tensor in a block not measured gets, for
/// each type measured with an LDLQ factor, the block-diagonal estimate of
/// [`crate::quant::sensitivity::chunked_ldlq`] times the ratio `Σ measured / Σ proxy` over the
/// tensors of the same kind (its name without `blk.N.`) in the measured blocks, where both are
/// computed ([`Measurer::finish`]); types measured without a factor are measured as before. The
/// estimate's standard error is its value times the spread of that kind's per-tensor ratios.
pub struct Measurer {
    live: Option<crate::quant::Hessian>,
    live_key: Option<String>,
    factors: crate::quant::sensitivity::Factors,
    blocks: BlockEstimate,
}

/// Per (tensor kind, type name): each measured tensor's (block, measured error, proxy).
type Pairs = std::collections::BTreeMap<(String, String), Vec<(usize, f64, f64)>>;

/// The state of the estimate for blocks not measured ([`Measurer`]).
struct BlockEstimate {
    blocks: ExactBlocks,
    /// Per (tensor kind, type name): each measured tensor's (block, measured error, proxy).
    pairs: Pairs,
    /// Estimates to finish: (item, member, candidate, kind, type name, proxy).
    pending: Vec<(usize, usize, usize, String, String, f64)>,
}

/// A tensor's kind across blocks: its name without the `blk.N.` prefix.
fn kind_of(name: &str) -> &str {
    match crate::arch::layer_of(name) {
        Some(_) => name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .map_or(name, |(_, k)| k),
        None => name,
    }
}

impl Measurer {
    /// A measurer for the sensitivity pass, LDLQ on `blocks` only.
    pub fn new(blocks: ExactBlocks) -> Measurer {
        Measurer {
            live: None,
            live_key: None,
            factors: Default::default(),
            blocks: BlockEstimate {
                blocks,
                pairs: Default::default(),
                pending: vec![],
            },
        }
    }

    /// Fill the estimates of the blocks not measured (the table of every item: [`Measurer::item`]
    /// gave them their proxies), from the ratios of the measured blocks: per (kind, type), over
    /// the measured blocks inside the model (not the first or the last, whose inputs differ
    /// most: a 7B-shaped model's first attention measured 100× its later ones), or, where none
    /// holds the kind, over every measured block but the first, then every one; where no
    /// measured block holds the kind at all, pooled over the kinds for the type (1 where no
    /// measured tensor has the type). The result does not depend on the order in which the
    /// items were measured.
    pub fn finish(&mut self, table: &mut Table) {
        let BlockEstimate {
            blocks,
            pairs,
            pending,
        } = &mut self.blocks;
        let last = blocks.n_layer.saturating_sub(1);
        let ratio = |v: &[(usize, f64, f64)]| -> Option<(f64, f64)> {
            let pick = |keep: &dyn Fn(usize) -> bool| -> Vec<(f64, f64)> {
                v.iter().filter(|x| keep(x.0)).map(|x| (x.1, x.2)).collect()
            };
            let mut v = pick(&|l| l != 0 && l != last);
            if v.is_empty() {
                v = pick(&|l| l != 0);
            }
            if v.is_empty() {
                v = pick(&|_| true);
            }
            let (e, p) = v.iter().fold((0.0, 0.0), |a, x| (a.0 + x.0, a.1 + x.1));
            if !(p > 0.0 && e.is_finite() && p.is_finite()) {
                return None;
            }
            let r = e / p;
            // The relative spread of the per-tensor ratios around the pooled one.
            let rs: Vec<f64> = v
                .iter()
                .filter(|x| x.1 > 0.0)
                .map(|x| x.0 / x.1 / r)
                .collect();
            let spread = if rs.len() > 1 {
                let m = rs.iter().sum::<f64>() / rs.len() as f64;
                (rs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (rs.len() - 1) as f64).sqrt()
            } else {
                0.0
            };
            Some((r, spread))
        };
        let mut by_type: std::collections::BTreeMap<&str, Vec<(usize, f64, f64)>> =
            Default::default();
        for ((_, t), v) in pairs.iter() {
            by_type.entry(t).or_default().extend(v);
        }
        for (it, m, c, kind, ty, proxy) in pending.drain(..) {
            let (r, spread) = pairs
                .get(&(kind, ty.clone()))
                .and_then(|v| ratio(v))
                .or_else(|| by_type.get(ty.as_str()).and_then(|v| ratio(v)))
                .unwrap_or((1.0, 1.0));
            let err = r * proxy;
            table[it][m][c] = crate::quant::sensitivity::Estimate {
                err,
                se: err * spread,
            };
        }
    }

    /// One item's members under each of its candidate types `tys` ([`measure`]); `it` is the
    /// item's index in the table [`Measurer::finish`] completes.
    #[allow(clippy::too_many_arguments)]
    pub fn item(
        &mut self,
        it: usize,
        src: &dyn crate::source::TensorSource,
        plan: &Plan,
        idx: &[usize],
        tys: &[TensorType],
        calib: &Calibration,
        sample: crate::quant::sensitivity::Sample,
    ) -> Result<Vec<Vec<crate::quant::sensitivity::Estimate>>> {
        use crate::quant::sensitivity::{errors, rows_for, sample_rows, Estimate, Weighting};
        if let Calibration::Stream(_) = calib {
            return Err(Error::internal(
                "the mix's sensitivity from a streamed calibration is measured block by block",
            ));
        }
        let mut per = vec![];
        for &i in idx {
            let e = &plan.entries[i];
            if let Some(est) = expert_errors(src, plan, i, tys, calib, sample)? {
                per.push(est);
                continue;
            }
            let n = row_len(&e.dims) as usize;
            let n_rows: u64 = e.dims.iter().skip(1).product();
            let picks = sample_rows(n_rows, rows_for(sample.rows, n));
            let exact = rows_for(sample.exact, n);
            let mut rows = vec![0f32; picks.len() * n];
            for (r, buf) in picks.iter().zip(rows.chunks_mut(n)) {
                src.read_rows_f32(i, *r, buf)?;
                crate::quant::check_finite(&e.name, *r, buf)?;
            }
            // The Hessian group of this tensor, loaded when it changes.
            let key = match calib {
                Calibration::File(f) => f.index.for_tensor(&e.name).map(|g| g.tensors.join(",")),
                Calibration::Memory(h) => h.for_tensor(&e.name).map(|g| g.tensors.join(",")),
                _ => None,
            };
            if key.is_some() && key != self.live_key {
                // A new Hessian group: its factors (and, from a file, its matrix) replace the last.
                self.factors.clear();
                self.live = None;
                if let (Some(k), Calibration::File(f)) = (&key, calib) {
                    self.live = Some(f.load_group(k)?);
                }
                self.live_key = key.clone();
            }
            let h: Option<&crate::quant::Hessian> = match calib {
                Calibration::File(_) if key.is_some() => self.live.as_ref(),
                Calibration::Memory(hs) => hs.for_tensor(&e.name),
                _ => None,
            };
            let h = h.filter(|h| h.n == n);
            let imp = match calib {
                Calibration::Imatrix(m) => m.get(&e.name).filter(|v| v.len() == n),
                _ => None,
            };
            let w = match (h, imp) {
                (Some(h), _) => Weighting::Hessian { h, ldlq: plan.ldlq },
                (None, Some(v)) => Weighting::Diagonal(v),
                _ => Weighting::Identity,
            };
            let mut est = match (&w, crate::arch::layer_of(&e.name)) {
                (Weighting::Hessian { h, .. }, Some(l)) if !self.blocks.blocks.all() => {
                    self.blocks.tensor(
                        it,
                        per.len(),
                        (&e.name, &rows, n, n_rows),
                        tys,
                        &w,
                        h,
                        l as usize,
                        &mut self.factors,
                        exact,
                    )?
                }
                _ => errors(&e.name, &rows, n, n_rows, tys, &w, &mut self.factors, exact)?,
            };
            let calibrated = !matches!(calib, Calibration::None);
            if calibrated
                && matches!(w, Weighting::Identity)
                && classify(&e.name).0 == Role::TokenEmbd
            {
                let k = n_rows.max(1) as f64;
                est.iter_mut().for_each(|x| {
                    *x = Estimate {
                        err: x.err / k,
                        se: x.se / k,
                    }
                });
            }
            per.push(est);
        }
        Ok(per)
    }
}

impl BlockEstimate {
    /// A dense tensor of block `l` under a Hessian when not every block is measured: in a
    /// measured block, [`crate::quant::sensitivity::errors`] as always plus the factor types'
    /// proxies, kept as ratio pairs; in another block, the types without a factor measured and
    /// the others' proxies left for [`Measurer::finish`] (placeholders in the returned row).
    #[allow(clippy::too_many_arguments)]
    fn tensor(
        &mut self,
        it: usize,
        member: usize,
        (name, rows, n, n_rows): (&str, &[f32], usize, u64),
        tys: &[TensorType],
        w: &crate::quant::sensitivity::Weighting,
        h: &crate::quant::Hessian,
        l: usize,
        factors: &mut crate::quant::sensitivity::Factors,
        exact: usize,
    ) -> Result<Vec<crate::quant::sensitivity::Estimate>> {
        use crate::quant::sensitivity::{chunk_width, chunked_ldlq, errors, uses_factor, Estimate};
        let fac: Vec<usize> = (0..tys.len()).filter(|&c| uses_factor(tys[c], w)).collect();
        let ftys: Vec<TensorType> = fac.iter().map(|&c| tys[c]).collect();
        let crate::quant::sensitivity::Weighting::Hessian { ldlq, .. } = w else {
            return Err(Error::internal("a block estimate without a Hessian"));
        };
        let b = chunk_width(n, &ftys, self.blocks.chunk);
        let proxy = chunked_ldlq(name, rows, n, n_rows, &ftys, h, *ldlq, b, exact)?;
        let kind = kind_of(name).to_string();
        if self.blocks.exact(l) {
            let est = errors(name, rows, n, n_rows, tys, w, factors, exact)?;
            for (&c, p) in fac.iter().zip(&proxy) {
                self.pairs
                    .entry((kind.clone(), tys[c].name().to_string()))
                    .or_default()
                    .push((l, est[c].err, *p));
            }
            return Ok(est);
        }
        let rest: Vec<usize> = (0..tys.len()).filter(|c| !fac.contains(c)).collect();
        let rtys: Vec<TensorType> = rest.iter().map(|&c| tys[c]).collect();
        let measured = errors(name, rows, n, n_rows, &rtys, w, factors, exact)?;
        let mut est = vec![Estimate { err: 0.0, se: 0.0 }; tys.len()];
        for (&c, m) in rest.iter().zip(measured) {
            est[c] = m;
        }
        for (&c, p) in fac.iter().zip(proxy) {
            self.pending
                .push((it, member, c, kind.clone(), tys[c].name().to_string(), p));
        }
        Ok(est)
    }
}

/// A 3-D expert tensor with per-expert Hessians: each expert's sampled rows measured under its
/// own Hessian, quantized as convert will (LDLQ, or round-to-nearest under
/// [`MIN_EXPERT_TOKENS`](crate::quant::hessian::MIN_EXPERT_TOKENS) tokens), and the experts'
/// per-token errors summed weighted by the share of the layer's routed tokens each saw (an
/// expert no token reached costs nothing). All experts of a tensor share one type, as llama.cpp
/// stores them. None: not an expert tensor, or no expert Hessians (the dense path measures it).
fn expert_errors(
    src: &dyn crate::source::TensorSource,
    plan: &Plan,
    i: usize,
    tys: &[TensorType],
    calib: &Calibration,
    sample: crate::quant::sensitivity::Sample,
) -> Result<Option<Vec<crate::quant::sensitivity::Estimate>>> {
    use crate::quant::sensitivity::{errors, rows_for, sample_rows, Estimate, Factors, Weighting};
    use std::borrow::Cow;
    let e = &plan.entries[i];
    let [n, per, n_exp] = e.dims[..] else {
        return Ok(None);
    };
    let (n, n_exp) = (n as usize, n_exp as usize);
    let mut hs: Vec<Option<Cow<crate::quant::Hessian>>> = Vec::with_capacity(n_exp);
    for x in 0..n_exp {
        hs.push(match calib {
            Calibration::Memory(h) => h.for_expert(&e.name, x).map(Cow::Borrowed),
            Calibration::File(f) => match f.index.for_expert(&e.name, x) {
                Some(g) => Some(Cow::Owned(f.load_group(&g.tensors.join(","))?)),
                None => None,
            },
            _ => None,
        });
    }
    let hs: Vec<_> = hs.into_iter().map(|h| h.filter(|h| h.n == n)).collect();
    let total: u64 = hs.iter().flatten().map(|h| h.tokens).sum();
    if total == 0 {
        return Ok(None);
    }
    let k = rows_for(sample.rows, n).div_ceil(n_exp).max(1);
    let exact = rows_for(sample.exact, n).div_ceil(n_exp).max(1);
    let mut sum = vec![(0f64, 0f64); tys.len()];
    for (x, h) in hs.iter().enumerate() {
        let Some(h) = h.as_deref().filter(|h| h.tokens > 0) else {
            continue;
        };
        let picks = sample_rows(per, k);
        let mut rows = vec![0f32; picks.len() * n];
        for (r, buf) in picks.iter().zip(rows.chunks_mut(n)) {
            let row = x as u64 * per + r;
            src.read_rows_f32(i, row, buf)?;
            crate::quant::check_finite(&e.name, row, buf)?;
        }
        let w = if h.tokens >= crate::quant::hessian::MIN_EXPERT_TOKENS {
            Weighting::Hessian { h, ldlq: plan.ldlq }
        } else {
            Weighting::HessianRtn(h)
        };
        let share = h.tokens as f64 / total as f64;
        let est = errors(&e.name, &rows, n, per, tys, &w, &mut Factors::new(), exact)?;
        for (s, t) in sum.iter_mut().zip(est) {
            s.0 += share * t.err;
            s.1 += (share * t.se).powi(2);
        }
    }
    Ok(Some(
        sum.into_iter()
            .map(|(err, var)| Estimate {
                err,
                se: var.sqrt(),
            })
            .collect(),
    ))
}

/// `e` has calibration data in `calib` of its row length (a Hessian, an expert's Hessian, or an
/// imatrix entry).
pub fn has_weights(calib: &Calibration, e: &PlanEntry) -> bool {
    let n = row_len(&e.dims) as usize;
    // A 3-D expert tensor: any expert's Hessian ([`expert_errors`] measures it).
    let n_exp = if e.dims.len() == 3 {
        e.dims[2] as usize
    } else {
        0
    };
    let any = |hs: &crate::quant::Hessians| {
        hs.for_tensor(&e.name).is_some_and(|h| h.n == n)
            || (0..n_exp).any(|x| {
                hs.for_expert(&e.name, x)
                    .is_some_and(|h| h.n == n && h.tokens > 0)
            })
    };
    match calib {
        Calibration::File(f) => any(&f.index),
        Calibration::Memory(h) => any(h),
        // The index has every expert's group but not its tokens (known once the block runs):
        // a calibration routes each token to some expert of every MoE block, so an expert
        // tensor with groups of its row length has data, as in memory.
        Calibration::Stream(h) => {
            h.for_tensor(&e.name).is_some_and(|h| h.n == n)
                || (0..n_exp).any(|x| h.for_expert(&e.name, x).is_some_and(|h| h.n == n))
        }
        Calibration::Imatrix(m) => m.get(&e.name).is_some_and(|v| v.len() == n),
        Calibration::None => false,
    }
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
                        cost: d[k],
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

    /// `--mix-exact-blocks K`: K distinct, evenly spaced blocks, the first and the last among
    /// them; 0 or K ≥ the block count: all.
    #[test]
    fn exact_blocks_are_evenly_spaced_with_both_ends() {
        let on = |count, n_layer| -> Vec<usize> {
            let e = ExactBlocks {
                count,
                n_layer,
                chunk: CHUNK,
            };
            (0..n_layer).filter(|&l| e.exact(l)).collect()
        };
        assert_eq!(on(8, 32), [0, 4, 9, 13, 18, 22, 27, 31]);
        assert_eq!(on(2, 80), [0, 79]);
        assert_eq!(on(1, 30), [15]);
        assert_eq!(on(0, 30).len(), 30);
        assert_eq!(on(30, 30).len(), 30);
        assert_eq!(on(40, 30).len(), 30);
        for n_layer in 2..100 {
            for count in 2..n_layer {
                let v = on(count, n_layer);
                assert_eq!(v.len(), count, "{count} of {n_layer}");
                assert_eq!((v[0], v[count - 1]), (0, n_layer - 1));
            }
        }
    }
}
