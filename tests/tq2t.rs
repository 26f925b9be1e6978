//! `tq2_t` (trellis-coded 2-bit, issue 19) through `tq convert` and the reader: bytes equal to the
//! registry's row quantizer, the rotation recorded, its own type id, token_embd's and short rows'
//! fallbacks, thread independence, `--dry-run` sizes, and `tq validate` reading it back.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use std::path::{Path, PathBuf};
use tq::gguf::GgufFile;
use tq::types::{tq2r, TensorType};

fn model(dir: &Path, n_embd: u64) -> PathBuf {
    // Rows of n_embd and 192 (3 trellis blocks; 192 = 12·16 is a Paley rotation).
    let fx = fixtures::gguf_gen::tiny_llama(2, n_embd, 192, 64);
    let p = dir.join("in.gguf");
    std::fs::write(&p, &fx.bytes).unwrap();
    p
}

fn convert(inp: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec!["convert", s(inp), "--weights", "tq2_t", "-o", s(out)];
    args.extend_from_slice(extra);
    let (code, _, err) = tq(&args);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn convert_writes_registry_bytes_its_id_and_the_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let inp = model(dir.path(), 128);
    let out = dir.path().join("out.gguf");
    convert(&inp, &out, &["--threads", "1"]);
    let src = GgufFile::open(&inp).unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.get_str(tq2r::META_ROTATION), Some(tq2r::ROTATION_ID));
    let mut n2 = 0;
    for (t, st) in f.tensors.iter().zip(&src.tensors) {
        if t.dims.len() == 1 {
            continue;
        }
        if t.name == "token_embd.weight" {
            assert_eq!(t.ty, TensorType::Q8_0, "token_embd falls back");
            continue;
        }
        assert_eq!((t.ty, t.type_id), (TensorType::TQ2T, 121), "{}", t.name);
        n2 += 1;
        let k = t.dims[0] as usize;
        let x = src.tensor_f32(st).unwrap();
        let mut want = vec![0u8; t.size as usize];
        tq::types::quantize_rows(TensorType::TQ2T, &x, &mut want, k, &t.name).unwrap();
        assert!(f.tensor_data(t) == &want[..], "{}", t.name);
        assert_eq!(t.size as usize, x.len() / 64 * 17, "2.125 bpw");
        let y = f.tensor_f32(t).unwrap();
        let e: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let nmse = e / x.iter().map(|a| (*a as f64).powi(2)).sum::<f64>();
        assert!(nmse > 0.04 && nmse < 0.11, "{}: nmse {nmse}", t.name);
    }
    assert_eq!(n2, 15);
    let out3 = dir.path().join("out3.gguf");
    convert(&inp, &out3, &["--threads", "3"]);
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&out3).unwrap());
    // Read back by the validator (structure, dequantization of every tensor).
    let (code, o, err) = tq(&["validate", s(&out), "--gen-prompts", "0", "-q"]);
    assert_eq!(code, 0, "{o}\n{err}");
}

#[test]
fn short_rows_fall_back_and_dry_run_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let inp = model(dir.path(), 96);
    let (code, o, err) = tq(&["convert", s(&inp), "--weights", "tq2_t", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    // ffn_down: 96 rows of 192 → 96 · 3 blocks · 17 bytes.
    let line = |name: &str| {
        o.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{o}"))
            .to_string()
    };
    let l = line("blk.0.ffn_down.weight");
    assert!(l.contains("tq2_t") && l.contains(" 4896 "), "{l}");
    // Rows of 96 are not whole trellis blocks: tq2_r (32-value blocks) instead.
    let l = line("blk.0.attn_q.weight");
    assert!(l.contains("tq2_r"), "{l}");
    assert!(o.contains("fallback tq2_t -> tq2_r: row length 96"), "{o}");
}

/// `tq validate --kernels cpu`: every tq2_t tensor's sampled rows through the tq2_t kernels (the
/// CPU statement of their arithmetic: trellis decode, tq2_r's inverse row rotation, rotation +
/// GEMV) against the CPU reference, every row of rows of 128 (power of two) and 192 (Paley).
#[test]
fn validate_runs_the_kernels_on_tq2t_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let inp = model(dir.path(), 128);
    let out = dir.path().join("out.gguf");
    convert(&inp, &out, &[]);
    let (code, o, err) = tq(&[
        "validate",
        s(&out),
        "--kernels",
        "cpu",
        "--full",
        "--gen-prompts",
        "0",
        "-q",
    ]);
    assert_eq!(code, 0, "{o}\n{err}");
    let line = o
        .lines()
        .find(|l| l.contains("kernels/cpu-emulation"))
        .unwrap_or_else(|| panic!("{o}"));
    assert!(line.contains(" pass "), "{line}");
    assert!(line.contains("15 tensors"), "{line}");
    assert!(line.contains("every row"), "{line}");
    assert!(line.contains("dequantize bit-exact"), "{line}");
}
