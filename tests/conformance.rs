//! Bit-exactness against the fork's conformance vectors (`../shared/conformance/*.json`).
//!
//! For every case: quantize `input_f32` and compare the bytes exactly with `expected_bytes`;
//! dequantize `expected_bytes` and compare bit for bit with `expected_dequant_f32` (where the
//! expected value is NaN, only NaN-ness is compared). Failures print the case id, block index and
//! the differing bytes / values; every mismatch of a file is collected before the test fails.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use ::tq::types::tq as tqs;
use ::tq::types::turbo;
use serde_json::Value;

type QFn = fn(&[f32], &mut [u8]);
type DFn = fn(&[u8], &mut [f32]);

fn hex_bytes(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex byte"))
        .collect()
}

fn f32_list(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of hex u32")
        .iter()
        .map(|h| u32::from_str_radix(h.as_str().expect("hex string"), 16).expect("hex u32"))
        .collect()
}

#[derive(Default, Debug)]
struct Counts {
    cases: usize,
    blocks: usize,
    q_cases_ok: usize,
    q_blocks_ok: usize,
    dq_cases_ok: usize,
    dq_blocks_ok: usize,
}

fn run_file(file: &str, block: usize, bytes: usize, quantize: QFn, dequantize: DFn) -> Counts {
    let path = fixtures::conformance(file);
    let text = std::fs::read_to_string(&path).expect("read conformance file");
    let doc: Value = serde_json::from_str(&text).expect("parse conformance json");
    assert_eq!(
        doc["block_elements"].as_u64(),
        Some(block as u64),
        "{file}: block_elements"
    );
    assert_eq!(
        doc["block_bytes"].as_u64(),
        Some(bytes as u64),
        "{file}: block_bytes"
    );
    let cases = doc["cases"].as_array().expect("cases");
    assert_eq!(
        doc["case_count"].as_u64(),
        Some(cases.len() as u64),
        "{file}: case_count"
    );

    let mut c = Counts::default();
    let mut failures = Vec::new();
    for case in cases {
        let id = case["id"].as_str().unwrap_or("?");
        let n = case["n"].as_u64().expect("n") as usize;
        let input: Vec<f32> = f32_list(&case["input_f32"])
            .into_iter()
            .map(f32::from_bits)
            .collect();
        let expected = hex_bytes(case["expected_bytes"].as_str().expect("expected_bytes"));
        let expected_dq = f32_list(&case["expected_dequant_f32"]);
        assert_eq!(input.len(), n, "{file}/{id}: input length");
        assert_eq!(n % block, 0, "{file}/{id}: n not a whole number of blocks");
        let nb = n / block;
        assert_eq!(
            expected.len(),
            nb * bytes,
            "{file}/{id}: expected_bytes length"
        );
        assert_eq!(expected_dq.len(), n, "{file}/{id}: expected_dequant length");
        c.cases += 1;
        c.blocks += nb;

        // Quantize.
        let mut got = vec![0u8; nb * bytes];
        quantize(&input, &mut got);
        let mut q_ok = true;
        for b in 0..nb {
            let (g, e) = (
                &got[b * bytes..(b + 1) * bytes],
                &expected[b * bytes..(b + 1) * bytes],
            );
            if g == e {
                c.q_blocks_ok += 1;
            } else {
                q_ok = false;
                let diff: Vec<String> = (0..bytes)
                    .filter(|&i| g[i] != e[i])
                    .map(|i| format!("[{i}] got {:02x} want {:02x}", g[i], e[i]))
                    .collect();
                failures.push(format!(
                    "{file} {id} block {b}: quantize bytes differ: {}",
                    diff.join(", ")
                ));
            }
        }
        c.q_cases_ok += q_ok as usize;

        // Dequantize the expected bytes.
        let mut out = vec![0f32; n];
        dequantize(&expected, &mut out);
        let mut dq_ok = true;
        for b in 0..nb {
            let mut diffs = Vec::new();
            for j in b * block..(b + 1) * block {
                let (g, e) = (out[j].to_bits(), expected_dq[j]);
                let same = if f32::from_bits(e).is_nan() {
                    out[j].is_nan()
                } else {
                    g == e
                };
                if !same {
                    diffs.push(format!("[{}] got {g:08x} want {e:08x}", j - b * block));
                }
            }
            if diffs.is_empty() {
                c.dq_blocks_ok += 1;
            } else {
                dq_ok = false;
                let more = if diffs.len() > 8 {
                    format!(" (+{} more)", diffs.len() - 8)
                } else {
                    String::new()
                };
                diffs.truncate(8);
                failures.push(format!(
                    "{file} {id} block {b}: dequant differs: {}{more}",
                    diffs.join(", ")
                ));
            }
        }
        c.dq_cases_ok += dq_ok as usize;
    }
    eprintln!(
        "{file}: {} cases / {} blocks; quantize: {} cases, {} blocks exact; dequantize: {} cases, {} blocks exact",
        c.cases, c.blocks, c.q_cases_ok, c.q_blocks_ok, c.dq_cases_ok, c.dq_blocks_ok
    );
    if !failures.is_empty() {
        for f in failures.iter().take(40) {
            eprintln!("{f}");
        }
        panic!(
            "{file}: {} block mismatches (first 40 shown)",
            failures.len()
        );
    }
    c
}

#[test]
fn conformance_tq4_1s() {
    let c = run_file(
        "tq4_1s.json",
        32,
        20,
        tqs::quantize_tq4_1s,
        tqs::dequantize_tq4_1s,
    );
    assert_eq!(c.cases, 220);
}

#[test]
fn conformance_tq4_1s_ref() {
    let c = run_file(
        "tq4_1s.json",
        32,
        20,
        tqs::quantize_tq4_1s_ref,
        tqs::dequantize_tq4_1s_ref,
    );
    assert_eq!(c.cases, 220);
}

#[test]
fn conformance_tq3_1s() {
    let c = run_file(
        "tq3_1s.json",
        32,
        16,
        tqs::quantize_tq3_1s,
        tqs::dequantize_tq3_1s,
    );
    assert_eq!(c.cases, 220);
}

#[test]
fn conformance_turbo2() {
    let c = run_file(
        "turbo2_0.json",
        128,
        34,
        turbo::quantize_turbo2,
        turbo::dequantize_turbo2,
    );
    assert_eq!(c.cases, 203);
}

#[test]
fn conformance_turbo3() {
    let c = run_file(
        "turbo3_0.json",
        128,
        50,
        turbo::quantize_turbo3,
        turbo::dequantize_turbo3,
    );
    assert_eq!(c.cases, 203);
}

#[test]
fn conformance_turbo4() {
    let c = run_file(
        "turbo4_0.json",
        128,
        68,
        turbo::quantize_turbo4,
        turbo::dequantize_turbo4,
    );
    assert_eq!(c.cases, 203);
}
