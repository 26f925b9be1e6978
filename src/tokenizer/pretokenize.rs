//! Pre-tokenization: splitting text into words before BPE, as llama.cpp does it.
//!
//! llama.cpp applies a list of regexes in turn; each one splits every current segment into its
//! matches and the gaps between them (HF's "Isolated" split behaviour), so later regexes only
//! see pieces produced by earlier ones. The common GPT-2 and LLaMA-3/Qwen2 regexes are
//! hand-coded there (with a few quirks that the golden tests pin) and we hand-code them the same
//! way; the remaining simple regexes run on a small backtracking matcher that reproduces how
//! llama.cpp feeds them to `std::regex`: with Unicode categories "collapsed" to one stand-in
//! byte per category when the regex uses `\p{..}`, and non-ASCII white space replaced by U+000B.

use super::unicode::{self, category, flags, is_letter, is_mark, is_number, is_ws};
use crate::error::{Error, Result};

/// One split step.
#[derive(Debug, Clone)]
pub enum Step {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (hand-coded).
    Gpt2,
    /// LLaMA-3 style: `(?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,k}| ?[^\s\p{L}\p{N}]+[\r\n]*|
    /// \s*[\r\n]+|\s+(?!\S)|\s+` with k = `max_digits` (3: LLaMA-3, 1: Qwen2); `marks` makes
    /// letter runs also take `\p{M}` (Qwen3.5).
    Llama3 { max_digits: usize, marks: bool },
    /// `[^\n]+|[\n]+` (hand-coded in llama.cpp): runs of newlines and of everything else.
    Newlines,
    /// Any other regex, on the std::regex-compatible matcher.
    Pattern(Pattern),
}

impl Step {
    pub fn pattern(re: &str) -> Result<Step> {
        Ok(Step::Pattern(Pattern::parse(re)?))
    }
}

/// Split `text` by `steps`; returns byte ranges of the words, in order.
pub fn split(text: &str, steps: &[Step]) -> Vec<(usize, usize)> {
    let mut cpts = Vec::with_capacity(text.len());
    let mut offsets = Vec::with_capacity(text.len() + 1);
    for (i, c) in text.char_indices() {
        cpts.push(c as u32);
        offsets.push(i);
    }
    offsets.push(text.len());
    let fl: Vec<u8> = cpts.iter().map(|&c| flags(c)).collect();
    let t = Text {
        cpts: &cpts,
        fl: &fl,
    };
    let mut words = vec![cpts.len()];
    if cpts.is_empty() {
        words.clear();
    }
    for step in steps {
        let mut out = Vec::with_capacity(words.len() * 2);
        let mut start = 0;
        for &len in &words {
            let end = start + len;
            match step {
                Step::Gpt2 => t.gpt2(start, end, &mut out),
                Step::Llama3 { max_digits, marks } => {
                    t.llama3(start, end, *max_digits, *marks, &mut out)
                }
                Step::Newlines => t.newlines(start, end, &mut out),
                Step::Pattern(p) => t.pattern(p, start, end, &mut out),
            }
            start = end;
        }
        words = out;
    }
    let mut ranges = Vec::with_capacity(words.len());
    let mut start = 0;
    for len in words {
        ranges.push((offsets[start], offsets[start + len]));
        start += len;
    }
    ranges
}

struct Text<'a> {
    cpts: &'a [u32],
    fl: &'a [u8],
}

const OUT: u32 = u32::MAX;

/// Emits words while scanning one segment.
struct Emit<'o> {
    prev: usize,
    out: &'o mut Vec<usize>,
}

impl Emit<'_> {
    /// End the current word at `end`; returns its length (0 emits nothing).
    fn to(&mut self, end: usize) -> usize {
        let len = end - self.prev;
        if len > 0 {
            self.out.push(len);
        }
        self.prev = end;
        len
    }
}

impl Text<'_> {
    /// Code point at `i` within [a, b), else OUT.
    #[inline]
    fn cp(&self, i: usize, b: usize) -> u32 {
        if i < b {
            self.cpts[i]
        } else {
            OUT
        }
    }

    /// Flags at `i` within [a, b), else 0 (no class).
    #[inline]
    fn f(&self, i: usize, b: usize) -> u8 {
        if i < b {
            self.fl[i]
        } else {
            0
        }
    }

    /// Length of a contraction (`'s 't 'm 'd 're 've 'll`) at `pos`, or 0.
    fn contraction(&self, pos: usize, b: usize, ignore_case: bool) -> usize {
        if self.cpts[pos] != '\'' as u32 || pos + 1 >= b {
            return 0;
        }
        let low = |c: u32| {
            if ignore_case && (b'A' as u32..=b'Z' as u32).contains(&c) {
                c + 32
            } else {
                c
            }
        };
        let c1 = low(self.cp(pos + 1, b));
        if [b's', b't', b'm', b'd'].iter().any(|&x| c1 == x as u32) {
            return 2;
        }
        if pos + 2 < b {
            let c2 = low(self.cp(pos + 2, b));
            let pair = |x: u8, y: u8| c1 == x as u32 && c2 == y as u32;
            if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
                return 3;
            }
        }
        0
    }

    fn gpt2(&self, a: usize, b: usize, out: &mut Vec<usize>) {
        let mut e = Emit { prev: a, out };
        let mut pos = a;
        while pos < b {
            let cp = self.cpts[pos];
            let n = self.contraction(pos, b, false);
            if n > 0 {
                pos += e.to(pos + n);
                continue;
            }
            // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the class is decided by the char
            // after an optional leading space.
            let sp = (cp == ' ' as u32) as usize;
            let f2 = self.f(pos + sp, b);
            let other = |f: u8| f != 0 && !is_ws(f) && !is_letter(f) && !is_number(f);
            let run: Option<fn(u8) -> bool> = if is_letter(f2) {
                Some(is_letter)
            } else if is_number(f2) {
                Some(is_number)
            } else if other(f2) {
                Some(other)
            } else {
                None
            };
            if let Some(class) = run {
                pos += sp;
                while class(self.f(pos, b)) {
                    pos += 1;
                }
                e.to(pos);
                continue;
            }
            let mut n_ws = 0;
            while is_ws(self.f(pos + n_ws, b)) {
                n_ws += 1;
            }
            if n_ws > 1 && pos + n_ws < b {
                // `\s+(?!\S)`: leave the last space to prefix the next word.
                pos += n_ws - 1;
                e.to(pos);
            } else if n_ws > 0 {
                pos += n_ws;
                e.to(pos);
            } else {
                pos += 1;
                e.to(pos);
            }
        }
        e.to(b);
    }

    fn llama3(&self, a: usize, b: usize, max_digits: usize, marks: bool, out: &mut Vec<usize>) {
        let letter = |f: u8| is_letter(f) || (marks && is_mark(f));
        let mut e = Emit { prev: a, out };
        let mut pos = a;
        while pos < b {
            let cp = self.cpts[pos];
            let f = self.fl[pos];
            let n = self.contraction(pos, b, true);
            if n > 0 {
                pos += e.to(pos + n);
                continue;
            }
            // `[^\r\n\p{L}\p{N}]?\p{L}+`
            let crlf = |c: u32| c == '\r' as u32 || c == '\n' as u32;
            if !(crlf(cp) || is_number(f)) && (letter(f) || letter(self.f(pos + 1, b))) {
                pos += 1;
                while letter(self.f(pos, b)) {
                    pos += 1;
                }
                e.to(pos);
                continue;
            }
            // `\p{N}{1,k}`
            if is_number(f) {
                let mut ini = pos;
                while is_number(self.f(pos, b)) {
                    pos += 1;
                    if pos - ini >= max_digits {
                        e.to(pos);
                        ini = pos;
                    }
                }
                e.to(pos);
                continue;
            }
            // ` ?[^\s\p{L}\p{N}]+[\r\n]*` (llama.cpp tests the class of the char after the
            // optional space, so a lone trailing space also lands here).
            let sp = (cp == ' ' as u32) as usize;
            let other = |f: u8| !(is_ws(f) || letter(f) || is_number(f));
            if other(self.f(pos + sp, b)) {
                pos += sp;
                while other(self.f(pos, b)) && self.f(pos, b) != 0 {
                    pos += 1;
                }
                while crlf(self.cp(pos, b)) {
                    pos += 1;
                }
                e.to(pos);
                continue;
            }
            let mut n_ws = 0;
            let mut last_crlf_end = 0;
            while is_ws(self.f(pos + n_ws, b)) {
                if crlf(self.cpts[pos + n_ws]) {
                    last_crlf_end = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            if last_crlf_end > 0 {
                // `\s*[\r\n]+`
                pos = last_crlf_end;
                e.to(pos);
            } else if n_ws > 1 && pos + n_ws < b {
                // `\s+(?!\S)`
                pos += n_ws - 1;
                e.to(pos);
            } else if n_ws > 0 {
                pos += n_ws;
                e.to(pos);
            } else {
                pos += 1;
                e.to(pos);
            }
        }
        e.to(b);
    }

    fn newlines(&self, a: usize, b: usize, out: &mut Vec<usize>) {
        let mut pos = a;
        while pos < b {
            let nl = self.cpts[pos] == '\n' as u32;
            let start = pos;
            while pos < b && (self.cpts[pos] == '\n' as u32) == nl {
                pos += 1;
            }
            out.push(pos - start);
        }
    }

    fn pattern(&self, p: &Pattern, a: usize, b: usize, out: &mut Vec<usize>) {
        let vals: Vec<u32> = self.cpts[a..b]
            .iter()
            .zip(&self.fl[a..b])
            .map(|(&c, &f)| p.value(c, f))
            .collect();
        let cats: Vec<u8> = self.fl[a..b].iter().map(|&f| category(f)).collect();
        let m = Matcher {
            p,
            vals: &vals,
            cats: &cats,
        };
        let mut e = Emit { prev: a, out };
        let n = b - a;
        let mut s = 0;
        while s < n {
            match m.at(0, s) {
                Some(end) if end > s => {
                    e.to(a + s);
                    e.to(a + end);
                    s = end;
                }
                _ => s += 1,
            }
        }
        e.to(b);
    }
}

/// A regex made of a sequence of quantified character classes, optionally anchored at the end
/// (`$`): enough for every non-hand-coded regex of the supported pre-tokenizers.
#[derive(Debug, Clone)]
pub struct Pattern {
    atoms: Vec<Atom>,
    anchored_end: bool,
    /// The regex uses `\p{..}`: llama.cpp matches it on category-collapsed text.
    collapsed: bool,
}

#[derive(Debug, Clone)]
struct Atom {
    negated: bool,
    items: Vec<Item>,
    min: usize,
    max: usize,
}

#[derive(Debug, Clone, Copy)]
enum Item {
    Range(u32, u32),
    /// `\s` as std::regex sees it (ASCII white space incl. \v, which stands for non-ASCII ones).
    Space,
    /// `\p{X}`, by category code.
    Cat(u8),
}

impl Atom {
    #[inline]
    fn matches(&self, v: u32, cat: u8) -> bool {
        let hit = self.items.iter().any(|it| match *it {
            Item::Range(lo, hi) => lo <= v && v <= hi,
            Item::Space => (9..=13).contains(&v) || v == 32,
            Item::Cat(k) => cat == k,
        });
        hit != self.negated
    }
}

impl Pattern {
    /// Parse one of llama.cpp's pre-tokenizer regexes into our matcher (the subset they use).
    // One function on purpose: a single recursive-descent pass over the pattern; the cases are
    // the regex syntax the pre-tokenizers use, each a few lines.
    pub fn parse(re: &str) -> Result<Pattern> {
        let bad = |why: &str| Error::Unsupported(format!("pre-tokenizer regex {re:?}: {why}"));
        let chars: Vec<char> = re.chars().collect();
        let collapsed = re.contains("\\p{");
        if collapsed && !re.is_ascii() {
            return Err(bad("unicode categories with non-ASCII characters"));
        }
        let mut atoms = Vec::new();
        let mut anchored_end = false;
        let mut i = 0;
        // An escape at chars[i] == '\\': returns the item and the index after it.
        let escape = |i: usize| -> Result<(Item, usize)> {
            let c = *chars.get(i + 1).ok_or_else(|| bad("trailing backslash"))?;
            Ok(match c {
                's' => (Item::Space, i + 2),
                'r' => (Item::Range(13, 13), i + 2),
                'n' => (Item::Range(10, 10), i + 2),
                't' => (Item::Range(9, 9), i + 2),
                'p' => {
                    let close = chars[i..]
                        .iter()
                        .position(|&c| c == '}')
                        .ok_or_else(|| bad("unclosed \\p{"))?;
                    let name: String = chars[i + 3..i + close].iter().collect();
                    let cat = match name.as_str() {
                        "N" => unicode::NUMBER,
                        "L" => unicode::LETTER,
                        "P" => unicode::PUNCT,
                        "M" => unicode::MARK,
                        "S" => unicode::SYMBOL,
                        _ => return Err(bad("unsupported category")),
                    };
                    (Item::Cat(cat), i + close + 1)
                }
                c if c.is_ascii_alphanumeric() => return Err(bad("unsupported escape")),
                c => (Item::Range(c as u32, c as u32), i + 2),
            })
        };
        while i < chars.len() {
            let c = chars[i];
            let (negated, items, next) = match c {
                '[' => {
                    let mut j = i + 1;
                    let negated = chars.get(j) == Some(&'^');
                    if negated {
                        j += 1;
                    }
                    let mut items = Vec::new();
                    loop {
                        let c = *chars.get(j).ok_or_else(|| bad("unclosed ["))?;
                        if c == ']' {
                            j += 1;
                            break;
                        }
                        let (item, after) = if c == '\\' {
                            escape(j)?
                        } else {
                            (Item::Range(c as u32, c as u32), j + 1)
                        };
                        // A range `x-y` (a '-' before ']' is a literal).
                        if let (Item::Range(lo, _), Some('-')) = (item, chars.get(after)) {
                            if let Some(&hi_c) = chars.get(after + 1) {
                                if hi_c != ']' {
                                    let (hi, after2) = if hi_c == '\\' {
                                        match escape(after + 1)? {
                                            (Item::Range(h, _), a2) => (h, a2),
                                            _ => return Err(bad("class in a range")),
                                        }
                                    } else {
                                        (hi_c as u32, after + 2)
                                    };
                                    items.push(Item::Range(lo, hi));
                                    j = after2;
                                    continue;
                                }
                            }
                        }
                        items.push(item);
                        j = after;
                    }
                    (negated, items, j)
                }
                '\\' => {
                    let (item, after) = escape(i)?;
                    (false, vec![item], after)
                }
                '$' if i + 1 == chars.len() => {
                    anchored_end = true;
                    i += 1;
                    continue;
                }
                '(' | ')' | '|' | '.' | '*' | '+' | '?' | '{' | '^' | '$' => {
                    return Err(bad("unsupported syntax"))
                }
                c => (false, vec![Item::Range(c as u32, c as u32)], i + 1),
            };
            i = next;
            let (min, max, used) = match chars.get(i) {
                Some('?') => (0, 1, 1),
                Some('*') => (0, usize::MAX, 1),
                Some('+') => (1, usize::MAX, 1),
                Some('{') => {
                    let close = chars[i..]
                        .iter()
                        .position(|&c| c == '}')
                        .ok_or_else(|| bad("unclosed {"))?;
                    let body: String = chars[i + 1..i + close].iter().collect();
                    let num = |s: &str| s.trim().parse::<usize>().map_err(|_| bad("bad {m,n}"));
                    let (lo, hi) = match body.split_once(',') {
                        None => (num(&body)?, num(&body)?),
                        Some((lo, "")) => (num(lo)?, usize::MAX),
                        Some((lo, hi)) => (num(lo)?, num(hi)?),
                    };
                    (lo, hi, close + 1)
                }
                _ => (1, 1, 0),
            };
            i += used;
            if matches!(chars.get(i), Some('?' | '*' | '+' | '{')) {
                return Err(bad("lazy or nested quantifiers"));
            }
            atoms.push(Atom {
                negated,
                items,
                min,
                max,
            });
        }
        Ok(Pattern {
            atoms,
            anchored_end,
            collapsed,
        })
    }

    /// The value std::regex compares for a code point: in collapsed mode non-ASCII code points
    /// become 0x0B (white space) or 0xD0..0xD5 (one byte per category); otherwise only non-ASCII
    /// white space is replaced (by 0x0B).
    #[inline]
    fn value(&self, c: u32, f: u8) -> u32 {
        if c < 128 {
            return c;
        }
        if is_ws(f) {
            return 0x0B;
        }
        if !self.collapsed {
            return c;
        }
        match category(f) {
            unicode::NUMBER => 0xD1,
            unicode::LETTER => 0xD2,
            unicode::PUNCT => 0xD3,
            unicode::MARK => 0xD4,
            unicode::SYMBOL => 0xD5,
            _ => 0xD0,
        }
    }
}

struct Matcher<'a> {
    p: &'a Pattern,
    vals: &'a [u32],
    cats: &'a [u8],
}

impl Matcher<'_> {
    /// Backtracking match of atoms[k..] at `pos`: greedy, longest first (ECMAScript order).
    fn at(&self, k: usize, pos: usize) -> Option<usize> {
        let atoms = &self.p.atoms;
        if k == atoms.len() {
            return (!self.p.anchored_end || pos == self.vals.len()).then_some(pos);
        }
        let a = &atoms[k];
        let mut n = 0;
        while n < a.max
            && pos + n < self.vals.len()
            && a.matches(self.vals[pos + n], self.cats[pos + n])
        {
            n += 1;
        }
        if n < a.min {
            return None;
        }
        if k + 1 == atoms.len() && !self.p.anchored_end {
            return Some(pos + n);
        }
        (a.min..=n).rev().find_map(|m| self.at(k + 1, pos + m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words<'a>(text: &'a str, steps: &[Step]) -> Vec<&'a str> {
        split(text, steps)
            .into_iter()
            .map(|(a, b)| &text[a..b])
            .collect()
    }

    #[test]
    fn gpt2_split() {
        let s = [Step::Gpt2];
        assert_eq!(
            words("Hello world's  3.14\n\n  x", &s),
            ["Hello", " world", "'s", " ", " 3", ".", "14", "\n\n ", " x"]
        );
        assert_eq!(words("a  ", &s), ["a", "  "]);
        assert!(words("", &s).is_empty());
    }

    #[test]
    fn llama3_split() {
        let s = [Step::Llama3 {
            max_digits: 3,
            marks: false,
        }];
        assert_eq!(
            words("I'M 12345 ok!!\n\n (x)", &s),
            ["I", "'M", " ", "123", "45", " ok", "!!\n\n", " (", "x", ")"]
        );
    }

    #[test]
    fn patterns() {
        let p = |re: &str, t: &'static str| words(t, &[Step::pattern(re).unwrap()]);
        assert_eq!(p(r"\p{N}", "a12b"), ["a", "1", "2", "b"]);
        assert_eq!(p("[0-9][0-9][0-9]", "12345"), ["123", "45"]);
        assert_eq!(p(r"\s?\p{L}+", "  ab c"), [" ", " ab", " c"]);
        assert_eq!(p(r"\s+$", "a  b  "), ["a  b", "  "]);
        assert_eq!(
            p(r"[\p{P}\$\+<=>\^~\|]+", "a+=b,c"),
            ["a", "+=", "b", ",", "c"]
        );
        assert_eq!(p("[\r\n]", "a\r\nb"), ["a", "\r", "\n", "b"]);
        assert_eq!(
            p(" ?[^(\\s|.,!?…。，、।۔،)]+", "hi there, you"),
            ["hi", " there", ",", " you"]
        );
        // Collapsed mode: a non-ASCII letter is in \p{L}; non-ASCII white space is \s.
        assert_eq!(p(r"\s?\p{L}+", "é\u{3000}ü"), ["é", "\u{3000}ü"]);
        assert!(Pattern::parse("(?!x)").is_err());
    }
}
