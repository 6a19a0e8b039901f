#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "epilogue.hpp"
#include "flux_dnn/flux_dnn.h"

namespace fdnn_cudnn {
namespace {

// Accumulation type: double for double, float for everything else.
template <class T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ inline float to_acc(__half v) { return __half2float(v); }
__device__ inline float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_acc(float v) { return v; }
__device__ inline double to_acc(double v) { return v; }

template <class T> __device__ inline T from_acc(typename Acc<T>::type v);
template <> __device__ inline __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ inline float from_acc<float>(float v) { return v; }
template <> __device__ inline double from_acc<double>(double v) { return v; }

// The FDNN_ACTIVATION_* values of flux_dnn.h, in the accumulation type.
template <class A>
__device__ A activate(A v, int32_t kind, A a, A b) {
  const A half = A(0.5), one = A(1);
  switch (kind) {
    case FDNN_ACTIVATION_RELU: return v > A(0) ? v : A(0);
    case FDNN_ACTIVATION_LEAKY_RELU: return v >= A(0) ? v : a * v;
    case FDNN_ACTIVATION_CLIP: return v < a ? a : (v > b ? b : v);
    case FDNN_ACTIVATION_SIGMOID: return one / (one + exp(-v));
    case FDNN_ACTIVATION_TANH: return tanh(v);
    case FDNN_ACTIVATION_GELU_TANH: {
      const A k = A(0.7978845608028654);  // sqrt(2 / pi)
      return half * v * (one + tanh(k * (v + A(0.044715) * v * v * v)));
    }
    case FDNN_ACTIVATION_GELU_ERF: return half * v * (one + erf(v * A(0.7071067811865476)));
    case FDNN_ACTIVATION_SILU: return v / (one + exp(-v));
    default: return v;  // FDNN_ACTIVATION_NONE
  }
}

// Offset of logical element `linear` (row-major over shape) and its dim-1 index.
__device__ inline int64_t offset_of(const StridedTensor& t, int64_t linear, int64_t* channel) {
  int64_t offset = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    int64_t i = linear % t.shape[d];
    linear /= t.shape[d];
    offset += i * t.strides[d];
    if (d == 1) *channel = i;
  }
  return offset;
}

template <class T>
__global__ void bias_activation_kernel(EpilogueParams p, T* y, const T* src, const T* bias,
                                       int64_t count) {
  using A = typename Acc<T>::type;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t k = 0;
    int64_t off = offset_of(p.y, i, &k);
    A v = to_acc(src[off]);
    if (bias) v += A(p.alpha) * to_acc(bias[k * p.bias_stride]);
    v = activate<A>(v, p.activation, A(p.activation_alpha), A(p.activation_beta));
    if (p.beta != 0.0) v += A(p.beta) * to_acc(y[off]);
    y[off] = from_acc<T>(v);
  }
}

// One block per channel k; a fixed reduction order, so the result is deterministic.
template <class T>
__global__ void bias_gradient_kernel(EpilogueParams p, const T* dy, T* db) {
  using A = typename Acc<T>::type;
  constexpr int kThreads = 256;
  __shared__ A partial[kThreads];
  int64_t k = blockIdx.x;
  StridedTensor rest = p.y;  // dy with dim 1 fixed at k
  rest.shape[1] = 1;
  int64_t count = 1;
  for (int d = 0; d < rest.ndim; ++d) count *= rest.shape[d];
  const T* base = dy + k * p.y.strides[1];
  A sum = A(0);
  for (int64_t i = threadIdx.x; i < count; i += kThreads) {
    int64_t unused = 0;
    sum += to_acc(base[offset_of(rest, i, &unused)]);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int step = kThreads / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    A v = A(p.alpha) * partial[0];
    T* out = db + k * p.bias_stride;
    if (p.beta != 0.0) v += A(p.beta) * to_acc(*out);
    *out = from_acc<T>(v);
  }
}

template <class Bits>
__global__ void strided_copy_kernel(StridedCopy c, const Bits* src, Bits* dst, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i, from = 0, to = 0;
    for (int d = c.src.ndim - 1; d >= 0; --d) {
      int64_t index = rest % c.src.shape[d];
      rest /= c.src.shape[d];
      from += index * c.src.strides[d];
      to += index * c.dst_strides[d];
    }
    dst[to] = src[from];
  }
}

int64_t element_count(const StridedTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

template <class T>
cudaError_t bias_activation(const EpilogueParams& p, void* y, const void* src,
                            const void* bias, cudaStream_t stream) {
  int64_t count = element_count(p.y);
  constexpr int kThreads = 256;
  int64_t blocks = (count + kThreads - 1) / kThreads;
  unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  bias_activation_kernel<T><<<grid, kThreads, 0, stream>>>(
      p, static_cast<T*>(y), static_cast<const T*>(src), static_cast<const T*>(bias), count);
  return cudaGetLastError();
}

template <class T>
cudaError_t bias_gradient(const EpilogueParams& p, const void* dy, void* db,
                          cudaStream_t stream) {
  unsigned channels = static_cast<unsigned>(p.y.shape[1]);
  bias_gradient_kernel<T><<<channels, 256, 0, stream>>>(p, static_cast<const T*>(dy),
                                                        static_cast<T*>(db));
  return cudaGetLastError();
}

template <class Bits>
cudaError_t strided_copy(const StridedCopy& c, const void* src, void* dst, cudaStream_t stream) {
  int64_t count = element_count(c.src);
  constexpr int kThreads = 256;
  int64_t blocks = (count + kThreads - 1) / kThreads;
  unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  strided_copy_kernel<Bits><<<grid, kThreads, 0, stream>>>(
      c, static_cast<const Bits*>(src), static_cast<Bits*>(dst), count);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_strided_copy(const StridedCopy& c, const void* src, void* dst,
                                cudaStream_t stream) {
  switch (c.element_size) {
    case 2: return strided_copy<uint16_t>(c, src, dst, stream);
    case 4: return strided_copy<uint32_t>(c, src, dst, stream);
    case 8: return strided_copy<uint64_t>(c, src, dst, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_bias_activation(const EpilogueParams& p, void* y, const void* src,
                                   const void* bias, cudaStream_t stream) {
  switch (p.type) {
    case ElementType::kHalf: return bias_activation<__half>(p, y, src, bias, stream);
    case ElementType::kBFloat16:
      return bias_activation<__nv_bfloat16>(p, y, src, bias, stream);
    case ElementType::kFloat: return bias_activation<float>(p, y, src, bias, stream);
    case ElementType::kDouble: return bias_activation<double>(p, y, src, bias, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_bias_gradient(const EpilogueParams& p, const void* dy, void* db,
                                 cudaStream_t stream) {
  switch (p.type) {
    case ElementType::kHalf: return bias_gradient<__half>(p, dy, db, stream);
    case ElementType::kBFloat16: return bias_gradient<__nv_bfloat16>(p, dy, db, stream);
    case ElementType::kFloat: return bias_gradient<float>(p, dy, db, stream);
    case ElementType::kDouble: return bias_gradient<double>(p, dy, db, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fdnn_cudnn
