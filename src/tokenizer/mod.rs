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

pub mod bpe;
pub mod input;
pub mod pretokenize;
pub mod spm;
pub mod unicode;

pub use input::read_token_file;

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

/// The `tokenizer.ggml.pre` values we implement, grouped by pre-tokenizer (llama.cpp's names).
const PRE_FAMILIES: &[(&[&str], Pre)] = &[
    (&["default"], Pre::Default),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        Pre::Llama3,
    ),
    (&["dbrx", "smaug-bpe"], Pre::Dbrx),
    (&["chatglm-bpe"], Pre::ChatGlm),
    (&["glm4", "glm5"], Pre::Glm4),
    (&["deepseek-llm"], Pre::DeepseekLlm),
    (&["deepseek-coder"], Pre::DeepseekCoder),
    (&["falcon"], Pre::Falcon),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ],
        Pre::Gpt2,
    ),
    (
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        Pre::Starcoder,
    ),
    (
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
            "grok-2",
        ],
        Pre::Qwen2,
    ),
    (&["qwen35"], Pre::Qwen35),
    (&["laguna"], Pre::Laguna),
    (&["poro-chat", "bloom", "gpt3-finnish"], Pre::Poro),
    (&["viking"], Pre::Viking),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pre {
    Default,
    Llama3,
    Dbrx,
    ChatGlm,
    Glm4,
    DeepseekLlm,
    DeepseekCoder,
    Falcon,
    Gpt2,
    Starcoder,
    Qwen2,
    Qwen35,
    Laguna,
    Poro,
    Viking,
}

const GPT2_RE: &str =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const PORO_RE: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+";
// Non-ASCII characters in these regexes are written as escapes so that no editor can
// normalize them (U+212A KELVIN SIGN, for one, is canonically equivalent to "K").
const CJK_RE: &str = "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+";
const DEEPSEEK_LLM_LETTERS: &str = concat!(
    "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-",
    "\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}",
    "\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}",
    "\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}",
    "\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-",
    "\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}",
    "\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-",
    "\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}",
    "-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}",
    "\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}",
    "\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-",
    "\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-",
    "\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}",
    "-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}",
    "\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
);

impl Pre {
    fn from_name(name: &str) -> Option<Pre> {
        PRE_FAMILIES
            .iter()
            .find(|(names, _)| names.contains(&name))
            .map(|&(_, p)| p)
    }

    /// The regex list llama.cpp uses for this pre-tokenizer, as split steps. The GPT-2 and
    /// LLaMA-3/Qwen2 regexes are the hand-coded splitters (llama.cpp dispatches them by string).
    fn steps(self) -> Result<Vec<Step>> {
        let p = Step::pattern;
        let llama3 = || Step::Llama3 {
            max_digits: 3,
            marks: false,
        };
        let qwen2 = || Step::Llama3 {
            max_digits: 1,
            marks: false,
        };
        let _ = GPT2_RE;
        Ok(match self {
            Pre::Default => vec![
                p("[\\p{P}\\$\\+<=>\\^~\\|]+")?,
                Step::Gpt2,
                p("\\p{N}+")?,
                p("[0-9][0-9][0-9]")?,
            ],
            Pre::Llama3 | Pre::Dbrx | Pre::ChatGlm | Pre::Glm4 => vec![llama3()],
            Pre::DeepseekLlm => vec![
                p("[\r\n]")?,
                p(DEEPSEEK_LLM_LETTERS)?,
                p("\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+")?,
                p("\\s+$")?,
                p(CJK_RE)?,
                p("\\p{N}+")?,
            ],
            Pre::DeepseekCoder => vec![
                p("[\r\n]")?,
                p("\\s?\\p{L}+")?,
                p("\\s?\\p{P}+")?,
                p(CJK_RE)?,
                p("\\p{N}")?,
            ],
            Pre::Falcon => vec![
                p("[\\p{P}\\$\\+<=>\\^~\\|`]+")?,
                Step::Gpt2,
                p("[0-9][0-9][0-9]")?,
            ],
            Pre::Gpt2 => vec![Step::Gpt2],
            Pre::Starcoder => vec![p("\\p{N}")?, Step::Gpt2],
            Pre::Qwen2 => vec![qwen2()],
            Pre::Qwen35 => vec![Step::Llama3 {
                max_digits: 1,
                marks: true,
            }],
            Pre::Laguna => vec![Step::Newlines, qwen2()],
            Pre::Poro => vec![p(PORO_RE)?],
            Pre::Viking => vec![p(PORO_RE)?, p("\\p{N}")?],
        })
    }
}

fn supported_pre_list() -> String {
    PRE_FAMILIES
        .iter()
        .flat_map(|(names, _)| names.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

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
    /// Build the tokenizer a GGUF file describes. Unsupported tokenizers are
    /// `Error::Unsupported` naming the value and the supported list.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer> {
        let path = f.path.clone();
        let bad = |msg: String| Error::bad_input(&path, msg);
        let hatch = "pass pre-tokenized ids with --tokens FILE instead";
        let model_name = f.get_str("tokenizer.ggml.model").ok_or_else(|| {
            Error::Unsupported(format!(
                "{}: no tokenizer.ggml.model in metadata (no tokenizer to build); {hatch}",
                path.display()
            ))
        })?;
        let model_name = crate::error::one_line(model_name);
        let pre_raw = f.get_str("tokenizer.ggml.pre").unwrap_or("");
        let is_bpe = match model_name.as_str() {
            "gpt2" => true,
            "llama" => false,
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: tokenizer.ggml.model '{other}' is not supported (supported: gpt2 = \
                     byte-level BPE, llama = SentencePiece); {hatch}",
                    path.display()
                )))
            }
        };

        // Token texts, types, scores.
        let tok_vals = array(f, "tokenizer.ggml.tokens")
            .ok_or_else(|| bad("tokenizer.ggml.tokens missing or not an array".into()))?;
        let mut tokens = Vec::with_capacity(tok_vals.len());
        for (i, v) in tok_vals.iter().enumerate() {
            match v {
                Value::String(s) if s.0.is_empty() => {
                    tokens.push(format!("[EMPTY_{i}]").into_bytes())
                }
                Value::String(s) => tokens.push(s.0.clone()),
                _ => {
                    return Err(bad(
                        "tokenizer.ggml.tokens is not an array of strings".into()
                    ))
                }
            }
        }
        let n_vocab = tokens.len();
        let mut attrs = vec![0u8; n_vocab];
        if let Some(types) = array(f, "tokenizer.ggml.token_type") {
            if types.len() < n_vocab {
                return Err(bad(format!(
                    "tokenizer.ggml.token_type has {} entries for {n_vocab} tokens",
                    types.len()
                )));
            }
            for (a, t) in attrs.iter_mut().zip(types) {
                *a = match t.as_f64().map(|x| x as i64) {
                    Some(2) => ATTR_UNKNOWN,
                    Some(3) => ATTR_CONTROL,
                    Some(4) => ATTR_USER_DEFINED,
                    Some(5) => ATTR_UNUSED,
                    Some(6) => ATTR_BYTE,
                    _ => 0,
                };
            }
        }
        let mut token_to_id: FastMap<Box<[u8]>, u32> = FastMap::default();
        token_to_id.reserve(n_vocab);
        for (i, t) in tokens.iter().enumerate() {
            token_to_id.insert(t.as_slice().into(), i as u32);
        }

        let pre_name;
        let model = if is_bpe {
            let pre = if pre_raw.is_empty() {
                Pre::Default
            } else {
                Pre::from_name(pre_raw).ok_or_else(|| {
                    Error::Unsupported(format!(
                        "{}: tokenizer.ggml.pre '{}' is not supported (supported: {}); {hatch}",
                        path.display(),
                        crate::error::one_line(pre_raw),
                        supported_pre_list()
                    ))
                })?
            };
            pre_name = if pre_raw.is_empty() {
                "default".to_string()
            } else {
                pre_raw.to_string()
            };
            let ignore_merges = matches!(pre, Pre::Llama3 | Pre::Glm4);
            let merges = array(f, "tokenizer.ggml.merges")
                .ok_or_else(|| bad("gpt2 tokenizer without tokenizer.ggml.merges".to_string()))?;
            let mut merge_bytes = Vec::with_capacity(merges.len());
            for m in merges {
                match m {
                    Value::String(s) => merge_bytes.push(s.0.as_slice()),
                    _ => {
                        return Err(bad(
                            "tokenizer.ggml.merges is not an array of strings".into()
                        ))
                    }
                }
            }
            let bpe = Box::new(bpe::Bpe::new(
                &tokens,
                merge_bytes.into_iter(),
                ignore_merges,
            ));
            Model::Bpe {
                bpe,
                steps: pre.steps()?,
            }
        } else {
            pre_name = "default".to_string();
            let scores = match array(f, "tokenizer.ggml.scores") {
                None => vec![0.0; n_vocab],
                Some(v) => {
                    if v.len() < n_vocab {
                        return Err(bad(format!(
                            "tokenizer.ggml.scores has {} entries for {n_vocab} tokens",
                            v.len()
                        )));
                    }
                    v.iter().map(|x| x.as_f64().unwrap_or(0.0) as f32).collect()
                }
            };
            Model::Spm(spm::Spm::new(&tokens, scores))
        };
        let add_space_prefix = f
            .get("tokenizer.ggml.add_space_prefix")
            .and_then(Value::as_bool)
            .unwrap_or(!is_bpe);

        let Specials {
            bos,
            eos,
            unk,
            add_bos,
            add_eos,
        } = Specials::of(f, &model_name, pre_raw, n_vocab);

        mark_control_looking(&tokens, &mut attrs);
        set_strip_attrs(f, &pre_name, &token_to_id, &mut attrs);

        // User-defined tokens are split out of raw text (parse_special = false skips
        // control and unknown ones), longest first.
        let mut partition: Vec<u32> = (0..n_vocab as u32)
            .filter(|&i| {
                let a = attrs[i as usize];
                a & ATTR_USER_DEFINED != 0 && a & (ATTR_CONTROL | ATTR_UNKNOWN) == 0
            })
            .collect();
        partition.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));
        let mut partition_by_byte = vec![Vec::new(); 256];
        for (k, &id) in partition.iter().enumerate() {
            if let Some(&b) = tokens[id as usize].first() {
                partition_by_byte[b as usize].push(k as u32);
            }
        }

        Ok(Tokenizer {
            model,
            model_name,
            pre_name,
            tokens,
            attrs,
            token_to_id,
            partition,
            partition_by_byte,
            bos,
            eos,
            unk,
            add_bos,
            add_eos,
            add_space_prefix,
        })
    }

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

fn array<'a>(f: &'a GgufFile, key: &str) -> Option<&'a [Value]> {
    f.get(key).and_then(Value::as_array)
}

/// llama.cpp marks tokens whose text looks like an end-of-generation / FIM control token as
/// control even when the file types them otherwise (so they are not split out of raw text).
fn mark_control_looking(tokens: &[Vec<u8>], attrs: &mut [u8]) {
    const NAMES: &[&str] = &[
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
        "<|eom_id|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "</s>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "[e~[",
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
        "<|fim_pad|>",
        "<fim-pad>",
        "<fim_pad>",
        "<PAD>",
        "[PAD]",
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
        "<|file_sep|>",
    ];
    for (t, a) in tokens.iter().zip(attrs.iter_mut()) {
        if NAMES.iter().any(|n| n.as_bytes() == t.as_slice()) {
            *a |= ATTR_CONTROL;
        }
    }
    // gpt-oss: these are always rendered, typed user-defined.
    for (t, a) in tokens.iter().zip(attrs.iter_mut()) {
        if [
            &b"<|channel|>"[..],
            b"<|message|>",
            b"<|start|>",
            b"<|constrain|>",
        ]
        .contains(&t.as_slice())
        {
            *a = ATTR_USER_DEFINED;
        }
    }
}

/// llama.cpp's per-model strip attributes (white space eaten next to special tokens).
fn set_strip_attrs(
    f: &GgufFile,
    pre: &str,
    token_to_id: &FastMap<Box<[u8]>, u32>,
    attrs: &mut [u8],
) {
    let name = f.get_str("general.name").unwrap_or("").to_ascii_lowercase();
    let arch = f.architecture().unwrap_or("");
    let set = |attrs: &mut [u8], text: &str, bit: u8, on: bool| {
        if let Some(&id) = token_to_id.get(text.as_bytes()) {
            let a = &mut attrs[id as usize];
            *a = if on { *a | bit } else { *a & !bit };
        }
    };
    if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
        .iter()
        .any(|p| pre.contains(p))
        || ["nomic-bert-moe", "jina-bert-v3"]
            .iter()
            .any(|p| arch.contains(p))
    {
        set(attrs, "<mask>", ATTR_LSTRIP, true);
    } else if name.contains("phi-3") || name.contains("phi3") {
        for a in attrs.iter_mut() {
            if *a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0 {
                *a |= ATTR_RSTRIP;
            }
        }
        set(attrs, "</s>", ATTR_RSTRIP, true);
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            set(attrs, t, ATTR_RSTRIP, false);
        }
    } else if name.contains("modern-bert") {
        set(attrs, "[MASK]", ATTR_LSTRIP, true);
    }
}
