//! The planner: recipe + overrides + the target engine's constraints → one decision per tensor,
//! each with the reasons behind it. Nothing is read or written here, so `--dry-run` and `convert`
//! share exactly the same plan.

mod engine;
pub mod mix;
pub mod preset;
pub mod recipe;

pub use engine::{check_engine, engine_checks, GGML_MAX_NAME};

use crate::error::{Error, Result};
use crate::source::SourceTensor;
use crate::types::profile::Profile;
use crate::types::TensorType;
use recipe::{classify, Recipe, Role};
use regex::Regex;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Same type as the source: bytes copied unchanged.
    Copy,
    /// Source is float: quantize (or convert between float types).
    Quantize,
    /// Source is already quantized: dequantize, then quantize again.
    Requantize,
}

#[derive(Clone, Debug)]
pub struct PlanEntry {
    pub name: String,
    pub dims: Vec<u64>,
    pub src: TensorType,
    pub dst: TensorType,
    pub action: Action,
    pub bytes: u64,
    /// Why this type: the rule that chose it, then any constraint that changed it.
    pub reasons: Vec<String>,
    /// A constraint overrode what was asked for (an error under `--strict`).
    pub fallback: bool,
    /// Quantized with banded LDLQ from a calibration Hessian (else round-to-nearest).
    pub ldlq: bool,
    /// Per-column importance from an imatrix (`--imatrix`): round-to-nearest with the block
    /// parameters fitted under these weights (stock types with a grid encoder only).
    pub importance: Option<std::sync::Arc<[f32]>>,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub entries: Vec<PlanEntry>,
    pub file_type: Option<u32>,
    pub base_type: TensorType,
    /// LDLQ's band, damping and refit passes, for every tensor the plan marks `ldlq`.
    pub ldlq: crate::quant::LdlqSettings,
}

/// A preset's per-tensor types (`--preset`), computed from the model by [`preset::types`].
#[derive(Clone, Debug)]
pub struct PresetTypes {
    pub name: &'static str,
    pub types: std::collections::BTreeMap<String, preset::Choice>,
}

/// What the user asked for.
#[derive(Clone)]
pub struct Request<'a> {
    pub weights: TensorType,
    pub recipe: &'a Recipe,
    /// `--tensor-type REGEX=TYPE`, first match wins (as llama-quantize).
    pub overrides: Vec<(Regex, TensorType)>,
    pub output_type: Option<TensorType>,
    pub token_embd_type: Option<TensorType>,
    /// Keep every tensor's source type (no quantization at all); used for copies/round trips.
    pub keep_types: bool,
    pub strict: bool,
    /// `--preset`: each tensor's type as llama-quantize's file type gives it (overrides, output
    /// and token-embedding types already applied by the preset's rules, as llama-quantize does).
    pub preset: Option<std::sync::Arc<PresetTypes>>,
}

impl<'a> Request<'a> {
    /// Every matrix at `weights` under `recipe`, nothing else asked for: no overrides, output and
    /// token-embedding types from the recipe, not strict, no preset, sources' types not kept.
    pub fn new(weights: TensorType, recipe: &'a Recipe) -> Request<'a> {
        Request {
            weights,
            recipe,
            overrides: vec![],
            output_type: None,
            token_embd_type: None,
            keep_types: false,
            strict: false,
            preset: None,
        }
    }
}

/// Parse `REGEX=TYPE`.
pub fn parse_override(s: &str) -> Result<(Regex, TensorType)> {
    let (re, ty) = s.rsplit_once('=').ok_or_else(|| {
        Error::Usage(format!(
            "--tensor-type '{s}': expected REGEX=TYPE, e.g. 'attn_v=q8_0'"
        ))
    })?;
    let ty =
        TensorType::parse(ty).map_err(|e| Error::Usage(format!("--tensor-type '{s}': {e}")))?;
    let re =
        Regex::new(re).map_err(|e| Error::Usage(format!("--tensor-type '{s}': bad regex: {e}")))?;
    Ok((re, ty))
}

/// Read `--tensor-type-file`: one `REGEX=TYPE` per line, `#` comments.
pub fn read_override_file(path: &std::path::Path) -> Result<Vec<(Regex, TensorType)>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        Error::bad_input(
            path,
            format!(
                "not UTF-8 text (byte {}); --tensor-type-file takes one REGEX=TYPE per line",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| parse_override(l).map_err(|e| Error::bad_input(path, e.to_string())))
        .collect()
}

/// Every `--tensor-type` / `--tensor-type-file` pattern must match a tensor of the input: one
/// that matches none is a misspelled name or a rule for another model, refused with the pattern.
pub fn check_overrides(tensors: &[SourceTensor], req: &Request) -> Result<()> {
    for (re, ty) in &req.overrides {
        if !tensors.iter().any(|t| re.is_match(&t.name)) {
            return Err(Error::Usage(format!(
                "--tensor-type '{}={}' matches no tensor of the input; check the names with `tq inspect` and fix or drop it",
                re.as_str(),
                ty.name()
            )));
        }
    }
    Ok(())
}

/// The type a tensor falls back to when its rows do not fit the block size: llama-quantize's
/// table for stock types ([`preset::fallback`]); tq2_t's rows of 32·odd values go to the scalar
/// row-rotated 2-bit type.
fn row_fallback(t: TensorType) -> TensorType {
    match t {
        TensorType::TQ2T => TensorType::TQ2R,
        // Any row length that is a multiple of 32 but not of 256 (the fallback is only asked for
        // rows the type does not fit).
        _ => match preset::fallback(t, 32) {
            Some(f) if f != t => f,
            _ => TensorType::F16,
        },
    }
}

/// ggml's ne0 (a 0-dim tensor is one value).
fn row_len(dims: &[u64]) -> u64 {
    dims.first().copied().unwrap_or(1)
}

fn fits(t: TensorType, row_len: u64) -> bool {
    row_len.is_multiple_of(t.block_size() as u64)
}

/// Plan a conversion of `tensors` under `req` for the engine described by `profile`.
pub fn plan(tensors: &[SourceTensor], req: &Request, profile: &Profile) -> Result<Plan> {
    let n_layers = tensors
        .iter()
        .filter_map(|t| classify(&t.name).1)
        .max()
        .map(|m| m + 1)
        .unwrap_or(0);
    let mut entries: Vec<PlanEntry> = tensors.iter().map(|t| choose(t, req, n_layers)).collect();

    // Engine constraint (the fork's): the attention projections of a layer that holds a TQ
    // weight type share one type. An engine without it (upstream llama.cpp: its own Q4_K_M
    // gives attn_v q8_0/q6_K beside q5_0/q4_K q/k/o) keeps the types asked for.
    if profile.unify_attention_tq {
        unify_attention(&mut entries);
    }

    for e in &mut entries {
        // Every type must exist in the target engine, and tq must be able to produce it.
        let id = profile.id_of(e.dst);
        if id.is_none() {
            return Err(Error::Usage(format!(
                "{}: type {} has no id in target profile '{}' (choose another --target or --type-map)",
                e.name, e.dst, profile.name
            )));
        }
        e.action = if e.dst == e.src {
            Action::Copy
        } else if e.src.info().dequantize.is_none() {
            return Err(Error::Unsupported(format!(
                "{}: source type {} cannot be dequantized by tq, so it cannot become {}; keep it (--tensor-type '{}={}')",
                e.name,
                e.src,
                e.dst,
                regex::escape(&e.name),
                e.src
            )));
        } else if e.dst.info().quantize.is_none() {
            return Err(Error::Unsupported(format!(
                "{}: quantization to {} is not supported by tq yet",
                e.name, e.dst
            )));
        } else if e.src.is_float() {
            Action::Quantize
        } else {
            e.reasons.push(format!(
                "requantized from {} (quality loss compounds)",
                e.src
            ));
            Action::Requantize
        };
        let n: u64 = e.dims.iter().product();
        e.bytes = e.dst.bytes_for(n).ok_or_else(|| {
            Error::Unsupported(format!(
                "{}: {n} elements of type {} overflow the byte count",
                e.name, e.dst
            ))
        })?;
    }

    if req.strict {
        if let Some(e) = entries.iter().find(|e| e.fallback) {
            return Err(Error::Usage(format!(
                "--strict: {} would fall back to {} ({}); nothing was written",
                e.name,
                e.dst,
                e.reasons.last().map(String::as_str).unwrap_or("")
            )));
        }
    }
    let base_type = if req.keep_types {
        dominant_type(&entries)
    } else {
        req.recipe.base.resolve(req.weights)
    };
    Ok(Plan {
        file_type: profile.file_type_of(base_type),
        base_type,
        entries,
        ldlq: Default::default(),
    })
}

fn dominant_type(entries: &[PlanEntry]) -> TensorType {
    let mut by: std::collections::BTreeMap<TensorType, u64> = Default::default();
    for e in entries.iter().filter(|e| e.dims.len() >= 2) {
        *by.entry(e.dst).or_default() += e.dims.iter().product::<u64>();
    }
    by.into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(t, _)| t)
        .unwrap_or(TensorType::F32)
}

fn choose(t: &SourceTensor, req: &Request, n_layers: u32) -> PlanEntry {
    let mut e = PlanEntry {
        name: t.name.clone(),
        dims: t.dims.clone(),
        src: t.ty,
        dst: t.ty,
        action: Action::Copy,
        bytes: 0,
        reasons: vec![],
        fallback: false,
        ldlq: false,
        importance: None,
    };
    if req.keep_types {
        e.reasons.push("kept as is".into());
        return e;
    }
    if !t.is_matrix() {
        // Norms, biases, rope factors: llama.cpp keeps these f32. Non-float vectors stay as they are.
        if t.ty.info().dequantize.is_some() {
            e.dst = TensorType::F32;
            e.reasons.push("1-D tensor kept f32".into());
        } else {
            e.reasons.push("non-float tensor copied".into());
        }
        return e;
    }
    if let Some(c) = req.preset.as_ref().and_then(|p| {
        p.types
            .get(&t.name)
            .map(|c| (c, format!("preset {}: {}", p.name, c.why)))
    }) {
        e.dst = c.0.ty;
        e.reasons.push(c.1);
        apply_constraints(&mut e);
        return e;
    }
    let (role, layer) = classify(&t.name);
    let overridden = req.overrides.iter().any(|(re, _)| re.is_match(&t.name));
    if role == Role::Router && !overridden {
        e.dst = TensorType::F32;
        e.reasons.push(
            "MoE router kept f32 (as llama-quantize: a rounded router routes tokens to other experts)"
                .into(),
        );
        return e;
    }
    let r = req.recipe;
    let boundary =
        layer.is_some_and(|l| l < r.boundary_layers.0 || l + r.boundary_layers.1 >= n_layers);
    let (slot, why) = match role {
        Role::TokenEmbd => (r.token_embd, "token_embd"),
        Role::Output => (r.output, "output"),
        _ if boundary => (r.boundary, "boundary layer"),
        Role::Attn => (r.attn, "attention"),
        Role::FfnGateUp => (r.ffn_gate_up, "ffn gate/up"),
        Role::FfnDown => (r.ffn_down, "ffn down"),
        Role::Router | Role::Other => (r.other, "other weight"),
    };
    e.dst = slot.resolve(req.weights);
    e.reasons.push(format!("recipe {}: {why}", r.name));
    match role {
        Role::Output if req.output_type.is_some() => {
            e.dst = req.output_type.unwrap();
            e.reasons.push("--output-tensor-type".into());
        }
        Role::TokenEmbd if req.token_embd_type.is_some() => {
            e.dst = req.token_embd_type.unwrap();
            e.reasons.push("--token-embedding-type".into());
        }
        _ => {}
    }
    if let Some((re, ty)) = req.overrides.iter().find(|(re, _)| re.is_match(&t.name)) {
        e.dst = *ty;
        e.reasons
            .push(format!("--tensor-type {}={}", re.as_str(), ty));
    }
    apply_constraints(&mut e);
    e
}

/// Engine constraints that can change a chosen type, each reported as a fallback.
fn apply_constraints(e: &mut PlanEntry) {
    if (e.dst.is_tq_weight() || e.dst.rotates_rows()) && classify(&e.name).0 == Role::TokenEmbd {
        e.reasons.push(format!("fallback {} -> q8_0: token_embd is never a TQ type (the fork's CUDA get_rows lacks TQ; a row-rotated row cannot be looked up without its inverse rotation)", e.dst));
        e.dst = TensorType::Q8_0;
        e.fallback = true;
    }
    let row = row_len(&e.dims);
    while !fits(e.dst, row) {
        let f = row_fallback(e.dst);
        let f = if fits(f, row) { f } else { TensorType::F16 };
        e.reasons.push(format!(
            "fallback {} -> {f}: row length {row} is not a multiple of {}",
            e.dst,
            e.dst.block_size()
        ));
        e.dst = f;
        e.fallback = true;
    }
}

/// Give the four attention projections of each layer one type: the type most of their elements
/// were given (ties: attn_q's), then re-check row constraints for all four.
fn unify_attention(entries: &mut [PlanEntry]) {
    let mut layers: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for (i, e) in entries.iter().enumerate() {
        if let Some(l) = recipe::attention_group(&e.name) {
            layers.entry(l).or_default().push(i);
        }
    }
    for idx in layers.values() {
        // Only TQ weight kernels rotate the shared activation in place (the fork's Metal
        // mul_mm path); a group of stock types may differ, as in upstream's own Q4_K_M.
        if !idx.iter().any(|&i| entries[i].dst.is_tq_weight()) {
            continue;
        }
        for _ in 0..4 {
            let first = entries[idx[0]].dst;
            if idx.iter().all(|&i| entries[i].dst == first) {
                break;
            }
            let mut count: Vec<(TensorType, u64)> = vec![];
            for &i in idx {
                let n: u64 = entries[i].dims.iter().product();
                match count.iter_mut().find(|(t, _)| *t == entries[i].dst) {
                    Some(c) => c.1 += n,
                    None => count.push((entries[i].dst, n)),
                }
            }
            let best = count
                .iter()
                .max_by_key(|(_, n)| *n)
                .map(|(t, _)| *t)
                .unwrap_or(first);
            // If the chosen type does not fit one of the rows, the whole group takes that row's fallback.
            let target = idx
                .iter()
                .map(|&i| row_len(&entries[i].dims))
                .find(|&r| !fits(best, r))
                .map(|r| {
                    if fits(row_fallback(best), r) {
                        row_fallback(best)
                    } else {
                        TensorType::F16
                    }
                })
                .unwrap_or(best);
            for &i in idx {
                if entries[i].dst != target {
                    let old = entries[i].dst;
                    entries[i].reasons.push(format!(
                        "fallback {old} -> {target}: attention q/k/v/o of a layer share one type"
                    ));
                    entries[i].dst = target;
                    entries[i].fallback = true;
                }
            }
        }
    }
}

/// A calibration file (`--calib H.safetensors`, `--imatrix`) made for another model is refused
/// before anything is written: every entry `(tensor, columns)` must name a tensor of the plan
/// (an expert member `NAME#e` names `NAME`) whose rows have that many columns. `what` says what
/// an entry is, `remake` how to make a file for this model.
pub fn check_calibration_file<'a>(
    plan: &Plan,
    file: &std::path::Path,
    what: &str,
    remake: &str,
    entries: impl IntoIterator<Item = (&'a str, usize)>,
) -> Result<()> {
    for (name, n) in entries {
        let base = crate::quant::tensor_of(name);
        let Some(e) = plan.entries.iter().find(|e| e.name == base) else {
            return Err(Error::bad_input(
                file,
                format!(
                    "{what} for '{name}', a tensor the input does not have: the file was made for another model; {remake}"
                ),
            ));
        };
        if row_len(&e.dims) != n as u64 {
            return Err(Error::bad_input(
                file,
                format!(
                    "{what} for '{name}' has {n} columns but the tensor's rows have {}: the file was made for another model; {remake}",
                    row_len(&e.dims)
                ),
            ));
        }
    }
    Ok(())
}

/// Give each stock tensor with a grid encoder its imatrix importance (`--imatrix`; tensors that
/// also have LDLQ keep LDLQ). The importance map is name → per-column weights.
pub fn assign_importance(plan: &mut Plan, imatrix: &std::collections::BTreeMap<String, Vec<f32>>) {
    for e in &mut plan.entries {
        if e.action == Action::Copy || e.ldlq || !e.dst.imatrix_weighted() {
            continue;
        }
        match imatrix.get(&e.name) {
            Some(v) if v.len() as u64 == row_len(&e.dims) => {
                e.importance = Some(v.as_slice().into());
                e.reasons
                    .push("imatrix-weighted block parameters (diagonal only)".into());
            }
            Some(v) => e.reasons.push(format!(
                "imatrix entry has {} columns but rows are {}: not weighted",
                v.len(),
                row_len(&e.dims)
            )),
            None => {}
        }
    }
}

/// Mark the TQ tensors that have a calibration Hessian of the right size for LDLQ; the others
/// fall back to round-to-nearest with the reason recorded.
pub fn assign_ldlq(
    plan: &mut Plan,
    hessians: &crate::quant::Hessians,
    ldlq: &crate::quant::LdlqSettings,
) {
    for e in &mut plan.entries {
        if e.action == Action::Copy || !e.dst.has_ldlq() {
            continue;
        }
        if e.dims.len() == 3 {
            // An expert tensor: one Hessian per expert slice (`NAME#e`).
            let n_exp = e.dims[2] as usize;
            match (0..n_exp).find_map(|x| hessians.for_expert(&e.name, x)) {
                Some(h) if h.n as u64 == row_len(&e.dims) => {
                    e.ldlq = true;
                    e.reasons.push(format!(
                        "LDLQ per expert ({n_exp} experts, each with the Hessian of the tokens routed to it; under {} tokens: round-to-nearest)",
                        crate::quant::hessian::MIN_EXPERT_TOKENS
                    ));
                }
                Some(h) => e.reasons.push(format!(
                    "expert Hessians are {}-dim but rows are {}: round-to-nearest",
                    h.n,
                    row_len(&e.dims)
                )),
                None => e.reasons.push(
                    "no per-expert Hessians (they come from tq convert --calib TEXT; Hessian files hold the dense layers): round-to-nearest"
                        .into(),
                ),
            }
            continue;
        }
        match hessians.for_tensor(&e.name) {
            Some(h) if h.n as u64 == row_len(&e.dims) => {
                e.ldlq = true;
                let band = ldlq.band_for(e.dst);
                let b = if band == 0 {
                    "full".to_string()
                } else {
                    band.to_string()
                };
                let shrink = match ldlq.shrink_for(e.dst) {
                    s if s > 0.0 => format!(", shrink {s}"),
                    _ => String::new(),
                };
                e.reasons.push(format!(
                    "LDLQ (band {b}, damp {}{shrink}) with a Hessian of {} tokens",
                    ldlq.damp_for(e.dst),
                    h.tokens
                ));
            }
            Some(h) => e.reasons.push(format!(
                "Hessian is {}-dim but rows are {}: round-to-nearest",
                h.n,
                row_len(&e.dims)
            )),
            None => e
                .reasons
                .push("no Hessian for this tensor: round-to-nearest".into()),
        }
    }
}
