// tq GPU decode kernels, WGSL: turbo2 / turbo3 / turbo4 KV-cache blocks (FORMATS.md §3, the
// 2026-05-04 layouts). Prepend common.wgsl.
//
// Entry points
//   turbo{2,3,4}_dequant   value j of a 128-group = C[idx_j] · f16(norm), left in the rotated
//                          domain (no inverse rotation, as in the engines). One thread per value.
//   turbo{2,3,4}_qk        score[r] = Σ_j q̂_j · (C[idx_j] · norm) over a key row of params.cols
//                          values (a multiple of 128), q̂ = the query already rotated forward
//                          (bound as vec_in). 128 threads per key row.
// Dequantize is one f32 product per value: bit-exact. Q·K sums in another order than the f64
// reference and is held to a relative bound (docs/kernels.md).

// Codebooks for N(0, 1/128), as f32 bit patterns (tq::types::turbo::CB2 / CB3 / CB4, the May-2026
// snapshot; CB4 is the mis-scaled table the snapshot shipped).
var<private> CB2: array<u32, 4> = array<u32, 4>(0xbe08aa43u, 0xbd23d0c0u, 0x3d23d0c0u, 0x3e08aa43u);
var<private> CB3: array<u32, 8> = array<u32, 8>(
    0xbe4342eeu, 0xbdf151e7u, 0xbd8696a2u, 0xbcafcce2u, 0x3cafcce2u, 0x3d8696a2u, 0x3df151e7u, 0x3e4342eeu);
var<private> CB4: array<u32, 16> = array<u32, 16>(
    0xbe3219a8u, 0xbdf003efu, 0xbdb759efu, 0xbd8ccff2u, 0xbd51f81au, 0xbd11ce29u, 0xbcabf120u, 0xbbe3582au,
    0x3be3582au, 0x3cabf120u, 0x3d11ce29u, 0x3d51f81au, 0x3d8ccff2u, 0x3db759efu, 0x3df003efu, 0x3e3219a8u);

const TURBO2_BYTES: u32 = 34u;
const TURBO3_BYTES: u32 = 50u;
const TURBO4_BYTES: u32 = 68u;

var<workgroup> red: array<f32, 128>;

// Value j of group g: centroid × norm (the CPU reference's order of operands).
fn turbo2_value(g: u32, j: u32) -> f32 {
    let o = g * TURBO2_BYTES;
    let norm = f16_to_f32(rd_u16(o));
    let i = (rd_byte(o + 2u + (j >> 2u)) >> (2u * (j & 3u))) & 3u;
    return bitcast<f32>(CB2[i]) * norm;
}

fn turbo3_value(g: u32, j: u32) -> f32 {
    let o = g * TURBO3_BYTES;
    let norm = f16_to_f32(rd_u16(o));
    let lo = (rd_byte(o + 2u + (j >> 2u)) >> (2u * (j & 3u))) & 3u;
    let hi = (rd_byte(o + 34u + (j >> 3u)) >> (j & 7u)) & 1u;
    return bitcast<f32>(CB3[lo | (hi << 2u)]) * norm;
}

fn turbo4_value(g: u32, j: u32) -> f32 {
    let o = g * TURBO4_BYTES;
    let norm = f16_to_f32(rd_u16(o));
    let i = (rd_byte(o + 4u + (j >> 1u)) >> (4u * (j & 1u))) & 15u;
    return bitcast<f32>(CB4[i]) * norm;
}

@compute @workgroup_size(128)
fn turbo2_dequant(@builtin(local_invocation_index) t: u32,
                  @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = group_index(wid, nwg);
    if (g < params.n) {
        dst[g * 128u + t] = turbo2_value(g, t);
    }
}

@compute @workgroup_size(128)
fn turbo3_dequant(@builtin(local_invocation_index) t: u32,
                  @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = group_index(wid, nwg);
    if (g < params.n) {
        dst[g * 128u + t] = turbo3_value(g, t);
    }
}

@compute @workgroup_size(128)
fn turbo4_dequant(@builtin(local_invocation_index) t: u32,
                  @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = group_index(wid, nwg);
    if (g < params.n) {
        dst[g * 128u + t] = turbo4_value(g, t);
    }
}

fn reduce128(t: u32) {
    for (var s = 64u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (t < s) {
            red[t] = red[t] + red[t + s];
        }
    }
    workgroupBarrier();
}

// params.n = key rows, params.cols = values per row (multiple of 128); vec_in = q̂; dst = scores.
@compute @workgroup_size(128)
fn turbo2_qk(@builtin(local_invocation_index) t: u32,
             @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_index(wid, nwg);
    var acc = 0.0;
    if (row < params.n) {
        let gpr = params.cols / 128u;
        for (var j = t; j < params.cols; j = j + 128u) {
            acc = acc + vec_in[j] * turbo2_value(row * gpr + (j >> 7u), j & 127u);
        }
    }
    red[t] = acc;
    reduce128(t);
    if (t == 0u && row < params.n) {
        dst[row] = red[0];
    }
}

@compute @workgroup_size(128)
fn turbo3_qk(@builtin(local_invocation_index) t: u32,
             @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_index(wid, nwg);
    var acc = 0.0;
    if (row < params.n) {
        let gpr = params.cols / 128u;
        for (var j = t; j < params.cols; j = j + 128u) {
            acc = acc + vec_in[j] * turbo3_value(row * gpr + (j >> 7u), j & 127u);
        }
    }
    red[t] = acc;
    reduce128(t);
    if (t == 0u && row < params.n) {
        dst[row] = red[0];
    }
}

@compute @workgroup_size(128)
fn turbo4_qk(@builtin(local_invocation_index) t: u32,
             @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_index(wid, nwg);
    var acc = 0.0;
    if (row < params.n) {
        let gpr = params.cols / 128u;
        for (var j = t; j < params.cols; j = j + 128u) {
            acc = acc + vec_in[j] * turbo4_value(row * gpr + (j >> 7u), j & 127u);
        }
    }
    red[t] = acc;
    reduce128(t);
    if (t == 0u && row < params.n) {
        dst[row] = red[0];
    }
}
