// tq GPU kernels, CUDA: tq2_r, the seed design's incoherent 2-bit weights (FORMATS.md §6,
// docs/formats.md). Prepend common.cuh. The algorithms of kernels/wgsl/tq2r.wgsl, with warp
// shuffles for the GEMV's reduction.
//
//   tq2r_dequant    rotated-domain decode, (2q − 3)·d per value; 256 threads = 8 blocks of 32.
//                   flags & 1: the design's split layout (u32 code words, then f32 scales)
//                   instead of tq2_r blocks (f16 d + 8 code bytes, 10 bytes per block).
//   tq2r_rotate     whole-row rotation R·x (flags & 2: Rᵀ·y) of rows of ≤ 4096 values, one
//                   256-thread block per row, the row in shared memory: × sign, butterfly on each
//                   of the h segments of w = cols/h, then the dense factor and the scale
//                   (Hadamard, flags & 4: mix then × 1/√K; DCT: × 1/√w then mix).
//   tq2r_rot_local, tq2r_rot_stage, tq2r_rot_mix
//                   the same for rows of any length: butterflies inside sub-blocks of `step`
//                   ≤ 4096 values (one block each), one launch per remaining stage (one thread
//                   per pair, in place), then factor, scale and inverse sign (one thread/output).
//   tq2r_matvec     word-oriented 2-bit GEMV over the rotated activation: one warp per row, lane
//                   l takes u32 words l, l+32, … (16 codes each), warp xor-sum; 4 rows per
//                   128-thread block.
// Every tq2_r kernel ends with the four scalars (flags, h, scale bits, step). Compiled with
// --fmad=false: the rotation is bit-exact with the CPU transform (DCT factor included).

#define TQ2R_SEED_LAYOUT 1u
#define TQ2R_INVERSE 2u
#define TQ2R_MIX_THEN_SCALE 4u
#define TQ2R_BYTES 10u
#define TQ2R_ROT_MAX 4096u

// Code word `half` (0, 1) of block gb: 16 codes, code j at bits 2j.
__device__ __forceinline__ unsigned int tq2r_word(const unsigned char * __restrict__ src,
                                                  size_t gb, unsigned int half,
                                                  unsigned int flags) {
    if (flags & TQ2R_SEED_LAYOUT) {
        return ((const unsigned int *)src)[2 * gb + half];
    }
    // tq2_r blocks start at even offsets: two aligned 16-bit loads.
    const unsigned short * p = (const unsigned short *)(src + gb * TQ2R_BYTES + 2u + 4u * half);
    return (unsigned int)p[0] | ((unsigned int)p[1] << 16);
}

// f32 bits of block gb's scale; nblk = blocks in the buffer.
__device__ __forceinline__ unsigned int tq2r_scale_bits(const unsigned char * __restrict__ src,
                                                        size_t gb, size_t nblk,
                                                        unsigned int flags) {
    if (flags & TQ2R_SEED_LAYOUT) {
        return ((const unsigned int *)src)[2 * nblk + gb];
    }
    return __float_as_uint(tq_f16_to_f32(tq_u16(src + gb * TQ2R_BYTES)));
}

// (2q − 3)·s correctly rounded; a subnormal s in integer arithmetic (immune to FTZ).
__device__ __forceinline__ float tq2r_scaled_level(unsigned int q, unsigned int sbits) {
    const unsigned int m = sbits & 0x7fffffu;
    if (((sbits >> 23) & 0xffu) != 0u || m == 0u) {
        return (float)((int)(2u * q) - 3) * __uint_as_float(sbits);
    }
    const unsigned int sign = (sbits & 0x80000000u) ^ (q < 2u ? 0x80000000u : 0u);
    unsigned int mag = m;
    if (q == 0u || q == 3u) {
        const unsigned int t = 3u * m;
        if (t < 0x1000000u) {
            mag = t;
        } else {
            unsigned int r = t >> 1;
            if ((t & 1u) && (r & 1u)) {
                r += 1u;
            }
            mag = r + 0x800000u;
        }
    }
    return __uint_as_float(sign | mag);
}

extern "C" __global__ void tq2r_dequant(const unsigned char * __restrict__ src,
                                        float * __restrict__ dst, unsigned int n_blocks,
                                        unsigned int flags, unsigned int h, unsigned int scale,
                                        unsigned int step) {
    const size_t gb = (size_t)blockIdx.x * 8u + (threadIdx.x >> 5);
    const unsigned int j = threadIdx.x & 31u;
    if (gb >= n_blocks) {
        return;
    }
    const unsigned int q = (tq2r_word(src, gb, j >> 4, flags) >> (2u * (j & 15u))) & 3u;
    dst[gb * 32u + j] = tq2r_scaled_level(q, tq2r_scale_bits(src, gb, n_blocks, flags));
}

// One butterfly stage over sh[0 .. cols) in segments of w; every thread of the block calls it.
__device__ __forceinline__ void tq2r_sh_stage(float * sh, unsigned int cols, unsigned int w,
                                              unsigned int step) {
    const unsigned int half = w >> 1;
    for (unsigned int p = threadIdx.x; p < (cols >> 1); p += blockDim.x) {
        const unsigned int j = p % half;
        const unsigned int lo = (p / half) * w + (j / step) * 2u * step + (j % step);
        const float a = sh[lo];
        const float c = sh[lo + step];
        sh[lo] = a + c;
        sh[lo + step] = a - c;
    }
    __syncthreads();
}

__device__ __forceinline__ float tq2r_rot_finish(float y, unsigned int i,
                                                 const float * __restrict__ signs,
                                                 unsigned int flags, unsigned int scale) {
    if (flags & TQ2R_MIX_THEN_SCALE) {
        y = y * __uint_as_float(scale);
    }
    if (flags & TQ2R_INVERSE) {
        y = y * signs[i];
    }
    return y;
}

extern "C" __global__ void tq2r_rotate(const float * __restrict__ x, float * __restrict__ y,
                                       unsigned int rows, unsigned int cols,
                                       const float * __restrict__ signs,
                                       const float * __restrict__ mat, unsigned int flags,
                                       unsigned int h, unsigned int scale, unsigned int step) {
    __shared__ float sh[TQ2R_ROT_MAX];
    const unsigned int row = blockIdx.x;
    if (row >= rows || cols > TQ2R_ROT_MAX) {
        return;   // the whole block leaves together
    }
    h = h ? h : 1u;
    const unsigned int w = cols / h;
    const size_t base = (size_t)row * cols;
    const bool inverse = (flags & TQ2R_INVERSE) != 0u;
    for (unsigned int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = x[base + i];
        sh[i] = inverse ? v : v * signs[i];
    }
    __syncthreads();
    for (unsigned int s = 1u; s < w; s *= 2u) {
        tq2r_sh_stage(sh, cols, w, s);
    }
    if (!(flags & TQ2R_MIX_THEN_SCALE)) {
        for (unsigned int i = threadIdx.x; i < cols; i += blockDim.x) {
            sh[i] = sh[i] * __uint_as_float(scale);
        }
        __syncthreads();
    }
    for (unsigned int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = sh[i];
        if (h > 1u) {
            const unsigned int a = i / w;
            const unsigned int c = i % w;
            float acc = 0.0f;
            for (unsigned int a2 = 0; a2 < h; ++a2) {
                acc = acc + mat[a * h + a2] * sh[a2 * w + c];
            }
            v = acc;
        }
        y[base + i] = tq2r_rot_finish(v, i, signs, flags, scale);
    }
}

extern "C" __global__ void tq2r_rot_local(const float * __restrict__ x, float * __restrict__ t,
                                          unsigned int n_sub, unsigned int cols,
                                          const float * __restrict__ signs, unsigned int flags,
                                          unsigned int h, unsigned int scale, unsigned int step) {
    __shared__ float sh[TQ2R_ROT_MAX];
    const unsigned int sb = blockIdx.x;
    const unsigned int l = step;
    if (sb >= n_sub || l > TQ2R_ROT_MAX) {
        return;
    }
    const size_t base = (size_t)sb * l;
    const bool inverse = (flags & TQ2R_INVERSE) != 0u;
    for (unsigned int i = threadIdx.x; i < l; i += blockDim.x) {
        const float v = x[base + i];
        sh[i] = inverse ? v : v * signs[(base + i) % cols];
    }
    __syncthreads();
    for (unsigned int s = 1u; s < l; s *= 2u) {
        tq2r_sh_stage(sh, l, l, s);
    }
    for (unsigned int i = threadIdx.x; i < l; i += blockDim.x) {
        t[base + i] = sh[i];
    }
}

extern "C" __global__ void tq2r_rot_stage(float * __restrict__ t, unsigned int n_pairs,
                                          unsigned int cols, unsigned int flags, unsigned int h,
                                          unsigned int scale, unsigned int step) {
    const size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n_pairs) {
        return;
    }
    const size_t w = cols / (h ? h : 1u);
    const size_t half = w >> 1;
    const size_t j = p % half;
    const size_t lo = (p / half) * w + (j / step) * 2u * step + (j % step);
    const float a = t[lo];
    const float c = t[lo + step];
    t[lo] = a + c;
    t[lo + step] = a - c;
}

extern "C" __global__ void tq2r_rot_mix(const float * __restrict__ t, float * __restrict__ y,
                                        unsigned int n, unsigned int cols,
                                        const float * __restrict__ signs,
                                        const float * __restrict__ mat, unsigned int flags,
                                        unsigned int h, unsigned int scale, unsigned int step) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) {
        return;
    }
    h = h ? h : 1u;
    const unsigned int w = cols / h;
    const unsigned int i = (unsigned int)(idx % cols);
    const size_t base = idx - i;
    const bool dct = !(flags & TQ2R_MIX_THEN_SCALE);
    const float k = __uint_as_float(scale);
    float v;
    if (h == 1u) {
        v = dct ? t[idx] * k : t[idx];
    } else {
        const unsigned int a = i / w;
        const unsigned int c = i % w;
        float acc = 0.0f;
        for (unsigned int a2 = 0; a2 < h; ++a2) {
            const float u = t[base + (size_t)a2 * w + c];
            acc = acc + mat[a * h + a2] * (dct ? u * k : u);
        }
        v = acc;
    }
    y[idx] = tq2r_rot_finish(v, i, signs, flags, scale);
}

extern "C" __global__ void tq2r_matvec(const unsigned char * __restrict__ w,
                                       const float * __restrict__ xr, float * __restrict__ y,
                                       unsigned int rows, unsigned int cols, unsigned int flags,
                                       unsigned int h, unsigned int scale, unsigned int step) {
    const unsigned int row = blockIdx.x * 4u + (threadIdx.x >> 5);
    const unsigned int lane = threadIdx.x & 31u;
    if (row >= rows) {
        return;   // the whole warp leaves together
    }
    const unsigned int bpr = cols / 32u;
    const size_t nblk = (size_t)rows * bpr;
    float acc = 0.0f;
    for (unsigned int wi = lane; wi < cols / 16u; wi += 32u) {
        const size_t gb = (size_t)row * bpr + (wi >> 1);
        const unsigned int word = tq2r_word(w, gb, wi & 1u, flags);
        const float * xs = xr + (size_t)wi * 16u;
        float s = 0.0f;
        for (unsigned int i = 0; i < 16u; ++i) {
            s = s + (float)((int)(2u * ((word >> (2u * i)) & 3u)) - 3) * xs[i];
        }
        acc = acc + __uint_as_float(tq2r_scale_bits(w, gb, nblk, flags)) * s;
    }
    acc = tq_warp_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}

// ---- tq2_t (issue 19): trellis-coded 2-bit weights on the same whole-row rotation ----------
// The algorithms of the tq2_t section of kernels/wgsl/tq2r.wgsl (format, exactness argument
// there): 17-byte blocks of 64 rotated values, value j = scale(e)·c(s_j), tail-biting L = 12
// state, 1MAD codeword. The rotation kernels above do R·x and Rᵀ.
//
//   tq2t_dequant    rotated-domain decode, one thread per value; 256 threads = 4 blocks of 64.
//   tq2t_matvec     GEMV over the rotated activation: one warp per row, lane l takes values 2l,
//                   2l+1 of every block (both states from one window of codes), warp xor-sum;
//                   4 rows per 128-thread block.
// Both take the four tq2_r scalars last (unused), like every kernel of this file.

#define TQ2T_BYTES 17u
#define TQ2T_MAD_A 34038481u
#define TQ2T_MAD_B 76625530u
#define TQ2T_INV_STD 0x3bddb447u

__device__ __forceinline__ unsigned int tq2t_code(const unsigned char * __restrict__ blk,
                                                  unsigned int j) {
    return (blk[1u + (j >> 2)] >> (2u * (j & 3u))) & 3u;
}

__device__ __forceinline__ unsigned int tq2t_state(const unsigned char * __restrict__ blk,
                                                   unsigned int j) {
    unsigned int s = 0u;
#pragma unroll
    for (unsigned int t = 0; t < 6u; ++t) {
        s |= tq2t_code(blk, (j + 64u - t) & 63u) << (2u * t);
    }
    return s;
}

__device__ __forceinline__ float tq2t_codeword(unsigned int s) {
    const unsigned int x = TQ2T_MAD_A * s + TQ2T_MAD_B;
    const unsigned int sum = (x & 255u) + ((x >> 8) & 255u) + ((x >> 16) & 255u) + (x >> 24);
    return __fmul_rn((float)((int)sum - 510), __uint_as_float(TQ2T_INV_STD));
}

__device__ __forceinline__ float tq2t_scale(unsigned int e) {
    if (e == 0u) {
        return 0.0f;
    }
    return __uint_as_float((((e >> 3) + 103u) << 23) | ((e & 7u) << 20));
}

// The states of values j = 2l and j + 1 from one 14-bit window of the code stream (codes
// j − 5 .. j + 1; at j < 5 it wraps to the block's end), 2-bit digits reversed: digit k of r is
// code j + 1 − k. Three byte reads inside the block (the WGSL kernel's tq2t_states).
__device__ __forceinline__ void tq2t_states(const unsigned char * __restrict__ blk, unsigned int j,
                                            unsigned int * s0, unsigned int * s1) {
    const unsigned char * q = blk + 1;
    unsigned int w;
    if (j >= 5u) {
        const unsigned int c0 = j - 5u;
        const unsigned int k = c0 >> 2;
        const unsigned int v = (unsigned int)q[k] | ((unsigned int)q[k + 1u] << 8) |
                               ((unsigned int)q[min(k + 2u, 15u)] << 16);
        w = (v >> (2u * (c0 & 3u))) & 0x3fffu;
    } else {
        const unsigned int n1 = 5u - j;
        const unsigned int hi = ((unsigned int)q[14] | ((unsigned int)q[15] << 8)) >> (2u * (3u + j));
        const unsigned int lo =
            ((unsigned int)q[0] | ((unsigned int)q[1] << 8)) & ((1u << (2u * (j + 2u))) - 1u);
        w = hi | (lo << (2u * n1));
    }
    const unsigned int b = __brev(w) >> 18;
    const unsigned int r = ((b >> 1) & 0x1555u) | ((b & 0x1555u) << 1);
    *s0 = (r >> 2) & 0xfffu;
    *s1 = r & 0xfffu;
}

extern "C" __global__ void tq2t_dequant(const unsigned char * __restrict__ src,
                                        float * __restrict__ dst, unsigned int n_blocks,
                                        unsigned int flags, unsigned int h, unsigned int scale,
                                        unsigned int step) {
    const size_t gb = (size_t)blockIdx.x * 4u + (threadIdx.x >> 6);
    const unsigned int j = threadIdx.x & 63u;
    if (gb >= n_blocks) {
        return;
    }
    const unsigned char * blk = src + gb * TQ2T_BYTES;
    dst[gb * 64u + j] = __fmul_rn(tq2t_scale(blk[0]), tq2t_codeword(tq2t_state(blk, j)));
}

extern "C" __global__ void tq2t_matvec(const unsigned char * __restrict__ w,
                                       const float * __restrict__ xr, float * __restrict__ y,
                                       unsigned int rows, unsigned int cols, unsigned int flags,
                                       unsigned int h, unsigned int scale, unsigned int step) {
    const unsigned int row = blockIdx.x * 4u + (threadIdx.x >> 5);
    const unsigned int lane = threadIdx.x & 31u;
    if (row >= rows) {
        return;   // the whole warp leaves together
    }
    const unsigned int bpr = cols / 64u;
    const unsigned int j = 2u * lane;
    float acc = 0.0f;
    for (unsigned int b = 0; b < bpr; ++b) {
        const unsigned char * blk = w + ((size_t)row * bpr + b) * TQ2T_BYTES;
        unsigned int s0, s1;
        tq2t_states(blk, j, &s0, &s1);
        const float * xs = xr + (size_t)b * 64u + j;
        const float p = tq2t_codeword(s0) * xs[0] + tq2t_codeword(s1) * xs[1];
        acc = acc + tq2t_scale(blk[0]) * p;
    }
    acc = tq_warp_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}
