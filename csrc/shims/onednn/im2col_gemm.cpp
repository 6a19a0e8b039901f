// The small-problem path of the oneDNN shim: im2col + dnnl_sgemm, or padded taps (see im2col_gemm.hpp).
#include "im2col_gemm.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FDNN_ONEDNN_HAS_AVX2_KERNELS 1
#endif

#include "shim_common.hpp"

namespace fdnn_onednn {
namespace {

using fdnn_shim::fail;

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// ceil(a / b) for b > 0 and any sign of a.
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// The stride of one flat index over `count` dims (outer to inner) that addresses them all as
// one run, e.g. H and W of a dense NCHW image as one pixel index; `ok` false when the dims do
// not form one run (gaps, or a broadcast stride 0 across elements). One element: stride 1.
struct FlatStride {
  bool ok = false;
  int64_t step = 1;
};

FlatStride flat_stride(const int64_t* size, const int64_t* stride, int count) {
  FlatStride f;
  f.ok = true;
  bool first = true;
  int64_t extent = 1;
  for (int i = count - 1; i >= 0; --i) {
    if (size[i] == 1) continue;
    if (first) {
      f.step = stride[i];
      first = false;
    } else if (stride[i] != f.step * extent) {
      f.ok = false;
    }
    extent *= size[i];
  }
  if (!first && f.step == 0) f.ok = false;
  return f;
}

// The leading dimension of a row-major `rows` x `cols` matrix whose rows lie `row_stride`
// apart, or 0 when sgemm cannot take it (rows that overlap). One row: any row stride.
int64_t leading_dim(int64_t rows, int64_t cols, int64_t row_stride) {
  if (rows <= 1) return std::max<int64_t>(cols, 1);
  return row_stride >= std::max<int64_t>(cols, 1) ? row_stride : 0;
}

// x, w, y as 3 spatial dims: rank r fills the last r entries.
void place_spatial(const FDNN_Conv_Plan_Create_Args& a, Im2colGemm& g) {
  const int first = 3 - a.spatial_rank;
  for (int i = 0; i < a.spatial_rank; ++i) {
    const int d = first + i;
    g.in[d] = a.x->shape[2 + i];
    g.kernel[d] = a.w->shape[2 + i];
    g.out[d] = a.y->shape[2 + i];
    g.stride[d] = a.stride[i];
    g.dilation[d] = a.dilation[i];
    g.pad_lo[d] = a.padding_lo[i];
    g.x_s[d] = a.x->strides[2 + i];
    g.w_s[d] = a.w->strides[2 + i];
    g.y_s[d] = a.y->strides[2 + i];
  }
}

bool is_pointwise(const FDNN_Conv_Plan_Create_Args& a) {
  for (int i = 0; i < a.spatial_rank; ++i)
    if (a.w->shape[2 + i] != 1 || a.stride[i] != 1 || a.padding_lo[i] != 0 || a.padding_hi[i] != 0)
      return false;
  return true;
}

// A 1x1, stride-1, unpadded x whose layout already is the C/g x P matrix of each (image,
// group): NC[D]HW read as it is, channels-last read transposed. Else im2col.
void choose_x_operand(const FDNN_Conv_Plan_Create_Args& a, Im2colGemm& g) {
  g.im2col = true;
  if (!is_pointwise(a)) return;
  const FlatStride pixel = flat_stride(g.in, g.x_s, 3);
  if (!pixel.ok) return;
  const bool pixel_unit = g.pixels == 1 || pixel.step == 1;
  const bool channel_unit = g.group_in == 1 || g.x_c == 1;
  if (pixel_unit && (g.x_ld = leading_dim(g.group_in, g.pixels, g.x_c)) > 0) {
    g.x_trans = 'N';
    g.im2col = false;
  } else if (channel_unit && (g.x_ld = leading_dim(g.pixels, g.group_in, pixel.step)) > 0) {
    g.x_trans = 'T';
    g.im2col = false;
  }
}

// Whether im2col reads a zero-padded copy of x (Im2colGemm::padded_source): along each dim the
// taps read input positions [-pad_lo, (out - 1) * stride + (kernel - 1) * dilation - pad_lo],
// `span` of them. Only where that copy is at most twice the matrix, so that a stride far
// above the kernel extent does not make the workspace grow with the gaps it skips.
void choose_padded_source(Im2colGemm& g) {
  double copy = g.group_in, matrix = static_cast<double>(g.rows) * static_cast<double>(g.pixels);
  for (int d = 0; d < 3; ++d) {
    g.span[d] = (g.out[d] - 1) * g.stride[d] + (g.kernel[d] - 1) * g.dilation[d] + 1;
    copy *= static_cast<double>(g.span[d]);
  }
  g.padded_source = g.im2col && copy <= 2 * matrix;
  g.source_pitch = g.span[0] * g.span[1] * g.span[2];
  g.wide = g.padded_source && g.out[0] == 1 && g.stride[1] == 1 && g.stride[2] == 1;
  if (g.wide) {
    g.wide_pixels = g.out[1] * g.span[2];
    // The last tap's run reads (kernel[2] - 1) * dilation[2] floats past the channel's block.
    g.source_pitch += (g.kernel[2] - 1) * g.dilation[2];
  }
}

// Where each row of the im2col matrix starts in the padded copy (Im2colGemm::tap_offsets):
// im2col copies from there, and the padded-taps product reads there in place.
void place_taps(Im2colGemm& g) {
  g.tap_offsets.clear();
  if (!g.padded_source) return;
  const int64_t p1 = g.span[1], p2 = g.span[2];
  for (int64_t c = 0; c < g.group_in; ++c)
    for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0)
      for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1)
        for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2)
          g.tap_offsets.push_back(c * g.source_pitch + (k0 * g.dilation[0] * p1 + k1 * g.dilation[1]) * p2 +
                                  k2 * g.dilation[2]);
}

// The weights (K, C/g, *kernel) are the K x R matrix when (C/g, *kernel) is one unit-stride
// run (dense plain weights); else each call copies them into the workspace.
void choose_w_operand(Im2colGemm& g) {
  const int64_t size[4] = {g.group_in, g.kernel[0], g.kernel[1], g.kernel[2]};
  const int64_t stride[4] = {g.w_c, g.w_s[0], g.w_s[1], g.w_s[2]};
  const FlatStride r = flat_stride(size, stride, 4);
  const int64_t k = g.groups * g.group_out;
  g.w_ld = leading_dim(k, g.rows, g.w_k);
  g.w_matrix = r.ok && (g.rows == 1 || r.step == 1) && g.w_ld > 0;
}

// Where the product of one (image, group) goes (OutputMode). Every mode computes the same
// float32 values in the same order (the product W X, then alpha * act(product + bias) +
// beta * y), so a result does not depend on y's layout: out= and a fresh output agree bit
// for bit.
void choose_output(Im2colGemm& g) {
  g.mode = OutputMode::kStaged;
  if (g.beta != 0.f) return;  // the epilogue reads y and the product
  const FlatStride pixel = flat_stride(g.out, g.y_s, 3);
  if (!pixel.ok) return;
  if ((g.pixels == 1 || pixel.step == 1) &&
      (g.y_ld = leading_dim(g.group_out, g.pixels, g.y_k)) > 0)
    g.mode = OutputMode::kRowsK;
}

// Bytes of a rows x cols float matrix, 64-byte aligned; UNSUPPORTED beyond int64 (a given
// algorithm 8 on a problem whose im2col matrix no memory holds).
size_t matrix_bytes(int64_t rows, int64_t cols) {
  int64_t elements = 0, bytes = 0;
  if (fdnn_shim::checked_mul(rows, cols, &elements) ||
      fdnn_shim::checked_mul(elements, static_cast<int64_t>(sizeof(float)), &bytes) ||
      bytes > INT64_MAX - 64)
    fail(FDNN_ERROR_UNSUPPORTED, "the im2col + sgemm path needs a %lld x %lld float32 matrix, "
         "beyond any workspace", static_cast<long long>(rows), static_cast<long long>(cols));
  return align64(static_cast<size_t>(bytes));
}

void place_workspace(Im2colGemm& g) {
  int64_t offset = 0;
  auto add = [&](size_t bytes) {
    if (fdnn_shim::checked_add(offset, static_cast<int64_t>(bytes), &offset))
      fail(FDNN_ERROR_UNSUPPORTED, "the im2col + sgemm path needs more workspace than int64 counts");
  };
  const int64_t columns = g.wide ? g.wide_pixels : g.pixels;
  g.col_offset = static_cast<size_t>(offset);
  if (g.im2col && !g.taps()) add(matrix_bytes(g.rows, columns));
  g.w_offset = static_cast<size_t>(offset);
  if (!g.w_matrix && !g.packed_w) add(matrix_bytes(g.groups * g.group_out, g.rows));
  g.stage_offset = static_cast<size_t>(offset);
  if (g.mode == OutputMode::kStaged || g.wide) add(matrix_bytes(g.group_out, columns));
  g.source_offset = static_cast<size_t>(offset);
  if (g.im2col && g.padded_source) add(matrix_bytes(g.group_in, g.source_pitch));
  g.workspace_size = static_cast<size_t>(offset);
}

// ------------------------------------------------------------------------------------------
// Execution

// Copies a strided run of n floats (step in elements). Runs are short here (an output row
// of a small problem), so a plain loop: a memcpy call per row costs more than the copy
// (this file is built with GCC's loop-to-memcpy/memset rewriting off, see CMakeLists.txt).
void copy_run(const float* __restrict from, int64_t step, float* __restrict to, int64_t n) {
  if (step == 1) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)  // four at a time: one vector move, no tail loop per row
      for (int j = 0; j < 4; ++j) to[i + j] = from[i + j];
    for (; i < n; ++i) to[i] = from[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) to[i] = from[i * step];
}

// ---- Block kernels: the per-call copies and the plain epilogue, per instruction set ------
//
// Each moves `rows` runs of n floats, row r reading from + r * from_row and writing
// to + r * to_row. Nearly all of a small problem's own work (the padded copy, im2col, the
// epilogue) is such blocks, so they are the only code written per instruction set: the
// baseline (the shim is built for baseline x86-64, SSE2) and AVX2, taken where oneDNN itself
// dispatches to AVX2 or better (avx2_kernels_usable). Both variants compute the same float
// operations in the same order, so their results are bit-identical.
struct BlockKernels {
  // to[i] = from[i * from_step] for each row.
  void (*copy)(const float* from, int64_t from_row, int64_t from_step, float* to, int64_t to_row,
               int64_t rows, int64_t n);
  // to[i] = alpha * (from[i] + bias) for each row: the epilogue without activation or beta.
  void (*scale)(const float* from, int64_t from_row, float* to, int64_t to_row, int64_t rows,
                int64_t n, float alpha, float bias);
};

// Long unit-stride runs (wide im2col rows) go to libc's memcpy, which picks its own vector
// width at run time; short ones (rows of a small x) stay inline, where a call costs more.
void copy_block(const float* from, int64_t from_row, int64_t from_step, float* to, int64_t to_row,
                int64_t rows, int64_t n) {
  constexpr int64_t kMemcpyRun = 32;
  if (from_step == 1 && n >= kMemcpyRun) {
    for (int64_t r = 0; r < rows; ++r, from += from_row, to += to_row)
      std::memcpy(to, from, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t r = 0; r < rows; ++r, from += from_row, to += to_row) copy_run(from, from_step, to, n);
}

void scale_block(const float* from, int64_t from_row, float* to, int64_t to_row, int64_t rows,
                 int64_t n, float alpha, float bias) {
  for (int64_t r = 0; r < rows; ++r, from += from_row, to += to_row) {
    const float* __restrict in = from;
    float* __restrict out = to;
    for (int64_t i = 0; i < n; ++i) out[i] = alpha * (in[i] + bias);
  }
}

constexpr BlockKernels kBaselineKernels{copy_block, scale_block};

#ifdef FDNN_ONEDNN_HAS_AVX2_KERNELS
#define FDNN_AVX2 __attribute__((target("avx2")))

// The first n of 8 lanes (0 < n < 8), for a row's masked tail.
FDNN_AVX2 inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// One unit-stride run: 8 floats per step, then a masked tail (masked-off lanes are neither
// read nor written, so nothing past either run is touched). A run of exactly 8 (a row of a
// small x, the common case here) is one move, without the loop's tests.
FDNN_AVX2 inline void copy_run_avx2(const float* from, float* to, int64_t n) {
  if (n == 8) return _mm256_storeu_ps(to, _mm256_loadu_ps(from));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(to + i, _mm256_loadu_ps(from + i));
  if (i < n) {
    const __m256i lanes = first_lanes(n - i);
    _mm256_maskstore_ps(to + i, lanes, _mm256_maskload_ps(from + i, lanes));
  }
}

FDNN_AVX2 void copy_block_avx2(const float* from, int64_t from_row, int64_t from_step, float* to,
                               int64_t to_row, int64_t rows, int64_t n) {
  if (from_step != 1) return copy_block(from, from_row, from_step, to, to_row, rows, n);
  for (int64_t r = 0; r < rows; ++r, from += from_row, to += to_row) copy_run_avx2(from, to, n);
}

// The same two float operations per element as scale_block (no fused multiply-add).
FDNN_AVX2 void scale_block_avx2(const float* from, int64_t from_row, float* to, int64_t to_row,
                                int64_t rows, int64_t n, float alpha, float bias) {
  const __m256 a = _mm256_set1_ps(alpha), b = _mm256_set1_ps(bias);
  if (n == 8) {  // rows of one vector (a small y), without the loop's tests
    for (int64_t r = 0; r < rows; ++r, from += from_row, to += to_row)
      _mm256_storeu_ps(to, _mm256_mul_ps(a, _mm256_add_ps(_mm256_loadu_ps(from), b)));
    return;
  }
  for (int64_t r = 0; r < rows; ++r, from += from_row, to += to_row) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(to + i, _mm256_mul_ps(a, _mm256_add_ps(_mm256_loadu_ps(from + i), b)));
    if (i < n) {
      const __m256i lanes = first_lanes(n - i);
      const __m256 v = _mm256_mul_ps(a, _mm256_add_ps(_mm256_maskload_ps(from + i, lanes), b));
      _mm256_maskstore_ps(to + i, lanes, v);
    }
  }
}

constexpr BlockKernels kAvx2Kernels{copy_block_avx2, scale_block_avx2};

// ---- The padded-taps product (Im2colGemm::taps) -------------------------------------------
//
// c[m][n] = sum over k of w[m][k] * source[taps[k] + n]: the wide product W X where row k of
// X is the run of the padded copy that starts taps[k] floats in, read in place. For the
// tiny problems of this path oneDNN's sgemm costs more in its driver (ISA queries, the thread
// split, a buffer allocated per call: ~3.4k of its ~7k instructions on 1x4x8x8 / 4x4x3x3)
// than in its kernel, and im2col copies every tap's run once more; this reads the runs where
// they lie. Register blocks of R rows by V vectors of 8 columns, k innermost, one fused
// multiply-add per term, the sum over k in ascending order.
#define FDNN_AVX2_FMA __attribute__((target("avx2,fma")))

struct TapOperands {
  const float* w;  // row-major, w_ld floats per row
  int64_t w_ld;
  const float* source;
  const int64_t* taps;
  int64_t k_count;
  float* c;  // row-major, ldc floats per row
  int64_t ldc;
};

// One row's term: c0 (and c1) += w * b0 (and b1).
template <int V>
FDNN_AVX2_FMA __attribute__((always_inline)) inline void accumulate(const float* w, __m256 b0, __m256 b1, __m256& c0,
                                                                    __m256& c1) {
  const __m256 a = _mm256_broadcast_ss(w);
  c0 = _mm256_fmadd_ps(a, b0, c0);
  if constexpr (V == 2) c1 = _mm256_fmadd_ps(a, b1, c1);
}

// Columns [n, n + 8 V) of rows [0, R) (R <= 4, V <= 2); the last vector only its first lanes
// when kMasked (masked lanes are neither read nor written). The accumulators are named
// variables, not an array: GCC kept an array of them in memory, storing it on every term;
// the ones a block does not use are dropped by the compiler.
template <int R, int V, bool kMasked>
FDNN_AVX2_FMA inline void tap_block(const TapOperands& t, int64_t n, __m256i lanes) {
  static_assert(R >= 1 && R <= 4 && V >= 1 && V <= 2, "blocks of up to 4 rows by 2 vectors");
  const float* const source = t.source + n;
  const int64_t* const taps = t.taps;
  const float* const w0 = t.w;
  const float* const w1 = w0 + t.w_ld;
  const float* const w2 = w1 + t.w_ld;
  const float* const w3 = w2 + t.w_ld;
  const __m256 zero = _mm256_setzero_ps();
  __m256 c00 = zero, c01 = zero, c10 = zero, c11 = zero, c20 = zero, c21 = zero, c30 = zero, c31 = zero;
  for (int64_t k = 0, k_count = t.k_count; k < k_count; ++k) {
    const float* run = source + taps[k];
    const __m256 b0 = kMasked && V == 1 ? _mm256_maskload_ps(run, lanes) : _mm256_loadu_ps(run);
    __m256 b1 = zero;
    if constexpr (V == 2) b1 = kMasked ? _mm256_maskload_ps(run + 8, lanes) : _mm256_loadu_ps(run + 8);
    accumulate<V>(w0 + k, b0, b1, c00, c01);
    if constexpr (R > 1) accumulate<V>(w1 + k, b0, b1, c10, c11);
    if constexpr (R > 2) accumulate<V>(w2 + k, b0, b1, c20, c21);
    if constexpr (R > 3) accumulate<V>(w3 + k, b0, b1, c30, c31);
  }
  // Row r's vectors into c[r][n...]: the last one masked when kMasked.
  auto store_row = [&](int r, __m256 first, __m256 second) FDNN_AVX2_FMA {
    float* to = t.c + r * t.ldc + n;
    if (kMasked && V == 1) return _mm256_maskstore_ps(to, lanes, first);
    _mm256_storeu_ps(to, first);
    if constexpr (V == 2) {
      if (kMasked)
        _mm256_maskstore_ps(to + 8, lanes, second);
      else
        _mm256_storeu_ps(to + 8, second);
    }
  };
  store_row(0, c00, c01);
  if constexpr (R > 1) store_row(1, c10, c11);
  if constexpr (R > 2) store_row(2, c20, c21);
  if constexpr (R > 3) store_row(3, c30, c31);
}

// Rows [0, R) over `cols` columns: blocks of 16, then 8, then a masked tail.
template <int R>
FDNN_AVX2_FMA void tap_rows(const TapOperands& t, int64_t cols) {
  const __m256i all = _mm256_set1_epi32(-1);
  int64_t n = 0;
  for (; n + 16 <= cols; n += 16) tap_block<R, 2, false>(t, n, all);
  if (n + 8 <= cols) {
    tap_block<R, 1, false>(t, n, all);
    n += 8;
  }
  if (n < cols) tap_block<R, 1, true>(t, n, first_lanes(cols - n));
}

FDNN_AVX2_FMA void tap_product_avx2(TapOperands t, int64_t rows, int64_t cols) {
  for (; rows >= 4; rows -= 4, t.w += 4 * t.w_ld, t.c += 4 * t.ldc) tap_rows<4>(t, cols);
  switch (rows) {
    case 3: return tap_rows<3>(t, cols);
    case 2: return tap_rows<2>(t, cols);
    case 1: return tap_rows<1>(t, cols);
    default: return;
  }
}
#undef FDNN_AVX2_FMA
#undef FDNN_AVX2
#endif

const BlockKernels& block_kernels(const Im2colGemm& g) {
#ifdef FDNN_ONEDNN_HAS_AVX2_KERNELS
  if (g.avx2) return kAvx2Kernels;
#endif
  (void)g;
  return kBaselineKernels;
}

// One row of the im2col matrix along output dim 2: zeros, `from` read every `step`
// elements for outputs [lo, hi), zeros.
inline void fill_row(float* __restrict row, int64_t run, int64_t lo, int64_t hi,
                     const float* __restrict from, int64_t step) {
  for (int64_t o = 0; o < lo; ++o) row[o] = 0.f;
  copy_run(from, step, row + lo, hi - lo);
  for (int64_t o = hi; o < run; ++o) row[o] = 0.f;
}

// The R x P matrix of one (image, group): row (c, k0, k1, k2), column (o0, o1, o2), holding
// x at the input position that kernel tap sees from that output position, 0 in the padding.
// The geometry is read into locals first: stores through `col` could alias the plan's
// fields, which the compiler would then reload in every row.
void im2col(const Im2colGemm& g, const float* x, float* col) {
  const int64_t in0 = g.in[0], in1 = g.in[1], in2 = g.in[2];
  const int64_t out0 = g.out[0], out1 = g.out[1], run = g.out[2];
  const int64_t s0 = g.stride[0], s1 = g.stride[1], s2 = g.stride[2];
  const int64_t xs0 = g.x_s[0], xs1 = g.x_s[1], xs2 = g.x_s[2], xc = g.x_c;
  const int64_t step = s2 * xs2;
  float* row = col;
  for (int64_t c = 0; c < g.group_in; ++c)
    for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0)
      for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1)
        for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2) {
          const int64_t shift0 = k0 * g.dilation[0] - g.pad_lo[0];
          const int64_t shift1 = k1 * g.dilation[1] - g.pad_lo[1];
          const int64_t shift2 = k2 * g.dilation[2] - g.pad_lo[2];
          // The outputs whose input along dim 2 lies inside x: [lo, hi).
          const int64_t lo = std::clamp<int64_t>(ceil_div(-shift2, s2), 0, run);
          const int64_t hi = std::clamp<int64_t>(ceil_div(in2 - shift2, s2), lo, run);
          const float* plane = x + c * xc + (lo * s2 + shift2) * xs2;
          for (int64_t o0 = 0; o0 < out0; ++o0) {
            const int64_t i0 = o0 * s0 + shift0;
            const bool inside0 = i0 >= 0 && i0 < in0 && lo < hi;
            for (int64_t o1 = 0; o1 < out1; ++o1, row += run) {
              const int64_t i1 = o1 * s1 + shift1;
              if (inside0 && i1 >= 0 && i1 < in1)
                fill_row(row, run, lo, hi, plane + i0 * xs0 + i1 * xs1, step);
              else
                fill_row(row, run, 0, 0, plane, step);
            }
          }
        }
}

// x of one (image, group) as the zero-padded dense block im2col_padded reads: per channel
// span[0] x span[1] x span[2], x at offset pad_lo, zeros around it (and where the taps read
// no x at all, nothing of x is copied).
void pad_source(const Im2colGemm& g, const BlockKernels& k, const float* x, float* source) {
  const int64_t p1 = g.span[1], p2 = g.span[2];
  std::memset(source, 0, static_cast<size_t>(g.group_in * g.source_pitch) * sizeof(float));
  // The part of x the taps read: rows [0, n) along each dim, placed at pad_lo.
  const int64_t n0 = std::min(g.in[0], g.span[0] - g.pad_lo[0]), n1 = std::min(g.in[1], p1 - g.pad_lo[1]);
  const int64_t n2 = std::min(g.in[2], p2 - g.pad_lo[2]);
  if (n0 <= 0 || n1 <= 0 || n2 <= 0) return;
  for (int64_t c = 0; c < g.group_in; ++c)
    for (int64_t i0 = 0; i0 < n0; ++i0)
      k.copy(x + c * g.x_c + i0 * g.x_s[0], g.x_s[1], g.x_s[2],
             source + c * g.source_pitch + ((i0 + g.pad_lo[0]) * p1 + g.pad_lo[1]) * p2 + g.pad_lo[2], p2, n1, n2);
}

// The R x P matrix of one (image, group) from its zero-padded block: every row a plain copy
// from its tap's offset (stride along dim 2 read every stride[2] elements), no bounds to test.
void im2col_padded(const Im2colGemm& g, const BlockKernels& k, const float* source, float* col) {
  const int64_t out0 = g.out[0], out1 = g.out[1], run = g.out[2];
  const int64_t step0 = g.stride[0] * g.span[1] * g.span[2], step1 = g.stride[1] * g.span[2];
  for (const int64_t tap : g.tap_offsets)
    for (int64_t o0 = 0; o0 < out0; ++o0, col += out1 * run)
      k.copy(source + tap + o0 * step0, step1, g.stride[2], col, run, out1, run);
}

// Wide mode's R x (out[1] * span[2]) matrix: each row the run of the padded copy that starts
// at its tap's offset. The kernel[2] taps of one (c, k0, k1) are consecutive in tap_offsets,
// dilation[2] apart: one block per (c, k0, k1).
void im2col_wide(const Im2colGemm& g, const BlockKernels& k, const float* source, float* col) {
  const int64_t run = g.wide_pixels, taps = g.kernel[2];
  for (size_t r = 0; r < g.tap_offsets.size(); r += static_cast<size_t>(taps), col += taps * run)
    k.copy(source + g.tap_offsets[r], g.dilation[2], 1, col, run, taps, run);
}

// The K x R weights, dense, from the caller's strides.
void copy_weights(const Im2colGemm& g, const float* w, float* dense) {
  for (int64_t k = 0; k < g.groups * g.group_out; ++k)
    for (int64_t c = 0; c < g.group_in; ++c)
      for (int64_t k0 = 0; k0 < g.kernel[0]; ++k0)
        for (int64_t k1 = 0; k1 < g.kernel[1]; ++k1)
          for (int64_t k2 = 0; k2 < g.kernel[2]; ++k2)
            *dense++ = w[k * g.w_k + c * g.w_c + k0 * g.w_s[0] + k1 * g.w_s[1] + k2 * g.w_s[2]];
}

// The activation as oneDNN's eltwise post-op computes it (relu with a negative slope: s > 0 ?
// s : s * alpha; clip: max with the lower bound first), so this path matches the primitive.
float activate(const Im2colGemm& g, float v) {
  switch (g.activation) {
    case FDNN_ACTIVATION_RELU: return v > 0.f ? v : v * 0.f;
    case FDNN_ACTIVATION_LEAKY_RELU: return v > 0.f ? v : v * g.activation_alpha;
    case FDNN_ACTIVATION_CLIP:
      v = v > g.activation_alpha ? v : g.activation_alpha;
      return v > g.activation_beta ? g.activation_beta : v;
    default: return v;
  }
}

// Calls f(k, y element) for every output of one (image, group) in (k, o0, o1, o2) order.
template <class F>
void for_each_output(const Im2colGemm& g, float* y, F&& f) {
  for (int64_t k = 0; k < g.group_out; ++k)
    for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
        float* run = y + k * g.y_k + o0 * g.y_s[0] + o1 * g.y_s[1];
        for (int64_t o2 = 0; o2 < g.out[2]; ++o2) f(k, run[o2 * g.y_s[2]]);
      }
}

struct Matrix {
  const float* data;
  char trans;  // 'N': stored as written, 'T': stored transposed
  int64_t ld;
};

void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, Matrix a, Matrix b,
           float beta, float* c, int64_t ldc) {
  const dnnl_status_t s =
      dnnl_sgemm(ta, tb, m, n, k, alpha, a.data, a.ld, b.data, b.ld, beta, c, ldc);
  if (s != dnnl_success)
    fail(FDNN_ERROR_VENDOR, "oneDNN dnnl_sgemm failed with status %d (M=%lld N=%lld K=%lld)",
         static_cast<int>(s), static_cast<long long>(m), static_cast<long long>(n),
         static_cast<long long>(k));
}

// The product W X of one (image, group): W (K/g x R) times X (R x P) into the row-major
// K/g x P matrix c.
void product(const Im2colGemm& g, Matrix w, Matrix x, float* c, int64_t ldc) {
  sgemm('N', x.trans, g.group_out, g.pixels, g.rows, 1.f, w, x, 0.f, c, ldc);
}

// The header's epilogue before beta, alpha * act(conv + bias), in the order of the
// primitive's post-ops (the activation, then alpha as eltwise_linear), so both paths agree.
inline float scaled_activation(const Im2colGemm& g, float conv_plus_bias) {
  return g.alpha * activate(g, conv_plus_bias);
}

// One (image, group) with the product written straight into y (beta == 0: y is written
// before it is read, so whatever it held cannot leak), then alpha * act(y + bias) in place
// where that changes anything.
void run_direct(const Im2colGemm& g, Matrix w, Matrix x, const float* bias, float* y) {
  product(g, w, x, y, g.y_ld);
  if (bias == nullptr && g.alpha == 1.f && g.activation == FDNN_ACTIVATION_NONE) return;
  for_each_output(g, y, [&](int64_t k, float& v) {
    v = scaled_activation(g, v + (bias != nullptr ? bias[k * g.bias_stride] : 0.f));
  });
}

// The header's y = alpha * act(product + bias) + beta * y for one element (beta == 0: y
// is not read).
inline float finish(const Im2colGemm& g, float product, float bias, float prior) {
  const float out = scaled_activation(g, product + bias);
  return g.beta == 0.f ? out : out + g.beta * prior;
}

// One (image, group) in wide mode: the product over span[2] columns per output row into the
// workspace (from the padded copy's taps, or im2col + sgemm), then each row's first out[2]
// columns through the epilogue into y.
void run_wide(const Im2colGemm& g, const BlockKernels& kernels, Matrix w, const float* source, float* col,
              const float* bias, float* y, float* stage) {
#ifdef FDNN_ONEDNN_HAS_AVX2_KERNELS
  if (g.taps())
    tap_product_avx2(TapOperands{w.data, w.ld, source, g.tap_offsets.data(), g.rows, stage, g.wide_pixels},
                     g.group_out, g.wide_pixels);
#endif
  if (!g.taps()) {
    im2col_wide(g, kernels, source, col);
    sgemm('N', 'N', g.group_out, g.wide_pixels, g.rows, 1.f, w, Matrix{col, 'N', g.wide_pixels}, 0.f, stage,
          g.wide_pixels);
  }
  const int64_t p2 = g.span[2], ys1 = g.y_s[1], ys2 = g.y_s[2], run = g.out[2];
  // No activation, beta 0 and unit-stride rows (the common case): the block kernel, with the
  // same float operations as finish(), so every layout gets the same bits.
  const bool plain = g.activation == FDNN_ACTIVATION_NONE && g.beta == 0.f && ys2 == 1;
  for (int64_t k = 0; k < g.group_out; ++k) {
    const float b = bias != nullptr ? bias[k * g.bias_stride] : 0.f;
    const float* from = stage + k * g.wide_pixels;
    float* to = y + k * g.y_k;
    if (plain) {
      kernels.scale(from, p2, to, ys1, g.out[1], run, g.alpha, b);
      continue;
    }
    for (int64_t o1 = 0; o1 < g.out[1]; ++o1, from += p2, to += ys1)
      for (int64_t o2 = 0; o2 < run; ++o2) to[o2 * ys2] = finish(g, from[o2], b, to[o2 * ys2]);
  }
}

// One (image, group) through the workspace: the product, then y = alpha * act(product +
// bias) + beta * y through y's strides (beta == 0: y is not read).
void run_staged(const Im2colGemm& g, Matrix w, Matrix x, const float* bias, float* y,
                float* stage) {
  product(g, w, x, stage, g.pixels);
  const float* from = stage;
  for_each_output(g, y, [&](int64_t k, float& v) {
    const float b = bias != nullptr ? bias[k * g.bias_stride] : 0.f;
    v = finish(g, *from++, b, v);
  });
}

// Whether the AVX2 kernels (block kernels, padded taps) run: on x86-64 with AVX2 and FMA
// where oneDNN's effective instruction set (the CPU's, capped by ONEDNN_MAX_CPU_ISA or
// dnnl_set_max_cpu_isa) includes AVX2. Following oneDNN's cap keeps the baseline kernels and
// sgemm reachable, and tested, on any machine.
bool avx2_kernels_usable() {
#ifdef FDNN_ONEDNN_HAS_AVX2_KERNELS
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2 && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace

const char* im2col_gemm_refusal(const FDNN_Conv_Plan_Create_Args& a) {
  if (a.op != FDNN_CONV_FORWARD) return "it computes forward convolutions only";
  if (!(a.x->dtype.code == FDNN_DTYPE_FLOAT && a.x->dtype.bits == 32 && a.x->dtype.lanes == 1))
    return "it computes float32 only";
  switch (a.activation) {
    case FDNN_ACTIVATION_NONE:
    case FDNN_ACTIVATION_RELU:
    case FDNN_ACTIVATION_LEAKY_RELU:
    case FDNN_ACTIVATION_CLIP: return nullptr;
    default: return "it applies no activation but relu, leaky_relu and clip";
  }
}

const char* small_plan_name(const Im2colGemm& g) { return g.taps() ? kTapsPlanName : kSgemmPlanName; }

std::shared_ptr<const Im2colGemm> make_im2col_gemm(const FDNN_Conv_Plan_Create_Args& a) {
  auto g = std::make_shared<Im2colGemm>();
  g->images = a.x->shape[0];
  g->groups = a.groups;
  g->group_in = a.x->shape[1] / a.groups;
  g->group_out = a.w->shape[0] / a.groups;
  place_spatial(a, *g);
  g->x_n = a.x->strides[0];
  g->x_c = a.x->strides[1];
  g->w_k = a.w->strides[0];
  g->w_c = a.w->strides[1];
  g->y_n = a.y->strides[0];
  g->y_k = a.y->strides[1];
  g->has_bias = fdnn_shim::has_tensor(a.bias);
  g->bias_stride = g->has_bias ? a.bias->strides[0] : 0;
  g->rows = g->group_in * g->kernel[0] * g->kernel[1] * g->kernel[2];
  g->pixels = g->out[0] * g->out[1] * g->out[2];
  g->alpha = a.alpha;
  g->beta = a.beta;
  g->activation = a.activation;
  g->activation_alpha = a.activation_alpha;
  g->activation_beta = a.activation_beta;
  g->avx2 = avx2_kernels_usable();
  choose_x_operand(a, *g);
  choose_padded_source(*g);
  place_taps(*g);
  choose_w_operand(*g);
  choose_output(*g);
  place_workspace(*g);
  return g;
}

std::shared_ptr<const Im2colGemm> pack_im2col_gemm(const Im2colGemm& g, const void* w) {
  auto packed = std::make_shared<Im2colGemm>(g);
  const size_t bytes = matrix_bytes(g.groups * g.group_out, g.rows);
  auto* dense = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (dense == nullptr) throw std::bad_alloc();
  packed->packed_w = std::shared_ptr<float>(dense, std::free);
  copy_weights(g, static_cast<const float*>(w), dense);
  packed->w_matrix = false;
  packed->w_ld = g.rows;
  place_workspace(*packed);
  return packed;
}

void run_im2col_gemm(const Im2colGemm& g, void* const pointers[4], char* workspace) {
  const auto* x = static_cast<const float*>(pointers[0]);
  const auto* w = static_cast<const float*>(pointers[1]);
  auto* y = static_cast<float*>(pointers[2]);
  const auto* bias = static_cast<const float*>(pointers[3]);
  if (x == nullptr || y == nullptr || (w == nullptr && !g.packed_w) ||
      (g.has_bias && bias == nullptr))
    fail(FDNN_ERROR_INVALID_ARGUMENT, "a data pointer the plan needs is NULL");
  // The weights as the K x R matrix: packed, the caller's own, or copied into the workspace.
  const float* weights = g.packed_w.get();
  int64_t w_ld = g.rows, w_group = g.group_out * g.rows;
  if (weights == nullptr && g.w_matrix) {
    weights = w;
    w_ld = g.w_ld;
    w_group = g.group_out * g.w_k;
  } else if (weights == nullptr) {
    auto* dense = reinterpret_cast<float*>(workspace + g.w_offset);
    copy_weights(g, w, dense);
    weights = dense;
  }
  const BlockKernels& kernels = block_kernels(g);
  auto* col = reinterpret_cast<float*>(workspace + g.col_offset);
  auto* stage = reinterpret_cast<float*>(workspace + g.stage_offset);
  auto* source = reinterpret_cast<float*>(workspace + g.source_offset);
  for (int64_t n = 0; n < g.images; ++n)
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const float* x_ng = x + n * g.x_n + grp * g.group_in * g.x_c;
      float* y_ng = y + n * g.y_n + grp * g.group_out * g.y_k;
      const float* bias_g = g.has_bias ? bias + grp * g.group_out * g.bias_stride : nullptr;
      const Matrix w_g{weights + grp * w_group, 'N', w_ld};
      Matrix x_g{x_ng, g.x_trans, g.x_ld};
      if (g.wide) {
        pad_source(g, kernels, x_ng, source);
        run_wide(g, kernels, w_g, source, col, bias_g, y_ng, stage);
        continue;
      }
      if (g.im2col && g.padded_source) {
        pad_source(g, kernels, x_ng, source);
        im2col_padded(g, kernels, source, col);
        x_g = Matrix{col, 'N', g.pixels};
      } else if (g.im2col) {
        im2col(g, x_ng, col);
        x_g = Matrix{col, 'N', g.pixels};
      }
      if (g.mode == OutputMode::kStaged)
        run_staged(g, w_g, x_g, bias_g, y_ng, stage);
      else
        run_direct(g, w_g, x_g, bias_g, y_ng);
    }
}

}  // namespace fdnn_onednn
