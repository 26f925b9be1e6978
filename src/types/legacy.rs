//! Legacy ggml block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (in progress)
pub fn dequantize_q4_0(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_q4_1(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_q5_0(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_q5_1(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_q8_0(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn quantize_q4_0(_s: &[f32], _o: &mut [u8]) { unimplemented!("in progress") }
pub fn quantize_q4_1(_s: &[f32], _o: &mut [u8]) { unimplemented!("in progress") }
pub fn quantize_q8_0(_s: &[f32], _o: &mut [u8]) { unimplemented!("in progress") }
