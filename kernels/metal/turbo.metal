// tq GPU decode kernels, Metal: turbo2 / turbo3 / turbo4 KV-cache blocks (FORMATS.md §3) in every
// layout tq writes or simulates. Prepend common.metal. Same algorithms and layout parameters as
// kernels/cuda/turbo.cu:
//   cb [[buffer(5)]]       the ascending codebook, 2^bits f32 (passed by the host, not hard-coded)
//   lay [[buffer(6)]]      uint[3] = {group (64|128), bytes per block, hdr (2 | 4 for May turbo4)}
// Block: f16 norm | [f16 unused] | qs[group/4 or group/2] | turbo3: signs[group/8].
//
//   turbo{2,3,4}_dequant   one thread per value, rotated domain; value index / group = block.
//   turbo{2,3,4}_qk        one 128-thread threadgroup per key row (REQUIRED: part[4] holds one
//                          partial per 32-wide SIMD group); q̂ pre-rotated.
// Buffers: 0 = blocks, 1 = output, 2 = n (groups or rows), 3 = cols, 4 = query, 5 = cb, 6 = lay.

static inline float turbo2_value(device const uchar * b, uint j, constant float * cb, uint group,
                                 uint hdr) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const uint i = (b[hdr + (j >> 2)] >> (2u * (j & 3u))) & 3u;
    return cb[i] * norm;
}

static inline float turbo3_value(device const uchar * b, uint j, constant float * cb, uint group,
                                 uint hdr) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const uint lo = (b[hdr + (j >> 2)] >> (2u * (j & 3u))) & 3u;
    const uint hi = (b[hdr + (group >> 2) + (j >> 3)] >> (j & 7u)) & 1u;
    return cb[lo | (hi << 2)] * norm;
}

static inline float turbo4_value(device const uchar * b, uint j, constant float * cb, uint group,
                                 uint hdr) {
    const float norm = tq_f16_to_f32(tq_u16(b));
    const uint i = (b[hdr + (j >> 1)] >> (4u * (j & 1u))) & 15u;
    return cb[i] * norm;
}

#define TURBO_DEQUANT(NAME, VALUE)                                                 \
    kernel void NAME(device const uchar * src [[buffer(0)]],                       \
                     device float * dst [[buffer(1)]],                             \
                     constant uint & n_groups [[buffer(2)]],                       \
                     constant float * cb [[buffer(5)]],                            \
                     constant uint * lay [[buffer(6)]],                            \
                     uint tid [[thread_position_in_grid]]) {                       \
        const uint group = lay[0];                                                 \
        const uint g = tid / group;                                                \
        if (g >= n_groups) {                                                       \
            return;                                                                \
        }                                                                          \
        dst[tid] = VALUE(src + g * lay[1], tid - g * group, cb, group, lay[2]);    \
    }

TURBO_DEQUANT(turbo2_dequant, turbo2_value)
TURBO_DEQUANT(turbo3_dequant, turbo3_value)
TURBO_DEQUANT(turbo4_dequant, turbo4_value)

#define TURBO_QK(NAME, VALUE)                                                      \
    kernel void NAME(device const uchar * k [[buffer(0)]],                         \
                     device float * out [[buffer(1)]],                             \
                     constant uint & rows [[buffer(2)]],                           \
                     constant uint & cols [[buffer(3)]],                           \
                     device const float * q [[buffer(4)]],                         \
                     constant float * cb [[buffer(5)]],                            \
                     constant uint * lay [[buffer(6)]],                            \
                     uint row [[threadgroup_position_in_grid]],                    \
                     uint t [[thread_position_in_threadgroup]]) {                  \
        threadgroup float part[4]; /* one per SIMD group: 128 threads required */  \
        const uint group = lay[0];                                                 \
        const uint bytes = lay[1];                                                 \
        const uint gpr = cols / group;                                             \
        float acc = 0.0f;                                                          \
        if (row < rows) {                                                          \
            device const uchar * kr = k + row * gpr * bytes;                       \
            for (uint j = t; j < cols; j += 128u) {                                \
                const uint g = j / group;                                          \
                acc += q[j] * VALUE(kr + g * bytes, j - g * group, cb, group,      \
                                    lay[2]);                                       \
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

TURBO_QK(turbo2_qk, turbo2_value)
TURBO_QK(turbo3_qk, turbo3_value)
TURBO_QK(turbo4_qk, turbo4_value)
