//! Dev tool: write a large GGUF with a real model's tensor shapes and deterministic f16 data, for
//! memory/speed benchmarks of `tq convert` on models bigger than this machine likes.
//!
//!   cargo run --release --example gen_gguf -- OUT.gguf [--shape 7b] [--layers N]
//!
//! Shapes: `7b` = llama-2-7B (hidden 4096, ffn 11008, vocab 32000, 32 heads). Data is a cheap
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
    let (h, ff, vocab) = (4096u64, 11008u64, 32000u64);
    let mut t: Vec<(String, Vec<u64>)> = vec![("token_embd.weight".into(), vec![h, vocab])];
    for l in 0..layers {
        t.push((format!("blk.{l}.attn_norm.weight"), vec![h]));
        for n in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            t.push((format!("blk.{l}.{n}.weight"), vec![h, h]));
        }
        t.push((format!("blk.{l}.ffn_norm.weight"), vec![h]));
        t.push((format!("blk.{l}.ffn_gate.weight"), vec![h, ff]));
        t.push((format!("blk.{l}.ffn_up.weight"), vec![h, ff]));
        t.push((format!("blk.{l}.ffn_down.weight"), vec![ff, h]));
    }
    t.push(("output_norm.weight".into(), vec![h]));
    t.push(("output.weight".into(), vec![h, vocab]));
    let md = vec![
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
        ("llama.attention.head_count".to_string(), Value::U32(32)),
        // What llama.cpp's loader requires of a llama model (llama-quantize reads the hparams).
        ("llama.context_length".to_string(), Value::U32(4096)),
        ("llama.attention.head_count_kv".to_string(), Value::U32(32)),
        ("llama.rope.dimension_count".to_string(), Value::U32(128)),
        (
            "llama.attention.layer_norm_rms_epsilon".to_string(),
            Value::F32(1e-5),
        ),
        ("general.file_type".to_string(), Value::U32(1)),
    ];
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
