//! SentencePiece-style BPE ("llama" tokenizer model), as llama.cpp's `llm_tokenizer_spm_session`.
//!
//! The (already ▁-escaped) text is split into UTF-8 characters; adjacent pairs whose
//! concatenation is a vocabulary token are merged, highest token score first (ties: leftmost),
//! until none is left. Symbols that are not tokens become byte tokens (`<0xXX>`).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::FastMap;

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
        let l = match text[off] >> 4 {
            0xC | 0xD => 2,
            0xE => 3,
            0xF => 4,
            _ => 1,
        }
        .min(text.len() - off);
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
