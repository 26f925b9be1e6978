//! Just enough of a `tokenizer.json` BPE encoder to compute convert_hf_to_gguf's pre-tokenizer
//! fingerprint: the token ids of a fixed check text, hashed. Supports added tokens, the NFC
//! normalizer (the check text is already NFC), the Sequence / Split / ByteLevel / Digits
//! pre-tokenizers, the BPE model (merges by rank, `ignore_merges`, byte fallback, unk) and the
//! TemplateProcessing / Roberta / Bert / ByteLevel post-processors. Anything else is a clear error.
//!
//! Split regexes run on the `regex` crate alternative by alternative, in order, at each position
//! (the backtracking semantics of the original for these patterns); the one lookahead the common
//! patterns use, `\s+(?!\S)`, is implemented by hand.

use regex::Regex;
use serde_json::Value as Json;
use std::collections::HashMap;

pub type Res<T> = std::result::Result<T, String>;

/// One alternative of a split pattern.
enum Alt {
    Re(Regex),
    /// `\s+(?!\S)`
    SpaceRunNotBeforeNonSpace,
}

pub struct Pattern {
    alts: Vec<Alt>,
}

fn top_level_alternatives(p: &str) -> Vec<String> {
    let (mut out, mut cur) = (vec![], String::new());
    let (mut depth, mut class, mut esc) = (0i32, false, false);
    for c in p.chars() {
        if esc {
            cur.push(c);
            esc = false;
            continue;
        }
        match c {
            '\\' => esc = true,
            '[' if !class => class = true,
            ']' if class => class = false,
            '(' if !class => depth += 1,
            ')' if !class => depth -= 1,
            '|' if !class && depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

impl Pattern {
    pub fn regex(p: &str) -> Res<Pattern> {
        let mut alts = vec![];
        for a in top_level_alternatives(p) {
            if a == r"\s+(?!\S)" {
                alts.push(Alt::SpaceRunNotBeforeNonSpace);
                continue;
            }
            let re = Regex::new(&format!("^(?:{a})"))
                .map_err(|_| format!("unsupported split regex alternative '{a}'"))?;
            alts.push(Alt::Re(re));
        }
        Ok(Pattern { alts })
    }

    pub fn literal(s: &str) -> Res<Pattern> {
        Pattern::regex(&regex::escape(s))
    }

    /// Non-overlapping matches, leftmost first, as byte ranges.
    pub fn find_all(&self, s: &str) -> Vec<(usize, usize)> {
        let mut out = vec![];
        let mut p = 0;
        while p < s.len() {
            let rest = &s[p..];
            let mut m = None;
            for a in &self.alts {
                let len = match a {
                    Alt::Re(re) => re.find(rest).map(|m| m.end()).filter(|&e| e > 0),
                    Alt::SpaceRunNotBeforeNonSpace => {
                        let mut ends = vec![];
                        for (i, c) in rest.char_indices() {
                            if !c.is_whitespace() {
                                break;
                            }
                            ends.push(i + c.len_utf8());
                        }
                        match ends.last() {
                            None => None,
                            Some(&e) if e == rest.len() => Some(e),
                            // Followed by a non-space: give back one whitespace character.
                            Some(_) if ends.len() >= 2 => Some(ends[ends.len() - 2]),
                            Some(_) => None,
                        }
                    }
                };
                if let Some(l) = len {
                    m = Some(l);
                    break;
                }
            }
            match m {
                Some(l) => {
                    out.push((p, p + l));
                    p += l;
                }
                None => p += rest.chars().next().map(char::len_utf8).unwrap_or(1),
            }
        }
        out
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Behavior {
    Removed,
    Isolated,
    MergedWithPrevious,
    MergedWithNext,
    Contiguous,
}

fn split_pieces(s: &str, pat: &Pattern, behavior: Behavior, invert: bool) -> Vec<String> {
    let mut segs: Vec<(bool, &str)> = vec![];
    let mut last = 0;
    for (a, b) in pat.find_all(s) {
        if a > last {
            segs.push((false, &s[last..a]));
        }
        segs.push((true, &s[a..b]));
        last = b;
    }
    if last < s.len() {
        segs.push((false, &s[last..]));
    }
    if invert {
        for x in segs.iter_mut() {
            x.0 = !x.0;
        }
    }
    let mut out: Vec<String> = vec![];
    match behavior {
        Behavior::Isolated => out = segs.iter().map(|(_, t)| t.to_string()).collect(),
        Behavior::Removed => {
            out = segs
                .iter()
                .filter(|(m, _)| !m)
                .map(|(_, t)| t.to_string())
                .collect()
        }
        Behavior::MergedWithPrevious => {
            let mut prev_match = false;
            for (m, t) in segs {
                if m && !out.is_empty() && !prev_match {
                    out.last_mut().unwrap().push_str(t);
                } else {
                    out.push(t.to_string());
                }
                prev_match = m;
            }
        }
        Behavior::MergedWithNext => {
            let mut carry: Option<String> = None;
            for (m, t) in segs {
                if m {
                    let mut c = carry.take().unwrap_or_default();
                    c.push_str(t);
                    carry = Some(c);
                } else {
                    let mut c = carry.take().unwrap_or_default();
                    c.push_str(t);
                    out.push(c);
                }
            }
            if let Some(c) = carry {
                out.push(c);
            }
        }
        Behavior::Contiguous => {
            let mut prev_match = false;
            for (m, t) in segs {
                if m && prev_match && !out.is_empty() {
                    out.last_mut().unwrap().push_str(t);
                } else {
                    out.push(t.to_string());
                }
                prev_match = m;
            }
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

enum Pre {
    Split(Pattern, Behavior, bool),
    ByteLevel {
        add_prefix_space: bool,
        use_regex: bool,
    },
    Digits(bool),
}

enum Post {
    Template { single: Vec<Result<Vec<u32>, ()>> },
    Around(Vec<u32>, Vec<u32>),
}

/// GPT-2's byte → printable character table.
pub fn bytes_to_unicode() -> [char; 256] {
    let mut t = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (b'!' as u32..=b'~' as u32).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b);
        t[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    t
}

const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

pub struct Encoder {
    vocab: HashMap<String, u32>,
    ranks: HashMap<(String, String), usize>,
    ignore_merges: bool,
    byte_fallback: bool,
    unk: Option<u32>,
    added: Vec<(String, u32)>,
    pre: Vec<Pre>,
    post: Vec<Post>,
}

fn str_of<'a>(v: &'a Json, k: &str) -> Option<&'a str> {
    v.get(k).and_then(|x| x.as_str())
}

fn parse_pre(v: &Json, out: &mut Vec<Pre>) -> Res<()> {
    match str_of(v, "type").unwrap_or("") {
        "Sequence" => {
            for p in v
                .get("pretokenizers")
                .and_then(|x| x.as_array())
                .ok_or("pre_tokenizer Sequence without pretokenizers")?
            {
                parse_pre(p, out)?;
            }
        }
        "Split" => {
            let pat = v.get("pattern").ok_or("Split without pattern")?;
            let pattern = if let Some(r) = str_of(pat, "Regex") {
                Pattern::regex(r)?
            } else if let Some(s) = str_of(pat, "String") {
                Pattern::literal(s)?
            } else {
                return Err("Split pattern is neither Regex nor String".into());
            };
            let b = match str_of(v, "behavior").unwrap_or("Isolated") {
                "Removed" => Behavior::Removed,
                "Isolated" => Behavior::Isolated,
                "MergedWithPrevious" => Behavior::MergedWithPrevious,
                "MergedWithNext" => Behavior::MergedWithNext,
                "Contiguous" => Behavior::Contiguous,
                o => return Err(format!("unsupported Split behavior '{o}'")),
            };
            let invert = v.get("invert").and_then(|x| x.as_bool()).unwrap_or(false);
            out.push(Pre::Split(pattern, b, invert));
        }
        "ByteLevel" => out.push(Pre::ByteLevel {
            add_prefix_space: v
                .get("add_prefix_space")
                .and_then(|x| x.as_bool())
                .unwrap_or(true),
            use_regex: v.get("use_regex").and_then(|x| x.as_bool()).unwrap_or(true),
        }),
        "Digits" => out.push(Pre::Digits(
            v.get("individual_digits")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
        )),
        o => return Err(format!("unsupported pre_tokenizer '{o}'")),
    }
    Ok(())
}

fn check_normalizer(v: &Json) -> Res<()> {
    if v.is_null() {
        return Ok(());
    }
    match str_of(v, "type").unwrap_or("") {
        // The check text is NFC already, so NFC leaves it unchanged.
        "NFC" => Ok(()),
        "Sequence" => {
            for n in v
                .get("normalizers")
                .and_then(|x| x.as_array())
                .into_iter()
                .flatten()
            {
                check_normalizer(n)?;
            }
            Ok(())
        }
        o => Err(format!("unsupported normalizer '{o}'")),
    }
}

impl Encoder {
    /// Build the encoder a tokenizer.json describes (vocab, merges, added tokens, pre-tokenizer).
    // One function on purpose: it reads tokenizer.json's sections in the order gguf-py does.
    pub fn new(tok: &Json) -> Res<Encoder> {
        let model = tok.get("model").ok_or("no model")?;
        if str_of(model, "type") != Some("BPE") {
            return Err(format!(
                "model type '{}' is not BPE",
                str_of(model, "type").unwrap_or("?")
            ));
        }
        for k in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if model
                .get(k)
                .is_some_and(|v| !v.is_null() && v.as_str() != Some(""))
            {
                return Err(format!("unsupported BPE option {k}"));
            }
        }
        let vocab: HashMap<String, u32> = model
            .get("vocab")
            .and_then(|v| v.as_object())
            .ok_or("BPE model without vocab")?
            .iter()
            .filter_map(|(k, v)| v.as_u64().map(|i| (k.clone(), i as u32)))
            .collect();
        let mut ranks = HashMap::new();
        for (r, m) in model
            .get("merges")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .enumerate()
        {
            let pair = if let Some(s) = m.as_str() {
                s.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            } else if let Some(a) = m.as_array() {
                match (
                    a.first().and_then(|x| x.as_str()),
                    a.get(1).and_then(|x| x.as_str()),
                ) {
                    (Some(x), Some(y)) if a.len() == 2 => Some((x.to_string(), y.to_string())),
                    _ => None,
                }
            } else {
                None
            };
            let pair = pair.ok_or_else(|| format!("malformed merge #{r}"))?;
            ranks.entry(pair).or_insert(r);
        }
        let unk = str_of(model, "unk_token").and_then(|u| vocab.get(u).copied());
        let added: Vec<(String, u32)> = tok
            .get("added_tokens")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|a| {
                Some((
                    str_of(a, "content")?.to_string(),
                    a.get("id")?.as_u64()? as u32,
                ))
            })
            .filter(|(c, _)| !c.is_empty())
            .collect();
        check_normalizer(tok.get("normalizer").unwrap_or(&Json::Null))?;
        let mut pre = vec![];
        if let Some(p) = tok.get("pre_tokenizer").filter(|p| !p.is_null()) {
            parse_pre(p, &mut pre)?;
        }
        let lookup = |t: &str| -> Res<u32> {
            vocab
                .get(t)
                .copied()
                .or_else(|| added.iter().find(|(c, _)| c == t).map(|(_, i)| *i))
                .ok_or_else(|| format!("post-processor token '{t}' is not in the vocabulary"))
        };
        let mut post = vec![];
        let mut procs = vec![];
        if let Some(p) = tok.get("post_processor").filter(|p| !p.is_null()) {
            match p.get("processors").and_then(|x| x.as_array()) {
                Some(list) if str_of(p, "type") == Some("Sequence") => procs.extend(list.iter()),
                _ => procs.push(p),
            }
        }
        for p in procs {
            match str_of(p, "type").unwrap_or("") {
                "ByteLevel" => {}
                "TemplateProcessing" => {
                    let specials = p.get("special_tokens");
                    let mut single = vec![];
                    for item in p
                        .get("single")
                        .and_then(|x| x.as_array())
                        .into_iter()
                        .flatten()
                    {
                        if let Some(st) = item.get("SpecialToken") {
                            let id = str_of(st, "id")
                                .ok_or("TemplateProcessing SpecialToken without id")?;
                            let ids = specials
                                .and_then(|s| s.get(id))
                                .and_then(|s| s.get("ids"))
                                .and_then(|x| x.as_array())
                                .map(|a| {
                                    a.iter()
                                        .filter_map(|i| i.as_u64().map(|i| i as u32))
                                        .collect()
                                })
                                .map(Ok)
                                .unwrap_or_else(|| lookup(id).map(|i| vec![i]))?;
                            single.push(Ok(ids));
                        } else {
                            single.push(Err(()));
                        }
                    }
                    post.push(Post::Template { single });
                }
                "RobertaProcessing" | "BertProcessing" => {
                    let tok_of = |k: &str| -> Res<u32> {
                        p.get(k)
                            .and_then(|x| x.as_array())
                            .and_then(|a| a.get(1))
                            .and_then(|i| i.as_u64())
                            .map(|i| i as u32)
                            .ok_or_else(|| format!("post-processor without {k}"))
                    };
                    post.push(Post::Around(vec![tok_of("cls")?], vec![tok_of("sep")?]));
                }
                o => return Err(format!("unsupported post_processor '{o}'")),
            }
        }
        Ok(Encoder {
            vocab,
            ranks,
            ignore_merges: model
                .get("ignore_merges")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            byte_fallback: model
                .get("byte_fallback")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            unk,
            added,
            pre,
            post,
        })
    }

    fn pre_tokenize(&self, text: &str) -> Vec<String> {
        let b2u = bytes_to_unicode();
        let mut pieces = vec![text.to_string()];
        for p in &self.pre {
            let mut next = vec![];
            for piece in pieces {
                match p {
                    Pre::Split(pat, b, inv) => next.extend(split_pieces(&piece, pat, *b, *inv)),
                    Pre::Digits(individual) => {
                        let pat = Pattern::regex(if *individual { r"\p{N}" } else { r"\p{N}+" })
                            .expect("static");
                        next.extend(split_pieces(&piece, &pat, Behavior::Isolated, false));
                    }
                    Pre::ByteLevel {
                        add_prefix_space,
                        use_regex,
                    } => {
                        let mut s = piece.clone();
                        if *add_prefix_space && !s.starts_with(' ') {
                            s.insert(0, ' ');
                        }
                        let parts = if *use_regex {
                            let pat = Pattern::regex(GPT2_PATTERN).expect("static");
                            split_pieces(&s, &pat, Behavior::Isolated, false)
                        } else {
                            vec![s]
                        };
                        for part in parts {
                            next.push(part.bytes().map(|b| b2u[b as usize]).collect());
                        }
                    }
                }
            }
            pieces = next;
        }
        pieces
    }

    fn bpe(&self, word: &str, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges {
            if let Some(&id) = self.vocab.get(word) {
                out.push(id);
                return;
            }
        }
        let mut syms: Vec<String> = word.chars().map(|c| c.to_string()).collect();
        loop {
            let mut best: Option<(usize, usize)> = None;
            for i in 0..syms.len().saturating_sub(1) {
                if let Some(&r) = self.ranks.get(&(syms[i].clone(), syms[i + 1].clone())) {
                    if best.is_none_or(|(br, _)| r < br) {
                        best = Some((r, i));
                    }
                }
            }
            let Some((_, i)) = best else { break };
            let right = syms.remove(i + 1);
            syms[i].push_str(&right);
        }
        for s in syms {
            if let Some(&id) = self.vocab.get(&s) {
                out.push(id);
            } else if self.byte_fallback {
                for b in s.bytes() {
                    if let Some(&id) = self.vocab.get(&format!("<0x{b:02X}>")) {
                        out.push(id);
                    } else if let Some(u) = self.unk {
                        out.push(u);
                    }
                }
            } else if let Some(u) = self.unk {
                out.push(u);
            }
        }
    }

    /// Token ids of `text` with the post-processor's special tokens (`add_special_tokens=True`).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = vec![];
        // Added tokens first: leftmost, longest at the same start.
        let mut rest = text;
        let mut segments: Vec<(&str, Option<u32>)> = vec![];
        while !rest.is_empty() {
            let mut best: Option<(usize, usize, u32)> = None;
            for (c, id) in &self.added {
                if let Some(p) = rest.find(c.as_str()) {
                    if best.is_none_or(|(bp, bl, _)| p < bp || (p == bp && c.len() > bl)) {
                        best = Some((p, c.len(), *id));
                    }
                }
            }
            match best {
                Some((p, l, id)) => {
                    segments.push((&rest[..p], None));
                    segments.push(("", Some(id)));
                    rest = &rest[p + l..];
                }
                None => {
                    segments.push((rest, None));
                    rest = "";
                }
            }
        }
        for (s, id) in segments {
            if let Some(id) = id {
                ids.push(id);
                continue;
            }
            if s.is_empty() {
                continue;
            }
            let pieces = if self.pre.is_empty() {
                vec![s.to_string()]
            } else {
                self.pre_tokenize(s)
            };
            for p in pieces {
                self.bpe(&p, &mut ids);
            }
        }
        for p in &self.post {
            match p {
                Post::Template { single } => {
                    let mut out = vec![];
                    for item in single {
                        match item {
                            Ok(v) => out.extend_from_slice(v),
                            Err(()) => out.extend_from_slice(&ids),
                        }
                    }
                    ids = out;
                }
                Post::Around(a, b) => {
                    let mut out = a.clone();
                    out.extend_from_slice(&ids);
                    out.extend_from_slice(b);
                    ids = out;
                }
            }
        }
        ids
    }
}

/// Python's `str(list_of_ints)`.
pub fn py_list_repr(ids: &[u32]) -> String {
    let inner: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    format!("[{}]", inner.join(", "))
}

/// Lowercase hex SHA-256, as Python's `hashlib.sha256(…).hexdigest()` (convert_hf_to_gguf's chkhsh).
fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// convert_hf_to_gguf's `tokenizer.ggml.pre` for this tokenizer, or why it cannot be named.
pub fn detect_pre(tok: &Json) -> Res<(String, String)> {
    let enc = Encoder::new(tok)?;
    let ids = enc.encode(super::pre::CHKTXT);
    let h = sha256_hex(py_list_repr(&ids).as_bytes());
    // The reference tests every entry in turn, so the last match wins.
    match super::pre::PRE_HASHES.iter().rev().find(|(x, _)| *x == h) {
        Some((_, name)) => Ok((name.to_string(), h)),
        None => Err(format!("BPE pre-tokenizer not recognized (chkhsh {h})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FIPS 180-4 vectors, and the hash of convert_hf_to_gguf's check text itself.
    #[test]
    fn sha256_vectors() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(&[b'a'; 1000]),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
        );
        assert_eq!(
            sha256_hex(super::super::pre::CHKTXT.as_bytes()),
            "a36179c1e2b1cfcfbfad1dc779addad2ffc778201e4cf0d538bddeafa2c526da"
        );
    }

    #[test]
    fn gpt2_split() {
        let p = Pattern::regex(GPT2_PATTERN).unwrap();
        let s = "Hello  world's 33\n\n  x";
        let parts: Vec<&str> = p.find_all(s).iter().map(|&(a, b)| &s[a..b]).collect();
        assert_eq!(parts, ["Hello", " ", " world", "'s", " 33", "\n\n ", " x"]);
        let parts: Vec<&str> = p
            .find_all("a  ")
            .iter()
            .map(|&(a, b)| &"a  "[a..b])
            .collect();
        assert_eq!(parts, ["a", "  "]);
    }

    #[test]
    fn byte_table() {
        let t = bytes_to_unicode();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
    }

    #[test]
    fn tiny_bpe() {
        let tok: Json = serde_json::from_str(
            r#"{"added_tokens":[{"id":5,"content":"<s>","special":true}],
            "normalizer":null,
            "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},
            "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
               "special_tokens":{"<s>":{"id":"<s>","ids":[5],"tokens":["<s>"]}}},
            "model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"Ġab":4},"merges":["a b","Ġ ab"]}}"#,
        )
        .unwrap();
        let e = Encoder::new(&tok).unwrap();
        assert_eq!(e.encode("ab ab<s>a"), vec![5, 2, 4, 5, 0]);
        assert_eq!(py_list_repr(&[1, 22]), "[1, 22]");
    }

    #[test]
    fn unsupported_is_an_error() {
        let tok: Json = serde_json::from_str(
            r#"{"normalizer":{"type":"NFKC"},"model":{"type":"BPE","vocab":{},"merges":[]}}"#,
        )
        .unwrap();
        assert!(Encoder::new(&tok).err().unwrap().contains("NFKC"));
    }
}
