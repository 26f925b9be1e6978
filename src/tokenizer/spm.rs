//! SentencePiece-style BPE ("llama" tokenizer model), as llama.cpp's `llm_tokenizer_spm_session`.
//!
//! The (already ▁-escaped) text is split into UTF-8 characters; adjacent pairs whose
//! concatenation is a vocabulary token are merged, highest token score first (ties: leftmost),
//! until none is left. Symbols that are not tokens become byte tokens (`<0xXX>`).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::FastMap;

/// Key of two adjacent UTF-8 characters (each at most 4 bytes).
#[inline]
fn pair_key(a: &[u8], b: &[u8]) -> u64 {
    let mut k = [0u8; 8];
    k[..a.len()].copy_from_slice(a);
    k[4..4 + b.len()].copy_from_slice(b);
    u64::from_le_bytes(k)
}

/// Length of the UTF-8 character starting with `lead` (llama.cpp's unicode_len_utf8).
#[inline]
fn char_len(lead: u8) -> usize {
    match lead >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

/// The SentencePiece model: token scores, and every pair of adjacent characters that occurs
/// inside some token. Merged symbols are always tokens, so text can be cut wherever two
/// neighbouring characters occur in no token: no merge can cross such a cut, merges on either
/// side commute, and encoding the pieces separately (and caching them) gives the same result
/// as one pass over the whole text.
pub struct Spm {
    pub scores: Vec<f32>,
    pairs: FastMap<u64, ()>,
}

impl Spm {
    pub fn new(tokens: &[Vec<u8>], scores: Vec<f32>) -> Spm {
        let mut pairs = FastMap::default();
        for t in tokens {
            let mut prev: Option<&[u8]> = None;
            let mut off = 0;
            while off < t.len() {
                let l = char_len(t[off]).min(t.len() - off);
                let c = &t[off..off + l];
                if let Some(p) = prev {
                    pairs.insert(pair_key(p, c), ());
                }
                prev = Some(c);
                off += l;
            }
        }
        Spm { scores, pairs }
    }

    /// Tokenize `text` (spaces already replaced by ▁) into `out`, piece by piece.
    pub fn encode<'t>(
        &self,
        text: &'t [u8],
        token_to_id: &FastMap<Box<[u8]>, u32>,
        byte_token: &dyn Fn(u8) -> Option<u32>,
        cache: &mut FastMap<&'t [u8], Vec<u32>>,
        out: &mut Vec<u32>,
    ) {
        let mut start = 0;
        let mut prev: Option<(usize, usize)> = None;
        let mut off = 0;
        let mut flush = |a: usize, b: usize, out: &mut Vec<u32>| {
            let piece = &text[a..b];
            if let Some(ids) = cache.get(piece) {
                out.extend_from_slice(ids);
                return;
            }
            let mut ids = Vec::new();
            encode(piece, token_to_id, &self.scores, byte_token, &mut ids);
            out.extend_from_slice(&ids);
            cache.insert(piece, ids);
        };
        while off < text.len() {
            let l = char_len(text[off]).min(text.len() - off);
            if let Some((pa, pl)) = prev {
                if !self
                    .pairs
                    .contains_key(&pair_key(&text[pa..pa + pl], &text[off..off + l]))
                {
                    flush(start, off, out);
                    start = off;
                }
            }
            prev = Some((off, l));
            off += l;
        }
        if start < text.len() {
            flush(start, text.len(), out);
        }
    }
}

struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then lower left index.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .partial_cmp(&o.score)
            .unwrap_or(Ordering::Equal)
            .then(o.left.cmp(&self.left))
    }
}

/// Tokenize `text` (spaces already replaced by ▁) into `out`.
/// `token_to_id`: raw token text → id; `scores`: per token; `byte_token`: the token for a byte.
pub fn encode(
    text: &[u8],
    token_to_id: &FastMap<Box<[u8]>, u32>,
    scores: &[f32],
    byte_token: &dyn Fn(u8) -> Option<u32>,
    out: &mut Vec<u32>,
) {
    if text.is_empty() {
        return;
    }
    // Symbols: one per UTF-8 character (length from the lead byte, as llama.cpp).
    let mut start = Vec::new();
    let mut n = Vec::new();
    let mut off = 0;
    while off < text.len() {
        let l = char_len(text[off]).min(text.len() - off);
        start.push(off as u32);
        n.push(l as u32);
        off += l;
    }
    let count = start.len();
    let mut prev: Vec<i32> = (0..count as i32).map(|i| i - 1).collect();
    let mut next: Vec<i32> = (1..=count as i32).collect();
    next[count - 1] = -1;
    let mut heap = BinaryHeap::new();
    let try_add = |heap: &mut BinaryHeap<Bigram>, start: &[u32], n: &[u32], l: i32, r: i32| {
        if l < 0 || r < 0 {
            return;
        }
        let (l, r) = (l as usize, r as usize);
        let s = start[l] as usize;
        let size = (n[l] + n[r]) as usize;
        if let Some(&id) = token_to_id.get(&text[s..s + size]) {
            if let Some(&score) = scores.get(id as usize) {
                heap.push(Bigram {
                    score,
                    left: l as u32,
                    right: r as u32,
                    size: size as u32,
                });
            }
        }
    };
    for i in 1..count as i32 {
        try_add(&mut heap, &start, &n, i - 1, i);
    }
    while let Some(bg) = heap.pop() {
        let (l, r) = (bg.left as usize, bg.right as usize);
        if n[l] == 0 || n[r] == 0 || n[l] + n[r] != bg.size {
            continue;
        }
        n[l] += n[r];
        n[r] = 0;
        next[l] = next[r];
        if next[r] >= 0 {
            prev[next[r] as usize] = l as i32;
        }
        try_add(&mut heap, &start, &n, prev[l], l as i32);
        try_add(&mut heap, &start, &n, l as i32, next[l]);
    }
    let mut i = 0i32;
    while i >= 0 {
        let s = i as usize;
        let piece = &text[start[s] as usize..(start[s] + n[s]) as usize];
        match token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => out.extend(piece.iter().filter_map(|&b| byte_token(b))),
        }
        i = next[s];
    }
}
