//! Fuzz the safetensors path of `tq inspect` (file written to a temp path, then opened).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = std::env::temp_dir().join(format!("tq-fuzz-{}.safetensors", std::process::id()));
    if std::fs::write(&p, data).is_ok() {
        if let Ok(f) = tq::st::SafetensorsFile::open(&p) {
            for t in &f.tensors {
                let _ = f.tensor_f32(t);
            }
        }
    }
});
