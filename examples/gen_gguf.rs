//! Dev tool: write a large GGUF with a real model's tensor shapes and deterministic f16 data, for
//! memory/speed benchmarks of `tq convert` on models bigger than this machine likes.
//!
//!   cargo run --release --example gen_gguf -- OUT.gguf [--shape 7b|70b] [--layers N] [--vocab V.gguf]
//!
//! Shapes: `7b` = llama-2-7B (hidden 4096, ffn 11008, vocab 32000, 32 heads); `70b` = llama-2-70B
//! (hidden 8192, ffn 28672, 64 heads, 8 KV heads). `--vocab` copies the `tokenizer.*` keys of a
//! vocab GGUF (e.g. llama.cpp's `ggml-vocab-llama-spm.gguf`, 32000 tokens) so the model can be
//! calibrated on text (`tq convert --calib TEXT`). Data is a cheap
//! deterministic pattern (not random: generation speed matters at GB scale), written through tq's
//! streaming writer in 16 MiB chunks.

use tq::gguf::{GgufWriter, TensorSpec, Value};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = args.first().expect("usage: gen_gguf OUT.gguf [--layers N]");
    let layers: u64 = args
        .iter()
        .position(|a| a == "--layers")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse().unwrap())
        .unwrap_or(10);
    let opt = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (h, ff, vocab, heads, heads_kv) = match opt("--shape").as_deref().unwrap_or("7b") {
        "7b" => (4096u64, 11008u64, 32000u64, 32u64, 32u64),
        "70b" => (8192, 28672, 32000, 64, 8),
        s => panic!("--shape {s}: expected 7b or 70b"),
    };
    let head_dim = h / heads;
    let kv = heads_kv * head_dim;
    let mut t: Vec<(String, Vec<u64>)> = vec![("token_embd.weight".into(), vec![h, vocab])];
    for l in 0..layers {
        t.push((format!("blk.{l}.attn_norm.weight"), vec![h]));
        t.push((format!("blk.{l}.attn_q.weight"), vec![h, h]));
        t.push((format!("blk.{l}.attn_k.weight"), vec![h, kv]));
        t.push((format!("blk.{l}.attn_v.weight"), vec![h, kv]));
        t.push((format!("blk.{l}.attn_output.weight"), vec![h, h]));
        t.push((format!("blk.{l}.ffn_norm.weight"), vec![h]));
        t.push((format!("blk.{l}.ffn_gate.weight"), vec![h, ff]));
        t.push((format!("blk.{l}.ffn_up.weight"), vec![h, ff]));
        t.push((format!("blk.{l}.ffn_down.weight"), vec![ff, h]));
    }
    t.push(("output_norm.weight".into(), vec![h]));
    t.push(("output.weight".into(), vec![h, vocab]));
    let mut md = vec![
        ("general.architecture".to_string(), Value::string("llama")),
        (
            "general.name".to_string(),
            Value::string("synthetic-7b-shapes"),
        ),
        ("llama.block_count".to_string(), Value::U32(layers as u32)),
        ("llama.embedding_length".to_string(), Value::U32(h as u32)),
        (
            "llama.feed_forward_length".to_string(),
            Value::U32(ff as u32),
        ),
        (
            "llama.attention.head_count".to_string(),
            Value::U32(heads as u32),
        ),
        // What llama.cpp's loader requires of a llama model (llama-quantize reads the hparams).
        ("llama.context_length".to_string(), Value::U32(4096)),
        (
            "llama.attention.head_count_kv".to_string(),
            Value::U32(heads_kv as u32),
        ),
        (
            "llama.rope.dimension_count".to_string(),
            Value::U32(head_dim as u32),
        ),
        (
            "llama.attention.layer_norm_rms_epsilon".to_string(),
            Value::F32(1e-5),
        ),
        ("general.file_type".to_string(), Value::U32(1)),
    ];
    if let Some(v) = opt("--vocab") {
        let f = tq::gguf::GgufFile::open(std::path::Path::new(&v)).expect("open --vocab GGUF");
        let kvs: Vec<(String, Value)> = f
            .metadata
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .cloned()
            .collect();
        assert!(!kvs.is_empty(), "{v}: no tokenizer.* keys");
        md.extend(kvs);
    }
    let specs: Vec<TensorSpec> = t
        .iter()
        .map(|(n, d)| {
            let (id, bpe) = if d.len() == 1 { (0, 4) } else { (1, 2) };
            TensorSpec {
                name: n.clone(),
                dims: d.clone(),
                type_id: id,
                size: d.iter().product::<u64>() * bpe,
            }
        })
        .collect();
    let mut w = GgufWriter::create(out, 3, &md, &specs).unwrap();
    let mut total = 0u64;
    for (i, s) in specs.iter().enumerate() {
        let n = (s.size / if s.type_id == 0 { 4 } else { 2 }) as usize;
        let mut done = 0usize;
        while done < n {
            let k = (n - done).min(8 << 20);
            let mut buf = Vec::with_capacity(k * 4);
            for j in done..done + k {
                // A small, varied, finite pattern: f16 of a sine-like sequence.
                let v = (((j as u64).wrapping_mul(2654435761).wrapping_add(i as u64) % 2001)
                    as f32
                    - 1000.0)
                    * 2e-5;
                if s.type_id == 0 {
                    buf.extend_from_slice(&(1.0f32).to_le_bytes());
                } else {
                    buf.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
                }
            }
            w.write_data(&buf).unwrap();
            done += k;
        }
        total += s.size;
    }
    w.finish().unwrap();
    eprintln!(
        "wrote {out}: {} tensors, {:.2} GB of tensor data",
        specs.len(),
        total as f64 / 1e9
    );
}
