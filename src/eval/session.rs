//! The set-up of one evaluation, resolved from plain values: which windows are scored (from the
//! input text/tokens, or from a saved reference file, which then must agree with the input), how
//! many windows go through the model at once, and the header of a `--save-logits` file.

use super::logits_file::{self, Format};
use super::{Reference, Windows};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::Model;
use crate::tokenizer::input::{window_bos, Input};
use std::path::Path;

/// The windows to score and the reference to compare with.
///
/// With `ref_logits`, the windows (and their count, unless `chunks` is given) come from the
/// file; an `input` given as well must start with the same tokens, and `ctx` must be the file's
/// (512, the default, means "whatever the file has"). Otherwise the windows are cut from `input`
/// and the reference is `ref_model` (or none).
/// The input's windows of `ctx` tokens; a text too short for two is refused naming its file
/// (the windows themselves see only tokens).
pub fn input_windows(
    file: &GgufFile,
    input: &Input<'_>,
    ctx: usize,
    chunks: Option<usize>,
) -> Result<Windows> {
    let (toks, bos) = input.tokens(file)?;
    if ctx >= 4 && toks.len() < 2 * ctx {
        return Err(Error::bad_input(
            input.path(),
            format!(
                "only {} tokens; at least {} (2 windows of {ctx}) are needed: give a longer text",
                toks.len(),
                2 * ctx
            ),
        ));
    }
    Windows::new(&toks, ctx, chunks, bos)
}

pub fn windows_and_reference<'m>(
    file: &GgufFile,
    input: Option<Input<'_>>,
    ctx: usize,
    chunks: Option<usize>,
    ref_logits: Option<&Path>,
    ref_model: Option<&'m Model>,
) -> Result<(Windows, Reference<'m>)> {
    if let Some(rl) = ref_logits {
        let rd = logits_file::Reader::open(rl)?;
        let h = &rd.header;
        if ctx != 512 && ctx != h.n_ctx {
            return Err(Error::Usage(format!(
                "--ctx {} differs from the {} tokens per window of {}",
                ctx,
                h.n_ctx,
                rl.display()
            )));
        }
        let win = Windows::new(
            &h.tokens,
            h.n_ctx,
            chunks.or(Some(h.n_chunk)),
            window_bos(file),
        )?;
        if let Some(input) = input {
            let (toks, _) = input.tokens(file)?;
            if toks.len() < win.tokens.len() || toks[..win.tokens.len()] != win.tokens[..] {
                return Err(Error::Usage(format!(
                    "the input's tokens differ from those saved in {}; evaluate on the same text",
                    rl.display()
                )));
            }
        }
        return Ok((win, Reference::File(rd)));
    }
    let input = input.ok_or_else(|| {
        Error::Usage("tq eval: give --text FILE (or --tokens FILE, or --ref-logits FILE)".into())
    })?;
    let win = input_windows(file, &input, ctx, chunks)?;
    let r = match ref_model {
        Some(m) => Reference::Model(m),
        None => Reference::None,
    };
    Ok((win, r))
}

/// Windows per forward pass when not given: about 2048 tokens, and at most 1 GiB of logits
/// (twice that with a reference model running beside), never more than there are windows.
pub fn default_batch(win: &Windows, n_vocab: usize, with_ref_model: bool) -> usize {
    let n_out = win.n_ctx - win.first();
    let by_tokens = (2048 / win.n_ctx).max(1);
    let logits_per_window = n_out * n_vocab * 4 * if with_ref_model { 2 } else { 1 };
    let by_memory = ((1usize << 30) / logits_per_window.max(1)).max(1);
    by_tokens.min(by_memory).min(win.n_chunk)
}

/// Start a `--save-logits` file for these windows: the model's file name, the numerics and the
/// tq version go into its info string.
pub fn logits_writer(
    path: &Path,
    format: Format,
    model_path: &Path,
    numerics: &str,
    win: &Windows,
    n_vocab: usize,
) -> Result<logits_file::Writer> {
    let info = serde_json::json!({
        "model": model_path.file_name().map(|s| s.to_string_lossy().into_owned()),
        "numerics": numerics, "tq": env!("CARGO_PKG_VERSION"),
    })
    .to_string();
    let h = logits_file::Header {
        format,
        n_ctx: win.n_ctx,
        n_vocab,
        n_chunk: win.n_chunk,
        first: win.first(),
        info,
        tokens: win.tokens.clone(),
    };
    logits_file::Writer::create(path, format, &h)
}
