//! Block-major evaluation (issue 29, item 2): a pass of windows advances block by block, each
//! block's weights loaded once per pass, and every number must be bit for bit what the
//! batch-major order gives (each batch through every block, a block loaded per batch — the
//! order `tq eval` had before, and what `--pass-windows` equal to `--batch` still runs).
//!
//! The oracle for the model-level test is [`Model::blocks`] run batch by batch (the public
//! batch-major API); for the commands it is the same command in the batch-major order: PPL,
//! KLD, every per-window PPL and the saved logits files must be equal to the bit.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::tq;
use std::path::Path;
use tq::gguf::GgufFile;
use tq::model::{Batches, Model, Numerics};

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    fixtures::gguf_gen::pseudo_bytes(seed, n * 2)
        .chunks(2)
        .map(|c| (u16::from_le_bytes([c[0], c[1]]) as usize % vocab) as u32)
        .collect()
}

#[test]
fn blocks_major_equals_blocks_batch_by_batch() {
    let fx = fixtures::gguf_gen::tiny_llama(3, 64, 128, 100);
    check_block_orders(&fx.bytes);
}

/// The same on the MoE fixtures: in a block-major pass an expert is loaded when the first batch
/// routed to it needs it and kept for the pass's other batches (batch-major loads it per batch),
/// and the states must still be equal to the bit.
#[test]
fn blocks_major_equals_blocks_batch_by_batch_on_moe() {
    for name in ["qwen3moe", "mixtral", "mixtral-ties"] {
        let bytes = fixtures::arch_gen::arch_fixture(name).unwrap();
        check_block_orders(&bytes);
    }
}

/// [`Model::blocks_major`] against [`Model::blocks`] batch by batch on the model `bytes`.
fn check_block_orders(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, bytes).unwrap();
    let f = GgufFile::open(&p).unwrap();
    for numerics in [Numerics::F32, Numerics::Ggml] {
        let m = Model::new(&f, numerics).unwrap();
        let n = m.cfg.n_layer;
        let vocab = m.cfg.n_vocab.min(100);
        let (seq, out_from) = (16, 8);
        // Batches of 2, 2 and 1 windows (the last one smaller, as at the end of a text).
        let sizes = [2usize, 2, 1];
        let toks: Vec<Vec<u32>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &w)| tokens(w * seq, vocab, 7 + i as u64))
            .collect();
        for from in [0, 1, n] {
            // Batch-major: each batch's embeddings through blocks 0..from, then from..n.
            let mut want = Vec::new();
            let mut start = Vec::new();
            for (t, &w) in toks.iter().zip(&sizes) {
                let x = m.embed(t).unwrap();
                let x = m.blocks(w, seq, out_from, 0..from, x, None).unwrap();
                start.push((w, x.clone()));
                want.push(m.blocks(w, seq, out_from, from..n, x, None).unwrap());
            }
            let mut b = Batches {
                seq,
                out_from,
                batches: start,
            };
            let mut calls = Vec::new();
            m.blocks_major(&mut b, from..n, &mut |l, i| calls.push((l, i)))
                .unwrap();
            // Block-major order: every batch through block l before block l + 1.
            let order: Vec<(usize, usize)> = (from..n)
                .flat_map(|l| (0..sizes.len()).map(move |i| (l, i)))
                .collect();
            assert_eq!(calls, order);
            for (i, ((w, got), want)) in b.batches.iter().zip(&want).enumerate() {
                assert_eq!(*w, sizes[i]);
                // After the last block only the output rows remain.
                let rows = w * (seq - out_from);
                assert_eq!(got.len(), rows * m.cfg.n_embd);
                let same = got
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same && got.len() == want.len(),
                    "{numerics:?} from block {from}, batch {i}: block-major states differ"
                );
            }
        }
    }
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `tq eval ARGS --json` with `--pass-windows PASS` (None: the default), its JSON with the
/// timings and the pass size removed.
fn eval(args: &[&str], pass: Option<&str>) -> (serde_json::Value, u64) {
    let mut a: Vec<&str> = vec!["eval"];
    a.extend(args);
    a.extend(["--json", "-q"]);
    if let Some(p) = pass {
        a.extend(["--pass-windows", p]);
    }
    let (code, out, err) = tq(&a);
    assert_eq!(code, 0, "tq {a:?}: {err}");
    let mut j = json(&out);
    let pw = j["pass_windows"].as_u64().expect("pass_windows reported");
    for k in ["seconds", "tokens_per_second"] {
        j["result"].as_object_mut().unwrap().remove(k);
    }
    j.as_object_mut().unwrap().remove("pass_windows");
    (j, pw)
}

/// PPL, KLD (against a reference model and against saved logits) and the saved logits of a
/// block-major run equal the batch-major run's, bit for bit.
fn check_eval_orders(model: &Path, text: &Path, ctx: &str, chunks: &str, batch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = (model.to_str().unwrap(), text.to_str().unwrap());
    let (la, lb) = (dir.path().join("a.logits"), dir.path().join("b.logits"));
    let base = ["-f", t, "--ctx", ctx, "--chunks", chunks, "--batch", batch];
    let mut a_args = vec![m];
    a_args.extend(base);
    a_args.extend(["--save-logits", la.to_str().unwrap()]);
    let mut b_args = vec![m];
    b_args.extend(base);
    b_args.extend(["--save-logits", lb.to_str().unwrap()]);
    let (stream, pw) = eval(&a_args, None);
    let (batch_major, pw1) = eval(&b_args, Some(batch));
    let n_chunk = stream["result"]["n_chunk"].as_u64().unwrap();
    let b: u64 = batch.parse().unwrap();
    assert!(n_chunk > b, "the test needs more than one batch");
    assert_eq!(pw, n_chunk, "the default pass holds every window here");
    assert_eq!(pw1, b);
    assert_eq!(stream, batch_major, "PPL of the two orders");
    assert_eq!(
        std::fs::read(&la).unwrap(),
        std::fs::read(&lb).unwrap(),
        "saved logits of the two orders"
    );
    // KLD against a reference model run beside (the model itself with an f16 cache against a
    // bf16 cache), block-major in passes of two batches against batch-major. Both K and V in
    // bf16: on the tiny fixture the attention is near uniform, so K's rounding alone can leave
    // every logit's bits as they were (a KLD of exactly 0 would make the comparison vacuous).
    let two = (2 * b).to_string();
    let mut k_args = vec![m];
    k_args.extend(base);
    k_args.extend(["--ref", m, "--ctk", "bf16", "--ctv", "bf16"]);
    let (k2, pw2) = eval(&k_args, Some(&two));
    let (k1, _) = eval(&k_args, Some(batch));
    assert_eq!(pw2, (2 * b).min(n_chunk.div_ceil(b) * b));
    assert!(k1["result"]["kld"]["kld"]["value"].as_f64().unwrap() > 0.0);
    assert_eq!(k2, k1, "KLD against a reference model");
    // KLD against the saved logits.
    let r_args = [
        m,
        "--ref-logits",
        la.to_str().unwrap(),
        "--batch",
        batch,
        "--ctv",
        "bf16",
    ];
    let (r2, _) = eval(&r_args, None);
    let (r1, _) = eval(&r_args, Some(batch));
    assert_eq!(r2, r1, "KLD against saved logits");
}

#[test]
fn eval_block_major_equals_batch_major_on_a_fixture() {
    let fx = fixtures::gguf_gen::tiny_llama_tok(3, 64, 128);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tiny.gguf");
    std::fs::write(&p, &fx.bytes).unwrap();
    let text = dir.path().join("t.txt");
    let words = "the quick brown fox jumps over the lazy dog, he said; ".repeat(12);
    std::fs::write(&text, words).unwrap();
    check_eval_orders(&p, &text, "16", "7", "2");
}

#[test]
fn eval_block_major_equals_batch_major_on_smollm2() {
    let (Some(smol), Some(text)) = (fixtures::smollm2(), fixtures::botchan()) else {
        eprintln!("skipped: SmolLM2 or Botchan not in the cache (scripts/fetch-data.sh)");
        return;
    };
    check_eval_orders(&smol, &text, "128", "5", "2");
}

/// `tq validate` (block-major in its default passes) reports the PPL and KLD that `tq eval`
/// computes batch-major on the same windows.
#[test]
fn validate_equals_batch_major_eval() {
    let fx = fixtures::gguf_gen::tiny_llama_tok(3, 64, 128);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tiny.gguf");
    std::fs::write(&p, &fx.bytes).unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "she sells sea shells by the sea shore; ".repeat(16)).unwrap();
    let (m, t) = (p.to_str().unwrap(), text.to_str().unwrap());
    let args = ["-f", t, "--ctx", "16", "--chunks", "6", "--batch", "2"];
    let mut v = vec!["validate", m, "--ref", m, "--json", "-q"];
    v.extend(args);
    let (_, out, err) = tq(&v);
    let vj = json(&out);
    let q = &vj["quality"];
    assert!(q.is_object(), "validate reported no quality: {out} {err}");
    let mut e = vec![m, "--ref", m];
    e.extend(args);
    let (ej, _) = eval(&e, Some("2"));
    let r = &ej["result"];
    assert_eq!(q["windows"].as_u64(), r["n_chunk"].as_u64());
    assert_eq!(q["ppl"]["value"].as_f64(), r["ppl"]["value"].as_f64());
    assert_eq!(
        q["kld"]["value"].as_f64(),
        r["kld"]["kld"]["value"].as_f64()
    );
}
