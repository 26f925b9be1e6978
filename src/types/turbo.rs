//! turbo2/3/4 KV blocks (in progress)
pub fn dequantize_turbo2(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_turbo3(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn dequantize_turbo4(_b: &[u8], _o: &mut [f32]) { unimplemented!("in progress") }
pub fn quantize_turbo2(_s: &[f32], _o: &mut [u8]) { unimplemented!("in progress") }
pub fn quantize_turbo3(_s: &[f32], _o: &mut [u8]) { unimplemented!("in progress") }
pub fn quantize_turbo4(_s: &[f32], _o: &mut [u8]) { unimplemented!("in progress") }
