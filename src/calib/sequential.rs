//! Sequential (GPTQ-style) calibration: the Hessians of block `i` are accumulated from the
//! activations of the model whose blocks `< i` — and whose earlier sub-blocks of block `i` — are
//! already quantized the way `tq convert` will quantize them.
//!
//! It is an [`Observer`] of one forward pass over *all* calibration windows (the runtime goes
//! block by block, so every sub-block sees every window before the next one runs). For each
//! linear set of a block, in the order the runtime meets them (q/k/v, attn_output, gate/up,
//! ffn_down): `linear_input` completes that input's Hessian, then `transform_weights` quantizes the
//! set's weights to their planned type (LDLQ with the just-completed Hessian for TQ types, else
//! round-to-nearest; [`crate::quant::encode_rows`] with [`crate::quant::Encoder`], the bytes `tq convert` writes) and replaces
//! them by their dequantized values, so the set's output — and everything after it — is the
//! quantized model's.

use super::Hessians;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::layer::LinearSet;
use crate::model::runtime::Observer;
use crate::plan::recipe::classify;
use crate::plan::Plan;
use crate::quant::ldlq::Factor;
use crate::source::SourceTensor;
use crate::types::profile::Profile;
use crate::types::TensorType;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What sequential calibration simulates: each block weight's planned type, and LDLQ's settings.
#[derive(Clone, Debug)]
pub struct SeqQuant {
    /// Every 2-D weight inside a block → the type the plan gives it (unchanged when the plan copies).
    pub types: BTreeMap<String, TensorType>,
    /// `--ldlq-band` (`None`: each type's default).
    pub band: Option<usize>,
    /// `--damp` (`None`: each type's default).
    pub damp: Option<f64>,
    /// `--ldlq-refit` (the plan's).
    pub refit: usize,
    /// `--weights` and `--recipe` as given to the planner (recorded, and compared by convert).
    pub weights: String,
    pub recipe: String,
}

impl SeqQuant {
    pub fn from_plan(plan: &Plan, weights: &str, recipe: &str) -> SeqQuant {
        let types = plan
            .entries
            .iter()
            .filter(|e| {
                classify(&e.name).1.is_some() && e.dims.iter().filter(|&&d| d > 1).count() >= 2
            })
            .map(|e| (e.name.clone(), e.dst))
            .collect();
        SeqQuant {
            types,
            band: plan.ldlq.band,
            damp: plan.ldlq.damp,
            refit: plan.ldlq.refit,
            weights: weights.into(),
            recipe: recipe.into(),
        }
    }

    /// What `tq convert --weights W --recipe R` of `f` (default target profile) would write,
    /// reduced to what sequential calibration simulates (`tq calib --sequential`).
    pub fn for_conversion(
        f: &GgufFile,
        weights: &str,
        recipe: &str,
        ldlq: crate::quant::LdlqSettings,
    ) -> Result<SeqQuant> {
        let weights = TensorType::parse(weights)?;
        let r = crate::plan::recipe::parse(recipe)?;
        let req = crate::plan::Request::new(weights, r);
        let tensors: Vec<SourceTensor> = f.tensors.iter().map(SourceTensor::of_gguf).collect();
        let mut p = crate::plan::plan(&tensors, &req, &Profile::default())?;
        p.ldlq = ldlq;
        Ok(SeqQuant::from_plan(&p, weights.name(), r.name))
    }

    fn settings(&self) -> crate::quant::LdlqSettings {
        crate::quant::LdlqSettings {
            band: self.band,
            damp: self.damp,
            refit: self.refit,
            shrink: None,
        }
    }

    /// The effective damping over the simulated types (one number when they share it).
    fn damp_label(&self) -> String {
        self.settings().damp_label_for(self.types.values().copied())
    }

    /// The effective band over the simulated types (one number when they share it).
    fn band_label(&self) -> String {
        self.settings().band_label_for(self.types.values().copied())
    }

    fn types_string(&self) -> String {
        self.types
            .iter()
            .map(|(n, t)| format!("{n}={t}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The `tq.*` keys a sequential Hessian file records.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("tq.sequential".into(), "true".into()),
            ("tq.weights".into(), self.weights.clone()),
            ("tq.recipe".into(), self.recipe.clone()),
            ("tq.ldlq_band".into(), self.band_label()),
            ("tq.damp".into(), self.damp_label()),
            ("tq.ldlq_refit".into(), self.refit.to_string()),
            ("tq.tensor_types".into(), self.types_string()),
        ])
    }

    /// Short form for fingerprints and messages.
    pub fn describe(&self) -> String {
        format!(
            "--weights {} --recipe {} --ldlq-band {} --damp {} --ldlq-refit {}",
            self.weights,
            self.recipe,
            self.band_label(),
            self.damp_label(),
            self.refit
        )
    }
}

/// Compare a Hessian file's metadata with the conversion about to use it. `None` when the file
/// is not sequential or was calibrated for the same quantization; else a one-line description.
pub fn mismatch(meta: &BTreeMap<String, String>, now: &SeqQuant) -> Option<String> {
    if meta.get("tq.sequential").map(String::as_str) != Some("true") {
        return None;
    }
    let mut diffs = vec![];
    let rec_types: BTreeMap<&str, &str> = meta
        .get("tq.tensor_types")
        .map(|s| s.split(',').filter_map(|p| p.split_once('=')).collect())
        .unwrap_or_default();
    let differing: Vec<String> = now
        .types
        .iter()
        .filter(|(n, t)| rec_types.get(n.as_str()).is_some_and(|r| *r != t.name()))
        .map(|(n, t)| format!("{n} {} vs {t}", rec_types[n.as_str()]))
        .collect();
    if let Some(first) = differing.first() {
        diffs.push(format!(
            "{} tensor type(s) differ (e.g. {first})",
            differing.len()
        ));
    }
    let missing = now
        .types
        .keys()
        .filter(|n| !rec_types.contains_key(n.as_str()))
        .count();
    if missing > 0 {
        diffs.push(format!("{missing} tensor(s) not in the calibrated plan"));
    }
    if meta.get("tq.ldlq_band") != Some(&now.band_label()) {
        diffs.push(format!(
            "--ldlq-band {} vs {}",
            meta.get("tq.ldlq_band").map_or("?", |s| s.as_str()),
            now.band_label()
        ));
    }
    if meta.get("tq.damp") != Some(&now.damp_label()) {
        diffs.push(format!(
            "--damp {} vs {}",
            meta.get("tq.damp").map_or("?", |s| s.as_str()),
            now.damp_label()
        ));
    }
    // Files from before --ldlq-refit have no key: they were calibrated with the default.
    let rec_refit = meta
        .get("tq.ldlq_refit")
        .cloned()
        .unwrap_or_else(|| crate::quant::ldlq::Refit::DEFAULT.passes.to_string());
    if rec_refit != now.refit.to_string() {
        diffs.push(format!("--ldlq-refit {rec_refit} vs {}", now.refit));
    }
    if meta.get("tq.weights") != Some(&now.weights) || meta.get("tq.recipe") != Some(&now.recipe) {
        diffs.push(format!(
            "calibrated for --weights {} --recipe {}, converting with --weights {} --recipe {}",
            meta.get("tq.weights").map_or("?", |s| s.as_str()),
            meta.get("tq.recipe").map_or("?", |s| s.as_str()),
            now.weights,
            now.recipe
        ));
    }
    if diffs.is_empty() {
        None
    } else {
        Some(diffs.join("; "))
    }
}

/// The observer: accumulates Hessians (through [`Hessians`]) and quantizes each linear set once
/// its input's Hessian is complete.
pub struct Sequential<'q, 'c> {
    pub hs: Hessians,
    q: &'q SeqQuant,
    /// Blocks below this come from the checkpoint being resumed: their Hessians are loaded and
    /// only used to quantize (the same weights as the interrupted run), not accumulated again.
    pub replay_until: usize,
    /// Called after each block `>= replay_until` with the number of blocks done (writing the
    /// block's Hessians, which it may remove; progress); an error stops the run.
    on_layer: &'c mut dyn FnMut(&mut Hessians, usize) -> Result<()>,
    /// Where the Hessians of blocks `< replay_until` come from (the resumed file), by group key.
    pub load: Option<&'c crate::quant::HessianReader>,
    /// For messages.
    model: String,
    factors: HashMap<String, Arc<Factor>>,
    /// Tensors quantized with LDLQ / round-to-nearest / left as stored.
    pub counts: [usize; 3],
    pub quant_secs: f64,
}

impl<'q, 'c> Sequential<'q, 'c> {
    pub fn new(
        hs: Hessians,
        q: &'q SeqQuant,
        replay_until: usize,
        model: String,
        on_layer: &'c mut dyn FnMut(&mut Hessians, usize) -> Result<()>,
    ) -> Self {
        Sequential {
            hs,
            q,
            replay_until,
            on_layer,
            load: None,
            model,
            factors: HashMap::new(),
            counts: [0; 3],
            quant_secs: 0.0,
        }
    }

    fn quantize_set(&mut self, set: &mut LinearSet) -> Result<()> {
        let k = set.k;
        for seg in &mut set.segments {
            let Some(&dst) = self.q.types.get(&seg.name) else {
                return Err(Error::Unsupported(format!(
                    "{}: {} is not in the quantization plan",
                    self.model, seg.name
                )));
            };
            if dst == seg.ty {
                self.counts[2] += 1;
                continue;
            }
            let w = &mut set.w[seg.off * k..(seg.off + seg.n) * k];
            w.par_chunks(k)
                .enumerate()
                .try_for_each(|(r, row)| crate::quant::check_finite(&seg.name, r as u64, row))?;
            let factor = match self.hs.for_tensor(&seg.name) {
                Some(h) if dst.has_ldlq() && h.n == k => {
                    let key = format!("{:?}:{}", dst.family(), h.tensors.join(","));
                    if !self.factors.contains_key(&key) {
                        let f = crate::quant::ldlq::factor_hessian(
                            dst,
                            h,
                            self.q.settings().damp_for(dst),
                            self.q.settings().shrink_for(dst),
                            self.q.refit,
                            &seg.name,
                        )?;
                        self.factors.insert(key.clone(), Arc::new(f));
                    }
                    Some(self.factors[&key].clone())
                }
                _ => None,
            };
            let enc = crate::quant::Encoder::choose(
                dst,
                factor
                    .as_deref()
                    .map(|f| (f, self.q.settings().band_for(dst))),
                None,
            );
            let bytes = crate::quant::encode_rows(dst, &seg.name, w, k, &enc)?;
            self.counts[if factor.is_some() { 0 } else { 1 }] += 1;
            // Decoded as the engine reads the file: by rows (row-rotated types rotate back here).
            crate::quant::decode_rows(dst, &bytes, w, k, &seg.name)?;
            seg.ty = dst;
        }
        Ok(())
    }
}

impl Observer for Sequential<'_, '_> {
    fn linear_input(
        &mut self,
        layer: Option<usize>,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    ) {
        if layer.is_some_and(|l| l < self.replay_until) {
            return;
        }
        self.hs.linear_input(layer, tensors, x, rows, cols);
    }

    fn expert_input(
        &mut self,
        layer: usize,
        expert: usize,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    ) {
        if layer < self.replay_until {
            return;
        }
        self.hs.expert_input(layer, expert, tensors, x, rows, cols);
    }

    fn transform_weights(&mut self, layer: usize, set: &mut LinearSet) -> Result<()> {
        if let Some(e) = &self.hs.non_finite {
            return Err(Error::Unsupported(format!("{}: {e}", self.model)));
        }
        if let (true, Some(load)) = (layer < self.replay_until, self.load) {
            let key = set
                .segments
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(",");
            if let std::collections::btree_map::Entry::Vacant(e) = self.hs.groups.entry(key) {
                if let Some(h) = load.read_back(e.key())? {
                    e.insert(h);
                }
            }
        }
        let t0 = std::time::Instant::now();
        let r = self.quantize_set(set);
        self.quant_secs += t0.elapsed().as_secs_f64();
        r
    }

    fn layer_end(&mut self, layer: usize) -> Result<()> {
        self.factors.clear();
        if layer >= self.replay_until {
            (self.on_layer)(&mut self.hs, layer + 1)?;
        } else {
            // A replayed block's Hessians came from the file and are done with.
            self.hs.groups.clear();
        }
        Ok(())
    }
}
