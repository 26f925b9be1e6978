// tq GPU decode kernels, WGSL: TQ4_1S / TQ3_1S weights (FORMATS.md §2). Prepend common.wgsl.
//
// Entry points
//   tq4_dequant, tq3_dequant   row dequantize: centroid × half scale, then the inverse 32-point
//                              RHT (butterfly, × (1/√32)·sign). 256 threads = 8 blocks of 32.
//   tq_prerotate               forward RHT of each 32-block of the activation (× sign,
//                              butterfly, × 1/√32) into dst: the matmul identity of FORMATS.md §2.
//                              One invocation per block, no barriers (64 blocks per workgroup).
//   tq4_matvec, tq3_matvec     y[r] = Σ_j C[idx_j]·d_half · x̂_j over a row, with x̂ the output of
//                              tq_prerotate (bound as vec_in). 64 threads per row.
//   tq4_matmul, tq3_matmul     Y[t][r] = Σ_j C[idx_j]·d_half · X̂[t][j] for many activation rows
//                              (tokens) at once, X̂ rotated by tq_prerotate: one invocation per
//                              (2 rows, tile of MM_TOKENS tokens), 128 rows per workgroup, no
//                              workgroup memory and no barriers (cheap on software devices).
// The dequantize path is bit-exact with the CPU reference (same f32 operations, same order);
// the mat-vec sums in another order and is held to a relative bound (docs/kernels.md).

// 4-bit and 3-bit Lloyd-Max codebooks, as f32 bit patterns (tq::types::tq::C4 / C3).
var<private> C4: array<u32, 16> = array<u32, 16>(
    0xc02ee2c1u, 0xc0046ac6u, 0xbfcf1c22u, 0xbfa0cc2du, 0xbf713d32u, 0xbf28215cu, 0xbec6ae3au, 0xbe0379fbu,
    0x3e0379fbu, 0x3ec6ae3au, 0x3f28215cu, 0x3f713d32u, 0x3fa0cc2du, 0x3fcf1c22u, 0x40046ac6u, 0x402ee2c1u);
var<private> C3: array<u32, 8> = array<u32, 8>(
    0xbfff9357u, 0xbfa54c88u, 0xbf3d86fdu, 0xbe7d72bdu, 0x3e6ba0e8u, 0x3f39a826u, 0x3fa38538u, 0x3ffe95afu);

// 1/sqrt(32) as the f32 the engines use (0.17677669529663688f).
const INV_SQRT32_BITS: u32 = 0x3e3504f3u;
const TQ4_BYTES: u32 = 20u;
const TQ3_BYTES: u32 = 16u;

var<workgroup> sh: array<f32, 256>;
var<workgroup> red: array<f32, 64>;

// Block sign: -1 where the top bit of (i * 0x9E3779B9) mod 2^32 is set.
fn sign_negative(i: u32) -> bool {
    return ((i * 0x9E3779B9u) >> 31u) != 0u;
}

// Unnormalized 32-point Sylvester butterfly over sh[base .. base+32), steps 1, 2, 4, 8, 16, as
// the CPU reference orders it: b[j] = a + c, b[j+step] = a - c. Every thread of the workgroup
// must call it (barriers).
fn butterfly32(t: u32) {
    let lane = t & 31u;
    let base = t & ~31u;
    for (var step = 1u; step < 32u; step = step * 2u) {
        let a = sh[base + (lane & ~step)];
        let c = sh[base + (lane | step)];
        workgroupBarrier();
        var r: f32;
        if ((lane & step) == 0u) {
            r = a + c;
        } else {
            r = a - c;
        }
        sh[t] = r;
        workgroupBarrier();
    }
}

fn tq4_weight(blk: u32, lane: u32) -> f32 {
    let o = blk * TQ4_BYTES;
    let d = f16_to_f32(rd_u16(o + select(0u, 2u, lane >= 16u)));
    let q = (rd_byte(o + 4u + (lane >> 1u)) >> ((lane & 1u) * 4u)) & 15u;
    return bitcast<f32>(C4[q]) * d;
}

fn tq3_weight(blk: u32, lane: u32) -> f32 {
    let o = blk * TQ3_BYTES;
    let d = f16_to_f32(rd_u16(o + select(0u, 2u, lane >= 16u)));
    let g = o + 4u + 3u * (lane >> 3u);
    let w = rd_byte(g) | (rd_byte(g + 1u) << 8u) | (rd_byte(g + 2u) << 16u);
    let q = (w >> (3u * (lane & 7u))) & 7u;
    return bitcast<f32>(C3[q]) * d;
}

// Inverse rotation of the 8 blocks in sh, then store: out = b · ((1/√32)·s), one product.
fn finish_dequant(t: u32, blk: u32, valid: bool) {
    workgroupBarrier();
    butterfly32(t);
    if (valid) {
        let lane = t & 31u;
        let inv = bitcast<f32>(INV_SQRT32_BITS);
        let f = select(inv, -inv, sign_negative(lane));
        dst[blk * 32u + lane] = sh[t] * f;
    }
}

@compute @workgroup_size(256)
fn tq4_dequant(@builtin(local_invocation_index) t: u32,
               @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let blk = group_index(wid, nwg) * 8u + (t >> 5u);
    let valid = blk < params.n;
    var v = 0.0;
    if (valid) {
        v = tq4_weight(blk, t & 31u);
    }
    sh[t] = v;
    finish_dequant(t, blk, valid);
}

@compute @workgroup_size(256)
fn tq3_dequant(@builtin(local_invocation_index) t: u32,
               @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let blk = group_index(wid, nwg) * 8u + (t >> 5u);
    let valid = blk < params.n;
    var v = 0.0;
    if (valid) {
        v = tq3_weight(blk, t & 31u);
    }
    sh[t] = v;
    finish_dequant(t, blk, valid);
}

// params.n = number of 32-blocks of the activation; vec_in = x; dst = x̂. One invocation per
// block, 64 blocks per workgroup, no barriers: × sign, the butterfly with the CPU reference's pairs
// (steps 1..16: b[j] = a + c, b[j+step] = a - c), × 1/√32; bit-exact with forward_rotate.
@compute @workgroup_size(64)
fn tq_prerotate(@builtin(local_invocation_index) t: u32,
                @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let blk = group_index(wid, nwg) * 64u + t;
    if (blk >= params.n) {
        return;
    }
    var v: array<f32, 32>;
    for (var l = 0u; l < 32u; l = l + 1u) {
        let x = vec_in[blk * 32u + l];
        v[l] = select(x, -x, sign_negative(l));
    }
    for (var step = 1u; step < 32u; step = step * 2u) {
        for (var j = 0u; j < 32u; j = j + 1u) {
            if ((j & step) == 0u) {
                let a = v[j];
                let c = v[j + step];
                v[j] = a + c;
                v[j + step] = a - c;
            }
        }
    }
    let inv = bitcast<f32>(INV_SQRT32_BITS);
    for (var l = 0u; l < 32u; l = l + 1u) {
        dst[blk * 32u + l] = v[l] * inv;
    }
}

// Tree sum of red[0..64) into red[0]; every thread calls it.
fn reduce64(t: u32) {
    for (var s = 32u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (t < s) {
            red[t] = red[t] + red[t + s];
        }
    }
    workgroupBarrier();
}

// params.n = rows, params.cols = row length; vec_in = x̂ (rotated activation); dst = y.
@compute @workgroup_size(64)
fn tq4_matvec(@builtin(local_invocation_index) t: u32,
              @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_index(wid, nwg);
    var acc = 0.0;
    if (row < params.n) {
        let bpr = params.cols / 32u;
        for (var j = t; j < params.cols; j = j + 64u) {
            acc = acc + tq4_weight(row * bpr + (j >> 5u), j & 31u) * vec_in[j];
        }
    }
    red[t] = acc;
    reduce64(t);
    if (t == 0u && row < params.n) {
        dst[row] = red[0];
    }
}

@compute @workgroup_size(64)
fn tq3_matvec(@builtin(local_invocation_index) t: u32,
              @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_index(wid, nwg);
    var acc = 0.0;
    if (row < params.n) {
        let bpr = params.cols / 32u;
        for (var j = t; j < params.cols; j = j + 64u) {
            acc = acc + tq3_weight(row * bpr + (j >> 5u), j & 31u) * vec_in[j];
        }
    }
    red[t] = acc;
    reduce64(t);
    if (t == 0u && row < params.n) {
        dst[row] = red[0];
    }
}

// Tokens per invocation of the mat-mul (tq::gpu::MATMUL_TOKENS): each decoded weight is used for
// this many activation rows. The host pads X̂ to a multiple of it (zero rows).
const MM_TOKENS: u32 = 8u;

// The mat-mul reads X̂ (binding 3, vec_in) four columns at a time: cols is a multiple of 32, so
// every 4-column group of every row is one aligned vec4.
@group(0) @binding(3) var<storage, read> vec_in4: array<vec4<f32>>;

// Rotated-domain weights of lanes l4..l4+3 of block `o` (word offset; scale word first).
fn mm_weights4(o: u32, l4: u32, tq4: bool) -> vec4<f32> {
    let dw = src[o];
    let d = f16_to_f32(select(dw & 0xffffu, dw >> 16u, l4 >= 16u));
    var wv: vec4<f32>;
    if (tq4) {
        let qw = src[o + 1u + (l4 >> 3u)] >> ((l4 & 7u) * 4u);
        for (var e = 0u; e < 4u; e = e + 1u) {
            wv[e] = bitcast<f32>(C4[(qw >> (4u * e)) & 15u]) * d;
        }
    } else {
        for (var e = 0u; e < 4u; e = e + 1u) {
            let p = 3u * (l4 + e);
            let wi = p >> 5u;
            let sh = p & 31u;
            var v = src[o + 1u + wi] >> sh;
            if (sh > 29u) {
                v = v | (src[o + 2u + wi] << (32u - sh));
            }
            wv[e] = bitcast<f32>(C3[v & 7u]) * d;
        }
    }
    return wv;
}

// params.n = rows, params.cols = row length, params.tokens = activation rows; vec_in = X̂
// (tokens × cols, padded to a multiple of MM_TOKENS rows); dst = Y (tokens × rows, token-major).
// Each invocation computes rows r and r + 64 for one tile of MM_TOKENS tokens (every X̂ load
// feeds 2 rows, every decoded weight MM_TOKENS tokens); 128 rows per workgroup, workgroups
// numbered row-group-major within a token tile: g = tile · ceil(rows/128) + row group.
// Order of the sums (what the CPU emulation reproduces): per 32-block the 32 products in lane
// order into a block sum, then the block sums in block order into the output.
fn tq_matmul(t: u32, wid: vec3<u32>, nwg: vec3<u32>, tq4: bool) {
    let rgs = (params.n + 127u) / 128u;
    let g = group_index(wid, nwg);
    let r0 = (g % rgs) * 128u + t;
    let r1 = r0 + 64u;
    let t0 = (g / rgs) * MM_TOKENS;
    if (r0 >= params.n || t0 >= params.tokens) {
        return;
    }
    let two = r1 < params.n;
    let r1c = select(r0, r1, two);
    let cols = params.cols;
    let c4 = cols / 4u;
    let bpr = cols / 32u;
    let words = select(4u, 5u, tq4);
    var acc0: array<f32, MM_TOKENS>;
    var acc1: array<f32, MM_TOKENS>;
    for (var b = 0u; b < bpr; b = b + 1u) {
        let o0 = (r0 * bpr + b) * words;
        let o1 = (r1c * bpr + b) * words;
        var blk0: array<f32, MM_TOKENS>;
        var blk1: array<f32, MM_TOKENS>;
        for (var l4 = 0u; l4 < 32u; l4 = l4 + 4u) {
            let w0 = mm_weights4(o0, l4, tq4);
            let w1 = mm_weights4(o1, l4, tq4);
            let j4 = t0 * c4 + (b * 32u + l4) / 4u;
            for (var k = 0u; k < MM_TOKENS; k = k + 1u) {
                let xv = vec_in4[j4 + k * c4];
                var s = blk0[k];
                s = s + w0.x * xv.x;
                s = s + w0.y * xv.y;
                s = s + w0.z * xv.z;
                s = s + w0.w * xv.w;
                blk0[k] = s;
                var u = blk1[k];
                u = u + w1.x * xv.x;
                u = u + w1.y * xv.y;
                u = u + w1.z * xv.z;
                u = u + w1.w * xv.w;
                blk1[k] = u;
            }
        }
        for (var k = 0u; k < MM_TOKENS; k = k + 1u) {
            acc0[k] = acc0[k] + blk0[k];
            acc1[k] = acc1[k] + blk1[k];
        }
    }
    for (var k = 0u; k < MM_TOKENS; k = k + 1u) {
        if (t0 + k < params.tokens) {
            dst[(t0 + k) * params.n + r0] = acc0[k];
            if (two) {
                dst[(t0 + k) * params.n + r1] = acc1[k];
            }
        }
    }
}

@compute @workgroup_size(64)
fn tq4_matmul(@builtin(local_invocation_index) t: u32,
              @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    tq_matmul(t, wid, nwg, true);
}

@compute @workgroup_size(64)
fn tq3_matmul(@builtin(local_invocation_index) t: u32,
              @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    tq_matmul(t, wid, nwg, false);
}
