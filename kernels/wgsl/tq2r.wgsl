// tq GPU kernels, WGSL: tq2_r, the seed design's incoherent 2-bit weights (FORMATS.md §6,
// docs/formats.md). Prepend common.wgsl.
//
// Entry points
//   tq2r_dequant    rotated-domain decode, (2q − 3)·d per value; 256 threads = 8 blocks of 32.
//                   params.flags & 1: the design's split layout (u32 code words over the whole
//                   tensor, then one f32 scale per block) instead of tq2_r blocks (f16 d + 8 code
//                   bytes, 10 bytes per block).
//   tq2r_rotate     the whole-row rotation R·x (or Rᵀ·y: flags & 2) of rows of at most 4096
//                   values: one 256-thread workgroup per row, the row in workgroup memory (the
//                   design's single-workgroup input rotation). × sign, the unnormalized butterfly
//                   on each of the h segments of w = cols/h values (steps 1, 2, 4, …), then the
//                   dense h×h factor rot_mat and the scale: Hadamard (flags & 4) mix then
//                   × 1/√K, DCT × 1/√w then mix. The inverse binds the transposed factor and
//                   multiplies by the sign last.
//   tq2r_rot_local, tq2r_rot_stage, tq2r_rot_mix
//                   the same transform for rows of any length: butterflies inside sub-blocks of
//                   params.rot_step ≤ 4096 values (one workgroup each, signs first), one launch per
//                   remaining butterfly stage (one thread per pair, in place on dst), then the
//                   factor, scale and inverse sign (one thread per output, vec_in → dst).
//   tq2r_matvec     the word-oriented 2-bit GEMV: y[r] = Σ_b d_b · Σ_j (2q_j − 3)·x'_j over the
//                   rotated activation x' (vec_in). 32 lanes per row, each lane one u32 word
//                   (16 codes) at a time, tree sum; 8 rows per 256-thread workgroup.
// Extra bindings: 4 rot_signs (±1 per position of a row), 5 rot_mat (h×h, row-major).
//
// Exactness: the decode is bit-exact with the CPU reference (subnormal f32 scales of the design's
// layout are multiplied in integer arithmetic, so a device that flushes subnormals still gets
// them right). The rotation does the CPU transform's f32 operations in its order (sums over the
// dense factor from 0 in increasing order): bit-exact for Hadamard factors, whose ±1 products
// are exact whether or not a compiler fuses them; a DCT factor is held to a bound. The GEMV sums
// in its own order and is held to a relative bound (docs/kernels.md).

const TQ2R_SEED_LAYOUT: u32 = 1u;
const TQ2R_INVERSE: u32 = 2u;
const TQ2R_MIX_THEN_SCALE: u32 = 4u;
const TQ2R_BYTES: u32 = 10u;
const ROT_MAX: u32 = 4096u;

@group(0) @binding(4) var<storage, read> rot_signs: array<f32>;
@group(0) @binding(5) var<storage, read> rot_mat: array<f32>;

var<workgroup> rsh: array<f32, 4096>;
var<workgroup> red: array<f32, 256>;

// Code word `half` (0, 1) of block gb: 16 codes, code j at bits 2j.
fn tq2r_word(gb: u32, half: u32) -> u32 {
    if ((params.flags & TQ2R_SEED_LAYOUT) != 0u) {
        return src[2u * gb + half];
    }
    let o = gb * TQ2R_BYTES + 2u + 4u * half; // even: aligned, or two halves of two words
    let i = o >> 2u;
    if ((o & 2u) == 0u) {
        return src[i];
    }
    return (src[i] >> 16u) | (src[i + 1u] << 16u);
}

// The f32 bits of block gb's scale; nblk = blocks in the buffer (the design's scales follow the
// 2·nblk code words).
fn tq2r_scale_bits(gb: u32, nblk: u32) -> u32 {
    if ((params.flags & TQ2R_SEED_LAYOUT) != 0u) {
        return src[2u * nblk + gb];
    }
    let o = gb * TQ2R_BYTES;
    return bitcast<u32>(f16_to_f32((src[o >> 2u] >> ((o & 2u) * 8u)) & 0xffffu));
}

// (2q − 3)·s correctly rounded. A normal (or zero, inf, NaN) s: one f32 product, which cannot
// be subnormal. A subnormal s (m·2^-149): integer arithmetic, immune to flush-to-zero.
fn scaled_level(q: u32, sbits: u32) -> f32 {
    let m = sbits & 0x7fffffu;
    if (((sbits >> 23u) & 0xffu) != 0u || m == 0u) {
        return f32(i32(2u * q) - 3) * bitcast<f32>(sbits);
    }
    let sign = (sbits & 0x80000000u) ^ select(0u, 0x80000000u, q < 2u);
    var mag = m;
    if (q == 0u || q == 3u) {
        let t = 3u * m;
        if (t < 0x1000000u) {
            mag = t; // subnormal, or exponent field 1: the bits are 3m
        } else {
            var r = t >> 1u; // exponent field 2: 3m/2 to nearest, ties to even
            if ((t & 1u) == 1u && (r & 1u) == 1u) {
                r = r + 1u;
            }
            mag = r + 0x800000u;
        }
    }
    return bitcast<f32>(sign | mag);
}

@compute @workgroup_size(256)
fn tq2r_dequant(@builtin(local_invocation_index) t: u32,
                @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let gb = group_index(wid, nwg) * 8u + (t >> 5u);
    if (gb < params.n) {
        let j = t & 31u;
        let q = (tq2r_word(gb, j >> 4u) >> (2u * (j & 15u))) & 3u;
        dst[gb * 32u + j] = scaled_level(q, tq2r_scale_bits(gb, params.n));
    }
}

// One butterfly stage (`step`) over rsh[0 .. cols) in segments of w; every thread calls it.
fn rsh_stage(t: u32, cols: u32, w: u32, step: u32) {
    let half = w >> 1u;
    for (var p = t; p < (cols >> 1u); p = p + 256u) {
        let j = p % half;
        let lo = (p / half) * w + (j / step) * 2u * step + (j % step);
        let a = rsh[lo];
        let c = rsh[lo + step];
        rsh[lo] = a + c;
        rsh[lo + step] = a - c;
    }
    workgroupBarrier();
}

// The Hadamard scale and the inverse's sign of output i (of a row).
fn rot_finish(y: f32, i: u32) -> f32 {
    var r = y;
    if ((params.flags & TQ2R_MIX_THEN_SCALE) != 0u) {
        r = r * bitcast<f32>(params.rot_scale);
    }
    if ((params.flags & TQ2R_INVERSE) != 0u) {
        r = r * rot_signs[i];
    }
    return r;
}

// params.n = rows, params.cols = K ≤ 4096; vec_in = rows of x; dst = R·x (or Rᵀ·x).
@compute @workgroup_size(256)
fn tq2r_rotate(@builtin(local_invocation_index) t: u32,
               @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_index(wid, nwg);
    let cols = min(params.cols, ROT_MAX);
    let h = max(params.rot_h, 1u);
    let w = cols / h;
    let valid = row < params.n;
    let base = row * cols;
    let inverse = (params.flags & TQ2R_INVERSE) != 0u;
    for (var i = t; i < cols; i = i + 256u) {
        var v = 0.0;
        if (valid) {
            v = vec_in[base + i];
            if (!inverse) {
                v = v * rot_signs[i];
            }
        }
        rsh[i] = v;
    }
    workgroupBarrier();
    for (var step = 1u; step < w; step = step * 2u) {
        rsh_stage(t, cols, w, step);
    }
    if ((params.flags & TQ2R_MIX_THEN_SCALE) == 0u) {
        for (var i = t; i < cols; i = i + 256u) {
            rsh[i] = rsh[i] * bitcast<f32>(params.rot_scale);
        }
        workgroupBarrier();
    }
    if (valid) {
        for (var i = t; i < cols; i = i + 256u) {
            var y = rsh[i];
            if (h > 1u) {
                let a = i / w;
                let c = i % w;
                var acc = 0.0;
                for (var a2 = 0u; a2 < h; a2 = a2 + 1u) {
                    acc = acc + rot_mat[a * h + a2] * rsh[a2 * w + c];
                }
                y = acc;
            }
            dst[base + i] = rot_finish(y, i);
        }
    }
}

// params.n = sub-blocks, params.rot_step = their length L (≤ 4096, ≤ w, a power of two),
// params.cols = K; vec_in = x; dst = scratch after the butterfly stages below L.
@compute @workgroup_size(256)
fn tq2r_rot_local(@builtin(local_invocation_index) t: u32,
                  @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let sb = group_index(wid, nwg);
    let l = min(params.rot_step, ROT_MAX);
    let valid = sb < params.n;
    let base = sb * l;
    let inverse = (params.flags & TQ2R_INVERSE) != 0u;
    for (var i = t; i < l; i = i + 256u) {
        var v = 0.0;
        if (valid) {
            v = vec_in[base + i];
            if (!inverse) {
                v = v * rot_signs[(base + i) % params.cols];
            }
        }
        rsh[i] = v;
    }
    workgroupBarrier();
    for (var step = 1u; step < l; step = step * 2u) {
        rsh_stage(t, l, l, step);
    }
    if (valid) {
        for (var i = t; i < l; i = i + 256u) {
            dst[base + i] = rsh[i];
        }
    }
}

// params.n = butterfly pairs (all rows), params.rot_step = the stage's step; dst in place.
@compute @workgroup_size(256)
fn tq2r_rot_stage(@builtin(local_invocation_index) t: u32,
                  @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let p = group_index(wid, nwg) * 256u + t;
    if (p < params.n) {
        let w = params.cols / max(params.rot_h, 1u);
        let half = w >> 1u;
        let step = params.rot_step;
        let j = p % half;
        let lo = (p / half) * w + (j / step) * 2u * step + (j % step);
        let a = dst[lo];
        let c = dst[lo + step];
        dst[lo] = a + c;
        dst[lo + step] = a - c;
    }
}

// params.n = values (all rows); vec_in = scratch after every butterfly stage; dst = output.
@compute @workgroup_size(256)
fn tq2r_rot_mix(@builtin(local_invocation_index) t: u32,
                @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = group_index(wid, nwg) * 256u + t;
    if (idx < params.n) {
        let cols = params.cols;
        let h = max(params.rot_h, 1u);
        let w = cols / h;
        let i = idx % cols;
        let base = idx - i;
        // DCT: the scale comes before the factor.
        let dct = (params.flags & TQ2R_MIX_THEN_SCALE) == 0u;
        var y: f32;
        if (h == 1u) {
            y = vec_in[idx];
            if (dct) {
                y = y * bitcast<f32>(params.rot_scale);
            }
        } else {
            let a = i / w;
            let c = i % w;
            var acc = 0.0;
            for (var a2 = 0u; a2 < h; a2 = a2 + 1u) {
                var v = vec_in[base + a2 * w + c];
                if (dct) {
                    v = v * bitcast<f32>(params.rot_scale);
                }
                acc = acc + rot_mat[a * h + a2] * v;
            }
            y = acc;
        }
        dst[idx] = rot_finish(y, i);
    }
}

// params.n = rows, params.cols = K; vec_in = x' (rotated activation); dst = y.
@compute @workgroup_size(256)
fn tq2r_matvec(@builtin(local_invocation_index) t: u32,
               @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_index(wid, nwg) * 8u + (t >> 5u);
    let lane = t & 31u;
    var acc = 0.0;
    if (row < params.n) {
        let bpr = params.cols / 32u;
        let nblk = params.n * bpr;
        for (var wi = lane; wi < params.cols / 16u; wi = wi + 32u) {
            let gb = row * bpr + (wi >> 1u);
            let word = tq2r_word(gb, wi & 1u);
            let x = wi * 16u;
            var s = 0.0;
            for (var i = 0u; i < 16u; i = i + 1u) {
                s = s + f32(i32(2u * ((word >> (2u * i)) & 3u)) - 3) * vec_in[x + i];
            }
            acc = acc + bitcast<f32>(tq2r_scale_bits(gb, nblk)) * s;
        }
    }
    red[t] = acc;
    for (var s = 16u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (lane < s) {
            red[t] = red[t] + red[t + s];
        }
    }
    workgroupBarrier();
    if (lane == 0u && row < params.n) {
        dst[row] = red[t];
    }
}

// ---- tq2_t (issue 19): trellis-coded 2-bit weights on the same whole-row rotation ----------
//
// Block (17 bytes per 64 rotated values): scale byte e, then 16 code bytes, code j at bits
// 2·(j mod 4) of byte 1 + j/4. Value j = scale(e) · c(s_j) with the tail-biting L = 12 state
// s_j = Σ_{t<6} code((j − t) mod 64) << 2t and the 1MAD codeword c(s) = (Σ bytes of
// (A·s + B mod 2³²) − 510) · INV_STD (src/types/tq2t.rs, docs/formats.md).
//
//   tq2t_dequant    rotated-domain decode, one thread per value; 256 threads = 4 blocks of 64.
//   tq2t_matvec     GEMV over the rotated activation x' (vec_in): 32 lanes per row, lane l takes
//                   values 2l and 2l+1 of every block of the row (both states from one 14-bit
//                   window of codes, tq2t_states), acc += d_b·(c(s_2l)·x'_2l + c(s_2l+1)·x'_2l+1);
//                   tree sum; 8 rows per 256-thread workgroup.
// Rows back to the original domain, and the activation's R·x, are the tq2r rotation kernels
// above (the same R): the host launches them around these two.
//
// Exactness: the state and the codeword's byte sum are integer arithmetic; the value is the
// CPU's two f32 products (f32(sum − 510)·INV_STD, then ·scale) with no addition to contract
// with. The scale byte decodes to a normal f32 (≥ 2^-24) built from bits and a nonzero |c| is
// ≥ 1/147.8, so no product is subnormal and flush-to-zero cannot change it: the decode is
// bit-exact. The GEMV sums in its own order and is held to the relative bound, like tq2r_matvec.

const TQ2T_BYTES: u32 = 17u;
const TQ2T_MAD_A: u32 = 34038481u;
const TQ2T_MAD_B: u32 = 76625530u;
const TQ2T_INV_STD: u32 = 0x3bddb447u; // f32 bits of 1/147.80054 (tq2t::MAD_INV_STD)

// Code j (0..63) of the block whose first byte is at `base`.
fn tq2t_code(base: u32, j: u32) -> u32 {
    return (rd_byte(base + 1u + (j >> 2u)) >> (2u * (j & 3u))) & 3u;
}

// The 12-bit tail-biting state of value j: its code in the low bits, the five before it above.
fn tq2t_state(base: u32, j: u32) -> u32 {
    var s = 0u;
    for (var t = 0u; t < 6u; t = t + 1u) {
        s = s | (tq2t_code(base, (j + 64u - t) & 63u) << (2u * t));
    }
    return s;
}

// The 1MAD codeword of state s (u32 arithmetic wraps, as the CPU's wrapping_mul/add).
fn tq2t_codeword(s: u32) -> f32 {
    let x = TQ2T_MAD_A * s + TQ2T_MAD_B;
    let sum = (x & 255u) + ((x >> 8u) & 255u) + ((x >> 16u) & 255u) + (x >> 24u);
    return f32(i32(sum) - 510) * bitcast<f32>(TQ2T_INV_STD);
}

// The scale byte: 0, or (8 + m)·2^(E − 27) = (1 + m/8)·2^(E − 24), E = e >> 3, m = e & 7.
fn tq2t_scale(e: u32) -> f32 {
    if (e == 0u) {
        return 0.0;
    }
    return bitcast<f32>((((e >> 3u) + 103u) << 23u) | ((e & 7u) << 20u));
}

// params.n = blocks; dst = the rotated values.
@compute @workgroup_size(256)
fn tq2t_dequant(@builtin(local_invocation_index) t: u32,
                @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let gb = group_index(wid, nwg) * 4u + (t >> 6u);
    if (gb < params.n) {
        let j = t & 63u;
        let base = gb * TQ2T_BYTES;
        dst[gb * 64u + j] = tq2t_scale(rd_byte(base)) * tq2t_codeword(tq2t_state(base, j));
    }
}

// The states of values j = 2l and j + 1 of the block at `base`, from one 14-bit window of the
// code stream (codes j − 5 .. j + 1, code c at bits 2c; at j < 5 it wraps to the block's end)
// with its 2-bit digits reversed: digit k of r is code j + 1 − k, so s_{j+1} = r & 0xfff and
// s_j = (r >> 2) & 0xfff. Three byte reads inside the block instead of seven.
fn tq2t_states(base: u32, j: u32) -> vec2<u32> {
    let q = base + 1u; // code byte 0
    var w: u32;
    if (j >= 5u) {
        let c0 = j - 5u; // odd: at bit 2 or 6 of its byte; the window ends within 3 bytes
        let k = c0 >> 2u;
        let v = rd_byte(q + k) | (rd_byte(q + k + 1u) << 8u) | (rd_byte(q + min(k + 2u, 15u)) << 16u);
        w = (v >> (2u * (c0 & 3u))) & 0x3fffu;
    } else {
        // Codes 59 + j .. 63 (5 − j of them) from code bytes 14, 15 (codes 56 .. 63), then
        // codes 0 .. j + 1 from code bytes 0, 1.
        let n1 = 5u - j;
        let hi = (rd_byte(q + 14u) | (rd_byte(q + 15u) << 8u)) >> (2u * (3u + j));
        let lo = (rd_byte(q) | (rd_byte(q + 1u) << 8u)) & ((1u << (2u * (j + 2u))) - 1u);
        w = hi | (lo << (2u * n1));
    }
    let b = reverseBits(w) >> 18u;
    let r = ((b >> 1u) & 0x1555u) | ((b & 0x1555u) << 1u);
    return vec2<u32>((r >> 2u) & 0xfffu, r & 0xfffu);
}

// params.n = rows, params.cols = K (a multiple of 64); vec_in = x' (rotated activation); dst = y.
@compute @workgroup_size(256)
fn tq2t_matvec(@builtin(local_invocation_index) t: u32,
               @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_index(wid, nwg) * 8u + (t >> 5u);
    let lane = t & 31u;
    var acc = 0.0;
    if (row < params.n) {
        let bpr = params.cols / 64u;
        let j = 2u * lane;
        for (var b = 0u; b < bpr; b = b + 1u) {
            let base = (row * bpr + b) * TQ2T_BYTES;
            let st = tq2t_states(base, j);
            let s0 = st.x;
            let s1 = st.y;
            let x = b * 64u + j;
            let p = tq2t_codeword(s0) * vec_in[x] + tq2t_codeword(s1) * vec_in[x + 1u];
            acc = acc + tq2t_scale(rd_byte(base)) * p;
        }
    }
    red[t] = acc;
    for (var s = 16u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (lane < s) {
            red[t] = red[t] + red[t + s];
        }
    }
    workgroupBarrier();
    if (lane == 0u && row < params.n) {
        dst[row] = red[t];
    }
}
