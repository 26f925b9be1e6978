//! TQ4_1S / TQ3_1S (in progress)
pub fn dequantize_tq3_1s(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_tq4_1s(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn quantize_tq3_1s(_s: &[f32], _o: &mut [u8]) { unimplemented!("in progress") }
pub fn quantize_tq4_1s(_s: &[f32], _o: &mut [u8]) { unimplemented!("in progress") }
