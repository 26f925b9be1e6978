//! k-quant quantizers (Q2_K..Q6_K) against llama.cpp's own `llama-quantize` (no imatrix, so
//! ggml's `quantize_row_q*_K_ref`), byte for byte; and IQ4_NL / IQ4_XS the same way (no imatrix:
//! ggml's `quantize_iq4_nl` / `quantize_iq4_xs` with weights `x²`), recorded under the `iq4_*`
//! keys.
//!
//! * `synthetic_matches_recorded_llama_hashes`: deterministic synthetic F32 tensors (Gaussian,
//!   heavy-tailed, dynamic-range sweeps and edge rows: zeros, constants, 1e-30, subnormals, f16
//!   overflow of the super-scale, ...) quantized with our kernels must hash (blake3 of the tensor
//!   data) to what llama-quantize produced, recorded in `fixtures/kquants_expected.json` by
//!   `scripts/dev/kquants_llama_oracle.sh`. Runs everywhere, no llama.cpp needed.
//! * `synthetic_matches_llama_quantize_live`: with `$TQ_CACHE/llama.cpp/build/bin/llama-quantize`
//!   (`scripts/build-llama.sh`, which `scripts/test.sh` runs first; missing, the test is recorded
//!   as not run, a failure under `TQ_REQUIRE_DATA=1`), writes the synthetic F32 GGUF, runs
//!   `llama-quantize --pure` for every k-type and compares all bytes, reporting the first
//!   differing block. With `TQ_KQ_RECORD=1` it (re)writes the recorded hashes from llama's output.
//! * `iq4_*`: the same three checks for IQ4_NL / IQ4_XS (no extreme rows: llama-quantize rejects
//!   them, and ggml's `quantize_row_iq4_*_ref` is not what llama-quantize runs), and
//!   `iq4_weighted_is_no_worse_than_llama_imatrix`: with an imatrix (written by tq for the
//!   synthetic tensors, read by `llama-quantize --imatrix`), tq's importance-weighted encoder has
//!   no larger imatrix-weighted error `Σ imp·(x − q)²` than llama-quantize's, per type.
//! * `smollm2_ffn_down_matches_llama`: real weights — SmolLM2's Q4_1 `ffn_down` tensors (rows of
//!   1536 = 6 super-blocks) dequantized to f32 and quantized to every k-type must hash to the
//!   recorded llama-quantize output, and match it live (llama-quantize missing: recorded as above).

#[path = "../fixtures/mod.rs"]
mod fixtures;

use std::path::Path;
use std::process::Command;

use fixtures::gguf_gen::{gaussian, pseudo_bytes};
use fixtures::llama_oracle::{
    first_diff, llama_metadata, registry_bytes, run_llama, smollm2_ffn_down, ty, write_f32_gguf,
    Expected, Tensor, SMOLLM2_SHAPE,
};
use serde_json::{json, Value as Json};
use tq::types::{self, TensorType};

/// `general.name` of the F32 input files.
const NAME: &str = "tq k-quant oracle";

/// (type, llama-quantize ftype name whose default type it is).
const KTYPES: [(&str, &str); 5] = [
    ("q2_K", "Q2_K"),
    ("q3_K", "Q3_K"),
    ("q4_K", "Q4_K"),
    ("q5_K", "Q5_K"),
    ("q6_K", "Q6_K"),
];

/// The IQ4 types, checked the same way under their own keys.
const IQ4TYPES: [(&str, &str); 2] = [("iq4_nl", "IQ4_NL"), ("iq4_xs", "IQ4_XS")];

const EXPECTED: Expected = Expected {
    path: "fixtures/kquants_expected.json",
    about: "Facts from llama.cpp (the copy vendored in the PyPI sdist llama-cpp-python==0.3.36, built by scripts/build-llama.sh): blake3 of each tensor's data bytes. 'synthetic', 'smollm2_ffn_down' (k-quants) and 'iq4_synthetic', 'iq4_smollm2_ffn_down' (IQ4_NL, IQ4_XS): as written by llama-quantize --pure <in.gguf> <out.gguf> <TYPE> (no imatrix) from F32 input. 'ggml_ref_extreme': ggml's quantize_row_q*_K_ref called directly (llama-quantize rejects blocks with non-finite f16 scales). Recorded by scripts/dev/kquants_llama_oracle.sh; checked by tests/kquants_llama.rs.",
    script: "scripts/dev/kquants_llama_oracle.sh",
    record_var: "TQ_KQ_RECORD",
};

/// 32 edge rows of 256 values each.
fn edge_rows() -> Vec<f32> {
    let g = |seed: u64| gaussian(seed, 256, 1.0);
    let mut rows: Vec<Vec<f32>> = vec![
        vec![0.0; 256],                                  // zeros
        vec![0.5; 256],                                  // positive constant
        vec![-0.75; 256],                                // negative constant
        g(301).iter().map(|v| v * 1e-30).collect(),      // below GROUP_MAX_EPS
        g(302).iter().map(|v| v * 1e-38).collect(),      // f32 subnormals
        g(303).iter().map(|v| v.abs() + 0.1).collect(),  // all positive (min > 0)
        g(304).iter().map(|v| -v.abs() - 0.1).collect(), // all negative
    ];
    let mut spike = vec![0.0; 256];
    spike[37] = 3.0;
    rows.push(spike); // one spike in zeros
    rows.push((0..256).map(|i| (i % 16) as f32 - 8.0).collect()); // integer grid (ties)
    rows.push((0..256).map(|i| (i * 7 % 4) as f32).collect()); // exact 2-bit grid
    rows.push(
        (0..256)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect(),
    );
    rows.push(
        g(305)
            .iter()
            .enumerate()
            .map(|(i, v)| if i < 128 { 0.0 } else { *v })
            .collect(),
    ); // half zero
    rows.push((0..256).map(|i| (i % 64) as f32 * 0.5 - 16.0).collect()); // half-integer ties
    rows.push(g(306).iter().map(|v| v * 1e4).collect());
    rows.push(g(307).iter().map(|v| v * 6e4).collect());
    rows.push(g(308).iter().map(|v| v * 1e5).collect()); // near the largest finite Q2_K d
    rows.push(g(309).iter().map(|v| v * 2e4 + 3e4).collect()); // large, all positive
    rows.push((0..256).map(|i| (i % 31) as f32 / 31.0).collect()); // ramp
    rows.push(
        g(311)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 32 == 5 { 1e3 } else { v * 1e-3 })
            .collect(),
    ); // one outlier per sub-block
    rows.push(
        g(312)
            .iter()
            .zip(pseudo_bytes(313, 256))
            .map(|(v, b)| if b < 230 { 0.0 } else { *v })
            .collect(),
    ); // sparse
    rows.push(g(314).iter().map(|v| v + 5.0).collect());
    rows.push(g(315).iter().map(|v| v - 5.0).collect());
    rows.push(
        g(316)
            .iter()
            .enumerate()
            .map(|(i, v)| if (i / 16) % 2 == 0 { *v } else { v * 1e-6 })
            .collect(),
    ); // 16-groups alternating scale
    rows.push(
        g(317)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1u32 << (i / 32)) as f32)
            .collect(),
    ); // 32-groups growing scale
    rows.push(
        g(318)
            .iter()
            .enumerate()
            .map(|(i, v)| if (i / 16) % 2 == 1 { 0.0 } else { *v })
            .collect(),
    ); // every other group zero
    rows.push(g(319).iter().map(|v| v * 1e-15).collect()); // straddles GROUP_MAX_EPS
    rows.push(vec![-0.0; 256]); // negative zeros
    rows.push(
        (0..256)
            .map(|i| f32::from_bits(1 + i as u32 * 977) * if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect(),
    ); // tiny subnormal bit patterns
    rows.push((0..256).map(|i| ((i / 16) as f32 - 7.5) * 0.3).collect()); // constant per group
    rows.push(g(320).iter().map(|v| v * 0.02 + 0.001).collect());
    rows.push(
        g(321)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 16 == 0 { -4.0 } else { v * 0.5 })
            .collect(),
    ); // negative extreme per group
    rows.push(
        g(322)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 16 == 0 { 4.0 } else { v * 0.5 })
            .collect(),
    ); // positive extreme per group
    assert_eq!(rows.len(), 32);
    rows.concat()
}

/// Rows whose f16 super-scales overflow (inf) or whose intermediate sums overflow f32 (inf/NaN
/// inside the search). llama-quantize refuses to write such blocks (its output validation rejects
/// non-finite d/dmin), so these are checked against ggml's `quantize_row_q*_K_ref` called
/// directly (see `extreme_rows_match_recorded_ggml_ref`).
fn extreme_rows() -> Vec<f32> {
    let g = |seed: u64| gaussian(seed, 256, 1.0);
    [
        g(308).iter().map(|v| v * 1e6).collect::<Vec<f32>>(), // Q2_K d overflows f16
        g(309).iter().map(|v| v * 1e8).collect(),             // every d overflows but Q6_K's
        g(310).iter().map(|v| v * 1e15).collect(),
        g(401).iter().map(|v| v * 1e20).collect(), // x*x overflows
        g(402).iter().map(|v| v * 3e37).collect(), // x - min overflows
        g(403)
            .iter()
            .enumerate()
            .map(|(i, v)| if i == 100 { 3e38 } else { *v })
            .collect(),
        (0..256)
            .map(|i| if i % 2 == 0 { 3.4e38 } else { -3.4e38 })
            .collect(),
        g(404)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 16 == 3 { -2e6 } else { *v })
            .collect(), // Q2_K dmin overflows f16
    ]
    .concat()
}

/// The deterministic synthetic tensors (all 2-D, rows a multiple of 256).
fn synthetic() -> Vec<Tensor> {
    let mut ts = Vec::new();
    let mut add = |name: &str, cols: u64, rows: u64, data: Vec<f32>| {
        assert_eq!(data.len() as u64, cols * rows, "{name}");
        ts.push(Tensor {
            name: name.to_string(),
            dims: [cols, rows],
            data,
        });
    };
    add(
        "blk.0.attn_q.weight",
        256,
        96,
        gaussian(101, 256 * 96, 0.02),
    );
    let ranged = fixtures::llama_oracle::ranged_rows(64);
    add("blk.0.ffn_up.weight", 512, 64, ranged);
    let heavy = fixtures::llama_oracle::heavy_rows(48);
    add("blk.0.ffn_down.weight", 768, 48, heavy);
    add("blk.0.attn_output.weight", 256, 32, edge_rows());
    add(
        "blk.1.ffn_gate.weight",
        1024,
        24,
        fixtures::gguf_gen::uniform(105, 1024 * 24),
    );
    ts
}

fn ktype(name: &str) -> TensorType {
    ty(name)
}

fn ours(ty: TensorType, t: &Tensor) -> Vec<u8> {
    registry_bytes(ty, t)
}

fn expected() -> Json {
    EXPECTED.load()
}

fn record(key: &str, section: Json) {
    EXPECTED.record(key, section)
}

fn recording() -> bool {
    EXPECTED.recording()
}

#[test]
fn synthetic_matches_recorded_llama_hashes() {
    recorded_synthetic(&KTYPES, "synthetic");
}

#[test]
fn iq4_synthetic_matches_recorded_llama_hashes() {
    recorded_synthetic(&IQ4TYPES, "iq4_synthetic");
}

fn recorded_synthetic(tys: &[(&str, &str)], key: &str) {
    let exp = expected();
    let exp = &exp[key];
    let ts = synthetic();
    let mut bad = Vec::new();
    let mut n = 0;
    for &(tname, _) in tys {
        let ty = ktype(tname);
        for t in &ts {
            let want = exp[tname][&t.name]
                .as_str()
                .unwrap_or_else(|| panic!("no recorded hash for {tname} {}", t.name));
            let got = fixtures::blake3_hex(&ours(ty, t));
            if got != want {
                bad.push(format!("{tname} {}", t.name));
            }
            n += 1;
        }
    }
    assert!(bad.is_empty(), "differ from llama-quantize: {bad:?}");
    eprintln!("{n} (type, tensor) pairs byte-identical to the recorded llama-quantize output");
}

#[test]
fn synthetic_matches_llama_quantize_live() {
    let Some(bin) = fixtures::llama_quantize() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("synthetic-f32.gguf");
    let ts = synthetic();
    write_f32_gguf(&inp, llama_metadata(NAME, 2, 256, 4), &ts);
    compare_live(&bin, &inp, &ts, &KTYPES, "synthetic", dir.path());
}

#[test]
fn iq4_synthetic_matches_llama_quantize_live() {
    let Some(bin) = fixtures::llama_quantize() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("synthetic-f32.gguf");
    let ts = synthetic();
    write_f32_gguf(&inp, llama_metadata(NAME, 2, 256, 4), &ts);
    compare_live(&bin, &inp, &ts, &IQ4TYPES, "iq4_synthetic", dir.path());
}

/// With an importance matrix, tq's weighted encoder (`--imatrix`: the block scales searched under
/// the importance, codes nearest on the stored f16 grid) against `llama-quantize --imatrix` (its
/// own search, weights `imp·sqrt(σ² + x²)`): the imatrix-weighted error of every type and
/// synthetic tensor must be no larger than llama.cpp's (measured 0.83–0.95×).
#[test]
fn iq4_weighted_is_no_worse_than_llama_imatrix() {
    let Some(bin) = fixtures::llama_quantize() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("synthetic-f32.gguf");
    let ts = synthetic();
    write_f32_gguf(&inp, llama_metadata(NAME, 2, 256, 4), &ts);
    // Per-column importance with a wide spread (1/100 .. 100), as real imatrices have.
    let diag: Vec<tq::quant::Diagonal> = ts
        .iter()
        .enumerate()
        .map(|(k, t)| tq::quant::Diagonal {
            tensors: vec![t.name.clone()],
            tokens: 64,
            d: fixtures::gguf_gen::uniform(900 + k as u64, t.dims[0] as usize)
                .iter()
                .map(|u| 64.0 * 10f64.powf(2.0 * *u as f64))
                .collect(),
        })
        .collect();
    let im = dir.path().join("imatrix.gguf");
    tq::calib::imatrix::write_gguf(&diag, &im, "synthetic", 64).unwrap();
    let imx = tq::calib::imatrix::load(&im).unwrap();
    for (tname, ftype) in IQ4TYPES {
        let ty = ktype(tname);
        let out = dir.path().join(format!("im-{tname}.gguf"));
        let theirs = run_llama(&bin, &inp, &out, ftype, Some(&im));
        let (mut e_ours, mut e_llama, mut e_rtn) = (0f64, 0f64, 0f64);
        for t in &ts {
            let imp = imx.for_tensor(&t.name).unwrap();
            let n = t.dims[0] as usize;
            let ob =
                tq::quant::encode_rows(ty, &t.name, &t.data, n, &tq::quant::Encoder::Weighted(imp))
                    .unwrap();
            let err = |b: &[u8]| {
                let mut y = vec![0f32; t.data.len()];
                types::dequantize(ty, b, &mut y, &t.name).unwrap();
                let mut e = 0f64;
                for (i, (a, b)) in t.data.iter().zip(&y).enumerate() {
                    e += imp[i % n] as f64 * ((a - b) as f64).powi(2);
                }
                e
            };
            let (eo, el, er) = (err(&ob), err(&theirs[&t.name].1), err(&ours(ty, t)));
            eprintln!(
                "{tname} {}: imatrix-weighted error tq {eo:.4e}, llama-quantize --imatrix {el:.4e} ({:.3}x), no imatrix {er:.4e}",
                t.name,
                eo / el
            );
            assert!(eo <= el, "{tname} {}: {eo} vs llama {el}", t.name);
            e_ours += eo;
            e_llama += el;
            e_rtn += er;
        }
        eprintln!(
            "{tname}: total tq {e_ours:.4e} vs llama {e_llama:.4e} ({:.3}x; no imatrix {:.3}x)",
            e_ours / e_llama,
            e_rtn / e_llama
        );
        assert!(e_llama < e_rtn, "{tname}: llama's imatrix was not used");
    }
}

/// Quantize `ts` with llama-quantize and with ours for every type of `tys`; all bytes must match.
fn compare_live(
    bin: &Path,
    inp: &Path,
    ts: &[Tensor],
    tys: &[(&str, &str)],
    key: &str,
    dir: &Path,
) {
    let mut section = serde_json::Map::new();
    let mut problems = Vec::new();
    for &(tname, ftype) in tys {
        let ty = ktype(tname);
        let out = dir.join(format!("{key}-{tname}.gguf"));
        let theirs = run_llama(bin, inp, &out, ftype, None);
        std::fs::remove_file(&out).ok();
        let mut hashes = serde_json::Map::new();
        let (mut blocks, mut same_tensors) = (0usize, 0usize);
        for t in ts {
            let (lty, lb) = theirs
                .get(&t.name)
                .unwrap_or_else(|| panic!("{} missing from llama output", t.name));
            assert_eq!(
                *lty, ty,
                "{}: llama-quantize --pure wrote {lty}, not {ty}",
                t.name
            );
            hashes.insert(t.name.clone(), json!(fixtures::blake3_hex(lb)));
            let ob = ours(ty, t);
            match first_diff(ty, t, &ob, lb) {
                None => {
                    same_tensors += 1;
                    blocks += ob.len() / ty.block_bytes();
                }
                Some(d) => problems.push(d),
            }
        }
        eprintln!(
            "{key} {tname}: {same_tensors}/{} tensors, {blocks} blocks byte-identical to llama-quantize",
            ts.len()
        );
        section.insert(tname.to_string(), Json::Object(hashes));
    }
    if recording() {
        record(key, Json::Object(section));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Extreme rows (f16 overflow of d/dmin, f32 overflow inside the search) against ggml's
/// `quantize_row_q*_K_ref` called directly: `$TQ_KQ_GGML_REF` names a small harness
/// (`kq TYPE in.f32 out.bin`, TYPE 2..6) that `scripts/build-ggml-ref.sh` compiles from
/// llama.cpp's `ggml-quants.c` with ggml-base's flags (`scripts/test.sh` builds it and sets the
/// variable; unset, the live part is recorded as not run). Recorded hashes are checked everywhere.
#[test]
fn extreme_rows_match_recorded_ggml_ref() {
    let t = Tensor {
        name: "extreme".into(),
        dims: [256, 8],
        data: extreme_rows(),
    };
    let live = std::env::var("TQ_KQ_GGML_REF")
        .ok()
        .filter(|v| !v.is_empty());
    if live.is_none() {
        fixtures::not_run(
            "live comparison with ggml's quantize_row_q*_K_ref: TQ_KQ_GGML_REF unset \
             (scripts/build-ggml-ref.sh builds the harness; scripts/test.sh sets it)",
        );
    }
    if let Some(bin) = live {
        let dir = tempfile::tempdir().unwrap();
        let inp = dir.path().join("extreme.f32");
        let b: Vec<u8> = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&inp, b).unwrap();
        let mut section = serde_json::Map::new();
        let mut problems = Vec::new();
        for (tname, _) in KTYPES {
            let ty = ktype(tname);
            let out = dir.path().join(format!("extreme.{tname}"));
            let st = Command::new(&bin)
                .arg(&tname[1..2])
                .arg(&inp)
                .arg(&out)
                .status()
                .expect("run ggml ref harness");
            assert!(st.success(), "{bin} failed");
            let theirs = std::fs::read(&out).unwrap();
            section.insert(
                tname.to_string(),
                json!({ "extreme": fixtures::blake3_hex(&theirs) }),
            );
            let ob = ours(ty, &t);
            match first_diff(ty, &t, &ob, &theirs) {
                None => eprintln!(
                    "extreme {tname}: {} blocks byte-identical to ggml's quantize_row_{tname}_ref",
                    ob.len() / ty.block_bytes()
                ),
                Some(d) => problems.push(d),
            }
        }
        if recording() {
            record("ggml_ref_extreme", Json::Object(section));
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
    let exp = expected();
    for (tname, _) in KTYPES {
        let want = exp["ggml_ref_extreme"][tname]["extreme"]
            .as_str()
            .unwrap_or_else(|| panic!("no recorded hash for {tname} extreme"));
        assert_eq!(
            fixtures::blake3_hex(&ours(ktype(tname), &t)),
            want,
            "{tname} extreme rows"
        );
    }
}

#[test]
fn smollm2_ffn_down_matches_llama() {
    smollm2_matches(&KTYPES, "smollm2_ffn_down");
}

#[test]
fn iq4_smollm2_ffn_down_matches_llama() {
    smollm2_matches(&IQ4TYPES, "iq4_smollm2_ffn_down");
}

fn smollm2_matches(tys: &[(&str, &str)], key: &str) {
    let Some(ts) = smollm2_ffn_down() else { return };
    if let Some(bin) = fixtures::llama_quantize() {
        let dir = tempfile::tempdir().unwrap();
        let inp = dir.path().join("smollm2-ffn_down-f32.gguf");
        let (l, e, h) = SMOLLM2_SHAPE;
        write_f32_gguf(&inp, llama_metadata(NAME, l, e, h), &ts);
        compare_live(&bin, &inp, &ts, tys, key, dir.path());
    }
    let exp = expected();
    let exp = &exp[key];
    let mut bad = Vec::new();
    for &(tname, _) in tys {
        let ty = ktype(tname);
        for t in &ts {
            let want = exp[tname][&t.name]
                .as_str()
                .unwrap_or_else(|| panic!("no recorded hash for {tname} {}", t.name));
            if fixtures::blake3_hex(&ours(ty, t)) != want {
                bad.push(format!("{tname} {}", t.name));
            }
        }
    }
    assert!(bad.is_empty(), "differ from llama-quantize: {bad:?}");
}

/// Single-thread throughput of the k-quant quantizers (M values/s):
/// `cargo test --release --test kquants_llama throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput() {
    let x = gaussian(9, 1 << 22, 0.02);
    for (tname, _) in KTYPES {
        let ty = ktype(tname);
        let q = ty.info().quantize.unwrap();
        let mut out = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
        q(&x, &mut out);
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t0 = std::time::Instant::now();
            q(std::hint::black_box(&x), &mut out);
            best = best.min(t0.elapsed().as_secs_f64());
        }
        eprintln!("{tname}: {:.1} M values/s", x.len() as f64 / best / 1e6);
    }
}
