//! Tokenizer tests: llama.cpp's own golden tests (`tests/test-tokenizer-0`: the vocab-only
//! GGUFs `ggml-vocab-*.gguf` with `.inp`/`.out` pairs, fetched by scripts/fetch-vocabs.sh from the
//! llama-cpp-python==0.3.36 sdist) must match token for token; the real SmolLM2 vocabulary
//! against ids produced by llama.cpp itself; unsupported tokenizers fail with a clear error.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use std::path::PathBuf;

use tq::gguf::{GgufFile, Value, ValueType};
use tq::tokenizer::Tokenizer;

/// Vocabularies with golden pairs that we support, and how many pairs each file holds.
const GOLDEN: &[(&str, usize)] = &[
    ("llama-spm", 46),
    ("phi-3", 46),
    ("llama-bpe", 46),
    ("qwen2", 46),
    ("qwen35", 50),
    ("gpt-2", 46),
    ("starcoder", 46),
    ("refact", 46),
    ("command-r", 46),
    ("mpt", 46),
    ("falcon", 46),
    ("deepseek-coder", 46),
    ("deepseek-llm", 46),
];

fn vocab(name: &str) -> Option<PathBuf> {
    fixtures::data_file(
        fixtures::cache_dir().join(format!("vocabs/ggml-vocab-{name}.gguf")),
        "scripts/fetch-vocabs.sh",
    )
}

/// The pairs as test-tokenizer-0.cpp reads them: inputs separated by
/// "\n__ggml_vocab_test__\n", one line of space-separated ids per input.
fn golden_pairs(gguf: &std::path::Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(i) => {
                inputs.push(inp[pos..pos + i].to_string());
                pos += i + sep.len();
            }
            None => {
                inputs.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse::<u32>().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{}", gguf.display());
    inputs.into_iter().zip(outputs).collect()
}

#[test]
fn llama_cpp_golden_pairs() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for &(name, n_pairs) in GOLDEN {
        let Some(path) = vocab(name) else { return };
        let f = GgufFile::open(&path).unwrap();
        let tok = Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{name}: {e}"));
        let pairs = golden_pairs(&path);
        assert_eq!(pairs.len(), n_pairs, "{name}: pair count");
        let mut ok = 0;
        for (text, want) in &pairs {
            let got = tok.encode(text, false);
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!(
                    "{name}: {text:?}\n   want {want:?}\n   got  {got:?}"
                ));
            }
        }
        report.push(format!("{name}: {ok}/{}", pairs.len()));
    }
    eprintln!("golden pairs: {}", report.join(", "));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// BOS/EOS with add_special, per metadata and llama.cpp's model defaults.
#[test]
fn special_tokens_per_metadata() {
    // SPM: add_bos_token = true in the file.
    if let Some(p) = vocab("llama-spm") {
        let tok = Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap();
        assert_eq!(
            (tok.bos(), tok.eos(), tok.n_vocab()),
            (Some(1), Some(2), 32000)
        );
        assert!(tok.add_bos() && !tok.add_eos());
        let plain = tok.encode("Hello world", false);
        let special = tok.encode("Hello world", true);
        assert_eq!(special[0], 1);
        assert_eq!(&special[1..], &plain[..]);
        assert_eq!(tok.encode("", true), vec![1]);
        assert!(tok.encode("", false).is_empty());
        assert_eq!(tok.decode(&special), "Hello world");
    }
    // llama-bpe: no add_bos_token key, but llama.cpp's LLaMA-3 pre-tokenizer defaults it on.
    if let Some(p) = vocab("llama-bpe") {
        let tok = Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap();
        assert!(tok.add_bos());
        assert_eq!(tok.bos(), Some(128000));
        assert_eq!(tok.encode("Hello", true)[0], 128000);
        assert_eq!(
            tok.decode(&tok.encode(" Hello\n\t wörld 123", true)),
            " Hello\n\t wörld 123"
        );
    }
    // gpt-2: BPE defaults to no BOS.
    if let Some(p) = vocab("gpt-2") {
        let tok = Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap();
        assert!(!tok.add_bos() && !tok.add_eos());
        assert_eq!(
            tok.encode("Hello world", true),
            tok.encode("Hello world", false)
        );
    }
    // command-r: add_bos_token = true in the file.
    if let Some(p) = vocab("command-r") {
        let tok = Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap();
        assert!(tok.add_bos());
        assert_eq!(tok.encode("Hi", true)[0], 5);
    }
}

/// Control tokens in the text are plain text (parse_special = false); user-defined ones are
/// cut out.
#[test]
fn special_text_is_not_parsed() {
    if let Some(p) = vocab("qwen2") {
        let tok = Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap();
        let ids = tok.encode("a<|endoftext|>b", false);
        assert!(!ids.contains(&151643), "{ids:?}");
        assert_eq!(tok.decode(&ids), "a<|endoftext|>b");
    }
    if let Some(p) = vocab("deepseek-coder") {
        // 'õ' is a user-defined token (32000) in this vocabulary.
        let tok = Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap();
        let ids = tok.encode("xõy", false);
        assert!(ids.contains(&32000), "{ids:?}");
    }
}

/// The real SmolLM2-135M vocabulary (pre-tokenizer "smollm"): ids produced by llama.cpp
/// (libllama at the commit vendored in llama-cpp-python 0.3.36, `llama_tokenize(..., add_special
/// = true, parse_special = false)`).
#[test]
fn smollm2_matches_llama_cpp() {
    let Some(p) = fixtures::smollm2() else { return };
    let tok = Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap();
    assert_eq!((tok.model(), tok.pre()), ("gpt2", "smollm"));
    assert_eq!(tok.n_vocab(), 49152);
    assert!(!tok.add_bos(), "SmolLM2 sets add_bos_token = false");
    for (text, want) in SMOLLM2_CASES {
        assert_eq!(&tok.encode(text, true), want, "{text:?}");
        assert_eq!(&tok.decode(want), text);
    }
}

/// (text, ids) from llama.cpp for the SmolLM2 vocabulary.
const SMOLLM2_CASES: &[(&str, &[u32])] = &[
    ("Hello world", &[19556, 905]),
    (" Hello world!", &[38699, 905, 17]),
    (
        "The year 2024 had 366 days; 3.14159 is pi.",
        &[
            504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 43, 216, 35, 30, 33, 36, 33,
            37, 41, 314, 16916, 30,
        ],
    ),
    (
        "don't STOP, I'M here\n\n  indented\tcode(x) {\n    return 0;\n}",
        &[
            12420, 982, 5022, 7627, 28, 339, 23, 61, 1535, 8866, 641, 6574, 197, 4635, 24, 104, 25,
            1662, 472, 1003, 216, 32, 43, 198, 109,
        ],
    ),
    (
        "ünïcödé façade — naïve café 中文 🦙",
        &[
            47682, 25972, 83, 7466, 84, 2756, 40852, 1841, 15486, 46494, 37366, 216, 28589, 29184,
            15107, 116, 243,
        ],
    ),
    // Control tokens in the text are plain text (parse_special = false).
    (
        "<|im_start|>user\nHi<|im_end|>",
        &[44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44, 108, 306, 79, 486, 108, 46],
    ),
    (
        " = Robert Boulter = \n \n Robert Boulter is an English film , television and theatre actor . \n",
        &[
            446, 6356, 389, 9226, 352, 446, 3717, 3717, 6356, 389, 9226, 352, 314, 354, 2321, 4771,
            3297, 8552, 284, 16984, 17523, 1673, 3717,
        ],
    ),
    ("", &[]),
];

/// Our code point classes equal llama.cpp's table (src/unicode-data.cpp, Unicode 15.1) for
/// every code point, when the llama.cpp sources are in the cache (scripts/build-llama.sh).
#[test]
fn unicode_classes_match_llama_cpp_table() {
    use tq::tokenizer::unicode::{category, flags, is_ws};
    let Some(p) = fixtures::data_file(
        fixtures::cache_dir().join("llama.cpp/src/src/unicode-data.cpp"),
        "scripts/build-llama.sh, which fetches the llama.cpp sources",
    ) else {
        return;
    };
    let src = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let hex = |s: &str| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap();
    let section = |name: &str| {
        let a = src.find(name).unwrap();
        let b = a + src[a..].find("};").unwrap();
        &src[a..b]
    };
    let mut ranges = Vec::new();
    for line in section("unicode_ranges_flags").lines() {
        let l = line.trim();
        if let Some(body) = l.strip_prefix('{').and_then(|l| l.strip_suffix("},")) {
            let (c, f) = body.split_once(',').unwrap();
            ranges.push((hex(c), hex(f)));
        }
    }
    let white: std::collections::HashSet<u32> = section("unicode_set_whitespace")
        .lines()
        .filter(|l| l.trim().starts_with("0x"))
        .map(|l| hex(l.trim().trim_end_matches(',')))
        .collect();
    assert!(ranges.len() > 1000 && white.len() == 25);
    let mut mismatches = Vec::new();
    for w in ranges.windows(2) {
        let (lo, fl) = w[0];
        let want = match fl & 0xFF {
            0x01 => 1,
            0x02 => 2,
            0x04 => 3,
            0x08 => 4,
            0x10 => 5,
            0x20 => 6,
            0x40 => 7,
            0x80 => 8,
            other => panic!("flags {other:#x}"),
        };
        for c in lo..w[1].0 {
            let f = flags(c);
            if category(f) != want || is_ws(f) != white.contains(&c) {
                mismatches.push(c);
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} code points differ, first {:x?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(20)]
    );
}

/// Unsupported tokenizers: one line naming the value, the supported list and --tokens.
#[test]
fn unsupported_tokenizers_are_clear_errors() {
    for (name, what) in [
        ("bert-bge", "'bert'"),
        ("gemma-4", "'gemma4'"),
        ("nomic-bert-moe", "'t5'"),
    ] {
        let Some(p) = vocab(name) else { return };
        let err = Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, tq::Error::Unsupported(_)), "{name}: {msg}");
        assert!(msg.contains(what) && msg.contains("--tokens FILE"), "{msg}");
        assert!(msg.contains("gpt2") && msg.contains("llama"), "{msg}");
        assert!(!msg.contains('\n'));
    }
    // An unknown pre-tokenizer on a gpt2 vocabulary, and no tokenizer at all.
    let dir = tempfile::tempdir().unwrap();
    let s = |x: &str| Value::string(x);
    let strs = |v: &[&str]| Value::Array(ValueType::String, v.iter().map(|x| s(x)).collect());
    let unknown_pre = vec![
        ("general.architecture".to_string(), s("llama")),
        ("tokenizer.ggml.model".to_string(), s("gpt2")),
        ("tokenizer.ggml.pre".to_string(), s("tekken")),
        ("tokenizer.ggml.tokens".to_string(), strs(&["a", "b", "ab"])),
        ("tokenizer.ggml.merges".to_string(), strs(&["a b"])),
    ];
    let err = Tokenizer::from_gguf(&write_gguf(dir.path(), "pre.gguf", &unknown_pre)).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("'tekken'") && msg.contains("smollm") && msg.contains("--tokens FILE"),
        "{msg}"
    );
    let none = vec![("general.architecture".to_string(), s("llama"))];
    let err = Tokenizer::from_gguf(&write_gguf(dir.path(), "none.gguf", &none)).unwrap_err();
    assert!(err.to_string().contains("--tokens FILE"), "{err}");
}

/// A tiny synthetic BPE vocabulary: merges by rank, byte fallback, default BOS handling.
#[test]
fn synthetic_bpe() {
    let dir = tempfile::tempdir().unwrap();
    let s = |x: &str| Value::string(x);
    let strs = |v: &[&str]| Value::Array(ValueType::String, v.iter().map(|x| s(x)).collect());
    let meta = vec![
        ("general.architecture".to_string(), s("llama")),
        ("tokenizer.ggml.model".to_string(), s("gpt2")),
        ("tokenizer.ggml.pre".to_string(), s("gpt-2")),
        (
            "tokenizer.ggml.tokens".to_string(),
            strs(&["a", "b", "c", "Ġ", "ab", "bc", "abc", "Ġa", "<s>"]),
        ),
        (
            "tokenizer.ggml.merges".to_string(),
            strs(&["b c", "a b", "a bc", "Ġ a"]),
        ),
        ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(8)),
        (
            "tokenizer.ggml.add_bos_token".to_string(),
            Value::Bool(true),
        ),
    ];
    let tok = Tokenizer::from_gguf(&write_gguf(dir.path(), "bpe.gguf", &meta)).unwrap();
    // "b c" ranks before "a b": abc → a + bc → abc.
    assert_eq!(tok.encode("abc", false), vec![6]);
    assert_eq!(tok.encode("abc ab", true), vec![8, 6, 3, 4]);
    // 'd' has no token: dropped like llama.cpp's byte fallback finds nothing.
    assert_eq!(tok.encode("d", false), Vec::<u32>::new());
}

#[test]
fn token_file_escape_hatch() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ids.txt");
    std::fs::write(&p, "1 2,3\n# comment\n 40  5 # tail\n").unwrap();
    assert_eq!(
        tq::tokenizer::read_token_file(&p).unwrap(),
        vec![1, 2, 3, 40, 5]
    );
    // The plain form `tq eval --tokens` documented and `tq calib --save-tokens` writes:
    // whitespace-separated ids, one window per line, tabs and CRLF included.
    std::fs::write(&p, "7 8\t9\r\n10\n\n11\n").unwrap();
    assert_eq!(
        tq::tokenizer::read_token_file(&p).unwrap(),
        vec![7, 8, 9, 10, 11]
    );
    std::fs::write(&p, "1 x\n").unwrap();
    let e = tq::tokenizer::read_token_file(&p).unwrap_err().to_string();
    assert!(e.contains("line 1") && e.contains("\"x\""), "{e}");
}

/// One BOS policy: the metadata-only rule (used for token files) agrees with the tokenizer's,
/// and follows llama.cpp: add_bos_token if present, else the vocabulary type's default.
#[test]
fn window_bos_policy() {
    use tq::tokenizer::input::window_bos;
    let dir = tempfile::tempdir().unwrap();
    let s = |x: &str| Value::string(x);
    let strs = |v: &[&str]| Value::Array(ValueType::String, v.iter().map(|x| s(x)).collect());
    let base = |model: &str, pre: &str| {
        vec![
            ("general.architecture".to_string(), s("llama")),
            ("tokenizer.ggml.model".to_string(), s(model)),
            ("tokenizer.ggml.pre".to_string(), s(pre)),
            (
                "tokenizer.ggml.tokens".to_string(),
                strs(&["a", "b", "ab", "<s>"]),
            ),
            ("tokenizer.ggml.merges".to_string(), strs(&["a b"])),
            ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(3)),
        ]
    };
    let flag = |b: bool| ("tokenizer.ggml.add_bos_token".to_string(), Value::Bool(b));
    type Meta = Vec<(String, Value)>;
    let cases: Vec<(Meta, Option<u32>)> = vec![
        // gpt2: off by default, on for the LLaMA-3 pre-tokenizers, the key wins.
        (base("gpt2", "gpt-2"), None),
        (base("gpt2", "llama-bpe"), Some(3)),
        ([base("gpt2", "gpt-2"), vec![flag(true)]].concat(), Some(3)),
        (
            [base("gpt2", "llama-bpe"), vec![flag(false)]].concat(),
            None,
        ),
        // SentencePiece: on by default.
        (base("llama", ""), Some(3)),
    ];
    for (i, (meta, want)) in cases.iter().enumerate() {
        let f = write_gguf(dir.path(), &format!("v{i}.gguf"), meta);
        assert_eq!(window_bos(&f), *want, "case {i}");
        let tok = Tokenizer::from_gguf(&f).unwrap();
        assert_eq!(tok.bos().filter(|_| tok.add_bos()), *want, "case {i}");
    }
    // A vocabulary the tokenizer does not implement: only the key decides (token files).
    let mut meta = base("t5", "");
    assert_eq!(window_bos(&write_gguf(dir.path(), "t5a.gguf", &meta)), None);
    meta.push(flag(true));
    assert_eq!(
        window_bos(&write_gguf(dir.path(), "t5b.gguf", &meta)),
        Some(3)
    );
}

fn write_gguf(dir: &std::path::Path, name: &str, meta: &[(String, Value)]) -> GgufFile {
    let (mut bytes, _, align) = tq::gguf::writer::encode_header(3, meta, &[]).unwrap();
    bytes.resize(bytes.len().div_ceil(align as usize) * align as usize, 0);
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    GgufFile::open(p).unwrap()
}

/// Developer tool (ignored): tokenize texts for comparison with another implementation and
/// time it. `TQ_TOK_DUMP=vocab.gguf:input.txt:output.txt:add_special(0|1)`; inputs are separated
/// by "\n__tq_sep__\n"; writes one line of space-separated ids per input and prints MB/s.
#[test]
#[ignore]
fn dump_tokens() {
    let Ok(spec) = std::env::var("TQ_TOK_DUMP") else {
        fixtures::not_run(
            "a tool run by hand: set TQ_TOK_DUMP=vocab.gguf:input.txt:output.txt:add_special",
        );
        return;
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let f = GgufFile::open(parts[0]).unwrap();
    let t0 = std::time::Instant::now();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let t_load = t0.elapsed();
    let input = std::fs::read_to_string(parts[1]).unwrap();
    let add = parts.get(3) == Some(&"1");
    let t1 = std::time::Instant::now();
    let outs: Vec<Vec<u32>> = input
        .split("\n__tq_sep__\n")
        .map(|t| tok.encode(t, add))
        .collect();
    let dt = t1.elapsed().as_secs_f64();
    let n: usize = outs.iter().map(Vec::len).sum();
    let text: Vec<String> = outs
        .iter()
        .map(|ids| {
            ids.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    std::fs::write(parts[2], text.join("\n") + "\n").unwrap();
    eprintln!(
        "{}: load {:.3}s, {} bytes -> {n} tokens in {dt:.3}s = {:.2} MB/s",
        parts[0],
        t_load.as_secs_f64(),
        input.len(),
        input.len() as f64 / dt / 1e6
    );
}
