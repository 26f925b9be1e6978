// tq GPU decode kernels, WGSL: shared declarations. The host prepends this file to tq.wgsl and
// turbo.wgsl before compiling (WGSL has no #include).
//
// Exactness rules followed by every kernel (see docs/kernels.md):
// - f16 scales are decoded with integer bit manipulation (f16_to_f32): exact for every bit
//   pattern, subnormals included, with no dependence on the device's denormal mode;
// - constants are written as f32 bit patterns (bitcast), never as decimal literals, because WGSL
//   lets an implementation round an inexact literal either way;
// - a product that the CPU reference rounds on its own is stored to workgroup memory and read back
//   after a barrier before it meets an addition, so no compiler can contract it into an FMA.

struct Params {
    n: u32,      // dequantize: number of blocks; mat-vec / Q·K: number of rows
    cols: u32,   // mat-vec / Q·K / tq2_r rotation: row length in values
    group: u32,  // turbo: values per group (64 | 128)
    bytes: u32,  // turbo: bytes per block
    hdr: u32,    // turbo: bytes before qs (2, or 4 for the May-2026 turbo4 block)
    tokens: u32, // mat-mul: activation rows (vec_in holds them padded to a multiple of MM_TOKENS)
    flags: u32,  // tq2_r: 1 = the design's split layout, 2 = inverse rotation, 4 = Hadamard factor
    rot_h: u32,  // tq2_r rotation: order of the dense factor (1: none)
    rot_scale: u32, // tq2_r rotation: the scale's f32 bits
    rot_step: u32,  // tq2_r rotation: sub-block length (tq2r_rot_local) / stage step (tq2r_rot_stage)
    pad0: u32,   // 12 u32 = 48 bytes: a multiple of 16 (uniform layout)
    pad1: u32,
}

// Packed blocks, little-endian bytes in u32 words (the host pads to a multiple of 4 bytes).
@group(0) @binding(0) var<storage, read> src: array<u32>;
// Output values.
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;
// Input vector: the activation (mat-vec), its rotated copy, the pre-rotated query (Q·K), or the
// rotated activation rows of a mat-mul (tokens × cols).
@group(0) @binding(3) var<storage, read> vec_in: array<f32>;

fn rd_byte(o: u32) -> u32 {
    return (src[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

fn rd_u16(o: u32) -> u32 {
    return rd_byte(o) | (rd_byte(o + 1u) << 8u);
}

// IEEE binary16 bits -> f32, exact for every input: zeros keep their sign, subnormals are
// normalized by hand, inf stays inf, NaN stays NaN (payload shifted as a hardware conversion does).
fn f16_to_f32(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        if (m == 0u) {
            return bitcast<f32>(s);
        }
        // m * 2^-24 with the leading one of m at bit p: exponent p - 24, biased p + 103.
        let p = firstLeadingBit(m);
        let mm = (m << (10u - p)) & 0x3ffu;
        return bitcast<f32>(s | ((p + 103u) << 23u) | (mm << 13u));
    }
    if (e == 31u) {
        return bitcast<f32>(s | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}

// Flattened workgroup index of a 2-D dispatch (the host splits counts above 65535).
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}
