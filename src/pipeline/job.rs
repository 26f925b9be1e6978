//! A conversion job, resolved once from the flags: every check that needs no model, the
//! calibration input detected once, LDLQ's settings as one value, the budget, the profile and the
//! outputs. [`Job::resolve`] is the only place that looks at a `--calib` path's contents.

use crate::calib::input::{is_hessian_file, TextOptions};
use crate::convert::{self, Provenance};
use crate::error::{Error, Result};
use crate::plan::{self, recipe, Plan, Request};
use crate::quant::LdlqSettings;
use crate::shard::Shard;
use crate::source::TensorSource;
use crate::types::profile::Profile;
use crate::types::TensorType;
use std::path::{Path, PathBuf};

/// The flags of `tq convert` as plain values (the CLI fills this in; nothing is checked yet).
#[derive(Clone, Debug, Default)]
pub struct ConvertFlags {
    pub input: PathBuf,
    pub output: Option<PathBuf>,
    pub weights: Option<String>,
    /// `--preset NAME`: llama-quantize's file type by name (Q4_K_M, IQ2_XS, ...).
    pub preset: Option<String>,
    pub recipe: Option<String>,
    pub tensor_type: Vec<String>,
    pub tensor_type_file: Option<PathBuf>,
    pub output_tensor_type: Option<String>,
    pub token_embedding_type: Option<String>,
    pub strict: bool,
    pub dry_run: bool,
    pub json: bool,
    pub target: Option<String>,
    pub type_map: Option<PathBuf>,
    pub calib: Option<PathBuf>,
    pub calib_tokens: usize,
    pub calib_ctx: usize,
    pub calib_batch: usize,
    pub calib_sequential: bool,
    pub allow_partial_calib: bool,
    pub imatrix: Option<PathBuf>,
    pub ldlq: LdlqSettings,
    pub resume: bool,
    pub quiet: bool,
    pub shard: Option<String>,
    pub target_bpw: Option<f64>,
    pub target_size: Option<String>,
    /// `--target-kld X`: the smallest mix predicted (and measured) at most X.
    pub target_kld: Option<f64>,
    pub types: Option<String>,
    pub mix_rows: usize,
    pub mix_exact_rows: usize,
    /// `--mix-exact-blocks K`: blocks the sensitivity measures with LDLQ (0: all).
    pub mix_exact_blocks: usize,
    pub kld_text: Option<PathBuf>,
    pub kld_windows: usize,
    pub kld_probes: usize,
    /// `--mix-cache FILE`: the mix's measurements, reused when they fit, else made and saved.
    pub mix_cache: Option<PathBuf>,
    pub verify: bool,
    /// `--max-kld X` (with `--verify`): the gate.
    pub max_kld: Option<f64>,
    pub no_provenance: bool,
    /// Not a flag (tests): a mix with `--calib TEXT` calibrates once and holds every block's
    /// Hessians in memory until the conversion ends (the path before the mix streamed them),
    /// to compare the streamed path with.
    pub mix_in_memory: bool,
}

/// Where LDLQ's Hessians come from, decided once.
#[derive(Clone, Debug, PartialEq)]
pub enum CalibInput {
    None,
    /// `--calib H.safetensors` from `tq calib`.
    Hessians {
        path: PathBuf,
        allow_partial: bool,
    },
    /// `--calib TEXT`: calibrated in this command (batched, or sequential with this plan).
    Text {
        path: PathBuf,
        tokens: usize,
        ctx: usize,
        batch: usize,
        sequential: bool,
    },
}

impl CalibInput {
    pub fn path(&self) -> Option<&Path> {
        match self {
            CalibInput::None => None,
            CalibInput::Hessians { path, .. } | CalibInput::Text { path, .. } => Some(path),
        }
    }

    pub fn text(&self) -> Option<&Path> {
        match self {
            CalibInput::Text { path, .. } => Some(path),
            _ => None,
        }
    }
}

/// A resolved `tq convert`: what to read, how to calibrate and plan, what to write.
pub struct Job {
    pub flags: ConvertFlags,
    pub profile: Profile,
    pub request: Request<'static>,
    /// `--preset`: the request's types come from llama-quantize's rules once the model is read
    /// ([`Job::request_for`]).
    pub preset: Option<&'static plan::preset::Preset>,
    pub calib: CalibInput,
    pub budget: Option<Budget>,
    pub shard: Option<Shard>,
    /// `-o` (None only with `--dry-run`).
    pub output: Option<PathBuf>,
    /// The text of the mix's KLD fit and `--verify` (`--kld-text`, else `--calib TEXT`).
    pub kld_text: Option<PathBuf>,
}

impl Job {
    /// Check the flags and resolve them, in the order a user's mistakes are best reported.
    pub fn resolve(f: ConvertFlags) -> Result<Job> {
        f.ldlq.check()?;
        let calib = match &f.calib {
            None => CalibInput::None,
            Some(p) if is_hessian_file(p)? => CalibInput::Hessians {
                path: p.clone(),
                allow_partial: f.allow_partial_calib,
            },
            Some(p) => CalibInput::Text {
                path: p.clone(),
                tokens: f.calib_tokens,
                ctx: f.calib_ctx,
                batch: f.calib_batch,
                sequential: f.calib_sequential,
            },
        };
        let shard = check_shard(f.shard.as_deref(), calib.text().is_some())?;
        let profile = Profile::select(f.target.as_deref(), f.type_map.as_deref())?;
        let output = match (&f.output, f.dry_run) {
            (Some(o), _) => Some(o.clone()),
            (None, true) => None,
            (None, false) => {
                return Err(Error::Usage(
                    "tq convert: give -o OUT.gguf (or --dry-run)".into(),
                ))
            }
        };
        crate::io::check_outputs(
            &[("-o", output.as_deref())],
            &[
                Some(&f.input),
                f.calib.as_deref(),
                f.imatrix.as_deref(),
                f.tensor_type_file.as_deref(),
                f.type_map.as_deref(),
            ],
        )?;
        let preset = check_preset(&f)?;
        let budget = budget(&f)?;
        let request = request(&f, preset)?;
        let kld_text = f
            .kld_text
            .clone()
            .or_else(|| calib.text().map(Path::to_path_buf));
        if let (Some(x), None) = (f.target_kld, &kld_text) {
            return Err(Error::Usage(format!(
                "tq convert --target-kld {x}: the KLD is fitted and measured on a text; give --kld-text FILE (or --calib TEXT)"
            )));
        }
        if f.verify && (kld_text.is_none() || f.dry_run) {
            return Err(Error::Usage(
                "tq convert --verify: give --kld-text FILE (or --calib TEXT) to measure on, and -o (not --dry-run)".into(),
            ));
        }
        if let Some(x) = f.max_kld.filter(|x| !(x.is_finite() && *x >= 0.0)) {
            return Err(Error::Usage(format!(
                "--max-kld {x}: expected a mean KLD >= 0, e.g. 0.05"
            )));
        }
        if f.max_kld.is_some() && !f.verify {
            return Err(Error::Usage(
                "tq convert --max-kld: it gates --verify's measurement; add --verify".into(),
            ));
        }
        if f.calib_sequential && calib.text().is_none() {
            return Err(Error::Usage(
                "tq convert: --calib-sequential calibrates on a text file given to --calib; for a Hessian file, run tq calib --sequential".into(),
            ));
        }
        Ok(Job {
            profile,
            request,
            preset,
            budget,
            shard,
            output,
            kld_text,
            calib,
            flags: f,
        })
    }

    /// The request for this model: with `--preset`, every tensor's type as llama-quantize's
    /// rules give it for `src` (refused when a type needs an imatrix that is not given, or an
    /// encoder tq lacks); otherwise the request as resolved.
    pub fn request_for(
        &self,
        src: &dyn TensorSource,
    ) -> Result<std::borrow::Cow<'_, Request<'static>>> {
        use plan::preset;
        let Some(p) = self.preset else {
            return Ok(std::borrow::Cow::Borrowed(&self.request));
        };
        let facts = preset::ModelFacts::of(src)?;
        // With calibration, the rules that differ for an imatrix take the imatrix branch: the
        // file is compared with llama-quantize + imatrix.
        let has_imatrix = self.flags.imatrix.is_some() || self.calib != CalibInput::None;
        let opts = preset::Options {
            has_imatrix,
            output_type: self.request.output_type,
            token_embd_type: self.request.token_embd_type,
            overrides: &self.request.overrides,
        };
        let types = preset::types(p, &facts, src.tensors(), &opts)?;
        // llama-quantize's refusal first (it holds whatever tq can encode), then tq's encoders.
        let planned = || {
            src.tensors()
                .iter()
                .filter_map(|t| types.get(&t.name).map(|c| (t, c)))
        };
        if let Some((t, c)) = planned().find(|(_, c)| c.needs_imatrix && !has_imatrix) {
            return Err(Error::Usage(format!(
                "tq convert --preset {}: {} would be {}, which (as in llama-quantize) needs an importance matrix; give --imatrix FILE or --calib TEXT",
                p.name, t.name, c.ty
            )));
        }
        if let Some((t, c)) =
            planned().find(|(t, c)| c.ty != t.ty && c.ty.info().quantize.is_none() && t.is_matrix())
        {
            return Err(Error::Unsupported(format!(
                "tq convert --preset {}: {} would be {}, which tq cannot encode yet; choose another preset",
                p.name, t.name, c.ty
            )));
        }
        let mut r = self.request.clone();
        r.preset = Some(std::sync::Arc::new(plan::PresetTypes {
            name: p.name,
            types,
        }));
        Ok(std::borrow::Cow::Owned(r))
    }

    /// `--calib TEXT`'s options for the calibration run.
    pub fn text_options(&self) -> Option<TextOptions> {
        match &self.calib {
            CalibInput::Text {
                tokens, ctx, batch, ..
            } => Some(TextOptions {
                tokens: *tokens,
                ctx: *ctx,
                batch: *batch,
                quiet: self.flags.quiet,
            }),
            _ => None,
        }
    }

    /// What `--verify` is gated at: `--max-kld X`, else `--target-kld X`.
    pub fn kld_gate(&self) -> Option<f64> {
        self.flags.max_kld.or(self.flags.target_kld)
    }

    pub fn mixing(&self) -> bool {
        self.budget.is_some()
    }

    /// The flags that decide the output, in a fixed form (no paths, no thread count).
    pub fn canonical_flags(&self) -> String {
        let (a, req) = (&self.flags, &self.request);
        let name = |p: &Path| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let mut f = match self.preset {
            Some(p) => vec![format!("--preset {}", p.name)],
            None => vec![
                format!("--weights {}", req.weights),
                format!("--recipe {}", req.recipe.name),
            ],
        };
        for o in &a.tensor_type {
            f.push(format!("--tensor-type {o}"));
        }
        if let Some(t) = &a.tensor_type_file {
            f.push(format!("--tensor-type-file {}", name(t)));
        }
        if let Some(t) = req.output_type {
            f.push(format!("--output-tensor-type {t}"));
        }
        if let Some(t) = req.token_embd_type {
            f.push(format!("--token-embedding-type {t}"));
        }
        if a.strict {
            f.push("--strict".into());
        }
        if let Some(c) = self.calib.path() {
            f.push(format!("--calib {}", name(c)));
            if let CalibInput::Text {
                tokens,
                ctx,
                batch,
                sequential,
                ..
            } = &self.calib
            {
                f.push(format!(
                    "--calib-tokens {tokens} --calib-ctx {ctx} --calib-batch {batch}"
                ));
                if *sequential {
                    f.push("--calib-sequential".into());
                }
            }
            if a.allow_partial_calib {
                f.push("--allow-partial-calib".into());
            }
            f.push(format!(
                "--ldlq-band {} --damp {} --ldlq-refit {} --shrink {}",
                self.flags.ldlq.band_label(),
                self.flags.ldlq.damp_label(),
                self.flags.ldlq.refit,
                self.flags.ldlq.shrink_label()
            ));
        }
        if let Some(x) = a.target_bpw {
            f.push(format!("--target-bpw {x}"));
        }
        if let Some(x) = &a.target_size {
            f.push(format!("--target-size {x}"));
        }
        if let Some(x) = a.target_kld {
            f.push(format!("--target-kld {x}"));
        }
        if self.mixing() {
            if let Some(t) = &a.types {
                f.push(format!("--types {t}"));
            }
            f.push(format!(
                "--mix-rows {} --mix-exact-rows {} --mix-exact-blocks {}",
                a.mix_rows, a.mix_exact_rows, a.mix_exact_blocks
            ));
            if let Some(t) = &a.kld_text {
                f.push(format!("--kld-text {}", name(t)));
            }
            f.push(format!(
                "--kld-windows {} --kld-probes {}",
                a.kld_windows, a.kld_probes
            ));
        }
        if let Some(c) = &self.flags.imatrix {
            f.push(format!("--imatrix {}", name(c)));
        }
        f.join(" ")
    }

    /// What a checkpoint of this conversion is keyed by: the output-deciding flags, LDLQ's
    /// settings, the inputs' identities and tq's version.
    pub fn checkpoint_key(&self) -> String {
        let a = &self.flags;
        format!(
            "{} | --ldlq-band {} --damp {} --ldlq-refit {} --shrink {} | input {} | calib {} | imatrix {} | tq {}",
            self.canonical_flags(),
            self.flags.ldlq.band_label(),
            self.flags.ldlq.damp_label(),
            self.flags.ldlq.refit,
            self.flags.ldlq.shrink_label(),
            file_identity(&a.input),
            self.calib.path().map(file_identity).unwrap_or_default(),
            self.flags.imatrix.as_deref().map(file_identity).unwrap_or_default(),
            env!("CARGO_PKG_VERSION")
        )
    }
}

/// `--shard I/N`: refused before any work for `--calib TEXT` (calibration needs every block of the
/// model in one process; shard it with `tq calib --shard` instead).
pub fn check_shard(shard: Option<&str>, calib_is_text: bool) -> Result<Option<Shard>> {
    let Some(s) = shard else { return Ok(None) };
    let s = Shard::parse(s)?;
    if calib_is_text {
        return Err(Error::Usage(format!(
            "tq convert --shard {s}: --calib TEXT calibrates in this process; run tq calib --shard I/N on each machine, tq calib merge, then tq convert --shard {s} --calib H.safetensors"
        )));
    }
    Ok(Some(s))
}

/// `--target-bpw` / `--target-size`, checked: one of them, a positive finite value.
fn budget(a: &ConvertFlags) -> Result<Option<Budget>> {
    let given = [
        ("--target-bpw", a.target_bpw.is_some()),
        ("--target-size", a.target_size.is_some()),
        ("--target-kld", a.target_kld.is_some()),
    ];
    let on: Vec<&str> = given.iter().filter(|g| g.1).map(|g| g.0).collect();
    if on.len() > 1 {
        return Err(Error::Usage(format!(
            "tq convert: give one of --target-bpw, --target-size, --target-kld, not {}",
            on.join(" and ")
        )));
    }
    let b = match (a.target_bpw, &a.target_size) {
        (None, None) => match a.target_kld {
            Some(x) if x.is_finite() && x > 0.0 => Some(Budget::Kld(x)),
            Some(x) => {
                return Err(Error::Usage(format!(
                    "--target-kld {x}: expected a mean KLD above 0, e.g. 0.02"
                )))
            }
            None => None,
        },
        (Some(_), Some(_)) => {
            return Err(Error::Usage(
                "tq convert: give --target-bpw or --target-size, not both".into(),
            ))
        }
        (Some(x), None) if x.is_finite() && x > 0.0 && x <= 64.0 => Some(Budget::Bpw(x)),
        (Some(x), None) => {
            return Err(Error::Usage(format!(
                "--target-bpw {x}: expected bits per parameter in (0, 64], e.g. 4.5"
            )))
        }
        (None, Some(s)) => Some(Budget::Bytes(parse_size(s)?)),
    };
    if a.kld_windows < 2 {
        return Err(Error::Usage(format!(
            "--kld-windows {}: at least 2 windows (the evaluator's minimum)",
            a.kld_windows
        )));
    }
    if b.is_none() && a.mix_cache.is_some() {
        return Err(Error::Usage(
            "tq convert: --mix-cache holds a mix's measurements; give --target-bpw, --target-size or --target-kld"
                .into(),
        ));
    }
    if b.is_none() && a.types.is_some() {
        return Err(Error::Usage(
            "tq convert: --types lists the candidates of a mix; give --target-bpw, --target-size or --target-kld"
                .into(),
        ));
    }
    if b.is_some() && a.shard.is_some() {
        return Err(Error::Usage(
            "tq convert: a mix (--target-bpw/--target-size) cannot be sharded yet; convert without --shard".into(),
        ));
    }
    if b.is_some() && a.calib_sequential {
        return Err(Error::Usage(
            "tq convert: --calib-sequential with a mix is not supported; use tq calib --sequential and --calib H.safetensors".into(),
        ));
    }
    Ok(b)
}

/// `--preset NAME`: a known name, and none of the flags that choose the types another way.
fn check_preset(a: &ConvertFlags) -> Result<Option<&'static plan::preset::Preset>> {
    let Some(name) = &a.preset else {
        return Ok(None);
    };
    let p = plan::preset::parse(name)?;
    let clash = [
        ("--weights", a.weights.is_some()),
        ("--recipe", a.recipe.is_some()),
        ("--target-bpw", a.target_bpw.is_some()),
        ("--target-size", a.target_size.is_some()),
        ("--target-kld", a.target_kld.is_some()),
    ];
    if let Some((flag, _)) = clash.iter().find(|(_, on)| *on) {
        return Err(Error::Usage(format!(
            "tq convert: --preset {} chooses every tensor's type; drop {flag} (or drop --preset)",
            p.name
        )));
    }
    Ok(Some(p))
}

fn request(
    a: &ConvertFlags,
    preset: Option<&'static plan::preset::Preset>,
) -> Result<Request<'static>> {
    let parse = |t: &Option<String>| t.as_deref().map(TensorType::parse).transpose();
    let weights = parse(&a.weights)?.or(preset.map(|p| p.default));
    let recipe = a.recipe.as_deref().map(recipe::parse).transpose()?;
    let mut overrides = a
        .tensor_type
        .iter()
        .map(|s| plan::parse_override(s))
        .collect::<Result<Vec<_>>>()?;
    if let Some(f) = &a.tensor_type_file {
        overrides.extend(plan::read_override_file(f)?);
    }
    let output_type = parse(&a.output_tensor_type)?;
    let token_embd_type = parse(&a.token_embedding_type)?;
    let mixing = a.target_bpw.is_some() || a.target_size.is_some() || a.target_kld.is_some();
    let keep_types = !mixing
        && preset.is_none()
        && weights.is_none()
        && recipe.is_none()
        && overrides.is_empty()
        && output_type.is_none()
        && token_embd_type.is_none();
    Ok(Request {
        // A mix sets every matrix's type; its starting plan needs a type every profile loads.
        weights: weights.unwrap_or(if mixing {
            TensorType::Q8_0
        } else {
            TensorType::TQ4_1S
        }),
        recipe: recipe.unwrap_or(&recipe::RECIPES[0]),
        overrides,
        output_type,
        token_embd_type,
        keep_types,
        strict: a.strict,
        preset: None,
    })
}

/// A file's size and modification time: what a checkpoint checks its inputs by (hashing a 140 GB
/// model again on every resume would cost minutes).
fn file_identity(p: &Path) -> String {
    match std::fs::metadata(p) {
        Ok(m) => format!(
            "{} bytes, modified {:?}",
            m.len(),
            m.modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos())
        ),
        Err(_) => String::new(),
    }
}

/// The byte budget asked for.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    Bpw(f64),
    Bytes(u64),
    /// `--target-kld X`: the smallest mix whose predicted and measured KLD is at most X.
    Kld(f64),
}

/// `100MB` (10⁶), `100MiB` (2²⁰), `1.5GB`, `105466560` (bytes). Every refusal names the value
/// and what a valid one looks like.
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = |why: &str| {
        Err(Error::Usage(format!(
            "--target-size '{s}': {why}; give bytes or a size like 100MB, 95MiB, 1.5GB"
        )))
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1048576.0,
        "gib" => 1073741824.0,
        _ if t.starts_with('-') => return bad("a size cannot be negative"),
        u if num.is_empty() || !u.chars().next().is_some_and(char::is_alphabetic) => {
            return bad("not a number")
        }
        _ => {
            return bad(&format!(
                "unknown unit '{}' (B, KB, MB, GB, KiB, MiB, GiB)",
                unit.trim()
            ))
        }
    };
    match num.parse::<f64>() {
        Err(_) => bad("not a number"),
        Ok(v) if v * mult < 1.0 => bad("the size must be at least 1 byte"),
        Ok(v) if v * mult >= 1e18 => bad("larger than any file tq can write (under 1e18 bytes)"),
        Ok(v) => Ok((v * mult).floor() as u64),
    }
}

/// The `tq.*` provenance of the output (None with `--no-provenance`).
pub(super) fn provenance(job: &Job, extra: Vec<(String, String)>) -> Option<Provenance> {
    let a = &job.flags;
    if a.no_provenance {
        return None;
    }
    Some(Provenance {
        recipe: if let Some(p) = job.preset {
            format!("preset {}", p.name)
        } else if job.request.keep_types {
            "keep".into()
        } else if job.mixing() {
            "mix".into()
        } else {
            job.request.recipe.name.into()
        },
        flags: job.canonical_flags(),
        input_name: a
            .input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        // Filled in by execute, which hashes the input while converting; a dry run counts
        // the placeholder too, so its size is the written file's (a mix's budget depends on it).
        input_blake3: convert::HASH_PLACEHOLDER.to_string(),
        extra,
    })
}

/// The file a plan gives with the marks convert will add (ldlq / imatrix) and its provenance:
/// what a mix's budget counts.
pub(super) fn file_size_of(
    job: &Job,
    src: &dyn TensorSource,
    plan: &Plan,
    calib: &crate::plan::mix::Calibration,
    imatrix: Option<&std::collections::BTreeMap<String, Vec<f32>>>,
    extra: Vec<(String, String)>,
) -> Result<u64> {
    use crate::plan::mix::Calibration;
    let mut p = plan.clone();
    match calib {
        Calibration::File(f) => plan::assign_ldlq(&mut p, &f.index, &job.flags.ldlq),
        Calibration::Memory(h) | Calibration::Stream(h) => {
            plan::assign_ldlq(&mut p, h, &job.flags.ldlq)
        }
        Calibration::Imatrix(_) | Calibration::None => {}
    }
    if let Some(m) = imatrix {
        plan::assign_importance(&mut p, m);
    }
    let prov = provenance(job, extra);
    let md = convert::output_metadata(src.metadata(), &p, prov.as_ref(), true);
    crate::gguf::writer::file_size(
        src.gguf_version(),
        &md,
        &convert::tensor_specs(&p, &job.profile),
    )
}
