//! Hugging Face model directories as conversion input (issue 5).
//!
//! - The round trip on real data: scripts/oracle/hf.py rebuilds a reduced (2-layer) SmolLM2 as a
//!   Hugging Face directory with gguf-py / numpy / safetensors (q/k rows un-permuted, f16 and bf16,
//!   sharded). `tq convert DIR` must give back the original GGUF's tensors (bit-exact after the
//!   same float rounding), its metadata, and gguf-py's own answers for the keys it derives.
//! - The tokenizer fingerprint: tq's BPE encoder against the `tokenizers` library's ids.
//! - Tiny synthetic llama / qwen2 / qwen3 directories (permutation, biases, q/k norms) and hostile
//!   ones (one-line error, exit 2, nothing written).

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tq::gguf::{GgufFile, Value};
use tq::types::TensorType;

fn convert(dir: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "convert",
        dir.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (code, _, err) = tq(&args);
    assert_eq!(code, 0, "{err}");
}

fn md_map(f: &GgufFile) -> HashMap<String, Value> {
    f.metadata.iter().cloned().collect()
}

fn json_value(ty: &str, v: &serde_json::Value) -> Value {
    match ty {
        "STRING" => Value::string(v.as_str().unwrap()),
        "UINT32" => Value::U32(v.as_u64().unwrap() as u32),
        "INT32" => Value::I32(v.as_i64().unwrap() as i32),
        "FLOAT32" => Value::F32(v.as_f64().unwrap() as f32),
        "BOOL" => Value::Bool(v.as_bool().unwrap()),
        "ARRAY" => Value::Array(
            tq::gguf::ValueType::String,
            v.as_array()
                .unwrap()
                .iter()
                .map(|s| Value::string(s.as_str().unwrap()))
                .collect(),
        ),
        t => panic!("type {t}"),
    }
}

/// The reduced HF round trip: tensors, order, types and metadata.
fn roundtrip(name: &str, weights: &str) {
    let Some(smol) = fixtures::smollm2() else {
        return;
    };
    let Some(dir) = fixtures::oracle(&format!("hf/{name}")) else {
        return;
    };
    let Some(expect) = fixtures::oracle_json("hf/expect.json") else {
        return;
    };
    let expect = &expect[name];
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.gguf");
    convert(&dir, &out, &["--weights", weights]);
    let orig = GgufFile::open(&smol).unwrap();
    let got = GgufFile::open(&out).unwrap();
    let wty = TensorType::from_name(weights).unwrap();

    // Tensors: the original's, layers 0 and 1, in the original order.
    let want: Vec<_> = orig
        .tensors
        .iter()
        .filter(|t| {
            !t.name.starts_with("blk.")
                || t.name.starts_with("blk.0.")
                || t.name.starts_with("blk.1.")
        })
        .collect();
    let names: Vec<&str> = got.tensors.iter().map(|t| t.name.as_str()).collect();
    let want_names: Vec<&str> = want.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, want_names);
    assert_eq!(got.tensors.len(), 20);
    let bf16_norms = name.contains("bf16");
    for (w, g) in want.iter().zip(&got.tensors) {
        assert_eq!(w.dims, g.dims, "{}", w.name);
        let x = orig.tensor_f32(w).unwrap();
        let matrix = w.dims.len() >= 2;
        // What the HF file stores, then what tq writes from it.
        let stored: Vec<f32> = if matrix || bf16_norms {
            let enc = if name.contains("bf16") {
                TensorType::BF16
            } else {
                TensorType::F16
            };
            let mut b = vec![0u8; x.len() * 2];
            tq::types::quantize(enc, &x, &mut b, "t").unwrap();
            let mut y = vec![0f32; x.len()];
            tq::types::dequantize(enc, &b, &mut y, "t").unwrap();
            y
        } else {
            x.clone()
        };
        let dst = if matrix { wty } else { TensorType::F32 };
        assert_eq!(g.ty, dst, "{}", g.name);
        let mut want_bytes = vec![0u8; dst.bytes_for(stored.len() as u64).unwrap() as usize];
        tq::types::quantize(dst, &stored, &mut want_bytes, "t").unwrap();
        assert!(
            got.tensor_data(g) == &want_bytes[..],
            "{}: data differs",
            g.name
        );
    }

    // Metadata: every key of the original except those that depend on the layer count / size.
    let om = md_map(&orig);
    let gm = md_map(&got);
    let derived = [
        "general.finetune",
        "general.size_label",
        "general.file_type",
        "llama.block_count",
    ];
    for (k, v) in &orig.metadata {
        if derived.contains(&k.as_str()) {
            continue;
        }
        assert_eq!(gm.get(k), Some(v), "{k}");
    }
    assert_eq!(gm["llama.block_count"], Value::U32(2));
    assert_eq!(
        gm["general.file_type"],
        Value::U32(if weights == "bf16" { 32 } else { 1 })
    );
    // gguf-py's Metadata heuristics and SpecialVocab for this directory.
    for part in ["general", "special"] {
        for (k, e) in expect[part].as_object().unwrap() {
            if k == "tokenizer.ggml.merges" {
                let m = gm[k].as_array().unwrap();
                assert_eq!(m.len() as u64, e["value"]["count"].as_u64().unwrap());
                assert_eq!(gm[k], om[k]);
                continue;
            }
            assert_eq!(
                gm.get(k),
                Some(&json_value(e["type"].as_str().unwrap(), &e["value"])),
                "{k}"
            );
        }
    }
    // Nothing else but the provenance.
    for k in gm.keys() {
        assert!(
            om.contains_key(k) || k.starts_with("tq.") || k == "general.file_type",
            "extra key {k}"
        );
    }
    assert_eq!(gm["tq.input.name"], Value::string(name));
}

#[test]
fn roundtrip_reduced_smollm2_f16_bit_exact() {
    roundtrip("smol2-f16", "f16");
}

#[test]
fn roundtrip_reduced_smollm2_bf16_bit_exact() {
    roundtrip("smol2-bf16", "bf16");
}

/// A converted HF directory goes straight to TQ4_1S in one command.
#[test]
fn hf_dir_to_tq4_1s_in_one_command() {
    let Some(dir) = fixtures::oracle("hf/smol2-bf16") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("tq4.gguf");
    convert(&dir, &out, &["--weights", "tq4_1s"]);
    let g = GgufFile::open(&out).unwrap();
    let ty = |n: &str| g.tensor(n).unwrap().ty;
    assert_eq!(ty("blk.0.attn_q.weight"), TensorType::TQ4_1S);
    assert_eq!(ty("blk.1.ffn_down.weight"), TensorType::TQ4_1S);
    assert_eq!(ty("token_embd.weight"), TensorType::Q8_0);
    assert_eq!(ty("blk.0.attn_norm.weight"), TensorType::F32);
    assert_eq!(g.get_str("tokenizer.ggml.pre"), Some("smollm"));
    // Without flags: types kept (bf16 matrices copied, bf16 file type).
    let keep = tmp.path().join("keep.gguf");
    convert(&dir, &keep, &[]);
    let k = GgufFile::open(&keep).unwrap();
    assert_eq!(
        k.tensor("blk.0.attn_q.weight").unwrap().ty,
        TensorType::BF16
    );
    assert_eq!(k.get_u64("general.file_type"), Some(32));
    // Dry run works on a directory too.
    let (code, out, err) = tq(&[
        "convert",
        dir.to_str().unwrap(),
        "--dry-run",
        "--recipe",
        "config-i",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("blk.0.attn_q.weight"), "{out}");
}

/// HF directory → TQ4_1S in one command writes the same bytes as HF → f16 GGUF → TQ4_1S (the
/// f16 shards make the intermediate f16 exact). Provenance names the input, so it is left out;
/// general.file_type still follows the tensors written (44 = TQ4_1S).
#[test]
fn hf_dir_to_tq4_1s_equals_two_steps() {
    let Some(dir) = fixtures::oracle("hf/smol2-f16") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (one, f16, two) = (
        tmp.path().join("one.gguf"),
        tmp.path().join("f16.gguf"),
        tmp.path().join("two.gguf"),
    );
    let np = ["--no-provenance"];
    convert(&dir, &one, &["--weights", "tq4_1s", np[0]]);
    convert(&dir, &f16, &["--weights", "f16", np[0]]);
    convert(&f16, &two, &["--weights", "tq4_1s", np[0]]);
    let (a, b) = (std::fs::read(&one).unwrap(), std::fs::read(&two).unwrap());
    assert!(a == b, "one-step and two-step TQ4_1S files differ");
    let g = GgufFile::open(&one).unwrap();
    assert_eq!(g.get_u64("general.file_type"), Some(44));
    assert_eq!(
        GgufFile::open(&f16).unwrap().get_u64("general.file_type"),
        Some(1)
    );
    assert_eq!(
        g.tensor("blk.1.attn_k.weight").unwrap().ty,
        TensorType::TQ4_1S
    );
}

/// A SentencePiece-style tokenizer.json (byte-fallback BPE, Llama 2 / Mistral) with no
/// tokenizer.model: convert_hf_to_gguf's `_set_vocab_llama_hf`. The expected keys are gguf-py's
/// (LlamaHfVocab with transformers, then SpecialVocab) for the directories
/// scripts/oracle/hf_llama_vocab.py builds: tokens, types, scores -1000, no merges, special ids,
/// add_bos/add_eos, chat template, and no other tokenizer key.
#[test]
fn llama_hf_tokenizer_json_matches_gguf_py() {
    let Some(p) = fixtures::oracle("hf/llama-hf/expect.json") else {
        return;
    };
    let expect: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let cases = expect.as_object().unwrap();
    assert_eq!(cases.len(), 3);
    let tmp = tempfile::tempdir().unwrap();
    for (case, kv) in cases {
        let dir = p.parent().unwrap().join(case);
        let out = tmp.path().join(format!("{case}.gguf"));
        convert(&dir, &out, &[]);
        let g = GgufFile::open(&out).unwrap();
        let gm = md_map(&g);
        let kv = kv.as_object().unwrap();
        for (k, e) in kv {
            let v = &e["value"];
            let want = match k.as_str() {
                "tokenizer.ggml.tokens" => json_value("ARRAY", v),
                "tokenizer.ggml.scores" => Value::Array(
                    tq::gguf::ValueType::F32,
                    v.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| Value::F32(x.as_f64().unwrap() as f32))
                        .collect(),
                ),
                "tokenizer.ggml.token_type" => Value::Array(
                    tq::gguf::ValueType::I32,
                    v.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| Value::I32(x.as_i64().unwrap() as i32))
                        .collect(),
                ),
                _ => json_value(e["type"].as_str().unwrap(), v),
            };
            assert_eq!(gm.get(k), Some(&want), "{case}: {k}");
        }
        // No tokenizer key that gguf-py does not write (no merges for this model).
        for k in gm.keys().filter(|k| k.starts_with("tokenizer.")) {
            assert!(kv.contains_key(k), "{case}: extra key {k}");
        }
        let types = g
            .get("tokenizer.ggml.token_type")
            .unwrap()
            .as_array()
            .unwrap();
        assert_eq!(types[3], Value::I32(6), "{case}: <0x00> is BYTE");
    }
}

/// tq's BPE encoder gives the `tokenizers` library's ids (convert_hf_to_gguf fingerprints the
/// pre-tokenizer by hashing these ids).
#[test]
fn bpe_encoder_matches_tokenizers_library() {
    let Some(p) = fixtures::oracle("hf/pretok/expect.json") else {
        return;
    };
    let e: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let texts: Vec<&str> = e["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let dir = p.parent().unwrap();
    let mut n = 0;
    for (variant, ids) in e["ids"].as_object().unwrap() {
        let tok: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{variant}.json"))).unwrap(),
        )
        .unwrap();
        let enc = tq::source::hf::bpe::Encoder::new(&tok).unwrap();
        for (t, want) in texts.iter().zip(ids.as_array().unwrap()) {
            let want: Vec<u32> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(enc.encode(t), want, "{variant}: {t:?}");
            n += 1;
        }
    }
    assert!(n >= 25);
    let tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("smollm.json")).unwrap()).unwrap();
    assert_eq!(tq::source::hf::bpe::detect_pre(&tok).unwrap().0, "smollm");
}

// ---- tiny synthetic models ----

struct Tiny {
    dir: tempfile::TempDir,
}

fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn spm_piece(text: &str, score: f32, kind: u8) -> Vec<u8> {
    let mut m = vec![0x0a, text.len() as u8];
    m.extend_from_slice(text.as_bytes());
    m.push(0x15);
    m.extend_from_slice(&score.to_le_bytes());
    m.extend_from_slice(&[0x18, kind]);
    let mut out = vec![0x0a, m.len() as u8];
    out.extend(m);
    out
}

/// (name, pytorch shape, f32 data)
type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

fn tiny_tensors(
    arch: &str,
    layers: usize,
    n_embd: usize,
    n_head: usize,
    n_kv: usize,
    vocab: usize,
) -> Tensors {
    tiny_tensors_hd(arch, layers, n_embd, n_head, n_kv, vocab, n_embd / n_head)
}

/// Real shapes for a per-head dimension `hd` (`head_dim` in config.json when ≠ n_embd / n_head):
/// q [n_head·hd, n_embd], k/v [n_kv·hd, n_embd], o [n_embd, n_head·hd], q/k norms [hd].
fn tiny_tensors_hd(
    arch: &str,
    layers: usize,
    n_embd: usize,
    n_head: usize,
    n_kv: usize,
    vocab: usize,
    hd: usize,
) -> Tensors {
    let ff = 2 * n_embd;
    let mut t: Tensors = vec![];
    let mut seed = 1;
    let mut add = |t: &mut Tensors, n: String, shape: Vec<usize>| {
        seed += 1;
        let len = shape.iter().product();
        t.push((n, shape, rand_f32(len, seed)));
    };
    add(
        &mut t,
        "model.embed_tokens.weight".into(),
        vec![vocab, n_embd],
    );
    add(&mut t, "model.norm.weight".into(), vec![n_embd]);
    add(&mut t, "lm_head.weight".into(), vec![vocab, n_embd]);
    for l in 0..layers {
        let p = format!("model.layers.{l}.");
        add(&mut t, format!("{p}input_layernorm.weight"), vec![n_embd]);
        add(
            &mut t,
            format!("{p}post_attention_layernorm.weight"),
            vec![n_embd],
        );
        add(
            &mut t,
            format!("{p}self_attn.q_proj.weight"),
            vec![n_head * hd, n_embd],
        );
        add(
            &mut t,
            format!("{p}self_attn.k_proj.weight"),
            vec![n_kv * hd, n_embd],
        );
        add(
            &mut t,
            format!("{p}self_attn.v_proj.weight"),
            vec![n_kv * hd, n_embd],
        );
        add(
            &mut t,
            format!("{p}self_attn.o_proj.weight"),
            vec![n_embd, n_head * hd],
        );
        add(&mut t, format!("{p}mlp.gate_proj.weight"), vec![ff, n_embd]);
        add(&mut t, format!("{p}mlp.up_proj.weight"), vec![ff, n_embd]);
        add(&mut t, format!("{p}mlp.down_proj.weight"), vec![n_embd, ff]);
        if arch == "qwen2" {
            add(
                &mut t,
                format!("{p}self_attn.q_proj.bias"),
                vec![n_head * hd],
            );
            add(&mut t, format!("{p}self_attn.k_proj.bias"), vec![n_kv * hd]);
            add(&mut t, format!("{p}self_attn.v_proj.bias"), vec![n_kv * hd]);
        }
        if arch == "qwen3" {
            add(&mut t, format!("{p}self_attn.q_norm.weight"), vec![hd]);
            add(&mut t, format!("{p}self_attn.k_norm.weight"), vec![hd]);
        }
    }
    t
}

fn write_st(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, d)| {
            let b = match dtype {
                Dtype::F32 => d.iter().flat_map(|v| v.to_le_bytes()).collect(),
                Dtype::F16 => d
                    .iter()
                    .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
                    .collect(),
                _ => d
                    .iter()
                    .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
                    .collect(),
            };
            (n.clone(), s.clone(), b)
        })
        .collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap()))
        .collect();
    let data = safetensors::serialize(views, None).unwrap();
    std::fs::write(path, data).unwrap();
}

fn tiny_dir(
    arch: &str,
    hf_arch: &str,
    tensors: &Tensors,
    n_head: usize,
    n_kv: usize,
    extra_cfg: &str,
) -> Tiny {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n_embd = tensors[0].1[1];
    let vocab = tensors[0].1[0];
    let layers = tensors
        .iter()
        .filter(|t| t.0.ends_with("input_layernorm.weight"))
        .count();
    std::fs::write(
        d.join("config.json"),
        format!(
            r#"{{"architectures":["{hf_arch}"],"model_type":"{arch}","hidden_size":{n_embd},"intermediate_size":{},
            "num_hidden_layers":{layers},"num_attention_heads":{n_head},"num_key_value_heads":{n_kv},
            "max_position_embeddings":128,"rms_norm_eps":1e-6,"rope_theta":10000.0,"vocab_size":{vocab},
            "tie_word_embeddings":false,"bos_token_id":1,"eos_token_id":2{extra_cfg}}}"#,
            2 * n_embd
        ),
    )
    .unwrap();
    write_st(&d.join("model.safetensors"), tensors, Dtype::F32);
    // A SentencePiece tokenizer.model: <unk>, <s>, </s>, then pieces.
    let mut spm = spm_piece("<unk>", 0.0, 2);
    spm.extend(spm_piece("<s>", 0.0, 3));
    spm.extend(spm_piece("</s>", 0.0, 3));
    for i in 3..vocab {
        spm.extend(spm_piece(&format!("\u{2581}t{i}"), -(i as f32), 1));
    }
    std::fs::write(d.join("tokenizer.model"), spm).unwrap();
    Tiny { dir }
}

fn f32_of(g: &GgufFile, name: &str) -> Vec<f32> {
    g.tensor_f32(g.tensor(name).unwrap()).unwrap()
}

#[test]
fn tiny_llama_permutes_q_and_k_like_llama_cpp() {
    let (n_embd, n_head, n_kv) = (32, 4, 2);
    let t = tiny_tensors("llama", 2, n_embd, n_head, n_kv, 40);
    let m = tiny_dir("llama", "LlamaForCausalLM", &t, n_head, n_kv, "");
    let out = m.dir.path().join("out.gguf");
    let hf = m.dir.path().to_path_buf();
    let out2 = tempfile::tempdir().unwrap();
    let out = out2.path().join(out.file_name().unwrap());
    convert(&hf, &out, &[]);
    let g = GgufFile::open(&out).unwrap();
    let hd = n_embd / n_head;
    let get = |n: &str| t.iter().find(|x| x.0 == n).unwrap().2.clone();
    for (hfname, gname, heads) in [
        (
            "model.layers.1.self_attn.q_proj.weight",
            "blk.1.attn_q.weight",
            n_head,
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            "blk.0.attn_k.weight",
            n_kv,
        ),
    ] {
        let w = get(hfname);
        let rows = heads * hd;
        // llama.cpp: w.reshape(heads, 2, hd/2, n_embd).swapaxes(1, 2).reshape(rows, n_embd)
        let mut want = vec![0f32; w.len()];
        for h in 0..heads {
            for i in 0..hd / 2 {
                for j in 0..2 {
                    let dst = h * hd + i * 2 + j;
                    let src = h * hd + j * (hd / 2) + i;
                    want[dst * n_embd..(dst + 1) * n_embd]
                        .copy_from_slice(&w[src * n_embd..(src + 1) * n_embd]);
                }
            }
        }
        assert_eq!(rows * n_embd, w.len());
        assert_eq!(f32_of(&g, gname), want, "{gname}");
    }
    assert_eq!(
        f32_of(&g, "blk.0.attn_v.weight"),
        get("model.layers.0.self_attn.v_proj.weight")
    );
    assert_eq!(f32_of(&g, "output.weight"), get("lm_head.weight"));
    assert_eq!(g.tensors.len(), 3 + 2 * 9);
    assert_eq!(g.get_str("tokenizer.ggml.model"), Some("llama"));
    assert_eq!(g.get_u64("llama.rope.dimension_count"), Some(8));
    let toks = g.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(toks.len(), 40);
    assert_eq!(g.get_u64("tokenizer.ggml.bos_token_id"), Some(1));
    let types = g
        .get("tokenizer.ggml.token_type")
        .unwrap()
        .as_array()
        .unwrap();
    assert_eq!(types[0], Value::I32(2));
    assert_eq!(types[1], Value::I32(3));
    assert_eq!(types[5], Value::I32(1));
    // f16 output of permuted tensors goes through the re-encode path: still exact rows.
    let out16 = out2.path().join("f16.gguf");
    convert(&hf, &out16, &["--weights", "f16"]);
    let g16 = GgufFile::open(&out16).unwrap();
    let a = f32_of(&g16, "blk.1.attn_q.weight");
    let b: Vec<f32> = f32_of(&g, "blk.1.attn_q.weight")
        .iter()
        .map(|v| half::f16::from_f32(*v).to_f32())
        .collect();
    assert_eq!(a, b);
}

#[test]
fn tiny_qwen2_biases_and_qwen3_norms() {
    let t = tiny_tensors("qwen2", 2, 32, 4, 2, 40);
    let m = tiny_dir("qwen2", "Qwen2ForCausalLM", &t, 4, 2, "");
    let o = tempfile::tempdir().unwrap();
    let out = o.path().join("q2.gguf");
    convert(m.dir.path(), &out, &[]);
    let g = GgufFile::open(&out).unwrap();
    let get = |n: &str| t.iter().find(|x| x.0 == n).unwrap().2.clone();
    // No permutation for qwen2.
    assert_eq!(
        f32_of(&g, "blk.1.attn_q.weight"),
        get("model.layers.1.self_attn.q_proj.weight")
    );
    assert_eq!(
        f32_of(&g, "blk.0.attn_k.bias"),
        get("model.layers.0.self_attn.k_proj.bias")
    );
    assert_eq!(g.get_str("general.architecture"), Some("qwen2"));
    assert_eq!(g.get_u64("qwen2.block_count"), Some(2));
    assert!(g.get("qwen2.rope.dimension_count").is_none());

    // head_dim 16 != 32 / 4, as in real Qwen3 (e.g. 0.6B: hidden 1024, 16 heads, head_dim 128):
    // q [4·16, 32], k/v [2·16, 32], o [32, 4·16], q/k norms [16].
    let t = tiny_tensors_hd("qwen3", 2, 32, 4, 2, 40, 16);
    let m = tiny_dir("qwen3", "Qwen3ForCausalLM", &t, 4, 2, r#","head_dim":16"#);
    let out = o.path().join("q3.gguf");
    convert(m.dir.path(), &out, &[]);
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(
        f32_of(&g, "blk.1.attn_q_norm.weight"),
        get3(&t, "model.layers.1.self_attn.q_norm.weight")
    );
    assert_eq!(
        f32_of(&g, "blk.0.attn_output.weight"),
        get3(&t, "model.layers.0.self_attn.o_proj.weight")
    );
    assert_eq!(g.tensor("blk.0.attn_q.weight").unwrap().dims, vec![32, 64]);
    assert_eq!(g.tensor("blk.0.attn_k.weight").unwrap().dims, vec![32, 32]);
    assert_eq!(
        g.tensor("blk.0.attn_output.weight").unwrap().dims,
        vec![64, 32]
    );
    assert_eq!(g.get_u64("qwen3.attention.key_length"), Some(16));
    assert_eq!(g.get_u64("qwen3.attention.value_length"), Some(16));
}

/// Shapes are checked against config.json before anything is written: the q/k/v/o, embedding,
/// norm and MLP shapes the hyper-parameters imply (here: what a wrong `head_dim` or
/// `intermediate_size` would make llama.cpp reject).
#[test]
fn shapes_must_match_config() {
    // A tiny llama with head_dim 1 in config.json (weights of head_dim 8).
    let t = tiny_tensors("llama", 1, 16, 2, 2, 8);
    let m = tiny_dir("llama", "LlamaForCausalLM", &t, 2, 2, r#","head_dim":1"#);
    expect_error(
        m.dir.path(),
        "tensor 'model.layers.0.self_attn.k_proj.weight' (blk.0.attn_k.weight) has shape [16, 16], but config.json gives [2, 16] (num_key_value_heads 2 x head_dim 1, hidden_size 16); config.json and the weights describe different models",
    );
    // The wrong intermediate_size / vocab_size / qwen3 q_norm width.
    for (arch, hf, extra, needle) in [
        ("llama", "LlamaForCausalLM", r#","intermediate_size":24"#, "intermediate_size 24"),
        ("llama", "LlamaForCausalLM", r#","vocab_size":9"#, "tensor 'lm_head.weight' (output.weight) has shape [8, 16], but config.json gives [9, 16] (vocab_size 9, hidden_size 16)"),
        ("qwen3", "Qwen3ForCausalLM", r#","head_dim":4"#, "(blk.0.attn_k_norm.weight) has shape [8], but config.json gives [4] (head_dim 4)"),
    ] {
        let t = tiny_tensors(arch, 1, 16, 2, 2, 8);
        let m = tiny_dir(arch, hf, &t, 2, 2, extra);
        let cfg = std::fs::read_to_string(m.dir.path().join("config.json")).unwrap();
        // tiny_dir writes intermediate_size and vocab_size itself: drop its value so that the
        // file holds the key once.
        let cfg = if extra.contains("intermediate_size") {
            cfg.replacen("\"intermediate_size\":32,", "", 1)
        } else if extra.contains("vocab_size") {
            cfg.replacen("\"vocab_size\":8,", "", 1)
        } else {
            cfg
        };
        std::fs::write(m.dir.path().join("config.json"), cfg).unwrap();
        expect_error(m.dir.path(), needle);
    }
    // Heads that do not divide: a config error before any tensor is read.
    let t = tiny_tensors("llama", 1, 16, 2, 2, 8);
    let m = tiny_dir("llama", "LlamaForCausalLM", &t, 2, 2, "");
    let cfg = std::fs::read_to_string(m.dir.path().join("config.json")).unwrap();
    std::fs::write(
        m.dir.path().join("config.json"),
        cfg.replace("\"num_attention_heads\":2", "\"num_attention_heads\":3")
            .replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":1"),
    )
    .unwrap();
    expect_error(
        m.dir.path(),
        "hidden_size 16 is not a multiple of num_attention_heads 3",
    );
}

/// The reported case: the real (reduced) SmolLM2 directory with `"head_dim": 1` added to its
/// config.json converted with exit 0 and wrote a file llama.cpp rejects.
#[test]
fn smollm2_with_wrong_head_dim_is_refused() {
    let Some(src) = fixtures::oracle("hf/smol2-f16") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let dst = tmp.path().join(p.file_name().unwrap());
        if p.file_name().unwrap() == "config.json" {
            let mut c: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            c["head_dim"] = 1.into();
            std::fs::write(&dst, c.to_string()).unwrap();
        } else {
            std::os::unix::fs::symlink(&p, &dst).unwrap();
        }
    }
    expect_error(
        tmp.path(),
        "tensor 'model.layers.0.self_attn.k_proj.weight' (blk.0.attn_k.weight) has shape [192, 576], but config.json gives [3, 576]",
    );
}

fn get3(t: &Tensors, n: &str) -> Vec<f32> {
    t.iter().find(|x| x.0 == n).unwrap().2.clone()
}

/// Rope scaling from config.json: the `llama.rope.*` keys (names, types, values) are exactly what
/// convert_hf_to_gguf writes (scripts/oracle/hf_rope.py: gguf-py's writer calls), for llama3
/// (the `rope_freqs.weight` factors, numpy float32: equal to within 1 ulp, torch's own pow being
/// vectorized), yarn given with the old `type` key, and linear.
#[test]
fn rope_scaling_keys_match_convert_hf_to_gguf() {
    let Some(expect) = fixtures::oracle_json("hf/rope/expect.json") else {
        return;
    };
    let out_dir = tempfile::tempdir().unwrap();
    for (case, e) in expect.as_object().unwrap() {
        let u = |k: &str| e[k].as_u64().unwrap() as usize;
        let (n_embd, n_head, n_kv) = (u("n_embd"), u("n_head"), u("n_kv"));
        let t = tiny_tensors("llama", 1, n_embd, n_head, n_kv, 40);
        let m = tiny_dir("llama", "LlamaForCausalLM", &t, n_head, n_kv, "");
        let cp = m.dir.path().join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cp).unwrap()).unwrap();
        let obj = cfg.as_object_mut().unwrap();
        obj.remove("rope_theta");
        for (k, v) in e["config"].as_object().unwrap() {
            obj.insert(k.clone(), v.clone());
        }
        std::fs::write(&cp, cfg.to_string()).unwrap();
        let out = out_dir.path().join(format!("{case}.gguf"));
        convert(m.dir.path(), &out, &[]);
        let g = GgufFile::open(&out).unwrap();
        let want: HashMap<&str, Value> = e["keys"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.contains(".rope."))
            .map(|(k, v)| {
                (
                    k.as_str(),
                    json_value(v["type"].as_str().unwrap(), &v["value"]),
                )
            })
            .collect();
        let got: HashMap<&str, Value> = g
            .metadata
            .iter()
            .filter(|(k, _)| k.contains(".rope."))
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        assert_eq!(got, want, "{case}");
        match e.get("rope_freqs") {
            Some(f) => {
                let want: Vec<f32> = f
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect();
                assert_eq!(g.tensors[0].name, "rope_freqs.weight");
                let got = f32_of(&g, "rope_freqs.weight");
                assert_eq!(got.len(), want.len());
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
                    assert!(
                        ulps <= 1,
                        "{case}: rope_freqs[{i}] = {a}, gguf-py/numpy {b}"
                    );
                }
            }
            None => assert!(g.tensor("rope_freqs.weight").is_none(), "{case}"),
        }
    }
}

// ---- hostile / unsupported input: one line, exit 2, nothing written ----

fn expect_error(dir: &Path, needle: &str) {
    let o = tempfile::tempdir().unwrap();
    let out = o.path().join("x.gguf");
    let (code, _, err) = tq(&[
        "convert",
        dir.to_str().unwrap(),
        "--weights",
        "f16",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "want '{needle}' in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists());
}

fn small() -> (Tensors, Tiny) {
    let t = tiny_tensors("llama", 1, 16, 2, 2, 8);
    let m = tiny_dir("llama", "LlamaForCausalLM", &t, 2, 2, "");
    (t, m)
}

#[test]
fn unknown_architecture_lists_supported() {
    let (_, m) = small();
    let cfg = std::fs::read_to_string(m.dir.path().join("config.json")).unwrap();
    std::fs::write(
        m.dir.path().join("config.json"),
        cfg.replace("LlamaForCausalLM", "GPTNeoXForCausalLM"),
    )
    .unwrap();
    expect_error(
        m.dir.path(),
        "unsupported architecture 'GPTNeoXForCausalLM'",
    );
    let (code, _, err) = tq(&["convert", m.dir.path().to_str().unwrap(), "--dry-run"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("LlamaForCausalLM")
            && err.contains("Qwen2ForCausalLM")
            && err.contains("Qwen3ForCausalLM"),
        "{err}"
    );
}

#[test]
fn hostile_directories() {
    // Truncated shard.
    let (_, m) = small();
    let p = m.dir.path().join("model.safetensors");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 7]).unwrap();
    expect_error(m.dir.path(), "model.safetensors");

    // Header length pointing past the end.
    let (_, m) = small();
    let p = m.dir.path().join("model.safetensors");
    let mut b = std::fs::read(&p).unwrap();
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    expect_error(m.dir.path(), "invalid safetensors");

    // An index naming a file outside the directory.
    let (_, m) = small();
    std::fs::write(
        m.dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map":{"model.norm.weight":"../evil.safetensors"}}"#,
    )
    .unwrap();
    expect_error(m.dir.path(), "not a file name");

    // An index that disagrees with the shards.
    let (_, m) = small();
    std::fs::write(
        m.dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map":{"model.norm.weight":"model.safetensors","model.extra.weight":"model.safetensors"}}"#,
    )
    .unwrap();
    expect_error(m.dir.path(), "disagree");

    // Unsupported dtype.
    let (mut t, m) = small();
    t.truncate(3);
    let views = vec![(
        "model.embed_tokens.weight".to_string(),
        TensorView::new(Dtype::I32, vec![2, 2], &[0u8; 16]).unwrap(),
    )];
    std::fs::write(
        m.dir.path().join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    expect_error(m.dir.path(), "dtype I32");

    // q_proj rows that do not match config.json.
    let (mut t, m) = small();
    let q = t
        .iter_mut()
        .find(|x| x.0.ends_with("q_proj.weight"))
        .unwrap();
    q.1 = vec![15, 16];
    q.2.truncate(15 * 16);
    write_st(&m.dir.path().join("model.safetensors"), &t, Dtype::F32);
    expect_error(
        m.dir.path(),
        "has shape [15, 16], but config.json gives [16, 16]",
    );

    // An odd head_dim: shapes agree with config.json, but the rope permutation cannot split
    // the heads' rows into halves.
    let t = tiny_tensors_hd("llama", 1, 16, 2, 2, 8, 3);
    let m = tiny_dir("llama", "LlamaForCausalLM", &t, 2, 2, r#","head_dim":3"#);
    expect_error(m.dir.path(), "rope permutation");

    // A tensor with no GGUF name.
    let (mut t, m) = small();
    t.push((
        "model.layers.0.mystery.weight".into(),
        vec![4],
        vec![0.0; 4],
    ));
    write_st(&m.dir.path().join("model.safetensors"), &t, Dtype::F32);
    expect_error(m.dir.path(), "no GGUF name");

    // A layer beyond num_hidden_layers.
    let (mut t, m) = small();
    t.push((
        "model.layers.7.input_layernorm.weight".into(),
        vec![16],
        vec![0.0; 16],
    ));
    write_st(&m.dir.path().join("model.safetensors"), &t, Dtype::F32);
    expect_error(m.dir.path(), "layer 7");

    // config.json says more layers than the shards hold: refused before anything is written,
    // naming the first missing tensor and the shards searched.
    let (_, m) = small();
    let cfg = std::fs::read_to_string(m.dir.path().join("config.json")).unwrap();
    std::fs::write(
        m.dir.path().join("config.json"),
        cfg.replace(r#""num_hidden_layers":1"#, r#""num_hidden_layers":3"#),
    )
    .unwrap();
    expect_error(
        m.dir.path(),
        "tensor 'model.layers.1.input_layernorm.weight' (blk.1.attn_norm.weight) is not in model.safetensors; 18 of the 30 tensors",
    );
    // One tensor of a block missing (qwen3: a q/k norm; qwen2: a bias), and an untied lm_head.
    for (arch, class, drop, needle) in [
        (
            "qwen3",
            "Qwen3ForCausalLM",
            "model.layers.0.self_attn.k_norm.weight",
            "(blk.0.attn_k_norm.weight)",
        ),
        (
            "qwen2",
            "Qwen2ForCausalLM",
            "model.layers.1.self_attn.v_proj.bias",
            "(blk.1.attn_v.bias)",
        ),
        (
            "llama",
            "LlamaForCausalLM",
            "lm_head.weight",
            "tie_word_embeddings false",
        ),
    ] {
        let mut t = tiny_tensors(arch, 2, 16, 2, 2, 8);
        t.retain(|x| x.0 != drop);
        let m = tiny_dir(arch, class, &t, 2, 2, "");
        expect_error(m.dir.path(), needle);
    }
    // Hostile config values and broken JSON.
    for (cfg, needle) in [
        (
            r#"{"architectures":["LlamaForCausalLM"],"num_hidden_layers":1,"hidden_size":16,"num_attention_heads":0,"num_key_value_heads":2}"#,
            "out of range",
        ),
        (
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":16}"#,
            "missing",
        ),
        ("{\"architectures\": [", "invalid JSON"),
    ] {
        let (_, m) = small();
        std::fs::write(m.dir.path().join("config.json"), cfg).unwrap();
        expect_error(m.dir.path(), needle);
    }

    // A corrupt tokenizer.model / no tokenizer at all.
    let (_, m) = small();
    std::fs::write(m.dir.path().join("tokenizer.model"), [0x0a, 0xff, 0x01]).unwrap();
    expect_error(m.dir.path(), "SentencePiece");
    let (_, m) = small();
    std::fs::remove_file(m.dir.path().join("tokenizer.model")).unwrap();
    expect_error(m.dir.path(), "tokenizer.json");

    // No weights; not a model directory.
    let (_, m) = small();
    std::fs::remove_file(m.dir.path().join("model.safetensors")).unwrap();
    expect_error(m.dir.path(), "no model*.safetensors");
    let empty = tempfile::tempdir().unwrap();
    expect_error(empty.path(), "no config.json");
}

/// `tq inspect DIR`: a model directory is shown as the GGUF `tq convert` would write (same
/// tensors and metadata as the f16 conversion, source types); a directory that is not one says
/// which files to pass.
#[test]
fn inspect_a_model_directory() {
    let Some(dir) = fixtures::oracle("hf/smol2-f16") else {
        return;
    };
    let (code, out, err) = tq(&["inspect", dir.to_str().unwrap(), "--json", "--full"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["format"], "hf");
    let tmp = tempfile::tempdir().unwrap();
    let conv = tmp.path().join("f16.gguf");
    convert(&dir, &conv, &["--no-provenance"]);
    let g = GgufFile::open(&conv).unwrap();
    let tensors = j["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), g.tensors.len());
    for (t, gt) in tensors.iter().zip(&g.tensors) {
        assert_eq!(t["name"], gt.name.as_str());
        assert_eq!(t["type"], gt.ty.name());
        let shape: Vec<u64> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(shape, gt.dims);
    }
    let keys: Vec<&str> = j["metadata"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["key"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = g.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, want);
    let (code, out, _) = tq(&["inspect", dir.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("Hugging Face model directory"), "{out}");

    // Not a model directory: one line naming the files to pass, exit 2.
    let d = tempfile::tempdir().unwrap();
    for f in ["b.safetensors", "a.safetensors", "notes.txt"] {
        std::fs::write(d.path().join(f), b"x").unwrap();
    }
    let (code, _, err) = tq(&["inspect", d.path().to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("not a Hugging Face model directory")
            && err.contains(
                "pass one of its 2 .gguf / .safetensors files (a.safetensors, b.safetensors)"
            ),
        "{err}"
    );
    assert!(!err.contains("os error"), "{err}");
}

#[test]
fn inspect_lists_a_shard() {
    let Some(dir) = fixtures::oracle("hf/smol2-f16") else {
        return;
    };
    let shard: PathBuf = dir.join("model-00001-of-00002.safetensors");
    let (code, out, err) = tq(&["inspect", shard.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["format"], "safetensors");
}

/// Optional card files that are there but unusable are named in a warning (their metadata is left
/// out), never dropped silently; the conversion still succeeds.
#[test]
fn unreadable_card_files_are_warnings() {
    let t = tiny_tensors("llama", 1, 32, 4, 2, 40);
    let m = tiny_dir("llama", "LlamaForCausalLM", &t, 4, 2, "");
    std::fs::write(m.dir.path().join("generation_config.json"), "{not json").unwrap();
    std::fs::write(m.dir.path().join("README.md"), [0xffu8, 0xfe, 0x00]).unwrap();
    let o = tempfile::tempdir().unwrap();
    let out = o.path().join("w.gguf");
    let (code, _, err) = tq(&["convert", s(m.dir.path()), "-o", s(&out)]);
    assert_eq!(code, 0, "{err}");
    for f in [
        "generation_config.json: not a JSON object",
        "README.md: cannot be read",
    ] {
        assert!(
            err.lines()
                .any(|l| l.starts_with("tq: warning: ") && l.contains(f)),
            "no warning for {f}: {err}"
        );
    }
    assert!(out.exists());
}
