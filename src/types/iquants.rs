//! IQ4_NL / IQ4_XS (in progress)
pub fn dequantize_iq4_nl(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_iq4_xs(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
