// How the caller's workspace is shared between cuDNN and the shim's own scratch, as plain
// arithmetic (no cuDNN, no CUDA: host_selftest.cpp checks it on the CPU):
//   [shared: cuDNN's workspace, then (once the convolution is done) the bias gradient's
//    partial sums | conv result, when the epilogue needs y_old | staged x | staged w |
//    staged y]
// each part after the first at a 256-byte boundary, and never more than the limit. A staged
// operand is a compact copy the convolution reads (x zero-padded for asymmetric padding, w in
// x's memory order, a view with gaps or repeated elements) or writes (copied out after).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace fdnn_cudnn {

constexpr size_t kWorkspaceAlign = 256;
constexpr int kRoles = 3;  // x, w, y in the graph's roles (problem.hpp's Role)

inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
inline size_t round_down(size_t n, size_t a) { return n / a * a; }

// The shim's own parts after cuDNN's, each already a multiple of kWorkspaceAlign.
struct ExtraWorkspace {
  size_t conv_result = 0;          // the conv result, when the epilogue still needs y's old value
  size_t staged[kRoles] = {0, 0, 0};  // the compact copies of x, w, y (0: given as they are)
  size_t total() const { return conv_result + staged[0] + staged[1] + staged[2]; }
};

// Bytes cuDNN (and, after it, the bias-gradient partials) may use so that, with our parts
// after it at a 256-byte boundary, the whole stays within the limit: rounded down before
// the comparison, never up after it. The caller has checked extra.total() <= limit.
inline size_t shared_budget(size_t limit, const ExtraWorkspace& extra) {
  if (limit == SIZE_MAX) return SIZE_MAX;
  if (extra.total() == 0) return limit;  // nothing follows the shared part: no rounding
  return round_down(limit - extra.total(), kWorkspaceAlign);
}

struct WorkspaceLayout {
  size_t bias_grad = 0;               // bytes of bias-gradient partials at offset 0
  size_t scratch_offset = 0;          // the conv result
  size_t stage_offset[kRoles] = {};   // the staged x, w, y
  size_t total = 0;                   // what the plan reports as workspace_size
};

// cudnn_bytes: the chosen engine's workspace (within shared_budget); bias_grad_wanted: the
// partials that would fill the GPU (fewer, down to none, when the budget is smaller).
inline WorkspaceLayout lay_out(size_t limit, size_t cudnn_bytes, size_t bias_grad_wanted,
                               const ExtraWorkspace& extra) {
  WorkspaceLayout l;
  l.bias_grad = std::min(bias_grad_wanted, shared_budget(limit, extra));
  size_t shared = std::max(cudnn_bytes, l.bias_grad);
  l.scratch_offset = extra.total() > 0 ? round_up(shared, kWorkspaceAlign) : shared;
  size_t next = l.scratch_offset + extra.conv_result;
  for (int r = 0; r < kRoles; ++r) {
    l.stage_offset[r] = next;
    next += extra.staged[r];
  }
  l.total = next;
  return l;
}

}  // namespace fdnn_cudnn
