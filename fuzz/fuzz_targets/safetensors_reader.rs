//! Fuzz the safetensors path of `tq inspect` (file written to a temp path, then opened, the
//! report built and rendered as text and JSON).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = std::env::temp_dir().join(format!("tq-fuzz-{}.safetensors", std::process::id()));
    if std::fs::write(&p, data).is_ok() {
        let profile = tq::types::profile::Profile::default();
        if let Ok(r) = tq::inspect::inspect(&p, &profile, true) {
            let _ = tq::inspect::render_text(&r, true);
            let _ = serde_json::to_string(&r);
        }
    }
});
