//! Tokenizers built from GGUF metadata, reproducing llama.cpp's `llama_tokenize(text,
//! add_special, parse_special = false)` token for token. See docs/tokenizer.md.
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE ([`bpe`]) after the pre-tokenizer that
//!   `tokenizer.ggml.pre` names ([`pretokenize`]).
//! - `tokenizer.ggml.model = "llama"`: SentencePiece BPE by token scores ([`spm`]).
//!
//! In both, user-defined tokens (token type 4) are cut out of the text first and emitted as
//! themselves (llama.cpp does this even without `parse_special`); control tokens in the text
//! are tokenized as plain text. BOS/EOS are added per `tokenizer.ggml.add_bos_token` /
//! `add_eos_token`, with llama.cpp's defaults when those keys are absent.

pub(crate) mod bpe;
pub mod input;
mod load;
mod pre;
pub(crate) mod pretokenize;
pub(crate) mod spm;
pub mod unicode;

pub use input::read_token_file;
use load::array;
use pre::Pre;

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Value};
use pretokenize::Step;

/// The tokenizer's byte-string maps use rustc's Fx hash (std's SipHash is the bottleneck
/// otherwise; the keys are vocabulary data, where flooding could only cost speed). Nothing
/// iterates these maps, so their order never reaches the output.
pub type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

// Token attributes (llama.cpp's llama_token_attr bits that matter for tokenizing).
const ATTR_UNKNOWN: u8 = 1;
const ATTR_CONTROL: u8 = 2;
const ATTR_USER_DEFINED: u8 = 4;
const ATTR_BYTE: u8 = 8;
const ATTR_UNUSED: u8 = 16;
const ATTR_LSTRIP: u8 = 32;
const ATTR_RSTRIP: u8 = 64;

enum Model {
    Bpe {
        bpe: Box<bpe::Bpe>,
        steps: Vec<Step>,
    },
    Spm(spm::Spm),
}

/// A tokenizer reconstructed from `tokenizer.ggml.*` metadata.
pub struct Tokenizer {
    model: Model,
    /// `tokenizer.ggml.model` and the pre-tokenizer name in effect.
    model_name: String,
    pre_name: String,
    tokens: Vec<Vec<u8>>,
    attrs: Vec<u8>,
    /// Raw token text → id (later duplicates win, as in llama.cpp).
    token_to_id: FastMap<Box<[u8]>, u32>,
    /// User-defined tokens cut out of raw text, longest first.
    partition: Vec<u32>,
    /// For each first byte, the indices into `partition` of tokens starting with it.
    partition_by_byte: Vec<Vec<u32>>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model_name)
            .field("pre", &self.pre_name)
            .field("n_vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish()
    }
}

/// One piece of input after cutting out user-defined tokens.
enum Fragment<'a> {
    Text(&'a str),
    /// A user-defined token and the text it was cut from.
    Token(u32, &'a str),
}

impl Tokenizer {
    /// Token ids for `text`, as `llama_tokenize(text, add_special, parse_special = false)`:
    /// with `add_special`, BOS first if the model adds one, EOS last likewise.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let fragments = self.partition_text(text);
        match &self.model {
            Model::Bpe { bpe, steps } => {
                let raw = |b: &[u8]| self.token_to_id.get(b).copied();
                let mut cache: FastMap<&str, (u32, u32)> = FastMap::default();
                let mut arena: Vec<u32> = Vec::new();
                for frag in &fragments {
                    let s = match frag {
                        Fragment::Token(t, _) => {
                            out.push(*t);
                            continue;
                        }
                        Fragment::Text(s) => *s,
                    };
                    for (a, b) in pretokenize::split(s, steps) {
                        let word = &s[a..b];
                        let (start, len) = *cache.entry(word).or_insert_with(|| {
                            let start = arena.len();
                            bpe.encode_word(word.as_bytes(), &raw, &mut arena);
                            (start as u32, (arena.len() - start) as u32)
                        });
                        out.extend_from_slice(&arena[start as usize..(start + len) as usize]);
                    }
                }
            }
            Model::Spm(spm) => {
                let byte_token = |b: u8| self.byte_token(b);
                // A space is prefixed to text at the start and after a token. The escaped
                // fragments outlive the piece cache that borrows them.
                let escaped: Vec<Option<String>> = fragments
                    .iter()
                    .enumerate()
                    .map(|(i, frag)| match frag {
                        Fragment::Token(..) => None,
                        Fragment::Text(s) => {
                            let prefix = self.add_space_prefix
                                && (i == 0 || matches!(fragments[i - 1], Fragment::Token(..)));
                            let mut t = String::with_capacity(s.len() + 8);
                            if prefix {
                                t.push(' ');
                            }
                            t.push_str(s);
                            Some(t.replace(' ', "\u{2581}"))
                        }
                    })
                    .collect();
                let mut cache = FastMap::default();
                for (frag, esc) in fragments.iter().zip(&escaped) {
                    match (frag, esc) {
                        (Fragment::Token(t, _), _) => out.push(*t),
                        (Fragment::Text(_), Some(e)) => {
                            spm.encode(
                                e.as_bytes(),
                                &self.token_to_id,
                                &byte_token,
                                &mut cache,
                                &mut out,
                            );
                        }
                        (Fragment::Text(_), None) => unreachable!(),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The words BPE sees for `text` (after cutting out user-defined tokens, which appear as
    /// their own text); SentencePiece models return the text pieces unsplit. For debugging and
    /// comparisons with other implementations.
    pub fn pre_tokenize<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut words = Vec::new();
        for frag in self.partition_text(text) {
            match (frag, &self.model) {
                (Fragment::Token(_, t), _) => words.push(t),
                (Fragment::Text(s), Model::Bpe { steps, .. }) => words.extend(
                    pretokenize::split(s, steps)
                        .into_iter()
                        .map(|(a, b)| &s[a..b]),
                ),
                (Fragment::Text(s), Model::Spm(_)) => words.push(s),
            }
        }
        words
    }

    /// SentencePiece byte token: `<0xXX>`, else the byte itself as a token, else UNK.
    fn byte_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        self.token_to_id
            .get(hex.as_bytes())
            .or_else(|| self.token_to_id.get(&[b][..]))
            .copied()
            .or(self.unk)
    }

    /// Cut user-defined tokens out of `text` as llama.cpp's `tokenizer_st_partition` does:
    /// tokens in priority order (longest first), each at its leftmost non-overlapping
    /// occurrences within what is still raw text.
    fn partition_text<'t>(&self, text: &'t str) -> Vec<Fragment<'t>> {
        if self.partition.is_empty() || text.is_empty() {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![Fragment::Text(text)]
            };
        }
        let bytes = text.as_bytes();
        // All occurrences (priority index, position).
        let mut occ: Vec<(u32, u32)> = Vec::new();
        for (pos, &c) in bytes.iter().enumerate() {
            for &k in &self.partition_by_byte[c as usize] {
                let tok = &self.tokens[self.partition[k as usize] as usize];
                // (Token texts that are not whole characters of `text` never match.)
                if bytes[pos..].starts_with(tok)
                    && text.is_char_boundary(pos)
                    && text.is_char_boundary(pos + tok.len())
                {
                    occ.push((k, pos as u32));
                }
            }
        }
        if occ.is_empty() {
            return vec![Fragment::Text(text)];
        }
        occ.sort_unstable();
        let mut used = vec![false; bytes.len()];
        let mut found: Vec<(usize, u32)> = Vec::new(); // (position, token id)
        let mut i = 0;
        while i < occ.len() {
            let k = occ[i].0;
            let id = self.partition[k as usize];
            let len = self.tokens[id as usize].len();
            let attr = self.attrs[id as usize];
            let mut search_from = 0usize;
            while i < occ.len() && occ[i].0 == k {
                let p = occ[i].1 as usize;
                i += 1;
                if p < search_from || used[p..p + len].iter().any(|&u| u) {
                    continue;
                }
                used[p..p + len].fill(true);
                found.push((p, id));
                search_from = p + len;
                if attr & ATTR_LSTRIP != 0 {
                    let mut q = p;
                    while q > 0 && !used[q - 1] && bytes[q - 1].is_ascii_whitespace_c() {
                        q -= 1;
                        used[q] = true;
                    }
                }
                if attr & ATTR_RSTRIP != 0 {
                    let mut q = p + len;
                    while q < bytes.len() && !used[q] && bytes[q].is_ascii_whitespace_c() {
                        used[q] = true;
                        q += 1;
                    }
                    search_from = q;
                }
            }
        }
        found.sort_unstable();
        let mut frags = Vec::with_capacity(found.len() * 2 + 1);
        let mut pos = 0;
        let mut fi = 0;
        while pos < bytes.len() {
            if fi < found.len() && found[fi].0 == pos {
                let id = found[fi].1;
                let end = pos + self.tokens[id as usize].len();
                frags.push(Fragment::Token(id, &text[pos..end]));
                pos = end;
                fi += 1;
                continue;
            }
            if used[pos] {
                pos += 1; // stripped white space
                continue;
            }
            let start = pos;
            while pos < bytes.len() && !used[pos] {
                pos += 1;
            }
            frags.push(Fragment::Text(&text[start..pos]));
        }
        frags
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether `encode(.., add_special = true)` prepends BOS / appends EOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    pub fn add_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// `tokenizer.ggml.model` ("gpt2" or "llama").
    pub fn model(&self) -> &str {
        &self.model_name
    }

    /// The pre-tokenizer in effect ("default" when the metadata names none).
    pub fn pre(&self) -> &str {
        &self.pre_name
    }

    /// The raw text of a token (byte-encoded form for BPE vocabularies).
    pub fn token_text(&self, id: u32) -> Option<&[u8]> {
        self.tokens.get(id as usize).map(Vec::as_slice)
    }

    /// Text for a sequence of ids, like llama.cpp's detokenizer without special tokens:
    /// control/unknown/unused tokens are skipped, byte tokens become bytes, invalid UTF-8 is
    /// replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        let map = unicode::byte_map();
        for &id in ids {
            let Some(t) = self.tokens.get(id as usize) else {
                continue;
            };
            let attr = self.attrs[id as usize];
            if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_UNUSED) != 0 {
                continue;
            }
            match &self.model {
                Model::Bpe { .. } => {
                    if attr & ATTR_USER_DEFINED != 0 {
                        bytes.extend_from_slice(t);
                        continue;
                    }
                    let s = String::from_utf8_lossy(t);
                    for c in s.chars() {
                        match map.byte(c) {
                            Some(b) => bytes.push(b),
                            None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
                Model::Spm(_) => {
                    if attr & ATTR_BYTE != 0 && t.len() == 6 && t.starts_with(b"<0x") {
                        if let Some(b) = std::str::from_utf8(&t[3..5])
                            .ok()
                            .and_then(|h| u8::from_str_radix(h, 16).ok())
                        {
                            bytes.push(b);
                            continue;
                        }
                    }
                    let s = String::from_utf8_lossy(t).replace('\u{2581}', " ");
                    bytes.extend_from_slice(s.as_bytes());
                }
            }
        }
        let mut s = String::from_utf8_lossy(&bytes).into_owned();
        if matches!(self.model, Model::Spm(_)) && self.add_space_prefix && s.starts_with(' ') {
            s.remove(0);
        }
        s
    }
}

trait CSpace {
    fn is_ascii_whitespace_c(&self) -> bool;
}

impl CSpace for u8 {
    /// C `isspace` in the "C" locale (includes \v, unlike `u8::is_ascii_whitespace`).
    fn is_ascii_whitespace_c(&self) -> bool {
        matches!(*self, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
    }
}

/// The special tokens of a vocabulary and whether `encode(.., add_special)` adds BOS / EOS: the
/// one policy for the tokenizer and for pre-tokenized input ([`input::window_bos`]).
pub(crate) struct Specials {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
}

impl Specials {
    /// As llama.cpp's `llama_vocab::impl::load` decides them: the vocabulary type's defaults
    /// (`tokenizer.ggml.model`, and for gpt2 the pre-tokenizer), overridden by the metadata keys.
    /// Defaults out of range are dropped; metadata ids out of range are ignored. Vocabulary types
    /// the tokenizer does not implement still get llama.cpp's defaults here, for `--tokens` input.
    pub(crate) fn of(f: &GgufFile, model: &str, pre: &str, n_vocab: usize) -> Specials {
        let (bos, eos, unk, add_bos) = match model {
            "llama" => (Some(1), Some(2), Some(0), true),
            "gpt2" => {
                let pre = Pre::from_name(pre);
                let bos = match pre {
                    Some(Pre::ChatGlm | Pre::Glm4) => None,
                    _ => Some(11),
                };
                (bos, Some(11), None, pre == Some(Pre::Llama3))
            }
            "bert" => (Some(101), None, Some(100), true),
            _ => (None, None, None, false),
        };
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n_vocab);
        let meta_id = |key: &str, default: Option<u32>| -> Option<u32> {
            match f.get_u64(key) {
                Some(v) if (v as usize) < n_vocab => Some(v as u32),
                _ => default,
            }
        };
        let flag = |key: &str| f.get(key).and_then(Value::as_bool);
        Specials {
            bos: meta_id("tokenizer.ggml.bos_token_id", in_range(bos)),
            eos: meta_id("tokenizer.ggml.eos_token_id", in_range(eos)),
            unk: meta_id("tokenizer.ggml.unknown_token_id", in_range(unk)),
            add_bos: flag("tokenizer.ggml.add_bos_token").unwrap_or(add_bos),
            add_eos: flag("tokenizer.ggml.add_eos_token").unwrap_or(false),
        }
    }
}
