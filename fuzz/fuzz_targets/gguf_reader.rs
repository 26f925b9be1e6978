//! Fuzz the GGUF header parser/validator: any byte string must give Ok or an error, never a
//! panic, an out-of-bounds access, or an allocation sized by an unchecked header field.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let profile = tq::types::profile::Profile::default();
    let _ = tq::gguf::reader::validate(data, &profile);
});
