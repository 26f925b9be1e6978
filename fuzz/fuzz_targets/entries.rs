// The bodies of the fuzz targets that need more than one library call, shared by the libFuzzer
// binaries (`#[path = "entries.rs"] mod entries;` in each) and by `tests/fuzz_replay.rs`, which
// replays a seeded corpus of mutated inputs through the same functions in every test run (no
// cargo-fuzz needed). Any panic is a finding; the invariant checks below panic on a wrong answer.

use std::path::PathBuf;

/// A per-process scratch file (`/dev/shm` when there is one).
pub fn scratch(name: &str) -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let t = format!("{:?}", std::thread::current().id());
    let t: String = t.chars().filter(char::is_ascii_digit).collect();
    dir.join(format!("tq-fuzz-{}-{t}-{name}", std::process::id()))
}

/// Reads little-endian numbers off the input; zeros once it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = N.min(self.0.len());
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        b
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    /// A size: small, mid-sized or any u64 (so sums can overflow), chosen by the input.
    fn size(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => self.u8() as u64,
            1 => self.u16() as u64,
            2 => self.u64() >> 24,
            _ => self.u64(),
        }
    }
    /// A cost: a finite value, or now and then NaN, ±inf, 0 or a negative number.
    fn cost(&mut self) -> f64 {
        match self.u8() % 16 {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => 0.0,
            4 => -(self.u16() as f64),
            _ => self.u16() as f64 / 64.0,
        }
    }
}

/// The least cost of choosing one option per item within `budget`, by trying every choice.
fn brute(items: &[Vec<(u64, f64)>], budget: u64) -> Option<f64> {
    let mut best: Option<f64> = None;
    let mut idx = vec![0usize; items.len()];
    loop {
        let bytes = items
            .iter()
            .zip(&idx)
            .map(|(o, &k)| o[k].0)
            .fold(0u64, u64::saturating_add);
        if bytes <= budget {
            let c: f64 = items.iter().zip(&idx).map(|(o, &k)| o[k].1).sum();
            best = Some(best.map_or(c, |b| b.min(c)));
        }
        let mut i = 0;
        loop {
            if i == items.len() {
                return best;
            }
            idx[i] += 1;
            if idx[i] < items[i].len() {
                break;
            }
            idx[i] = 0;
            i += 1;
        }
    }
}

/// The mix's planner (`tq::plan::mix::solve`, the multiple-choice knapsack over a byte grid) on
/// items, option sizes and costs, a budget and a grid all taken from the input. It must not
/// panic, and an answer must pick one existing option per item, stay within the budget and
/// report the sums of what it picked; with a grid of one byte and finite costs on a small input
/// it must be optimal (checked against trying every choice).
pub fn mix_planner(data: &[u8]) {
    let mut r = Bytes(data);
    let n_items = (r.u8() % 12) as usize;
    let cells = 1 + (r.u16() as u64 % 4096);
    let budget = r.size();
    let mut items = Vec::with_capacity(n_items);
    for _ in 0..n_items {
        // 0 options now and then (no answer), at most 255 (the planner's documented limit).
        let k = match r.u8() {
            0 => 0,
            255 => 255,
            x => 1 + (x % 6) as usize,
        };
        items.push((0..k).map(|_| (r.size(), r.cost())).collect::<Vec<_>>());
    }
    let Some(sol) = tq::plan::mix::solve(&items, budget, cells) else {
        return;
    };
    assert_eq!(sol.choice.len(), items.len());
    assert!(
        sol.bytes <= budget,
        "{} over the budget {budget}",
        sol.bytes
    );
    let mut bytes = 0u64;
    let mut cost = 0f64;
    for (o, &k) in items.iter().zip(&sol.choice) {
        assert!(k < o.len(), "option {k} of {}", o.len());
        bytes += o[k].0;
        cost += o[k].1;
    }
    assert_eq!(bytes, sol.bytes);
    assert!(cost.to_bits() == sol.cost.to_bits() || cost == sol.cost);
    let small = items.iter().map(Vec::len).product::<usize>() <= 4096;
    let finite = items.iter().flatten().all(|x| x.1.is_finite());
    if sol.grid == 1 && small && finite {
        let best = brute(&items, budget).expect("solve found an answer");
        assert!(
            sol.cost <= best + 1e-9 * best.abs().max(1.0),
            "cost {} but {best} is possible",
            sol.cost
        );
    }
}

/// A Hessian file (`tq convert --calib H.safetensors`): opened as convert and the mix open it,
/// then every group read in full. Any error is fine; a panic is not.
pub fn hessian_reader(data: &[u8]) {
    let p = scratch("h.safetensors");
    if std::fs::write(&p, data).is_err() {
        return;
    }
    if let Ok((f, _meta)) = tq::quant::HessianFile::open(&p) {
        for key in &f.order {
            if let Ok(h) = f.load_group(key) {
                assert_eq!(h.h.len(), h.n * h.n, "{key}");
                assert!(
                    h.h.iter().all(|v| v.is_finite()),
                    "{key}: non-finite passed"
                );
            }
        }
    }
    let _ = std::fs::remove_file(&p);
}

/// An importance matrix (`tq convert --imatrix`): GGUF or legacy `.dat`, as convert loads it.
/// Every entry it returns is finite and at least 0.
pub fn imatrix_reader(data: &[u8]) {
    let p = scratch("imatrix");
    if std::fs::write(&p, data).is_err() {
        return;
    }
    if let Ok(im) = tq::calib::imatrix::load(&p) {
        for (k, v) in &im.entries {
            assert!(v.iter().all(|x| x.is_finite() && *x >= 0.0), "{k}");
        }
    }
    let _ = std::fs::remove_file(&p);
}

/// What runs *after* a GGUF header parses: `tq inspect`'s report and its text and JSON
/// renderings, the planner over the file's tensors (`--weights tq4_1s` with each recipe, q8_0,
/// q4_K, keep types), the output metadata and size `convert` derives from a plan, and, for small
/// files, `convert` itself into a scratch output. Inputs that do not parse are dropped early (the
/// `gguf_reader` target covers those). Any panic is a finding.
pub fn gguf_pipeline(data: &[u8]) {
    use tq::plan::{self, recipe::RECIPES, Request};
    use tq::source::{GgufSource, SourceTensor, TensorSource};
    use tq::types::profile::Profile;
    use tq::types::TensorType;
    /// Files with at most this many elements in all are also converted (keeps runs fast).
    const CONVERT_MAX_ELEMENTS: u64 = 1 << 16;

    let profile = Profile::default();
    if tq::gguf::reader::validate(data, &profile).is_err() {
        return;
    }
    let p = scratch("in.gguf");
    if std::fs::write(&p, data).is_err() {
        return;
    }
    for full in [false, true] {
        if let Ok(r) = tq::inspect::inspect(&p, &profile, full) {
            let _ = tq::inspect::render_text(&r, true);
            let _ = tq::inspect::render_text(&r, false);
            let _ = serde_json::to_string(&r);
        }
    }
    let Ok(f) = tq::gguf::GgufFile::open_with(&p, &profile) else {
        let _ = std::fs::remove_file(&p);
        return;
    };
    let src = GgufSource::new(f);
    let tensors: Vec<SourceTensor> = src.tensors().to_vec();
    let _ = plan::engine_checks(&src);
    let mut requests = vec![];
    for r in RECIPES {
        requests.push((TensorType::TQ4_1S, r, false));
    }
    requests.push((TensorType::Q8_0, &RECIPES[0], false));
    requests.push((TensorType::Q4K, &RECIPES[0], false));
    requests.push((TensorType::TQ4_1S, &RECIPES[0], true));
    let small = tensors.iter().map(|t| t.n_elements()).sum::<u64>() <= CONVERT_MAX_ELEMENTS;
    for (i, (weights, recipe, keep_types)) in requests.into_iter().enumerate() {
        let req = Request {
            weights,
            recipe,
            overrides: vec![],
            output_type: None,
            token_embd_type: None,
            keep_types,
            strict: false,
            preset: None,
        };
        let Ok(plan) = plan::plan(&tensors, &req, &profile) else {
            continue;
        };
        let md = tq::convert::output_metadata(src.metadata(), &plan, None, !keep_types);
        let specs = tq::convert::tensor_specs(&plan, &profile);
        let _ = tq::gguf::writer::file_size(src.gguf_version(), &md, &specs);
        // Convert the small ones for real: q8_0 (row-parallel RTN) and keep types (copies).
        if small && (i == RECIPES.len() || keep_types) {
            let out = scratch("out.gguf");
            let cp = tq::convert::Checkpoints {
                resume: false,
                key: String::new(),
                quiet: true,
            };
            let target = tq::convert::Target {
                src: &src,
                plan: &plan,
                metadata: &md,
                version: src.gguf_version(),
                profile: &profile,
                out: &out,
                hash_input: None,
                cp: &cp,
                prepared: None,
            };
            let _ = tq::convert::execute(&target, tq::convert::Calib::None, &|_| {});
            let _ = std::fs::remove_file(&out);
            // A failed run may leave its partial output and checkpoint (kept for --resume).
            if let Ok(partial) = tq::io::partial_path(&out) {
                let _ = std::fs::remove_file(tq::io::checkpoint_path(&partial));
                let _ = std::fs::remove_file(partial);
            }
        }
    }
    let _ = std::fs::remove_file(&p);
}
