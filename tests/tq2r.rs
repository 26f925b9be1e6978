//! `tq2_r` (the seed design's 2-bit rotated weights) through `tq convert` and the reader: bytes
//! equal to the registry's row quantizer, the rotation recorded, token_embd's fallback, thread
//! independence, a file without its rotation key refused, the id overridable by a type map, and
//! the artifact's own blocks through the GPU kernels' arithmetic (`tq validate --kernels cpu`).

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use std::path::{Path, PathBuf};
use tq::gguf::GgufFile;
use tq::types::{tq2r, TensorType};

fn model(dir: &Path) -> PathBuf {
    // Rows of 96 and 192 (12·8, 12·16: Paley rotations, not powers of two) and 64 (power of two).
    let fx = fixtures::gguf_gen::tiny_llama(2, 96, 192, 64);
    let p = dir.join("in.gguf");
    std::fs::write(&p, &fx.bytes).unwrap();
    p
}

fn convert(inp: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec!["convert", s(inp), "--weights", "tq2_r", "-o", s(out)];
    args.extend_from_slice(extra);
    let (code, _, err) = tq(&args);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn convert_writes_registry_bytes_and_the_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let inp = model(dir.path());
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
        assert_eq!(t.ty, TensorType::TQ2R, "{}", t.name);
        assert_eq!(t.type_id, 120, "fork profile id");
        n2 += 1;
        let k = t.dims[0] as usize;
        let x = src.tensor_f32(st).unwrap();
        let mut want = vec![0u8; t.size as usize];
        tq::types::quantize_rows(TensorType::TQ2R, &x, &mut want, k, &t.name).unwrap();
        assert!(f.tensor_data(t) == &want[..], "{}", t.name);
        assert_eq!(t.size as usize, x.len() / 32 * 10, "2.5 bpw");
        // Read back through the registry: a 2-bit reconstruction (NMSE of the 4-level grid).
        let y = f.tensor_f32(t).unwrap();
        let e: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let nmse = e / x.iter().map(|a| (*a as f64).powi(2)).sum::<f64>();
        assert!(nmse > 0.05 && nmse < 0.16, "{}: nmse {nmse}", t.name);
    }
    assert_eq!(n2, 15);
    // Any thread count, same bytes.
    let out3 = dir.path().join("out3.gguf");
    convert(&inp, &out3, &["--threads", "3"]);
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&out3).unwrap());
}

#[test]
fn a_file_without_its_rotation_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let inp = model(dir.path());
    let out = dir.path().join("out.gguf");
    convert(&inp, &out, &["--no-provenance"]);
    let mut bytes = std::fs::read(&out).unwrap();
    let key = tq2r::META_ROTATION.as_bytes();
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
    bytes[at + key.len() - 1] = b'X'; // same length, another key
    let bad = dir.path().join("norot.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let (code, _, err) = tq(&["inspect", s(&bad)]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("norot.gguf") && err.contains("no tq.tq2_r.rotation key"),
        "{err}"
    );
    // An unknown rotation value: change one byte of the value.
    let mut bytes = std::fs::read(&out).unwrap();
    let val = tq2r::ROTATION_ID.as_bytes();
    let at = bytes.windows(val.len()).position(|w| w == val).unwrap();
    bytes[at + val.len() - 1] = b'9';
    std::fs::write(&bad, &bytes).unwrap();
    let (code, _, err) = tq(&["inspect", s(&bad)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a rotation this tq does not know"), "{err}");
}

#[test]
fn type_map_overrides_the_id_and_dry_run_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let inp = model(dir.path());
    let map = dir.path().join("map.json");
    std::fs::write(
        &map,
        r#"{"name": "mine", "types": {"tq2_r": 200, "tq4_1s": 46}}"#,
    )
    .unwrap();
    let out = dir.path().join("out.gguf");
    convert(&inp, &out, &["--type-map", s(&map)]);
    let f =
        GgufFile::open_with(&out, &tq::types::profile::Profile::from_file(&map).unwrap()).unwrap();
    let t = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((t.ty, t.type_id), (TensorType::TQ2R, 200));
    let (code, o, err) = tq(&["convert", s(&inp), "--weights", "tq2_r", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    // ffn_down: 96 rows of 192 → 96 · 6 blocks · 10 bytes.
    let line = o
        .lines()
        .find(|l| l.starts_with("blk.0.ffn_down.weight"))
        .unwrap();
    assert!(line.contains("tq2_r") && line.contains(" 5760 "), "{line}");
    assert!(o.contains("fallback tq2_r -> q8_0: token_embd"), "{o}");
}

/// `tq validate --kernels cpu`: every tq2_r tensor's sampled rows through the tq2_r kernels (the
/// CPU emulation of their arithmetic: decode, inverse row rotation, rotation + GEMV) against the
/// CPU reference — rows of 96 and 192 (Paley) and 64 (power of two).
#[test]
fn validate_runs_the_kernels_on_tq2r_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let inp = model(dir.path());
    let out = dir.path().join("out.gguf");
    convert(&inp, &out, &[]);
    let (code, o, err) = tq(&[
        "validate",
        s(&out),
        "--kernels",
        "cpu",
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
    assert!(line.contains("dequantize bit-exact"), "{line}");
}
