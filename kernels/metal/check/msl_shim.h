// A host C++ stand-in for the parts of the Metal Shading Language the kernels use, so that
// `g++ -fsyntax-only` can catch typos, undeclared names and type errors in kernels/metal/*.metal
// on a machine without Xcode (scripts/ci-gpu.sh). It is NOT a Metal compiler: address spaces are
// erased, attributes ignored, and nothing here says the code is valid MSL or correct on a GPU.
#pragma once
#include <cstdint>
#include <cstring>

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;

#define kernel
#define device
#define constant const
// Address spaces are erased (also `threadgroup`, which qualifies both local arrays and pointer
// parameters: `static` would be invalid on a parameter).
#define threadgroup
#define METAL_SHIM_ATTR(x)

namespace metal {
enum class mem_flags { mem_none, mem_threadgroup, mem_device };
inline void threadgroup_barrier(mem_flags) {}
inline float simd_shuffle_xor(float v, ushort) { return v; }
inline uint clz(uint x) { return x ? (uint)__builtin_clz(x) : 32u; }
inline uint reverse_bits(uint x) {
    uint r = 0;
    for (int i = 0; i < 32; ++i) {
        r = (r << 1) | ((x >> i) & 1u);
    }
    return r;
}
template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
struct uint2 {
    uint x, y;
    uint2(uint a, uint b) : x(a), y(b) {}
};
template <typename T, typename U> inline T as_type(U u) {
    static_assert(sizeof(T) == sizeof(U), "as_type size");
    T t;
    std::memcpy(&t, &u, sizeof t);
    return t;
}
}  // namespace metal
