//! k-quants (in progress)
pub fn dequantize_q2_k(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_q3_k(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_q4_k(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_q5_k(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_q6_k(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
