// Bulk float16 / bfloat16 <-> float32 conversion of dense buffers, for shims that compute a
// 16-bit problem in float32. F16C instructions where the CPU has them (every x86-64 CPU with
// AVX2), the exact portable conversions of fp16.hpp elsewhere; both round to nearest even.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fdnn_shim {

enum class Half16 { kFloat16, kBFloat16 };

// dst[i] = float(src[i]) for i < n.
void widen16(Half16 type, const uint16_t* src, float* dst, size_t n);

// dst[i] = round16(alpha * src[i] + beta * float(dst[i])); with beta == 0, dst is not read (it
// may hold anything, NaN included). One rounding per element.
void narrow16(Half16 type, const float* src, uint16_t* dst, size_t n, float alpha, float beta);

}  // namespace fdnn_shim
