//! Dev tool: write a large GGUF with a real model's tensor shapes and deterministic f16 data, for
//! memory/speed benchmarks of `tq convert` on models bigger than this machine likes.
//!
//!   cargo run --release --example gen_gguf -- OUT.gguf [--shape 7b|70b|30b-a3b] [--layers N] [--vocab V.gguf]
//!
//! Shapes: `7b` = llama-2-7B (hidden 4096, ffn 11008, vocab 32000, 32 heads); `70b` = llama-2-70B
//! (hidden 8192, ffn 28672, 64 heads, 8 KV heads); `30b-a3b` = Qwen3-30B-A3B (qwen3moe: hidden
//! 2048, 128 experts of FFN 768, 8 used, 32 heads of 128, 4 KV heads, vocab 151936). `--vocab` copies the `tokenizer.*` keys of a
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
    let shape = opt("--shape").unwrap_or_else(|| "7b".into());
    // (hidden, ffn, vocab, heads, kv heads, head dim, experts (count, used, ffn each)).
    let (h, ff, vocab, heads, heads_kv, head_dim, moe) = match shape.as_str() {
        "7b" => (4096u64, 11008u64, 32000u64, 32u64, 32u64, 128u64, None),
        "70b" => (8192, 28672, 32000, 64, 8, 128, None),
        // Qwen3-30B-A3B (config.json): 48 blocks, 128 experts of FFN 768, 8 used, head dim 128
        // (the query is 4096 wide on a 2048 residual), per-head q/k norms, vocab 151936.
        "30b-a3b" => (2048, 6144, 151936, 32, 4, 128, Some((128u64, 8u64, 768u64))),
        s => panic!("--shape {s}: expected 7b, 70b or 30b-a3b"),
    };
    let arch = if moe.is_some() { "qwen3moe" } else { "llama" };
    let qd = heads * head_dim;
    let kv = heads_kv * head_dim;
    let mut t: Vec<(String, Vec<u64>)> = vec![("token_embd.weight".into(), vec![h, vocab])];
    for l in 0..layers {
        t.push((format!("blk.{l}.attn_norm.weight"), vec![h]));
        t.push((format!("blk.{l}.attn_q.weight"), vec![h, qd]));
        t.push((format!("blk.{l}.attn_k.weight"), vec![h, kv]));
        t.push((format!("blk.{l}.attn_v.weight"), vec![h, kv]));
        t.push((format!("blk.{l}.attn_output.weight"), vec![qd, h]));
        t.push((format!("blk.{l}.ffn_norm.weight"), vec![h]));
        match moe {
            None => {
                t.push((format!("blk.{l}.ffn_gate.weight"), vec![h, ff]));
                t.push((format!("blk.{l}.ffn_up.weight"), vec![h, ff]));
                t.push((format!("blk.{l}.ffn_down.weight"), vec![ff, h]));
            }
            Some((n_exp, _, ffe)) => {
                t.push((format!("blk.{l}.attn_q_norm.weight"), vec![head_dim]));
                t.push((format!("blk.{l}.attn_k_norm.weight"), vec![head_dim]));
                t.push((format!("blk.{l}.ffn_gate_inp.weight"), vec![h, n_exp]));
                t.push((format!("blk.{l}.ffn_gate_exps.weight"), vec![h, ffe, n_exp]));
                t.push((format!("blk.{l}.ffn_up_exps.weight"), vec![h, ffe, n_exp]));
                t.push((format!("blk.{l}.ffn_down_exps.weight"), vec![ffe, h, n_exp]));
            }
        }
    }
    t.push(("output_norm.weight".into(), vec![h]));
    t.push(("output.weight".into(), vec![h, vocab]));
    let k = |s: &str| format!("{arch}.{s}");
    let mut md = vec![
        ("general.architecture".to_string(), Value::string(arch)),
        (
            "general.name".to_string(),
            Value::string(&format!("synthetic-{shape}-shapes")),
        ),
        (k("block_count"), Value::U32(layers as u32)),
        (k("embedding_length"), Value::U32(h as u32)),
        (k("feed_forward_length"), Value::U32(ff as u32)),
        (k("attention.head_count"), Value::U32(heads as u32)),
        // What llama.cpp's loader requires of a llama model (llama-quantize reads the hparams).
        (k("context_length"), Value::U32(4096)),
        (k("attention.head_count_kv"), Value::U32(heads_kv as u32)),
        (k("rope.dimension_count"), Value::U32(head_dim as u32)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        ("general.file_type".to_string(), Value::U32(1)),
    ];
    if let Some((n_exp, used, ffe)) = moe {
        md.push((k("attention.key_length"), Value::U32(head_dim as u32)));
        md.push((k("attention.value_length"), Value::U32(head_dim as u32)));
        md.push((k("expert_count"), Value::U32(n_exp as u32)));
        md.push((k("expert_used_count"), Value::U32(used as u32)));
        md.push((k("expert_feed_forward_length"), Value::U32(ffe as u32)));
        md.push((k("rope.freq_base"), Value::F32(1e6)));
    }
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
