// tq GPU decode kernels, CUDA: TQ4_1S / TQ3_1S weights (FORMATS.md §2). Prepend common.cuh.
//
//   tq4_dequant, tq3_dequant   one warp per 32-block: centroid × half scale, inverse RHT
//                              (butterfly over lanes with __shfl_xor_sync, then × (1/√32)·sign).
//                              Bit-exact with the CPU reference under --fmad=false.
//   tq_prerotate               forward RHT of each 32-block of the activation (× sign, butterfly,
//                              × 1/√32), as the fork's tq_prerotate_activation.
//   tq4_matvec, tq3_matvec     one warp per row over the rotated activation: lane l handles
//                              element l of every block (w = C[idx]·d_half, acc += w·x̂), then a
//                              warp xor-sum. Mirrors the fork's float mmvq path (TQ3_1S, and
//                              TQ4_1S where it does not use dp4a); held to a relative bound.
//   tq4_matmul, tq3_matmul     Y[t][r] = W[r]·X̂[t] for many activation rows (tokens): one warp
//                              per (row, tile of TQ_MM_TOKENS tokens), each lane one element of
//                              every block as in the mat-vec, one warp sum per token. Per token
//                              the same operations in the same order as tq*_matvec.
// Launch: dequant/prerotate 256 threads (8 blocks) per CUDA block; matvec 128 threads (4 rows);
// matmul 128 threads (4 rows) per CUDA block, blockIdx.x = tile * ceil(rows/4) + row group.

#define TQ_INV_SQRT32 0.17677669529663688f

__constant__ float TQ_C4[16] = {
    -2.732590f, -2.069017f, -1.618046f, -1.256231f, -0.942340f, -0.656759f, -0.388048f, -0.128395f,
     0.128395f,  0.388048f,  0.656759f,  0.942340f,  1.256231f,  1.618046f,  2.069017f,  2.732590f};
__constant__ float TQ_C3[8] = {
    -1.996684f, -1.291398f, -0.740341f, -0.247508f, 0.230106f, 0.725222f, 1.277503f, 1.988943f};

// -1 where the top bit of (i * 0x9E3779B9) mod 2^32 is set.
__device__ __forceinline__ bool tq_sign_negative(unsigned int i) {
    return ((i * 0x9E3779B9u) >> 31) != 0u;
}

// Unnormalized Sylvester butterfly across the warp, steps 1..16 in the CPU reference's order:
// the lane with the step bit clear gets a + c, the other a - c.
__device__ __forceinline__ float tq_butterfly32(float v, unsigned int lane) {
    for (unsigned int h = 1; h < 32; h <<= 1) {
        const float o = __shfl_xor_sync(TQ_FULL_MASK, v, h);
        v = (lane & h) ? (o - v) : (v + o);
    }
    return v;
}

__device__ __forceinline__ float tq4_weight(const unsigned char * b, unsigned int lane) {
    const float d = tq_f16_to_f32(tq_u16(b + (lane < 16 ? 0 : 2)));
    const unsigned int q = (b[4 + (lane >> 1)] >> ((lane & 1u) * 4u)) & 15u;
    return TQ_C4[q] * d;
}

__device__ __forceinline__ float tq3_weight(const unsigned char * b, unsigned int lane) {
    const float d = tq_f16_to_f32(tq_u16(b + (lane < 16 ? 0 : 2)));
    const unsigned char * g = b + 4 + 3 * (lane >> 3);
    const unsigned int w = (unsigned int)g[0] | ((unsigned int)g[1] << 8) | ((unsigned int)g[2] << 16);
    const unsigned int q = (w >> (3u * (lane & 7u))) & 7u;
    return TQ_C3[q] * d;
}

__device__ __forceinline__ float tq_inverse_finish(float v, unsigned int lane) {
    v = tq_butterfly32(v, lane);
    return v * (tq_sign_negative(lane) ? -TQ_INV_SQRT32 : TQ_INV_SQRT32);
}

extern "C" __global__ void tq4_dequant(const unsigned char * __restrict__ src,
                                       float * __restrict__ dst, unsigned int n_blocks) {
    const unsigned int blk = blockIdx.x * 8u + (threadIdx.x >> 5);
    const unsigned int lane = threadIdx.x & 31u;
    if (blk >= n_blocks) {
        return;   // the whole warp leaves together
    }
    const float v = tq4_weight(src + (size_t)blk * 20u, lane);
    dst[(size_t)blk * 32u + lane] = tq_inverse_finish(v, lane);
}

extern "C" __global__ void tq3_dequant(const unsigned char * __restrict__ src,
                                       float * __restrict__ dst, unsigned int n_blocks) {
    const unsigned int blk = blockIdx.x * 8u + (threadIdx.x >> 5);
    const unsigned int lane = threadIdx.x & 31u;
    if (blk >= n_blocks) {
        return;
    }
    const float v = tq3_weight(src + (size_t)blk * 16u, lane);
    dst[(size_t)blk * 32u + lane] = tq_inverse_finish(v, lane);
}

extern "C" __global__ void tq_prerotate(const float * __restrict__ x, float * __restrict__ xr,
                                        unsigned int n_blocks) {
    const unsigned int blk = blockIdx.x * 8u + (threadIdx.x >> 5);
    const unsigned int lane = threadIdx.x & 31u;
    if (blk >= n_blocks) {
        return;
    }
    float v = x[(size_t)blk * 32u + lane];
    v = tq_sign_negative(lane) ? -v : v;
    v = tq_butterfly32(v, lane);
    xr[(size_t)blk * 32u + lane] = v * TQ_INV_SQRT32;
}

extern "C" __global__ void tq4_matvec(const unsigned char * __restrict__ w,
                                      const float * __restrict__ xr, float * __restrict__ y,
                                      unsigned int rows, unsigned int cols) {
    const unsigned int row = blockIdx.x * 4u + (threadIdx.x >> 5);
    const unsigned int lane = threadIdx.x & 31u;
    if (row >= rows) {
        return;
    }
    const unsigned int bpr = cols / 32u;
    const unsigned char * wr = w + (size_t)row * bpr * 20u;
    float acc = 0.0f;
    for (unsigned int ib = 0; ib < bpr; ++ib) {
        acc += tq4_weight(wr + ib * 20u, lane) * xr[ib * 32u + lane];
    }
    acc = tq_warp_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}

extern "C" __global__ void tq3_matvec(const unsigned char * __restrict__ w,
                                      const float * __restrict__ xr, float * __restrict__ y,
                                      unsigned int rows, unsigned int cols) {
    const unsigned int row = blockIdx.x * 4u + (threadIdx.x >> 5);
    const unsigned int lane = threadIdx.x & 31u;
    if (row >= rows) {
        return;
    }
    const unsigned int bpr = cols / 32u;
    const unsigned char * wr = w + (size_t)row * bpr * 16u;
    float acc = 0.0f;
    for (unsigned int ib = 0; ib < bpr; ++ib) {
        acc += tq3_weight(wr + ib * 16u, lane) * xr[ib * 32u + lane];
    }
    acc = tq_warp_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}

// Tokens per warp of the mat-mul (tq::gpu::MATMUL_TOKENS); the host pads X̂ to a multiple.
#define TQ_MM_TOKENS 8

// rows, cols as the mat-vec; tokens = activation rows; xr = X̂ (tokens × cols, padded to a
// multiple of TQ_MM_TOKENS rows); y = Y (tokens × rows, token-major).
__device__ __forceinline__ void tq_matmul(const unsigned char * __restrict__ w,
                                          const float * __restrict__ xr, float * __restrict__ y,
                                          unsigned int rows, unsigned int cols,
                                          unsigned int tokens, bool tq4) {
    const unsigned int rgs = (rows + 3u) / 4u;
    const unsigned int row = (blockIdx.x % rgs) * 4u + (threadIdx.x >> 5);
    const unsigned int t0 = (blockIdx.x / rgs) * TQ_MM_TOKENS;
    const unsigned int lane = threadIdx.x & 31u;
    if (row >= rows || t0 >= tokens) {
        return;   // the whole warp leaves together
    }
    const unsigned int bpr = cols / 32u;
    const unsigned int bb = tq4 ? 20u : 16u;
    const unsigned char * wr = w + (size_t)row * bpr * bb;
    const float * xt = xr + (size_t)t0 * cols + lane;
    float acc[TQ_MM_TOKENS];
#pragma unroll
    for (int k = 0; k < TQ_MM_TOKENS; ++k) {
        acc[k] = 0.0f;
    }
    for (unsigned int ib = 0; ib < bpr; ++ib) {
        const float wv = tq4 ? tq4_weight(wr + ib * bb, lane) : tq3_weight(wr + ib * bb, lane);
#pragma unroll
        for (int k = 0; k < TQ_MM_TOKENS; ++k) {
            acc[k] += wv * xt[(size_t)k * cols + ib * 32u];
        }
    }
#pragma unroll
    for (int k = 0; k < TQ_MM_TOKENS; ++k) {
        const float s = tq_warp_sum(acc[k]);
        if (lane == 0 && t0 + k < tokens) {
            y[(size_t)(t0 + k) * rows + row] = s;
        }
    }
}

extern "C" __global__ void tq4_matmul(const unsigned char * __restrict__ w,
                                      const float * __restrict__ xr, float * __restrict__ y,
                                      unsigned int rows, unsigned int cols, unsigned int tokens) {
    tq_matmul(w, xr, y, rows, cols, tokens, true);
}

extern "C" __global__ void tq3_matmul(const unsigned char * __restrict__ w,
                                      const float * __restrict__ xr, float * __restrict__ y,
                                      unsigned int rows, unsigned int cols, unsigned int tokens) {
    tq_matmul(w, xr, y, rows, cols, tokens, false);
}
