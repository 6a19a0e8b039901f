// A compile-time check (not part of the shim): the HIP half of miopen_api.hpp against the HIP
// runtime's own header (Debian's libamdhip64-dev: /usr/include/hip). Each function pointer
// type the shim declares must take as many parameters as HIP's function, each of the same
// size and pointer-ness, and return a value of the same size; the error codes the shim
// tests must have HIP's values. .ci/rocm.sh compiles it with -fsyntax-only when the header
// is there. (MIOpen's half has no header anywhere we reach: its facts were read from
// ROCm/MIOpen's include/miopen/miopen.h and are exercised by tests/doubles/miopen.)
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#include <hip/hip_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace ours {
#include "miopen_api.hpp"
}

namespace {

template <class F>
struct Signature;
template <class R, class... A>
struct Signature<R (*)(A...)> {
  using Result = R;
  using Args = std::tuple<A...>;
};

template <class A, class B>
constexpr bool same_kind() {
  return sizeof(A) == sizeof(B) && std::is_pointer_v<A> == std::is_pointer_v<B>;
}

template <class Theirs, class Ours, size_t... I>
constexpr bool same_args(std::index_sequence<I...>) {
  return (same_kind<std::tuple_element_t<I, Theirs>, std::tuple_element_t<I, Ours>>() && ...);
}

template <class Theirs, class Ours>
constexpr bool same_shape() {
  using T = Signature<Theirs>;
  using O = Signature<Ours>;
  constexpr size_t n = std::tuple_size_v<typename T::Args>;
  if constexpr (n != std::tuple_size_v<typename O::Args>) {
    return false;
  } else {
    return same_kind<typename T::Result, typename O::Result>() &&
           same_args<typename T::Args, typename O::Args>(std::make_index_sequence<n>{});
  }
}

#define FDNN_CHECK_HIP(name)                                                  \
  static_assert(same_shape<decltype(&::name), ours::name##_fn>(), #name       \
                " in miopen_api.hpp differs from hip_runtime_api.h");
FDNN_CHECK_HIP(hipGetDeviceCount)
FDNN_CHECK_HIP(hipGetDevice)
FDNN_CHECK_HIP(hipSetDevice)
FDNN_CHECK_HIP(hipDeviceGetName)
FDNN_CHECK_HIP(hipGetErrorString)
FDNN_CHECK_HIP(hipFree)
FDNN_CHECK_HIP(hipMemsetAsync)
FDNN_CHECK_HIP(hipEventCreate)
FDNN_CHECK_HIP(hipEventRecord)
FDNN_CHECK_HIP(hipEventSynchronize)
FDNN_CHECK_HIP(hipEventElapsedTime)
FDNN_CHECK_HIP(hipEventDestroy)
FDNN_CHECK_HIP(hipStreamSynchronize)
// hipMalloc is a template overload set in C++; its C function has this signature.
static_assert(same_shape<hipError_t (*)(void**, size_t), ours::hipMalloc_fn>(), "hipMalloc");

static_assert(int{ours::hipSuccess} == int{::hipSuccess}, "hipSuccess");
static_assert(int{ours::hipErrorNoDevice} == int{::hipErrorNoDevice}, "hipErrorNoDevice");
static_assert(sizeof(ours::hipError_t) == sizeof(::hipError_t), "hipError_t");
static_assert(sizeof(ours::hipStream_t) == sizeof(::hipStream_t), "hipStream_t");

}  // namespace
