//! Does a calibration text share any of the evaluation windows' text? For a calibration taken
//! from the evaluation's own corpus (the in-domain preset runs of docs/bench/presets.md).
//!
//!   cargo run --release --example text_overlap -- MODEL.gguf EVAL.txt CAL.txt [--chunks 10] [--ctx 512]
//!
//! Tokenizes EVAL.txt with the model's tokenizer as `tq eval -f` does (BOS first where the
//! vocabulary adds one), takes the first `chunks × ctx` tokens (the windows `tq eval --chunks`
//! scores) and decodes them back to text. Prints the bytes of EVAL.txt those windows cover, whether
//! any window's text occurs in CAL.txt, and the longest byte string common to the covered text and
//! CAL.txt (binary search on its length over hashed substrings, then checked by a direct search).

use std::collections::HashSet;
use tq::gguf::GgufFile;
use tq::tokenizer::Tokenizer;

/// Some substring of `a` of `k` bytes that also occurs in `b`, if any.
fn common_of_len<'a>(a: &'a [u8], b: &[u8], k: usize) -> Option<&'a [u8]> {
    if k == 0 {
        return Some(&a[..0]);
    }
    if k > a.len() || k > b.len() {
        return None;
    }
    let set: HashSet<&[u8]> = b.windows(k).collect();
    a.windows(k).find(|w| set.contains(w))
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: text_overlap MODEL.gguf EVAL.txt CAL.txt [--chunks 10] [--ctx 512]");
        std::process::exit(2);
    }
    let get = |k: &str, d: usize| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .map_or(d, |v| v.parse().expect("a number"))
    };
    let (chunks, ctx) = (get("--chunks", 10), get("--ctx", 512));
    let f = GgufFile::open(std::path::Path::new(&args[0])).expect("model");
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer");
    let eval = std::fs::read_to_string(&args[1]).expect("evaluation text (UTF-8)");
    let cal = std::fs::read(&args[2]).expect("calibration text");

    let ids = tok.encode(&eval, true);
    let n = (chunks * ctx).min(ids.len());
    // The text of some tokens, without the BOS that `encode` put in front.
    let text_of = |ids: &[u32]| {
        let body: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&t| Some(t) != tok.bos() || !tok.add_bos())
            .collect();
        tok.decode(&body)
    };
    let covered = text_of(&ids[..n]);
    let covered = covered.as_bytes();
    // The decoded windows must be the file's own prefix, else the byte count below means nothing.
    assert!(
        eval.as_bytes().starts_with(covered),
        "the decoded windows are not a prefix of the evaluation text"
    );
    println!(
        "evaluation: {} tokens ({} windows of {}) cover bytes 0..{} of {} bytes",
        n,
        n / ctx,
        ctx,
        covered.len(),
        eval.len()
    );

    let mut in_cal = 0;
    for w in 0..n / ctx {
        let t = text_of(&ids[w * ctx..(w + 1) * ctx]);
        if find(&cal, t.as_bytes()) {
            in_cal += 1;
            println!(
                "window {w} ({} bytes) occurs in the calibration text",
                t.len()
            );
        }
    }
    println!("windows whose text occurs in the calibration text: {in_cal}");

    // Longest common substring: a common string of k bytes has common substrings of every
    // shorter length, so the predicate is monotone in k.
    let (mut lo, mut hi) = (0usize, covered.len().min(cal.len()));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if common_of_len(covered, &cal, mid).is_some() {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let s = common_of_len(covered, &cal, lo).expect("found at this length");
    assert!(find(&cal, s), "hash search disagrees with a direct search");
    println!(
        "longest string common to the evaluated text and the calibration text: {lo} bytes: {:?}",
        String::from_utf8_lossy(s)
    );
}
