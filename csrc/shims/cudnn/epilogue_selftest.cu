// The index math of epilogue.cu, checked on the CPU (no GPU needed): for tensors in NCHW,
// NHWC, with gaps, permuted, with size-1 dims, 1-D and 3-D,
//  - the bias/activation walk (flatten + offset_of, 32- and 64-bit) visits every element
//    exactly once with its channel, and dense NCHW/NHWC in memory order (coalesced);
//  - the bias gradient's per-thread shares (rows_thread_sum / inner_thread_sum, the code the
//    kernels run) over every chunk and lane add up to each channel's sum, counting each
//    element once, with one chunk and with as many as the scratch holds;
//  - the staging copies (copy_offsets, in the dims order the launch uses): a zero-padded
//    copy of a view with gaps into a compact buffer, and the crop back out of it into a
//    view, every element once, padding zero, nothing between the view's elements written;
//  - the epilogue's arithmetic (epilogue_value, the kernel's own code): the header's
//    y = alpha * act(conv + bias) + beta * y, alpha after activations that do not commute
//    with it, negative and fractional alpha, beta 0 and 1.
// Not part of the shim: tests/test_cudnn.py compiles it with nvcc and runs it.
//   nvcc -std=c++17 -I csrc/include -o selftest csrc/shims/cudnn/epilogue_selftest.cu
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "epilogue.cu"

namespace {

using fdnn_cudnn::StridedTensor;

int failures = 0;

void expect(bool ok, const char* what, const char* name) {
  if (!ok) {
    std::printf("FAILED %s: %s\n", name, what);
    ++failures;
  }
}

struct Case {
  const char* name;
  std::vector<int64_t> shape, strides;
  bool dense_memory_order;  // compact: the walk must be offsets 0, 1, 2, ...
};

StridedTensor strided(const Case& c) {
  StridedTensor t;
  t.ndim = static_cast<int>(c.shape.size());
  for (int d = 0; d < t.ndim; ++d) {
    t.shape[d] = c.shape[d];
    t.strides[d] = c.strides[d];
  }
  return t;
}

// (offset, channel) of every logical element, counted.
std::map<std::pair<int64_t, int64_t>, int> logical_elements(const Case& c) {
  std::map<std::pair<int64_t, int64_t>, int> out;
  int64_t count = 1;
  for (int64_t s : c.shape) count *= s;
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, offset = 0, channel = 0;
    for (int d = static_cast<int>(c.shape.size()) - 1; d >= 0; --d) {
      int64_t index = rest % c.shape[d];
      rest /= c.shape[d];
      offset += index * c.strides[d];
      if (d == 1) channel = index;
    }
    ++out[{offset, channel}];
  }
  return out;
}

template <class Index>
void check_walk(const Case& c) {
  StridedTensor t = strided(c);
  fdnn_cudnn::FlatTensor f = fdnn_cudnn::flatten(t, true);
  int64_t count = fdnn_cudnn::element_count(t);
  std::map<std::pair<int64_t, int64_t>, int> seen;
  bool in_order = true;
  for (int64_t i = 0; i < count; ++i) {
    Index channel = 0;
    Index offset = fdnn_cudnn::offset_of<Index>(f, static_cast<Index>(i), &channel);
    ++seen[{static_cast<int64_t>(offset), static_cast<int64_t>(channel)}];
    in_order &= static_cast<int64_t>(offset) == i;
  }
  expect(seen == logical_elements(c), "the walk visits every element once with its channel",
         c.name);
  if (c.dense_memory_order) expect(in_order, "a dense tensor is walked in memory order", c.name);
}

int64_t span(const Case& c) {
  int64_t last = 0;
  for (size_t d = 0; d < c.shape.size(); ++d) last += (c.shape[d] - 1) * c.strides[d];
  return last + 1;
}

// Each channel's sum from the kernels' per-thread shares, in the kernels' order.
std::vector<double> gradient_by_threads(const fdnn_cudnn::BiasGradShape& s,
                                        const std::vector<double>& dy) {
  std::vector<double> db(static_cast<size_t>(s.channels), 0.0);
  for (int64_t k = 0; k < s.channels; ++k)
    for (int64_t chunk = 0; chunk < s.chunks; ++chunk) {
      bool rows = fdnn_cudnn::channels_last(s);
      int lanes = rows ? fdnn_cudnn::kRows : fdnn_cudnn::kGradThreads;
      for (int lane = 0; lane < lanes; ++lane)
        db[static_cast<size_t>(k)] +=
            rows ? fdnn_cudnn::rows_thread_sum<double, int64_t>(s, dy.data(), k, chunk, lane)
                 : fdnn_cudnn::inner_thread_sum<double, int64_t>(s, dy.data(), k, chunk, lane);
    }
  return db;
}

std::vector<double> gradient_directly(const Case& c, const std::vector<double>& dy) {
  std::vector<double> db(static_cast<size_t>(c.shape[1]), 0.0);
  int64_t count = 1;
  for (int64_t s : c.shape) count *= s;
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, offset = 0, channel = 0;
    for (int d = static_cast<int>(c.shape.size()) - 1; d >= 0; --d) {
      int64_t index = rest % c.shape[d];
      rest /= c.shape[d];
      offset += index * c.strides[d];
      if (d == 1) channel = index;
    }
    db[static_cast<size_t>(channel)] += dy[static_cast<size_t>(offset)];
  }
  return db;
}

void check_bias_gradient(const Case& c, std::mt19937& random) {
  fdnn_cudnn::BiasGradShape s = fdnn_cudnn::bias_grad_shape(strided(c));
  std::vector<double> ones(static_cast<size_t>(span(c)), 1.0), values(ones.size());
  std::uniform_int_distribution<int> draw(-8, 8);
  for (double& v : values) v = draw(random);
  size_t ideal_bytes = static_cast<size_t>(fdnn_cudnn::ideal_chunks(s) * s.channels) * 4;
  for (size_t scratch : {size_t(0), ideal_bytes, ideal_bytes / 2}) {
    s.chunks = fdnn_cudnn::chunks_within(s, scratch, 4);
    expect(s.chunks >= 1 && static_cast<size_t>(s.chunks * s.channels) * 4 <= (s.chunks > 1 ? scratch : SIZE_MAX),
           "chunks fit the scratch", c.name);
    expect(gradient_by_threads(s, ones) == gradient_directly(c, ones),
           "every element of a channel is counted once", c.name);
    expect(gradient_by_threads(s, values) == gradient_directly(c, values),
           "the per-thread shares add up to each channel's sum", c.name);
  }
}

// A copy run on the CPU as the kernel runs it (beta 0): dst[to] = src[from] or 0.
void run_copy(const fdnn_cudnn::StridedCopy& given, const std::vector<double>& src,
              std::vector<double>* dst, std::vector<int>* writes) {
  fdnn_cudnn::StridedCopy c = fdnn_cudnn::in_dst_order(given);
  int64_t count = fdnn_cudnn::element_count(c.dst);
  for (int64_t i = 0; i < count; ++i) {
    int64_t to = 0, from = 0;
    bool inside = fdnn_cudnn::copy_offsets<uint32_t>(c, static_cast<uint32_t>(i), &to, &from);
    (*dst)[static_cast<size_t>(to)] = inside ? src[static_cast<size_t>(from)] : 0.0;
    ++(*writes)[static_cast<size_t>(to)];
  }
}

fdnn_cudnn::StridedTensor tensor(std::vector<int64_t> shape, std::vector<int64_t> strides) {
  return strided(Case{"", shape, strides, false});
}

// x (2, 3, 4, 5) NHWC with gaps in W, padded by (2 before, 0 after) in H and (0, 1) in W
// into a compact NCHW buffer (2, 3, 6, 6), then cropped back into a fresh view.
void check_pad_and_crop() {
  const char* name = "pad copy and crop";
  std::vector<int64_t> shape{2, 3, 4, 5}, view_strides{120, 1, 30, 6};  // W stride 6: gaps
  std::vector<int64_t> padded{2, 3, 6, 6}, compact{108, 36, 6, 1}, lead{0, 0, 2, 0};
  std::vector<double> x(240);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i) + 1;
  fdnn_cudnn::StridedCopy in;
  in.dst = tensor(padded, compact);
  in.src = tensor(shape, view_strides);
  for (int d = 0; d < 4; ++d) in.lead[d] = lead[static_cast<size_t>(d)];
  std::vector<double> buffer(216, -1.0);
  std::vector<int> writes(216, 0);
  run_copy(in, x, &buffer, &writes);
  bool every_once = true, right = true;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t h = 0; h < 6; ++h)
        for (int64_t w = 0; w < 6; ++w) {
          size_t at = static_cast<size_t>(n * 108 + c * 36 + h * 6 + w);
          every_once &= writes[at] == 1;
          bool inside = h >= 2 && w < 5;
          double want = inside ? x[static_cast<size_t>(n * 120 + c + (h - 2) * 30 + w * 6)] : 0.0;
          right &= buffer[at] == want;
        }
  expect(every_once, "the padded copy writes every element once", name);
  expect(right, "the padded copy holds x at lead and zeros around it", name);
  fdnn_cudnn::StridedCopy out;
  out.dst = tensor(shape, view_strides);
  out.src = tensor(padded, compact);
  for (int d = 0; d < 4; ++d) out.lead[d] = -lead[static_cast<size_t>(d)];
  std::vector<double> back(240, -7.0);
  std::vector<int> back_writes(240, 0);
  run_copy(out, buffer, &back, &back_writes);
  bool cropped = true, untouched = true;
  for (size_t i = 0; i < back.size(); ++i) {
    bool element = (i % 30) % 6 < 3;  // offset c + 6 w (+ 30 h + 120 n) with c < 3
    if (element) cropped &= back_writes[i] == 1 && back[i] == x[i];
    else untouched &= back_writes[i] == 0 && back[i] == -7.0;
  }
  expect(cropped, "the crop brings every element back once", name);
  expect(untouched, "nothing between a view's elements is written", name);
}

// The header's meaning in double, written out here: alpha * act(raw + bias) + beta * old.
double header_epilogue(int32_t act, double raw, double bias, double alpha, double beta,
                       double old) {
  double v = raw + bias;
  switch (act) {
    case FDNN_ACTIVATION_SIGMOID: v = 1 / (1 + std::exp(-v)); break;
    case FDNN_ACTIVATION_TANH: v = std::tanh(v); break;
    case FDNN_ACTIVATION_SILU: v = v / (1 + std::exp(-v)); break;
    case FDNN_ACTIVATION_RELU: v = v < 0 ? 0 : v; break;
    default: break;
  }
  return alpha * v + beta * old;
}

// epilogue_value as the shim sets it up (cudnn_shim.cpp's alpha_in_conv: only without an
// activation has cuDNN scaled the convolution by alpha), against header_epilogue.
void check_epilogue_order() {
  const int32_t acts[] = {FDNN_ACTIVATION_NONE, FDNN_ACTIVATION_RELU, FDNN_ACTIVATION_SIGMOID,
                          FDNN_ACTIVATION_TANH, FDNN_ACTIVATION_SILU};
  const double alphas[] = {1.0, 0.5, -1.5}, betas[] = {0.0, 1.0};
  const double raws[] = {-2.25, -0.5, 0.0, 0.75, 3.0};
  for (int32_t act : acts)
    for (double alpha : alphas)
      for (double beta : betas)
        for (double raw : raws) {
          fdnn_cudnn::EpilogueParams p;
          p.type = fdnn_cudnn::ElementType::kDouble;
          p.alpha = alpha;
          p.beta = beta;
          p.activation = act;
          p.alpha_in_conv = act == FDNN_ACTIVATION_NONE;
          const double conv = p.alpha_in_conv ? alpha * raw : raw;  // as cuDNN wrote it
          const double got = fdnn_cudnn::epilogue_value<double>(p, conv, true, 0.25, 0.5);
          const double want = header_epilogue(act, raw, 0.25, alpha, beta, 0.5);
          expect(std::fabs(got - want) <= 1e-12 * (1 + std::fabs(want)),
                 "alpha * act(conv + bias) + beta * y", "epilogue_value");
        }
}

}  // namespace

int main() {
  const std::vector<Case> cases = {
      {"NCHW dense", {2, 3, 4, 5}, {60, 20, 5, 1}, true},
      {"NHWC dense", {2, 3, 4, 5}, {60, 1, 15, 3}, true},
      {"NCHW with gaps", {2, 3, 4, 5}, {200, 40, 8, 1}, false},
      {"NCWH (permuted spatial)", {2, 3, 4, 5}, {60, 20, 1, 4}, false},
      {"CNHW (channel outermost)", {2, 3, 4, 5}, {20, 40, 5, 1}, true},
      {"NHWC with C=1", {2, 1, 4, 5}, {20, 1, 5, 1}, true},
      {"NCHW with C=1", {2, 1, 4, 5}, {20, 20, 5, 1}, true},
      {"NHWC with W=1", {2, 3, 4, 1}, {12, 1, 3, 3}, true},
      {"NHWC with H=W=1", {2, 3, 1, 1}, {3, 1, 3, 3}, true},
      {"N=1 NHWC", {1, 6, 3, 2}, {36, 1, 12, 6}, true},
      {"NWC 1-D", {2, 3, 7}, {21, 1, 3}, true},
      {"NDHWC 3-D", {2, 3, 2, 3, 4}, {72, 1, 36, 12, 3}, true},
      {"NCDHW 3-D", {2, 3, 2, 3, 4}, {72, 24, 12, 4, 1}, true},
      {"NHWC, many chunks", {8, 40, 30, 30}, {36000, 1, 1200, 40}, true},
      {"NCHW, many chunks", {16, 4, 64, 64}, {16384, 4096, 64, 1}, true},
      {"NHWC, channels over 32", {2, 70, 3, 3}, {630, 1, 210, 70}, true},
  };
  std::mt19937 random(12);
  for (const Case& c : cases) {
    check_walk<uint32_t>(c);
    check_walk<int64_t>(c);
    check_bias_gradient(c, random);
  }
  for (size_t i : {size_t(13), size_t(14)}) {
    fdnn_cudnn::BiasGradShape big = fdnn_cudnn::bias_grad_shape(strided(cases[i]));
    expect(fdnn_cudnn::ideal_chunks(big) > 1, "a large gradient is split into chunks", cases[i].name);
  }
  check_pad_and_crop();
  check_epilogue_order();
  std::printf("%s: %zu layouts, %d failures\n", failures ? "FAILED" : "ok", cases.size(), failures);
  return failures ? 1 : 0;
}
