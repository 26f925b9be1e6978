// tq GPU decode kernels, CUDA: shared helpers. The host (src/gpu/cuda.rs) prepends this file to
// tq.cu and turbo.cu and compiles the result with NVRTC, `--fmad=false`: no multiply-add
// contraction, so every f32 product and sum is rounded on its own as in the CPU reference.
// No CUDA headers are needed (the f16 conversion below is integer code).

#define TQ_FULL_MASK 0xffffffffu

// IEEE binary16 bits -> f32, exact for every input (signed zeros, subnormals, inf, NaN), and
// independent of any flush-to-zero mode.
__device__ __forceinline__ float tq_f16_to_f32(unsigned int h) {
    const unsigned int s = (h & 0x8000u) << 16;
    const unsigned int e = (h >> 10) & 0x1fu;
    const unsigned int m = h & 0x3ffu;
    if (e == 0u) {
        if (m == 0u) {
            return __uint_as_float(s);
        }
        const unsigned int p = 31u - (unsigned int)__clz(m);   // leading one of m
        const unsigned int mm = (m << (10u - p)) & 0x3ffu;
        return __uint_as_float(s | ((p + 103u) << 23) | (mm << 13));
    }
    if (e == 31u) {
        return __uint_as_float(s | 0x7f800000u | (m << 13));
    }
    return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ unsigned int tq_u16(const unsigned char * p) {
    return (unsigned int)p[0] | ((unsigned int)p[1] << 8);
}

// Sum over the 32 lanes of a warp (xor tree).
__device__ __forceinline__ float tq_warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(TQ_FULL_MASK, v, off);
    }
    return v;
}
