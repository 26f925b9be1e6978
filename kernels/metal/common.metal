// tq GPU decode kernels, Metal Shading Language: shared helpers. The host (src/gpu/metal.rs)
// prepends this file to tq.metal and turbo.metal and compiles the text with
// MTLDevice.newLibraryWithSource, fast math off (MTLMathModeSafe) and no FP contraction, so every
// f32 product and sum is rounded on its own as in the CPU reference. Assumes 32-wide SIMD groups
// (every Apple GPU family).
#include <metal_stdlib>
using namespace metal;

// MSL 3.2 spellings; older compilers ignore unknown pragmas with a warning, and the host's
// compile options (safe math mode / fast math disabled) still apply.
#pragma METAL fp math_mode(safe)
#pragma METAL fp contract(off)

// IEEE binary16 bits -> f32, exact for every input (signed zeros, subnormals, inf, NaN), and
// independent of any flush-to-zero mode.
static inline float tq_f16_to_f32(uint h) {
    const uint s = (h & 0x8000u) << 16;
    const uint e = (h >> 10) & 0x1fu;
    const uint m = h & 0x3ffu;
    if (e == 0u) {
        if (m == 0u) {
            return as_type<float>(s);
        }
        const uint p = 31u - clz(m);   // leading one of m
        const uint mm = (m << (10u - p)) & 0x3ffu;
        return as_type<float>(s | ((p + 103u) << 23) | (mm << 13));
    }
    if (e == 31u) {
        return as_type<float>(s | 0x7f800000u | (m << 13));
    }
    return as_type<float>(s | ((e + 112u) << 23) | (m << 13));
}

static inline uint tq_u16(device const uchar * p) {
    return uint(p[0]) | (uint(p[1]) << 8);
}

// Sum over the 32 lanes of a SIMD group (xor tree, the same order as the CUDA kernels).
static inline float tq_simd_sum(float v) {
    for (ushort off = 16; off > 0; off >>= 1) {
        v += simd_shuffle_xor(v, off);
    }
    return v;
}
