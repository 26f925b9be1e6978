//! `tokenizer.model` (a SentencePiece `ModelProto`) → `tokenizer.*` keys, as convert_hf_to_gguf's
//! `_set_vocab_sentencepiece`. Only the pieces (text, score, type) are read, with a small
//! protobuf reader that bounds every length by the bytes left.

use super::config::Config;
use super::vocab::{special_vocab, BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED};
use crate::error::{Error, Result};
use crate::gguf::{Value, ValueType};
use serde_json::Value as Json;
use std::path::Path;

pub struct Piece {
    pub text: Vec<u8>,
    pub score: f32,
    /// SentencePiece type: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
    pub kind: u64,
}

fn varint(b: &[u8], p: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let x = *b.get(*p)?;
        *p += 1;
        v |= ((x & 0x7f) as u64) << shift;
        if x & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Skip or read one field; returns (field number, wire type, payload range or varint value).
enum Field<'a> {
    Varint(u64),
    Fixed32([u8; 4]),
    Bytes(&'a [u8]),
    Other,
}

fn next_field<'a>(b: &'a [u8], p: &mut usize) -> Option<(u64, Field<'a>)> {
    let key = varint(b, p)?;
    let (num, wt) = (key >> 3, key & 7);
    let f = match wt {
        0 => Field::Varint(varint(b, p)?),
        1 => {
            let e = p.checked_add(8).filter(|&e| e <= b.len())?;
            *p = e;
            Field::Other
        }
        2 => {
            let n = usize::try_from(varint(b, p)?).ok()?;
            let e = p.checked_add(n).filter(|&e| e <= b.len())?;
            let s = &b[*p..e];
            *p = e;
            Field::Bytes(s)
        }
        5 => {
            let e = p.checked_add(4).filter(|&e| e <= b.len())?;
            let v = [b[*p], b[*p + 1], b[*p + 2], b[*p + 3]];
            *p = e;
            Field::Fixed32(v)
        }
        _ => return None,
    };
    Some((num, f))
}

pub fn parse_model(b: &[u8]) -> std::result::Result<Vec<Piece>, String> {
    let mut pieces = vec![];
    let mut p = 0;
    while p < b.len() {
        let (num, f) = next_field(b, &mut p).ok_or("truncated or malformed protobuf")?;
        if let (1, Field::Bytes(msg)) = (num, f) {
            let mut piece = Piece {
                text: vec![],
                score: 0.0,
                kind: 1,
            };
            let mut q = 0;
            while q < msg.len() {
                let (n, f) = next_field(msg, &mut q).ok_or("malformed SentencePiece entry")?;
                match (n, f) {
                    (1, Field::Bytes(s)) => piece.text = s.to_vec(),
                    (2, Field::Fixed32(v)) => piece.score = f32::from_le_bytes(v),
                    (3, Field::Varint(v)) => piece.kind = v,
                    _ => {}
                }
            }
            pieces.push(piece);
        }
    }
    if pieces.is_empty() {
        return Err("no pieces".into());
    }
    Ok(pieces)
}

fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<｜") && t.ends_with("｜>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

pub fn sentencepiece_vocab(
    dir: &Path,
    cfg: &Config,
    tok: Option<&Json>,
    tc: Option<&Json>,
    md: &mut Vec<(String, Value)>,
) -> Result<()> {
    let path = dir.join("tokenizer.model");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let pieces = parse_model(&bytes)
        .map_err(|m| Error::bad_input(&path, format!("not a SentencePiece model: {m}")))?;
    let vocab_size = cfg.vocab_size()?.unwrap_or(pieces.len() as u64);
    if vocab_size > 1 << 24 {
        return Err(Error::bad_input(
            &cfg.path,
            format!("vocab_size {vocab_size} is out of range"),
        ));
    }
    let n = vocab_size as usize;
    let mut tokens: Vec<Vec<u8>> = (0..n).map(|i| format!("[PAD{i}]").into_bytes()).collect();
    let mut scores = vec![-10000.0f32; n];
    let mut types = vec![UNUSED; n];
    for (i, pc) in pieces.into_iter().enumerate().take(n) {
        types[i] = match pc.kind {
            2 => UNKNOWN,
            3 => CONTROL,
            5 => UNUSED,
            6 => BYTE,
            _ => NORMAL,
        };
        tokens[i] = pc.text;
        scores[i] = pc.score;
    }
    let added_path = dir.join("added_tokens.json");
    if let Ok(t) = std::fs::read_to_string(&added_path) {
        let v: Json = serde_json::from_str(&t)
            .map_err(|e| Error::bad_input(&added_path, format!("invalid JSON: {e}")))?;
        for (k, id) in v.as_object().into_iter().flatten() {
            if let Some(id) = id.as_u64().filter(|&i| i < vocab_size) {
                tokens[id as usize] = k.clone().into_bytes();
                scores[id as usize] = -1000.0;
                types[id as usize] = USER_DEFINED;
            }
        }
    }
    if let Some(dec) = tc
        .and_then(|t| t.get("added_tokens_decoder"))
        .and_then(|v| v.as_object())
    {
        for (id, data) in dec {
            let Ok(id) = id.parse::<u64>() else { continue };
            if id >= vocab_size {
                continue;
            }
            let Some(content) = data.get("content").and_then(|v| v.as_str()) else {
                continue;
            };
            let special = data
                .get("special")
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            let (t, ty) = if special || looks_special(content) {
                (content.to_string(), CONTROL)
            } else {
                (content.replace('\u{2581}', " "), USER_DEFINED)
            };
            tokens[id as usize] = t.into_bytes();
            types[id as usize] = ty;
            scores[id as usize] = -1000.0;
        }
    }
    md.push(("tokenizer.ggml.model".into(), Value::string("llama")));
    md.push(("tokenizer.ggml.pre".into(), Value::string("default")));
    md.push((
        "tokenizer.ggml.tokens".into(),
        Value::Array(
            ValueType::String,
            tokens
                .into_iter()
                .map(|t| Value::String(crate::gguf::GString(t)))
                .collect(),
        ),
    ));
    md.push((
        "tokenizer.ggml.scores".into(),
        Value::Array(ValueType::F32, scores.into_iter().map(Value::F32).collect()),
    ));
    md.push((
        "tokenizer.ggml.token_type".into(),
        Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
    ));
    special_vocab(dir, tok, tc, false, Some(vocab_size), md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(text: &str, score: f32, kind: u64) -> Vec<u8> {
        let mut m = vec![0x0a, text.len() as u8];
        m.extend_from_slice(text.as_bytes());
        m.push(0x15);
        m.extend_from_slice(&score.to_le_bytes());
        m.extend_from_slice(&[0x18, kind as u8]);
        let mut out = vec![0x0a, m.len() as u8];
        out.extend(m);
        out
    }

    #[test]
    fn parse_pieces() {
        let mut b = piece("<unk>", 0.0, 2);
        b.extend(piece("\u{2581}a", -1.5, 1));
        b.extend(piece("<0x0A>", 0.0, 6));
        // an unrelated field (trainer spec) is skipped
        b.extend([0x12, 0x02, 0x08, 0x01]);
        let p = parse_model(&b).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[1].text, "\u{2581}a".as_bytes());
        assert_eq!(p[1].score, -1.5);
        assert_eq!(p[2].kind, 6);
        assert!(parse_model(&b[..b.len() - 3]).is_err());
        assert!(parse_model(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }
}
