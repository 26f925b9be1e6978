//! Issue 17 measurement: the two ways tq2_r can hold a non-power-of-two row, on a real model's
//! weights — the Paley/DCT whole-row rotation tq writes (2.5 bpw) and the seed design's zero
//! padding to the next power of two (exact, Kp/K the bytes). Prints, per tensor kind, the
//! normalized reconstruction error ‖w − ŵ‖² / ‖w‖² of round-to-nearest and the bytes of each.
//!
//!   cargo run --release --example tq2r_padding -- MODEL.gguf [--layers N]

use tq::gguf::GgufFile;
use tq::types::{tq2r, TensorType};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .expect("usage: tq2r_padding MODEL.gguf [--layers N]");
    let layers: usize = args
        .iter()
        .position(|a| a == "--layers")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse().expect("--layers N"))
        .unwrap_or(usize::MAX);
    let f = GgufFile::open(path).expect("open model");
    println!("| tensor kind (rows x K) | tensors | rotation | NMSE Paley/DCT (2.5 bpw) | NMSE zero-pad | bytes pad / Paley |");
    println!("|---|---|---|---|---|---|");
    for kind in [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ] {
        let (mut e_rot, mut e_pad, mut norm, mut n, mut shape) = (0f64, 0f64, 0f64, 0, (0, 0));
        for t in f.tensors.iter().filter(|t| {
            t.name.ends_with(&format!(".{kind}.weight"))
                && t.name
                    .split('.')
                    .nth(1)
                    .and_then(|l| l.parse::<usize>().ok())
                    .is_some_and(|l| l < layers)
        }) {
            let k = t.dims[0] as usize;
            let w = f.tensor_f32(t).expect("decode");
            let mut b = vec![0u8; w.len() / 32 * 10];
            tq::types::quantize_rows(TensorType::TQ2R, &w, &mut b, k, &t.name).unwrap();
            let mut y = vec![0f32; w.len()];
            tq::types::dequantize_rows(TensorType::TQ2R, &b, &mut y, k, &t.name).unwrap();
            for (r, row) in w.chunks_exact(k).enumerate() {
                let p = tq2r::padded_roundtrip(row);
                for c in 0..k {
                    let v = row[c] as f64;
                    e_rot += (v - y[r * k + c] as f64).powi(2);
                    e_pad += (v - p[c] as f64).powi(2);
                    norm += v * v;
                }
            }
            n += 1;
            shape = (w.len() / k, k);
        }
        if n == 0 {
            continue;
        }
        let k = shape.1;
        println!(
            "| {kind} ({} x {k}) | {n} | {} | {:.4} | {:.4} | {:.2} |",
            shape.0,
            tq2r::rotation(k).unwrap().describe(),
            e_rot / norm,
            e_pad / norm,
            k.next_power_of_two() as f64 / k as f64
        );
    }
}
