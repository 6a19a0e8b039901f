// What the cuDNN shim decides on the host before any cuDNN call, checked on the CPU (no GPU,
// no cuDNN library; its headers only):
//  - the workspace layout never exceeds the limit, its parts are 256-byte aligned and do not
//    overlap (workspace.hpp), at every limit and engine workspace around the boundaries;
//  - read_problem's memory order: channels-last seen with one channel (from y) or width 1,
//    size-1 dims given canonical strides, w staged only when its order differs from x's,
//    and the no-scratch variant giving cuDNN the caller's w.
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

void check_workspace_layouts() {
  int checked = 0;
  for (size_t limit : {size_t(0), size_t(1), size_t(255), size_t(256), size_t(1000),
                       size_t(4096), size_t(70000), SIZE_MAX}) {
    for (size_t conv_result : {size_t(0), size_t(256), size_t(512)}) {
      for (size_t w_staged : {size_t(0), size_t(256), size_t(768)}) {
        ExtraWorkspace extra{conv_result, w_staged};
        if (extra.total() > limit) continue;  // fit_extra_workspace refuses or unstages first
        size_t budget = shared_budget(limit, extra);
        std::vector<size_t> engines = {0, 1, 255, 256, 300, 4095};
        if (budget != SIZE_MAX) engines.push_back(budget);
        for (size_t cudnn_bytes : engines) {
          if (cudnn_bytes > budget) continue;  // the engine is refused at plan time
          for (size_t partials : {size_t(0), size_t(64), size_t(100000)}) {
            WorkspaceLayout l = lay_out(limit, cudnn_bytes, partials, extra);
            ++checked;
            expect(l.total <= limit, "workspace_size within workspace_limit");
            expect(l.bias_grad <= partials && l.bias_grad <= budget, "partials within budget");
            expect(l.scratch_offset >= cudnn_bytes && l.scratch_offset >= l.bias_grad,
                   "our parts after cuDNN's and the partials");
            expect(extra.total() == 0 || l.scratch_offset % kWorkspaceAlign == 0,
                   "our parts 256-byte aligned");
            expect(l.w_stage_offset == l.scratch_offset + conv_result, "parts do not overlap");
            expect(l.total == l.w_stage_offset + w_staged, "the total covers every part");
          }
        }
      }
    }
  }
  // The case the review found: 300 bytes of cuDNN's + a 512-byte staged w under a limit of
  // 1000 used to be accepted (300 <= 1000 - 512) and laid out as 512 + 512 = 1024 bytes.
  expect(shared_budget(1000, ExtraWorkspace{0, 512}) < 300, "300 bytes refused under 1000");
  std::printf("workspace: %d layouts\n", checked);
}

// A tensor descriptor whose arrays live in the test.
struct Tensor {
  std::vector<int64_t> shape, strides;
  FDNN_DLTensor t{};
  Tensor(std::vector<int64_t> sh, std::vector<int64_t> st) : shape(sh), strides(st) {
    t.device = {FDNN_DEVICE_CUDA, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = {FDNN_DTYPE_FLOAT, 32, 1};
    t.shape = shape.data();
    t.strides = strides.data();
  }
};

ConvProblem problem(const Tensor& x, const Tensor& w, const Tensor& y, int64_t pad) {
  static const Tensor no_bias({}, {});
  FDNN_Conv_Plan_Create_Args a{};
  a.struct_size = sizeof a;
  a.op = FDNN_CONV_FORWARD;
  a.spatial_rank = static_cast<int32_t>(x.shape.size()) - 2;
  a.x = &x.t;
  a.w = &w.t;
  a.y = &y.t;
  FDNN_DLTensor none{};
  a.bias = &none;
  for (int i = 0; i < a.spatial_rank; ++i) {
    a.stride[i] = a.dilation[i] = 1;
    a.padding_lo[i] = a.padding_hi[i] = pad;
  }
  a.groups = 1;
  a.alpha = 1.f;
  a.workspace_limit = SIZE_MAX;
  return read_problem(a);
}

void check_memory_orders() {
  // An NHWC model's first layer on one-channel images: x (N, 1, H, W) says nothing, y does.
  {
    Tensor x({2, 1, 8, 8}, {64, 1, 8, 1}), w({16, 1, 3, 3}, {9, 9, 3, 1});
    Tensor y({2, 16, 8, 8}, {1024, 1, 128, 16});
    ConvProblem p = problem(x, w, y, 1);
    expect(p.x_channels_last, "C=1 x of an NHWC model is channels-last (from y)");
    expect(!p.stage_w, "C=1: w (K,1,R,S) is the same memory in either order: not staged");
  }
  {
    Tensor x({2, 1, 8, 8}, {64, 64, 8, 1}), w({16, 1, 3, 3}, {9, 9, 3, 1});
    Tensor y({2, 16, 8, 8}, {1024, 64, 8, 1});
    expect(!problem(x, w, y, 1).x_channels_last, "C=1 x of an NCHW model is channels-first");
  }
  // Width 1: (N, C, H, 1) in NHWC strides is channels-last (it was not: the innermost dim
  // had to be above 1), so an NHWC w is used as it is.
  {
    Tensor x({2, 8, 12, 1}, {96, 1, 8, 8}), w({4, 8, 3, 1}, {24, 1, 8, 8});
    Tensor y({2, 4, 12, 1}, {48, 1, 4, 4});
    ConvProblem p = problem(x, w, y, 0);
    expect(p.x_channels_last, "W=1 NHWC x is channels-last");
    expect(!p.stage_w, "W=1: an NHWC w is not staged");
  }
  // Size-1 dims carry odd strides (DLPack producers differ): written canonically.
  {
    Tensor x({1, 3, 1, 5}, {-7, 5, 999, 1}), w({2, 3, 1, 1}, {3, 1, 0, 123});
    Tensor y({1, 2, 1, 5}, {0, 5, 42, 1});
    ConvProblem p = problem(x, w, y, 0);
    expect(p.x.strides == std::vector<int64_t>({15, 5, 5, 1}), "x's size-1 strides canonical");
    expect(p.y.strides == std::vector<int64_t>({10, 5, 5, 1}), "y's size-1 strides canonical");
    expect(p.w.strides == std::vector<int64_t>({3, 1, 1, 1}), "w's size-1 strides canonical");
    expect(!p.stage_w, "w (K, C, 1, 1) compact: not staged");
  }
  // NHWC x with an NCHW w: staged into KRSC; the no-scratch variant gives cuDNN w as it is.
  {
    Tensor x({2, 4, 6, 6}, {144, 1, 24, 4}), w({8, 4, 3, 3}, {36, 9, 3, 1});
    Tensor y({2, 8, 6, 6}, {288, 1, 48, 8});
    ConvProblem p = problem(x, w, y, 1);
    expect(p.stage_w, "NCHW w under NHWC x is staged");
    expect(p.w.strides == std::vector<int64_t>({36, 1, 12, 4}), "staged w is KRSC");
    use_w_unstaged(&p);
    expect(!p.stage_w && p.w.strides == std::vector<int64_t>({36, 9, 3, 1}),
           "unstaged: cuDNN gets the caller's w");
  }
  // 1-D channels-last gets its unit height outside the width.
  {
    Tensor x({2, 4, 10}, {40, 1, 4}), w({3, 4, 3}, {12, 1, 4}), y({2, 3, 10}, {30, 1, 3});
    ConvProblem p = problem(x, w, y, 1);
    expect(p.x_channels_last && !p.stage_w, "NWC 1-D is channels-last, its w not staged");
    expect(p.x.strides == std::vector<int64_t>({40, 1, 40, 4}), "1-D: unit height added");
  }
}

}  // namespace

int main() {
  check_workspace_layouts();
  check_memory_orders();
  std::printf("%s: %d failures\n", failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
