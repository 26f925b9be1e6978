// tq GPU decode kernels, Metal: turbo2 / turbo3 / turbo4 KV-cache blocks (FORMATS.md §3,
// 2026-05-04 layouts). Prepend common.metal. Same algorithms as kernels/cuda/turbo.cu.
//
//   turbo{2,3,4}_dequant   one thread per value, rotated domain; grid = 128 threads per group.
//   turbo{2,3,4}_qk        one 128-thread threadgroup per key row; q̂ pre-rotated.
// Buffers: 0 = blocks, 1 = output, 2 = n (groups or rows), 3 = cols, 4 = query.

constant float TURBO_CB2[4] = {-0.133462f, -0.039994f, 0.039994f, 0.133462f};
constant float TURBO_CB3[8] = {
    -0.190685f, -0.117832f, -0.065717f, -0.021460f, 0.021460f, 0.065717f, 0.117832f, 0.190685f};
constant float TURBO_CB4[16] = {
    -0.173926f, -0.117195f, -0.089527f, -0.068756f, -0.051262f, -0.035597f, -0.020989f, -0.006938f,
     0.006938f,  0.020989f,  0.035597f,  0.051262f,  0.068756f,  0.089527f,  0.117195f,  0.173926f};

static inline float turbo2_value(device const uchar * b, uint j) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const uint i = (b[2 + (j >> 2)] >> (2u * (j & 3u))) & 3u;
    return TURBO_CB2[i] * norm;
}

static inline float turbo3_value(device const uchar * b, uint j) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const uint lo = (b[2 + (j >> 2)] >> (2u * (j & 3u))) & 3u;
    const uint hi = (b[34 + (j >> 3)] >> (j & 7u)) & 1u;
    return TURBO_CB3[lo | (hi << 2)] * norm;
}

static inline float turbo4_value(device const uchar * b, uint j) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const uint i = (b[4 + (j >> 1)] >> (4u * (j & 1u))) & 15u;
    return TURBO_CB4[i] * norm;
}

#define TURBO_DEQUANT(NAME, VALUE, BYTES)                                          \
    kernel void NAME(device const uchar * src [[buffer(0)]],                       \
                     device float * dst [[buffer(1)]],                             \
                     constant uint & n_groups [[buffer(2)]],                       \
                     uint tid [[thread_position_in_grid]]) {                       \
        const uint g = tid >> 7;                                                   \
        if (g >= n_groups) {                                                       \
            return;                                                                \
        }                                                                          \
        dst[tid] = VALUE(src + g * BYTES, tid & 127u);                             \
    }

TURBO_DEQUANT(turbo2_dequant, turbo2_value, 34u)
TURBO_DEQUANT(turbo3_dequant, turbo3_value, 50u)
TURBO_DEQUANT(turbo4_dequant, turbo4_value, 68u)

#define TURBO_QK(NAME, VALUE, BYTES)                                               \
    kernel void NAME(device const uchar * k [[buffer(0)]],                         \
                     device float * out [[buffer(1)]],                             \
                     constant uint & rows [[buffer(2)]],                           \
                     constant uint & cols [[buffer(3)]],                           \
                     device const float * q [[buffer(4)]],                         \
                     uint row [[threadgroup_position_in_grid]],                    \
                     uint t [[thread_position_in_threadgroup]]) {                  \
        threadgroup float part[4];                                                 \
        const uint gpr = cols / 128u;                                              \
        float acc = 0.0f;                                                          \
        if (row < rows) {                                                          \
            device const uchar * kr = k + row * gpr * BYTES;                       \
            for (uint j = t; j < cols; j += 128u) {                                \
                acc += q[j] * VALUE(kr + (j >> 7) * BYTES, j & 127u);              \
            }                                                                      \
        }                                                                          \
        acc = tq_simd_sum(acc);                                                    \
        if ((t & 31u) == 0u) {                                                     \
            part[t >> 5] = acc;                                                    \
        }                                                                          \
        threadgroup_barrier(mem_flags::mem_threadgroup);                           \
        if (t == 0u && row < rows) {                                               \
            out[row] = (part[0] + part[1]) + (part[2] + part[3]);                  \
        }                                                                          \
    }

TURBO_QK(turbo2_qk, turbo2_value, 34u)
TURBO_QK(turbo3_qk, turbo3_value, 50u)
TURBO_QK(turbo4_qk, turbo4_value, 68u)
