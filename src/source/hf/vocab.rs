//! tokenizer.json / tokenizer_config.json / config.json → `tokenizer.*` GGUF keys, following
//! convert_hf_to_gguf (`_set_vocab_gpt2`, `_set_vocab_llama_hf`, `_set_vocab_sentencepiece`) and
//! gguf-py's `SpecialVocab`.

use super::config::{Arch, Config};
use crate::error::{Error, Result};
use crate::gguf::{Value, ValueType};
use serde_json::{Map, Value as Json};
use std::path::Path;

pub const NORMAL: i32 = 1;
pub const UNKNOWN: i32 = 2;
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;
pub const UNUSED: i32 = 5;
pub const BYTE: i32 = 6;

/// Set a key in place (gguf-py overwrites a duplicate key where it first was) or append it.
pub fn set_kv(md: &mut Vec<(String, Value)>, k: &str, v: Value) {
    match md.iter_mut().find(|(kk, _)| kk == k) {
        Some(e) => e.1 = v,
        None => md.push((k.to_string(), v)),
    }
}

fn read_json(path: &Path) -> Result<Option<Json>> {
    match std::fs::read_to_string(path) {
        Ok(t) => serde_json::from_str(&t)
            .map(Some)
            .map_err(|e| Error::bad_input(path, format!("invalid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

fn str_array(v: impl IntoIterator<Item = String>) -> Value {
    Value::Array(
        ValueType::String,
        v.into_iter().map(|s| Value::String(s.into())).collect(),
    )
}

fn does_token_look_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<｜") && t.ends_with("｜>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

struct AddedToken {
    id: u64,
    content: String,
    special: bool,
}

fn added_tokens(tok: &Json) -> Vec<AddedToken> {
    tok.get("added_tokens")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|a| {
            Some(AddedToken {
                id: a.get("id")?.as_u64()?,
                content: a.get("content")?.as_str()?.to_string(),
                special: a.get("special").and_then(|v| v.as_bool()).unwrap_or(false),
            })
        })
        .collect()
}

/// All `tokenizer.*` keys for the model in `dir`, appended to `md` in convert_hf_to_gguf's order.
pub fn tokenizer_metadata(dir: &Path, cfg: &Config, md: &mut Vec<(String, Value)>) -> Result<()> {
    let tok_path = dir.join("tokenizer.json");
    let tc_path = dir.join("tokenizer_config.json");
    let tc = read_json(&tc_path)?;
    let tok = read_json(&tok_path)?;
    if cfg.arch == Arch::Llama {
        if let Some(b) = tc
            .as_ref()
            .and_then(|t| t.get("add_prefix_space"))
            .and_then(|v| v.as_bool())
        {
            md.push(("tokenizer.ggml.add_space_prefix".into(), Value::Bool(b)));
        }
    }
    if dir.join("tokenizer.model").is_file() {
        super::spm::sentencepiece_vocab(dir, cfg, tok.as_ref(), tc.as_ref(), md)?;
    } else {
        let tok = tok.ok_or_else(|| {
            Error::bad_input(
                dir,
                "no tokenizer.json (nor tokenizer.model): tq needs the Hugging Face tokenizer files beside config.json",
            )
        })?;
        let model = tok.get("model").cloned().unwrap_or(Json::Null);
        let is_bpe = model.get("type").and_then(|v| v.as_str()) == Some("BPE");
        let byte_fallback = model.get("byte_fallback").and_then(|v| v.as_bool());
        let ignore_merges = model
            .get("ignore_merges")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let is_llama3 = is_bpe && ignore_merges && !byte_fallback.unwrap_or(true);
        let decoder_seq = tok
            .get("decoder")
            .and_then(|d| d.get("type"))
            .and_then(|v| v.as_str())
            == Some("Sequence");
        if cfg.arch == Arch::Llama
            && !is_llama3
            && is_bpe
            && byte_fallback == Some(true)
            && decoder_seq
        {
            llama_hf_vocab(dir, &tok_path, &tok, tc.as_ref(), md)?;
        } else {
            gpt2_vocab(dir, &tok_path, cfg, &tok, tc.as_ref(), md)?;
        }
    }
    // convert_hf_to_gguf: "Apply to granite small models only".
    if cfg.arch == Arch::Llama && cfg.vocab_size()? == Some(49152) {
        set_kv(md, "tokenizer.ggml.add_bos_token", Value::Bool(false));
    }
    Ok(())
}

/// `_set_vocab_gpt2`: byte-level BPE.
fn gpt2_vocab(
    dir: &Path,
    tok_path: &Path,
    cfg: &Config,
    tok: &Json,
    tc: Option<&Json>,
    md: &mut Vec<(String, Value)>,
) -> Result<()> {
    let bad = |m: String| Error::bad_input(tok_path, m);
    let vocab = tok
        .get("model")
        .and_then(|m| m.get("vocab"))
        .and_then(|v| v.as_object())
        .ok_or_else(|| bad("no model.vocab".into()))?;
    let added = added_tokens(tok);
    let mut reverse: std::collections::HashMap<u64, String> = Default::default();
    for (t, id) in vocab {
        let id = id.as_u64().ok_or_else(|| {
            bad(format!(
                "token id of '{}' is not an integer",
                crate::error::one_line(t)
            ))
        })?;
        reverse.insert(id, t.clone());
    }
    for a in &added {
        reverse.insert(a.id, a.content.clone());
    }
    let mut distinct: std::collections::HashSet<&str> = vocab.keys().map(|s| s.as_str()).collect();
    distinct.extend(added.iter().map(|a| a.content.as_str()));
    let vocab_size = cfg.vocab_size()?.unwrap_or(distinct.len() as u64);
    let max_id = reverse.keys().max().copied().unwrap_or(0);
    if max_id >= vocab_size || vocab_size > 1 << 24 {
        return Err(bad(format!(
            "token id {max_id} is not below the vocabulary size {vocab_size} of config.json"
        )));
    }
    let (pre, _hash) = super::bpe::detect_pre(tok).map_err(|m| {
        bad(format!(
            "{m}; tq knows the pre-tokenizers convert_hf_to_gguf knows (tokenizer.ggml.pre)"
        ))
    })?;
    let mut tokens = Vec::with_capacity(vocab_size as usize);
    let mut types = Vec::with_capacity(vocab_size as usize);
    for i in 0..vocab_size {
        match reverse.get(&i) {
            None => {
                tokens.push(format!("[PAD{i}]"));
                types.push(UNUSED);
            }
            Some(t) => {
                let mut t = t.clone();
                if let Some(a) = added.iter().find(|a| a.content == t) {
                    let special = added
                        .iter()
                        .find(|x| x.id == i)
                        .map(|x| x.special)
                        .unwrap_or(a.special);
                    if special || does_token_look_special(&t) {
                        types.push(CONTROL);
                    } else {
                        t = t.replace('\u{2581}', " ");
                        types.push(USER_DEFINED);
                    }
                } else {
                    types.push(NORMAL);
                }
                tokens.push(t);
            }
        }
    }
    md.push(("tokenizer.ggml.model".into(), Value::string("gpt2")));
    md.push(("tokenizer.ggml.pre".into(), Value::string(&pre)));
    md.push(("tokenizer.ggml.tokens".into(), str_array(tokens)));
    md.push((
        "tokenizer.ggml.token_type".into(),
        Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
    ));
    special_vocab(dir, Some(tok), tc, true, None, md)
}

/// `_set_vocab_llama_hf`: a SentencePiece-style BPE tokenizer.json (byte fallback).
// One function on purpose: it follows gguf-py's LlamaHfVocab in order (tokens, scores, types).
fn llama_hf_vocab(
    dir: &Path,
    tok_path: &Path,
    tok: &Json,
    tc: Option<&Json>,
    md: &mut Vec<(String, Value)>,
) -> Result<()> {
    let bad = |m: String| Error::bad_input(tok_path, m);
    let vocab = tok
        .get("model")
        .and_then(|m| m.get("vocab"))
        .and_then(|v| v.as_object())
        .ok_or_else(|| bad("no model.vocab".into()))?;
    let base = vocab.len() as u64;
    let mut reverse: std::collections::HashMap<u64, &str> = Default::default();
    for (t, id) in vocab {
        reverse.insert(
            id.as_u64()
                .ok_or_else(|| bad("non-integer token id".into()))?,
            t,
        );
    }
    let mut added = added_tokens(tok);
    added.sort_by_key(|a| a.id);
    let added_beyond: Vec<&AddedToken> = added.iter().filter(|a| a.id >= base).collect();
    // The tokenizer's special tokens: tokenizer_config's named ones and additional_special_tokens.
    let lookup = |s: &str| -> Option<u64> {
        vocab
            .get(s)
            .and_then(|v| v.as_u64())
            .or_else(|| added.iter().find(|a| a.content == s).map(|a| a.id))
    };
    let mut special_names: Vec<String> = vec![];
    let content = |v: &Json| -> Option<String> {
        v.as_str().map(str::to_string).or_else(|| {
            v.get("content")
                .and_then(|c| c.as_str())
                .map(str::to_string)
        })
    };
    // transformers' LlamaTokenizerFast (what upstream asks) defaults these three when
    // tokenizer_config.json does not name them; an explicit null turns one off.
    for (k, default) in [
        ("bos_token", "<s>"),
        ("eos_token", "</s>"),
        ("unk_token", "<unk>"),
    ] {
        if tc.is_none_or(|tc| tc.get(k).is_none()) {
            special_names.push(default.to_string());
        }
    }
    if let Some(tc) = tc {
        for k in [
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
        ] {
            if let Some(s) = tc.get(k).and_then(content) {
                special_names.push(s);
            }
        }
        for v in tc
            .get("additional_special_tokens")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            if let Some(s) = content(v) {
                special_names.push(s);
            }
        }
    }
    let special_ids: std::collections::HashSet<u64> =
        special_names.iter().filter_map(|s| lookup(s)).collect();
    let byte_re = regex::Regex::new(r"^<0x[0-9A-Fa-f]{2}>$").unwrap();
    let (mut tokens, mut scores, mut types) = (vec![], vec![], vec![]);
    let added_ids: std::collections::HashSet<u64> = added_beyond.iter().map(|a| a.id).collect();
    for id in 0..base {
        if added_ids.contains(&id) {
            continue;
        }
        let t = reverse
            .get(&id)
            .ok_or_else(|| bad(format!("token id {id} missing from model.vocab")))?;
        tokens.push(t.to_string());
        scores.push(-1000.0f32);
        types.push(if byte_re.is_match(t) {
            BYTE
        } else if special_ids.contains(&id) {
            CONTROL
        } else {
            NORMAL
        });
    }
    for a in &added_beyond {
        tokens.push(a.content.clone());
        scores.push(-1000.0);
        types.push(if special_names.contains(&a.content) {
            CONTROL
        } else {
            USER_DEFINED
        });
    }
    let n = tokens.len() as u64;
    md.push(("tokenizer.ggml.model".into(), Value::string("llama")));
    md.push(("tokenizer.ggml.pre".into(), Value::string("default")));
    md.push(("tokenizer.ggml.tokens".into(), str_array(tokens)));
    md.push((
        "tokenizer.ggml.scores".into(),
        Value::Array(ValueType::F32, scores.into_iter().map(Value::F32).collect()),
    ));
    md.push((
        "tokenizer.ggml.token_type".into(),
        Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
    ));
    special_vocab(dir, Some(tok), tc, false, Some(n), md)
}

/// gguf-py `SpecialVocab(dir, load_merges, n_vocab).add_to_gguf(...)`.
// One function on purpose: it follows gguf-py's SpecialVocab._load/add_to_gguf step by step
// (merges, special ids, add_* flags, chat template) so the two can be compared side by side.
pub fn special_vocab(
    dir: &Path,
    tok: Option<&Json>,
    tc: Option<&Json>,
    load_merges: bool,
    n_vocab: Option<u64>,
    md: &mut Vec<(String, Value)>,
) -> Result<()> {
    let mut types: Vec<&'static str> = vec!["bos", "eos", "unk", "sep", "pad", "cls", "mask"];
    let mut ids: Vec<(&'static str, u64)> = vec![];
    let mut add: Vec<(&'static str, bool)> = vec![];
    let mut merges: Vec<String> = vec![];
    let (mut lower, mut strip) = (None, None);
    let mut tc: Option<Map<String, Json>> = tc.and_then(|v| v.as_object().cloned());
    let set_id =
        |ids: &mut Vec<(&'static str, u64)>, typ: &'static str, v: Option<&Json>| -> Result<()> {
            let Some(v) = v else { return Ok(()) };
            let tid = match v {
                Json::Number(n) if n.is_i64() || n.is_u64() => n.as_i64().unwrap_or(i64::MAX),
                Json::Bool(b) => *b as i64,
                _ => return Ok(()),
            };
            if tid < 0 {
                return Err(Error::bad_input(
                    dir,
                    format!("invalid value for special token type {typ}: {tid}"),
                ));
            }
            if n_vocab.is_none_or_lt(tid as u64) && !ids.iter().any(|(t, _)| *t == typ) {
                ids.push((typ, tid as u64));
            }
            Ok(())
        };
    let added = tok.map(added_tokens).unwrap_or_default();
    if let Some(tok) = tok {
        if load_merges {
            if let Some(list) = tok
                .get("model")
                .and_then(|m| m.get("merges"))
                .and_then(|v| v.as_array())
            {
                if let Some(first) = list.first() {
                    if first.is_string() {
                        merges = list
                            .iter()
                            .filter_map(|m| m.as_str().map(str::to_string))
                            .collect();
                    } else if first
                        .as_array()
                        .is_some_and(|a| a.len() == 2 && a[0].is_string())
                    {
                        merges = list
                            .iter()
                            .filter_map(|m| {
                                let a = m.as_array()?;
                                let f = |s: &Json| s.as_str().map(|s| s.replace(' ', "\u{0120}"));
                                Some(format!("{} {}", f(a.first()?)?, f(a.get(1)?)?))
                            })
                            .collect();
                    } else {
                        return Err(Error::bad_input(
                            dir.join("tokenizer.json"),
                            "unknown tokenizer merges format",
                        ));
                    }
                }
            }
        }
        if let Some(n) = tok.get("normalizer").filter(|n| !n.is_null()) {
            parse_normalizer(n, &mut lower, &mut strip);
        }
        let tcv = |tc: &Option<Map<String, Json>>, k: &str| {
            tc.as_ref()
                .and_then(|t| t.get(k))
                .cloned()
                .unwrap_or(Json::Null)
        };
        let truthy =
            |v: &Json| !matches!(v, Json::Null | Json::Bool(false)) && v.as_str() != Some("");
        let has_tc = tc.as_ref().is_some_and(|t| !t.is_empty());
        let mut sp_bos = tcv(&tc, "bos_token");
        let mut sp_cls = tcv(&tc, "cls_token");
        let mut sp_eos = tcv(&tc, "eos_token");
        let mut sp_sep = tcv(&tc, "sep_token");
        if !truthy(&sp_bos) && truthy(&sp_cls) && has_tc {
            sp_bos = sp_cls.clone();
            tc.as_mut()
                .unwrap()
                .insert("bos_token".into(), sp_bos.clone());
        }
        if !truthy(&sp_eos) && truthy(&sp_sep) && has_tc {
            sp_eos = sp_sep.clone();
            tc.as_mut()
                .unwrap()
                .insert("eos_token".into(), sp_eos.clone());
        }
        let set_add =
            |add: &mut Vec<(&'static str, bool)>, k: &'static str, v: bool, only_default: bool| {
                match add.iter_mut().find(|(t, _)| *t == k) {
                    Some(e) if !only_default => e.1 = v,
                    Some(_) => {}
                    None => add.push((k, v)),
                }
            };
        if let Some(pp) = tok.get("post_processor").filter(|p| !p.is_null()) {
            let procs: Vec<&Json> = match pp.get("processors").and_then(|v| v.as_array()) {
                Some(l) => l.iter().collect(),
                None => vec![pp],
            };
            for p in procs {
                let s = |v: &Json| Json::String(v.as_str().unwrap_or_default().to_string());
                match p.get("type").and_then(|v| v.as_str()).unwrap_or("") {
                    "ByteLevel" => {
                        set_add(&mut add, "bos", false, true);
                        set_add(&mut add, "eos", false, true);
                    }
                    "RobertaProcessing" => {
                        set_add(&mut add, "bos", true, false);
                        set_add(&mut add, "eos", true, false);
                        set_add(&mut add, "sep", true, false);
                        if !truthy(&sp_cls) && has_tc {
                            sp_cls = p
                                .get("cls")
                                .and_then(|v| v.get(0))
                                .cloned()
                                .unwrap_or(sp_bos.clone());
                            tc.as_mut()
                                .unwrap()
                                .insert("cls_token".into(), sp_cls.clone());
                        }
                        if !truthy(&sp_sep) && has_tc {
                            sp_sep = p
                                .get("sep")
                                .and_then(|v| v.get(0))
                                .cloned()
                                .unwrap_or(sp_eos.clone());
                            tc.as_mut()
                                .unwrap()
                                .insert("sep_token".into(), sp_sep.clone());
                        }
                    }
                    "TemplateProcessing" => {
                        let st = |item: Option<&Json>| -> Option<Json> {
                            item?
                                .get("SpecialToken")?
                                .get("id")
                                .filter(|v| truthy(v))
                                .map(s)
                        };
                        let single: Vec<Json> = p
                            .get("single")
                            .and_then(|v| v.as_array())
                            .cloned()
                            .unwrap_or_default();
                        let pair: Vec<Json> = p
                            .get("pair")
                            .and_then(|v| v.as_array())
                            .cloned()
                            .unwrap_or_default();
                        let (mut first, mut last) = (None, None);
                        if single.len() > 1 {
                            first = st(single.first());
                            if let Some(f) = &first {
                                if !has_tc {
                                    sp_bos = f.clone();
                                } else if *f != sp_bos && *f != sp_cls {
                                    if !truthy(&sp_bos) {
                                        sp_bos = f.clone();
                                        tc.as_mut().unwrap().insert("bos_token".into(), f.clone());
                                    }
                                    if !truthy(&sp_cls) {
                                        sp_cls = f.clone();
                                        tc.as_mut().unwrap().insert("cls_token".into(), f.clone());
                                    }
                                }
                                set_add(&mut add, "bos", *f == sp_bos || *f == sp_cls, false);
                            }
                            last = st(single.last());
                            if let Some(l) = &last {
                                if !has_tc {
                                    sp_eos = l.clone();
                                } else if *l != sp_eos {
                                    let t = tc.as_mut().unwrap();
                                    if !types.contains(&"eot") {
                                        types.push("eot");
                                        t.insert("eot_token".into(), sp_eos.clone());
                                    } else if !types.contains(&"eom") {
                                        types.push("eom");
                                        t.insert("eom_token".into(), sp_eos.clone());
                                    }
                                    t.insert("eos_token".into(), l.clone());
                                    sp_eos = l.clone();
                                }
                                set_add(&mut add, "eos", *l == sp_eos, false);
                            }
                        }
                        if !pair.is_empty() {
                            let start = if first.is_some() && st(pair.first()) == first {
                                1
                            } else {
                                0
                            };
                            let stop_trim = last.is_some() && st(pair.last()) == last;
                            let end = if stop_trim {
                                pair.len().saturating_sub(1)
                            } else {
                                pair.len()
                            };
                            let tp: Vec<Json> = if start < end {
                                pair[start..end].to_vec()
                            } else {
                                vec![]
                            };
                            if !tp.is_empty() {
                                let seq = |v: &Json| {
                                    v.get("Sequence")
                                        .and_then(|x| x.get("id"))
                                        .and_then(|x| x.as_str())
                                        .map(str::to_string)
                                };
                                let (a, b) = (seq(&tp[0]), seq(&tp[tp.len() - 1]));
                                if a.as_deref() == Some("A")
                                    && b.as_deref() == Some("B")
                                    && tp.len() > 2
                                {
                                    let mid = &tp[1..tp.len() - 1];
                                    let mut add_sep = false;
                                    if let Some(e) = st(mid.first()) {
                                        if (e == sp_sep || e == sp_eos) && last.is_none() {
                                            add_sep = true;
                                        }
                                    }
                                    if mid.len() == 2 {
                                        if let Some(e) = st(mid.get(1)) {
                                            if e == sp_sep || e == sp_eos {
                                                add_sep = true;
                                            }
                                        }
                                    }
                                    set_add(&mut add, "sep", add_sep, false);
                                    if add_sep && !truthy(&sp_sep) && has_tc {
                                        tc.as_mut()
                                            .unwrap()
                                            .insert("sep_token".into(), sp_eos.clone());
                                    }
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let mut chat_template: Option<Json> = None;
    if let Some(tcm) = tc.as_ref().filter(|t| !t.is_empty()) {
        let alt = {
            let jinja = dir.join("chat_template.jinja");
            let json = dir.join("chat_template.json");
            if jinja.is_file() {
                let t = std::fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?;
                let mut extra = vec![];
                if let Ok(rd) = std::fs::read_dir(dir.join("additional_chat_templates")) {
                    for e in rd.flatten() {
                        let p = e.path();
                        if p.extension().is_some_and(|x| x == "jinja") {
                            let body = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
                            let name = p
                                .file_stem()
                                .map(|s| s.to_string_lossy().into_owned())
                                .unwrap_or_default();
                            extra.push((name, body));
                        }
                    }
                }
                if extra.is_empty() {
                    Some(Json::String(t))
                } else {
                    extra.sort();
                    let mut l = vec![serde_json::json!({"name": "default", "template": t})];
                    l.extend(
                        extra
                            .into_iter()
                            .map(|(n, b)| serde_json::json!({"name": n, "template": b})),
                    );
                    Some(Json::Array(l))
                }
            } else if json.is_file() {
                read_json(&json)?.and_then(|v| v.get("chat_template").cloned())
            } else {
                None
            }
        };
        let ct = match tcm.get("chat_template") {
            Some(v) => Some(v.clone()),
            None => alt,
        };
        chat_template = ct.filter(|v| v.is_string() || v.is_array());
        for typ in types.clone() {
            if let Some(Json::Bool(b)) = tcm.get(&format!("add_{typ}_token")) {
                if !add.iter().any(|(t, _)| *t == typ) {
                    add.push((typ, *b));
                }
            }
            let content = match tcm.get(&format!("{typ}_token")) {
                Some(Json::String(s)) => s.clone(),
                Some(Json::Object(o)) => match o.get("content").and_then(|c| c.as_str()) {
                    Some(c) => c.to_string(),
                    None => continue,
                },
                _ => continue,
            };
            let id = added
                .iter()
                .find(|a| a.content == content)
                .map(|a| Json::from(a.id));
            set_id(&mut ids, typ, id.as_ref())?;
        }
    }
    if let Some(Json::Object(cfg)) = read_json(&dir.join("config.json"))? {
        for typ in types.clone() {
            let k = format!("{typ}_token_id");
            let v = cfg.get(&k).filter(|v| !v.is_null()).or_else(|| {
                cfg.get("text_config")
                    .and_then(|t| t.get(&k))
                    .filter(|v| !v.is_null())
            });
            set_id(&mut ids, typ, v)?;
        }
    }
    if load_merges && merges.is_empty() {
        let p = dir.join("merges.txt");
        if let Ok(t) = std::fs::read_to_string(&p) {
            let mut lines = t.lines().peekable();
            if lines.peek().is_some_and(|l| l.trim().starts_with('#')) {
                lines.next();
            }
            for l in lines {
                let parts: Vec<&str> = l.split_whitespace().collect();
                if parts.len() == 2 {
                    merges.push(format!("{} {}", parts[0], parts[1]));
                }
            }
        }
    }
    if !merges.is_empty() {
        md.push(("tokenizer.ggml.merges".into(), str_array(merges)));
    }
    for (typ, id) in ids {
        let key = match typ {
            "bos" => "bos_token_id",
            "eos" => "eos_token_id",
            "unk" => "unknown_token_id",
            "sep" => "seperator_token_id",
            "pad" => "padding_token_id",
            "mask" => "mask_token_id",
            "eot" => "eot_token_id",
            "eom" => "eom_token_id",
            _ => continue, // gguf-py has no writer for cls
        };
        let id = u32::try_from(id)
            .map_err(|_| Error::bad_input(dir, format!("{typ} token id {id} out of range")))?;
        set_kv(md, &format!("tokenizer.ggml.{key}"), Value::U32(id));
    }
    for (typ, v) in add {
        if matches!(typ, "bos" | "eos" | "sep") {
            set_kv(
                md,
                &format!("tokenizer.ggml.add_{typ}_token"),
                Value::Bool(v),
            );
        }
    }
    match chat_template {
        Some(Json::String(t)) => set_kv(md, "tokenizer.chat_template", Value::string(&t)),
        Some(Json::Array(list)) => {
            let mut default = None;
            let mut names = vec![];
            for c in list {
                let name: String = c
                    .get("name")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .chars()
                    .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
                    .collect();
                let Some(t) = c.get("template").and_then(|v| v.as_str()) else {
                    continue;
                };
                if name.is_empty() {
                    continue;
                }
                if name == "default" {
                    default = Some(t.to_string());
                } else {
                    if !names.contains(&name) {
                        names.push(name.clone());
                    }
                    set_kv(
                        md,
                        &format!("tokenizer.chat_template.{name}"),
                        Value::string(t),
                    );
                }
            }
            if !names.is_empty() {
                set_kv(md, "tokenizer.chat_templates", str_array(names));
            }
            if let Some(t) = default {
                set_kv(md, "tokenizer.chat_template", Value::string(&t));
            }
        }
        _ => {}
    }
    if let Some(b) = lower {
        set_kv(md, "tokenizer.ggml.normalizer.lowercase", Value::Bool(b));
    }
    if let Some(b) = strip {
        set_kv(
            md,
            "tokenizer.ggml.normalizer.strip_accents",
            Value::Bool(b),
        );
    }
    Ok(())
}

trait BelowBound {
    fn is_none_or_lt(&self, v: u64) -> bool;
}

impl BelowBound for Option<u64> {
    fn is_none_or_lt(&self, v: u64) -> bool {
        self.is_none_or(|n| v < n)
    }
}

fn parse_normalizer(n: &Json, lower: &mut Option<bool>, strip: &mut Option<bool>) {
    match n.get("type").and_then(|v| v.as_str()) {
        Some("Lowercase") => *lower = Some(true),
        Some("StripAccents") => *strip = Some(true),
        Some("BertNormalizer") => {
            if let Some(b) = n.get("lowercase") {
                *lower = b.as_bool();
            }
            if let Some(b) = n.get("strip_accents") {
                *strip = b.as_bool();
            }
        }
        Some("Sequence") => {
            for x in n
                .get("normalizers")
                .and_then(|v| v.as_array())
                .into_iter()
                .flatten()
            {
                parse_normalizer(x, lower, strip);
            }
        }
        _ => {}
    }
}
