// tq GPU decode kernels, CUDA: turbo2 / turbo3 / turbo4 KV-cache blocks (FORMATS.md §3,
// 2026-05-04 layouts: 34 / 50 / 68 bytes per 128 values). Prepend common.cuh.
//
//   turbo{2,3,4}_dequant   one thread per value: C[idx] · f16(norm), rotated domain (the engines
//                          never rotate K/V back; they rotate Q forward). 128 threads per group.
//   turbo{2,3,4}_qk        one 128-thread CUDA block per key row of `cols` values: thread t sums
//                          q̂_j · (C[idx_j]·norm) for j = t, t+128, ...; then warp xor-sums and a
//                          4-warp sum in shared memory. q̂ is the pre-rotated query, as in the
//                          fork's flash-attention vec kernels for turbo K.

__constant__ float TURBO_CB2[4] = {-0.133462f, -0.039994f, 0.039994f, 0.133462f};
__constant__ float TURBO_CB3[8] = {
    -0.190685f, -0.117832f, -0.065717f, -0.021460f, 0.021460f, 0.065717f, 0.117832f, 0.190685f};
__constant__ float TURBO_CB4[16] = {
    -0.173926f, -0.117195f, -0.089527f, -0.068756f, -0.051262f, -0.035597f, -0.020989f, -0.006938f,
     0.006938f,  0.020989f,  0.035597f,  0.051262f,  0.068756f,  0.089527f,  0.117195f,  0.173926f};

__device__ __forceinline__ float turbo2_value(const unsigned char * b, unsigned int j) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const unsigned int i = (b[2 + (j >> 2)] >> (2u * (j & 3u))) & 3u;
    return TURBO_CB2[i] * norm;
}

__device__ __forceinline__ float turbo3_value(const unsigned char * b, unsigned int j) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const unsigned int lo = (b[2 + (j >> 2)] >> (2u * (j & 3u))) & 3u;
    const unsigned int hi = (b[34 + (j >> 3)] >> (j & 7u)) & 1u;
    return TURBO_CB3[lo | (hi << 2)] * norm;
}

__device__ __forceinline__ float turbo4_value(const unsigned char * b, unsigned int j) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const unsigned int i = (b[4 + (j >> 1)] >> (4u * (j & 1u))) & 15u;
    return TURBO_CB4[i] * norm;
}

#define TURBO_DEQUANT(NAME, VALUE, BYTES)                                                    \
    extern "C" __global__ void NAME(const unsigned char * __restrict__ src,                  \
                                    float * __restrict__ dst, unsigned int n_groups) {       \
        const unsigned int g = blockIdx.x;                                                   \
        if (g >= n_groups) {                                                                 \
            return;                                                                          \
        }                                                                                    \
        dst[(size_t)g * 128u + threadIdx.x] = VALUE(src + (size_t)g * BYTES, threadIdx.x);   \
    }

TURBO_DEQUANT(turbo2_dequant, turbo2_value, 34u)
TURBO_DEQUANT(turbo3_dequant, turbo3_value, 50u)
TURBO_DEQUANT(turbo4_dequant, turbo4_value, 68u)

#define TURBO_QK(NAME, VALUE, BYTES)                                                         \
    extern "C" __global__ void NAME(const unsigned char * __restrict__ k,                    \
                                    const float * __restrict__ q, float * __restrict__ out,  \
                                    unsigned int rows, unsigned int cols) {                  \
        __shared__ float part[4];                                                            \
        const unsigned int row = blockIdx.x;                                                 \
        const unsigned int t = threadIdx.x;                                                  \
        if (row >= rows) {                                                                   \
            return;                                                                          \
        }                                                                                    \
        const unsigned int gpr = cols / 128u;                                                \
        const unsigned char * kr = k + (size_t)row * gpr * BYTES;                            \
        float acc = 0.0f;                                                                    \
        for (unsigned int j = t; j < cols; j += 128u) {                                      \
            acc += q[j] * VALUE(kr + (j >> 7) * BYTES, j & 127u);                            \
        }                                                                                    \
        acc = tq_warp_sum(acc);                                                              \
        if ((t & 31u) == 0u) {                                                               \
            part[t >> 5] = acc;                                                              \
        }                                                                                    \
        __syncthreads();                                                                     \
        if (t == 0u) {                                                                       \
            out[row] = (part[0] + part[1]) + (part[2] + part[3]);                            \
        }                                                                                    \
    }

TURBO_QK(turbo2_qk, turbo2_value, 34u)
TURBO_QK(turbo3_qk, turbo3_value, 50u)
TURBO_QK(turbo4_qk, turbo4_value, 68u)
