//! The fuzz targets of `fuzz/` that have no libFuzzer-free test of their own — the mix's planner,
//! the Hessian file reader and the imatrix reader — run on every test run: a seeded corpus (valid
//! files built here, then mutated: bit flips, interesting numbers over aligned words and over the
//! numbers of a safetensors header, truncation, splices) goes through the very functions the
//! fuzz binaries call (`fuzz/fuzz_targets/entries.rs`). A panic or a broken invariant fails the
//! test and names the seed and input; `TQ_FUZZ_ITERS=N` runs N mutants per target instead of the
//! default, `TQ_FUZZ_SEED=S` another seed.

#[path = "../fuzz/fuzz_targets/entries.rs"]
mod entries;

/// SplitMix64 (the mutator's only randomness: the same seed gives the same corpus).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    3,
    7,
    8,
    255,
    256,
    65535,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 40,
    1 << 62,
    u64::MAX,
];

/// One mutant of `seed`: 1 to 4 random edits.
fn mutate(r: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + r.below(4) {
        let n = b.len();
        match r.below(7) {
            0 if n > 0 => {
                let i = r.below(n);
                b[i] ^= 1 << r.below(8);
            }
            1 if n > 0 => {
                let i = r.below(n);
                b[i] = [0, 0xff, 0x7f, 0x80, b'0', b'9', b'"'][r.below(7)];
            }
            2 if n >= 8 => {
                // An interesting number (or an f32 NaN/inf/negative) over an aligned word.
                let i = r.below(n / 4) * 4;
                let v = INTERESTING[r.below(INTERESTING.len())];
                let w = match r.below(4) {
                    0 => f32::NAN.to_bits(),
                    1 => f32::INFINITY.to_bits(),
                    2 => (-1.5f32).to_bits(),
                    _ => v as u32,
                };
                let bytes = if r.below(2) == 0 || i + 8 > n {
                    w.to_le_bytes().to_vec()
                } else {
                    v.to_le_bytes().to_vec()
                };
                let e = (i + bytes.len()).min(n);
                b[i..e].copy_from_slice(&bytes[..e - i]);
            }
            3 => b.truncate(r.below(n + 1)),
            4 if n > 0 => {
                // Splice: a copy of one span inserted elsewhere.
                let (s, l) = (r.below(n), 1 + r.below(16));
                let span: Vec<u8> = b[s..(s + l).min(n)].to_vec();
                let at = r.below(n);
                b.splice(at..at, span);
            }
            5 => b.extend((0..r.below(32)).map(|_| r.next() as u8)),
            _ => {
                if let Some(m) = header_numbers(r, &b) {
                    b = m;
                }
            }
        }
    }
    b
}

/// A safetensors mutant that still parses as far as its JSON: one number of the header (a
/// shape, an offset, a token count) replaced by an interesting one, the length prefix fixed.
fn header_numbers(r: &mut Rng, b: &[u8]) -> Option<Vec<u8>> {
    let n = u64::from_le_bytes(b.get(..8)?.try_into().ok()?) as usize;
    let h = std::str::from_utf8(b.get(8..8usize.checked_add(n)?)?).ok()?;
    let runs: Vec<(usize, usize)> = h
        .char_indices()
        .filter(|&(i, c)| c.is_ascii_digit() && (i == 0 || !h.as_bytes()[i - 1].is_ascii_digit()))
        .map(|(i, _)| {
            let len = h[i..].bytes().take_while(u8::is_ascii_digit).count();
            (i, len)
        })
        .collect();
    let &(at, len) = runs.get(r.below(runs.len()))?;
    let v = INTERESTING[r.below(INTERESTING.len())].to_string();
    let nh = format!("{}{v}{}", &h[..at], &h[at + len..]);
    let mut out = (nh.len() as u64).to_le_bytes().to_vec();
    out.extend(nh.as_bytes());
    out.extend(&b[8 + n..]);
    Some(out)
}

fn iters(default: usize) -> usize {
    std::env::var("TQ_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn seed() -> u64 {
    std::env::var("TQ_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x7131)
}

/// Run `f` on `n` mutants of the seeds; a panic names the seed, the mutant's index and its bytes.
fn replay(target: &str, seeds: &[Vec<u8>], n: usize, f: fn(&[u8])) {
    let s = seed();
    eprintln!(
        "fuzz_replay {target}: seed {s}, {n} mutants of {} inputs",
        seeds.len()
    );
    let mut r = Rng(s);
    for sd in seeds {
        f(sd);
    }
    for i in 0..n {
        let m = mutate(&mut r, &seeds[i % seeds.len()]);
        let res = std::panic::catch_unwind(|| f(&m));
        if let Err(e) = res {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{target}: seed {s}, mutant {i} panicked: {msg}\ninput: {m:02x?}");
        }
    }
}

/// A safetensors file: `(name, dtype, shape, little-endian data)` and string metadata.
fn safetensors(tensors: &[(&str, &str, Vec<u64>, Vec<u8>)], meta: &[(&str, &str)]) -> Vec<u8> {
    let mut h = serde_json::Map::new();
    let m: serde_json::Map<String, serde_json::Value> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    h.insert("__metadata__".into(), m.into());
    let mut data: Vec<u8> = vec![];
    for (name, dtype, shape, d) in tensors {
        h.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape,
                "data_offsets": [data.len(), data.len() + d.len()]}),
        );
        data.extend(d);
    }
    let mut j = serde_json::Value::from(h).to_string().into_bytes();
    while j.len() % 8 != 0 {
        j.push(b' ');
    }
    let mut b = (j.len() as u64).to_le_bytes().to_vec();
    b.extend(j);
    b.extend(data);
    b
}

fn spd(n: usize) -> Vec<f64> {
    (0..n * n)
        .map(|k| {
            let (i, j) = (k / n, k % n);
            if i == j {
                4.0 + i as f64
            } else {
                1.0 / (1 + i + j) as f64
            }
        })
        .collect()
}

#[test]
fn mix_planner_survives_arbitrary_items() {
    let mut r = Rng(seed() ^ 0x006d_6978);
    let seeds: Vec<Vec<u8>> = (0..64)
        .map(|_| (0..r.below(160)).map(|_| r.next() as u8).collect())
        .collect();
    replay("mix_planner", &seeds, iters(6000), entries::mix_planner);
}

#[test]
fn hessian_reader_survives_damaged_files() {
    let f64s = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let f32s = |v: &[f64]| {
        v.iter()
            .flat_map(|&x| (x as f32).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let h4 = spd(4);
    let upper: Vec<f64> = (0..4)
        .flat_map(|i| (i..4).map(move |j| (i, j)))
        .map(|(i, j)| h4[i * 4 + j])
        .collect();
    let qk = "blk.0.attn_q.weight,blk.0.attn_k.weight";
    let seeds = vec![
        safetensors(
            &[
                (qk, "F64", vec![4, 4], f64s(&h4)),
                ("blk.0.ffn_up.weight", "F32", vec![4, 4], f32s(&h4)),
                ("blk.0.ffn_down.weight", "F32", vec![10], f32s(&upper)),
            ],
            &[(&format!("tokens:{qk}"), "128"), ("tq.complete", "true")],
        ),
        safetensors(
            &[("blk.1.ffn_down.weight#3", "F64", vec![3, 3], f64s(&spd(3)))],
            &[],
        ),
        safetensors(&[], &[]),
    ];
    replay(
        "hessian_reader",
        &seeds,
        iters(3000),
        entries::hessian_reader,
    );
}

#[test]
fn imatrix_reader_survives_damaged_files() {
    let mut dat = 2i32.to_le_bytes().to_vec();
    for (name, n) in [("blk.0.attn_q.weight", 4i32), ("output.weight", 3)] {
        dat.extend((name.len() as i32).to_le_bytes());
        dat.extend(name.as_bytes());
        dat.extend(5i32.to_le_bytes());
        dat.extend(n.to_le_bytes());
        for k in 0..n {
            dat.extend((0.5 + k as f32).to_le_bytes());
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("i.gguf");
    let diag = |t: &[&str], tokens, d: Vec<f64>| tq::quant::Diagonal {
        tensors: t.iter().map(|s| s.to_string()).collect(),
        tokens,
        d,
    };
    tq::calib::imatrix::write_gguf(
        &[
            diag(
                &["blk.0.attn_q.weight", "blk.0.attn_k.weight"],
                64,
                vec![1.0, 2.0, 3.0, 4.0],
            ),
            diag(&["blk.0.ffn_down.weight#0"], 8, vec![0.5; 4]),
            diag(&["blk.0.ffn_down.weight#1"], 0, vec![0.25; 4]),
        ],
        &p,
        "text.txt",
        512,
    )
    .unwrap();
    let gguf = std::fs::read(&p).unwrap();
    replay(
        "imatrix_reader",
        &[dat, gguf],
        iters(3000),
        entries::imatrix_reader,
    );
}

/// The knapsack's answers where it used to panic: an item whose every option costs NaN or +inf
/// (no pick was recorded: index out of bounds), and sizes whose sum overflows 64 bits.
#[test]
fn mix_planner_answers_nan_infinite_and_overflowing_items() {
    use tq::plan::mix::solve;
    let items = vec![
        vec![(10, 1.0), (20, 0.5)],
        vec![(5, f64::NAN)],
        vec![(5, f64::INFINITY), (6, f64::NAN)],
    ];
    let s = solve(&items, 40, 1 << 10).expect("within budget");
    assert_eq!(s.choice, vec![1, 0, 0]);
    assert_eq!(s.bytes, 30);
    let huge = vec![vec![(u64::MAX - 1, 1.0)], vec![(u64::MAX - 1, 1.0)]];
    assert_eq!(solve(&huge, u64::MAX, 1 << 10), None);
    let ok = vec![vec![(u64::MAX / 2, 1.0)], vec![(u64::MAX / 2, 2.0)]];
    assert_eq!(solve(&ok, u64::MAX, 1 << 10).unwrap().bytes, u64::MAX - 1);
}

#[path = "../fixtures/gguf_gen.rs"]
#[allow(dead_code)] // this test uses two of the generators
mod gguf_gen;

/// The `gguf_pipeline` target (inspect, plan, metadata, convert of small files) on mutants of
/// two valid models: a tiny llama with f32 weights (small enough to be converted for real) and
/// the fixture with every value type and a mix of quantized tensors. Few mutants: each one that
/// still parses runs the planner for every recipe and may convert.
#[test]
fn gguf_pipeline_survives_mutated_models() {
    let seeds = vec![
        gguf_gen::tiny_llama(1, 32, 64, 64).bytes,
        gguf_gen::standard(3, None).bytes,
    ];
    replay("gguf_pipeline", &seeds, iters(300), entries::gguf_pipeline);
}
