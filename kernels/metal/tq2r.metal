// tq GPU kernels, Metal: tq2_r, the seed design's incoherent 2-bit weights (FORMATS.md §6,
// docs/formats.md). Prepend common.metal. The algorithms of kernels/cuda/tq2r.cu, SIMD-group
// shuffles for the GEMV's reduction.
//
//   tq2r_dequant    rotated-domain decode; 256 threads = 8 blocks of 32.
//   tq2r_rotate     whole-row rotation of rows of ≤ 4096 values, one 256-thread threadgroup per
//                   row, the row in threadgroup memory.
//   tq2r_rot_local, tq2r_rot_stage, tq2r_rot_mix   the multi-pass rotation for longer rows.
//   tq2r_matvec     word-oriented 2-bit GEMV, one SIMD group per row.
// Buffers: 0 blocks, 1 output, 2 n, 3 cols, 4 vector input, 5 signs, 6 dense factor,
// 7 {flags, h, scale bits, step}.

#define TQ2R_SEED_LAYOUT 1u
#define TQ2R_INVERSE 2u
#define TQ2R_MIX_THEN_SCALE 4u
#define TQ2R_BYTES 10u
#define TQ2R_ROT_MAX 4096u

struct Tq2rParams {
    uint flags;
    uint h;
    uint scale;
    uint step;
};

// Code word `half` (0, 1) of block gb: 16 codes, code j at bits 2j.
static inline uint tq2r_word(device const uchar * src, uint gb, uint half, uint flags) {
    if (flags & TQ2R_SEED_LAYOUT) {
        return ((device const uint *)src)[2u * gb + half];
    }
    device const ushort * p = (device const ushort *)(src + gb * TQ2R_BYTES + 2u + 4u * half);
    return uint(p[0]) | (uint(p[1]) << 16);
}

static inline uint tq2r_scale_bits(device const uchar * src, uint gb, uint nblk, uint flags) {
    if (flags & TQ2R_SEED_LAYOUT) {
        return ((device const uint *)src)[2u * nblk + gb];
    }
    return as_type<uint>(tq_f16_to_f32(tq_u16(src + gb * TQ2R_BYTES)));
}

// (2q − 3)·s correctly rounded; a subnormal s in integer arithmetic (immune to FTZ).
static inline float tq2r_scaled_level(uint q, uint sbits) {
    const uint m = sbits & 0x7fffffu;
    if (((sbits >> 23) & 0xffu) != 0u || m == 0u) {
        return float(int(2u * q) - 3) * as_type<float>(sbits);
    }
    const uint sign = (sbits & 0x80000000u) ^ (q < 2u ? 0x80000000u : 0u);
    uint mag = m;
    if (q == 0u || q == 3u) {
        const uint t = 3u * m;
        if (t < 0x1000000u) {
            mag = t;
        } else {
            uint r = t >> 1;
            if ((t & 1u) && (r & 1u)) {
                r += 1u;
            }
            mag = r + 0x800000u;
        }
    }
    return as_type<float>(sign | mag);
}

kernel void tq2r_dequant(device const uchar * src [[buffer(0)]],
                         device float * dst [[buffer(1)]],
                         constant uint & n_blocks [[buffer(2)]],
                         constant Tq2rParams & p [[buffer(7)]],
                         uint tid [[thread_position_in_grid]]) {
    const uint gb = tid >> 5;
    const uint j = tid & 31u;
    if (gb >= n_blocks) {
        return;
    }
    const uint q = (tq2r_word(src, gb, j >> 4, p.flags) >> (2u * (j & 15u))) & 3u;
    dst[gb * 32u + j] = tq2r_scaled_level(q, tq2r_scale_bits(src, gb, n_blocks, p.flags));
}

// One butterfly stage over sh[0 .. cols) in segments of w; every thread calls it.
static inline void tq2r_sh_stage(threadgroup float * sh, uint t, uint nt, uint cols, uint w,
                                 uint step) {
    const uint half = w >> 1;
    for (uint q = t; q < (cols >> 1); q += nt) {
        const uint j = q % half;
        const uint lo = (q / half) * w + (j / step) * 2u * step + (j % step);
        const float a = sh[lo];
        const float c = sh[lo + step];
        sh[lo] = a + c;
        sh[lo + step] = a - c;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

static inline float tq2r_rot_finish(float y, uint i, device const float * signs,
                                    constant Tq2rParams & p) {
    if (p.flags & TQ2R_MIX_THEN_SCALE) {
        y = y * as_type<float>(p.scale);
    }
    if (p.flags & TQ2R_INVERSE) {
        y = y * signs[i];
    }
    return y;
}

kernel void tq2r_rotate(device float * y [[buffer(1)]],
                        constant uint & rows [[buffer(2)]],
                        constant uint & cols [[buffer(3)]],
                        device const float * x [[buffer(4)]],
                        device const float * signs [[buffer(5)]],
                        device const float * mat [[buffer(6)]],
                        constant Tq2rParams & p [[buffer(7)]],
                        uint row [[threadgroup_position_in_grid]],
                        uint t [[thread_position_in_threadgroup]],
                        uint nt [[threads_per_threadgroup]]) {
    threadgroup float sh[TQ2R_ROT_MAX];
    if (row >= rows || cols > TQ2R_ROT_MAX) {
        return;   // the whole threadgroup leaves together
    }
    const uint h = p.h ? p.h : 1u;
    const uint w = cols / h;
    const uint base = row * cols;
    const bool inverse = (p.flags & TQ2R_INVERSE) != 0u;
    for (uint i = t; i < cols; i += nt) {
        const float v = x[base + i];
        sh[i] = inverse ? v : v * signs[i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 1u; s < w; s *= 2u) {
        tq2r_sh_stage(sh, t, nt, cols, w, s);
    }
    if (!(p.flags & TQ2R_MIX_THEN_SCALE)) {
        for (uint i = t; i < cols; i += nt) {
            sh[i] = sh[i] * as_type<float>(p.scale);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (uint i = t; i < cols; i += nt) {
        float v = sh[i];
        if (h > 1u) {
            const uint a = i / w;
            const uint c = i % w;
            float acc = 0.0f;
            for (uint a2 = 0; a2 < h; ++a2) {
                acc = acc + mat[a * h + a2] * sh[a2 * w + c];
            }
            v = acc;
        }
        y[base + i] = tq2r_rot_finish(v, i, signs, p);
    }
}

kernel void tq2r_rot_local(device float * tbuf [[buffer(1)]],
                           constant uint & n_sub [[buffer(2)]],
                           constant uint & cols [[buffer(3)]],
                           device const float * x [[buffer(4)]],
                           device const float * signs [[buffer(5)]],
                           constant Tq2rParams & p [[buffer(7)]],
                           uint sb [[threadgroup_position_in_grid]],
                           uint t [[thread_position_in_threadgroup]],
                           uint nt [[threads_per_threadgroup]]) {
    threadgroup float sh[TQ2R_ROT_MAX];
    const uint l = p.step;
    if (sb >= n_sub || l > TQ2R_ROT_MAX) {
        return;
    }
    const uint base = sb * l;
    const bool inverse = (p.flags & TQ2R_INVERSE) != 0u;
    for (uint i = t; i < l; i += nt) {
        const float v = x[base + i];
        sh[i] = inverse ? v : v * signs[(base + i) % cols];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 1u; s < l; s *= 2u) {
        tq2r_sh_stage(sh, t, nt, l, l, s);
    }
    for (uint i = t; i < l; i += nt) {
        tbuf[base + i] = sh[i];
    }
}

kernel void tq2r_rot_stage(device float * tbuf [[buffer(1)]],
                           constant uint & n_pairs [[buffer(2)]],
                           constant uint & cols [[buffer(3)]],
                           constant Tq2rParams & p [[buffer(7)]],
                           uint tid [[thread_position_in_grid]]) {
    if (tid >= n_pairs) {
        return;
    }
    const uint w = cols / (p.h ? p.h : 1u);
    const uint half = w >> 1;
    const uint step = p.step;
    const uint j = tid % half;
    const uint lo = (tid / half) * w + (j / step) * 2u * step + (j % step);
    const float a = tbuf[lo];
    const float c = tbuf[lo + step];
    tbuf[lo] = a + c;
    tbuf[lo + step] = a - c;
}

kernel void tq2r_rot_mix(device float * y [[buffer(1)]],
                         constant uint & n [[buffer(2)]],
                         constant uint & cols [[buffer(3)]],
                         device const float * tbuf [[buffer(4)]],
                         device const float * signs [[buffer(5)]],
                         device const float * mat [[buffer(6)]],
                         constant Tq2rParams & p [[buffer(7)]],
                         uint idx [[thread_position_in_grid]]) {
    if (idx >= n) {
        return;
    }
    const uint h = p.h ? p.h : 1u;
    const uint w = cols / h;
    const uint i = idx % cols;
    const uint base = idx - i;
    const bool dct = !(p.flags & TQ2R_MIX_THEN_SCALE);
    const float k = as_type<float>(p.scale);
    float v;
    if (h == 1u) {
        v = dct ? tbuf[idx] * k : tbuf[idx];
    } else {
        const uint a = i / w;
        const uint c = i % w;
        float acc = 0.0f;
        for (uint a2 = 0; a2 < h; ++a2) {
            const float u = tbuf[base + a2 * w + c];
            acc = acc + mat[a * h + a2] * (dct ? u * k : u);
        }
        v = acc;
    }
    y[idx] = tq2r_rot_finish(v, i, signs, p);
}

kernel void tq2r_matvec(device const uchar * w [[buffer(0)]],
                        device float * y [[buffer(1)]],
                        constant uint & rows [[buffer(2)]],
                        constant uint & cols [[buffer(3)]],
                        device const float * xr [[buffer(4)]],
                        constant Tq2rParams & p [[buffer(7)]],
                        uint tid [[thread_position_in_grid]]) {
    const uint row = tid >> 5;
    const uint lane = tid & 31u;
    if (row >= rows) {
        return;   // the whole SIMD group leaves together
    }
    const uint bpr = cols / 32u;
    const uint nblk = rows * bpr;
    float acc = 0.0f;
    for (uint wi = lane; wi < cols / 16u; wi += 32u) {
        const uint gb = row * bpr + (wi >> 1);
        const uint word = tq2r_word(w, gb, wi & 1u, p.flags);
        device const float * xs = xr + wi * 16u;
        float s = 0.0f;
        for (uint i = 0; i < 16u; ++i) {
            s = s + float(int(2u * ((word >> (2u * i)) & 3u)) - 3) * xs[i];
        }
        acc = acc + as_type<float>(tq2r_scale_bits(w, gb, nblk, p.flags)) * s;
    }
    acc = tq_simd_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}

// ---- tq2_t (issue 19): trellis-coded 2-bit weights on the same whole-row rotation ----------
// The algorithms of kernels/cuda/tq2r.cu's tq2_t section (format and exactness argument in
// kernels/wgsl/tq2r.wgsl): tq2t_dequant one thread per value (256 threads = 4 blocks of 64),
// tq2t_matvec one SIMD group per row, lane l on values 2l, 2l+1 of every block. Buffers as the
// tq2_r kernels (7 is bound and unused).

#define TQ2T_BYTES 17u
#define TQ2T_MAD_A 34038481u
#define TQ2T_MAD_B 76625530u
#define TQ2T_INV_STD 0x3bddb447u

static inline uint tq2t_code(device const uchar * blk, uint j) {
    return (uint(blk[1u + (j >> 2)]) >> (2u * (j & 3u))) & 3u;
}

static inline uint tq2t_state(device const uchar * blk, uint j) {
    uint s = 0u;
    for (uint t = 0; t < 6u; ++t) {
        s |= tq2t_code(blk, (j + 64u - t) & 63u) << (2u * t);
    }
    return s;
}

static inline float tq2t_codeword(uint s) {
    const uint x = TQ2T_MAD_A * s + TQ2T_MAD_B;
    const uint sum = (x & 255u) + ((x >> 8) & 255u) + ((x >> 16) & 255u) + (x >> 24);
    return float(int(sum) - 510) * as_type<float>(TQ2T_INV_STD);
}

static inline float tq2t_scale(uint e) {
    if (e == 0u) {
        return 0.0f;
    }
    return as_type<float>((((e >> 3) + 103u) << 23) | ((e & 7u) << 20));
}

// The states of values j = 2l and j + 1 from one 14-bit window of codes (the WGSL kernel's
// tq2t_states): digit k of r is code j + 1 − k.
static inline uint2 tq2t_states(device const uchar * blk, uint j) {
    device const uchar * q = blk + 1;
    uint w;
    if (j >= 5u) {
        const uint c0 = j - 5u;
        const uint k = c0 >> 2;
        const uint v = uint(q[k]) | (uint(q[k + 1u]) << 8) | (uint(q[min(k + 2u, 15u)]) << 16);
        w = (v >> (2u * (c0 & 3u))) & 0x3fffu;
    } else {
        const uint n1 = 5u - j;
        const uint hi = (uint(q[14]) | (uint(q[15]) << 8)) >> (2u * (3u + j));
        const uint lo = (uint(q[0]) | (uint(q[1]) << 8)) & ((1u << (2u * (j + 2u))) - 1u);
        w = hi | (lo << (2u * n1));
    }
    const uint b = reverse_bits(w) >> 18;
    const uint r = ((b >> 1) & 0x1555u) | ((b & 0x1555u) << 1);
    return uint2((r >> 2) & 0xfffu, r & 0xfffu);
}

kernel void tq2t_dequant(device const uchar * src [[buffer(0)]],
                         device float * dst [[buffer(1)]],
                         constant uint & n_blocks [[buffer(2)]],
                         constant Tq2rParams & p [[buffer(7)]],
                         uint tid [[thread_position_in_grid]]) {
    const uint gb = tid >> 6;
    const uint j = tid & 63u;
    if (gb >= n_blocks) {
        return;
    }
    device const uchar * blk = src + gb * TQ2T_BYTES;
    dst[gb * 64u + j] = tq2t_scale(uint(blk[0])) * tq2t_codeword(tq2t_state(blk, j));
}

kernel void tq2t_matvec(device const uchar * w [[buffer(0)]],
                        device float * y [[buffer(1)]],
                        constant uint & rows [[buffer(2)]],
                        constant uint & cols [[buffer(3)]],
                        device const float * xr [[buffer(4)]],
                        constant Tq2rParams & p [[buffer(7)]],
                        uint tid [[thread_position_in_grid]]) {
    const uint row = tid >> 5;
    const uint lane = tid & 31u;
    if (row >= rows) {
        return;   // the whole SIMD group leaves together
    }
    const uint bpr = cols / 64u;
    const uint j = 2u * lane;
    float acc = 0.0f;
    for (uint b = 0; b < bpr; ++b) {
        device const uchar * blk = w + (row * bpr + b) * TQ2T_BYTES;
        const uint2 st = tq2t_states(blk, j);
        const uint s0 = st.x;
        const uint s1 = st.y;
        device const float * xs = xr + b * 64u + j;
        const float q = tq2t_codeword(s0) * xs[0] + tq2t_codeword(s1) * xs[1];
        acc = acc + tq2t_scale(uint(blk[0])) * q;
    }
    acc = tq_simd_sum(acc);
    if (lane == 0) {
        y[row] = acc;
    }
}
