//! Sign vectors the engines compile in.

/// TQ weight blocks: `s[i] = -1` if the top bit of `(i * 0x9E3779B9) mod 2^32` is set.
pub fn golden_ratio_sign(i: u32) -> f32 {
    if i.wrapping_mul(0x9E37_79B9) & 0x8000_0000 != 0 {
        -1.0
    } else {
        1.0
    }
}

/// The 32 signs of the TQ4_1S / TQ3_1S block rotation.
pub fn tq_block_signs() -> [f32; 32] {
    std::array::from_fn(|i| golden_ratio_sign(i as u32))
}

/// turbo KV: first draw of `numpy.random.default_rng(42).choice([-1.0, 1.0], size=128)`,
/// as the engines store it (FORMATS.md §3). `math::pcg64` reproduces it from the generator.
pub const TURBO_S1: [i8; 128] = [
    -1, 1, 1, -1, -1, 1, -1, 1, -1, -1, 1, 1, 1, 1, 1, 1, 1, -1, 1, -1, 1, -1, -1, 1, 1, 1, -1, 1,
    1, -1, -1, -1, -1, 1, 1, -1, 1, 1, -1, 1, -1, 1, 1, -1, -1, 1, -1, 1, 1, 1, 1, -1, -1, -1, -1,
    -1, 1, -1, 1, 1, 1, 1, -1, 1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1, 1, 1, -1,
    -1, 1, 1, 1, -1, -1, 1, 1, -1, 1, 1, -1, 1, -1, -1, 1, 1, -1, 1, -1, 1, -1, 1, 1, 1, 1, -1, 1,
    -1, 1, 1, -1, 1, 1, -1, -1, -1, -1, -1, 1, 1, -1, 1, 1, -1, 1,
];

/// turbo KV: second draw of the same generator.
pub const TURBO_S2: [i8; 128] = [
    1, 1, 1, 1, -1, 1, 1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1, 1, -1, -1, 1, -1, 1, -1, 1, -1, -1,
    1, -1, 1, 1, 1, 1, 1, -1, -1, -1, 1, -1, -1, -1, -1, -1, -1, 1, 1, 1, -1, 1, -1, 1, 1, 1, -1,
    -1, 1, -1, -1, -1, -1, -1, -1, 1, 1, 1, -1, 1, -1, -1, -1, -1, 1, -1, 1, -1, 1, -1, -1, 1, 1,
    -1, 1, -1, 1, 1, -1, 1, -1, -1, -1, -1, 1, -1, -1, 1, -1, 1, -1, 1, 1, 1, -1, -1, 1, -1, 1, -1,
    1, 1, -1, -1, 1, -1, 1, -1, 1, 1, -1, 1, -1, 1, -1, -1, -1, -1, -1, 1, -1,
];
