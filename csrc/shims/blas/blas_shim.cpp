// The CBLAS shim: flux_dnn's ABI on OpenBLAS's GEMM (the scipy-openblas32 wheel's library,
// whose symbols carry a scipy_ prefix).
//
// Every op is lowered to a few large GEMMs over an im2col matrix (see README.md):
//  - "rows" lowering (channels-last): one row per output position of the whole batch,
//    columns (kd, kh, kw, c); one GEMM per group covers N*OD*OH*OW rows.
//  - "cols" lowering (NC[D]HW): per image, one column per output position, rows
//    (c, kd, kh, kw) in the weights' own order; one GEMM per image and group writes y.
// A 1x1, stride-1, unpadded convolution in a matching layout uses x itself as the im2col
// matrix. Depthwise convolutions (one input channel per group) skip GEMM: direct loops
// vectorised over the output's innermost contiguous dim (algo 4). Forward 2-D 3x3 stride-1
// convolutions may run as Winograd F(2x2, 3x3): transforms and 16 GEMMs (algo 5). float64 and
// float32 run natively (dgemm, sgemm; on AVX-512 CPUs thin float32 GEMMs run on the shim's own
// kernel, sgemm_avx512.inc); float16 and bfloat16 are converted to float32 while gathered
// into the workspace (or, for a 1x1 layer's x, while that kernel packs it), computed in
// float32 and rounded once into the output. What a call needs lives in the caller's workspace (the direct depthwise
// kernels' staging excepted: per-thread heap buffers, README.md): a plan holds no mutable
// state and may execute on several threads at once.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "fp16.hpp"
#include "shim_common.hpp"

using fdnn_shim::fail;

// Function multiversioning of the hot loops: on x86-64 with GCC or Clang, a second copy
// compiled for AVX2+FMA is chosen at run time (a platform check; the library itself stays
// baseline x86-64). Elsewhere (aarch64, other compilers) only the plain copy exists.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FDNN_X86_CLONES 1
#include <immintrin.h>
#else
#define FDNN_X86_CLONES 0
#endif

namespace {

using namespace fdnn_shim;  // fp16.hpp

// ------------------------------------------------------------------------------------------
// Element types

struct Half {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

inline double widen(double v) { return v; }
inline float widen(float v) { return v; }
inline float widen(Half v) { return half_to_float(v.bits); }
inline float widen(BF16 v) { return bf16_to_float(v.bits); }
inline void store(double* p, double v) { *p = v; }
inline void store(float* p, float v) { *p = v; }
inline void store(Half* p, float v) { p->bits = float_to_half(v); }
inline void store(BF16* p, float v) { p->bits = float_to_bf16(v); }

// Runs of n contiguous elements converted at once: where the im2col, gather and epilogue loops
// meet a unit stride. A 16-bit problem converts every element it reads and writes, so these
// loops, not the GEMM, decided its speed (float16 at a tenth of float32 on 1x1 layers).
// float16 on x86-64 with F16C: VCVTPH2PS (exact) and VCVTPS2PH with round-to-nearest-even,
// bit-identical to fp16.hpp (NaN quieted with its top payload bits, overflow to infinity,
// subnormals rounded; they ignore MXCSR's DAZ/FTZ for these operands: a float32 denormal
// rounds to a signed zero either way). Elsewhere the portable scalar conversions of fp16.hpp.
#if FDNN_X86_CLONES
bool cpu_f16c() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return ok;
}

// Whether this CPU runs the AVX-512 code: the float32 GEMM kernel (own_gemm), the
// channels-last depthwise forward, the bfloat16 conversions below (checked once).
bool cpu_avx512() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return ok;
}

// float32 to bfloat16, 16 lanes at a time: fp16.hpp's float_to_bf16 (round to nearest even,
// NaN quieted with its top payload bits kept) as vector integer operations, so bit-identical
// by construction. The compiler's own loop over float_to_bf16 ran 4 lanes wide, and rounding
// a channels-last depthwise layer's output took half of its time.
__attribute__((target("avx512f"))) void narrow_bf16_avx512(const float* s, BF16* d, int64_t n) {
  typedef uint32_t U32x16 __attribute__((vector_size(64)));
  typedef uint16_t U16x16 __attribute__((vector_size(32)));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    U32x16 x;
    std::memcpy(&x, s + i, sizeof x);
    const U32x16 rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const U32x16 quiet = (x >> 16) | 0x0040u;
    const U32x16 out = (x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
    const U16x16 bits = __builtin_convertvector(out, U16x16);
    std::memcpy(static_cast<void*>(d + i), &bits, sizeof bits);
  }
  for (; i < n; ++i) d[i].bits = float_to_bf16(s[i]);
}

// bfloat16 to float32, 16 lanes at a time (exact: the bits moved up by 16).
__attribute__((target("avx512f"))) void widen_bf16_avx512(const BF16* s, float* d, int64_t n) {
  typedef uint16_t U16x16 __attribute__((vector_size(32)));
  typedef uint32_t U32x16 __attribute__((vector_size(64)));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    U16x16 bits;
    std::memcpy(&bits, static_cast<const void*>(s + i), sizeof bits);
    const U32x16 wide = __builtin_convertvector(bits, U32x16) << 16;
    std::memcpy(d + i, &wide, sizeof wide);
  }
  for (; i < n; ++i) d[i] = bf16_to_float(s[i].bits);
}

// A run's last 4-7 elements convert as one 4-lane block (rows of 7, 14 and 28, the ResNet
// layers' widths, would otherwise convert up to half of their elements one by one in
// software); the last 0-3, and runs under 4 (a 3-channel stem's im2col), stay scalar: a
// padded 8-lane block costs more than three scalar conversions there (measured: the float16
// stem, channels-last, at 0.45x its float32 with padded blocks, 0.75x before them).
__attribute__((target("avx,f16c"))) void widen_f16c(const Half* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  if (i + 4 <= n) {
    _mm_storeu_ps(d + i, _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + i))));
    i += 4;
  }
  for (; i < n; ++i) d[i] = half_to_float(s[i].bits);
}

__attribute__((target("avx,f16c"))) void narrow_f16c(const float* s, Half* d, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), kRound));
  if (i + 4 <= n) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(d + i), _mm_cvtps_ph(_mm_loadu_ps(s + i), kRound));
    i += 4;
  }
  for (; i < n; ++i) d[i].bits = float_to_half(s[i]);
}
#endif

template <class T>
void widen_run(const T* s, T* d, int64_t n) {
  std::memcpy(static_cast<void*>(d), s, static_cast<size_t>(n) * sizeof(T));
}
void widen_run(const Half* s, float* d, int64_t n) {
#if FDNN_X86_CLONES
  if (cpu_f16c()) return widen_f16c(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i] = half_to_float(s[i].bits);
}
void widen_run(const BF16* s, float* d, int64_t n) {
#if FDNN_X86_CLONES
  if (cpu_avx512()) return widen_bf16_avx512(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i].bits);
}

template <class T>
void narrow_run(const T* s, T* d, int64_t n) {
  std::memcpy(static_cast<void*>(d), s, static_cast<size_t>(n) * sizeof(T));
}
void narrow_run(const float* s, Half* d, int64_t n) {
#if FDNN_X86_CLONES
  if (cpu_f16c()) return narrow_f16c(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i].bits = float_to_half(s[i]);
}
void narrow_run(const float* s, BF16* d, int64_t n) {
#if FDNN_X86_CLONES
  if (cpu_avx512()) return narrow_bf16_avx512(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i].bits = float_to_bf16(s[i]);
}

// n elements `step` apart (a strided convolution's im2col row) into d. A 16-bit source with a
// short step has its whole span widened as one run (vector conversions, a thread's buffer),
// then every step-th element taken: the float16 stem (7x7, stride 2) converted its elements
// one by one at 0.72x its float32 time.
template <class S, class T>
void widen_strided(const S* s, int64_t step, T* d, int64_t n) {
  if constexpr (!std::is_same<S, T>::value) {
    if (step <= 4 && n > 1) {
      thread_local std::vector<T> span;
      const int64_t len = (n - 1) * step + 1;
      if (static_cast<int64_t>(span.size()) < len) span.resize(static_cast<size_t>(len));
      widen_run(s, span.data(), len);
      for (int64_t t = 0; t < n; ++t) d[t] = span[t * step];
      return;
    }
  }
  for (int64_t t = 0; t < n; ++t) d[t] = widen(s[t * step]);
}

// d[i] = round(v[i] + beta * d[i]) over a run (beta != 0), in blocks widened at once.
template <class S, class T>
void blend_run(const T* v, T beta, S* d, int64_t n) {
  T old[256];
  for (int64_t i0 = 0; i0 < n; i0 += 256) {
    const int64_t len = std::min<int64_t>(256, n - i0);
    widen_run(d + i0, old, len);
    for (int64_t i = 0; i < len; ++i) old[i] = v[i0 + i] + beta * old[i];
    narrow_run(old, d + i0, len);
  }
}

enum Dt { kF64, kF32, kF16, kBF16, kNone };

Dt dt_of(FDNN_DLDataType t) {
  if (t.lanes != 1) return kNone;
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 64) return kF64;
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 32) return kF32;
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 16) return kF16;
  if (t.code == FDNN_DTYPE_BFLOAT && t.bits == 16) return kBF16;
  return kNone;
}

// ------------------------------------------------------------------------------------------
// GEMM (row-major) and threads

inline CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

#if FDNN_X86_CLONES
#include "sgemm_avx512.inc"
#endif

// Whether float32 GEMMs may run on the shim's AVX-512 kernel (sgemm_avx512.inc), and so a
// 16-bit plan may hand it x as it is (it widens x as it packs): on x86-64 CPUs with AVX-512
// (cpu_avx512), unless FLUX_DNN_BLAS_GEMM=openblas (read once) keeps every GEMM on OpenBLAS.
// Elsewhere OpenBLAS's own kernels serve (README.md, "GEMM").
bool own_gemm() {
#if FDNN_X86_CLONES
  static const bool on = [] {
    const char* env = std::getenv("FLUX_DNN_BLAS_GEMM");
    return !(env && std::strcmp(env, "openblas") == 0) && cpu_avx512();
  }();
  return on;
#else
  return false;
#endif
}

#if FDNN_X86_CLONES
// The shapes the kernel takes (measured on one Xeon core against OpenBLAS 0.3.34's SkylakeX
// kernels, README.md "GEMM"): thin ones, which it is written for, a side of C of at most 512
// (a square 2048 GEMM, which no forward layer makes, runs at 0.8x OpenBLAS); both sides at
// least one vector wide (OpenBLAS's small-matrix path wins on thinner ones); a k of at least
// 8; and the wide operand (the one streamed strip by strip: B where m <= n, else A) not
// transposed. A transposed operand is gathered one element at a time into its packing, which
// the thin side, packed once per k block, can afford and the streamed side cannot (64 x 512
// x 512 with B transposed: 0.77x OpenBLAS).
bool own_sgemm_takes(bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  const bool wide_transposed = m <= n ? tb : ta;
  return own_gemm() && std::min(m, n) >= 16 && std::min(m, n) <= 512 && k >= 8 && !wide_transposed;
}
#endif

inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#if FDNN_X86_CLONES
  if (own_sgemm_takes(ta, tb, m, n, k)) return sg512::sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
  scipy_cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<blasint>(m),
                    static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
                    static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                    static_cast<blasint>(ldc));
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                 double* c, int64_t ldc) {
  scipy_cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<blasint>(m),
                    static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
                    static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                    static_cast<blasint>(ldc));
}
// A float32 GEMM with a 16-bit operand (x itself, in a 16-bit plan with x_direct): only the
// AVX-512 kernel reads one, widening it as it packs, whatever the shape; plans take that path
// only where own_gemm() (make_plan), so elsewhere this is never reached.
template <class EA, class EB>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const EA* a, int64_t lda,
          const EB* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#if FDNN_X86_CLONES
  sg512::sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b,
      (void)ldb, (void)beta, (void)c, (void)ldc;
  fail(FDNN_ERROR_INTERNAL, "a 16-bit GEMM operand without the AVX-512 kernel");
#endif
}

// Threads: the OpenMP team owns them (README.md, "Threads"). Its size is the calling thread's
// omp_get_max_threads(), which OMP_NUM_THREADS and torch.set_num_threads set (one OpenMP
// runtime in the process), as in the oneDNN shim; one in a forked child (GNU libgomp's team
// does not survive fork). OpenBLAS's own pool is kept at one thread, so every GEMM runs on the
// team thread that calls it: the shim splits each GEMM into panels across the team.
int team_threads() { return fdnn_shim::in_forked_child() ? 1 : omp_get_max_threads(); }

// OpenBLAS computes on its caller's thread only. Checked at every call (a global read) because
// anything else in the process may have raised it; a pthreads OpenBLAS with more threads would
// serialise concurrent calls on its lock and spin its pool against the OpenMP team.
void openblas_on_calling_thread() {
  if (scipy_openblas_get_num_threads() != 1) scipy_openblas_set_num_threads(1);
}

#if FDNN_X86_CLONES
// Whether this CPU runs the AVX2+FMA copies (checked once).
bool cpu_avx2_fma() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return ok;
}
#endif

// Threads for a copy loop of `work` elements: the team, or one for small loops.
int threads_for(int64_t work) {
  if (work < (1 << 15)) return 1;
  return team_threads();
}

// A GEMM C(m x n) = op(A)(m x k) * op(B)(k x n) as panels: a power of two of them along the
// larger of m and n, each at least kMinPanel wide (64 at most). The split is a function of the
// shape only, never of the team size: each element of C comes from the same GEMM call
// (same kernel, same blocking of k) whatever the number of threads, so results are identical
// for 1 and N threads. Splitting m or n repacks the other operand once per panel; panels of
// 192 or more lose under 10% against one call (measured single-threaded, sgemm and dgemm).
constexpr int64_t kMinPanel = 192;
constexpr int64_t kMinPanelFlops = int64_t{4} << 20;  // a panel worth a team's fork and join

struct Panels {
  bool along_n = true;
  int64_t count = 1;
};

Panels panels_of(int64_t m, int64_t n, int64_t k) {
  Panels p;
  p.along_n = n >= m;
  const int64_t dim = p.along_n ? n : m;
  const int64_t other = p.along_n ? m : n;
  while (p.count < 64 && dim / (p.count * 2) >= kMinPanel &&
         2 * other * k * (dim / (p.count * 2)) >= kMinPanelFlops)
    p.count *= 2;
  return p;
}

// Where panel i of sp starts along a dim of C: on a multiple of 64 columns or 6 rows (the
// AVX-512 kernel's register tile, sgemm_avx512.inc), so that only the last panel has a partial
// tile (3136 columns in 16 panels of 196 each ended in a 4-column tile).
int64_t panel_edge(const Panels& sp, int64_t dim, int64_t i) {
  if (i >= sp.count) return dim;
  const int64_t unit = sp.along_n ? 64 : 6;
  return dim * i / sp.count / unit * unit;
}

// Row-major op(X) element (i, j) address for a transposed or plain operand.
template <class T>
const T* at(const T* a, bool t, int64_t ld, int64_t i, int64_t j) {
  return t ? a + j * ld + i : a + i * ld + j;
}

// Panel i of sp of a GEMM: one gemm() call on the calling thread.
template <class T, class TA, class TB>
void gemm_panel(const Panels& sp, int64_t i, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                T alpha, const TA* a, int64_t lda, const TB* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const int64_t dim = sp.along_n ? n : m;
  const int64_t d0 = panel_edge(sp, dim, i), d1 = panel_edge(sp, dim, i + 1);
  if (sp.along_n)
    gemm(ta, tb, m, d1 - d0, k, alpha, a, lda, at(b, tb, ldb, 0, d0), ldb, beta, c + d0, ldc);
  else
    gemm(ta, tb, d1 - d0, n, k, alpha, at(a, ta, lda, d0, 0), lda, b, ldb, beta, c + d0 * ldc, ldc);
}

// gemm() split into panels (panels_of) run on the OpenMP team, each on its thread; the panels
// write disjoint parts of C. A and B are of the compute type T, or one of them 16-bit (x in a
// 16-bit 1x1 plan: the AVX-512 kernel widens it).
template <class T, class TA, class TB>
void par_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const TA* a,
              int64_t lda, const TB* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const Panels sp = panels_of(m, n, k);
  const int nt = static_cast<int>(std::min<int64_t>(sp.count, team_threads()));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
  for (int64_t i = 0; i < sp.count; ++i) gemm_panel(sp, i, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// ------------------------------------------------------------------------------------------
// The plan

enum Lowering : int64_t {
  kHeuristic = 0,
  kRows = 1,  // im2col rows over the whole batch (channels-last GEMM)
  kCols = 2,       // im2col columns per image (NC[D]HW GEMM, reads/writes the caller's arrays)
  kColsBatch = 3,  // im2col columns over the batch (one NC[D]HW GEMM for many images)
  kDepthwise = 4,  // direct loops, one input channel per group (no GEMM)
  kWinograd = 5,   // Winograd F(2x2, 3x3): forward 2-D 3x3, stride 1, dilation 1 (winograd.inc)
};

struct Plan {
  int32_t op = FDNN_CONV_FORWARD;
  Dt dt = kF32;
  Lowering lowering = kRows;  // kRows or kCols (kColsBatch is kCols spanning images)
  bool span_images = false;   // cols chunks may span images (no per-image direct views)
  bool depthwise = false;     // direct depthwise loops (C/groups == 1)
  bool dw_cl = false;         // depthwise: vectorised over channels (channels-last y)
  bool winograd = false;      // Winograd F(2x2, 3x3) (kWinograd)
  bool wg_cl = false;         // winograd: channels-last flavour (vectors over channels)
  int64_t tiles_h = 0, tiles_w = 0, tiles = 0;  // winograd: 2x2 output tiles of one image
  // Geometry, as 3-D with unit leading dims for lower ranks.
  int64_t N = 1, C = 1, K = 1, G = 1, Cg = 1, Kg = 1;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, ks[3] = {1, 1, 1};
  int64_t st[3] = {1, 1, 1}, dil[3] = {1, 1, 1}, lo[3] = {0, 0, 0};
  int64_t xs[5] = {}, ws[5] = {}, ys[5] = {}, bs = 0;  // element strides
  bool has_bias = false;
  int64_t kvol = 1, R = 1, OSP = 1, ISP = 1, M = 1;
  float alpha = 1.f, beta = 0.f;
  int32_t act = FDNN_ACTIVATION_NONE;
  float act_a = 0.f, act_b = 0.f;
  // Zero-copy views (the caller's arrays used as GEMM operands).
  bool x_direct = false;  // x is the im2col matrix (forward, backward-weight)
  bool dx_gemm = false;   // backward-data GEMM writes dx itself (pointwise)
  bool y_direct = false;  // y is the GEMM output (forward) / dy the GEMM input (backward)
  bool w_direct = false;  // w is the weight operand / dw the GEMM output
  bool w_runs = false;    // each k's weights are one contiguous run in the lowering's order
  int64_t ldx = 0, ldy = 0, ldw = 0;
  int64_t chunk = 1;  // rows: output positions of the batch; cols: of one image
  size_t off_w = 0, off_col = 0, off_y = 0, off_acc = 0, off_bias = 0, workspace = 0;
  size_t off_v = 0, off_m = 0;  // winograd: transformed inputs, GEMM outputs (per chunk)
  int64_t algo_id = kRows;
  std::string name;
  std::shared_ptr<std::vector<unsigned char>> packed_w;  // Conv_Plan_Pack_Weights
};

size_t align64(size_t n) { return (n + 63) / 64 * 64; }
size_t elem_size(Dt dt) { return dt == kF64 ? 8 : 4; }  // of the compute type
size_t storage_size(Dt dt) { return dt == kF64 ? 8 : dt == kF32 ? 4 : 2; }  // of the caller's

// Whether dims `order` (outer to inner) of an array form one compact block whose innermost
// stride is `unit` (dims of size 1 may have any stride).
bool compact(const int64_t* shape, const int64_t* strides, std::initializer_list<int> order,
             int64_t unit) {
  int64_t expect = unit;
  for (auto it = order.end(); it != order.begin();) {
    --it;
    if (shape[*it] == 1) continue;
    if (strides[*it] != expect) return false;
    expect *= shape[*it];
  }
  return true;
}

// A 5-D (N, C, D, H, W) view of an (n+2)-D array.
void pad5(const FDNN_DLTensor* t, int rank, int64_t shape[5], int64_t strides[5]) {
  shape[0] = t->shape[0];
  shape[1] = t->shape[1];
  strides[0] = t->strides[0];
  strides[1] = t->strides[1];
  for (int i = 0; i < 3; ++i) {
    const int j = i - (3 - rank);
    shape[2 + i] = j >= 0 ? t->shape[2 + j] : 1;
    strides[2 + i] = j >= 0 ? t->strides[2 + j] : 0;
  }
}

// The matrix view of an activation array (N, Ch, *sp) in a lowering: rows lowering wants
// (n, sp) flattened with one stride `ld` and channels at stride 1; cols lowering wants the
// spatial dims of an image flattened at stride 1 and channels at stride `ld`.
bool activation_view(const int64_t sh[5], const int64_t s[5], Lowering l, int64_t& ld) {
  const int64_t sp = sh[2] * sh[3] * sh[4];
  if (l == kCols) {
    if (!compact(sh, s, {2, 3, 4}, 1)) return false;
    ld = sh[1] == 1 ? sp : s[1];
    return ld >= sp && ld <= INT_MAX;
  }
  if (sh[1] != 1 && s[1] != 1) return false;
  ld = sh[1];
  for (int d : {4, 3, 2, 0})
    if (sh[d] != 1) {
      ld = s[d];
      break;
    }
  return ld >= sh[1] && ld <= INT_MAX && compact(sh, s, {0, 2, 3, 4}, ld);
}

// ------------------------------------------------------------------------------------------
// Problem checks (what the ABI promises callers is verified before any work)

fdnn_shim::Capabilities capabilities(int32_t op, FDNN_DLDataType dtype);

// Whether Winograd F(2x2, 3x3) computes a: FORWARD, 2-D, a 3x3 kernel, stride 1, dilation 1.
bool winograd_computes(const FDNN_Conv_Plan_Create_Args& a) {
  if (a.op != FDNN_CONV_FORWARD || a.spatial_rank != 2) return false;
  for (int i = 0; i < 2; ++i)
    if (a.w->shape[2 + i] != 3 || a.stride[i] != 1 || a.dilation[i] != 1) return false;
  return true;
}

// The shared rules (fdnn_shim::check_conv_problem), what this shim reports it computes
// (fdnn_shim::check_covered), then what only OpenBLAS asks.
void check_problem(const FDNN_Conv_Plan_Create_Args& a) {
  fdnn_shim::check_conv_problem(a, FDNN_DEVICE_CPU, /*num_devices=*/1);
  fdnn_shim::check_covered(a, capabilities(a.op, a.x->dtype), "the OpenBLAS shim");
  // OpenBLAS (the 32-bit-index build) takes its GEMM sizes and leading dimensions in int.
  fdnn_shim::check_vendor_int_range(a, INT32_MAX, "OpenBLAS");
  fdnn_shim::check_compute_type_served(a, "the OpenBLAS shim");
  if (a.algo_policy == FDNN_ALGO_GIVEN && (a.algo_id < 0 || a.algo_id > 5))
    fdnn_shim::fail_unknown_algo(a, "the OpenBLAS shim",
                                 "its algorithms are 0 heuristic, 1 rows, 2 cols per image, 3 "
                                 "cols over the batch, 4 direct depthwise, 5 Winograd F(2x2, 3x3)");
  if (a.algo_policy == FDNN_ALGO_GIVEN && a.algo_id == 4 && a.w->shape[1] != 1)
    fdnn_shim::fail_algo_cannot_compute(a, "the OpenBLAS shim",
                                        "4 (direct depthwise) needs one input channel per group");
  if (a.algo_policy == FDNN_ALGO_GIVEN && a.algo_id == kWinograd && !winograd_computes(a))
    fdnn_shim::fail_algo_cannot_compute(a, "the OpenBLAS shim",
                                        "5 (Winograd F(2x2, 3x3)) computes FORWARD 2-D 3x3 "
                                        "convolutions of stride 1 and dilation 1 only");
}

// Whether the heuristic takes Winograd (3x3 stride 1: most of a ResNet's or VGG's work): 16
// multiplies per 4 outputs instead of 36, in 16 GEMMs whose inner dimension is C/g. Measured
// single-threaded against im2col on this shim (3x3 layers of 16-512 channels, N = 1, 4, 16,
// float32 and float64): the NC[D]HW flavour 1.3-2.3x from 16 channels a side; the
// channels-last one 1.1-1.7x from 64 channels, 0.5-0.7x under 32 (its vectors run along the
// channels); both lose under about 48 tiles, where transforming the weights (16 x K x C/g
// values each call) outweighs the GEMMs (3x3 512 @7, N=1: 16 tiles, 0.5-0.7x).
// Winograd's flavour for a: channels-last when both activations have unit channel stride (or
// one channel), and for narrow images in any layout: the NC[D]HW flavour's vectors run along a
// tile row, too short under 8 tiles (3x3 512 @7, N=4: 10.8 ms against ~7 in the other one).
bool winograd_channels_last(const FDNN_Conv_Plan_Create_Args& a) {
  const bool unit = (a.x->shape[1] == 1 || a.x->strides[1] == 1) && (a.y->shape[1] == 1 || a.y->strides[1] == 1);
  return unit || (a.y->shape[3] + 1) / 2 < 8;
}

bool winograd_pays(const FDNN_Conv_Plan_Create_Args& a) {
  if (!winograd_computes(a)) return false;
  const int64_t cg = a.w->shape[1], kg = a.w->shape[0] / a.groups;
  const int64_t tiles = a.y->shape[0] * ((a.y->shape[2] + 1) / 2) * ((a.y->shape[3] + 1) / 2);
  const int64_t least = winograd_channels_last(a) ? 64 : 16;
  return cg >= least && kg >= least && tiles >= 48;
}

// Heuristic lowering: channels-last output (channel stride 1) -> rows over the batch; else
// cols, per image (GEMMs on the caller's arrays) for pointwise convolutions, one image or
// large images, and over the batch otherwise (few large GEMMs beat many small ones, at the
// cost of copying y once).
Lowering heuristic_lowering(const FDNN_Conv_Plan_Create_Args& a) {
  const FDNN_DLTensor* y = a.y;
  // One input channel per group: a GEMM per group is tiny; direct loops win by far.
  if (a.groups > 1 && a.w->shape[1] == 1) return kDepthwise;
  if (winograd_pays(a)) return kWinograd;
  // Backward-weight of one image: dW = dY^T * Col (rows) runs OpenBLAS's transposed-A kernel
  // with a short inner dim, far slower than dY * Col^T (cols) even after gathering a
  // channels-last dy and scattering dW.
  if (a.op == FDNN_CONV_BACKWARD_WEIGHT && y->shape[0] == 1 && dt_of(a.x->dtype) == kF64) {
    int64_t osp = 1;
    for (int i = 2; i < y->ndim; ++i) osp *= y->shape[i];
    if (osp <= 256) return kCols;
  }
  if (y->shape[1] > 1 && y->strides[1] == 1) return kRows;
  int64_t osp = 1;
  bool pointwise = true;
  for (int i = 2; i < y->ndim; ++i) {
    osp *= y->shape[i];
    pointwise = pointwise && a.w->shape[i] == 1 && a.stride[i - 2] == 1 && a.padding_lo[i - 2] == 0 &&
                a.padding_hi[i - 2] == 0;
  }
  if (osp == 1) return kRows;
  if (pointwise || y->shape[0] == 1 || osp >= 4096) return kCols;
  return kColsBatch;
}

const char* dt_label(Dt dt) {
  return dt == kF64 ? "float64" : dt == kF32 ? "float32" : dt == kF16 ? "float16->float32"
                                                                       : "bfloat16->float32";
}

// The Winograd part of make_plan: flavour, tiles, workspace. Fixed: U (16 x K x C/g: the
// transformed weights) and alpha*bias; per chunk of tiles: V (16 x C/g per tile) and M
// (16 x K/g per tile), chunks of about 8 MiB and at least 256 tiles (the GEMMs' wide
// dimension), fewer to fit workspace_limit, equal in size (as the im2col chunks).
void plan_winograd(const FDNN_Conv_Plan_Create_Args& a, Plan& p) {
  const size_t es = elem_size(p.dt);
  p.tiles_h = (p.out[1] + 1) / 2;
  p.tiles_w = (p.out[2] + 1) / 2;
  p.wg_cl = winograd_channels_last(a);
  p.tiles = p.tiles_h * p.tiles_w;
  size_t fixed = align64(static_cast<size_t>(16 * p.K * p.Cg) * es);
  p.off_w = 0;
  p.off_bias = fixed;
  if (p.has_bias) fixed += align64(static_cast<size_t>(p.K) * es);
  const int64_t total = p.N * p.tiles;
  const size_t per_tile = static_cast<size_t>(16 * (p.Cg + p.Kg)) * es;
  auto bytes_for = [&](int64_t c) {
    return fixed + align64(static_cast<size_t>(16 * p.Cg * c) * es) + align64(static_cast<size_t>(16 * p.Kg * c) * es);
  };
  int64_t chunk = std::min<int64_t>(total, std::max<int64_t>(256, static_cast<int64_t>((size_t{8} << 20) / per_tile)));
  if (a.workspace_limit != SIZE_MAX && bytes_for(chunk) > a.workspace_limit) {
    int64_t fit = a.workspace_limit > fixed + 128 ? static_cast<int64_t>((a.workspace_limit - fixed - 128) / per_tile) : 0;
    while (fit > 0 && bytes_for(fit) > a.workspace_limit) --fit;
    chunk = std::min(chunk, std::max<int64_t>(fit, 1));  // 1: the least; plan_create checks
  }
  // OpenBLAS's int dimensions: the GEMMs' operands span 16 x C/g x chunk (V) per xi.
  chunk = std::min<int64_t>(chunk, INT_MAX / std::max<int64_t>(1, std::max(p.Cg, p.Kg)));
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t pieces = (total + chunk - 1) / chunk;
  p.chunk = (total + pieces - 1) / pieces;
  p.off_v = fixed;
  p.off_m = p.off_v + align64(static_cast<size_t>(16 * p.Cg * p.chunk) * es);
  p.workspace = p.off_m + align64(static_cast<size_t>(16 * p.Kg * p.chunk) * es);
  p.name = std::string("OpenBLAS Winograd F(2x2, 3x3) (") + (p.wg_cl ? "channels-last" : "NC[D]HW") +
           "), " + dt_label(p.dt);
}

// The plan of lowering l, its buffers chunked to fit workspace_limit where they can: its
// workspace may still exceed the limit (fixed parts, or one output position, too large), which
// plan_create checks.
Plan make_plan(const FDNN_Conv_Plan_Create_Args& a, Lowering l) {
  Plan p;
  p.op = a.op;
  p.dt = dt_of(a.x->dtype);
  p.algo_id = l;
  p.span_images = l == kColsBatch;
  p.depthwise = l == kDepthwise;
  p.winograd = l == kWinograd;
  if (l == kColsBatch || l == kDepthwise || l == kWinograd) l = kCols;
  p.lowering = l;
  const int rank = a.spatial_rank;
  int64_t xsh[5], wsh[5], ysh[5];
  pad5(a.x, rank, xsh, p.xs);
  pad5(a.w, rank, wsh, p.ws);
  pad5(a.y, rank, ysh, p.ys);
  p.N = xsh[0];
  p.C = xsh[1];
  p.K = wsh[0];
  p.G = a.groups;
  p.Cg = p.C / p.G;
  p.Kg = p.K / p.G;
  for (int i = 0; i < 3; ++i) {
    const int j = i - (3 - rank);
    p.in[i] = xsh[2 + i];
    p.out[i] = ysh[2 + i];
    p.ks[i] = wsh[2 + i];
    p.st[i] = j >= 0 ? a.stride[j] : 1;
    p.dil[i] = j >= 0 ? a.dilation[j] : 1;
    p.lo[i] = j >= 0 ? a.padding_lo[j] : 0;
  }
  p.has_bias = fdnn_shim::has_tensor(a.bias) && a.op != FDNN_CONV_BACKWARD_DATA;
  p.bs = p.has_bias ? a.bias->strides[0] : 0;
  p.kvol = p.ks[0] * p.ks[1] * p.ks[2];
  p.R = p.Cg * p.kvol;
  p.OSP = p.out[0] * p.out[1] * p.out[2];
  p.ISP = p.in[0] * p.in[1] * p.in[2];
  p.M = p.N * p.OSP;
  p.alpha = a.alpha;
  p.beta = a.beta;
  p.act = a.activation;
  p.act_a = a.activation_alpha;
  p.act_b = a.activation_beta;
  if (p.R > INT_MAX || p.K > INT_MAX || p.OSP > INT_MAX)
    fail(FDNN_ERROR_UNSUPPORTED, "a GEMM dimension exceeds OpenBLAS's 32-bit indices: %s",
         fdnn_shim::describe_problem(a).c_str());

  const bool native = p.dt == kF64 || p.dt == kF32;
  if (p.depthwise) {
    // Direct loops: weights widened to (kvol, K) and alpha*bias (forward), or the channels-last
    // backward-weight accumulator (kvol, K); no im2col.
    const size_t es = elem_size(p.dt);
    // Vectorise over channels when y is channels-last (channel stride below the W stride).
    p.dw_cl = p.K > 1 && (p.ys[1] == 1 || (p.out[2] > 1 && std::llabs(p.ys[1]) < std::llabs(p.ys[4])));
    p.off_w = 0;
    size_t off = align64(static_cast<size_t>(p.K * p.kvol) * es);
    p.off_bias = off;
    if (p.has_bias && a.op == FDNN_CONV_FORWARD) off += align64(static_cast<size_t>(p.K) * es);
    p.off_acc = off;
    if (a.op == FDNN_CONV_BACKWARD_WEIGHT && p.dw_cl) off += align64(static_cast<size_t>(p.K * p.kvol) * es);
    p.off_col = p.off_y = off;
    p.workspace = off;
    p.w_direct = false;
    p.chunk = p.M;
    p.name = std::string("OpenBLAS direct depthwise (") + (p.dw_cl ? "channels-last" : "NC[D]HW") +
             "), " + dt_label(p.dt);
    return p;
  }
  if (p.winograd) {
    plan_winograd(a, p);
    return p;
  }
  bool pointwise = true;
  for (int i = 0; i < 3; ++i)
    pointwise = pointwise && p.ks[i] == 1 && p.st[i] == 1 && p.lo[i] == 0 && p.in[i] == p.out[i];
  int64_t ldx = 0, ldy = 0;
  const bool x_view = native && !p.span_images && activation_view(xsh, p.xs, l, ldx);
  const bool y_view = native && !p.span_images && activation_view(ysh, p.ys, l, ldy);
  p.ldx = ldx;
  p.ldy = ldy;
  if (l == kCols)
    p.w_runs = compact(wsh, p.ws, {1, 2, 3, 4}, 1);
  else
    p.w_runs = compact(wsh, p.ws, {2, 3, 4, 1}, 1);
  p.w_direct = native && p.w_runs;
  p.ldw = p.K == 1 ? p.R : p.ws[0];
  if (p.ldw < p.R || p.ldw > INT_MAX) p.w_direct = false;
  if (!p.w_direct) p.ldw = p.R;
  // A 16-bit forward pointwise convolution hands x itself to the AVX-512 kernel, which widens
  // it as it packs (own_gemm): a widened copy of x cost as much as the GEMM (float16
  // and bfloat16 1x1 layers at 0.65-0.8x their float32).
  const bool x_view_16 = !native && a.op == FDNN_CONV_FORWARD && own_gemm() &&
                         !p.span_images && activation_view(xsh, p.xs, l, p.ldx);
  switch (a.op) {
    case FDNN_CONV_FORWARD:
      p.x_direct = pointwise && (x_view || x_view_16);
      p.y_direct = y_view && !(p.act != FDNN_ACTIVATION_NONE && p.beta != 0.f);
      break;
    case FDNN_CONV_BACKWARD_DATA:
      p.dx_gemm = pointwise && x_view;
      p.y_direct = y_view;
      break;
    case FDNN_CONV_BACKWARD_WEIGHT:
      p.x_direct = pointwise && x_view;
      p.y_direct = y_view;
      break;
  }

  // Workspace: fixed parts, then chunked buffers per output position.
  const size_t es = elem_size(p.dt);
  const bool need_col = a.op == FDNN_CONV_BACKWARD_DATA ? !p.dx_gemm : !p.x_direct;
  const bool need_y = !p.y_direct;
  const bool need_acc = a.op == FDNN_CONV_BACKWARD_DATA && !p.dx_gemm && !native;
  size_t fixed = 0;
  p.off_w = fixed;
  if (!p.w_direct) fixed += align64(static_cast<size_t>(p.K * p.R) * es);
  p.off_bias = fixed;
  if (p.has_bias && a.op == FDNN_CONV_FORWARD) fixed += align64(static_cast<size_t>(p.K) * es);
  p.off_acc = fixed;
  if (need_acc) fixed += align64(static_cast<size_t>(p.N * p.C * p.ISP) * es);
  const int64_t per_unit = (need_col ? p.R : 0) + (need_y ? p.Kg : 0);
  const int64_t total = l == kRows || p.span_images ? p.M : p.OSP;
  int64_t chunk = total;
  if (per_unit > 0) {
    // Chunks of about 4 MiB: the im2col buffer is still in cache when the GEMM packs it (96
    // MiB chunks ran 15-30% slower single-threaded; they suited an OpenBLAS pool that paid a
    // wake-up per call, which the team does not). At least 512 output positions, so the
    // weights (repacked by every GEMM call) are amortised over enough columns. Both sizes
    // depend on the problem only, never the team size (see panels_of).
    const size_t preferred_bytes = size_t{4} << 20;
    chunk = std::min<int64_t>(total, std::max<int64_t>(
                                         512, static_cast<int64_t>(preferred_bytes / (per_unit * es))));
    if (a.workspace_limit != SIZE_MAX) {
      auto bytes_for = [&](int64_t c) {
        return fixed + (need_col ? align64(static_cast<size_t>(c * p.R) * es) : 0) +
               (need_y ? align64(static_cast<size_t>(c * p.Kg) * es) : 0);
      };
      if (bytes_for(chunk) > a.workspace_limit) {
        int64_t fit = a.workspace_limit > fixed + 128
                          ? static_cast<int64_t>((a.workspace_limit - fixed - 128) / (per_unit * es))
                          : 0;
        while (fit > 0 && bytes_for(fit) > a.workspace_limit) --fit;
        chunk = std::min(chunk, std::max<int64_t>(fit, 1));  // 1: the least; plan_create checks
      }
    }
    chunk = std::min<int64_t>(chunk, INT_MAX / std::max<int64_t>(1, per_unit));
    chunk = std::max<int64_t>(chunk, 1);
    // Equal chunks: 784 positions as 512 + 272 left the second GEMM too narrow to split into
    // panels (panels_of), so a third of the work ran on one thread (3x3 256 @14, N=4: 1.5x on
    // 2 cores); as 392 + 392 both split. Never larger, so the workspace limit still holds.
    const int64_t pieces = (total + chunk - 1) / chunk;
    chunk = (total + pieces - 1) / pieces;
  }
  p.chunk = chunk;
  size_t off = fixed;
  p.off_col = off;
  if (need_col) off += align64(static_cast<size_t>(chunk * p.R) * es);
  p.off_y = off;
  if (need_y) off += align64(static_cast<size_t>(chunk * p.Kg) * es);
  p.workspace = off;

  p.name = std::string("OpenBLAS ") + (l == kRows           ? "im2col rows GEMM (channels-last)"
                                        : p.span_images ? "im2col cols GEMM (batch)"
                                                        : "im2col cols GEMM (per image)");
  if (p.x_direct || p.dx_gemm) p.name += " pointwise";
  p.name += std::string(", ") + dt_label(p.dt);
  return p;
}

// ------------------------------------------------------------------------------------------
// Execution

template <class T>
void activate(T* v, int64_t n, int32_t act, T a, T b) {
  switch (act) {
    case FDNN_ACTIVATION_NONE: return;
    case FDNN_ACTIVATION_RELU:
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] < T(0) ? T(0) : v[i];
      return;
    case FDNN_ACTIVATION_LEAKY_RELU:
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] >= T(0) ? v[i] : a * v[i];
      return;
    case FDNN_ACTIVATION_CLIP:
      for (int64_t i = 0; i < n; ++i) v[i] = std::min(std::max(v[i], a), b);
      return;
    case FDNN_ACTIVATION_SIGMOID:
      for (int64_t i = 0; i < n; ++i) v[i] = T(1) / (T(1) + std::exp(-v[i]));
      return;
    case FDNN_ACTIVATION_TANH:
      for (int64_t i = 0; i < n; ++i) v[i] = std::tanh(v[i]);
      return;
    case FDNN_ACTIVATION_GELU_TANH: {
      const T c = T(0.79788456080286535587989211986876);  // sqrt(2/pi)
      for (int64_t i = 0; i < n; ++i) {
        const T x = v[i];
        v[i] = T(0.5) * x * (T(1) + std::tanh(c * (x + T(0.044715) * x * x * x)));
      }
      return;
    }
    case FDNN_ACTIVATION_GELU_ERF:
      for (int64_t i = 0; i < n; ++i)
        v[i] = T(0.5) * v[i] * (T(1) + std::erf(v[i] * T(0.70710678118654752440084436210485)));
      return;
    case FDNN_ACTIVATION_SILU:
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] / (T(1) + std::exp(-v[i]));
      return;
  }
}

// Valid output range [o_lo, o_hi) along one dim for kernel offset k: those whose input
// index o*s - lo + k*d lies in [0, n).
inline void valid_range(int64_t n, int64_t out, int64_t s, int64_t lo, int64_t kd, int64_t& o_lo,
                        int64_t& o_hi) {
  const int64_t off = lo - kd;  // input index = o*s - off
  o_lo = off <= 0 ? 0 : (off + s - 1) / s;
  o_hi = n - 1 + off < 0 ? 0 : (n - 1 + off) / s + 1;
  o_hi = std::min(o_hi, out);
  o_lo = std::min(o_lo, o_hi);
}

template <class S, class T>
struct Exec {
  using Src = S;  // the caller's element type
  using Acc = T;  // the compute type
  const Plan& p;
  S* x;
  S* w;
  S* y;
  S* bias;
  char* ws;

  T* buf(size_t off) const { return reinterpret_cast<T*>(ws + off); }

  // alpha's place in the forward epilogue, out = alpha * act(conv + bias) + beta * out.
  // Without an activation it scales the sum, in the GEMM (the bias premultiplied): the same
  // result at no extra pass. With one it scales the activated value (activate_and_scale).
  T alpha_before_act() const {
    return p.act == FDNN_ACTIVATION_NONE ? static_cast<T>(p.alpha) : T(1);
  }

  // act(v), then alpha * act(v) where alpha_before_act left alpha out, over v[0..n).
  void activate_and_scale(T* v, int64_t n) const {
    activate<T>(v, n, p.act, static_cast<T>(p.act_a), static_cast<T>(p.act_b));
    if (p.act == FDNN_ACTIVATION_NONE || p.alpha == 1.f) return;
    const T alpha = static_cast<T>(p.alpha);
    for (int64_t i = 0; i < n; ++i) v[i] *= alpha;
  }

  int64_t spatial_offset(int64_t q, const int64_t* s) const {
    const int64_t ow = q % p.out[2], t = q / p.out[2];
    return (t / p.out[1]) * s[2] + (t % p.out[1]) * s[3] + ow * s[4];
  }

  // Weights as a (K x R) row-major matrix in the lowering's column order.
  const T* weights(int64_t& ldw) const {
    if (p.packed_w) {
      ldw = p.R;
      return reinterpret_cast<const T*>(p.packed_w->data());
    }
    if (p.w_direct) {
      ldw = p.ldw;
      return reinterpret_cast<const T*>(w);
    }
    T* dst = buf(p.off_w);
    pack_weights(w, dst);
    ldw = p.R;
    return dst;
  }

  // r index of (c, kernel offset) in the lowering's column order.
  int64_t r_of(int64_t c, int64_t kidx) const {
    return p.lowering == kCols ? c * p.kvol + kidx : kidx * p.Cg + c;
  }

  void pack_weights(const S* src, T* dst) const {
    const int nt = threads_for(p.K * p.R);
    if (p.w_runs) {  // the packed row k is the source's row k: converted as one run (F16C)
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
      for (int64_t k = 0; k < p.K; ++k) widen_run(src + k * p.ws[0], dst + k * p.R, p.R);
      return;
    }
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t k = 0; k < p.K; ++k)
      for (int64_t c = 0; c < p.Cg; ++c)
        for (int64_t kd = 0; kd < p.ks[0]; ++kd)
          for (int64_t kh = 0; kh < p.ks[1]; ++kh)
            for (int64_t kw = 0; kw < p.ks[2]; ++kw) {
              const int64_t kidx = (kd * p.ks[1] + kh) * p.ks[2] + kw;
              dst[k * p.R + r_of(c, kidx)] =
                  widen(src[k * p.ws[0] + c * p.ws[1] + kd * p.ws[2] + kh * p.ws[3] + kw * p.ws[4]]);
            }
  }

  // --- rows lowering: col (mc x R), row i = output position m0+i of the batch -------------
  void im2col_rows(int64_t m0, int64_t mc, int64_t g, T* col) const {
    const int nt = threads_for(mc * p.R);
    const int64_t* s = p.xs;
    // Channels-last x whose pixels hold exactly this group's channels, dilation 1 along W.
    const bool kw_runs = s[1] == 1 && s[4] == p.Cg && p.dil[2] == 1;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t i = 0; i < mc; ++i) {
      const int64_t m = m0 + i, n = m / p.OSP, q = m % p.OSP;
      const int64_t ow = q % p.out[2], t = q / p.out[2], oh = t % p.out[1], od = t / p.out[1];
      const S* xn = x + n * s[0] + g * p.Cg * s[1];
      T* row = col + i * p.R;
      for (int64_t kd = 0; kd < p.ks[0]; ++kd) {
        const int64_t id = od * p.st[0] - p.lo[0] + kd * p.dil[0];
        for (int64_t kh = 0; kh < p.ks[1]; ++kh) {
          const int64_t ih = oh * p.st[1] - p.lo[1] + kh * p.dil[1];
          if (kw_runs && id >= 0 && id < p.in[0] && ih >= 0 && ih < p.in[1]) {
            // The kernel row's taps inside the image are one run in x and in the row: widened
            // at once (a 3-channel stem: 7 runs of 3 elements become one of 21, which F16C
            // converts 8 at a time; one at a time in software below 4).
            const int64_t iw0 = ow * p.st[2] - p.lo[2];
            const int64_t kw_lo = std::min(std::max<int64_t>(0, -iw0), p.ks[2]);
            const int64_t kw_hi = std::max(kw_lo, std::min(p.ks[2], p.in[2] - iw0));
            T* dst = row + (kd * p.ks[1] + kh) * p.ks[2] * p.Cg;
            std::fill(dst, dst + kw_lo * p.Cg, T(0));
            widen_run(xn + id * s[2] + ih * s[3] + (iw0 + kw_lo) * s[4], dst + kw_lo * p.Cg, (kw_hi - kw_lo) * p.Cg);
            std::fill(dst + kw_hi * p.Cg, dst + p.ks[2] * p.Cg, T(0));
            continue;
          }
          for (int64_t kw = 0; kw < p.ks[2]; ++kw) {
            const int64_t iw = ow * p.st[2] - p.lo[2] + kw * p.dil[2];
            T* dst = row + ((kd * p.ks[1] + kh) * p.ks[2] + kw) * p.Cg;
            if (id < 0 || id >= p.in[0] || ih < 0 || ih >= p.in[1] || iw < 0 || iw >= p.in[2]) {
              std::fill(dst, dst + p.Cg, T(0));
              continue;
            }
            const S* src = xn + id * s[2] + ih * s[3] + iw * s[4];
            if (s[1] == 1)
              widen_run(src, dst, p.Cg);
            else
              for (int64_t c = 0; c < p.Cg; ++c) dst[c] = widen(src[c * s[1]]);
          }
        }
      }
    }
  }

  // Adds col (mc x R) back into the activation-shaped target (tx strides), group g.
  void col2im_rows(int64_t m0, int64_t mc, int64_t g, const T* col, T* target,
                   const int64_t* tx) const {
    const int nt = static_cast<int>(std::min<int64_t>(threads_for(mc * p.R), p.Cg));
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const int team = omp_get_num_threads(), me = omp_get_thread_num();
      const int64_t c0 = p.Cg * me / team, c1 = p.Cg * (me + 1) / team;
      for (int64_t i = 0; i < mc; ++i) {
        const int64_t m = m0 + i, n = m / p.OSP, q = m % p.OSP;
        const int64_t ow = q % p.out[2], t = q / p.out[2], oh = t % p.out[1], od = t / p.out[1];
        T* xn = target + n * tx[0] + g * p.Cg * tx[1];
        const T* row = col + i * p.R;
        for (int64_t kd = 0; kd < p.ks[0]; ++kd) {
          const int64_t id = od * p.st[0] - p.lo[0] + kd * p.dil[0];
          if (id < 0 || id >= p.in[0]) continue;
          for (int64_t kh = 0; kh < p.ks[1]; ++kh) {
            const int64_t ih = oh * p.st[1] - p.lo[1] + kh * p.dil[1];
            if (ih < 0 || ih >= p.in[1]) continue;
            for (int64_t kw = 0; kw < p.ks[2]; ++kw) {
              const int64_t iw = ow * p.st[2] - p.lo[2] + kw * p.dil[2];
              if (iw < 0 || iw >= p.in[2]) continue;
              const T* src = row + ((kd * p.ks[1] + kh) * p.ks[2] + kw) * p.Cg;
              T* dst = xn + id * tx[2] + ih * tx[3] + iw * tx[4];
              for (int64_t c = c0; c < c1; ++c) dst[c * tx[1]] += src[c];
            }
          }
        }
      }
    }
  }

  // dy rows (mc x Kg) of group g gathered (and widened) into buf.
  void pack_y_rows(int64_t m0, int64_t mc, int64_t g, T* dst) const {
    const int nt = threads_for(mc * p.Kg);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t i = 0; i < mc; ++i) {
      const int64_t m = m0 + i;
      const S* src = y + (m / p.OSP) * p.ys[0] + spatial_offset(m % p.OSP, p.ys) + g * p.Kg * p.ys[1];
      if (p.ys[1] == 1)
        widen_run(src, dst + i * p.Kg, p.Kg);
      else
        for (int64_t k = 0; k < p.Kg; ++k) dst[i * p.Kg + k] = widen(src[k * p.ys[1]]);
    }
  }

  // Forward epilogue over O (mc x Kg, ld ldo): bias, activation, alpha (where the GEMM did
  // not apply it), beta, rounding into y.
  void epilogue_rows(int64_t m0, int64_t mc, int64_t g, T* O, int64_t ldo) const {
    const bool has_act = p.act != FDNN_ACTIVATION_NONE;
    if (p.y_direct && !p.has_bias && !has_act) return;
    const T* b = p.has_bias ? buf(p.off_bias) + g * p.Kg : nullptr;
    const T beta = static_cast<T>(p.beta);
    const int nt = threads_for(mc * p.Kg);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t i = 0; i < mc; ++i) {
      T* row = O + i * ldo;
      if (b)
        for (int64_t k = 0; k < p.Kg; ++k) row[k] += b[k];
      activate_and_scale(row, p.Kg);
      if (p.y_direct) continue;
      const int64_t m = m0 + i;
      S* dst = y + (m / p.OSP) * p.ys[0] + spatial_offset(m % p.OSP, p.ys) + g * p.Kg * p.ys[1];
      if (p.ys[1] == 1) {
        if (beta != T(0))
          blend_run(row, beta, dst, p.Kg);
        else
          narrow_run(row, dst, p.Kg);
        continue;
      }
      for (int64_t k = 0; k < p.Kg; ++k) {
        T v = row[k];
        if (beta != T(0)) v += beta * widen(dst[k * p.ys[1]]);
        store(dst + k * p.ys[1], v);
      }
    }
  }

  // --- cols lowering: col (R x mc), column j = output position m0+j of the batch (a chunk
  // may span images; in per-image mode it never does) --------------------------------------

  // Calls f(j, n, od, oh, ow, seg) for runs of one output row: columns j..j+seg-1 of the chunk
  // are image n, output row (od, oh), positions ow..ow+seg-1.
  template <class F>
  void for_segments(int64_t m0, int64_t mc, F&& f) const {
    const int64_t plane = p.out[1] * p.out[2];
    int64_t j = 0, q = m0;
    while (j < mc) {
      const int64_t n = q / p.OSP, pp = q % p.OSP;
      const int64_t od = pp / plane, oh = (pp % plane) / p.out[2], ow = pp % p.out[2];
      const int64_t seg = std::min(p.out[2] - ow, mc - j);
      f(j, n, od, oh, ow, seg);
      j += seg;
      q += seg;
    }
  }

  void im2col_cols(int64_t m0, int64_t mc, int64_t g, T* col) const {
    const int nt = threads_for(mc * p.R);
    const int64_t* s = p.xs;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t r = 0; r < p.R; ++r) {
      const int64_t c = r / p.kvol, kidx = r % p.kvol;
      const int64_t kw = kidx % p.ks[2], kh = (kidx / p.ks[2]) % p.ks[1], kd = kidx / (p.ks[2] * p.ks[1]);
      const S* xc = x + (g * p.Cg + c) * s[1];
      int64_t w_lo, w_hi;
      valid_range(p.in[2], p.out[2], p.st[2], p.lo[2], kw * p.dil[2], w_lo, w_hi);
      T* dst = col + r * mc;
      const int64_t step = p.st[2] * s[4];
      for_segments(m0, mc, [&](int64_t j, int64_t n, int64_t od, int64_t oh, int64_t ow, int64_t seg) {
        const int64_t id = od * p.st[0] - p.lo[0] + kd * p.dil[0];
        const int64_t ih = oh * p.st[1] - p.lo[1] + kh * p.dil[1];
        T* d = dst + j;
        if (id < 0 || id >= p.in[0] || ih < 0 || ih >= p.in[1]) {
          std::fill(d, d + seg, T(0));
          return;
        }
        const S* src = xc + n * s[0] + id * s[2] + ih * s[3];
        const int64_t a0 = std::clamp(w_lo, ow, ow + seg), a1 = std::clamp(w_hi, a0, ow + seg);
        std::fill(d, d + (a0 - ow), T(0));
        const S* sp = src + (a0 * p.st[2] - p.lo[2] + kw * p.dil[2]) * s[4];
        T* dd = d + (a0 - ow);
        if (step == 1)
          widen_run(sp, dd, a1 - a0);
        else
          widen_strided(sp, step, dd, a1 - a0);
        std::fill(d + (a1 - ow), d + seg, T(0));
      });
    }
  }

  void col2im_cols(int64_t m0, int64_t mc, int64_t g, const T* col, T* target,
                   const int64_t* tx) const {
    const int nt = static_cast<int>(std::min<int64_t>(threads_for(mc * p.R), p.Cg));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t c = 0; c < p.Cg; ++c) {
      T* xc = target + (g * p.Cg + c) * tx[1];
      for (int64_t kidx = 0; kidx < p.kvol; ++kidx) {
        const int64_t kw = kidx % p.ks[2], kh = (kidx / p.ks[2]) % p.ks[1], kd = kidx / (p.ks[2] * p.ks[1]);
        int64_t w_lo, w_hi;
        valid_range(p.in[2], p.out[2], p.st[2], p.lo[2], kw * p.dil[2], w_lo, w_hi);
        const T* src = col + (c * p.kvol + kidx) * mc;
        const int64_t step = p.st[2] * tx[4];
        for_segments(m0, mc, [&](int64_t j, int64_t n, int64_t od, int64_t oh, int64_t ow, int64_t seg) {
          const int64_t id = od * p.st[0] - p.lo[0] + kd * p.dil[0];
          const int64_t ih = oh * p.st[1] - p.lo[1] + kh * p.dil[1];
          if (id < 0 || id >= p.in[0] || ih < 0 || ih >= p.in[1]) return;
          const int64_t a0 = std::clamp(w_lo, ow, ow + seg), a1 = std::clamp(w_hi, a0, ow + seg);
          T* dp = xc + n * tx[0] + id * tx[2] + ih * tx[3] + (a0 * p.st[2] - p.lo[2] + kw * p.dil[2]) * tx[4];
          const T* sp = src + j + (a0 - ow);
          for (int64_t t = 0; t < a1 - a0; ++t) dp[t * step] += sp[t];
        });
      }
    }
  }

  const S* y_row(int64_t n, int64_t ch, int64_t od, int64_t oh, int64_t ow) const {
    return y + n * p.ys[0] + ch * p.ys[1] + od * p.ys[2] + oh * p.ys[3] + ow * p.ys[4];
  }

  void pack_y_cols(int64_t m0, int64_t mc, int64_t g, T* dst) const {
    const int nt = threads_for(mc * p.Kg);
    const int64_t s4 = p.ys[4];
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t k = 0; k < p.Kg; ++k) {
      T* row = dst + k * mc;
      for_segments(m0, mc, [&](int64_t j, int64_t n, int64_t od, int64_t oh, int64_t ow, int64_t seg) {
        const S* src = y_row(n, g * p.Kg + k, od, oh, ow);
        if (s4 == 1)
          widen_run(src, row + j, seg);
        else
          for (int64_t t = 0; t < seg; ++t) row[j + t] = widen(src[t * s4]);
      });
    }
  }

  void epilogue_cols(int64_t m0, int64_t mc, int64_t g, T* O, int64_t ldo) const {
    const bool has_act = p.act != FDNN_ACTIVATION_NONE;
    if (p.y_direct && !p.has_bias && !has_act) return;
    const T* b = p.has_bias ? buf(p.off_bias) + g * p.Kg : nullptr;
    const T beta = static_cast<T>(p.beta);
    const int nt = threads_for(mc * p.Kg);
    const int64_t s4 = p.ys[4];
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t k = 0; k < p.Kg; ++k) {
      T* row = O + k * ldo;
      if (b) {
        const T bk = b[k];
        for (int64_t j = 0; j < mc; ++j) row[j] += bk;
      }
      activate_and_scale(row, mc);
      if (p.y_direct) continue;
      for_segments(m0, mc, [&](int64_t j, int64_t n, int64_t od, int64_t oh, int64_t ow, int64_t seg) {
        S* dst = const_cast<S*>(y_row(n, g * p.Kg + k, od, oh, ow));
        const T* v = row + j;
        if (s4 == 1 && beta != T(0)) {
          blend_run(v, beta, dst, seg);
        } else if (beta != T(0)) {
          for (int64_t t = 0; t < seg; ++t) store(dst + t * s4, static_cast<T>(v[t] + beta * widen(dst[t * s4])));
        } else if (s4 == 1) {
          narrow_run(v, dst, seg);
        } else {
          for (int64_t t = 0; t < seg; ++t) store(dst + t * s4, v[t]);
        }
      });
    }
  }

  // The chunks of the cols lowering: (m0, mc) over the batch, or within each image when the
  // plan reads or writes the caller's arrays per image.
  template <class F>
  void for_chunks_cols(F&& f) const {
    if (p.span_images) {
      for (int64_t m0 = 0; m0 < p.M; m0 += p.chunk) f(m0, std::min(p.chunk, p.M - m0));
      return;
    }
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t p0 = 0; p0 < p.OSP; p0 += p.chunk) f(n * p.OSP + p0, std::min(p.chunk, p.OSP - p0));
  }

  // Rows lowering: f(m0, mc) for each chunk of output positions of the whole batch.
  template <class F>
  void for_chunks_rows(F&& f) const {
    for (int64_t m0 = 0; m0 < p.M; m0 += p.chunk) f(m0, std::min(p.chunk, p.M - m0));
  }

  // The GEMM operands of chunk (m0, mc) and group g: the caller's array itself when its
  // layout is the matrix the GEMM wants (x_direct, y_direct), else gathered into `buf`.
  // Sets `ld` to the operand's leading dimension.
  // x (forward's and backward-weight's input, backward-data's pointwise output) as a matrix.
  // x itself as the im2col operand (x_direct), in its own element type: S is T but in 16-bit
  // forward plans, whose GEMM widens it (own_gemm).
  const S* x_direct_at(int64_t m0, int64_t g) const {
    if (p.lowering == kRows) return x + m0 * p.ldx + g * p.Cg;
    const int64_t n = m0 / p.OSP, p0 = m0 % p.OSP;
    return x + n * p.xs[0] + g * p.Cg * p.ldx + p0;
  }
  // dx itself as a backward-data GEMM's output (dx_gemm: native dtypes only, S is T).
  T* dx_direct_at(int64_t m0, int64_t g) const {
    return reinterpret_cast<T*>(const_cast<S*>(x_direct_at(m0, g)));
  }

  const T* x_operand(int64_t m0, int64_t mc, int64_t g, T* buf, int64_t& ld) const {
    if constexpr (std::is_same<S, T>::value) {
      if (p.x_direct) {
        ld = p.ldx;
        return x_direct_at(m0, g);
      }
    }
    if (p.lowering == kRows) {
      im2col_rows(m0, mc, g, buf);
      ld = p.R;
      return buf;
    }
    im2col_cols(m0, mc, g, buf);
    ld = mc;
    return buf;
  }

  // y (forward's output, where the GEMM writes) or dy (the backward ops' input).
  T* y_direct_at(int64_t m0, int64_t g) const {
    if (p.lowering == kRows) return reinterpret_cast<T*>(y) + m0 * p.ldy + g * p.Kg;
    const int64_t n = m0 / p.OSP, p0 = m0 % p.OSP;
    return reinterpret_cast<T*>(y) + n * p.ys[0] + g * p.Kg * p.ldy + p0;
  }

  T* y_output(int64_t m0, int64_t mc, int64_t g, T* buf, int64_t& ld) const {
    if (p.y_direct) {
      ld = p.ldy;
      return y_direct_at(m0, g);
    }
    ld = p.lowering == kRows ? p.Kg : mc;
    return buf;
  }

  const T* dy_operand(int64_t m0, int64_t mc, int64_t g, T* buf, int64_t& ld) const {
    if (p.y_direct) {
      ld = p.ldy;
      return y_direct_at(m0, g);
    }
    if (p.lowering == kRows) {
      pack_y_rows(m0, mc, g, buf);
      ld = p.Kg;
      return buf;
    }
    pack_y_cols(m0, mc, g, buf);
    ld = mc;
    return buf;
  }

  // --- direct depthwise (C/groups == 1): input channel of output channel k is k / Kg -------
  // Forward's register-blocked case: 2-D, 3x3, stride 1, dilation 1.
  bool dw_3x3_unit() const {
    return p.in[0] == 1 && p.ks[0] == 1 && p.ks[1] == 3 && p.ks[2] == 3 && p.st[1] == 1 && p.st[2] == 1 &&
           p.dil[1] == 1 && p.dil[2] == 1;
  }
  static constexpr int64_t kBlk = 256;  // elements of one vector block (on the stack)
  static constexpr int64_t kMaxKw = 32;  // kernel widths whose ranges are precomputed

  // Weights widened to (kvol, K): dst[kidx * K + k].
  void dw_pack(const S* src, T* dst) const {
    for (int64_t k = 0; k < p.K; ++k)
      for (int64_t kidx = 0; kidx < p.kvol; ++kidx) {
        const int64_t kw = kidx % p.ks[2], kh = (kidx / p.ks[2]) % p.ks[1], kd = kidx / (p.ks[2] * p.ks[1]);
        dst[kidx * p.K + k] = widen(src[k * p.ws[0] + kd * p.ws[2] + kh * p.ws[3] + kw * p.ws[4]]);
      }
  }
  const T* dw_weights() const {
    if (p.packed_w) return reinterpret_cast<const T*>(p.packed_w->data());
    T* dst = buf(p.off_w);
    dw_pack(w, dst);
    return dst;
  }
  // Output index along one dim reached from input index i at kernel offset kd*dil, or -1.
  static int64_t dw_src(int64_t i, int64_t lo, int64_t koff, int64_t s, int64_t out) {
    const int64_t t = i + lo - koff;
    if (t < 0 || t % s != 0 || t / s >= out) return -1;
    return t / s;
  }
  // Input positions [i_lo, i_lo + n) along W that output block [o0, o0 + len) reads in one
  // input row, widened into xw (kSpan elements at most; false when the span does not fit).
  static constexpr int64_t kSpan = 2048;
  bool dw_stage_row(const S* xr, int64_t o0, int64_t len, T* xw, int64_t& i_lo) const {
    i_lo = std::max<int64_t>(0, o0 * p.st[2] - p.lo[2]);
    const int64_t i_hi =
        std::min<int64_t>(p.in[2], (o0 + len - 1) * p.st[2] - p.lo[2] + (p.ks[2] - 1) * p.dil[2] + 1);
    const int64_t n = i_hi - i_lo;
    if (n > kSpan) return false;
    if (n <= 0) return true;
    if (p.xs[4] == 1)
      widen_run(xr + i_lo, xw, n);
    else
      for (int64_t i = 0; i < n; ++i) xw[i] = widen(xr[(i_lo + i) * p.xs[4]]);
    return true;
  }
  // 16-bit, NC[D]HW: one input channel (D x H x W) widened into this thread's buffer, once for
  // all its output rows (staging row spans per output row widened each input row kh times);
  // null for float32/64 and for planes over kPlane elements, which stage row spans instead.
  static constexpr int64_t kPlane = int64_t(1) << 16;
  const T* dw_stage_plane(const S* xc) const {
    if (std::is_same<S, T>::value) return nullptr;
    const int64_t rows = p.in[0] * p.in[1], width = p.in[2];
    if (rows * width > kPlane) return nullptr;
    thread_local std::vector<T> plane;
    if (static_cast<int64_t>(plane.size()) < rows * width) plane.resize(static_cast<size_t>(rows * width));
    const int64_t* xs = p.xs;
    if (xs[4] == 1 && (p.in[1] == 1 || xs[3] == width) && (p.in[0] == 1 || xs[2] == p.in[1] * width)) {
      widen_run(xc, plane.data(), rows * width);  // the channel is one run
      return plane.data();
    }
    for (int64_t r = 0; r < rows; ++r) {
      const S* xr = xc + (r / p.in[1]) * xs[2] + (r % p.in[1]) * xs[3];
      T* dst = plane.data() + r * width;
      if (xs[4] == 1)
        widen_run(xr, dst, width);
      else
        for (int64_t i = 0; i < width; ++i) dst[i] = widen(xr[i * xs[4]]);
    }
    return plane.data();
  }
  // v[0..len) into dst at element step: v + beta * dst (the header's epilogue's last term),
  // rounded once for 16-bit outputs.
  void store_row(S* dst, int64_t step, const T* v, int64_t len) const {
    const T beta = static_cast<T>(p.beta);
    if (step == 1) {
      if (beta != T(0))
        blend_run(v, beta, dst, len);
      else
        narrow_run(v, dst, len);
      return;
    }
    if (beta != T(0)) {
      for (int64_t t = 0; t < len; ++t) store(dst + t * step, static_cast<T>(v[t] + beta * widen(dst[t * step])));
    } else {
      for (int64_t t = 0; t < len; ++t) store(dst + t * step, v[t]);
    }
  }

  static constexpr int64_t kWgBlock = 64;  // winograd: tiles or channels per vector block

#define FDNN_KERNEL_TARGET
#define FDNN_KERNEL_NAME(f) f##_base
#include "dw_kernels.inc"
#include "winograd.inc"
#undef FDNN_KERNEL_TARGET
#undef FDNN_KERNEL_NAME
#if FDNN_X86_CLONES
#define FDNN_KERNEL_TARGET __attribute__((target("avx2,fma")))
#define FDNN_KERNEL_NAME(f) f##_avx2
#include "dw_kernels.inc"
#include "winograd.inc"
#undef FDNN_KERNEL_TARGET
#undef FDNN_KERNEL_NAME
// A third copy of the direct loops for AVX-512 (512-bit vectors), taken by the channels-last
// depthwise forward only. Measured (3x3 256 @28, one thread): float32 0.59 -> 0.42-0.48 ms at
// N=4, 2.24 -> 1.72 at N=16; float16 0.59 -> 0.46-0.54; bfloat16 0.61-0.67 (1.36 before the
// 16-lane bfloat16 conversions). Not taken where it was slower than the AVX2 copy: the
// NC[D]HW depthwise forward (10-15%: rows of 28 fill under two 16-lane vectors) and the
// Winograd transforms (no faster; winograd.inc is compiled here for stage_padded_row only).
#define FDNN_KERNEL_TARGET __attribute__((target("avx512f,avx512vl,fma,prefer-vector-width=512")))
#define FDNN_KERNEL_NAME(f) f##_avx512
#include "dw_kernels.inc"
#include "winograd.inc"
#undef FDNN_KERNEL_TARGET
#undef FDNN_KERNEL_NAME
#endif
  void dw_forward() const {
#if FDNN_X86_CLONES
    if (p.dw_cl && cpu_avx512()) return dw_forward_avx512();
    if (cpu_avx2_fma()) return dw_forward_avx2();
#endif
    dw_forward_base();
  }
  void dw_backward_data() const {
#if FDNN_X86_CLONES
    if (cpu_avx2_fma()) return dw_backward_data_avx2();
#endif
    dw_backward_data_base();
  }
  void dw_backward_weight() const {
#if FDNN_X86_CLONES
    if (cpu_avx2_fma()) return dw_backward_weight_avx2();
#endif
    dw_backward_weight_base();
  }

  // --- Winograd F(2x2, 3x3) (winograd.inc) ---------------------------------------------------
  // Each transform in its AVX2+FMA copy where the CPU has it.
#if FDNN_X86_CLONES
#define FDNN_WG_CALL(f, ...) (cpu_avx2_fma() ? f##_avx2(__VA_ARGS__) : f##_base(__VA_ARGS__))
#else
#define FDNN_WG_CALL(f, ...) f##_base(__VA_ARGS__)
#endif
  void wg_pack(const S* src, T* dst) const { FDNN_WG_CALL(wg_pack, src, dst); }

  const T* wg_weights() const {
    if (p.packed_w) return reinterpret_cast<const T*>(p.packed_w->data());
    T* u = buf(p.off_w);
    wg_pack(w, u);
    return u;
  }

  // The 16 GEMMs of a chunk of tc tiles, group g: M[xi] = alpha * U[xi] * V[xi] (NC[D]HW:
  // (K/g x C/g) * (C/g x tc); channels-last: V[xi] (tc x C/g) * U[xi]^T). Each GEMM is split
  // into panels by its shape only (panels_of) and the 16 x panels calls spread over the team:
  // every element comes from the same GEMM call whatever the team size.
  void wg_gemms(int64_t tc, const T* U, const T* V, T* M, T alpha) const {
    const int64_t m = p.wg_cl ? tc : p.Kg, n = p.wg_cl ? p.Kg : tc, k = p.Cg;
    const Panels sp = panels_of(m, n, k);
    const int64_t tasks = 16 * sp.count;
    const int nt = static_cast<int>(std::min<int64_t>(tasks, team_threads()));
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t xi = task / sp.count, i = task % sp.count;
      const T* u = U + xi * p.Kg * p.Cg;
      const T* v = V + xi * p.Cg * tc;
      T* c = M + xi * p.Kg * tc;
      if (p.wg_cl)  // A = V (tc rows, ld Cg), B = U^T (ld Cg), C ld Kg
        gemm_panel(sp, i, false, true, m, n, k, alpha, v, p.Cg, u, p.Cg, T(0), c, p.Kg);
      else  // A = U (Kg rows, ld Cg), B = V (ld tc), C ld tc
        gemm_panel(sp, i, false, false, m, n, k, alpha, u, p.Cg, v, tc, T(0), c, tc);
    }
  }

  void wg_forward() const {
    const T* U = wg_weights();
    if (p.has_bias) {
      T* b = buf(p.off_bias);
      for (int64_t k = 0; k < p.K; ++k) b[k] = alpha_before_act() * widen(bias[k * p.bs]);
    }
    T* V = buf(p.off_v);
    T* M = buf(p.off_m);
    const int64_t total = p.N * p.tiles;
    for (int64_t t0 = 0; t0 < total; t0 += p.chunk) {
      const int64_t tc = std::min(p.chunk, total - t0);
      for (int64_t g = 0; g < p.G; ++g) {
        if (p.wg_cl)
          FDNN_WG_CALL(wg_input_cl, t0, tc, g, V);
        else
          FDNN_WG_CALL(wg_input_nchw, t0, tc, g, V);
        wg_gemms(tc, U + g * 16 * p.Kg * p.Cg, V, M, alpha_before_act());
        if (p.wg_cl)
          FDNN_WG_CALL(wg_output_cl, t0, tc, g, M);
        else
          FDNN_WG_CALL(wg_output_nchw, t0, tc, g, M);
      }
    }
  }
#undef FDNN_WG_CALL

  // --- ops ---------------------------------------------------------------------------------
  void forward() const {
    int64_t ldw;
    const T* W = weights(ldw);
    if (p.has_bias) {
      T* b = buf(p.off_bias);
      for (int64_t k = 0; k < p.K; ++k) b[k] = alpha_before_act() * widen(bias[k * p.bs]);
    }
    const T alpha = alpha_before_act(), beta = p.y_direct ? static_cast<T>(p.beta) : T(0);
    T* col = buf(p.off_col);
    T* ybuf = buf(p.off_y);
    // One chunk and group: x as the GEMM reads it (x itself where x_direct, else the im2col
    // matrix built in col), then the epilogue.
    auto chunk_gemm = [&](int64_t m0, int64_t mc, int64_t g, auto&& gemm_on_x) {
      int64_t ldo;
      T* O = y_output(m0, mc, g, ybuf, ldo);
      if (p.x_direct) {
        gemm_on_x(x_direct_at(m0, g), p.ldx, O, ldo);
      } else {
        int64_t ldx;
        const T* X = x_operand(m0, mc, g, col, ldx);
        gemm_on_x(X, ldx, O, ldo);
      }
      if (p.lowering == kRows)
        epilogue_rows(m0, mc, g, O, ldo);
      else
        epilogue_cols(m0, mc, g, O, ldo);
    };
    if (p.lowering == kRows) {
      for_chunks_rows([&](int64_t m0, int64_t mc) {
        for (int64_t g = 0; g < p.G; ++g)
          chunk_gemm(m0, mc, g, [&](const auto* A, int64_t lda, T* O, int64_t ldo) {
            par_gemm(false, true, mc, p.Kg, p.R, alpha, A, lda, W + g * p.Kg * ldw, ldw, beta, O, ldo);
          });
      });
      return;
    }
    for_chunks_cols([&](int64_t m0, int64_t mc) {
      for (int64_t g = 0; g < p.G; ++g)
        chunk_gemm(m0, mc, g, [&](const auto* B, int64_t ldb, T* O, int64_t ldo) {
          par_gemm(false, false, p.Kg, mc, p.R, alpha, W + g * p.Kg * ldw, ldw, B, ldb, beta, O, ldo);
        });
    });
  }

  // Scales (beta) or zeroes every element of an activation-shaped array in place.
  void scale_x(S* t, const int64_t* s, T beta) const {
    const int nt = threads_for(p.N * p.C * p.ISP);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t nc = 0; nc < p.N * p.C; ++nc) {
      S* base = t + (nc / p.C) * s[0] + (nc % p.C) * s[1];
      for (int64_t d = 0; d < p.in[0]; ++d)
        for (int64_t h = 0; h < p.in[1]; ++h) {
          S* r = base + d * s[2] + h * s[3];
          for (int64_t i = 0; i < p.in[2]; ++i)
            store(r + i * s[4], beta == T(0) ? T(0) : static_cast<T>(beta * widen(r[i * s[4]])));
        }
    }
  }

  void backward_data() const {
    int64_t ldw;
    const T* W = weights(ldw);
    const T alpha = static_cast<T>(p.alpha);
    T* col = buf(p.off_col);
    T* ybuf = buf(p.off_y);
    // The col2im target: dx itself (native dtypes) or a float32 accumulator.
    T* target = nullptr;
    int64_t tx[5];
    const bool native = std::is_same<S, T>::value;
    if (!p.dx_gemm) {
      if (native) {
        target = reinterpret_cast<T*>(x);
        std::copy(p.xs, p.xs + 5, tx);
        scale_x(x, p.xs, static_cast<T>(p.beta));
      } else {
        target = buf(p.off_acc);
        if (p.lowering == kRows) {  // dense N, D, H, W, C
          tx[1] = 1, tx[4] = p.C, tx[3] = p.C * p.in[2], tx[2] = tx[3] * p.in[1], tx[0] = tx[2] * p.in[0];
        } else {  // dense N, C, D, H, W
          tx[4] = 1, tx[3] = p.in[2], tx[2] = p.in[1] * p.in[2], tx[1] = p.ISP, tx[0] = p.C * p.ISP;
        }
        std::memset(static_cast<void*>(target), 0, static_cast<size_t>(p.N * p.C * p.ISP) * sizeof(T));
      }
    }
    const T beta = static_cast<T>(p.beta);
    if (p.lowering == kRows) {
      for_chunks_rows([&](int64_t m0, int64_t mc) {
        for (int64_t g = 0; g < p.G; ++g) {
          int64_t ldy;
          const T* dY = dy_operand(m0, mc, g, ybuf, ldy);
          if (p.dx_gemm) {
            par_gemm(false, false, mc, p.Cg, p.Kg, alpha, dY, ldy, W + g * p.Kg * ldw, ldw, beta,
                 dx_direct_at(m0, g), p.ldx);
          } else {
            par_gemm(false, false, mc, p.R, p.Kg, alpha, dY, ldy, W + g * p.Kg * ldw, ldw, T(0), col, p.R);
            col2im_rows(m0, mc, g, col, target, tx);
          }
        }
      });
    } else {
      for_chunks_cols([&](int64_t m0, int64_t mc) {
        for (int64_t g = 0; g < p.G; ++g) {
          int64_t ldy;
          const T* dY = dy_operand(m0, mc, g, ybuf, ldy);
          if (p.dx_gemm) {
            par_gemm(true, false, p.Cg, mc, p.Kg, alpha, W + g * p.Kg * ldw, ldw, dY, ldy, beta,
                 dx_direct_at(m0, g), p.ldx);
          } else {
            par_gemm(true, false, p.R, mc, p.Kg, alpha, W + g * p.Kg * ldw, ldw, dY, ldy, T(0), col, mc);
            col2im_cols(m0, mc, g, col, target, tx);
          }
        }
      });
    }
    if (!p.dx_gemm && !native) {  // round the accumulator once into dx
      const int nt = threads_for(p.N * p.C * p.ISP);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
      for (int64_t nc = 0; nc < p.N * p.C; ++nc) {
        const int64_t n = nc / p.C, c = nc % p.C;
        for (int64_t d = 0; d < p.in[0]; ++d)
          for (int64_t h = 0; h < p.in[1]; ++h)
            for (int64_t i = 0; i < p.in[2]; ++i) {
              S* e = x + n * p.xs[0] + c * p.xs[1] + d * p.xs[2] + h * p.xs[3] + i * p.xs[4];
              T v = target[n * tx[0] + c * tx[1] + d * tx[2] + h * tx[3] + i * tx[4]];
              if (beta != T(0)) v += beta * widen(*e);
              store(e, v);
            }
      }
    }
  }

  void backward_weight() const {
    const T alpha = static_cast<T>(p.alpha), beta = static_cast<T>(p.beta);
    T* dW = p.w_direct ? reinterpret_cast<T*>(w) : buf(p.off_w);
    const int64_t ldw = p.w_direct ? p.ldw : p.R;
    const T beta0 = p.w_direct ? beta : T(0);
    T* col = buf(p.off_col);
    T* ybuf = buf(p.off_y);
    if (p.lowering == kRows) {
      for_chunks_rows([&](int64_t m0, int64_t mc) {
        for (int64_t g = 0; g < p.G; ++g) {
          int64_t lda, ldy;
          const T* A = x_operand(m0, mc, g, col, lda);
          const T* dY = dy_operand(m0, mc, g, ybuf, ldy);
          par_gemm(true, false, p.Kg, p.R, mc, alpha, dY, ldy, A, lda, m0 == 0 ? beta0 : T(1),
               dW + g * p.Kg * ldw, ldw);
        }
      });
    } else {
      for_chunks_cols([&](int64_t m0, int64_t mc) {
        for (int64_t g = 0; g < p.G; ++g) {
          int64_t ldb, ldy;
          const T* B = x_operand(m0, mc, g, col, ldb);
          const T* dY = dy_operand(m0, mc, g, ybuf, ldy);
          par_gemm(false, true, p.Kg, p.R, mc, alpha, dY, ldy, B, ldb, m0 == 0 ? beta0 : T(1),
               dW + g * p.Kg * ldw, ldw);
        }
      });
    }
    if (!p.w_direct) {  // dW buffer -> w in its layout, with beta, rounded once
      const int nt = threads_for(p.K * p.R);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
      for (int64_t k = 0; k < p.K; ++k)
        for (int64_t c = 0; c < p.Cg; ++c)
          for (int64_t kidx = 0; kidx < p.kvol; ++kidx) {
            const int64_t kw = kidx % p.ks[2], kh = (kidx / p.ks[2]) % p.ks[1],
                          kd = kidx / (p.ks[2] * p.ks[1]);
            S* e = w + k * p.ws[0] + c * p.ws[1] + kd * p.ws[2] + kh * p.ws[3] + kw * p.ws[4];
            T v = dW[k * p.R + r_of(c, kidx)];
            if (beta != T(0)) v += beta * widen(*e);
            store(e, v);
          }
    }
    if (p.has_bias) bias_grad();
  }

  // db = alpha * sum of dy over N and space + beta * db
  void bias_grad() const {
    const T alpha = static_cast<T>(p.alpha), beta = static_cast<T>(p.beta);
    {
      const int nt = threads_for(p.M * p.K);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
      for (int64_t k = 0; k < p.K; ++k) {
        double sum = 0;
        for (int64_t n = 0; n < p.N; ++n) {
          const S* base = y + n * p.ys[0] + k * p.ys[1];
          for (int64_t od = 0; od < p.out[0]; ++od)
            for (int64_t oh = 0; oh < p.out[1]; ++oh) {
              const S* r = base + od * p.ys[2] + oh * p.ys[3];
              for (int64_t ow = 0; ow < p.out[2]; ++ow) sum += widen(r[ow * p.ys[4]]);
            }
        }
        S* e = bias + k * p.bs;
        T v = static_cast<T>(alpha * static_cast<T>(sum));
        if (beta != T(0)) v += beta * widen(*e);
        store(e, v);
      }
    }
  }

  void run() const {
    if (p.winograd) return wg_forward();
    if (p.depthwise) {
      switch (p.op) {
        case FDNN_CONV_FORWARD: dw_forward(); break;
        case FDNN_CONV_BACKWARD_DATA: dw_backward_data(); break;
        case FDNN_CONV_BACKWARD_WEIGHT: dw_backward_weight(); break;
      }
      return;
    }
    switch (p.op) {
      case FDNN_CONV_FORWARD: forward(); break;
      case FDNN_CONV_BACKWARD_DATA: backward_data(); break;
      case FDNN_CONV_BACKWARD_WEIGHT: backward_weight(); break;
    }
  }
};

void execute_plan(const Plan& plan, void* const ptr[4], char* workspace) {
  openblas_on_calling_thread();
  switch (plan.dt) {
    case kF64:
      Exec<double, double>{plan, static_cast<double*>(ptr[0]), static_cast<double*>(ptr[1]),
                           static_cast<double*>(ptr[2]), static_cast<double*>(ptr[3]), workspace}
          .run();
      break;
    case kF32:
      Exec<float, float>{plan, static_cast<float*>(ptr[0]), static_cast<float*>(ptr[1]),
                         static_cast<float*>(ptr[2]), static_cast<float*>(ptr[3]), workspace}
          .run();
      break;
    case kF16:
      Exec<Half, float>{plan, static_cast<Half*>(ptr[0]), static_cast<Half*>(ptr[1]),
                        static_cast<Half*>(ptr[2]), static_cast<Half*>(ptr[3]), workspace}
          .run();
      break;
    case kBF16:
      Exec<BF16, float>{plan, static_cast<BF16*>(ptr[0]), static_cast<BF16*>(ptr[1]),
                        static_cast<BF16*>(ptr[2]), static_cast<BF16*>(ptr[3]), workspace}
          .run();
      break;
    case kNone: fail(FDNN_ERROR_INTERNAL, "plan without a dtype");
  }
}

// Calls f with an Exec of the plan's dtypes that has no arrays (weight packing only).
template <class F>
void with_packer(const Plan& plan, F&& f) {
  switch (plan.dt) {
    case kF64: return f(Exec<double, double>{plan, nullptr, nullptr, nullptr, nullptr, nullptr});
    case kF32: return f(Exec<float, float>{plan, nullptr, nullptr, nullptr, nullptr, nullptr});
    case kF16: return f(Exec<Half, float>{plan, nullptr, nullptr, nullptr, nullptr, nullptr});
    case kBF16: return f(Exec<BF16, float>{plan, nullptr, nullptr, nullptr, nullptr, nullptr});
    case kNone: fail(FDNN_ERROR_INTERNAL, "plan without a dtype");
  }
}

// Packs the weights of a FORWARD plan into plan-owned memory in the lowering's layout:
// Winograd's transformed weights, depthwise's (kvol, K), or the GEMM's rows.
void pack_into(Plan& plan, const void* w) {
  const size_t es = elem_size(plan.dt);
  const int64_t count = plan.winograd ? 16 * plan.K * plan.Cg : plan.K * plan.R;
  auto bytes = std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(count) * es);
  with_packer(plan, [&](const auto& e) {
    using E = std::decay_t<decltype(e)>;
    const auto* src = static_cast<const typename E::Src*>(w);
    auto* dst = reinterpret_cast<typename E::Acc*>(bytes->data());
    if (plan.winograd)
      e.wg_pack(src, dst);
    else if (plan.depthwise)
      e.dw_pack(src, dst);
    else
      e.pack_weights(src, dst);
  });
  plan.packed_w = std::move(bytes);
  if (!plan.winograd && !plan.depthwise) plan.w_direct = false;
}

// Times a plan on zero-filled buffers (benchmark policy).
double time_plan(const Plan& plan, const FDNN_Conv_Plan_Create_Args& a) {
  auto bytes_of = [](const FDNN_DLTensor* t) { return fdnn_shim::span_bytes(t); };
  std::vector<std::vector<double>> buffers;  // sizes checked by fdnn_shim::benchmark_fits
  void* pointers[4];
  const FDNN_DLTensor* tensors[4] = {a.x, a.w, a.y, a.bias};
  for (int i = 0; i < 4; ++i) {
    buffers.emplace_back(std::max<size_t>(bytes_of(tensors[i]), 64) / 8 + 1, 0.0);
    pointers[i] = buffers.back().data();
  }
  std::vector<double> workspace(plan.workspace / 8 + 8);
  using clock = std::chrono::steady_clock;
  execute_plan(plan, pointers, reinterpret_cast<char*>(workspace.data()));  // warm up
  double best = 1e30;
  for (int run = 0; run < 2; ++run) {
    auto t0 = clock::now();
    execute_plan(plan, pointers, reinterpret_cast<char*>(workspace.data()));
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
  }
  return best;
}

// ------------------------------------------------------------------------------------------
// The ABI table

std::string trim(std::string s) {
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

const std::string& built_version() {
  static const std::string v = [] {
    std::string s = trim(OPENBLAS_VERSION);  // " OpenBLAS 0.3.x "
    const size_t sp = s.rfind(' ');
    return sp == std::string::npos ? s : s.substr(sp + 1);
  }();
  return v;
}

const std::string& runtime_version() {
  static const std::string v = [] {
    const char* cfg = scipy_openblas_get_config();  // "OpenBLAS 0.3.x DYNAMIC_ARCH ..."
    std::string s = cfg ? cfg : "";
    if (s.rfind("OpenBLAS ", 0) == 0) s = s.substr(9);
    return s.substr(0, s.find(' '));
  }();
  return v;
}

const std::string& device_name() {
  static const std::string v = [] {
    const char* core = scipy_openblas_get_corename();
    return std::string("CPU, OpenBLAS ") + (core ? core : "unknown core");
  }();
  return v;
}

void check_device_id(int32_t device_id) {
  if (device_id != 0)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "device_id %d: the OpenBLAS shim has one device (0)",
         static_cast<int>(device_id));
}

FDNN_Error* shim_info(FDNN_Shim_Info_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Shim_Info_Args_STRUCT_SIZE, "Shim_Info");
    args->shim_name = "blas";
    args->vendor_name = "OpenBLAS";
    args->vendor_version_built = built_version().c_str();
    args->vendor_version_runtime = runtime_version().c_str();
    args->shim_version = FLUX_DNN_VERSION_STRING;
    args->device_type = FDNN_DEVICE_CPU;
    args->num_devices = 1;
    args->priority = FDNN_PRIORITY_PORTABLE;  // oneDNN, where present, is asked first
    args->unavailable_reason = nullptr;
  });
}

FDNN_Error* device_describe(FDNN_Device_Describe_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Device_Describe_Args_STRUCT_SIZE, "Device_Describe");
    check_device_id(args->device_id);
    args->default_flags = 0;
    args->name = device_name().c_str();
  });
}

// Every op, rank, activation and feature is this shim's own code around GEMM (or the direct
// depthwise loops), the same for each dtype: float64 and float32 natively, 16-bit floats
// widened to float32 and rounded once. Results are deterministic (fixed loop and reduction
// orders); there is no lower-precision math to allow.
fdnn_shim::Capabilities capabilities(int32_t op, FDNN_DLDataType dtype) {
  fdnn_shim::Capabilities c;
  switch (dt_of(dtype)) {
    case kF64:
      c.support = FDNN_SUPPORT_NATIVE;
      c.detail = "float64 GEMM (dgemm)";
      break;
    case kF32:
      c.support = FDNN_SUPPORT_NATIVE;
      c.detail = own_gemm() ? "float32 GEMM (sgemm), thin GEMMs on the shim's AVX-512 kernel"
                                    : "float32 GEMM (sgemm)";
      break;
    case kF16:
    case kBF16:
      c.support = FDNN_SUPPORT_CONVERTED;
      c.detail = own_gemm() ? "float32 GEMM, one rounding (the shim's AVX-512 kernel)"
                                    : "float32 GEMM, one rounding";
      break;
    case kNone:
      return fdnn_shim::not_computed(
          "OpenBLAS convolutions take float64, float32, float16 and bfloat16 only");
  }
  c.spatial_ranks = fdnn_shim::kRanks1To3;
  c.activations = fdnn_shim::activations_of_op(op, fdnn_shim::kEveryActivation);  // activate()
  c.features = FDNN_FEATURE_GROUPS | FDNN_FEATURE_DILATION | FDNN_FEATURE_ALPHA_BETA |
               FDNN_FEATURE_ASYMMETRIC_PADDING | FDNN_FEATURE_DETERMINISTIC |
               FDNN_FEATURE_BENCHMARK;
  if (op == FDNN_CONV_FORWARD) c.features |= FDNN_FEATURE_PACK_WEIGHTS;
  if (op == FDNN_CONV_BACKWARD_WEIGHT) c.features |= FDNN_FEATURE_BIAS_GRADIENT;  // bias_grad()
  return c;
}

FDNN_Error* conv_capabilities(FDNN_Conv_Capabilities_Args* args) {
  return fdnn_shim::conv_capabilities(args, [](int32_t device_id, int32_t op, FDNN_DLDataType dtype) {
    check_device_id(device_id);
    return capabilities(op, dtype);
  });
}

// The lowerings that can compute a: the im2col ones always, direct depthwise with one input
// channel per group, Winograd on what winograd_computes.
std::vector<Lowering> lowerings_for(const FDNN_Conv_Plan_Create_Args& a) {
  std::vector<Lowering> all{kRows, kCols, kColsBatch};
  if (a.w->shape[1] == 1) all.push_back(kDepthwise);
  if (winograd_computes(a)) all.push_back(kWinograd);
  return all;
}

// The plan of the policy: the given lowering, the fastest of those within workspace_limit, or
// the heuristic's.
Plan chosen_plan(const FDNN_Conv_Plan_Create_Args& a) {
  if (a.algo_policy == FDNN_ALGO_GIVEN && a.algo_id != kHeuristic)
    return make_plan(a, static_cast<Lowering>(a.algo_id));
  if (a.algo_policy == FDNN_ALGO_BENCHMARK) {
    double best = 0;
    bool have = false;
    Plan plan;
    for (Lowering l : lowerings_for(a)) {
      Plan candidate = make_plan(a, l);
      if (candidate.workspace > a.workspace_limit) continue;
      if (!fdnn_shim::benchmark_fits(a, candidate.workspace)) continue;
      const double t = time_plan(candidate, a);
      if (!have || t < best) {
        best = t;
        plan = std::move(candidate);
        have = true;
      }
    }
    if (have) return plan;
  }
  return make_plan(a, heuristic_lowering(a));
}

// A plan within workspace_limit, as the header asks: the policy's, else the lowering that
// needs the least (a pointwise one on the caller's own arrays needs none); else the problem
// is refused as UNSUPPORTED, naming the least it needs, so that a caller may pass it on.
Plan plan_within_limit(const FDNN_Conv_Plan_Create_Args& a) {
  Plan plan = chosen_plan(a);
  if (plan.workspace <= a.workspace_limit) return plan;
  for (Lowering l : lowerings_for(a)) {
    Plan lean = make_plan(a, l);
    if (lean.workspace < plan.workspace) plan = std::move(lean);
  }
  if (plan.workspace > a.workspace_limit)
    fail(FDNN_ERROR_UNSUPPORTED,
         "the OpenBLAS shim needs at least %zu bytes of workspace, the limit (workspace_limit) is "
         "%zu: %s",
         plan.workspace, a.workspace_limit, fdnn_shim::describe_problem(a).c_str());
  return plan;
}

FDNN_Error* plan_create(FDNN_Conv_Plan_Create_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Create_Args_STRUCT_SIZE, "Conv_Plan_Create");
    check_problem(*args);
    Plan plan = plan_within_limit(*args);
    fdnn_shim::check_workspace_within_limit(plan.workspace, *args, "the OpenBLAS shim");
    auto* owned = new Plan(std::move(plan));
    args->plan = reinterpret_cast<FDNN_Plan*>(owned);
    args->workspace_size = owned->workspace;
    args->chosen_algo_id = owned->algo_id;
    args->algo_name = owned->name.c_str();
  });
}

FDNN_Error* plan_execute(FDNN_Conv_Plan_Execute_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE, "Conv_Plan_Execute");
    const Plan& plan = fdnn_shim::plan_of<Plan>(args->plan, "Conv_Plan_Execute");
    fdnn_shim::check_execute_args(*args, storage_size(plan.dt), plan.workspace,
                                  {true, !plan.packed_w, true, plan.has_bias});
    void* const pointers[4] = {args->x, args->w, args->y, args->bias};
    execute_plan(plan, pointers, static_cast<char*>(args->workspace));
  });
}

FDNN_Error* plan_pack_weights(FDNN_Conv_Plan_Pack_Weights_Args* args) {
  return fdnn_shim::guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Pack_Weights_Args_STRUCT_SIZE,
                                 "Conv_Plan_Pack_Weights");
    const Plan& source = fdnn_shim::plan_of<Plan>(args->plan, "Conv_Plan_Pack_Weights");
    fdnn_shim::check_pack_args(*args, source.op, storage_size(source.dt));
    auto packed = std::make_unique<Plan>(source);
    pack_into(*packed, args->w);
    packed->name += " [packed weights]";
    args->workspace_size = packed->workspace;
    args->packed_plan = reinterpret_cast<FDNN_Plan*>(packed.release());
  });
}

void plan_destroy(FDNN_Plan_Destroy_Args* args) {
  if (args != nullptr) delete reinterpret_cast<Plan*>(args->plan);
}

const FDNN_Api kApi = {
    FDNN_Api_STRUCT_SIZE,
    FDNN_ABI_MAJOR,
    FDNN_ABI_MINOR,
    nullptr,  // extension_start
    fdnn_shim::error_destroy,
    fdnn_shim::error_describe,
    shim_info,
    device_describe,
    conv_capabilities,
    plan_create,
    plan_execute,
    plan_destroy,
    plan_pack_weights,
};

}  // namespace

extern "C" FDNN_EXPORT const FDNN_Api* fdnn_get_api(void) { return &kApi; }
