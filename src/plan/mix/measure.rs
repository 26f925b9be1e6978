//! The mix's sensitivity pass: each item's members measured under each candidate type
//! ([`measure`], [`Measurer`]), with LDLQ under the whole Hessian in the blocks [`ExactBlocks`]
//! names and from the Hessian's diagonal blocks elsewhere; experts under their own Hessians.

use super::super::{row_len, Plan, PlanEntry};
use crate::arch::{classify, Role};
use crate::error::{Error, Result};
use crate::types::TensorType;

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
    let mut m = Measurer::new(blocks, plan);
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
    /// Dense tensors with rows wider than this are estimated in every block, measured ones
    /// included ([`WIDE`]).
    pub wide: usize,
}

/// [`ExactBlocks::wide`]'s default: rows wider than 16,384 (a 70B-class `ffn_down`, 28,672) are
/// estimated from their Hessian's diagonal blocks in every block, scaled by the ratio of the
/// other tensors' measurements (their own kind has none). Their whole LDLQ factor is what the
/// conversion builds, in f32 and holding the Hessian over (17.7 GB at 28,672); beside the
/// Hessian the sensitivity keeps for its error measure it did not fit in 24 GB, and it took
/// ≥ 11 minutes per tensor against seconds for the estimate.
pub const WIDE: usize = 16_384;

/// [`ExactBlocks::chunk`]'s default: 512 columns (a 7B row of 4096 in 8 blocks).
pub const CHUNK: usize = 512;

impl ExactBlocks {
    /// Every block measured.
    pub const ALL: ExactBlocks = ExactBlocks {
        count: 0,
        n_layer: 0,
        chunk: CHUNK,
        wide: WIDE,
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
            wide: WIDE,
        }
    }

    /// How many dense block tensors of `plan` have rows wider than [`ExactBlocks::wide`], and
    /// the widest rows of the others (the estimate cuts a wide tensor into as many diagonal
    /// blocks as those are cut into); None when no tensor is that wide.
    pub fn wide_tensors(&self, plan: &Plan) -> Option<(usize, usize)> {
        let widths = plan
            .entries
            .iter()
            .filter(|e| e.dims.len() == 2 && crate::arch::layer_of(&e.name).is_some())
            .map(|e| row_len(&e.dims) as usize);
        let wide = widths.clone().filter(|&w| w > self.wide).count();
        let narrow = widths.filter(|&w| w <= self.wide).max().unwrap_or(0);
        (wide > 0).then_some((wide, narrow))
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
    /// When the plan has dense block tensors wider than [`ExactBlocks::wide`] (then every
    /// block's tensors go through the estimate, for the ratios): the widest rows of the others
    /// ([`ExactBlocks::wide_tensors`], the reference width of [`BlockEstimate::tensor`]).
    reference: Option<usize>,
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

impl Measurer {
    /// A measurer for the sensitivity pass of `plan`, LDLQ on `blocks` only.
    pub fn new(blocks: ExactBlocks, plan: &Plan) -> Measurer {
        Measurer {
            live: None,
            live_key: None,
            factors: Default::default(),
            blocks: BlockEstimate {
                blocks,
                pairs: Default::default(),
                pending: vec![],
            },
            reference: blocks.wide_tensors(plan).map(|(_, r)| r),
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
            let (blocks, reference) = (self.blocks.blocks, self.reference);
            let mut est = match (&w, crate::arch::layer_of(&e.name)) {
                (Weighting::Hessian { h, .. }, Some(l)) if !blocks.all() || reference.is_some() => {
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
                        reference,
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
    /// A dense tensor of block `l` under a Hessian when not every block is measured, or the
    /// plan has tensors wider than [`ExactBlocks::wide`]: in a measured block (and not that
    /// wide), [`crate::quant::sensitivity::errors`] as always plus the factor types' proxies,
    /// kept as ratio pairs; otherwise the types without a factor measured and the others'
    /// proxies left for [`Measurer::finish`] (placeholders in the returned row).
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
        reference: Option<usize>,
    ) -> Result<Vec<crate::quant::sensitivity::Estimate>> {
        use crate::quant::sensitivity::{chunk_width, chunked_ldlq, errors, uses_factor, Estimate};
        let fac: Vec<usize> = (0..tys.len()).filter(|&c| uses_factor(tys[c], w)).collect();
        let ftys: Vec<TensorType> = fac.iter().map(|&c| tys[c]).collect();
        let crate::quant::sensitivity::Weighting::Hessian { ldlq, .. } = w else {
            return Err(Error::internal("a block estimate without a Hessian"));
        };
        // A wide tensor's diagonal blocks as many as the reference width's (the ratio it borrows
        // comes from tensors cut into that many): 1,792 columns for a 70B `ffn_down` beside
        // 8,192-wide attention. With the same block size the estimate was 1.4–1.8× the
        // measurement on a test model, with the same count 0.9–1.17× (stream.rs tests).
        let target = match reference {
            Some(r) if n > self.blocks.wide && r > 0 => self.blocks.chunk * n / r,
            _ => self.blocks.chunk,
        };
        let b = chunk_width(n, &ftys, target);
        let proxy = chunked_ldlq(name, rows, n, n_rows, &ftys, h, *ldlq, b, exact)?;
        let kind = super::role_of(name).to_string();
        if self.blocks.exact(l) && n <= self.blocks.wide {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `--mix-exact-blocks K`: K distinct, evenly spaced blocks, the first and the last among
    /// them; 0 or K ≥ the block count: all.
    #[test]
    fn exact_blocks_are_evenly_spaced_with_both_ends() {
        let on = |count, n_layer| -> Vec<usize> {
            let e = ExactBlocks {
                count,
                n_layer,
                chunk: CHUNK,
                wide: WIDE,
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
