//! What a substitution pass measures against and with: the input's reference logits on the KLD
//! windows, and the input's tensors encoded as convert writes them, to substitute in memory for
//! a pass ([`super::probe::Probes`]) — the fit's probes, the direct measurements and the measured
//! plans all use these.

use super::probe::Substitute;
use crate::convert;
use crate::error::{Error, Result};
use crate::eval::logits_file::Format;
use crate::eval::{evaluate, session, Reference};
use crate::gguf::GgufFile;
use crate::model::{Model, Numerics};
use crate::plan::mix::Calibration;
use crate::plan::{self, Action, Plan, Request};
use crate::source::TensorSource;
use crate::tokenizer::input::Input;
use crate::types::profile::Profile;
use crate::types::TensorType;
use std::path::Path;

/// The input model (a GGUF file) and the first `windows` windows of `text` (ctx 512): what the
/// mix's passes on the KLD text run.
pub(super) fn input_windows(
    input: &Path,
    text: &Path,
    windows: usize,
) -> Result<(GgufFile, crate::eval::perplexity::Windows)> {
    let file = GgufFile::open(input).map_err(|e| {
        Error::Usage(format!(
            "--kld-text / --verify evaluate the input model, which must be a GGUF file ({e})"
        ))
    })?;
    let (win, _) = session::windows_and_reference(
        &file,
        Some(Input::Text(text)),
        512,
        Some(windows),
        None,
        None,
    )
    .map_err(|e| match e {
        // Name the flag the text came from.
        Error::BadInput { path, msg } if path == text => {
            Error::bad_input(path, format!("--kld-text: {msg}"))
        }
        e => e,
    })?;
    Ok((file, win))
}

/// The input model's logits on the first `windows` windows of `text` (ctx 512).
pub fn reference_logits(
    input: &Path,
    text: &Path,
    windows: usize,
    out: &Path,
    quiet: bool,
) -> Result<()> {
    let (file, win) = input_windows(input, text, windows)?;
    let model = Model::new(&file, Numerics::Ggml)?;
    let nv = model.cfg.n_vocab;
    let mut w = session::logits_writer(out, Format::Tq, input, "ggml", &win, nv)?;
    let batch = session::default_batch(&win, nv, false);
    let mut pb = crate::pipeline::progress::steps(quiet, 1, "KLD reference (block passes)");
    evaluate(
        &model,
        &win,
        Reference::None,
        Some(&mut w),
        batch,
        &|d, t| {
            pb.set_length(t);
            pb.set_position(d)
        },
    )?;
    pb.finish_and_clear();
    w.finish()
}

/// Mean KLD of `model` against the saved reference logits (progress as `what` unless `quiet`).
pub fn kld_of(
    model: &Path,
    ref_logits: &Path,
    windows: usize,
    what: &str,
    quiet: bool,
) -> Result<f64> {
    let file = GgufFile::open(model)?;
    let m = Model::new(&file, Numerics::Ggml)?;
    let (win, r) =
        session::windows_and_reference(&file, None, 512, Some(windows), Some(ref_logits), None)?;
    let batch = session::default_batch(&win, m.cfg.n_vocab, false);
    let mut pb = crate::pipeline::progress::steps(quiet, 1, what);
    let res = evaluate(&m, &win, r, None, batch, &|d, t| {
        pb.set_length(t);
        pb.set_position(d)
    })?;
    pb.finish_and_clear();
    res.kld
        .map(|k| k.kld.value)
        .ok_or_else(|| Error::internal("no KLD was computed against the reference"))
}

/// The plan of the input with only the entries `idx` quantized to `ty`, the way convert would
/// (every other tensor kept as it is).
pub(super) fn probe_plan(
    src: &dyn TensorSource,
    plan: &Plan,
    profile: &Profile,
    idx: &[usize],
    ty: TensorType,
    calib: &Calibration,
) -> Result<Plan> {
    let keep = Request {
        keep_types: true,
        ..Request::new(TensorType::Q8_0, &plan::recipe::RECIPES[0])
    };
    let mut p = plan::plan(src.tensors(), &keep, profile)?;
    p.ldlq = plan.ldlq;
    for &i in idx {
        let e = &mut p.entries[i];
        debug_assert_eq!(e.name, plan.entries[i].name);
        e.dst = ty;
        e.action = if e.src.is_float() {
            Action::Quantize
        } else {
            Action::Requantize
        };
        e.bytes = ty
            .bytes_for(e.dims.iter().product())
            .ok_or_else(|| Error::Unsupported(format!("{}: does not fit {ty}", e.name)))?;
    }
    mark(&mut p, calib);
    Ok(p)
}

/// Mark `p` as convert executes it: LDLQ (its own settings) or imatrix from the calibration.
pub(super) fn mark(p: &mut Plan, calib: &Calibration) {
    let ldlq = p.ldlq;
    match calib {
        Calibration::File(f) => plan::assign_ldlq(p, &f.index, &ldlq),
        Calibration::Memory(h) | Calibration::Stream(h) => plan::assign_ldlq(p, h, &ldlq),
        Calibration::Imatrix(m) => plan::assign_importance(p, m),
        Calibration::None => {}
    }
}

/// Entry `i` of the marked plan `p` quantized as convert writes it. From in-memory Hessians only
/// this tensor's group is copied (a copy of all would be the model's): its own, or one per
/// expert (`NAME#e`) for an expert tensor.
pub(super) fn encode_entry(
    src: &dyn TensorSource,
    p: &Plan,
    i: usize,
    calib: &Calibration,
) -> Result<Vec<u8>> {
    let c = match calib {
        Calibration::File(f) => convert::Calib::File(f),
        // A streamed calibration's data comes block by block (as `Memory` of the block);
        // a tensor without Hessians (token_embd, output) needs none.
        Calibration::Stream(ix) => {
            let e = &p.entries[i];
            if ix.for_tensor(&e.name).is_some() || ix.has_experts(&e.name) {
                return Err(Error::internal(format!(
                    "{}: its Hessian is encoded from inside a calibration pass",
                    e.name
                )));
            }
            convert::Calib::Hessians(crate::quant::Hessians::default())
        }
        Calibration::Memory(hs) => {
            let mut one = crate::quant::Hessians::default();
            let e = &p.entries[i];
            let n_exp = if e.dims.len() == 3 {
                e.dims[2] as usize
            } else {
                0
            };
            let groups = std::iter::once(hs.for_tensor(&e.name))
                .chain((0..n_exp).map(|x| hs.for_expert(&e.name, x)));
            for g in groups.flatten() {
                one.groups.insert(g.tensors.join(","), g.clone());
            }
            convert::Calib::Hessians(one)
        }
        _ => convert::Calib::None,
    };
    convert::entry_bytes(src, p, i, c)
}

/// The entries `idx` quantized to `ty` as convert would write them, to substitute in memory.
pub(super) fn substitutes(
    src: &dyn TensorSource,
    plan: &Plan,
    profile: &Profile,
    idx: &[usize],
    ty: TensorType,
    calib: &Calibration,
) -> Result<Vec<Substitute>> {
    substitutes_with(src, plan, profile, idx, ty, calib, &|p, i| {
        encode_entry(src, p, i, calib)
    })
}

/// Entry `i` quantized to `ty` as [`substitutes`] writes it, in the rows `rows` only
/// ([`rows_encoding`]): for the token embeddings' candidates, whose pass looks up only the
/// windows' tokens, so its KLD is the whole encoding's bit for bit, at the cost of encoding those
/// rows (a 128k vocabulary's 4096-wide table is 0.5 G values per candidate; 2 windows hold at
/// most 1,024 tokens).
pub(super) fn substitute_rows(
    src: &dyn TensorSource,
    plan: &Plan,
    profile: &Profile,
    i: usize,
    ty: TensorType,
    calib: &Calibration,
    rows: &[u64],
) -> Result<Substitute> {
    substitutes_with(src, plan, profile, &[i], ty, calib, &|p, i| {
        rows_encoding(src, p, i, calib, rows)
    })?
    .pop()
    .ok_or_else(|| Error::internal("no substitute encoded"))
}

/// [`substitutes`] with each entry's bytes from `encode` (the probe plan, the entry).
pub(super) fn substitutes_with(
    src: &dyn TensorSource,
    plan: &Plan,
    profile: &Profile,
    idx: &[usize],
    ty: TensorType,
    calib: &Calibration,
    encode: &dyn Fn(&Plan, usize) -> Result<Vec<u8>>,
) -> Result<Vec<Substitute>> {
    let p = probe_plan(src, plan, profile, idx, ty, calib)?;
    let id = profile
        .id_of(ty)
        .ok_or_else(|| Error::internal(format!("{ty}: no id in the profile")))?;
    idx.iter()
        .map(|&i| {
            let bytes = encode(&p, i)?;
            Ok((
                p.entries[i].name.clone(),
                ty,
                id,
                std::sync::Arc::new(bytes),
            ))
        })
        .collect()
}

/// Entry `i` of the marked plan `p` as [`encode_entry`] writes it, in the rows `rows` (sorted,
/// distinct) only: each holds the bytes of the whole tensor's encoding (round-to-nearest and the
/// grid encoders quantize each row on its own; tested against the whole encoding), every other
/// row zeros, for a pass that reads no other row. A type whose rows do not end on whole blocks
/// is encoded whole.
pub(super) fn rows_encoding(
    src: &dyn TensorSource,
    p: &Plan,
    i: usize,
    calib: &Calibration,
    rows: &[u64],
) -> Result<Vec<u8>> {
    let e = &p.entries[i];
    let ty = e.dst;
    let (n, n_rows) = match e.dims[..] {
        [n, r] => (n, r),
        _ => return Err(Error::internal("row-wise encodings are for 2-D tensors")),
    };
    if rows.iter().any(|&r| r >= n_rows) {
        return Err(Error::internal(format!(
            "{}: a window's token is past its {n_rows} rows",
            e.name
        )));
    }
    let unfit = || Error::Unsupported(format!("{}: does not fit {ty}", e.name));
    let row_bytes = ty.bytes_for(n).ok_or_else(unfit)? as usize;
    let whole = ty.bytes_for(n * n_rows).ok_or_else(unfit)? as usize;
    if whole != row_bytes * n_rows as usize {
        return encode_entry(src, p, i, calib);
    }
    let mut cut = p.clone();
    cut.entries[i].dims = vec![n, rows.len() as u64];
    cut.entries[i].bytes = row_bytes as u64 * rows.len() as u64;
    let picked = RowsOf {
        src,
        i,
        rows,
        tensors: src
            .tensors()
            .iter()
            .enumerate()
            .map(|(j, t)| {
                let mut t = t.clone();
                if j == i {
                    t.dims = vec![n, rows.len() as u64];
                }
                t
            })
            .collect(),
    };
    let bytes = encode_entry(&picked, &cut, i, calib)?;
    let mut data = vec![0u8; whole];
    for (k, &r) in rows.iter().enumerate() {
        let at = r as usize * row_bytes;
        data[at..at + row_bytes].copy_from_slice(&bytes[k * row_bytes..(k + 1) * row_bytes]);
    }
    Ok(data)
}

/// `src` with tensor `i` cut to the rows `rows` (in that order): what [`substitute_rows`]
/// encodes.
struct RowsOf<'a> {
    src: &'a dyn TensorSource,
    i: usize,
    rows: &'a [u64],
    tensors: Vec<crate::source::SourceTensor>,
}

impl TensorSource for RowsOf<'_> {
    fn name(&self) -> String {
        self.src.name()
    }
    fn gguf_version(&self) -> u32 {
        self.src.gguf_version()
    }
    fn metadata(&self) -> &[(String, crate::gguf::Value)] {
        self.src.metadata()
    }
    fn tensors(&self) -> &[crate::source::SourceTensor] {
        &self.tensors
    }
    fn raw(&self, index: usize) -> Option<&[u8]> {
        (index != self.i).then(|| self.src.raw(index)).flatten()
    }
    fn read_rows_f32(&self, index: usize, row0: u64, out: &mut [f32]) -> Result<()> {
        if index != self.i {
            return self.src.read_rows_f32(index, row0, out);
        }
        let n = self.tensors[index].dims[0] as usize;
        for (k, o) in out.chunks_mut(n).enumerate() {
            let r = self.rows.get(row0 as usize + k).ok_or_else(|| {
                Error::internal(format!(
                    "{}: row {} of the cut",
                    self.tensors[index].name,
                    row0 as usize + k
                ))
            })?;
            self.src.read_rows_f32(index, *r, o)?;
        }
        Ok(())
    }
}

/// The Hessian group `name` belongs to under `calib`, as a key.
pub(super) fn group_of(calib: &Calibration, name: &str) -> Option<String> {
    match calib {
        Calibration::Memory(h) | Calibration::Stream(h) => {
            h.for_tensor(name).map(|g| g.tensors.join(","))
        }
        Calibration::File(f) => f.index.for_tensor(name).map(|g| g.tensors.join(",")),
        _ => None,
    }
}

/// `plan` written to `out` as convert writes it (tests: the file a probe or a measured plan
/// stands for), with `calib`'s in-memory Hessians.
#[cfg(test)]
pub(super) fn write_plan(
    src: &dyn TensorSource,
    plan: &Plan,
    profile: &Profile,
    calib: &Calibration,
    out: &Path,
) -> Result<()> {
    let md = convert::output_metadata(src.metadata(), plan, None, false);
    let cp = convert::Checkpoints {
        resume: false,
        key: String::new(),
        quiet: true,
    };
    let target = convert::Target {
        src,
        plan,
        metadata: &md,
        version: src.gguf_version(),
        profile,
        out,
        hash_input: None,
        cp: &cp,
        prepared: None,
    };
    let c = match calib {
        Calibration::Memory(hs) => {
            let mut all = crate::quant::Hessians::default();
            for (k, g) in &hs.groups {
                all.groups.insert(k.clone(), g.clone());
            }
            convert::Calib::Hessians(all)
        }
        _ => convert::Calib::None,
    };
    convert::execute(&target, c, &|_| {})?;
    Ok(())
}
