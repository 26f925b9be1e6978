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
pub(super) use super::measured::Candidate;
use super::measured::{
    each_cost, extrapolation, measure, plan_blocks, plan_elements, plan_key, sampling, Scope,
};
use super::report::{MixReport, Tried};
use super::store::Store;
use super::MixOpts;
use crate::error::{Error, Result};
use crate::plan::mix::{self, Calibration};
use crate::plan::{preset, Action, Plan};
use crate::source::TensorSource;
use crate::types::profile::Profile;
use crate::types::TensorType;
use std::collections::BTreeMap;
use std::path::Path;

/// How many of the largest llama.cpp presets that fit the target are measured (a smaller
/// preset of the same family is rarely better per byte, and each costs one encode + one pass).
pub(super) const PRESETS_MEASURED: usize = 3;

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

/// The suffix of a candidate taken from the cache's plans of another size.
const KEPT: &str = " (measured at another size)";

/// `kept`'s plan (from `--mix-cache`) with the lowest measured KLD in `known` among those that
/// `fits` and are not among `cands`, rebuilt on `plan`; None when none does (or a kept plan's
/// tensors are not `plan`'s: another model's plans never reach here, the cache is keyed by it).
fn best_kept(
    plan: &Plan,
    kept: &BTreeMap<String, PlanTypes>,
    known: &BTreeMap<String, f64>,
    scope: &Scope,
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
            || plan_key(&q, scope) != *k
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
    each_cost(plan, items, table, direct, alpha_of, &mut |_, c| match c {
        Some((e, k)) => {
            err += e;
            cost += k;
        }
        None => known = false,
    });
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
    /// token_embd's candidates measured in steps (direct.rs): every plan's type measured here.
    pub(super) lazy: Option<&'a super::direct::Lazy>,
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
    direct: &mut [Option<Vec<f64>>],
) -> Result<()> {
    let (items, table, alpha_of) = (b.items, b.table, b.alpha_of);
    let all = &*direct;
    let mut cands = vec![Candidate {
        name: "knapsack".into(),
        plan: plan.clone(),
    }];
    if rep.role_alpha.len() > 1 {
        let one = mix::options(plan, items, table, all, &|_| b.global);
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
        let up = upgrade(&c.plan, items, table, all, alpha_of, b.budget)
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
    let scope = Scope {
        cap: sampling(plan, items, b.calib, plan_elements()),
        blocks: plan_blocks(b.o.exact_blocks, plan),
    };
    if let (Some(bl), false) = (scope.blocks, b.o.quiet) {
        let l: Vec<String> = bl.list().iter().map(|l| l.to_string()).collect();
        eprintln!(
            "tq: mix: the measured plans change the tensors of blocks {} of {} only; each plan's KLD is scaled by its predicted whole over the part measured (--mix-exact-blocks)",
            l.join(", "),
            bl.n_layer
        );
    }
    // The best plan another size measured (`--mix-cache`) that fits this one: its KLD is known, so
    // it costs no pass, and a larger target never writes worse than a smaller one measured.
    if let Some(c) = best_kept(plan, kept, known, &scope, &cands, &|q| {
        (b.size_of)(q, rep).is_ok_and(|s| s <= rep.target)
    }) {
        cands.push(c);
    }
    if let Some(l) = b.lazy {
        let ctx = super::direct::Ctx {
            input: b.input,
            src: b.src,
            profile: b.profile,
            calib: b.calib,
            o: b.o,
            text: b.text,
        };
        let plans: Vec<&Plan> = cands.iter().map(|c| &c.plan).collect();
        l.cover(&ctx, &plans, items, direct, rep)?;
    }
    let direct = &*direct;
    let mut files = vec![];
    let mut predicted = vec![];
    for c in &cands {
        files.push((b.size_of)(&c.plan, rep)?);
        let (_, pred) = predict(&c.plan, items, table, direct, alpha_of);
        predicted.push(pred.filter(|_| rep.alpha.is_some()));
    }
    // Reference logits: the fit's, or (its measurements from the cache) computed now.
    let ref_path = super::direct::ensure_reference(rep, b.input, b.text, b.o)?;
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
        scope,
        store.as_ref(),
    )?;
    // A plan measured on some blocks: its KLD stands for the whole plan's by extrapolation (one
    // known from the cache was scaled when it was measured).
    let klds: Vec<(f64, bool)> = klds
        .into_iter()
        .zip(&cands)
        .map(|((kld, cached), c)| match cached {
            true => (kld, true),
            false => (
                kld * extrapolation(&c.plan, items, table, direct, alpha_of, &scope),
                false,
            ),
        })
        .collect();
    let keys: Vec<String> = cands.iter().map(|c| plan_key(&c.plan, &scope)).collect();
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
    use super::super::measured::marked;
    use super::*;
    use crate::calib::input::{calibrate_text, TextOptions};
    use crate::gguf::GgufFile;
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
        super::super::substitute::reference_logits(model, &text, 2, &ref_path, true).unwrap();
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
        let run = |known: &BTreeMap<String, f64>, store: Option<&Store>| {
            measure(
                &model,
                src.as_ref(),
                &cands,
                &profile,
                &calib,
                &ref_path,
                2,
                known,
                true,
                None,
                Scope::default(),
                store,
            )
            .unwrap()
        };
        let klds = run(&BTreeMap::new(), Some(&store));
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
            super::super::substitute::write_plan(src.as_ref(), &m, &profile, &calib, &out).unwrap();
            let disk = super::super::substitute::kld_of(&out, &ref_path, 2, "", true).unwrap();
            let mem = klds[k].0;
            assert!(
                (mem - disk).abs() <= 1e-9 * disk.max(1e-6),
                "{}: in memory {mem} vs file {disk}",
                c.name
            );
        }
        let k: Vec<f64> = klds.iter().map(|x| x.0).collect();
        // Without a store an untied token_embd is encoded in the windows' rows only: the same
        // KLDs, bit for bit.
        let cold = run(&BTreeMap::new(), None);
        for (a, b) in klds.iter().zip(&cold) {
            assert_eq!(a.0.to_bits(), b.0.to_bits(), "{} vs {}", a.0, b.0);
        }
        let embd_changed = cands.iter().any(|c| {
            c.plan
                .entries
                .iter()
                .any(|e| e.name == "token_embd.weight" && e.action != Action::Copy)
        });
        assert!(embd_changed, "a plan quantizes token_embd");
        assert!(k[1] < k[0], "q4_K_M {} vs all-q2_K {}", k[1], k[0]);
        assert_eq!(ranking(&k), vec![1, 0], "the preset is measured better");
        assert_eq!(ranking(&[k[1], k[0]]), vec![0, 1]);
        // Ties go to the earlier candidate; a known KLD is not measured again.
        assert_eq!(ranking(&[0.5, 0.5, 0.25]), vec![2, 0, 1]);
        let known: BTreeMap<String, f64> =
            [(plan_key(&cands[0].plan, &Scope::default()), 7.0)].into();
        let s2 = Store::open(&p("mix-cache.json"), &key).unwrap();
        let again = run(&known, Some(&s2));
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
        let direct = super::super::substitute::encode_entry(src.as_ref(), &m, i, &calib).unwrap();
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
        let t = two_plans(&model, dir.path());
        let calib = Calibration::Memory(&t.hs);
        let run = |cap| klds_of(&model, &t, &t.cands, Scope { cap, blocks: None });
        let plan = &t.cands[0].plan;
        assert_eq!(sampling(plan, &t.items, &calib, 1 << 16), None);
        let cap = sampling(plan, &t.items, &calib, 4096);
        assert_eq!(cap, Some(4096));
        let at = |cap| Scope { cap, blocks: None };
        assert_ne!(plan_key(plan, &at(cap)), plan_key(plan, &Scope::default()));
        let whole = run(None);
        assert_eq!(run(Some(1 << 16)), whole, "no tensor over the cap: whole");
        near_the_whole("sampled", &t.cands, &run(cap), &whole);
    }

    /// How far a sampled measurement may be from the whole one on the fixture.
    const FACTOR: f64 = 1.5;

    /// `cands`' KLDs measured on the fixture (`t`, fresh: nothing known) under `scope`.
    fn klds_of(model: &Path, t: &TwoPlans, cands: &[Candidate], scope: Scope) -> Vec<f64> {
        measure(
            model,
            t.src.as_ref(),
            cands,
            &Profile::default(),
            &Calibration::Memory(&t.hs),
            &t.ref_path,
            2,
            &BTreeMap::new(),
            true,
            None,
            scope,
            None,
        )
        .unwrap()
        .into_iter()
        .map(|k| k.0)
        .collect()
    }

    /// Each estimate within [`FACTOR`] of the whole plan's KLD, and the same ranking.
    fn near_the_whole(what: &str, cands: &[Candidate], est: &[f64], whole: &[f64]) {
        for (k, c) in cands.iter().enumerate() {
            let r = est[k] / whole[k];
            eprintln!("{}: {what} {} whole {} ratio {r}", c.name, est[k], whole[k]);
            assert!(
                (1.0 / FACTOR..FACTOR).contains(&r),
                "{}: {what} {} vs whole {}",
                c.name,
                est[k],
                whole[k]
            );
        }
        assert_eq!(ranking(est), ranking(whole));
    }

    /// Plans measured on blocks 0 and 2 of 3 (`Scope::blocks`): each measured KLD is, bit for
    /// bit, that of the plan with block 1's tensors kept as the input's (nothing is encoded
    /// there); the extrapolated KLD stands for the whole plan's within the factor below, the
    /// better plan still ranks first, and the key differs from the whole measurement's.
    #[test]
    fn plans_measured_on_some_blocks_extrapolate_to_the_whole_plans() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, crate::gguf_gen::tiny_llama_tok(3, 256, 256).bytes).unwrap();
        let t = two_plans(&model, dir.path());
        let calib = Calibration::Memory(&t.hs);
        let plan = &t.cands[0].plan;
        let blocks = mix::ExactBlocks {
            count: 2,
            ..mix::ExactBlocks::of_plan(2, plan)
        };
        assert_eq!((blocks.n_layer, blocks.list()), (3, vec![0, 2]));
        let scope = Scope {
            cap: None,
            blocks: Some(blocks),
        };
        assert_ne!(plan_key(plan, &scope), plan_key(plan, &Scope::default()));
        let run = |cands: &[Candidate], scope| klds_of(&model, &t, cands, scope);
        let part = run(&t.cands, scope);
        // The same plans with block 1 as the input's, measured whole.
        let kept: Vec<Candidate> = t
            .cands
            .iter()
            .map(|c| {
                let mut q = c.plan.clone();
                for i in 0..q.entries.len() {
                    if crate::arch::layer_of(&q.entries[i].name) == Some(1) {
                        let src = q.entries[i].src;
                        set_type(&mut q, i, src, "input").unwrap();
                    }
                }
                assert!(!super::super::same_types(&q, &c.plan));
                Candidate {
                    name: c.name.clone(),
                    plan: q,
                }
            })
            .collect();
        assert_eq!(part, run(&kept, Scope::default()), "block 1 as the input's");
        let whole = run(&t.cands, Scope::default());
        let table = mix::measure(
            t.src.as_ref(),
            plan,
            &t.items,
            &calib,
            crate::quant::sensitivity::Sample {
                rows: 64,
                exact: 64,
            },
            mix::ExactBlocks::ALL,
            &|_, _| {},
        )
        .unwrap();
        let direct = vec![None; t.items.len()];
        let est: Vec<f64> = t
            .cands
            .iter()
            .zip(&part)
            .map(|(c, k)| {
                let x = extrapolation(&c.plan, &t.items, &table, &direct, &|_| 1.0, &scope);
                assert!(x > 1.0, "{}: the part is less than the whole ({x})", c.name);
                k * x
            })
            .collect();
        near_the_whole("extrapolated", &t.cands, &est, &whole);
    }
}
