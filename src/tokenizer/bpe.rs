//! GPT-2 style byte-level BPE, merging exactly as llama.cpp's `llm_tokenizer_bpe_session`.
//!
//! A pre-tokenized word is byte-encoded (each byte one printable char), split into one symbol
//! per byte, and the adjacent pair with the lowest merge rank (ties: leftmost) is merged until
//! no pair has a rank. Merges need not produce a vocabulary token; a final symbol that is not a
//! token falls back to its bytes. We work on raw bytes instead of the printable chars: vocab
//! tokens and merge halves are decoded once to byte strings and interned as "pieces", so a merge
//! is a hash lookup on two piece ids.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::unicode::byte_map;
use super::FastMap;

const NONE: u32 = u32::MAX;

pub struct Bpe {
    /// Byte string → piece id (vocab tokens, merge halves and merge results).
    piece_of: FastMap<Box<[u8]>, u32>,
    /// Piece id → token id (NONE if the piece is not a token).
    piece_token: Vec<u32>,
    /// (left piece, right piece) → (rank, merged piece).
    merges: FastMap<u64, (u32, u32)>,
    byte_piece: [u32; 256],
    /// LLaMA-3 style: a word that is itself a token is not merged.
    ignore_merges: bool,
}

#[inline]
fn pair_key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

impl Bpe {
    /// `tokens`: token texts (printable byte-encoded form); `merges`: "left right" strings in
    /// rank order.
    pub fn new<'a>(
        tokens: &[Vec<u8>],
        merges: impl Iterator<Item = &'a [u8]>,
        ignore_merges: bool,
    ) -> Bpe {
        let mut b = Bpe {
            piece_of: FastMap::default(),
            piece_token: Vec::new(),
            merges: FastMap::default(),
            byte_piece: [0; 256],
            ignore_merges,
        };
        for byte in 0..=255u8 {
            b.byte_piece[byte as usize] = b.intern(&[byte]);
        }
        let map = byte_map();
        let decode = |s: &[u8]| std::str::from_utf8(s).ok().and_then(|s| map.decode(s));
        for (id, text) in tokens.iter().enumerate() {
            // Later duplicates win, as in llama.cpp's token_to_id map.
            if let Some(bytes) = decode(text) {
                let p = b.intern(&bytes);
                b.piece_token[p as usize] = id as u32;
            }
        }
        for (rank, m) in merges.enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let Some(sp) = m.iter().skip(1).position(|&c| c == b' ').map(|i| i + 1) else {
                continue;
            };
            let (Some(l), Some(r)) = (decode(&m[..sp]), decode(&m[sp + 1..])) else {
                continue; // halves that byte-encoded text can never contain
            };
            let (pl, pr) = (b.intern(&l), b.intern(&r));
            let joined = [l, r].concat();
            let pm = b.intern(&joined);
            b.merges
                .entry(pair_key(pl, pr))
                .or_insert((rank as u32, pm));
        }
        b
    }

    fn intern(&mut self, bytes: &[u8]) -> u32 {
        if let Some(&p) = self.piece_of.get(bytes) {
            return p;
        }
        let p = self.piece_token.len() as u32;
        self.piece_of.insert(bytes.into(), p);
        self.piece_token.push(NONE);
        p
    }

    /// Token for a raw byte string, if it is a vocab token.
    pub fn token_of(&self, bytes: &[u8]) -> Option<u32> {
        let p = *self.piece_of.get(bytes)?;
        let t = self.piece_token[p as usize];
        (t != NONE).then_some(t)
    }

    /// Encode one pre-tokenized word (raw bytes). `raw_token` looks a raw token text up (for
    /// the byte fallback, which llama.cpp does on the byte-encoded text's bytes).
    pub fn encode_word(
        &self,
        word: &[u8],
        raw_token: &dyn Fn(&[u8]) -> Option<u32>,
        out: &mut Vec<u32>,
    ) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges {
            if let Some(t) = self.token_of(word) {
                out.push(t);
                return;
            }
        }
        let n = word.len();
        let mut piece: Vec<u32> = word.iter().map(|&c| self.byte_piece[c as usize]).collect();
        let mut len = vec![1u32; n];
        let mut prev: Vec<i32> = (0..n as i32).map(|i| i - 1).collect();
        let mut next: Vec<i32> = (1..=n as i32).collect();
        next[n - 1] = -1;
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, piece: &[u32], l: i32, r: i32| {
            if l < 0 || r < 0 {
                return;
            }
            let (pl, pr) = (piece[l as usize], piece[r as usize]);
            if let Some(&(rank, _)) = self.merges.get(&pair_key(pl, pr)) {
                heap.push(Reverse((rank, l as u32, r as u32, pl, pr)));
            }
        };
        for i in 1..n as i32 {
            push(&mut heap, &piece, i - 1, i);
        }
        while let Some(Reverse((_, l, r, pl, pr))) = heap.pop() {
            let (l, r) = (l as usize, r as usize);
            if len[l] == 0 || len[r] == 0 || piece[l] != pl || piece[r] != pr {
                continue; // outdated
            }
            piece[l] = self.merges[&pair_key(pl, pr)].1;
            len[l] += len[r];
            len[r] = 0;
            next[l] = next[r];
            if next[r] >= 0 {
                prev[next[r] as usize] = l as i32;
            }
            push(&mut heap, &piece, prev[l], l as i32);
            push(&mut heap, &piece, l as i32, next[l]);
        }
        let mut i = 0i32;
        let mut start = 0usize;
        while i >= 0 {
            let s = i as usize;
            let t = self.piece_token[piece[s] as usize];
            let l = len[s] as usize;
            if t != NONE {
                out.push(t);
            } else {
                // Not a token: llama.cpp looks up each byte of the byte-encoded text.
                let enc = byte_map().encode(&word[start..start + l]);
                for b in enc.as_bytes() {
                    if let Some(t) = raw_token(std::slice::from_ref(b)) {
                        out.push(t);
                    }
                }
            }
            start += l;
            i = next[s];
        }
    }
}
