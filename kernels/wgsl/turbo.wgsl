// tq GPU decode kernels, WGSL: turbo2 / turbo3 / turbo4 KV-cache blocks (FORMATS.md §3) in every
// layout tq writes or simulates. Prepend common.wgsl.
//
// Layout parameters: params.group (64 | 128 values per group), params.bytes (bytes per block),
// params.hdr (bytes before qs: 2, or 4 for the May-2026 turbo4 block), and the codebook `cb`
// (binding 4, 2^bits f32 written by the host: the May-2026 tables, the June turbo4 table or a
// per-head-dim table; never hard-coded here, and passed as raw f32 bits so no literal rounding).
// Block: f16 norm | [f16 unused] | qs[group/4 or group/2] | turbo3: signs[group/8].
//
// Entry points
//   turbo{2,3,4}_dequant   value j of a group = C[idx_j] · f16(norm), left in the rotated
//                          domain (no inverse rotation, as in the engines). One thread per value,
//                          128 per workgroup (value index / group = block).
//   turbo{2,3,4}_qk        score[r] = Σ_j q̂_j · (C[idx_j] · norm) over a key row of params.cols
//                          values (a multiple of params.group), q̂ = the query already rotated
//                          forward (bound as vec_in). 128 threads per key row (reduce128).
// Dequantize is one f32 product per value: bit-exact. Q·K sums in another order than the f64
// reference and is held to a relative bound (docs/kernels.md).

@group(0) @binding(4) var<storage, read> cb: array<f32>;

var<workgroup> red: array<f32, 128>;

// Value j of the block at byte offset o: centroid × norm (the CPU reference's order of operands).
fn turbo2_value(o: u32, j: u32) -> f32 {
    let norm = f16_to_f32(rd_u16(o));
    let i = (rd_byte(o + params.hdr + (j >> 2u)) >> (2u * (j & 3u))) & 3u;
    return cb[i] * norm;
}

fn turbo3_value(o: u32, j: u32) -> f32 {
    let norm = f16_to_f32(rd_u16(o));
    let lo = (rd_byte(o + params.hdr + (j >> 2u)) >> (2u * (j & 3u))) & 3u;
    let hi = (rd_byte(o + params.hdr + (params.group >> 2u) + (j >> 3u)) >> (j & 7u)) & 1u;
    return cb[lo | (hi << 2u)] * norm;
}

fn turbo4_value(o: u32, j: u32) -> f32 {
    let norm = f16_to_f32(rd_u16(o));
    let i = (rd_byte(o + params.hdr + (j >> 1u)) >> (4u * (j & 1u))) & 15u;
    return cb[i] * norm;
}

@compute @workgroup_size(128)
fn turbo2_dequant(@builtin(local_invocation_index) t: u32,
                  @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = group_index(wid, nwg) * 128u + t;
    let g = idx / params.group;
    if (g < params.n) {
        dst[idx] = turbo2_value(g * params.bytes, idx - g * params.group);
    }
}

@compute @workgroup_size(128)
fn turbo3_dequant(@builtin(local_invocation_index) t: u32,
                  @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = group_index(wid, nwg) * 128u + t;
    let g = idx / params.group;
    if (g < params.n) {
        dst[idx] = turbo3_value(g * params.bytes, idx - g * params.group);
    }
}

@compute @workgroup_size(128)
fn turbo4_dequant(@builtin(local_invocation_index) t: u32,
                  @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = group_index(wid, nwg) * 128u + t;
    let g = idx / params.group;
    if (g < params.n) {
        dst[idx] = turbo4_value(g * params.bytes, idx - g * params.group);
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

// Byte offset of the block holding value j of key row `row`.
fn turbo_block(row: u32, j: u32) -> u32 {
    return (row * (params.cols / params.group) + j / params.group) * params.bytes;
}

// params.n = key rows, params.cols = values per row (multiple of group); vec_in = q̂; dst = scores.
@compute @workgroup_size(128)
fn turbo2_qk(@builtin(local_invocation_index) t: u32,
             @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_index(wid, nwg);
    var acc = 0.0;
    if (row < params.n) {
        for (var j = t; j < params.cols; j = j + 128u) {
            acc = acc + vec_in[j] * turbo2_value(turbo_block(row, j), j % params.group);
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
        for (var j = t; j < params.cols; j = j + 128u) {
            acc = acc + vec_in[j] * turbo3_value(turbo_block(row, j), j % params.group);
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
        for (var j = t; j < params.cols; j = j + 128u) {
            acc = acc + vec_in[j] * turbo4_value(turbo_block(row, j), j % params.group);
        }
    }
    red[t] = acc;
    reduce128(t);
    if (t == 0u && row < params.n) {
        dst[row] = red[0];
    }
}
