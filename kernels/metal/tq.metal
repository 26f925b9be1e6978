// tq GPU decode kernels, Metal: TQ4_1S / TQ3_1S weights (FORMATS.md §2). Prepend common.metal.
// The same algorithms as kernels/cuda/tq.cu, SIMD-group shuffles in place of warp shuffles.
//
//   tq4_dequant, tq3_dequant   one SIMD group per 32-block; grid = 32 threads per block.
//   tq_prerotate               forward RHT of each 32-block of the activation (the in-place
//                              activation rotation of the fork's Metal mat-vec).
//   tq4_matvec, tq3_matvec     one SIMD group per row over the rotated activation.
//   tq4_matmul, tq3_matmul     one SIMD group per (row, tile of TQ_MM_TOKENS tokens), 4 rows per
//                              128-thread threadgroup; per token the mat-vec's operations.
// Buffers: 0 = blocks, 1 = output, 2 = n (blocks or rows), 3 = cols, 4 = vector input,
// 7 = tokens (mat-mul).

constant float TQ_INV_SQRT32 = 0.17677669529663688f;

constant float TQ_C4[16] = {
    -2.732590f, -2.069017f, -1.618046f, -1.256231f, -0.942340f, -0.656759f, -0.388048f, -0.128395f,
     0.128395f,  0.388048f,  0.656759f,  0.942340f,  1.256231f,  1.618046f,  2.069017f,  2.732590f};
constant float TQ_C3[8] = {
    -1.996684f, -1.291398f, -0.740341f, -0.247508f, 0.230106f, 0.725222f, 1.277503f, 1.988943f};

static inline bool tq_sign_negative(uint i) {
    return ((i * 0x9E3779B9u) >> 31) != 0u;
}

// Unnormalized Sylvester butterfly across the SIMD group, steps 1..16 (CPU reference order).
static inline float tq_butterfly32(float v, uint lane) {
    for (ushort h = 1; h < 32; h <<= 1) {
        const float o = simd_shuffle_xor(v, h);
        v = (lane & h) ? (o - v) : (v + o);
    }
    return v;
}

static inline float tq4_weight(device const uchar * b, uint lane) {
    const float d = tq_f16_to_f32(tq_u16(b + (lane < 16 ? 0 : 2)));
    const uint q = (b[4 + (lane >> 1)] >> ((lane & 1u) * 4u)) & 15u;
    return TQ_C4[q] * d;
}

static inline float tq3_weight(device const uchar * b, uint lane) {
    const float d = tq_f16_to_f32(tq_u16(b + (lane < 16 ? 0 : 2)));
    device const uchar * g = b + 4 + 3 * (lane >> 3);
    const uint w = uint(g[0]) | (uint(g[1]) << 8) | (uint(g[2]) << 16);
    const uint q = (w >> (3u * (lane & 7u))) & 7u;
    return TQ_C3[q] * d;
}

static inline float tq_inverse_finish(float v, uint lane) {
    v = tq_butterfly32(v, lane);
    return v * (tq_sign_negative(lane) ? -TQ_INV_SQRT32 : TQ_INV_SQRT32);
}

kernel void tq4_dequant(device const uchar * src [[buffer(0)]],
                        device float * dst [[buffer(1)]],
                        constant uint & n_blocks [[buffer(2)]],
                        uint tid [[thread_position_in_grid]]) {
    const uint blk = tid >> 5;
    const uint lane = tid & 31u;
    if (blk >= n_blocks) {
        return;   // the whole SIMD group leaves together
    }
    const float v = tq4_weight(src + blk * 20u, lane);
    dst[blk * 32u + lane] = tq_inverse_finish(v, lane);
}

kernel void tq3_dequant(device const uchar * src [[buffer(0)]],
                        device float * dst [[buffer(1)]],
                        constant uint & n_blocks [[buffer(2)]],
                        uint tid [[thread_position_in_grid]]) {
    const uint blk = tid >> 5;
    const uint lane = tid & 31u;
    if (blk >= n_blocks) {
        return;
    }
    const float v = tq3_weight(src + blk * 16u, lane);
    dst[blk * 32u + lane] = tq_inverse_finish(v, lane);
}

kernel void tq_prerotate(device float * xr [[buffer(1)]],
                         constant uint & n_blocks [[buffer(2)]],
                         device const float * x [[buffer(4)]],
                         uint tid [[thread_position_in_grid]]) {
    const uint blk = tid >> 5;
    const uint lane = tid & 31u;
    if (blk >= n_blocks) {
        return;
    }
    float v = x[blk * 32u + lane];
    v = tq_sign_negative(lane) ? -v : v;
    v = tq_butterfly32(v, lane);
    xr[blk * 32u + lane] = v * TQ_INV_SQRT32;
}

kernel void tq4_matvec(device const uchar * w [[buffer(0)]],
                       device float * y [[buffer(1)]],
                       constant uint & rows [[buffer(2)]],
                       constant uint & cols [[buffer(3)]],
                       device const float * xr [[buffer(4)]],
                       uint tid [[thread_position_in_grid]]) {
    const uint row = tid >> 5;
    const uint lane = tid & 31u;
    if (row >= rows) {
        return;
    }
    const uint bpr = cols / 32u;
    device const uchar * wr = w + row * bpr * 20u;
    float acc = 0.0f;
    for (uint ib = 0; ib < bpr; ++ib) {
        acc += tq4_weight(wr + ib * 20u, lane) * xr[ib * 32u + lane];
    }
    acc = tq_simd_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}

kernel void tq3_matvec(device const uchar * w [[buffer(0)]],
                       device float * y [[buffer(1)]],
                       constant uint & rows [[buffer(2)]],
                       constant uint & cols [[buffer(3)]],
                       device const float * xr [[buffer(4)]],
                       uint tid [[thread_position_in_grid]]) {
    const uint row = tid >> 5;
    const uint lane = tid & 31u;
    if (row >= rows) {
        return;
    }
    const uint bpr = cols / 32u;
    device const uchar * wr = w + row * bpr * 16u;
    float acc = 0.0f;
    for (uint ib = 0; ib < bpr; ++ib) {
        acc += tq3_weight(wr + ib * 16u, lane) * xr[ib * 32u + lane];
    }
    acc = tq_simd_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}

// Tokens per SIMD group of the mat-mul (tq::gpu::MATMUL_TOKENS); the host pads X̂ to a multiple.
#define TQ_MM_TOKENS 8

// rows, cols as the mat-vec; tokens = activation rows; xr = X̂ (tokens × cols, padded to a
// multiple of TQ_MM_TOKENS rows); y = Y (tokens × rows). Threadgroup g = tile · ceil(rows/4) +
// row group, 128 threads each (the kernel table's geometry).
static inline void tq_matmul(device const uchar * w, device float * y, uint rows, uint cols,
                             uint tokens, device const float * xr, uint tid, bool tq4) {
    const uint rgs = (rows + 3u) / 4u;
    const uint g = tid >> 7;
    const uint row = (g % rgs) * 4u + ((tid >> 5) & 3u);
    const uint t0 = (g / rgs) * TQ_MM_TOKENS;
    const uint lane = tid & 31u;
    if (row >= rows || t0 >= tokens) {
        return;   // the whole SIMD group leaves together
    }
    const uint bpr = cols / 32u;
    const uint bb = tq4 ? 20u : 16u;
    device const uchar * wr = w + row * bpr * bb;
    device const float * xt = xr + t0 * cols + lane;
    float acc[TQ_MM_TOKENS];
    for (int k = 0; k < TQ_MM_TOKENS; ++k) {
        acc[k] = 0.0f;
    }
    for (uint ib = 0; ib < bpr; ++ib) {
        const float wv = tq4 ? tq4_weight(wr + ib * bb, lane) : tq3_weight(wr + ib * bb, lane);
        for (int k = 0; k < TQ_MM_TOKENS; ++k) {
            acc[k] += wv * xt[uint(k) * cols + ib * 32u];
        }
    }
    for (int k = 0; k < TQ_MM_TOKENS; ++k) {
        const float s = tq_simd_sum(acc[k]);
        if (lane == 0 && t0 + uint(k) < tokens) {
            y[(t0 + uint(k)) * rows + row] = s;
        }
    }
}

kernel void tq4_matmul(device const uchar * w [[buffer(0)]],
                       device float * y [[buffer(1)]],
                       constant uint & rows [[buffer(2)]],
                       constant uint & cols [[buffer(3)]],
                       device const float * xr [[buffer(4)]],
                       constant uint & tokens [[buffer(8)]],
                       uint tid [[thread_position_in_grid]]) {
    tq_matmul(w, y, rows, cols, tokens, xr, tid, true);
}

kernel void tq3_matmul(device const uchar * w [[buffer(0)]],
                       device float * y [[buffer(1)]],
                       constant uint & rows [[buffer(2)]],
                       constant uint & cols [[buffer(3)]],
                       device const float * xr [[buffer(4)]],
                       constant uint & tokens [[buffer(8)]],
                       uint tid [[thread_position_in_grid]]) {
    tq_matmul(w, y, rows, cols, tokens, xr, tid, false);
}
