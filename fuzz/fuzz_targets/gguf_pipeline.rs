//! Fuzz what runs *after* a GGUF header parses: `tq inspect`'s report and its text and JSON
//! renderings, the planner over the file's tensors (a few requests: `--weights tq4_1s`, each
//! recipe, `--weights q8_0`, keep types), the output metadata and size `convert` derives from a
//! plan, and, for small files, `convert` itself into a scratch output. Inputs that do not parse
//! are dropped early (the `gguf_reader` target covers those). Any panic is a crash.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tq::plan::{self, recipe::RECIPES, Request};
use tq::source::{GgufSource, SourceTensor, TensorSource};
use tq::types::profile::Profile;
use tq::types::TensorType;

/// Files with at most this many elements in all are also converted (keeps runs fast).
const CONVERT_MAX_ELEMENTS: u64 = 1 << 16;

fn scratch(name: &str) -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("tq-fuzz-{}-{name}", std::process::id()))
}

fuzz_target!(|data: &[u8]| {
    let profile = Profile::default();
    if tq::gguf::reader::validate(data, &profile).is_err() {
        return;
    }
    let p = scratch("in.gguf");
    if std::fs::write(&p, data).is_err() {
        return;
    }

    // inspect: summarized and full, text (with and without the tensor table) and JSON.
    for full in [false, true] {
        if let Ok(r) = tq::inspect::inspect(&p, &profile, full) {
            let _ = tq::inspect::render_text(&r, true);
            let _ = tq::inspect::render_text(&r, false);
            let _ = serde_json::to_string(&r);
        }
    }

    let Ok(f) = tq::gguf::GgufFile::open_with(&p, &profile) else {
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
            let _ = tq::convert::execute(
                &src,
                &plan,
                &md,
                src.gguf_version(),
                &profile,
                &out,
                None,
                None,
                &|_| {},
            );
            let _ = std::fs::remove_file(&out);
        }
    }
    let _ = std::fs::remove_file(&p);
});
