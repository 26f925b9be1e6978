// tq GPU decode kernels, CUDA: turbo2 / turbo3 / turbo4 KV-cache blocks (FORMATS.md §3) in every
// layout tq writes or simulates. Prepend common.cuh.
//
// Layout parameters (kernel arguments, see src/gpu/turbo_spec.rs `TurboSpec`):
//   cb      the ascending codebook, 2^bits f32 in device memory (May-2026 CB2/CB3/CB4, the June
//           Lloyd-Max turbo4 table, or a per-head-dim table); never hard-coded here
//   group   values per group: 128, or 64 for 64-wide heads
//   bytes   bytes per block: hdr + group·bits/8
//   hdr     bytes before qs: 2 (f16 norm), or 4 for the May-2026 turbo4 block (f16 norm | f16 0)
// Block: f16 norm | [f16 unused] | qs[group/4 or group/2] | turbo3: signs[group/8].
//
//   turbo{2,3,4}_dequant   one thread per value: C[idx] · f16(norm), rotated domain (the engines
//                          never rotate K/V back; they rotate Q forward). 128 threads per CUDA
//                          block, any number of groups per block (value index / group).
//   turbo{2,3,4}_qk        one 128-thread CUDA block per key row of `cols` values (a multiple of
//                          `group`): thread t sums q̂_j · (C[idx_j]·norm) for j = t, t+128, ...;
//                          then warp xor-sums and a 4-warp sum in shared memory. REQUIRES
//                          blockDim.x == 128 (part[4] holds one partial per warp; enforced by
//                          __launch_bounds__ and the host's TURBO_QK_THREADS). q̂ is the
//                          pre-rotated query, as in the fork's flash-attention vec kernels.

__device__ __forceinline__ float turbo2_value(const unsigned char * b, unsigned int j,
                                              const float * cb, unsigned int group,
                                              unsigned int hdr) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const unsigned int i = (b[hdr + (j >> 2)] >> (2u * (j & 3u))) & 3u;
    return cb[i] * norm;
}

__device__ __forceinline__ float turbo3_value(const unsigned char * b, unsigned int j,
                                              const float * cb, unsigned int group,
                                              unsigned int hdr) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const unsigned int lo = (b[hdr + (j >> 2)] >> (2u * (j & 3u))) & 3u;
    const unsigned int hi = (b[hdr + (group >> 2) + (j >> 3)] >> (j & 7u)) & 1u;
    return cb[lo | (hi << 2)] * norm;
}

__device__ __forceinline__ float turbo4_value(const unsigned char * b, unsigned int j,
                                              const float * cb, unsigned int group,
                                              unsigned int hdr) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const unsigned int i = (b[hdr + (j >> 1)] >> (4u * (j & 1u))) & 15u;
    return cb[i] * norm;
}

#define TURBO_DEQUANT(NAME, VALUE)                                                           \
    extern "C" __global__ void __launch_bounds__(128)                                        \
    NAME(const unsigned char * __restrict__ src, float * __restrict__ dst,                   \
         unsigned int n_groups, const float * __restrict__ cb, unsigned int group,           \
         unsigned int bytes, unsigned int hdr) {                                             \
        const size_t idx = (size_t)blockIdx.x * 128u + threadIdx.x;                          \
        const size_t g = idx / group;                                                        \
        if (g >= n_groups) {                                                                 \
            return;                                                                          \
        }                                                                                    \
        dst[idx] = VALUE(src + g * bytes, (unsigned int)(idx - g * group), cb, group, hdr);  \
    }

TURBO_DEQUANT(turbo2_dequant, turbo2_value)
TURBO_DEQUANT(turbo3_dequant, turbo3_value)
TURBO_DEQUANT(turbo4_dequant, turbo4_value)

#define TURBO_QK(NAME, VALUE)                                                                \
    extern "C" __global__ void __launch_bounds__(128)                                        \
    NAME(const unsigned char * __restrict__ k, const float * __restrict__ q,                 \
         float * __restrict__ out, unsigned int rows, unsigned int cols,                     \
         const float * __restrict__ cb, unsigned int group, unsigned int bytes,              \
         unsigned int hdr) {                                                                 \
        __shared__ float part[4]; /* one per warp: blockDim.x must be 128 */                 \
        const unsigned int row = blockIdx.x;                                                 \
        const unsigned int t = threadIdx.x;                                                  \
        if (row >= rows) {                                                                   \
            return;                                                                          \
        }                                                                                    \
        const unsigned int gpr = cols / group;                                               \
        const unsigned char * kr = k + (size_t)row * gpr * bytes;                            \
        float acc = 0.0f;                                                                    \
        for (unsigned int j = t; j < cols; j += 128u) {                                      \
            const unsigned int g = j / group;                                                \
            acc += q[j] * VALUE(kr + (size_t)g * bytes, j - g * group, cb, group, hdr);      \
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

TURBO_QK(turbo2_qk, turbo2_value)
TURBO_QK(turbo3_qk, turbo3_value)
TURBO_QK(turbo4_qk, turbo4_value)
