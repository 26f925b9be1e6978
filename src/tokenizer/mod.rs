//! Tokenizers built from GGUF metadata (in progress: the public API is stable, the
//! implementation is being filled in).

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// A tokenizer reconstructed from `tokenizer.ggml.*` metadata.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    tokens: Vec<Vec<u8>>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

impl Tokenizer {
    /// Build the tokenizer a GGUF file describes. Unsupported tokenizers are
    /// `Error::Unsupported` naming the value and the supported list.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer> {
        let tokens = f
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "{}: no tokenizer.ggml.tokens in metadata; pass pre-tokenized ids with --tokens FILE",
                    f.path.display()
                ))
            })?
            .iter()
            .map(|v| match v {
                crate::gguf::Value::String(s) => s.0.clone(),
                _ => Vec::new(),
            })
            .collect();
        let id = |k: &str| f.get_u64(k).map(|v| v as u32);
        let flag = |k: &str| f.get(k).and_then(|v| v.as_bool());
        Ok(Tokenizer {
            tokens,
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            add_bos: flag("tokenizer.ggml.add_bos_token").unwrap_or(false),
            add_eos: flag("tokenizer.ggml.add_eos_token").unwrap_or(false),
        })
    }

    /// Token ids for `text`, as `llama_tokenize(text, add_special, parse_special = false)`.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        let _ = text;
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Text for a sequence of ids (lossy for byte tokens that do not form UTF-8).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &i in ids {
            if let Some(t) = self.tokens.get(i as usize) {
                bytes.extend_from_slice(t);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
