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
const SMOLLM2_CASES: &[(&str, &[u32])] = &[];

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
    std::fs::write(&p, "1 x\n").unwrap();
    let e = tq::tokenizer::read_token_file(&p).unwrap_err().to_string();
    assert!(e.contains("line 1") && e.contains("\"x\""), "{e}");
}

fn write_gguf(dir: &std::path::Path, name: &str, meta: &[(String, Value)]) -> GgufFile {
    let (mut bytes, _, align) = tq::gguf::writer::encode_header(3, meta, &[]).unwrap();
    bytes.resize(bytes.len().div_ceil(align as usize) * align as usize, 0);
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    GgufFile::open(p).unwrap()
}
