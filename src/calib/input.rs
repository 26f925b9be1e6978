//! What a calibration runs on, decided once for `tq calib` and `tq convert --calib`: whether a
//! `--calib` path is a Hessian file or text ([`is_hessian_file`]), the windows of a token stream
//! ([`first_windows`]), the windows of a text inside a conversion ([`text_windows`]), and an
//! in-memory calibration on a text ([`calibrate_text`], for `--target-bpw`'s sensitivity pass).

use std::io::Read;
use std::path::Path;

use super::run::{self, make_windows};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::input::Input;
use crate::types::profile::Profile;

/// A safetensors file (what `tq calib` writes) rather than calibration text: named
/// `*.safetensors`, or starting with a little-endian header length followed by `{`.
pub fn is_hessian_file(p: &Path) -> Result<bool> {
    if p.extension().is_some_and(|e| e == "safetensors") {
        return Ok(true);
    }
    let mut f = std::fs::File::open(p).map_err(|e| Error::io(p, e))?;
    let len = f.metadata().map_err(|e| Error::io(p, e))?.len();
    let mut b = [0u8; 9];
    let mut got = 0;
    while got < b.len() {
        match f.read(&mut b[got..]).map_err(|e| Error::io(p, e))? {
            0 => break,
            n => got += n,
        }
    }
    if got < b.len() {
        return Ok(false);
    }
    let n = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    Ok(b[8] == b'{' && n >= 2 && n <= len - 8)
}

/// As many whole windows of `ctx` tokens as the first `max_tokens` of `tokens` hold, with `bos`
/// written at the start of each; None when not even one window fits.
pub fn first_windows(
    tokens: &[u32],
    bos: Option<u32>,
    max_tokens: usize,
    ctx: usize,
) -> Option<Vec<u32>> {
    let n_win = max_tokens.min(tokens.len()) / ctx.max(1);
    (n_win > 0).then(|| make_windows(tokens, n_win, ctx, bos))
}

/// `tq convert --calib TEXT`: how to calibrate on the text first.
pub struct TextOptions {
    /// Calibration tokens (rounded down to whole windows), window length, windows per pass.
    pub tokens: usize,
    pub ctx: usize,
    pub batch: usize,
    pub quiet: bool,
}

/// The model opened and the calibration windows of `text` for `tq convert --calib TEXT`
/// (`o.tokens` rounded down to whole windows of `o.ctx`, BOS in place).
pub fn text_windows(
    model: &Path,
    profile: &Profile,
    text: &Path,
    o: &TextOptions,
) -> Result<(GgufFile, Vec<u32>)> {
    if crate::source::hf::is_model_dir(model) {
        return Err(Error::Usage(format!(
            "{}: calibrating on text (--calib {}) needs a GGUF input (the runtime reads GGUF); convert to GGUF first, then calibrate",
            model.display(),
            text.display()
        )));
    }
    if o.ctx < 2 || o.batch == 0 {
        return Err(Error::Usage(
            "tq convert: --calib-ctx must be >= 2 and --calib-batch >= 1".into(),
        ));
    }
    if o.tokens < o.ctx {
        return Err(Error::Usage(format!(
            "tq convert: --calib-tokens {} is less than one window: it must be at least --calib-ctx {}",
            o.tokens, o.ctx
        )));
    }
    let f = GgufFile::open_with(model, profile)?;
    let (tokens, bos) = Input::Text(text).tokens(&f)?;
    let windows = first_windows(&tokens, bos, o.tokens, o.ctx).ok_or_else(|| {
        Error::Usage(format!(
            "{}: {} tokens, fewer than one window of --calib-ctx {} (with --calib-tokens {})",
            text.display(),
            tokens.len(),
            o.ctx,
            o.tokens
        ))
    })?;
    Ok((f, windows))
}

/// Calibrate the GGUF model at `model` on the UTF-8 `text` (batched), as `tq calib` does but in
/// memory and without checkpoints: every Hessian is held (a mix ranks every tensor before any is
/// written).
pub fn calibrate_text(
    model: &Path,
    profile: &Profile,
    text: &Path,
    o: &TextOptions,
) -> Result<crate::quant::Hessians> {
    let (f, windows) = text_windows(model, profile, text, o)?;
    let c = run::calibrate(
        model,
        &f,
        &windows,
        &run::Options {
            ctx: o.ctx,
            batch: o.batch,
            output: None,
            store: Default::default(),
            resume: false,
            sequential: None,
            checkpoint_secs: 0.0,
            extra_meta: Default::default(),
            quiet: o.quiet,
        },
    )?;
    Ok(c.hessians)
}

/// Test fixture shared by the mix's calibration tests: a 3-block tiny llama with a tokenizer
/// (`m.gguf`) and 2,500 words of pseudo-text (`t.txt`) in `dir`, and a small calibration of them
/// (512 tokens, windows of 64, 4 per pass).
#[cfg(test)]
pub(crate) fn tiny_model_and_text(
    dir: &Path,
) -> (std::path::PathBuf, std::path::PathBuf, TextOptions) {
    let model = dir.join("m.gguf");
    std::fs::write(&model, crate::gguf_gen::tiny_llama_tok(3, 256, 256).bytes).unwrap();
    let text = dir.join("t.txt");
    std::fs::write(&text, crate::gguf_gen::pseudo_text(2500)).unwrap();
    let o = TextOptions {
        tokens: 512,
        ctx: 64,
        batch: 4,
        quiet: true,
    };
    (model, text, o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_whole_and_start_with_bos() {
        let t: Vec<u32> = (10..20).collect();
        assert_eq!(
            first_windows(&t, Some(1), 100, 4),
            Some(vec![1, 11, 12, 13, 1, 15, 16, 17])
        );
        assert_eq!(first_windows(&t, None, 5, 4), Some(vec![10, 11, 12, 13]));
        assert_eq!(first_windows(&t, None, 3, 4), None);
    }

    #[test]
    fn hessian_files_are_told_from_text() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t.txt");
        std::fs::write(&text, "Once upon a time").unwrap();
        assert!(!is_hessian_file(&text).unwrap());
        let st = dir.path().join("h.bin");
        let mut b = 2u64.to_le_bytes().to_vec();
        b.extend_from_slice(b"{}");
        std::fs::write(&st, b).unwrap();
        assert!(is_hessian_file(&st).unwrap());
        assert!(is_hessian_file(&dir.path().join("missing.safetensors")).unwrap());
    }
}
