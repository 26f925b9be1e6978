//! Building a [`Tokenizer`] from GGUF metadata: vocabulary, scores, token types, merges, special
//! ids and the attribute fix-ups llama.cpp applies at load time.

use super::pre::supported_pre_list;
use super::*;

impl Tokenizer {
    /// Build the tokenizer a GGUF file describes. Unsupported tokenizers are
    /// `Error::Unsupported` naming the value and the supported list.
    // One function on purpose: it follows llama.cpp's llama_vocab::impl::load in order (types,
    // specials, attributes, pre-tokenizer), which is what the golden tests compare against.
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
}

pub(super) fn array<'a>(f: &'a GgufFile, key: &str) -> Option<&'a [Value]> {
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
