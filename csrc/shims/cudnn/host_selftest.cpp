// What the cuDNN shim decides on the host before any cuDNN call, checked on the CPU (no GPU,
// no cuDNN library; its headers only):
//  - the workspace layout never exceeds the limit, its parts are 256-byte aligned and do not
//    overlap (workspace.hpp), at every limit and engine workspace around the boundaries;
//  - read_problem's memory order: channels-last seen with one channel (from y) or width 1,
//    size-1 dims given canonical strides, w staged only when its order differs from x's,
//    and the no-scratch variant giving cuDNN the caller's w;
//  - the staged problem (stage_for_fallback): x zero-padded by the difference of asymmetric
//    paddings (dx cropped out of such a buffer) with cuDNN padding min(lo, hi), views with
//    gaps and repeated elements (stride 0) copied compactly in their own order, nothing
//    staged that cuDNN could take as it is; alignment per tensor.
// Not part of the shim: tests/test_cudnn.py compiles it with the host compiler and runs it.
#include <cstdio>
#include <vector>

#include "problem.hpp"
#include "workspace.hpp"

namespace {

using namespace fdnn_cudnn;

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

void check_layout(size_t limit, size_t cudnn_bytes, size_t partials, const ExtraWorkspace& extra) {
  WorkspaceLayout l = lay_out(limit, cudnn_bytes, partials, extra);
  expect(l.total <= limit, "workspace_size within workspace_limit");
  expect(l.bias_grad <= partials && l.bias_grad <= shared_budget(limit, extra),
         "partials within budget");
  expect(l.scratch_offset >= cudnn_bytes && l.scratch_offset >= l.bias_grad,
         "our parts after cuDNN's and the partials");
  expect(extra.total() == 0 || l.scratch_offset % kWorkspaceAlign == 0,
         "our parts 256-byte aligned");
  // [scratch_offset, +conv_result) then each staged copy, in order, none overlapping
  size_t end = l.scratch_offset + extra.conv_result;
  for (int r = 0; r < kRoles; ++r) {
    expect(l.stage_offset[r] == end, "staged copies follow each other without overlap");
    expect(l.stage_offset[r] % kWorkspaceAlign == 0 || extra.total() == 0,
           "each staged copy 256-byte aligned");
    end += extra.staged[r];
  }
  expect(l.total == end, "the total covers every part");
}

void check_workspace_layouts() {
  int checked = 0;
  const size_t sizes[] = {0, 256, 768};
  for (size_t limit : {size_t(0), size_t(1), size_t(255), size_t(256), size_t(1000),
                       size_t(4096), size_t(70000), SIZE_MAX}) {
    for (size_t conv_result : {size_t(0), size_t(256), size_t(512)}) {
      for (size_t x : sizes) {
        for (size_t w : sizes) {
          for (size_t y : {size_t(0), size_t(512)}) {
            ExtraWorkspace extra{conv_result, {x, w, y}};
            if (extra.total() > limit) continue;  // fit_extra_workspace refuses or unstages first
            size_t budget = shared_budget(limit, extra);
            std::vector<size_t> engines = {0, 1, 255, 256, 300, 4095};
            if (budget != SIZE_MAX) engines.push_back(budget);
            for (size_t cudnn_bytes : engines) {
              if (cudnn_bytes > budget) continue;  // the engine is refused at plan time
              for (size_t partials : {size_t(0), size_t(64), size_t(100000)}) {
                check_layout(limit, cudnn_bytes, partials, extra);
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  // The case the review found: 300 bytes of cuDNN's + a 512-byte staged w under a limit of
  // 1000 used to be accepted (300 <= 1000 - 512) and laid out as 512 + 512 = 1024 bytes.
  expect(shared_budget(1000, ExtraWorkspace{0, {0, 512, 0}}) < 300,
         "300 bytes refused under 1000");
  std::printf("workspace: %d layouts\n", checked);
}

// A tensor descriptor whose arrays live in the test.
struct Tensor {
  std::vector<int64_t> shape, strides;
  FDNN_DLTensor t{};
  Tensor(std::vector<int64_t> sh, std::vector<int64_t> st, uintptr_t address = 0)
      : shape(sh), strides(st) {
    t.device = {FDNN_DEVICE_CUDA, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = {FDNN_DTYPE_FLOAT, 32, 1};
    t.shape = shape.data();
    t.strides = strides.data();
    t.data = reinterpret_cast<void*>(address);
  }
};

ConvProblem problem(const Tensor& x, const Tensor& w, const Tensor& y, int64_t pad,
                    int32_t op = FDNN_CONV_FORWARD, std::vector<int64_t> lo = {},
                    std::vector<int64_t> hi = {}) {
  FDNN_Conv_Plan_Create_Args a{};
  a.struct_size = sizeof a;
  a.op = op;
  a.spatial_rank = static_cast<int32_t>(x.shape.size()) - 2;
  a.x = &x.t;
  a.w = &w.t;
  a.y = &y.t;
  FDNN_DLTensor none{};
  a.bias = &none;
  for (int i = 0; i < a.spatial_rank; ++i) {
    a.stride[i] = a.dilation[i] = 1;
    a.padding_lo[i] = lo.empty() ? pad : lo[static_cast<size_t>(i)];
    a.padding_hi[i] = hi.empty() ? pad : hi[static_cast<size_t>(i)];
  }
  a.groups = 1;
  a.alpha = 1.f;
  a.workspace_limit = SIZE_MAX;
  return read_problem(a);
}

using V = std::vector<int64_t>;

void check_memory_orders() {
  // An NHWC model's first layer on one-channel images: x (N, 1, H, W) says nothing, y does.
  {
    Tensor x({2, 1, 8, 8}, {64, 1, 8, 1}), w({16, 1, 3, 3}, {9, 9, 3, 1});
    Tensor y({2, 16, 8, 8}, {1024, 1, 128, 16});
    ConvProblem p = problem(x, w, y, 1);
    expect(p.x.channels_last, "C=1 x of an NHWC model is channels-last (from y)");
    expect(!p.w.staged, "C=1: w (K,1,R,S) is the same memory in either order: not staged");
  }
  {
    Tensor x({2, 1, 8, 8}, {64, 64, 8, 1}), w({16, 1, 3, 3}, {9, 9, 3, 1});
    Tensor y({2, 16, 8, 8}, {1024, 64, 8, 1});
    expect(!problem(x, w, y, 1).x.channels_last, "C=1 x of an NCHW model is channels-first");
  }
  // Width 1: (N, C, H, 1) in NHWC strides is channels-last (it was not: the innermost dim
  // had to be above 1), so an NHWC w is used as it is.
  {
    Tensor x({2, 8, 12, 1}, {96, 1, 8, 8}), w({4, 8, 3, 1}, {24, 1, 8, 8});
    Tensor y({2, 4, 12, 1}, {48, 1, 4, 4});
    ConvProblem p = problem(x, w, y, 0);
    expect(p.x.channels_last, "W=1 NHWC x is channels-last");
    expect(!p.w.staged, "W=1: an NHWC w is not staged");
  }
  // Size-1 dims carry odd strides (DLPack producers differ): written canonically.
  {
    Tensor x({1, 3, 1, 5}, {-7, 5, 999, 1}), w({2, 3, 1, 1}, {3, 1, 0, 123});
    Tensor y({1, 2, 1, 5}, {0, 5, 42, 1});
    ConvProblem p = problem(x, w, y, 0);
    expect(p.x.cudnn.strides == std::vector<int64_t>({15, 5, 5, 1}), "x's size-1 strides canonical");
    expect(p.y.cudnn.strides == std::vector<int64_t>({10, 5, 5, 1}), "y's size-1 strides canonical");
    expect(p.w.cudnn.strides == std::vector<int64_t>({3, 1, 1, 1}), "w's size-1 strides canonical");
    expect(!p.w.staged, "w (K, C, 1, 1) compact: not staged");
  }
  // NHWC x with an NCHW w: staged into KRSC; the no-scratch variant gives cuDNN w as it is.
  {
    Tensor x({2, 4, 6, 6}, {144, 1, 24, 4}), w({8, 4, 3, 3}, {36, 9, 3, 1});
    Tensor y({2, 8, 6, 6}, {288, 1, 48, 8});
    ConvProblem p = problem(x, w, y, 1);
    expect(p.w.staged, "NCHW w under NHWC x is staged");
    expect(p.w.cudnn.strides == std::vector<int64_t>({36, 1, 12, 4}), "staged w is KRSC");
    expect(use_w_unstaged(&p), "a w with positive strides can be unstaged");
    expect(!p.w.staged && p.w.cudnn.strides == std::vector<int64_t>({36, 9, 3, 1}),
           "unstaged: cuDNN gets the caller's w");
  }
  // 1-D channels-last gets its unit height outside the width.
  {
    Tensor x({2, 4, 10}, {40, 1, 4}), w({3, 4, 3}, {12, 1, 4}), y({2, 3, 10}, {30, 1, 3});
    ConvProblem p = problem(x, w, y, 1);
    expect(p.x.channels_last && !p.w.staged, "NWC 1-D is channels-last, its w not staged");
    expect(p.x.cudnn.strides == std::vector<int64_t>({40, 1, 40, 4}), "1-D: unit height added");
  }
}

// The fallback the plan takes when cuDNN refuses the problem as given.
void check_staged_problems() {
  // Forward, NCHW, pre (2, 0) / post (0, 1): x grows by 2 rows before and 1 column after,
  // cuDNN pads 0 everywhere, and nothing else is staged.
  {
    Tensor x({2, 3, 8, 8}, {192, 64, 8, 1}), w({4, 3, 3, 3}, {27, 9, 3, 1});
    Tensor y({2, 4, 8, 7}, {224, 56, 7, 1});
    ConvProblem p = problem(x, w, y, 0, FDNN_CONV_FORWARD, {2, 0}, {0, 1});
    expect(!p.x.staged && p.pad_lo == V({2, 0}) && p.pad_hi == V({0, 1}),
           "as given: cuDNN gets the asymmetric padding itself");
    expect(stage_for_fallback(&p), "asymmetric padding: a staged problem");
    expect(p.x.staged && p.x.compact.shape == V({2, 3, 10, 9}), "x padded by the difference");
    expect(p.x.lead == V({0, 0, 2, 0}), "lo > hi: zeros before the data");
    expect(p.x.compact.strides == V({270, 90, 9, 1}), "padded x compact NCHW");
    expect(p.x.compact.span_bytes == 2u * 3 * 10 * 9 * 4, "padded x's bytes");
    expect(p.pad_lo == V({0, 0}) && p.pad_hi == V({0, 0}), "cuDNN pads min(lo, hi)");
    expect(p.x.cudnn.dims == V({2, 3, 10, 9}) && p.x.cudnn.alignment == 16,
           "the graph sees the padded copy");
    expect(!p.w.staged && !p.y.staged, "compact w and y stay the caller's");
    expect(staging_text(p) == "x (padded copy)", "the name says padded copy");
  }
  // Backward-data, 1-D NWC, pre 1 / post 3: dx computed into a buffer 2 wider at the end,
  // cuDNN pads 1 on both sides.
  {
    Tensor dx({2, 4, 10}, {40, 1, 4}), w({3, 4, 3}, {12, 1, 4}), dy({2, 3, 12}, {36, 1, 3});
    ConvProblem p = problem(dx, w, dy, 0, FDNN_CONV_BACKWARD_DATA, {1}, {3});
    expect(stage_for_fallback(&p), "1-D asymmetric backward-data is staged");
    expect(p.output_role() == Role::kX && p.x.staged, "dx computed into the workspace");
    expect(p.x.compact.shape == V({2, 4, 12}) && p.x.lead == V({0, 0, 0}),
           "hi > lo: the extra columns after the data");
    expect(p.x.compact.strides == V({48, 1, 4}), "padded dx stays NWC");
    expect(p.pad_lo == V({0, 1}) && p.pad_hi == V({0, 1}), "1-D: min padding after the unit H");
    expect(p.x.cudnn.dims == V({2, 4, 1, 12}), "1-D: unit height in the graph");
    expect(staging_text(p) == "dx (padded copy)", "named dx");
  }
  // Views with gaps: x (every other channel) and y (every other column) staged compactly in
  // their own order; symmetric padding untouched.
  {
    Tensor x({2, 3, 6, 6}, {432, 72, 12, 2}), w({4, 3, 3, 3}, {27, 9, 3, 1});
    Tensor y({2, 4, 6, 6}, {288, 72, 12, 2});
    ConvProblem p = problem(x, w, y, 1);
    expect(cudnn_can_take(p), "positive strides: cuDNN is asked first");
    expect(stage_for_fallback(&p), "gaps: a staged problem");
    expect(p.x.staged && p.x.compact.strides == V({108, 36, 6, 1}) && !p.x.padded(),
           "x compact NCHW");
    expect(p.y.staged && p.y.compact.strides == V({144, 36, 6, 1}), "y compact NCHW");
    expect(p.pad_lo == V({1, 1}) && p.pad_hi == V({1, 1}), "symmetric padding as given");
    expect(staging_text(p) == "x (compact copy), y (compact copy)", "named compact copies");
  }
  // Gaps in an NHWC dy of backward-weight: staged channels-last.
  {
    Tensor x({2, 4, 5, 5}, {100, 1, 20, 4}), dw({6, 4, 3, 3}, {36, 1, 12, 4});
    Tensor dy({2, 6, 5, 5}, {300, 1, 60, 12});
    ConvProblem p = problem(x, dw, dy, 1, FDNN_CONV_BACKWARD_WEIGHT);
    expect(stage_for_fallback(&p) && p.y.staged && !p.x.staged && !p.w.staged,
           "only the gapped dy is staged");
    expect(p.y.compact.strides == V({150, 1, 30, 6}), "dy compact NHWC");
  }
  // A repeated element (stride 0, allowed on what the op only reads): cuDNN cannot be given
  // it, so the staged problem is planned first; a repeated w is staged from the start and
  // cannot be unstaged.
  {
    Tensor x({2, 3, 6, 6}, {0, 36, 6, 1}), w({4, 3, 3, 3}, {0, 9, 3, 1});
    Tensor y({2, 4, 6, 6}, {144, 36, 6, 1});
    ConvProblem p = problem(x, w, y, 1);
    expect(!cudnn_can_take(p), "stride 0 on x: not for cuDNN as it is");
    expect(p.w.staged && p.w.compact.strides == V({27, 9, 3, 1}), "repeated w staged");
    ConvProblem unstaged = p;
    expect(!use_w_unstaged(&unstaged) && unstaged.w.staged, "repeated w stays staged");
    expect(stage_for_fallback(&p) && cudnn_can_take(p), "staged: cuDNN can take it");
    expect(p.x.compact.strides == V({108, 36, 6, 1}) && p.x.cudnn.strides == V({108, 36, 6, 1}),
           "repeated x copied compactly");
  }
  // Nothing cuDNN could take differently: no staged problem.
  {
    Tensor x({2, 3, 6, 6}, {108, 36, 6, 1}), w({4, 3, 3, 3}, {27, 9, 3, 1});
    Tensor y({2, 4, 6, 6}, {144, 36, 6, 1});
    ConvProblem p = problem(x, w, y, 1);
    expect(!stage_for_fallback(&p) && staging_text(p).empty(), "compact and symmetric: as is");
  }
  // Alignment per tensor: a 2-byte-off x does not lower w's or y's.
  {
    Tensor x({2, 3, 6, 6}, {108, 36, 6, 1}, 0x1004), w({4, 3, 3, 3}, {27, 9, 3, 1}, 0x2000);
    Tensor y({2, 4, 6, 6}, {144, 36, 6, 1}, 0x3008);
    ConvProblem p = problem(x, w, y, 1);
    expect(p.x.cudnn.alignment == 4 && p.w.cudnn.alignment == 16 && p.y.cudnn.alignment == 8,
           "each tensor its own alignment");
    expect(stage_for_fallback(&p) == false, "(nothing to stage)");
  }
}

}  // namespace

int main() {
  check_workspace_layouts();
  check_memory_orders();
  check_staged_problems();
  std::printf("%s: %d failures\n", failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
