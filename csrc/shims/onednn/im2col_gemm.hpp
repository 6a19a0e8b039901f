// The oneDNN shim's small-problem path: a float32 forward convolution as im2col plus
// oneDNN's public row-major sgemm (dnnl_sgemm), one product per (image, group), without a
// convolution primitive; or, for stride-1 problems where AVX2 runs, the same product read in
// place from a zero-padded copy of x by the shim's own kernel (padded taps). For tiny
// problems a primitive's per-call machinery (execution context, argument maps, its driver's
// descriptor queries) costs more than the arithmetic; this path has none of it. See
// README.md ("The small-problem path") for when it is chosen.
//
// Like a primitive plan, it holds no mutable state: the im2col matrix (and, where needed, a
// copy of the weights or the product before the epilogue) lives in the caller's workspace, so
// one plan runs on several threads at once and a call allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "flux_dnn/flux_dnn.h"

namespace fdnn_onednn {

// The algorithm id of this path (the primitive's layout policies are 0 to 7), its name in
// messages, and the names a plan reports: every one starts with kSmallPathPrefix.
constexpr int64_t kIm2colGemmAlgo = 8;
constexpr const char* kIm2colGemmName = "the small-problem path";
constexpr const char* kSmallPathPrefix = "small: ";
constexpr const char* kSgemmPlanName = "small: im2col + onednn sgemm";
constexpr const char* kTapsPlanName = "small: padded taps (shim avx2 kernel)";

// Why this path cannot compute the problem ("float16 is computed by the primitive ..."), or
// nullptr when it can: float32 FORWARD with activation NONE, RELU, LEAKY_RELU or CLIP (the
// ones it applies exactly as oneDNN's eltwise post-ops do). The problem has passed the
// shim's checks (check_problem).
const char* im2col_gemm_refusal(const FDNN_Conv_Plan_Create_Args& a);

// How y is written by the product of one (image, group).
enum class OutputMode {
  kRowsK,   // y[k][p] is a row-major matrix (NCHW-like) and beta == 0: sgemm writes y, the
            // epilogue (bias, alpha, activation) runs in place
  kStaged,  // any other y (channels-last, odd strides) or beta != 0: the product goes to the
            // workspace and the epilogue writes y through its strides
};

// A plan of this path: the problem as 3 spatial dims (rank 1 and 2 padded in front with
// size-1 dims), strides in elements, and where each buffer lies in the workspace.
struct Im2colGemm {
  int64_t images = 1, groups = 1, group_in = 1, group_out = 1;  // N, g, C/g, K/g
  int64_t in[3] = {1, 1, 1}, kernel[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1}, pad_lo[3] = {0, 0, 0};
  int64_t x_n = 0, x_c = 0, x_s[3] = {0, 0, 0};
  int64_t w_k = 0, w_c = 0, w_s[3] = {0, 0, 0};
  int64_t y_n = 0, y_k = 0, y_s[3] = {0, 0, 0};
  bool has_bias = false;
  int64_t bias_stride = 0;
  int64_t rows = 1;    // R = C/g * prod(kernel): the reduction, im2col's rows
  int64_t pixels = 1;  // P = prod(out): im2col's columns

  // x read as the R x P matrix directly (1x1, stride 1, unpadded), not through im2col:
  // transposed ('T') when it is stored pixel-major (channels-last).
  bool im2col = true;
  // im2col reads a zero-padded dense copy of x (padded_source), so that every row of the
  // matrix is a plain copy with no bounds: dims `span` (what the taps read along each dim)
  // per channel. Taken unless that copy would be much larger than the matrix (strides far
  // above the kernel extent).
  bool padded_source = false;
  int64_t span[3] = {1, 1, 1};
  int64_t source_pitch = 0;  // floats per channel of the padded copy
  // Stride 1 along dims 1 and 2 and one output plane along dim 0 (1-D and 2-D problems): the
  // product runs over span[2] columns per output row, not out[2] (the extra ones are
  // discarded by the epilogue), so that each im2col row is one run of the padded copy.
  bool wide = false;
  int64_t wide_pixels = 0;  // out[1] * span[2]: the product's columns in wide mode
  // Where row (c, k0, k1, k2) of the im2col matrix starts in the padded copy (padded_source
  // only): that tap's first input, in floats from the copy's start.
  std::vector<int64_t> tap_offsets;
  char x_trans = 'N';
  int64_t x_ld = 0;
  // The weights as the K x R row-major matrix with leading dimension w_ld, else copied.
  bool w_matrix = false;
  int64_t w_ld = 0;
  std::shared_ptr<float> packed_w;  // Conv_Plan_Pack_Weights: dense K x R, used instead of w
  OutputMode mode = OutputMode::kStaged;
  int64_t y_ld = 0;

  // The per-call copies and the plain epilogue run their AVX2 kernels (x86-64 where oneDNN's
  // effective instruction set includes AVX2), else the baseline ones; same results either way.
  bool avx2 = false;
  // Wide mode with the AVX2 kernels: the product reads the padded copy itself, row k of the
  // im2col matrix being the run at tap_offsets[k] (tap_product_avx2), so neither im2col nor
  // dnnl_sgemm runs. See README.md ("The small-problem path").
  bool taps() const { return wide && avx2; }

  float alpha = 1.f, beta = 0.f;
  int32_t activation = FDNN_ACTIVATION_NONE;
  float activation_alpha = 0.f, activation_beta = 0.f;

  size_t col_offset = 0, w_offset = 0, stage_offset = 0, source_offset = 0;  // workspace bytes
  size_t workspace_size = 0;
};

// The name a plan of this path reports (kSgemmPlanName or kTapsPlanName).
const char* small_plan_name(const Im2colGemm& g);

// The plan of this path for a problem im2col_gemm_refusal accepts.
std::shared_ptr<const Im2colGemm> make_im2col_gemm(const FDNN_Conv_Plan_Create_Args& a);

// A copy of `g` that reads its own dense copy of the weights `w` (laid out as at plan time).
std::shared_ptr<const Im2colGemm> pack_im2col_gemm(const Im2colGemm& g, const void* w);

// Computes the convolution: pointers are x, w, y, bias (the caller's, as described at plan
// time; w unused when packed, bias unused without one); workspace holds workspace_size bytes.
// Throws fdnn_shim::Failure (VENDOR) if dnnl_sgemm refuses.
void run_im2col_gemm(const Im2colGemm& g, void* const pointers[4], char* workspace);

}  // namespace fdnn_onednn
