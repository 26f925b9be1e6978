//! ggml block kernels against independent references.
//!
//! * gguf-py (llama.cpp's Python package, numpy kernels): `scripts/oracle/quants.py` writes its
//!   dequantization of real SmolLM2 tensor slices and of blocks of every type it can decode, its
//!   own quantization of test rows, its F16/BF16 conversions and its `GGML_QUANT_SIZES` into
//!   `$TQ_CACHE/oracle/quants/`. Our kernels must agree bit for bit (f32) / byte for byte.
//!   `scripts/oracle/quants_iq.py` adds structured blocks of the grid, ternary and FP4 types that
//!   use every grid row, sign pattern, scale code and scale byte (`$TQ_CACHE/oracle/quants_iq/`).
//! * llama.cpp itself: the SmolLM2 Q4_1 GGUF was written by llama.cpp's reference quantizers, so
//!   dequantizing every Q4_1 tensor and the Q8_0 `token_embd.weight` and quantizing them again
//!   must give back the file's bytes exactly.
//!
//! Missing data skips (or fails under `TQ_REQUIRE_DATA=1`), see `fixtures/mod.rs`.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use std::path::{Path, PathBuf};

use serde_json::Value;
use tq::gguf::GgufFile;
use tq::types::{self, float, Family, Origin, TensorType, TYPES};

fn index() -> Option<(PathBuf, Value)> {
    let p = fixtures::oracle("quants/index.json")?;
    let v: Value =
        serde_json::from_slice(&std::fs::read(&p).expect("read index.json")).expect("index.json");
    Some((p.parent().unwrap().to_path_buf(), v))
}

fn read(dir: &Path, name: &Value) -> Vec<u8> {
    let name = name.as_str().expect("file name");
    std::fs::read(dir.join(name))
        .unwrap_or_else(|e| panic!("{name}: {e} (re-run scripts/oracle.sh)"))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn ty(name: &str) -> TensorType {
    TensorType::from_name(name)
        .unwrap_or_else(|| panic!("oracle type {name} unknown to the registry"))
}

/// Bit-compare `ours` with `theirs`; NaN only as NaN-ness. Returns a description of the first
/// few mismatches (empty when equal).
fn diff_f32(what: &str, ours: &[f32], theirs: &[f32], block: usize) -> Vec<String> {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    let mut bad = Vec::new();
    let mut n = 0usize;
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        if !same {
            n += 1;
            if bad.len() < 5 {
                bad.push(format!(
                    "{what}: element {i} (block {}): ours {a:e} ({:08x}), gguf-py {b:e} ({:08x})",
                    i / block,
                    a.to_bits(),
                    b.to_bits()
                ));
            }
        }
    }
    if n > 0 {
        bad.push(format!("{what}: {n} of {} values differ", ours.len()));
    }
    bad
}

fn diff_bytes(what: &str, ours: &[u8], theirs: &[u8], block_bytes: usize) -> Vec<String> {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    let mut bad = Vec::new();
    let mut n = 0usize;
    for (k, (a, b)) in ours
        .chunks(block_bytes)
        .zip(theirs.chunks(block_bytes))
        .enumerate()
    {
        if a != b {
            n += 1;
            if bad.len() < 5 {
                bad.push(format!(
                    "{what}: block {k}: ours {a:02x?}, reference {b:02x?}"
                ));
            }
        }
    }
    if n > 0 {
        bad.push(format!(
            "{what}: {n} of {} blocks differ",
            ours.len() / block_bytes
        ));
    }
    bad
}

#[test]
fn registry_sizes_match_gguf_py() {
    let Some((_, idx)) = index() else { return };
    let sizes = idx["sizes"].as_array().expect("sizes");
    let mut seen = Vec::new();
    for s in sizes {
        let name = s["name"].as_str().unwrap();
        let id = s["id"].as_u64().unwrap() as u32;
        let (bs, ts) = (
            s["block_size"].as_u64().unwrap() as usize,
            s["type_size"].as_u64().unwrap() as usize,
        );
        let ours = TYPES
            .iter()
            .find(|t| t.origin == Origin::Stock(id))
            .unwrap_or_else(|| panic!("gguf-py type {name} (id {id}) missing from the registry"));
        assert!(
            ours.name.eq_ignore_ascii_case(name),
            "id {id}: gguf-py {name}, registry {}",
            ours.name
        );
        if ours.ty == TensorType::Q8_1 && (bs, ts) == (32, 40) {
            // gguf-py still lists block_q8_1 with f32 d and s (4 + 4 + 32 bytes); ggml's struct
            // has been two f16 (2 + 2 + 32 = 36) for years. The registry follows ggml.
            assert_eq!((ours.block_size, ours.block_bytes), (32, 36));
        } else {
            assert_eq!(
                (ours.block_size, ours.block_bytes),
                (bs, ts),
                "{name}: (block size, bytes)"
            );
        }
        seen.push(ours.ty);
    }
    for t in TYPES {
        if let Origin::Stock(id) = t.origin {
            if t.ty == TensorType::Q2_0 {
                // Newer than gguf-py 0.19 (its ids end at Q1_0 = 41); held to ggml's struct by
                // the unit test types::tests::ids_past_gguf_py_match_ggml.
                continue;
            }
            assert!(
                seen.contains(&t.ty),
                "registry type {} (id {id}) unknown to gguf-py",
                t.name
            );
        }
    }
    eprintln!(
        "{} gguf-py sizes compared (Q8_1: 36 in ggml, 40 in gguf-py's stale table)",
        sizes.len()
    );
}

#[test]
fn dequantize_real_smollm2_slices_bit_exact() {
    let Some((dir, idx)) = index() else { return };
    let Some(path) = fixtures::smollm2() else {
        return;
    };
    let f = GgufFile::open(&path).expect("open SmolLM2");
    let mut bad = Vec::new();
    let mut values = 0usize;
    for e in idx["tensors"].as_array().expect("tensors") {
        let name = e["name"].as_str().unwrap();
        let t = f
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} not in the GGUF"));
        assert!(
            t.ty.name()
                .eq_ignore_ascii_case(e["type"].as_str().unwrap()),
            "{name}: type"
        );
        let (r0, nr, rl) = (
            e["row_start"].as_u64().unwrap() as usize,
            e["n_rows"].as_u64().unwrap() as usize,
            e["row_len"].as_u64().unwrap() as usize,
        );
        assert_eq!(rl as u64, t.row_len());
        let row_bytes = rl / t.ty.block_size() * t.ty.block_bytes();
        let data = &f.tensor_data(t)[r0 * row_bytes..(r0 + nr) * row_bytes];
        let mut ours = vec![0f32; nr * rl];
        types::dequantize(t.ty, data, &mut ours, name).unwrap();
        let theirs = f32s(&read(&dir, &e["f32"]));
        bad.extend(diff_f32(
            &format!("{name} rows {r0}..{}", r0 + nr),
            &ours,
            &theirs,
            t.ty.block_size(),
        ));
        values += ours.len();
    }
    assert!(
        bad.is_empty(),
        "dequantization differs from gguf-py:\n{}",
        bad.join("\n")
    );
    eprintln!("{} real-tensor values bit-identical with gguf-py", values);
}

/// Types gguf-py 0.19 cannot decode, so an oracle cannot cover them (Q1_0 / Q2_0 are held to
/// ggml's structs by hand-made blocks in `types::legacy`).
const NO_GGUF_PY_DECODER: &[TensorType] = &[
    TensorType::Q8_1,
    TensorType::Q8K,
    TensorType::Q1_0,
    TensorType::Q2_0,
];

#[test]
fn dequantize_blocks_bit_exact_all_types() {
    let Some((dir, idx)) = index() else { return };
    let mut bad = Vec::new();
    let mut covered = Vec::new();
    let mut report = Vec::new();
    let mut without_kernel = Vec::new();
    for e in idx["blocks"].as_array().expect("blocks") {
        let t = ty(e["type"].as_str().unwrap());
        let set = e["set"].as_str().unwrap();
        let Some(deq) = t.info().dequantize else {
            without_kernel.push(format!("{t}"));
            continue;
        };
        let blocks = read(&dir, &e["blocks"]);
        let theirs = f32s(&read(&dir, &e["f32"]));
        let n = e["n_blocks"].as_u64().unwrap() as usize;
        assert_eq!(blocks.len(), n * t.block_bytes(), "{t}.{set}: file size");
        let mut ours = vec![0f32; n * t.block_size()];
        deq(&blocks, &mut ours);
        bad.extend(diff_f32(
            &format!("{t}.{set}"),
            &ours,
            &theirs,
            t.block_size(),
        ));
        covered.push(t);
        report.push(format!("{t}.{set}: {n}"));
    }
    // Every stock block type we can decode must be covered by the oracle.
    for info in TYPES {
        let stock = matches!(info.origin, Origin::Stock(_));
        if stock
            && info.block_size > 1
            && info.dequantize.is_some()
            && !NO_GGUF_PY_DECODER.contains(&info.ty)
        {
            assert!(
                covered.contains(&info.ty),
                "{} has a dequantizer but no gguf-py oracle blocks",
                info.name
            );
        }
    }
    assert!(
        bad.is_empty(),
        "dequantization differs from gguf-py:\n{}",
        bad.join("\n")
    );
    without_kernel.dedup();
    eprintln!("blocks bit-identical with gguf-py: {}", report.join(", "));
    if !without_kernel.is_empty() {
        eprintln!(
            "no tq dequantizer (not compared): {}",
            without_kernel.join(", ")
        );
    }
}

/// Structured blocks of the grid, ternary and FP4 types (`scripts/oracle/quants_iq.py`): every
/// grid index, sign pattern, scale code, delta sign and scale byte, with edge f16 scales. The
/// script asserts that coverage; this test checks the record of it and every value's bits.
#[test]
fn dequantize_structured_iq_blocks_bit_exact() {
    let Some(p) = fixtures::oracle("quants_iq/index.json") else {
        return;
    };
    let dir = p.parent().unwrap().to_path_buf();
    let idx: Value = serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json");
    let mut bad = Vec::new();
    let mut covered = Vec::new();
    let mut report = Vec::new();
    for e in idx["blocks"].as_array().expect("blocks") {
        let t = ty(e["type"].as_str().unwrap());
        let deq = t
            .info()
            .dequantize
            .unwrap_or_else(|| panic!("{t}: no dequantizer"));
        for (field, c) in e["coverage"].as_object().expect("coverage") {
            let (seen, all) = (c[0].as_u64().unwrap(), c[1].as_u64().unwrap());
            assert_eq!(seen, all, "{t}: {field}: only {seen} of {all} covered");
        }
        let blocks = read(&dir, &e["blocks"]);
        let theirs = f32s(&read(&dir, &e["f32"]));
        let n = e["n_blocks"].as_u64().unwrap() as usize;
        assert_eq!(blocks.len(), n * t.block_bytes(), "{t}: file size");
        let mut ours = vec![0f32; n * t.block_size()];
        deq(&blocks, &mut ours);
        bad.extend(diff_f32(
            &format!("{t}.structured"),
            &ours,
            &theirs,
            t.block_size(),
        ));
        covered.push(t);
        report.push(format!("{t}: {n}"));
    }
    // Every grid, ternary and FP4 type gguf-py decodes must be here (IQ4_NL / IQ4_XS have no
    // grid: quants.py's random blocks cover their 16 codes).
    for info in TYPES {
        let grid_like = matches!(info.family, Family::IQuant | Family::Ternary | Family::Fp4)
            && !matches!(info.ty, TensorType::IQ4NL | TensorType::IQ4XS);
        assert!(
            !grid_like || covered.contains(&info.ty),
            "{} has no structured oracle blocks",
            info.name
        );
    }
    assert!(
        bad.is_empty(),
        "dequantization differs from gguf-py:\n{}",
        bad.join("\n")
    );
    eprintln!(
        "structured blocks bit-identical with gguf-py: {}",
        report.join(", ")
    );
}

#[test]
fn quantize_matches_gguf_py_bytes() {
    let Some((dir, idx)) = index() else { return };
    let mut bad = Vec::new();
    let mut report = Vec::new();
    for e in idx["blocks"].as_array().expect("blocks") {
        if e.get("input").is_none() {
            continue;
        }
        let t = ty(e["type"].as_str().unwrap());
        if t.info().quantize.is_none() {
            continue;
        }
        let x = f32s(&read(&dir, &e["input"]));
        let theirs = read(&dir, &e["blocks"]);
        let mut ours = vec![0u8; theirs.len()];
        types::quantize(t, &x, &mut ours, "oracle input").unwrap();
        bad.extend(diff_bytes(&format!("{t}"), &ours, &theirs, t.block_bytes()));
        report.push(format!("{t}: {}", theirs.len() / t.block_bytes()));
    }
    assert!(
        bad.is_empty(),
        "quantization differs from gguf-py:\n{}",
        bad.join("\n")
    );
    assert!(!report.is_empty());
    eprintln!(
        "blocks byte-identical with gguf-py's quantizers: {}",
        report.join(", ")
    );
}

/// The strongest check: llama.cpp wrote this file; its Q4_1 and Q8_0 tensors, dequantized and
/// quantized again by tq, must come back byte for byte.
#[test]
fn requantize_smollm2_byte_exact() {
    let Some(path) = fixtures::smollm2() else {
        return;
    };
    let f = GgufFile::open(&path).expect("open SmolLM2");
    let targets: Vec<_> = f
        .tensors
        .iter()
        .filter(|t| {
            t.ty == TensorType::Q4_1 || (t.ty == TensorType::Q8_0 && t.name == "token_embd.weight")
        })
        .collect();
    let n_q4_1 = targets.iter().filter(|t| t.ty == TensorType::Q4_1).count();
    assert_eq!(n_q4_1, 210, "SmolLM2 has 210 Q4_1 tensors");
    assert_eq!(targets.len(), 211, "token_embd.weight (Q8_0) missing");
    let mut bad = Vec::new();
    let mut blocks = 0usize;
    let results: Vec<(usize, Vec<String>)> = {
        use rayon::prelude::*;
        targets
            .par_iter()
            .map(|t| {
                let x = f.tensor_f32(t).expect("dequantize");
                let orig = f.tensor_data(t);
                let mut ours = vec![0u8; orig.len()];
                types::quantize(t.ty, &x, &mut ours, &t.name).expect("quantize");
                (
                    orig.len() / t.ty.block_bytes(),
                    diff_bytes(&t.name, &ours, orig, t.ty.block_bytes()),
                )
            })
            .collect()
    };
    for (n, b) in results {
        blocks += n;
        bad.extend(b);
    }
    assert!(
        bad.is_empty(),
        "re-quantization differs from the llama.cpp file:\n{}",
        bad.join("\n")
    );
    eprintln!(
        "{} tensors ({} blocks) re-quantized byte-identical with llama.cpp's file",
        targets.len(),
        blocks
    );
}

#[test]
fn f16_bf16_match_gguf_py() {
    let Some((dir, idx)) = index() else { return };
    let fl = &idx["float"];
    let x = f32s(&read(&dir, &fl["input"]));
    for (t, key, all_key) in [
        (TensorType::F16, "f16", "f16_all_f32"),
        (TensorType::BF16, "bf16", "bf16_all_f32"),
    ] {
        let theirs = read(&dir, &fl[key]);
        let mut ours = vec![0u8; x.len() * 2];
        (t.info().quantize.unwrap())(&x, &mut ours);
        let mut bad = Vec::new();
        for (i, (a, b)) in u16s(&ours).iter().zip(u16s(&theirs)).enumerate() {
            if *a != b && bad.len() < 5 {
                bad.push(format!(
                    "{t}: input {i} ({:e}): ours {a:04x}, gguf-py {b:04x}",
                    x[i]
                ));
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        // Decoding: all 65536 bit patterns.
        let pats: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
        let mut dec = vec![0f32; 65536];
        (t.info().dequantize.unwrap())(&pats, &mut dec);
        let d = diff_f32(
            &format!("{t} decode"),
            &dec,
            &f32s(&read(&dir, &fl[all_key])),
            1,
        );
        assert!(d.is_empty(), "{}", d.join("\n"));
    }
    eprintln!(
        "f16/bf16: {} encodings and all 65536 decodings each identical with gguf-py",
        x.len()
    );
}

/// No data needed: every non-NaN f16/bf16 decodes and encodes back to itself, and the scalar
/// helpers agree with the slice kernels.
#[test]
fn f16_bf16_round_trip_all_patterns() {
    for t in [TensorType::F16, TensorType::BF16] {
        let pats: Vec<u16> = (0..=u16::MAX).collect();
        let bytes: Vec<u8> = pats.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut dec = vec![0f32; pats.len()];
        (t.info().dequantize.unwrap())(&bytes, &mut dec);
        let keep: Vec<usize> = (0..pats.len()).filter(|&i| !dec[i].is_nan()).collect();
        let src: Vec<f32> = keep.iter().map(|&i| dec[i]).collect();
        let mut enc = vec![0u8; src.len() * 2];
        (t.info().quantize.unwrap())(&src, &mut enc);
        for (k, &i) in keep.iter().enumerate() {
            let back = u16::from_le_bytes([enc[2 * k], enc[2 * k + 1]]);
            assert_eq!(
                back, pats[i],
                "{t}: {:04x} -> {:e} -> {back:04x}",
                pats[i], dec[i]
            );
        }
        if t == TensorType::F16 {
            for &i in &keep {
                assert_eq!(float::f16_bits_to_f32(pats[i]).to_bits(), dec[i].to_bits());
                assert_eq!(float::f32_to_f16_bits(dec[i]), pats[i]);
            }
        }
        let n_nan = pats.len() - keep.len();
        assert_eq!(
            n_nan,
            if t == TensorType::F16 { 2046 } else { 254 },
            "{t} NaN count"
        );
    }
}
