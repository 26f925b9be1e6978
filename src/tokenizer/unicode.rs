//! Code point classes as llama.cpp's pre-tokenizers see them, and the GPT-2 byte ↔ char map.
//!
//! llama.cpp classifies each code point by its Unicode general category (one class per major
//! category: N, L, Z, M, P, S, C; unassigned code points are "undefined") plus the White_Space
//! property. Its table was generated from Unicode 15.1, so code points first assigned later are
//! "undefined" there; we reproduce that by intersecting with `Age <= 15.1`. The category data
//! itself comes from `regex-syntax` (already in the dependency tree through `regex`).

use std::sync::OnceLock;

/// Category codes (low nibble of a flags byte). 0 means "outside the text" (never a code point).
pub const UNDEF: u8 = 1;
pub const NUMBER: u8 = 2;
pub const LETTER: u8 = 3;
pub const SEPARATOR: u8 = 4;
pub const MARK: u8 = 5;
pub const PUNCT: u8 = 6;
pub const SYMBOL: u8 = 7;
pub const CONTROL: u8 = 8;
/// Bit set on White_Space code points.
pub const WS: u8 = 0x80;

/// The Unicode White_Space property (PropList.txt): the code points llama.cpp treats as `\s`.
const WHITE_SPACE: &[(u32, u32)] = &[
    (0x09, 0x0D),
    (0x20, 0x20),
    (0x85, 0x85),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
];

const N_CPTS: usize = 0x110000;

fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .expect("valid unicode class");
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        _ => panic!("{pattern} is not a unicode class"),
    }
}

fn table() -> &'static [u8] {
    static TABLE: OnceLock<Box<[u8]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = vec![UNDEF; N_CPTS].into_boxed_slice();
        let cats: [(&str, u8); 9] = [
            (r"\p{Cc}", CONTROL),
            (r"\p{Cf}", CONTROL),
            (r"\p{Co}", CONTROL),
            (r"\p{L}", LETTER),
            (r"\p{M}", MARK),
            (r"\p{N}", NUMBER),
            (r"\p{P}", PUNCT),
            (r"\p{S}", SYMBOL),
            (r"\p{Z}", SEPARATOR),
        ];
        for (pat, cat) in cats {
            for (a, b) in class_ranges(pat) {
                t[a as usize..=b as usize].fill(cat);
            }
        }
        // Surrogates are category Cs (control) in the tables even though `char` cannot hold them.
        t[0xD800..=0xDFFF].fill(CONTROL);
        // Code points assigned after Unicode 15.1 are undefined for llama.cpp.
        let mut prev = 0usize;
        for (a, b) in class_ranges(r"\p{age:15.1}") {
            t[prev..a as usize].fill(UNDEF);
            prev = b as usize + 1;
        }
        t[prev..].fill(UNDEF);
        t[0xD800..=0xDFFF].fill(CONTROL);
        for &(a, b) in WHITE_SPACE {
            for c in a..=b {
                t[c as usize] |= WS;
            }
        }
        t
    })
}

/// Flags of a code point: category (low nibble) | `WS`. Never 0.
#[inline]
pub fn flags(c: u32) -> u8 {
    let t = table();
    if (c as usize) < t.len() {
        t[c as usize]
    } else {
        UNDEF
    }
}

#[inline]
pub fn category(f: u8) -> u8 {
    f & 0x0F
}

#[inline]
pub fn is_ws(f: u8) -> bool {
    f & WS != 0
}

#[inline]
pub fn is_letter(f: u8) -> bool {
    f & 0x0F == LETTER
}

#[inline]
pub fn is_number(f: u8) -> bool {
    f & 0x0F == NUMBER
}

#[inline]
pub fn is_mark(f: u8) -> bool {
    f & 0x0F == MARK
}

/// GPT-2's reversible byte → printable char map: printable Latin-1 bytes map to themselves, the
/// other 68 bytes to U+0100.. in byte order.
pub struct ByteMap {
    pub to_char: [char; 256],
    /// Indexed by code point (all mapped chars are < U+0200); -1 where not a mapped char.
    from_char: [i16; 0x200],
}

impl ByteMap {
    fn new() -> ByteMap {
        let printable =
            |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut to_char = ['\0'; 256];
        let mut from_char = [-1i16; 0x200];
        let mut next = 0x100u32;
        for b in 0..256u32 {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            to_char[b as usize] = char::from_u32(c).expect("valid");
            from_char[c as usize] = b as i16;
        }
        ByteMap { to_char, from_char }
    }

    /// The byte a mapped char stands for.
    #[inline]
    pub fn byte(&self, c: char) -> Option<u8> {
        let i = c as usize;
        if i < self.from_char.len() && self.from_char[i] >= 0 {
            Some(self.from_char[i] as u8)
        } else {
            None
        }
    }

    /// Bytes for a string made only of mapped chars (None if any char is not mapped).
    pub fn decode(&self, s: &str) -> Option<Vec<u8>> {
        s.chars().map(|c| self.byte(c)).collect()
    }

    /// The mapped (printable) form of raw bytes.
    pub fn encode(&self, bytes: &[u8]) -> String {
        bytes.iter().map(|&b| self.to_char[b as usize]).collect()
    }
}

pub fn byte_map() -> &'static ByteMap {
    static MAP: OnceLock<ByteMap> = OnceLock::new();
    MAP.get_or_init(ByteMap::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories() {
        assert_eq!(category(flags('a' as u32)), LETTER);
        assert_eq!(category(flags('7' as u32)), NUMBER);
        assert_eq!(category(flags('½' as u32)), NUMBER);
        assert_eq!(category(flags('$' as u32)), SYMBOL);
        assert_eq!(category(flags('_' as u32)), PUNCT);
        assert_eq!(category(flags(0x301)), MARK);
        assert!(is_ws(flags(' ' as u32)) && category(flags(' ' as u32)) == SEPARATOR);
        assert!(is_ws(flags(0x3000)) && is_ws(flags(0x85)) && !is_ws(flags(0x200B)));
        assert_eq!(category(flags(0xE000)), CONTROL);
        // Assigned in 15.1 (IDC ⿼) vs 16.0 (U+1C89): llama.cpp's table is 15.1.
        assert_eq!(category(flags(0x2FFC)), SYMBOL);
        assert_eq!(category(flags(0x1C89)), UNDEF);
        assert_eq!(category(flags(0x0378)), UNDEF);
        assert_eq!(flags(0x110000), UNDEF);
    }

    #[test]
    fn byte_map_is_gpt2() {
        let m = byte_map();
        assert_eq!(m.to_char[b' ' as usize], 'Ġ');
        assert_eq!(m.to_char[b'\n' as usize], 'Ċ');
        assert_eq!(m.to_char[b'a' as usize], 'a');
        assert_eq!(m.to_char[0xAD], 'Ń');
        for b in 0..=255u8 {
            assert_eq!(m.byte(m.to_char[b as usize]), Some(b));
        }
        assert_eq!(m.decode("Ġhello"), Some(b" hello".to_vec()));
        assert_eq!(m.decode("a b"), None);
    }
}
