//! Measuring candidate plans (best.rs picks them): each plan's tensors quantized as convert
//! would and substituted in memory, the plans run together block by block on the KLD windows
//! ([`measure`]). At large shapes a measurement covers less than the whole plan ([`Scope`]): the
//! tensors over a cap on a row sample with their error amplified ([`sampling`]), and on wide
//! models only the tensors of a few blocks, the KLD then scaled up by the plan's predicted cost
//! over the part measured ([`extrapolation`]). Each measurement's key says which ([`plan_key`]).

use super::probe::{Probes, Sample, Stage, Substitute};
use super::store::Store;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::plan::mix::{self, Calibration};
use crate::plan::{Action, Plan};
use crate::source::TensorSource;
use crate::types::profile::Profile;
use crate::types::TensorType;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

/// One candidate plan: its name in the report and the plan (the mix's plan with its items'
/// types changed).
pub(super) struct Candidate {
    pub name: String,
    pub plan: Plan,
}

/// What a plan's measurement covers when it is not the whole plan ([`measure`]): the tensors over
/// `cap` elements on a row sample ([`sampling`]), and only the tensors of the `blocks` measured
/// (the others run as the input's, [`plan_blocks`]; the KLD is then extrapolated,
/// [`extrapolation`]). The default: the whole plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Scope {
    pub cap: Option<u64>,
    pub blocks: Option<mix::ExactBlocks>,
}

impl Scope {
    /// Whether the plans change the tensors `stage` reads.
    fn changes(&self, stage: Stage) -> bool {
        match (stage, self.blocks) {
            (Stage::Block(l), Some(b)) => b.exact(l),
            _ => true,
        }
    }

    /// Whether the plans change tensor `name` (one outside the blocks: always).
    fn covers(&self, name: &str) -> bool {
        match (crate::arch::layer_of(name), self.blocks) {
            (Some(l), Some(b)) => b.exact(l as usize),
            _ => true,
        }
    }
}

/// Whether `TQ_MIX_WHOLE` is set (to anything but `0`): a measurement knob that measures the
/// plans on every block, as on narrow models, wherever the model is (to compare against the
/// block-sampled measurement).
pub(super) fn whole_knob() -> bool {
    std::env::var_os("TQ_MIX_WHOLE").is_some_and(|v| v != "0")
}

/// The blocks whose tensors the measured plans change: the sensitivity's measured blocks
/// (`--mix-exact-blocks`, [`mix::ExactBlocks::of_plan`]), or None for every block (narrow
/// models, `--mix-exact-blocks 0`, or [`whole_knob`]). On a 7B each block a plan changes costs
/// its distinct (tensor, type) LDLQ encodes (≈ 420 CPU-s per block for 8 plans); a block it
/// does not change costs one forward pass per plan.
pub(super) fn plan_blocks(exact_blocks: usize, plan: &Plan) -> Option<mix::ExactBlocks> {
    let b = mix::ExactBlocks::of_plan(exact_blocks, plan);
    (!b.all() && !whole_knob()).then_some(b)
}

/// The plan's types as one key (`name=type;…`), hashed: what the mix cache stores a measured
/// plan's KLD under. A plan measured on row samples or on some blocks ([`Scope`]) holds a
/// different estimate than one measured whole, so its key carries the cap (`;rows>N`) and the
/// blocks (`;blocks=0,4,…`).
pub(super) fn plan_key(plan: &Plan, scope: &Scope) -> String {
    let mut s = String::new();
    for e in &plan.entries {
        s.push_str(&e.name);
        s.push('=');
        s.push_str(e.dst.name());
        s.push(';');
    }
    if let Some(c) = scope.cap {
        s.push_str(&format!("rows>{c}"));
    }
    if let Some(b) = scope.blocks {
        let l: Vec<String> = b.list().iter().map(|l| l.to_string()).collect();
        s.push_str(&format!(";blocks={}", l.join(",")));
    }
    blake3::hash(s.as_bytes()).to_hex().to_string()
}

/// A plan measured on some blocks ([`Scope::blocks`]) stands for the whole plan by the ratio of
/// its predicted cost (the fit's α × error, plus the measured KLDs of the tensors without a
/// Hessian) over all tensors to that over the tensors it changed: first order, errors add
/// across blocks, and the measured part carries what the fit misprices there. 1 when the
/// measured part has no predicted cost.
pub(super) fn extrapolation(
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    table: &mix::Table,
    direct: &[Option<Vec<f64>>],
    alpha_of: &dyn Fn(&str) -> f64,
    scope: &Scope,
) -> f64 {
    if scope.blocks.is_none() {
        return 1.0;
    }
    let all = cost_where(plan, items, table, direct, alpha_of, &|_| true);
    let part = cost_where(plan, items, table, direct, alpha_of, &|n| scope.covers(n));
    if part > 0.0 && all.is_finite() {
        all / part
    } else {
        1.0
    }
}

/// The plan's predicted cost over the tensors `keep` selects (an entry at a type that is not a
/// candidate of its item counts nothing).
fn cost_where(
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    table: &mix::Table,
    direct: &[Option<Vec<f64>>],
    alpha_of: &dyn Fn(&str) -> f64,
    keep: &dyn Fn(&str) -> bool,
) -> f64 {
    let mut cost = 0.0;
    each_cost(plan, items, table, direct, alpha_of, &mut |name, c| {
        if let (true, Some((_, k))) = (keep(name), c) {
            cost += k;
        }
    });
    cost
}

/// An entry's `(error, cost)` at a candidate type of its item; None at another type.
pub(super) type Priced = Option<(f64, f64)>;

/// Each priced entry of `plan` under the fit, in item order: its name and, at a candidate type
/// of its item, `(error, cost)` — a tensor with a Hessian its error and α × error, an item
/// without one (its KLD measured per candidate) `(0, that KLD)` once, for its first member —
/// or None at a type that is not a candidate.
pub(super) fn each_cost(
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    table: &mix::Table,
    direct: &[Option<Vec<f64>>],
    alpha_of: &dyn Fn(&str) -> f64,
    f: &mut dyn FnMut(&str, Priced),
) {
    for ((idx, tys), (per, d)) in items.iter().zip(table.iter().zip(direct)) {
        let at = |i: usize| tys.iter().position(|t| *t == plan.entries[i].dst);
        match d {
            Some(d) => f(&plan.entries[idx[0]].name, at(idx[0]).map(|k| (0.0, d[k]))),
            None => {
                for (m, &i) in per.iter().zip(idx) {
                    let name = &plan.entries[i].name;
                    f(name, at(i).map(|k| (m[k].err, alpha_of(name) * m[k].err)));
                }
            }
        }
    }
}

/// Elements above which a measured plan's tensor is encoded on a row sample: the probes' cap
/// ([`super::probe::probe_elements`]), or `TQ_PLAN_ELEMENTS` when set to a positive integer (a
/// measurement knob: compare sampled and whole measurements of the same plans).
pub(super) fn plan_elements() -> u64 {
    super::probe::env_count("TQ_PLAN_ELEMENTS", super::probe::probe_elements())
}

/// The row-sample cap the plans of `items` are measured under: `cap` when one of the mixed
/// tensors is over it and has a Hessian under `calib` (so some plan is measured on a sample),
/// else None (every tensor whole, keys as before).
pub(super) fn sampling(
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    calib: &Calibration,
    cap: u64,
) -> Option<u64> {
    items
        .iter()
        .flat_map(|(idx, _)| idx)
        .any(|&i| {
            let e = &plan.entries[i];
            e.dims.iter().product::<u64>() > cap
                && match e.dims.len() {
                    2 => super::substitute::group_of(calib, &e.name).is_some(),
                    // An expert stack with its experts' Hessians (`ProbeEncoder::sample`).
                    3 => mix::has_weights(calib, e),
                    _ => false,
                }
        })
        .then_some(cap)
}

/// One (tensor, type) of a stage, encoded once for every plan that holds it.
enum Enc {
    Whole(Arc<Vec<u8>>),
    Rows(super::probe::RowProbe),
}

/// The plan as convert executes it: LDLQ or imatrix marks from the calibration.
pub(super) fn marked(plan: &Plan, calib: &Calibration) -> Plan {
    let mut p = plan.clone();
    super::substitute::mark(&mut p, calib);
    p
}

/// Measure each candidate's whole-plan KLD on `windows` windows against `ref_logits` (the
/// input's logits); `known` holds KLDs measured before (the mix cache, by [`plan_key`]), which are
/// not measured again. Returns one KLD per candidate and whether it came from `known`.
///
/// The plans are run together, block by block ([`Probes::kld_streamed`]), rather than one after
/// another: a block's tensors are encoded once for every plan that holds the same (tensor, type),
/// each plan runs that block on its own hidden states, and the encodings are dropped before the
/// next block. Peak memory is one block's distinct encodings (a few plans' worth of one block)
/// plus each plan's hidden states (`windows × 512 × n_embd` f32: 16.8 MB per plan for a 7B shape
/// at 2 windows), never a quantized model; every (tensor, type) is encoded once, as before, and
/// the input is read once for all plans. One plan after another would either encode shared
/// tensors again for each plan or hold them across plans (the whole-model memory this replaced).
///
/// With `cap` (from [`sampling`]), a tensor over `cap` elements that the plan quantizes with
/// LDLQ is encoded on the probes' row sample only, its error amplified to stand for the whole
/// tensor's ([`Sample::Amplified`]); every plan holding that tensor is measured on the same
/// rows. A 7B tensor then costs 2–6 % of its whole encode (plus its group's LDLQ factors, built
/// once per group and stage), and each KLD is an estimate of the whole plan's
/// (docs/bench/scale.md). None: every tensor whole.
///
/// With `scope.blocks`, the plans change only the tensors of those blocks (and those outside
/// the blocks); the other blocks run as the input's, so nothing is encoded there. The KLDs
/// returned are of those partial plans, as measured ([`extrapolation`] scales them).
#[allow(clippy::too_many_arguments)]
pub(super) fn measure(
    input: &Path,
    src: &dyn TensorSource,
    cands: &[Candidate],
    profile: &Profile,
    calib: &Calibration,
    ref_logits: &Path,
    windows: usize,
    known: &BTreeMap<String, f64>,
    quiet: bool,
    stream: Option<&super::stream::TextStream>,
    scope: Scope,
    store: Option<&Store>,
) -> Result<Vec<(f64, bool)>> {
    let cap = scope.cap;
    let todo: Vec<usize> = (0..cands.len())
        .filter(|&k| !known.contains_key(&plan_key(&cands[k].plan, &scope)))
        .collect();
    if todo.is_empty() {
        // Every plan's KLD is known (the mix cache): no pass, no calibration pass.
        return Ok(cands
            .iter()
            .map(|c| (known[&plan_key(&c.plan, &scope)], true))
            .collect());
    }
    let marked: Vec<Plan> = todo
        .iter()
        .map(|&k| marked(&cands[k].plan, calib))
        .collect();
    let file = GgufFile::open(input)?;
    let mut probes = Probes::new(&file, ref_logits, windows)?;
    // Per plan, the entries it changes by the stage that reads them.
    let mut by_stage: Vec<BTreeMap<Stage, Vec<usize>>> = vec![];
    for p in &marked {
        let mut m: BTreeMap<Stage, Vec<usize>> = BTreeMap::new();
        for (i, e) in p.entries.iter().enumerate() {
            if e.action != Action::Copy {
                for s in probes.stages_of(&e.name) {
                    if scope.changes(s) {
                        m.entry(s).or_default().push(i);
                    }
                }
            }
        }
        by_stage.push(m);
    }
    // Progress: each distinct (tensor, type) encoded per stage, and each plan's run of a stage.
    let mut encodes: BTreeMap<Stage, BTreeSet<(usize, TensorType)>> = BTreeMap::new();
    for (m, p) in by_stage.iter().zip(&marked) {
        for (s, idx) in m {
            let set = encodes.entry(*s).or_default();
            set.extend(idx.iter().map(|&i| (i, p.entries[i].dst)));
        }
    }
    // Tensors whose passes read only some rows (an untied token_embd: the windows' tokens):
    // without a store to keep them for the conversion, only those rows are encoded.
    let cut_rows: HashMap<usize, Vec<u64>> = match store {
        Some(_) => HashMap::new(),
        None => marked
            .first()
            .map(|p| {
                (0..p.entries.len())
                    .filter_map(|i| probes.rows_read(&p.entries[i].name).map(|r| (i, r)))
                    .collect()
            })
            .unwrap_or_default(),
    };
    let n_layer = probes.n_layer() as u64;
    let total =
        encodes.values().map(|s| s.len() as u64).sum::<u64>() + marked.len() as u64 * (n_layer + 2);
    let mut pb = crate::pipeline::progress::steps(quiet, total, "measured plans");
    let done = std::cell::Cell::new(0u64);
    let step = || {
        done.set(done.get() + 1);
        pb.set_position(done.get());
    };
    // A streamed calibration: the block being run's Hessians, moved here for the time of its
    // stage (the blocks run from inside the calibration pass, below).
    let cur = std::cell::RefCell::new(crate::quant::Hessians::default());
    let warned = std::cell::Cell::new(false);
    // The current stage's encodings, each (tensor, type) once for all plans: whole, or (a tensor
    // over `cap` elements with a Hessian) its amplified row sample, which each plan turns into
    // its substitute just before it runs (one tensor copy alive at a time, not one per plan).
    let mut held: HashMap<(usize, TensorType), Enc> = HashMap::new();
    let mut subs = |stage: Stage, k: usize| -> Result<Vec<Substitute>> {
        if k == 0 {
            // The stage's first plan (whether or not it changes anything here): encode what
            // every plan needs for this stage. A streamed calibration's Hessians are taken for
            // it and each group's matrix dropped once its encodings are done (a 70B block holds
            // 8.2 GB of them beside the LDLQ factor being used).
            let mut hs = crate::quant::Hessians {
                groups: std::mem::take(&mut cur.borrow_mut().groups),
                ..Default::default()
            };
            let streamed = matches!(calib, Calibration::Stream(_));
            held.clear();
            // (Hessian group, factor key, type, entry, plan).
            type Want = (Option<String>, Option<String>, TensorType, usize, usize);
            let mut want: Vec<Want> = vec![];
            let mut seen = BTreeSet::new();
            for (q, (p, mq)) in marked.iter().zip(&by_stage).enumerate() {
                for &i in mq.get(&stage).map_or(&[][..], |x| x.as_slice()) {
                    if seen.insert((i, p.entries[i].dst)) {
                        let (g, ty) = (
                            super::substitute::group_of(
                                &stage_calib(calib, &hs),
                                &p.entries[i].name,
                            ),
                            p.entries[i].dst,
                        );
                        let key = crate::quant::sensitivity::ldlq_factor_key(ty, &p.ldlq);
                        want.push((g, key, ty, i, q));
                    }
                }
            }
            // A Hessian group's encodings in a row, and in it those sharing an LDLQ factor, so
            // that each factor is built once.
            want.sort();
            let mut enc = super::fit::ProbeEncoder::default();
            for (at, (g, _, ty, i, q)) in want.iter().enumerate() {
                let (ty, i, q) = (*ty, *i, *q);
                let calib = &stage_calib(calib, &hs);
                let p = &marked[q];
                let rows = match cap {
                    Some(cap) if p.entries[i].ldlq => {
                        enc.sample(&file, src, p, i, ty, calib, cap, Sample::Amplified)?
                    }
                    _ => None,
                };
                let e = match rows {
                    Some(r) => Enc::Rows(r),
                    None => Enc::Whole(Arc::new(match store.and_then(|s| s.get(p, i)) {
                        Some(b) => b,
                        None if cut_rows.contains_key(&i) => {
                            super::substitute::rows_encoding(src, p, i, calib, &cut_rows[&i])?
                        }
                        None => {
                            let b = super::substitute::encode_entry(src, p, i, calib)?;
                            // The store only saves work: a failure to keep is a note.
                            if let Some(Err(err)) = store.map(|s| s.put(p, i, &b)) {
                                if !quiet && !warned.replace(true) {
                                    eprintln!("tq: --mix-cache: an encoding was not kept ({err}); going on without");
                                }
                            }
                            b
                        }
                    })),
                };
                held.insert((i, ty), e);
                if streamed
                    && super::stream::drop_finished(&mut hs, g, want.get(at + 1).map(|n| &n.0))
                {
                    enc.clear();
                }
                step();
            }
        }
        let Some(m) = by_stage[k].get(&stage) else {
            return Ok(vec![]);
        };
        let p = &marked[k];
        m.iter()
            .map(|&i| {
                let e = &p.entries[i];
                match held.get(&(i, e.dst)) {
                    Some(Enc::Whole(b)) => {
                        let id = profile.id_of(e.dst).ok_or_else(|| {
                            Error::internal(format!("{}: no id in the profile", e.dst))
                        })?;
                        Ok((e.name.clone(), e.dst, id, b.clone()))
                    }
                    Some(Enc::Rows(r)) => r.substitute(&file),
                    None => Err(Error::internal(format!(
                        "{} at {}: not encoded for {stage:?}",
                        e.name, e.dst
                    ))),
                }
            })
            .collect()
    };
    let streamed = match calib {
        Calibration::Stream(_) => stream,
        _ => None,
    };
    let mut drive = |f: &mut dyn FnMut(usize) -> Result<()>| -> Result<()> {
        let Some(s) = streamed else {
            return Err(Error::internal("measured plans: no calibration to stream"));
        };
        s.pass("the measured plans", &mut |l, hs| {
            cur.borrow_mut().groups = std::mem::take(&mut hs.groups);
            let r = f(l);
            cur.borrow_mut().groups.clear();
            r
        })
    };
    let klds = probes.kld_streamed(
        marked.len(),
        &mut subs,
        &step,
        streamed
            .is_some()
            .then_some(&mut drive as super::probe::Driver),
    )?;
    pb.finish_and_clear();
    if let (Some(s), false) = (store, quiet) {
        let n: usize = encodes.values().map(BTreeSet::len).sum();
        eprintln!(
            "tq: --mix-cache: {} of the measured plans' {n} encodings read from {}",
            s.hits(),
            s.dir().display()
        );
    }
    let mut measured: HashMap<usize, f64> = todo.iter().copied().zip(klds).collect();
    Ok((0..cands.len())
        .map(|k| match measured.remove(&k) {
            Some(kld) => (kld, false),
            None => (known[&plan_key(&cands[k].plan, &scope)], true),
        })
        .collect())
}

/// `calib` for one stage's encodings: a streamed calibration's block Hessians `hs` in memory.
fn stage_calib<'a>(calib: &Calibration<'a>, hs: &'a crate::quant::Hessians) -> Calibration<'a> {
    match calib {
        Calibration::Stream(_) => Calibration::Memory(hs),
        c => *c,
    }
}
