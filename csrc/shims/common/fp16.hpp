// IEEE binary16 and bfloat16 <-> binary32 conversions in portable C++ (integer bit
// manipulation only: exact for every input, subnormals, infinities and NaN included, and
// independent of the floating-point environment). float -> 16-bit rounds to nearest even.
#pragma once

#include <cstdint>
#include <cstring>

namespace fdnn_shim {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return float_of(sign);
    // Subnormal: m * 2^-24, exact in binary32.
    return float_of(sign | bits_of(static_cast<float>(m) * 5.9604644775390625e-8f));
  }
  if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));  // inf, NaN (payload kept)
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t x = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf stays inf; NaN stays a quiet NaN with its top payload bits
    return sign | (a > 0x7f800000u ? static_cast<uint16_t>(0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u);
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (a < 0x38800000u) {                         // below 2^-14: a binary16 subnormal or zero
    if (a < 0x33000000u) return sign;            // below 2^-25: rounds to zero
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // value in units of 2^-24 is m >> shift
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (a - 0x38000000u) >> 13;  // rebias the exponent (127 -> 15), keep 10 bits
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // a carry moves into the exponent
  return static_cast<uint16_t>(sign | r);
}

inline float bf16_to_float(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace fdnn_shim
