//! Test data for the harness: the PRNG and sample generators, the real shapes, query rotation, and
//! the conformance vectors (finding, loading).

use crate::error::{Error, Result};
use crate::types::turbo;
use crate::types::TensorType;
use std::path::{Path, PathBuf};

/// SplitMix64 with Box–Muller Gaussians (the conformance generator's PRNG; inputs only).
pub use crate::math::splitmix::SplitMix64 as Rng;
pub use crate::numerics::sample::{dots_of, random_activation, random_weights, reference_dots};

/// A weight or KV tensor shape to test on.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub rows: usize,
    pub cols: usize,
}

/// SmolLM2-135M's weight shapes (hidden 576, 9 heads / 3 KV heads of 64, FFN 1536), ggml
/// order: `rows` output features of `cols` inputs.
pub fn smollm2_weight_shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "smollm2.attn_q",
            rows: 576,
            cols: 576,
        },
        Shape {
            name: "smollm2.attn_k",
            rows: 192,
            cols: 576,
        },
        Shape {
            name: "smollm2.ffn_up",
            rows: 1536,
            cols: 576,
        },
        Shape {
            name: "smollm2.ffn_down",
            rows: 576,
            cols: 1536,
        },
    ]
}

/// KV-cache shapes for turbo: one row per (token, KV head), `cols` = head dim (128: Llama-3-8B,
/// 8 KV heads; 256: Gemma-style heads, two groups per row).
pub fn kv_shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "llama3-8b.k_cache[512 tok x 8 heads, hd 128]",
            rows: 4096,
            cols: 128,
        },
        Shape {
            name: "gemma.k_cache[128 tok x 4 heads, hd 256]",
            rows: 512,
            cols: 256,
        },
    ]
}

/// Forward turbo rotation of a query row (each 128-group separately, as the engine rotates Q).
pub fn rotate_query(q: &[f32]) -> Vec<f32> {
    rotate_query_groups(q, turbo::QK_TURBO)
}

/// The same for `group`-value groups (64: first 64 signs and 1/8, FORMATS.md §3).
pub fn rotate_query_groups(q: &[f32], group: usize) -> Vec<f32> {
    let mut out = q.to_vec();
    for g in out.chunks_exact_mut(group) {
        turbo::rotate_forward_n(g);
    }
    out
}

/// One conformance file: every case's packed row, back to back.
pub struct Conformance {
    pub file: PathBuf,
    pub cases: Vec<(String, Vec<u8>)>,
    /// Each case's f32 input (`input_f32`; empty when the file has none).
    pub inputs: Vec<Vec<f32>>,
}

/// The conformance file name for a type (`tq4_1s.json`, `turbo3_0.json`; tq2_r: the seed
/// design's `seed2bit.json`).
pub fn conformance_file(ty: TensorType) -> String {
    if ty.is_row_rotated() {
        "seed2bit.json".into()
    } else if ty.is_turbo() {
        format!("{}_0.json", ty.name())
    } else {
        format!("{}.json", ty.name())
    }
}

/// Where the conformance vectors are: `$TQ_CONFORMANCE`, then `shared/conformance` and
/// `../shared/conformance` beside the current directory and the source tree.
pub fn find_conformance_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("TQ_CONFORMANCE") {
        return Some(PathBuf::from(d));
    }
    let mut bases = vec![];
    if let Ok(c) = std::env::current_dir() {
        bases.push(c);
    }
    bases.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for b in bases {
        for rel in [
            "shared/conformance",
            "../shared/conformance",
            "../../shared/conformance",
        ] {
            let p = b.join(rel);
            if p.join("tq4_1s.json").exists() {
                return Some(p);
            }
        }
    }
    None
}

/// Read the packed rows of a conformance file.
pub fn load_conformance(dir: &Path, ty: TensorType) -> Result<Conformance> {
    let file = dir.join(conformance_file(ty));
    let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
    let bad = |what: &str| {
        Error::bad_input(
            &file,
            format!("{what} (not a turboquant-conformance/v1 file?)"),
        )
    };
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|_| bad("not JSON"))?;
    if doc["block_bytes"].as_u64() != Some(ty.block_bytes() as u64) {
        return Err(bad("block_bytes does not match the type"));
    }
    let mut cases = vec![];
    let mut inputs = vec![];
    for c in doc["cases"].as_array().ok_or_else(|| bad("no cases"))? {
        let input = match c["input_f32"].as_array() {
            Some(a) => a
                .iter()
                .map(|h| {
                    h.as_str()
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                        .map(f32::from_bits)
                })
                .collect::<Option<Vec<f32>>>()
                .ok_or_else(|| bad("bad input_f32"))?,
            None => vec![],
        };
        inputs.push(input);
        let id = c["id"].as_str().unwrap_or("?").to_string();
        let hex = c["expected_bytes"]
            .as_str()
            .ok_or_else(|| bad("case without expected_bytes"))?;
        if hex.len() % 2 != 0 {
            return Err(bad("odd hex length"));
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|_| bad("bad hex"))?;
        if bytes.len() % ty.block_bytes() != 0 {
            return Err(bad("a case is not a whole number of blocks"));
        }
        cases.push((id, bytes));
    }
    Ok(Conformance {
        file,
        cases,
        inputs,
    })
}

/// One `pack2bit` or `requant2bit` case of the seed design's vectors (`seed2bit.json`) as a 2-bit
/// matrix in the design's layout.
#[derive(Clone, Debug)]
pub(crate) struct Seed2bitCase {
    pub id: String,
    pub op: String,
    pub rows: usize,
    /// Row length of the codes (`K`; `Kp` for `requant2bit`, whose rows are zero-padded).
    pub cols: usize,
    pub incoherent: bool,
    pub qw: Vec<u32>,
    pub sc: Vec<f32>,
    /// `pack2bit`: the input weights and the expected reconstruction (empty for `requant2bit`).
    pub w: Vec<f32>,
    pub deq: Vec<f32>,
}

/// The `pack2bit` and `requant2bit` cases of `dir/seed2bit.json` (the other ops are encoders
/// with no kernel).
pub(crate) fn load_seed2bit(dir: &Path) -> Result<Vec<Seed2bitCase>> {
    let file = dir.join("seed2bit.json");
    let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
    let bad = |what: String| Error::bad_input(&file, format!("{what} (not the seed2bit vectors?)"));
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|_| bad("not JSON".into()))?;
    let mut out = vec![];
    for c in doc["cases"]
        .as_array()
        .ok_or_else(|| bad("no cases".into()))?
    {
        let id = c["id"].as_str().unwrap_or("?").to_string();
        let op = c["op"].as_str().unwrap_or("").to_string();
        if op != "pack2bit" && op != "requant2bit" {
            continue;
        }
        let count = |k: &str| {
            c[k].as_u64()
                .filter(|&v| v > 0 && v <= 1 << 24)
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("case {id}: `{k}` is not a count")))
        };
        let words = |k: &str| -> Result<Vec<u32>> {
            c[k].as_array()
                .ok_or_else(|| bad(format!("case {id}: no `{k}`")))?
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| bad(format!("case {id}: `{k}` holds {v}")))
                })
                .collect()
        };
        let floats = |k: &str| -> Result<Vec<f32>> {
            Ok(words(k)?.into_iter().map(f32::from_bits).collect())
        };
        let rows = count("N")?;
        let (cols, incoherent, w, deq) = if op == "pack2bit" {
            let inc = c["incoherent"]
                .as_bool()
                .ok_or_else(|| bad(format!("case {id}: `incoherent` is not true/false")))?;
            (count("K")?, inc, floats("w")?, floats("deq")?)
        } else {
            (count("Kp")?, true, vec![], vec![])
        };
        let (qw, sc) = (words("qw")?, floats("sc")?);
        let case = Seed2bitCase {
            id,
            op,
            rows,
            cols,
            incoherent,
            qw,
            sc,
            w,
            deq,
        };
        let n = rows * cols;
        let ok = cols % 32 == 0
            && case.qw.len() == n / 16
            && case.sc.len() == n / 32
            && (case.op != "pack2bit" || (case.w.len() == n && case.deq.len() == n));
        if !ok {
            return Err(bad(format!("case {}: arrays do not match N x K", case.id)));
        }
        out.push(case);
    }
    Ok(out)
}
