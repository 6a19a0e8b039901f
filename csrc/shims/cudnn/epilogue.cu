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
__host__ __device__ inline float to_acc(float v) { return v; }
__host__ __device__ inline double to_acc(double v) { return v; }

template <class T> __device__ inline T from_acc(typename Acc<T>::type v);
template <> __device__ inline __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ inline float from_acc<float>(float v) { return v; }
template <> __device__ inline double from_acc<double>(double v) { return v; }

// The FDNN_ACTIVATION_* values of flux_dnn.h, in the accumulation type.
template <class A>
__host__ __device__ A activate(A v, int32_t kind, A a, A b) {
  const A half = A(0.5), one = A(1);
  switch (kind) {
    case FDNN_ACTIVATION_RELU: return v < A(0) ? A(0) : v;  // NaN stays NaN, as in torch
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

// A tensor's dims in memory order (largest stride first), size-1 dims dropped (the channel
// dim kept) and neighbours merged where one is exactly the other's repeat, so that a
// linear index walks memory in order: dense NHWC becomes [N*H*W, C], dense NCHW
// [N, C, H*W]. `channel` is the position of the ABI's dim 1 (-1: not tracked).
struct FlatTensor {
  int ndim = 0;
  int channel = -1;
  int64_t shape[kMaxEpilogueDims] = {};
  int64_t strides[kMaxEpilogueDims] = {};
};

FlatTensor flatten(const StridedTensor& t, bool track_channel) {
  int order[kMaxEpilogueDims];
  int n = 0;
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] != 1 || (track_channel && d == 1)) order[n++] = d;
  for (int i = 1; i < n; ++i)  // insertion sort, stable: ties keep the logical order
    for (int j = i; j > 0 && t.strides[order[j - 1]] < t.strides[order[j]]; --j) {
      int swap = order[j];
      order[j] = order[j - 1];
      order[j - 1] = swap;
    }
  FlatTensor f;
  for (int i = 0; i < n; ++i) {
    int d = order[i];
    bool is_channel = track_channel && d == 1;
    bool mergeable = f.ndim > 0 && !is_channel && f.channel != f.ndim - 1 &&
                     f.strides[f.ndim - 1] == t.strides[d] * t.shape[d];
    if (mergeable) {  // the previous dim is this one repeated: one dim of their product
      f.shape[f.ndim - 1] *= t.shape[d];
      f.strides[f.ndim - 1] = t.strides[d];
      continue;
    }
    if (is_channel) f.channel = f.ndim;
    f.shape[f.ndim] = t.shape[d];
    f.strides[f.ndim] = t.strides[d];
    ++f.ndim;
  }
  if (f.ndim == 0) {  // a single element
    f.ndim = 1;
    f.shape[0] = 1;
    f.strides[0] = 1;
  }
  return f;
}

int64_t element_count(const StridedTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

// Whether every index and offset of the tensor fits 32-bit unsigned math (with room for
// the grid-stride step).
bool fits_32_bits(const FlatTensor& f, int64_t count) {
  int64_t last = 0;
  for (int d = 0; d < f.ndim; ++d) last += (f.shape[d] - 1) * f.strides[d];
  return count < (int64_t(1) << 31) && last < (int64_t(1) << 31);
}

// Offset of logical element `linear` (row-major over the flat dims) and its channel.
// The outermost dim needs no division: what is left of `linear` is its index.
template <class Index>
__host__ __device__ inline Index offset_of(const FlatTensor& t, Index linear, Index* channel) {
  Index offset = 0;
  for (int d = t.ndim - 1; d > 0; --d) {
    Index size = static_cast<Index>(t.shape[d]);
    Index i = linear % size;
    linear /= size;
    offset += i * static_cast<Index>(t.strides[d]);
    if (d == t.channel) *channel = i;
  }
  if (t.channel == 0) *channel = linear;
  return offset + linear * static_cast<Index>(t.strides[0]);
}

// One element of the header's y = alpha * act(conv + bias) + beta * y_old, from the
// convolution's result as cuDNN wrote it. Where cuDNN already scaled it by alpha
// (alpha_in_conv: no activation follows), only the bias is scaled here; else alpha scales
// the activated value. old is read only when beta != 0 (it may be NaN otherwise).
template <class A>
__host__ __device__ A epilogue_value(const EpilogueParams& p, A conv, bool has_bias, A bias,
                                     A old) {
  A v = conv;
  if (has_bias) v += (p.alpha_in_conv ? A(p.alpha) : A(1)) * bias;
  v = activate<A>(v, p.activation, A(p.activation_alpha), A(p.activation_beta));
  if (!p.alpha_in_conv) v *= A(p.alpha);
  if (p.beta != 0.0) v += A(p.beta) * old;
  return v;
}

template <class T, class Index>
__global__ void bias_activation_kernel(EpilogueParams p, FlatTensor t, T* y, const T* src,
                                       const T* bias, Index count) {
  using A = typename Acc<T>::type;
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    Index k = 0;
    Index off = offset_of<Index>(t, i, &k);
    const A b = bias ? to_acc(bias[static_cast<int64_t>(k) * p.bias_stride]) : A(0);
    const A old = p.beta != 0.0 ? to_acc(y[off]) : A(0);
    y[off] = from_acc<T>(epilogue_value<A>(p, to_acc(src[off]), bias != nullptr, b, old));
  }
}

// ---- bias gradient ------------------------------------------------------------------------
// dy seen as rows x channels: the flat dims outside the channel (`outer`) and inside it
// (`inner`). Pass 1: block (chunk, channel group) sums its share of rows of its channels
// into partial[chunk][channel] in a fixed order; pass 2 adds the chunks of each channel in
// order. One chunk writes db directly (no scratch).
struct BiasGradShape {
  FlatTensor outer;        // dims outside the channel
  FlatTensor inner;        // dims inside the channel (none: channels-last)
  int64_t channels = 1;
  int64_t channel_stride = 0;
  int64_t outer_count = 1, inner_count = 1;
  int64_t chunks = 1;
};

constexpr int kGradThreads = 256;
constexpr int kChannelsPerBlock = 32;  // channels-last: a warp reads 32 adjacent channels
constexpr int64_t kElementsPerBlock = 16384;  // per chunk: 64 per thread
constexpr int64_t kTargetBlocks = 1024;  // enough to fill any current GPU

BiasGradShape bias_grad_shape(const StridedTensor& dy) {
  FlatTensor f = flatten(dy, true);
  BiasGradShape s;
  s.channels = f.shape[f.channel];
  s.channel_stride = f.strides[f.channel];
  for (int d = 0; d < f.channel; ++d) {
    s.outer.shape[s.outer.ndim] = f.shape[d];
    s.outer.strides[s.outer.ndim++] = f.strides[d];
    s.outer_count *= f.shape[d];
  }
  for (int d = f.channel + 1; d < f.ndim; ++d) {
    s.inner.shape[s.inner.ndim] = f.shape[d];
    s.inner.strides[s.inner.ndim++] = f.strides[d];
    s.inner_count *= f.shape[d];
  }
  if (s.outer.ndim == 0) s.outer = FlatTensor{1, -1, {1}, {0}};
  if (s.inner.ndim == 0) s.inner = FlatTensor{1, -1, {1}, {0}};
  return s;
}

bool channels_last(const BiasGradShape& s) { return s.inner_count == 1; }

int64_t channel_groups(const BiasGradShape& s) {
  return channels_last(s) ? (s.channels + kChannelsPerBlock - 1) / kChannelsPerBlock
                          : s.channels;
}

// Chunks of rows that fill the GPU (about kElementsPerBlock per block, kTargetBlocks in
// all): a fixed function of the shape, so the sum's order, and its bits, do not depend on
// the device.
int64_t ideal_chunks(const BiasGradShape& s) {
  int64_t per_channel = s.outer_count * s.inner_count;
  int64_t block_channels = channels_last(s) ? (s.channels < kChannelsPerBlock ? s.channels
                                                                              : kChannelsPerBlock)
                                            : 1;
  int64_t by_work = (per_channel * block_channels + kElementsPerBlock - 1) / kElementsPerBlock;
  int64_t by_fill = (kTargetBlocks + channel_groups(s) - 1) / channel_groups(s);
  int64_t chunks = by_work < by_fill ? by_work : by_fill;
  return chunks < 1 ? 1 : (chunks > 65535 ? 65535 : chunks);
}

// The chunks a scratch of `bytes` holds (partials of `acc_size` bytes), at most the ideal.
int64_t chunks_within(const BiasGradShape& s, size_t bytes, size_t acc_size) {
  int64_t fit = static_cast<int64_t>(bytes / (acc_size * static_cast<size_t>(s.channels)));
  int64_t chunks = ideal_chunks(s) < fit ? ideal_chunks(s) : fit;
  return chunks < 2 ? 1 : chunks;
}

template <class A>
__device__ inline A block_sum(A* shared, A v, int lanes, int lane, int rows, int row) {
  // shared holds rows x lanes; rows summed in a fixed tree order per lane.
  shared[row * lanes + lane] = v;
  __syncthreads();
  for (int half = rows / 2; half > 0; half /= 2) {
    if (row < half) shared[row * lanes + lane] += shared[(row + half) * lanes + lane];
    __syncthreads();
  }
  return shared[lane];
}

template <class T, class A>
__device__ inline void write_channel(const EpilogueParams& p, T* db, int64_t k, A sum) {
  A v = A(p.alpha) * sum;
  T* out = db + k * p.bias_stride;
  if (p.beta != 0.0) v += A(p.beta) * to_acc(*out);
  *out = from_acc<T>(v);
}

// [begin, end) of `count` items for one chunk of s.chunks.
struct Range {
  int64_t begin, end;
};
__host__ __device__ inline Range chunk_range(int64_t count, int64_t chunks, int64_t chunk) {
  int64_t per_chunk = (count + chunks - 1) / chunks;
  int64_t begin = chunk * per_chunk;
  int64_t end = begin + per_chunk;
  return {begin < count ? begin : count, end < count ? end : count};
}

// One thread's share of channel k in a chunk, channels-last: rows lane, lane + kRows, ...
// (host-callable: epilogue_selftest.cu checks the index math on the CPU).
constexpr int kRows = kGradThreads / kChannelsPerBlock;
template <class T, class Index>
__host__ __device__ typename Acc<T>::type rows_thread_sum(const BiasGradShape& s, const T* dy,
                                                         int64_t k, int64_t chunk, int lane) {
  using A = typename Acc<T>::type;
  Range r = chunk_range(s.outer_count, s.chunks, chunk);
  const T* base = dy + k * s.channel_stride;
  A sum = A(0);
  for (Index row = static_cast<Index>(r.begin) + lane; row < static_cast<Index>(r.end);
       row += kRows) {
    Index unused = 0;
    sum += to_acc(base[offset_of<Index>(s.outer, row, &unused)]);
  }
  return sum;
}

// One thread's share of channel k in a chunk, channels-first: elements lane,
// lane + kGradThreads, ... of the channel's (outer x inner) elements.
template <class T, class Index>
__host__ __device__ typename Acc<T>::type inner_thread_sum(const BiasGradShape& s, const T* dy,
                                                          int64_t k, int64_t chunk, int lane) {
  using A = typename Acc<T>::type;
  Range r = chunk_range(s.outer_count * s.inner_count, s.chunks, chunk);
  const T* base = dy + k * s.channel_stride;
  const Index inner_count = static_cast<Index>(s.inner_count);
  A sum = A(0);
  for (Index j = static_cast<Index>(r.begin) + lane; j < static_cast<Index>(r.end);
       j += kGradThreads) {
    Index unused = 0;
    Index row = j / inner_count, col = j - row * inner_count;
    sum += to_acc(base[offset_of<Index>(s.outer, row, &unused) +
                       offset_of<Index>(s.inner, col, &unused)]);
  }
  return sum;
}

// Channels-last (channel stride smallest): threadIdx.x over 32 adjacent channels (one
// coalesced read per warp), threadIdx.y over rows.
template <class T, class Index>
__global__ void bias_grad_rows_kernel(EpilogueParams p, BiasGradShape s, const T* dy,
                                      typename Acc<T>::type* partial, T* db) {
  using A = typename Acc<T>::type;
  __shared__ A shared[kGradThreads];
  int64_t k = int64_t(blockIdx.x) * kChannelsPerBlock + threadIdx.x;
  int64_t chunk = blockIdx.y;
  A sum = k < s.channels ? rows_thread_sum<T, Index>(s, dy, k, chunk, threadIdx.y) : A(0);
  sum = block_sum<A>(shared, sum, kChannelsPerBlock, threadIdx.x, kRows, threadIdx.y);
  if (threadIdx.y != 0 || k >= s.channels) return;
  if (partial == nullptr)
    write_channel<T, A>(p, db, k, sum);
  else
    partial[chunk * s.channels + k] = sum;
}

// Channels-first: one channel per block column, threads along the inner (contiguous) dims.
template <class T, class Index>
__global__ void bias_grad_inner_kernel(EpilogueParams p, BiasGradShape s, const T* dy,
                                       typename Acc<T>::type* partial, T* db) {
  using A = typename Acc<T>::type;
  __shared__ A shared[kGradThreads];
  int64_t k = blockIdx.x;
  int64_t chunk = blockIdx.y;
  A sum = inner_thread_sum<T, Index>(s, dy, k, chunk, threadIdx.x);
  sum = block_sum<A>(shared, sum, 1, 0, kGradThreads, threadIdx.x);
  if (threadIdx.x != 0) return;
  if (partial == nullptr)
    write_channel<T, A>(p, db, k, sum);
  else
    partial[chunk * s.channels + k] = sum;
}

// Pass 2: each channel's chunks in order.
template <class T>
__global__ void bias_grad_finish_kernel(EpilogueParams p, BiasGradShape s,
                                        const typename Acc<T>::type* partial, T* db) {
  using A = typename Acc<T>::type;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;  // grid_for caps the blocks
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < s.channels; k += step) {
    A sum = A(0);
    for (int64_t c = 0; c < s.chunks; ++c) sum += partial[c * s.channels + k];
    write_channel<T, A>(p, db, k, sum);
  }
}

// Where element `linear` of a copy's walk goes (*to) and comes from (*from), in elements;
// false when it falls in the zero padding (nothing to read). Host-callable:
// epilogue_selftest.cu checks it on the CPU.
template <class Index>
__host__ __device__ inline bool copy_offsets(const StridedCopy& c, Index linear, int64_t* to,
                                             int64_t* from) {
  bool inside = true;
  int64_t t = 0, f = 0;
  for (int d = c.dst.ndim - 1; d >= 0; --d) {
    Index index = linear;  // the outermost dim takes what is left
    if (d > 0) {
      Index size = static_cast<Index>(c.dst.shape[d]);
      index = linear % size;
      linear /= size;
    }
    int64_t s = static_cast<int64_t>(index) - c.lead[d];
    inside = inside && s >= 0 && s < c.src.shape[d];
    t += static_cast<int64_t>(index) * c.dst.strides[d];
    f += s * c.src.strides[d];
  }
  *to = t;
  *from = f;
  return inside;
}

template <class T, class Index>
__global__ void strided_copy_kernel(StridedCopy c, const T* src, T* dst, Index count) {
  using A = typename Acc<T>::type;
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    int64_t to = 0, from = 0;
    T v = copy_offsets<Index>(c, i, &to, &from) ? src[from] : from_acc<T>(A(0));
    if (c.beta != 0.0) v = from_acc<T>(to_acc(v) + A(c.beta) * to_acc(dst[to]));
    dst[to] = v;
  }
}

// The copy's dims ordered by dst stride, largest first (stable), so that consecutive
// threads write consecutive addresses.
StridedCopy in_dst_order(StridedCopy c) {
  for (int i = 1; i < c.dst.ndim; ++i)
    for (int j = i; j > 0 && c.dst.strides[j - 1] < c.dst.strides[j]; --j)
      for (int64_t* v : {c.dst.shape, c.dst.strides, c.src.shape, c.src.strides, c.lead}) {
        int64_t swap = v[j];
        v[j] = v[j - 1];
        v[j - 1] = swap;
      }
  return c;
}

// Knuth's multiplicative hash of the word's index: its sign and low 10 bits.
__global__ void fill_pattern_kernel(uint16_t* dst, size_t words) {
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += step) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    h ^= h >> 15;
    dst[i] = static_cast<uint16_t>((h & 0x8000u) | 0x3C00u | (h & 0x03FFu));
  }
}

unsigned grid_for(int64_t count, int threads) {
  int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

template <class T>
cudaError_t bias_activation(const EpilogueParams& p, void* y, const void* src,
                            const void* bias, cudaStream_t stream) {
  // y and src share y's strides (the conv result is laid out as y), so one walk serves both.
  FlatTensor t = flatten(p.y, true);
  int64_t count = element_count(p.y);
  constexpr int kThreads = 256;
  unsigned grid = grid_for(count, kThreads);
  if (fits_32_bits(t, count))
    bias_activation_kernel<T, uint32_t><<<grid, kThreads, 0, stream>>>(
        p, t, static_cast<T*>(y), static_cast<const T*>(src), static_cast<const T*>(bias),
        static_cast<uint32_t>(count));
  else
    bias_activation_kernel<T, int64_t><<<grid, kThreads, 0, stream>>>(
        p, t, static_cast<T*>(y), static_cast<const T*>(src), static_cast<const T*>(bias),
        count);
  return cudaGetLastError();
}

template <class T>
cudaError_t bias_gradient(const EpilogueParams& p, const void* dy_raw, void* db_raw,
                          void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  BiasGradShape s = bias_grad_shape(p.y);
  s.chunks = chunks_within(s, scratch_bytes, sizeof(A));
  A* partial = s.chunks > 1 ? static_cast<A*>(scratch) : nullptr;
  const T* dy = static_cast<const T*>(dy_raw);
  T* db = static_cast<T*>(db_raw);
  // Channels (or groups of 32) on grid.x, which takes 2^31 - 1 blocks: grid.y stops at
  // 65535, which K alone may pass; the chunks are at most 65535 (ideal_chunks).
  dim3 grid(static_cast<unsigned>(channel_groups(s)), static_cast<unsigned>(s.chunks));
  dim3 rows_block(kChannelsPerBlock, kGradThreads / kChannelsPerBlock);
  // 32-bit index math when every offset (relative to a channel's first element) fits.
  bool small = fits_32_bits(flatten(p.y, false), element_count(p.y));
  if (channels_last(s) && small)
    bias_grad_rows_kernel<T, uint32_t><<<grid, rows_block, 0, stream>>>(p, s, dy, partial, db);
  else if (channels_last(s))
    bias_grad_rows_kernel<T, int64_t><<<grid, rows_block, 0, stream>>>(p, s, dy, partial, db);
  else if (small)
    bias_grad_inner_kernel<T, uint32_t><<<grid, kGradThreads, 0, stream>>>(p, s, dy, partial, db);
  else
    bias_grad_inner_kernel<T, int64_t><<<grid, kGradThreads, 0, stream>>>(p, s, dy, partial, db);
  if (partial != nullptr)
    bias_grad_finish_kernel<T><<<grid_for(s.channels, 256), 256, 0, stream>>>(p, s, partial,
                                                                              db);
  return cudaGetLastError();
}

template <class T>
cudaError_t strided_copy(const StridedCopy& given, const void* src, void* dst,
                         cudaStream_t stream) {
  StridedCopy c = in_dst_order(given);
  int64_t count = element_count(c.dst);
  constexpr int kThreads = 256;
  unsigned grid = grid_for(count, kThreads);
  if (count < (int64_t(1) << 31))  // 32-bit division for the walk; offsets stay 64-bit
    strided_copy_kernel<T, uint32_t><<<grid, kThreads, 0, stream>>>(
        c, static_cast<const T*>(src), static_cast<T*>(dst), static_cast<uint32_t>(count));
  else
    strided_copy_kernel<T, int64_t><<<grid, kThreads, 0, stream>>>(
        c, static_cast<const T*>(src), static_cast<T*>(dst), count);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_strided_copy(const StridedCopy& c, const void* src, void* dst,
                                cudaStream_t stream) {
  switch (c.type) {
    case ElementType::kHalf: return strided_copy<__half>(c, src, dst, stream);
    case ElementType::kBFloat16: return strided_copy<__nv_bfloat16>(c, src, dst, stream);
    case ElementType::kFloat: return strided_copy<float>(c, src, dst, stream);
    case ElementType::kDouble: return strided_copy<double>(c, src, dst, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_fill_pattern(void* dst, size_t bytes, cudaStream_t stream) {
  size_t words = bytes / 2;
  if (words == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  fill_pattern_kernel<<<grid_for(static_cast<int64_t>(words), kThreads), kThreads, 0, stream>>>(
      static_cast<uint16_t*>(dst), words);
  return cudaGetLastError();
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

size_t bias_gradient_scratch_bytes(const EpilogueParams& p) {
  BiasGradShape s = bias_grad_shape(p.y);
  int64_t chunks = ideal_chunks(s);
  if (chunks < 2) return 0;
  size_t acc = p.type == ElementType::kDouble ? sizeof(double) : sizeof(float);
  return static_cast<size_t>(chunks * s.channels) * acc;
}

cudaError_t launch_bias_gradient(const EpilogueParams& p, const void* dy, void* db,
                                 void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  switch (p.type) {
    case ElementType::kHalf:
      return bias_gradient<__half>(p, dy, db, scratch, scratch_bytes, stream);
    case ElementType::kBFloat16:
      return bias_gradient<__nv_bfloat16>(p, dy, db, scratch, scratch_bytes, stream);
    case ElementType::kFloat:
      return bias_gradient<float>(p, dy, db, scratch, scratch_bytes, stream);
    case ElementType::kDouble:
      return bias_gradient<double>(p, dy, db, scratch, scratch_bytes, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fdnn_cudnn
