//! Best of few, measured: the knapsack's plan is the best *predicted*, and the prediction is
//! off (3–5× low on SmolLM2, and on a held-out model it priced q2_K/q3_K as cheap where a
//! near-uniform file won). So the mix measures a few whole plans — the knapsack's, the knapsack's
//! under one α for all roles, the largest llama.cpp presets whose file fits the target, and each
//! of those with the bytes it leaves spent by the knapsack ([`upgrade`]) — on the `--kld-text`
//! windows and keeps the best *measured*.
//!
//! A plan is measured without a model copy: every tensor it changes is quantized as convert
//! would write it (LDLQ with the Hessians, the imatrix's weighting, or round-to-nearest) and
//! substituted in memory for one evaluation of the windows, the plans together block by block
//! ([`measure`]). A tensor's bytes at a type are the same in every plan, so each (tensor, type) is
//! encoded once for all candidates, and held only while its block runs. The winner is the least
//! measured KLD, ties to the earlier candidate (the
//! knapsack's first): deterministic and independent of the thread count, as the encoders and
//! the evaluator are.

use super::cache::PlanTypes;
use super::probe::{Probes, Sample, Stage, Substitute};
use super::report::{MixReport, Tried};
use super::store::Store;
use super::MixOpts;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::plan::mix::{self, Calibration};
use crate::plan::{preset, Action, Plan};
use crate::source::TensorSource;
use crate::types::profile::Profile;
use crate::types::TensorType;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

/// How many of the largest llama.cpp presets that fit the target are measured (a smaller
/// preset of the same family is rarely better per byte, and each costs one encode + one pass).
pub(super) const PRESETS_MEASURED: usize = 3;

/// One candidate plan: its name in the report and the plan (the mix's plan with its items'
/// types changed).
pub(super) struct Candidate {
    pub name: String,
    pub plan: Plan,
}

/// Set entry `i` of `plan` to `ty` as the planner would (action, bytes, reason).
fn set_type(plan: &mut Plan, i: usize, ty: TensorType, why: &str) -> Result<()> {
    let e = &mut plan.entries[i];
    e.dst = ty;
    e.fallback = false;
    e.reasons = vec![format!("{why}: {ty}")];
    e.action = if ty == e.src {
        Action::Copy
    } else if e.src.is_float() {
        Action::Quantize
    } else {
        Action::Requantize
    };
    let n: u64 = e.dims.iter().product();
    e.bytes = ty
        .bytes_for(n)
        .ok_or_else(|| Error::Unsupported(format!("{}: {n} elements do not fit {ty}", e.name)))?;
    Ok(())
}

/// The llama.cpp presets as candidates: every mixed tensor at the type llama-quantize's rules
/// give it (the imatrix branch when calibrated, as `--preset` with `--calib` does). A preset is
/// left out when one of its types needs an imatrix that is not there, is one tq cannot write, or
/// does not load under `profile`; F16/BF16 (never smaller than a target a mix is asked for) too.
pub(super) fn preset_plans(
    src: &dyn TensorSource,
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    profile: &Profile,
    calibrated: bool,
) -> Vec<Candidate> {
    let Ok(facts) = preset::ModelFacts::of(src) else {
        return vec![];
    };
    let opts = preset::Options {
        has_imatrix: calibrated,
        ..Default::default()
    };
    let mut out = vec![];
    'presets: for p in preset::PRESETS {
        if matches!(p.ftype, preset::Ftype::F16 | preset::Ftype::BF16) {
            continue;
        }
        let Ok(types) = preset::types(p, &facts, src.tensors(), &opts) else {
            continue;
        };
        let mut q = plan.clone();
        for &i in items.iter().flat_map(|(idx, _)| idx) {
            let e = &plan.entries[i];
            let Some(c) = types.get(&e.name) else {
                continue 'presets;
            };
            let t = c.ty;
            let writable = t == e.src || t.info().quantize.is_some();
            if !writable || profile.id_of(t).is_none() || (c.needs_imatrix && !calibrated) {
                continue 'presets;
            }
            if set_type(&mut q, i, t, &format!("mix: preset {}", p.name)).is_err() {
                continue 'presets;
            }
        }
        out.push(Candidate {
            name: format!("preset {}", p.name),
            plan: q,
        });
    }
    out
}

/// `base` (a preset's plan) with the bytes it leaves under the budget spent by the knapsack:
/// each item may keep its type in `base` or take a larger candidate, at the fit's cost. `budget`
/// is for the mixed tensors' bytes (as the knapsack's). None when nothing is left to spend or the
/// upgrade changes nothing.
pub(super) fn upgrade(
    base: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    table: &mix::Table,
    direct: &[Option<Vec<f64>>],
    alpha_of: &dyn Fn(&str) -> f64,
    budget: u64,
) -> Option<Plan> {
    // Per item: the base's type and the candidates larger for every member. An item the base
    // gives a type that is not a candidate, or whose members it gives different types (a group
    // the preset splits, e.g. attn_v above attn_q/k/o), keeps the base's types: its bytes are
    // spent before the knapsack.
    let mut fixed = 0u64;
    let mut items2 = vec![];
    let mut table2: mix::Table = vec![];
    let mut direct2 = vec![];
    for (((idx, tys), per), d) in items.iter().zip(table).zip(direct) {
        let now: Vec<TensorType> = idx.iter().map(|&i| base.entries[i].dst).collect();
        let uniform = now.iter().all(|t| *t == now[0]);
        let n = |i: usize| base.entries[i].dims.iter().product::<u64>();
        let keep: Vec<usize> = if uniform && tys.contains(&now[0]) {
            (0..tys.len())
                .filter(|&k| {
                    idx.iter().all(|&i| {
                        tys[k] == now[0] || tys[k].bytes_for(n(i)) > now[0].bytes_for(n(i))
                    })
                })
                .collect()
        } else {
            vec![]
        };
        if keep.is_empty() {
            fixed = idx
                .iter()
                .map(|&i| base.entries[i].bytes)
                .fold(fixed, u64::saturating_add);
            continue;
        }
        items2.push((idx.clone(), keep.iter().map(|&k| tys[k]).collect()));
        table2.push(
            per.iter()
                .map(|m| keep.iter().map(|&k| m[k]).collect())
                .collect(),
        );
        direct2.push(d.as_ref().map(|d| keep.iter().map(|&k| d[k]).collect()));
    }
    let budget = budget.checked_sub(fixed)?;
    let opts = mix::options(base, &items2, &table2, &direct2, alpha_of);
    let sol = mix::solve(&mix::costs(&opts), budget, mix::GRID_CELLS)?;
    let picks: Vec<&[usize]> = opts
        .iter()
        .zip(&sol.choice)
        .map(|(o, &k)| o[k].pick.as_slice())
        .collect();
    let mut q = base.clone();
    mix::apply(&mut q, &items2, &picks, "mix (preset + knapsack)").ok()?;
    let changed = q
        .entries
        .iter()
        .zip(&base.entries)
        .any(|(a, b)| a.dst != b.dst);
    changed.then_some(q)
}

/// The plan's types as one key (`name=type;…`), hashed: what the mix cache stores a measured
/// plan's KLD under. A plan measured on row samples (`cap`, [`measure`]) holds a different
/// estimate than one measured whole, so its key carries the cap (`;rows>N`).
pub(super) fn plan_key(plan: &Plan, cap: Option<u64>) -> String {
    let mut s = String::new();
    for e in &plan.entries {
        s.push_str(&e.name);
        s.push('=');
        s.push_str(e.dst.name());
        s.push(';');
    }
    if let Some(c) = cap {
        s.push_str(&format!("rows>{c}"));
    }
    blake3::hash(s.as_bytes()).to_hex().to_string()
}

/// The suffix of a candidate taken from the cache's plans of another size.
const KEPT: &str = " (measured at another size)";

/// `kept`'s plan (from `--mix-cache`) with the lowest measured KLD in `known` among those that
/// `fits` and are not among `cands`, rebuilt on `plan`; None when none does (or a kept plan's
/// tensors are not `plan`'s: another model's plans never reach here, the cache is keyed by it).
fn best_kept(
    plan: &Plan,
    kept: &BTreeMap<String, PlanTypes>,
    known: &BTreeMap<String, f64>,
    cap: Option<u64>,
    cands: &[Candidate],
    fits: &dyn Fn(&Plan) -> bool,
) -> Option<Candidate> {
    let mut best: Option<(f64, Candidate)> = None;
    for (k, p) in kept {
        let Some(&kld) = known.get(k) else { continue };
        if best.as_ref().is_some_and(|(b, _)| *b <= kld) || p.types.len() != plan.entries.len() {
            continue;
        }
        let mut q = plan.clone();
        let mut ok = true;
        for (i, (name, ty)) in p.types.iter().enumerate() {
            ok = q.entries[i].name == *name
                && (q.entries[i].dst == *ty
                    || set_type(&mut q, i, *ty, "mix: measured at another size").is_ok());
            if !ok {
                break;
            }
        }
        if !ok
            || plan_key(&q, cap) != *k
            || cands.iter().any(|c| super::same_types(&c.plan, &q))
            || !fits(&q)
        {
            continue;
        }
        let name = if p.name.ends_with(KEPT) {
            p.name.clone()
        } else {
            format!("{}{KEPT}", p.name)
        };
        best = Some((kld, Candidate { name, plan: q }));
    }
    best.map(|(_, c)| c)
}

/// Elements above which a measured plan's tensor is encoded on a row sample: the probes' cap
/// ([`super::probe::probe_elements`]), or `TQ_PLAN_ELEMENTS` when set to a positive integer (a
/// measurement knob: compare sampled and whole measurements of the same plans).
pub(super) fn plan_elements() -> u64 {
    std::env::var("TQ_PLAN_ELEMENTS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(super::probe::probe_elements)
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
            e.dims.len() == 2
                && e.dims.iter().product::<u64>() > cap
                && super::fit::group_of(calib, &e.name).is_some()
        })
        .then_some(cap)
}

/// One (tensor, type) of a stage, encoded once for every plan that holds it.
enum Enc {
    Whole(Arc<Vec<u8>>),
    Rows(super::probe::RowProbe),
}

/// The plan as convert executes it: LDLQ or imatrix marks from the calibration.
fn marked(plan: &Plan, calib: &Calibration) -> Plan {
    let mut p = plan.clone();
    super::fit::mark(&mut p, calib);
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
    cap: Option<u64>,
    store: Option<&Store>,
) -> Result<Vec<(f64, bool)>> {
    let todo: Vec<usize> = (0..cands.len())
        .filter(|&k| !known.contains_key(&plan_key(&cands[k].plan, cap)))
        .collect();
    if todo.is_empty() {
        // Every plan's KLD is known (the mix cache): no pass, no calibration pass.
        return Ok(cands
            .iter()
            .map(|c| (known[&plan_key(&c.plan, cap)], true))
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
                    m.entry(s).or_default().push(i);
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
        let hs = cur.borrow();
        let calib = match calib {
            Calibration::Stream(_) => &Calibration::Memory(&hs),
            c => c,
        };
        if k == 0 {
            // The stage's first plan (whether or not it changes anything here): encode what
            // every plan needs for this stage.
            held.clear();
            let mut want: Vec<(Option<String>, TensorType, usize, usize)> = vec![];
            let mut seen = BTreeSet::new();
            for (q, (p, mq)) in marked.iter().zip(&by_stage).enumerate() {
                for &i in mq.get(&stage).map_or(&[][..], |x| x.as_slice()) {
                    if seen.insert((i, p.entries[i].dst)) {
                        let g = super::fit::group_of(calib, &p.entries[i].name);
                        want.push((g, p.entries[i].dst, i, q));
                    }
                }
            }
            // A Hessian group's encodings in a row, so its LDLQ factors are built once.
            want.sort();
            let mut enc = super::fit::ProbeEncoder::default();
            for (_, ty, i, q) in want {
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
                        None => {
                            let b = super::fit::encode_entry(src, p, i, calib)?;
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
            None => (known[&plan_key(&cands[k].plan, cap)], true),
        })
        .collect())
}

/// The order to try the candidates in: least measured KLD first, ties to the earlier.
pub(super) fn ranking(klds: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..klds.len()).collect();
    order.sort_by(|&a, &b| klds[a].total_cmp(&klds[b]).then(a.cmp(&b)));
    order
}

/// The report's rows for the candidates.
pub(super) fn tried(
    cands: &[Candidate],
    files: &[u64],
    predicted: &[Option<f64>],
    calibrated: &[Option<f64>],
    klds: &[(f64, bool)],
) -> Vec<Tried> {
    cands
        .iter()
        .enumerate()
        .map(|(k, c)| Tried {
            name: c.name.clone(),
            file: files[k],
            predicted: predicted[k],
            calibrated: calibrated[k],
            kld: klds[k].0,
            cached: klds[k].1,
        })
        .collect()
}

/// `plan`'s summed calibrated error and predicted KLD under the fit (None when a tensor holds a
/// type that is not one of its item's candidates, as a preset's may).
pub(super) fn predict(
    plan: &Plan,
    items: &[(Vec<usize>, Vec<TensorType>)],
    table: &mix::Table,
    direct: &[Option<Vec<f64>>],
    alpha_of: &dyn Fn(&str) -> f64,
) -> (f64, Option<f64>) {
    let (mut err, mut cost, mut known) = (0.0, 0.0, true);
    for ((idx, tys), (per, d)) in items.iter().zip(table.iter().zip(direct)) {
        let ks: Vec<Option<usize>> = idx
            .iter()
            .map(|&i| tys.iter().position(|t| *t == plan.entries[i].dst))
            .collect();
        match d {
            Some(d) => match ks.first().copied().flatten() {
                Some(k) => cost += d[k],
                None => known = false,
            },
            None => {
                for ((m, &i), k) in per.iter().zip(idx).zip(&ks) {
                    match k {
                        Some(k) => {
                            err += m[*k].err;
                            cost += alpha_of(&plan.entries[i].name) * m[*k].err;
                        }
                        None => known = false,
                    }
                }
            }
        }
    }
    (err, known.then_some(cost))
}

/// What the best-of-few step needs besides the plan and the report.
pub(super) struct BestOf<'a> {
    pub(super) input: &'a Path,
    pub(super) src: &'a dyn TensorSource,
    pub(super) profile: &'a Profile,
    pub(super) o: &'a MixOpts<'a>,
    pub(super) calib: &'a Calibration<'a>,
    pub(super) items: &'a [(Vec<usize>, Vec<TensorType>)],
    pub(super) table: &'a mix::Table,
    pub(super) direct: &'a [Option<Vec<f64>>],
    pub(super) alpha_of: &'a dyn Fn(&str) -> f64,
    pub(super) global: f64,
    pub(super) calibrated: bool,
    /// The mixed tensors' bytes (the knapsack's budget).
    pub(super) budget: u64,
    pub(super) text: &'a Path,
    pub(super) size_of: &'a dyn Fn(&Plan, &MixReport) -> Result<u64>,
    /// The activation-rounding part of `table` (act.rs), when measured: for the report.
    pub(super) act: Option<&'a [Vec<Vec<f64>>]>,
}

/// Best of few, measured (best.rs): the knapsack's plan (on `plan`), the knapsack's under one α
/// for all roles (when roles have their own), and the largest presets that fit (default
/// candidates only: --types is the user's choice of types), each measured on the KLD windows
/// unless `known`; the best measured that fits is set on `plan` and `rep`. The measured plans join
/// `known` (and their summed predictions `sums`), and the calibration is refitted.
pub(super) fn best_of_few(
    b: &BestOf,
    plan: &mut Plan,
    rep: &mut MixReport,
    known: &mut BTreeMap<String, f64>,
    sums: &mut BTreeMap<String, f64>,
    kept: &mut BTreeMap<String, PlanTypes>,
) -> Result<()> {
    let (items, table, direct, alpha_of) = (b.items, b.table, b.direct, b.alpha_of);
    let mut cands = vec![Candidate {
        name: "knapsack".into(),
        plan: plan.clone(),
    }];
    if rep.role_alpha.len() > 1 {
        let one = mix::options(plan, items, table, direct, &|_| b.global);
        if let Some(s) = mix::solve(&mix::costs(&one), b.budget, mix::GRID_CELLS) {
            let picks: Vec<&[usize]> = one
                .iter()
                .zip(&s.choice)
                .map(|(o, &k)| o[k].pick.as_slice())
                .collect();
            let mut q = plan.clone();
            mix::apply(&mut q, items, &picks, "mix (one alpha)")?;
            if !super::same_types(&q, plan) {
                cands.push(Candidate {
                    name: "knapsack, one alpha".into(),
                    plan: q,
                });
            }
        }
    }
    let mut presets = vec![];
    if b.o.types.is_none() {
        for c in preset_plans(b.src, plan, items, b.profile, b.calibrated) {
            let size = (b.size_of)(&c.plan, rep)?;
            if size <= rep.target && !cands.iter().any(|k| super::same_types(&k.plan, &c.plan)) {
                presets.push((size, c));
            }
        }
    }
    // The largest first (ties by the presets' order), then the few kept.
    presets.sort_by_key(|(s, _)| std::cmp::Reverse(*s));
    for (_, c) in presets.into_iter().take(PRESETS_MEASURED) {
        // The preset with the bytes it leaves spent by the knapsack, when that changes it.
        let up = upgrade(&c.plan, items, table, direct, alpha_of, b.budget)
            .filter(|q| (b.size_of)(q, rep).is_ok_and(|s| s <= rep.target));
        let name = format!("{} + knapsack", c.name);
        if !cands.iter().any(|k| super::same_types(&k.plan, &c.plan)) {
            cands.push(c);
        }
        if let Some(q) = up {
            if !cands.iter().any(|k| super::same_types(&k.plan, &q)) {
                cands.push(Candidate { name, plan: q });
            }
        }
    }
    let cap = sampling(plan, items, b.calib, plan_elements());
    // The best plan another size measured (`--mix-cache`) that fits this one: its KLD is known, so
    // it costs no pass, and a larger target never writes worse than a smaller one measured.
    if let Some(c) = best_kept(plan, kept, known, cap, &cands, &|q| {
        (b.size_of)(q, rep).is_ok_and(|s| s <= rep.target)
    }) {
        cands.push(c);
    }
    let mut files = vec![];
    let mut predicted = vec![];
    for c in &cands {
        files.push((b.size_of)(&c.plan, rep)?);
        let (_, pred) = predict(&c.plan, items, table, direct, alpha_of);
        predicted.push(pred.filter(|_| rep.alpha.is_some()));
    }
    // Reference logits: the fit's, or (its measurements from the cache) computed now.
    let ref_path = match &rep.ref_logits {
        Some(r) => r.clone(),
        None => {
            let dir = std::env::temp_dir().join(format!("tq-mix-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            let r = dir.join("ref.logits");
            rep.ref_logits = Some(r.clone());
            super::fit::reference_logits(b.input, b.text, b.o.kld_windows, &r, b.o.quiet)?;
            r
        }
    };
    // `--mix-cache`: the encodings are kept beside it for the next size (or rerun).
    let store = match &b.o.cache {
        Some((p, k)) => Some(Store::open(p, k)?),
        None => None,
    };
    let klds = measure(
        b.input,
        b.src,
        &cands,
        b.profile,
        b.calib,
        &ref_path,
        b.o.kld_windows,
        known,
        b.o.quiet,
        b.o.stream,
        cap,
        store.as_ref(),
    )?;
    let keys: Vec<String> = cands.iter().map(|c| plan_key(&c.plan, cap)).collect();
    for (k, c) in keys.iter().zip(&cands) {
        kept.entry(k.clone()).or_insert_with(|| PlanTypes {
            name: c.name.clone(),
            types: c
                .plan
                .entries
                .iter()
                .map(|e| (e.name.clone(), e.dst))
                .collect(),
        });
    }
    for ((k, (kld, _)), p) in keys.iter().zip(&klds).zip(&predicted) {
        known.insert(k.clone(), *kld);
        if let Some(p) = p {
            sums.insert(k.clone(), *p);
        }
    }
    let pts = super::calibrate::points(known, sums);
    // Each plan's calibrated prediction leaves its own measurement out.
    let cal_of = |k: &str, p: Option<f64>| {
        let c = super::calibrate::KldCalibration::fit_except(&pts, Some(k));
        (c, p.zip(c).map(|(p, c)| c.apply(p)))
    };
    let calibrated: Vec<Option<f64>> = keys
        .iter()
        .zip(&predicted)
        .map(|(k, p)| cal_of(k, *p).1)
        .collect();
    rep.tried = tried(&cands, &files, &predicted, &calibrated, &klds);
    // The best measured that still fits once its own numbers are in the metadata.
    let ks: Vec<f64> = klds.iter().map(|k| k.0).collect();
    rep.chosen = None;
    // The knapsack's plan last of all when nothing fits (it fits by construction).
    let order = ranking(&ks).into_iter().map(|w| (w, false));
    for (w, fallback) in order.chain([(0, true)]) {
        let (err, pred) = predict(&cands[w].plan, items, table, direct, alpha_of);
        rep.err = err;
        rep.act_err = b
            .act
            .and_then(|a| super::act::of_plan(&cands[w].plan, items, direct, a));
        rep.predicted = pred.filter(|_| rep.alpha.is_some());
        rep.calibration = cal_of(&keys[w], None).0;
        let size = (b.size_of)(&cands[w].plan, rep)?;
        if size <= rep.target || fallback {
            *plan = cands[w].plan.clone();
            rep.file = size;
            rep.chosen = Some(w);
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calib::input::{calibrate_text, TextOptions};
    use crate::plan::{self, Request};

    /// A preset's plan with bytes to spare: the upgrade keeps every tensor at its preset type or
    /// a larger candidate, stays within the budget, spends it, and changes nothing without room.
    #[test]
    fn upgrade_spends_the_leftover_on_larger_types_only() {
        let profile = Profile::default();
        let fx = crate::gguf_gen::tiny_llama_tok(2, 256, 256);
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, fx.bytes).unwrap();
        let src = crate::source::open(&model, &profile).unwrap();
        let req = Request::new(TensorType::Q4K, &plan::recipe::RECIPES[0]);
        let plan = plan::plan(src.tensors(), &req, &profile).unwrap();
        let types = mix::default_candidates(&profile);
        let items = mix::items(&plan, &types, &profile);
        let base = preset_plans(src.as_ref(), &plan, &items, &profile, true)
            .into_iter()
            .find(|c| c.name == "preset Q4_K_M")
            .unwrap()
            .plan;
        // Error falls with bytes: 2^-bpw per candidate.
        let table: mix::Table = items
            .iter()
            .map(|(idx, tys)| {
                idx.iter()
                    .map(|_| {
                        tys.iter()
                            .map(|t| crate::quant::sensitivity::Estimate {
                                err: (-t.bpw()).exp2(),
                                se: 0.0,
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let direct = vec![None; items.len()];
        let mixed = |p: &Plan| -> u64 {
            items
                .iter()
                .flat_map(|(idx, _)| idx)
                .map(|&i| p.entries[i].bytes)
                .sum()
        };
        let b0 = mixed(&base);
        assert!(upgrade(&base, &items, &table, &direct, &|_| 1.0, b0).is_none());
        let budget = b0 + b0 / 5;
        let up = upgrade(&base, &items, &table, &direct, &|_| 1.0, budget).unwrap();
        assert!(mixed(&up) <= budget && mixed(&up) > b0);
        for &i in items.iter().flat_map(|(idx, _)| idx) {
            assert!(
                up.entries[i].bytes >= base.entries[i].bytes,
                "{}",
                up.entries[i].name
            );
        }
    }

    /// `src` without its output projection: the head reads the token embeddings (tied).
    fn untie(src: &Path, dst: &Path) {
        let f = GgufFile::open(src).unwrap();
        let keep: Vec<_> = f
            .tensors
            .iter()
            .filter(|t| t.name != "output.weight")
            .collect();
        let specs: Vec<_> = keep.iter().map(|t| t.spec()).collect();
        let mut w = crate::gguf::GgufWriter::create(dst, f.version, &f.metadata, &specs).unwrap();
        for t in &keep {
            w.write_data(f.tensor_data(t)).unwrap();
        }
        w.finish().unwrap();
    }

    /// Two candidates on a real (tiny) model: a deliberately poor "knapsack" plan (every matrix
    /// at q2_K) and a preset's plan. Measured in memory, each KLD equals the KLD of the file
    /// convert writes for that plan (evaluated from disk), and the ranking puts the better
    /// measured plan first whichever it is listed as.
    #[test]
    fn measured_plans_equal_their_files_and_the_best_measured_wins() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, crate::gguf_gen::tiny_llama_tok(2, 256, 256).bytes).unwrap();
        measured_equal_files(&model, dir.path());
    }

    /// The same with the output projection tied to the token embeddings: a plan's token_embd
    /// is read by the embedding lookup and by the head, streamed into both.
    #[test]
    fn measured_plans_equal_their_files_with_tied_embeddings() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full.gguf");
        std::fs::write(&full, crate::gguf_gen::tiny_llama_tok(2, 256, 256).bytes).unwrap();
        let model = dir.path().join("tied.gguf");
        untie(&full, &model);
        measured_equal_files(&model, dir.path());
    }

    /// The fixture's calibration, source, and two candidates: a deliberately poor "knapsack"
    /// plan (every mixed tensor at q2_K) and llama.cpp's Q4_K_M; with the reference logits of 2
    /// windows of its text at `dir/ref.logits`.
    struct TwoPlans {
        hs: crate::quant::Hessians,
        src: Box<dyn TensorSource>,
        cands: Vec<Candidate>,
        items: Vec<(Vec<usize>, Vec<TensorType>)>,
        ref_path: std::path::PathBuf,
    }

    fn two_plans(model: &Path, dir: &Path) -> TwoPlans {
        let text = dir.join("t.txt");
        std::fs::write(&text, crate::gguf_gen::pseudo_text(2500)).unwrap();
        let profile = Profile::default();
        let o = TextOptions {
            tokens: 512,
            ctx: 64,
            batch: 4,
            quiet: true,
        };
        let hs = calibrate_text(model, &profile, &text, &o).unwrap();
        let src = crate::source::open(model, &profile).unwrap();
        let req = Request::new(TensorType::Q4K, &plan::recipe::RECIPES[0]);
        let mut plan = plan::plan(src.tensors(), &req, &profile).unwrap();
        plan.ldlq.band = Some(64);
        let types = mix::default_candidates(&profile);
        let items = mix::items(&plan, &types, &profile);
        // The poor plan: every mixed tensor at q2_K.
        let mut poor = plan.clone();
        for &i in items.iter().flat_map(|(idx, _)| idx) {
            set_type(&mut poor, i, TensorType::Q2K, "mix").unwrap();
        }
        let te = poor
            .entries
            .iter()
            .find(|e| e.name == "token_embd.weight")
            .unwrap();
        assert_ne!(te.action, Action::Copy, "token_embd is measured quantized");
        let presets = preset_plans(src.as_ref(), &plan, &items, &profile, true);
        let q4km = presets
            .into_iter()
            .find(|c| c.name == "preset Q4_K_M")
            .expect("Q4_K_M is a candidate on a 256-wide model");
        let cands = vec![
            Candidate {
                name: "knapsack".into(),
                plan: poor,
            },
            q4km,
        ];
        let ref_path = dir.join("ref.logits");
        super::super::fit::reference_logits(model, &text, 2, &ref_path, true).unwrap();
        TwoPlans {
            hs,
            src,
            cands,
            items,
            ref_path,
        }
    }

    fn measured_equal_files(model: &Path, dir: &Path) {
        let p = |n: &str| dir.join(n);
        let model = model.to_path_buf();
        let profile = Profile::default();
        let TwoPlans {
            hs,
            src,
            cands,
            ref_path,
            ..
        } = two_plans(&model, dir);
        let calib = Calibration::Memory(&hs);
        let key = super::super::cache::Key(vec![("model", "m".into())]);
        let store = Store::open(&p("mix-cache.json"), &key).unwrap();
        let klds = measure(
            &model,
            src.as_ref(),
            &cands,
            &profile,
            &calib,
            &ref_path,
            2,
            &BTreeMap::new(),
            true,
            None,
            None,
            Some(&store),
        )
        .unwrap();
        // A cold store: nothing read back, except a tied token_embd's second stage (the head),
        // which reads what the first (the embedding lookup) kept.
        let tied = !cands[0]
            .plan
            .entries
            .iter()
            .any(|e| e.name == "output.weight");
        if !tied {
            assert_eq!(store.hits(), 0, "a cold store");
        }
        // Each measured KLD is the written file's.
        for (k, c) in cands.iter().enumerate() {
            let out = p(&format!("c{k}.gguf"));
            let m = marked(&c.plan, &calib);
            super::super::fit::write_plan(src.as_ref(), &m, &profile, &calib, &out).unwrap();
            let disk = super::super::fit::kld_of(&out, &ref_path, 2, "", true).unwrap();
            let mem = klds[k].0;
            assert!(
                (mem - disk).abs() <= 1e-9 * disk.max(1e-6),
                "{}: in memory {mem} vs file {disk}",
                c.name
            );
        }
        let k: Vec<f64> = klds.iter().map(|x| x.0).collect();
        assert!(k[1] < k[0], "q4_K_M {} vs all-q2_K {}", k[1], k[0]);
        assert_eq!(ranking(&k), vec![1, 0], "the preset is measured better");
        assert_eq!(ranking(&[k[1], k[0]]), vec![0, 1]);
        // Ties go to the earlier candidate; a known KLD is not measured again.
        assert_eq!(ranking(&[0.5, 0.5, 0.25]), vec![2, 0, 1]);
        let known: BTreeMap<String, f64> = [(plan_key(&cands[0].plan, None), 7.0)].into();
        let s2 = Store::open(&p("mix-cache.json"), &key).unwrap();
        let again = measure(
            &model,
            src.as_ref(),
            &cands,
            &profile,
            &calib,
            &ref_path,
            2,
            &known,
            true,
            None,
            None,
            Some(&s2),
        )
        .unwrap();
        assert_eq!(again[0], (7.0, true));
        // Measured again from the kept encodings: the same KLD, bit for bit.
        assert_eq!(again[1], (k[1], false));
        // Every encoding of the second plan came from the store.
        let reopened = Store::open(&p("mix-cache.json"), &key).unwrap();
        let m = marked(&cands[1].plan, &calib);
        let quantized: Vec<usize> = (0..m.entries.len())
            .filter(|&i| m.entries[i].action != Action::Copy)
            .collect();
        assert!(!quantized.is_empty());
        // (A tied token_embd is read twice: by the embedding lookup and by the head.)
        assert_eq!(
            s2.hits(),
            quantized.len() + tied as usize,
            "no encoding made again"
        );
        for &i in &quantized {
            assert!(reopened.get(&m, i).is_some(), "{}", m.entries[i].name);
        }
        // And a read-back encoding is what convert writes.
        let i = quantized[0];
        let direct = super::super::fit::encode_entry(src.as_ref(), &m, i, &calib).unwrap();
        assert!(reopened.get(&m, i).unwrap() == direct);
    }

    /// Plans measured on row samples (every mixed tensor of the 2-block fixture is 256 × 256;
    /// a cap of 4096 elements samples 16 of its 256 rows, error amplified ×4, as a 7B attention
    /// tensor is sampled): each KLD estimates the whole plan's within the factor stated below,
    /// the better plan still ranks first, the sampled measurement is keyed apart from the whole
    /// one, and a cap no tensor is over measures bit for bit as without one.
    #[test]
    fn plans_measured_on_row_samples_estimate_the_whole_plans() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, crate::gguf_gen::tiny_llama_tok(2, 256, 256).bytes).unwrap();
        let profile = Profile::default();
        let t = two_plans(&model, dir.path());
        let calib = Calibration::Memory(&t.hs);
        let run = |cap: Option<u64>| -> Vec<f64> {
            measure(
                &model,
                t.src.as_ref(),
                &t.cands,
                &profile,
                &calib,
                &t.ref_path,
                2,
                &BTreeMap::new(),
                true,
                None,
                cap,
                None,
            )
            .unwrap()
            .into_iter()
            .map(|k| k.0)
            .collect()
        };
        let plan = &t.cands[0].plan;
        assert_eq!(sampling(plan, &t.items, &calib, 1 << 16), None);
        let cap = sampling(plan, &t.items, &calib, 4096);
        assert_eq!(cap, Some(4096));
        assert_ne!(plan_key(plan, cap), plan_key(plan, None));
        let whole = run(None);
        assert_eq!(run(Some(1 << 16)), whole, "no tensor over the cap: whole");
        let sampled = run(cap);
        for (k, c) in t.cands.iter().enumerate() {
            let r = sampled[k] / whole[k];
            eprintln!(
                "{}: sampled {} whole {} ratio {r}",
                c.name, sampled[k], whole[k]
            );
            assert!(
                (1.0 / FACTOR..FACTOR).contains(&r),
                "{}: sampled {} vs whole {}",
                c.name,
                sampled[k],
                whole[k]
            );
        }
        assert_eq!(ranking(&sampled), ranking(&whole));
    }

    /// How far a sampled measurement may be from the whole one on the fixture.
    const FACTOR: f64 = 1.5;
}
