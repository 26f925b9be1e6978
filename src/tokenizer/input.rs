//! Model input as token ids, for every command that runs a model on text (`tq eval`, `tq kv
//! --measure`, `tq calib`, `tq convert --calib TEXT`): a UTF-8 text tokenized with the model's own
//! tokenizer the way `llama-perplexity -f` does, or a file of pre-tokenized ids (the escape hatch
//! for vocabularies the tokenizer does not implement). One token-file syntax and one BOS policy
//! ([`window_bos`], the same rule the tokenizer follows) serve all of them.

use std::path::Path;

use super::{array, Specials, Tokenizer};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// Where a command's tokens come from.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// UTF-8 text, tokenized with the model's tokenizer.
    Text(&'a Path),
    /// Pre-tokenized ids ([`read_token_file`]).
    TokenFile(&'a Path),
}

impl Input<'_> {
    pub fn path(&self) -> &Path {
        match self {
            Input::Text(p) | Input::TokenFile(p) => p,
        }
    }

    /// The token stream and the BOS that replaces each window's first token (None when the
    /// vocabulary adds no BOS). A token file is taken as the whole stream the tokenizer would
    /// produce, leading BOS included if the vocabulary adds one.
    pub fn tokens(&self, f: &GgufFile) -> Result<(Vec<u32>, Option<u32>)> {
        match *self {
            Input::Text(p) => text_tokens(f, p),
            Input::TokenFile(p) => Ok((read_token_file(p)?, window_bos(f))),
        }
    }
}

/// Read pre-tokenized ids: decimal ids separated by white space and/or commas; `#` starts a
/// comment to the end of the line. (This accepts everything both former readers did: plain
/// whitespace-separated ids, as `tq calib --save-tokens` writes them, and the commented form.)
pub fn read_token_file(path: &Path) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut ids = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("");
        for tok in line.split(|c: char| c.is_whitespace() || c == ',') {
            if tok.is_empty() {
                continue;
            }
            let id = tok.parse::<u32>().map_err(|_| {
                Error::bad_input(
                    path,
                    format!("line {}: {tok:?} is not a token id", lineno + 1),
                )
            })?;
            ids.push(id);
        }
    }
    Ok(ids)
}

/// The BOS written at the start of every window, when the vocabulary adds one (llama.cpp's
/// `add_bos_token`, else the vocabulary type's default), from metadata alone: no tokenizer is
/// built, so this also serves token files for vocabularies the tokenizer does not implement.
pub fn window_bos(f: &GgufFile) -> Option<u32> {
    let model = f.get_str("tokenizer.ggml.model").unwrap_or("");
    let pre = f.get_str("tokenizer.ggml.pre").unwrap_or("");
    let n_vocab = array(f, "tokenizer.ggml.tokens").map_or(usize::MAX, <[_]>::len);
    let s = Specials::of(f, model, pre, n_vocab);
    s.bos.filter(|_| s.add_bos)
}

/// Tokenize a UTF-8 text file with the model's tokenizer the way `llama-perplexity -f` does
/// (one trailing newline dropped, BOS added if the vocabulary adds one); returns the tokens and
/// the BOS that replaces each window's first token.
pub fn text_tokens(f: &GgufFile, p: &Path) -> Result<(Vec<u32>, Option<u32>)> {
    let bytes = std::fs::read(p).map_err(|e| Error::io(p, e))?;
    let mut text = String::from_utf8(bytes)
        .map_err(|e| Error::bad_input(p, format!("not UTF-8 text ({e})")))?;
    // llama.cpp's -f drops one trailing newline.
    if text.ends_with('\n') {
        text.pop();
    }
    let tok = Tokenizer::from_gguf(f)?;
    let bos = tok.bos().filter(|_| tok.add_bos());
    Ok((tok.encode(&text, true), bos))
}
