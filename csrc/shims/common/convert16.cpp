#include "convert16.hpp"

#include "fp16.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FDNN_HAVE_X86 1
#endif

namespace fdnn_shim {

namespace {

void widen_portable(Half16 type, const uint16_t* src, float* dst, size_t n) {
  if (type == Half16::kBFloat16) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
  }
}

inline float combine(float v, float alpha, float beta, float old) {
  return beta == 0.f ? alpha * v : alpha * v + beta * old;
}

void narrow_portable(Half16 type, const float* src, uint16_t* dst, size_t n, float alpha,
                     float beta) {
  if (type == Half16::kBFloat16) {
    for (size_t i = 0; i < n; ++i)
      dst[i] = float_to_bf16(combine(src[i], alpha, beta, beta == 0.f ? 0.f : bf16_to_float(dst[i])));
  } else {
    for (size_t i = 0; i < n; ++i)
      dst[i] = float_to_half(combine(src[i], alpha, beta, beta == 0.f ? 0.f : half_to_float(dst[i])));
  }
}

#ifdef FDNN_HAVE_X86
bool cpu_has_f16c() {
  static const bool has = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return has;
}

__attribute__((target("avx,f16c"))) void widen_f16c(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  widen_portable(Half16::kFloat16, src + i, dst + i, n - i);
}

__attribute__((target("avx,f16c"))) void narrow_f16c(const float* src, uint16_t* dst, size_t n,
                                                      float alpha, float beta) {
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(va, _mm256_loadu_ps(src + i));
    if (beta != 0.f) {
      const __m128i old = _mm_loadu_si128(reinterpret_cast<const __m128i*>(dst + i));
      v = _mm256_add_ps(v, _mm256_mul_ps(vb, _mm256_cvtph_ps(old)));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  narrow_portable(Half16::kFloat16, src + i, dst + i, n - i, alpha, beta);
}
#endif

}  // namespace

void widen16(Half16 type, const uint16_t* src, float* dst, size_t n) {
#ifdef FDNN_HAVE_X86
  if (type == Half16::kFloat16 && cpu_has_f16c()) return widen_f16c(src, dst, n);
#endif
  widen_portable(type, src, dst, n);
}

void narrow16(Half16 type, const float* src, uint16_t* dst, size_t n, float alpha, float beta) {
#ifdef FDNN_HAVE_X86
  if (type == Half16::kFloat16 && cpu_has_f16c()) return narrow_f16c(src, dst, n, alpha, beta);
#endif
  narrow_portable(type, src, dst, n, alpha, beta);
}

}  // namespace fdnn_shim
