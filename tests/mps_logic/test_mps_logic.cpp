// Unit tests of the MPS shim's platform-independent decisions (csrc/shims/mps/mps_problem.*):
// capabilities per macOS version, the refusals of problems MPSGraph gets wrong (PyTorch's
// guards: 2-D forward filter dims >= 256, dims > 65536 of y / dy before macOS 15.1), when a
// 16-bit convolution runs in float32 (one rounding), 1-D as 2-D, padding per side, layouts
// (NHWC on forward only), dense/gapped tensors and their gather indices, bindings (a written dw
// at an offset staged), the 4 GiB MPSNDArray limit, the Metal device choice and staging sizes. Built and run by tests/test_mps_logic.py (and .ci/mps.sh) with the host C++
// compiler: no Apple SDK is involved. Prints one line per failed check; exits 1 if any.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mps_problem.hpp"

using namespace fdnn_mps;

namespace {

int failures = 0;
int checks = 0;

#define CHECK(cond)                                                       \
  do {                                                                    \
    ++checks;                                                             \
    if (!(cond)) {                                                        \
      ++failures;                                                         \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);         \
    }                                                                     \
  } while (0)

const OsVersion kMac13_0{13, 0}, kMac13_1{13, 1}, kMac13_2{13, 2}, kMac14{14, 0}, kMac15_0{15, 0},
    kMac15_1{15, 1}, kMac12{12, 6};

constexpr FDNN_DLDataType kF32{FDNN_DTYPE_FLOAT, 32, 1}, kF16{FDNN_DTYPE_FLOAT, 16, 1},
    kBF16{FDNN_DTYPE_BFLOAT, 16, 1}, kF64{FDNN_DTYPE_FLOAT, 64, 1};

// A tensor descriptor with its own shape and strides (dense in `order`, or given strides).
struct Desc {
  std::vector<int64_t> shape, strides;
  FDNN_DLTensor t{};
  Desc() = default;
  Desc(std::vector<int64_t> s, std::vector<int64_t> st, FDNN_DLDataType dt)
      : shape(std::move(s)), strides(std::move(st)) {
    t.device = {FDNN_DEVICE_METAL, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dt;
  }
  FDNN_DLTensor* get() {
    t.shape = shape.empty() ? nullptr : shape.data();
    t.strides = strides.empty() ? nullptr : strides.data();
    return &t;
  }
};

std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape, const std::vector<int>& order) {
  std::vector<int64_t> st(shape.size());
  int64_t step = 1;
  for (int i = static_cast<int>(order.size()) - 1; i >= 0; --i) {
    st[order[i]] = step;
    step *= shape[order[i]];
  }
  return st;
}
std::vector<int> iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}
std::vector<int> channels_last(int n) {
  std::vector<int> v{0};
  for (int i = 2; i < n; ++i) v.push_back(i);
  v.push_back(1);
  return v;
}

// One convolution problem: N, C, K, spatial sizes, kernel, per-dim geometry.
struct Problem {
  int32_t op = FDNN_CONV_FORWARD;
  FDNN_DLDataType dtype = kF32;
  int64_t n = 2, c = 4, k = 6, groups = 1;
  std::vector<int64_t> in{9, 8}, kernel{3, 3}, stride{1, 1}, dilation{1, 1}, lo{1, 0}, hi{0, 2};
  bool with_bias = false;
  bool x_channels_last = false;
  float beta = 0.f;
  FDNN_DLDataType compute{0, 0, 0};
  Desc x, w, y, bias;
  FDNN_Conv_Plan_Create_Args args{};

  FDNN_Conv_Plan_Create_Args& build() {
    const int r = static_cast<int>(in.size());
    std::vector<int64_t> xs{n, c}, ws{k, c / groups}, ys{n, k};
    for (int i = 0; i < r; ++i) {
      xs.push_back(in[i]);
      ws.push_back(kernel[i]);
      ys.push_back((in[i] + lo[i] + hi[i] - dilation[i] * (kernel[i] - 1) - 1) / stride[i] + 1);
    }
    x = Desc(xs, dense_strides(xs, x_channels_last ? channels_last(r + 2) : iota(r + 2)), dtype);
    w = Desc(ws, dense_strides(ws, iota(r + 2)), dtype);
    y = Desc(ys, dense_strides(ys, iota(r + 2)), dtype);
    bias = with_bias ? Desc({k}, {1}, dtype) : Desc({}, {}, dtype);
    args = FDNN_Conv_Plan_Create_Args{};
    args.struct_size = FDNN_Conv_Plan_Create_Args_STRUCT_SIZE;
    args.op = op;
    args.spatial_rank = r;
    args.x = x.get();
    args.w = w.get();
    args.y = y.get();
    args.bias = bias.get();
    for (int i = 0; i < r; ++i) {
      args.stride[i] = stride[i];
      args.dilation[i] = dilation[i];
      args.padding_lo[i] = lo[i];
      args.padding_hi[i] = hi[i];
    }
    args.groups = groups;
    args.alpha = 1.f;
    args.beta = beta;
    args.compute_type = compute;
    args.workspace_limit = SIZE_MAX;
    return args;
  }
};

// plan_problem after the shared header checks, as the shim runs them; "" or the error text.
std::string refusal(Problem& p, OsVersion os, ProblemPlan* out = nullptr) {
  try {
    FDNN_Conv_Plan_Create_Args& a = p.build();
    fdnn_shim::check_conv_problem(a, FDNN_DEVICE_METAL);
    ProblemPlan plan = plan_problem(a, os);
    if (out) *out = plan;
    return "";
  } catch (const fdnn_shim::Failure& f) {
    return std::string(f.code() == FDNN_ERROR_UNSUPPORTED ? "UNSUPPORTED: " : "OTHER: ") + f.what();
  }
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

void test_capabilities_by_os() {
  for (int32_t op = 0; op < FDNN_NUM_CONV_OPS; ++op) {
    auto f32 = capabilities(kMac13_0, op, kF32);
    CHECK(f32.support == FDNN_SUPPORT_NATIVE);
    CHECK(f32.spatial_ranks == ((1u << 1) | (1u << 2)));  // no 3-D before 13.2
    CHECK(capabilities(kMac13_1, op, kF32).spatial_ranks == ((1u << 1) | (1u << 2)));
    CHECK(capabilities(kMac13_2, op, kF32).spatial_ranks == ((1u << 1) | (1u << 2) | (1u << 3)));
    CHECK(capabilities(kMac13_2, op, kF16).support == FDNN_SUPPORT_NATIVE);
    // bfloat16 from macOS 14 on, with the reason before.
    auto bf13 = capabilities(kMac13_2, op, kBF16);
    CHECK(bf13.support == FDNN_SUPPORT_NONE && contains(bf13.detail, "macOS 14"));
    CHECK(capabilities(kMac14, op, kBF16).support == FDNN_SUPPORT_NATIVE);
    CHECK(capabilities(kMac15_1, op, kF64).support == FDNN_SUPPORT_NONE);
    // Nothing before macOS 13.
    auto old = capabilities(kMac12, op, kF32);
    CHECK(old.support == FDNN_SUPPORT_NONE && contains(old.detail, "macOS 13"));
    // Activations fused on forward only; features honest (no determinism, benchmark, pack).
    const uint32_t acts = capabilities(kMac15_1, op, kF32).activations;
    CHECK(acts == (op == FDNN_CONV_FORWARD ? (1u << FDNN_NUM_ACTIVATIONS) - 1 : 1u));
    const uint32_t feats = capabilities(kMac15_1, op, kF32).features;
    CHECK((feats & FDNN_FEATURE_ASYMMETRIC_PADDING) && (feats & FDNN_FEATURE_GROUPS) &&
          (feats & FDNN_FEATURE_DILATION) && (feats & FDNN_FEATURE_ALPHA_BETA) &&
          (feats & FDNN_FEATURE_BIAS_GRADIENT));
    CHECK(!(feats & (FDNN_FEATURE_DETERMINISTIC | FDNN_FEATURE_BENCHMARK |
                     FDNN_FEATURE_PACK_WEIGHTS | FDNN_FEATURE_REDUCED_PRECISION)));
  }
  // The detail says what this OS does with layouts and ranks, and what it refuses.
  const std::string d14 = capabilities(kMac14, FDNN_CONV_FORWARD, kF32).detail;
  CHECK(contains(d14, "through transposes") && contains(d14, "65536") && contains(d14, "256"));
  const std::string d15 = capabilities(kMac15_1, FDNN_CONV_FORWARD, kF32).detail;
  CHECK(contains(d15, "natively") && !contains(d15, "65536") && contains(d15, "int32"));
  CHECK(contains(capabilities(kMac13_1, FDNN_CONV_FORWARD, kF16).detail, "3-D from macOS 13.2"));
  // Static storage: the same text, at the same address, every time.
  CHECK(capabilities(kMac14, FDNN_CONV_FORWARD, kF32).detail ==
        capabilities(kMac14, FDNN_CONV_BACKWARD_DATA, kF32).detail);
  CHECK(os_unavailable_reason(kMac12) != nullptr);
  CHECK(os_unavailable_reason(kMac13_0) == nullptr);
}

void test_refusals() {
  {  // filter dims >= 256: refused on 2-D (and 1-D) forward only, as PyTorch routes them
    Problem p;
    p.in = {4, 300};
    p.kernel = {1, 256};
    p.lo = {0, 0};
    p.hi = {0, 0};
    CHECK(contains(refusal(p, kMac15_1), "UNSUPPORTED") && contains(refusal(p, kMac15_1), "256"));
    p.kernel = {1, 255};
    CHECK(refusal(p, kMac15_1).empty());
    p.kernel = {256, 1};
    p.in = {300, 4};
    CHECK(contains(refusal(p, kMac14), "256"));
    for (int32_t op : {FDNN_CONV_BACKWARD_DATA, FDNN_CONV_BACKWARD_WEIGHT}) {
      p.op = op;
      CHECK(refusal(p, kMac14).empty());
    }
    Problem one_d;
    one_d.in = {300};
    one_d.kernel = {256};
    one_d.stride = one_d.dilation = {1};
    one_d.lo = one_d.hi = {0};
    CHECK(contains(refusal(one_d, kMac15_1), "256"));
    Problem three_d;
    three_d.in = {2, 3, 300};
    three_d.kernel = {1, 1, 256};
    three_d.stride = three_d.dilation = {1, 1, 1};
    three_d.lo = three_d.hi = {0, 0, 0};
    CHECK(refusal(three_d, kMac15_1).empty());
  }
  {  // dims > 65536 of y (forward) and dy (backward data) before macOS 15.1 only
    Problem p;
    p.n = 1;
    p.c = 1;
    p.k = 65537;
    p.in = {3, 3};
    p.kernel = {1, 1};
    p.lo = {0, 0};
    p.hi = {0, 0};
    const std::string before = refusal(p, kMac15_0);
    CHECK(contains(before, "UNSUPPORTED") && contains(before, "65536") && contains(before, "15.1"));
    CHECK(refusal(p, kMac15_1).empty());
    p.k = 65536;
    CHECK(refusal(p, kMac15_0).empty());
    // Backward data: dy is checked (what PyTorch checks there), not the written dx.
    p.op = FDNN_CONV_BACKWARD_DATA;
    p.k = 65537;
    CHECK(contains(refusal(p, kMac14), "65536") && contains(refusal(p, kMac14), "dy"));
    p.k = 4;
    p.c = 65537;
    CHECK(refusal(p, kMac14).empty());
    // Backward weight: PyTorch checks nothing, nor does the shim.
    p.op = FDNN_CONV_BACKWARD_WEIGHT;
    p.k = 65537;
    p.c = 1;
    CHECK(refusal(p, kMac14).empty());
  }
  {  // int32 element counts
    Problem p;
    p.n = 1;
    p.c = 1;
    p.k = 1;
    p.in = {65536, 32769};  // 2^31 + 2^16 elements
    p.kernel = {1, 1};
    p.lo = {0, 0};
    p.hi = {0, 0};
    const std::string r = refusal(p, kMac15_1);
    CHECK(contains(r, "UNSUPPORTED") && contains(r, "int32"));
  }
  {  // bfloat16 before 14, 3-D before 13.2, compute types
    Problem p;
    p.dtype = kBF16;
    CHECK(contains(refusal(p, kMac13_2), "macOS 14"));
    CHECK(refusal(p, kMac14).empty());
    Problem q;
    q.in = {5, 6, 7};
    q.kernel = {2, 2, 2};
    q.stride = q.dilation = {1, 1, 1};
    q.lo = {1, 0, 0};
    q.hi = {0, 1, 1};
    CHECK(contains(refusal(q, kMac13_1), "UNSUPPORTED"));
    CHECK(refusal(q, kMac13_2).empty());
    Problem h;
    h.dtype = kF16;
    h.compute = kF32;
    ProblemPlan plan;
    CHECK(refusal(h, kMac14, &plan).empty() && plan.compute_in_float32);
    h.compute = kF64;
    CHECK(contains(refusal(h, kMac14), "compute_type"));
  }
  {  // FDNN_CONV_DETERMINISTIC is not promised
    Problem p;
    p.build().flags = FDNN_CONV_DETERMINISTIC;
    bool refused = false;
    try {
      plan_problem(p.args, kMac15_1);
    } catch (const fdnn_shim::Failure& f) {
      refused = f.code() == FDNN_ERROR_UNSUPPORTED;
    }
    CHECK(refused);
  }
}

// When a 16-bit convolution runs in float32: an epilogue follows it, or compute_type asks.
void test_float32_convolution() {
  struct Case {
    int32_t op;
    FDNN_DLDataType dtype;
    bool bias;
    int32_t activation;
    float alpha, beta;
    bool want;
  };
  const Case cases[] = {
      {FDNN_CONV_FORWARD, kF16, false, FDNN_ACTIVATION_NONE, 1.f, 0.f, false},
      {FDNN_CONV_FORWARD, kF16, true, FDNN_ACTIVATION_NONE, 1.f, 0.f, true},
      {FDNN_CONV_FORWARD, kF16, false, FDNN_ACTIVATION_RELU, 1.f, 0.f, true},
      {FDNN_CONV_FORWARD, kF16, false, FDNN_ACTIVATION_NONE, 0.5f, 0.f, true},
      {FDNN_CONV_FORWARD, kBF16, false, FDNN_ACTIVATION_NONE, 1.f, 1.f, true},
      {FDNN_CONV_FORWARD, kF32, true, FDNN_ACTIVATION_RELU, 2.f, 1.f, false},
      {FDNN_CONV_BACKWARD_DATA, kF16, false, FDNN_ACTIVATION_NONE, 1.f, 0.f, false},
      {FDNN_CONV_BACKWARD_DATA, kBF16, false, FDNN_ACTIVATION_NONE, 1.f, 1.f, true},
      {FDNN_CONV_BACKWARD_WEIGHT, kF16, false, FDNN_ACTIVATION_NONE, -1.5f, 0.f, true},
      // a bias gradient is a float32 reduction of dy of its own: dw is still rounded once
      {FDNN_CONV_BACKWARD_WEIGHT, kF16, true, FDNN_ACTIVATION_NONE, 1.f, 0.f, false},
  };
  for (const Case& c : cases) {
    Problem p;
    p.op = c.op;
    p.dtype = c.dtype;
    p.with_bias = c.bias;
    p.beta = c.beta;
    FDNN_Conv_Plan_Create_Args& a = p.build();
    a.alpha = c.alpha;
    a.activation = c.activation;
    ProblemPlan plan;
    bool ok = true;
    try {
      plan = plan_problem(a, kMac15_1);
    } catch (const fdnn_shim::Failure& f) {
      std::printf("FAIL unexpected refusal: %s\n", f.what());
      ok = false;
    }
    CHECK(ok && conv_in_float32(a) == c.want && plan.compute_in_float32 == c.want);
    CHECK(!ok || contains(plan.name, "_f32compute") == c.want);
  }
}

void test_geometry() {
  {  // 2-D: padding per side, in graph order (H then W)
    Problem p;
    p.stride = {2, 1};
    p.dilation = {1, 2};
    p.lo = {1, 0};
    p.hi = {0, 2};
    ProblemPlan plan;
    CHECK(refusal(p, kMac14, &plan).empty());
    CHECK(plan.graph_rank == 2);
    CHECK(plan.pad_lo[0] == 1 && plan.pad_hi[0] == 0 && plan.pad_lo[1] == 0 && plan.pad_hi[1] == 2);
    CHECK(plan.stride[0] == 2 && plan.stride[1] == 1 && plan.dilation[1] == 2);
  }
  {  // 1-D runs as 2-D with a unit height and no padding on it
    Problem p;
    p.in = {11};
    p.kernel = {3};
    p.stride = {2};
    p.dilation = {1};
    p.lo = {2};
    p.hi = {1};
    ProblemPlan plan;
    CHECK(refusal(p, kMac13_0, &plan).empty());
    CHECK(plan.graph_rank == 2);
    CHECK((plan.x.shape == std::vector<int64_t>{2, 4, 1, 11}));
    CHECK((plan.w.shape == std::vector<int64_t>{6, 4, 1, 3}));
    CHECK(plan.y.shape.size() == 4 && plan.y.shape[2] == 1 && plan.y.shape[3] == 6);
    CHECK(plan.stride[0] == 1 && plan.pad_lo[0] == 0 && plan.pad_hi[0] == 0);
    CHECK(plan.stride[1] == 2 && plan.pad_lo[1] == 2 && plan.pad_hi[1] == 1);
    CHECK(plan.x.dense && plan.x.is_identity_order());
  }
  {  // 3-D: front/back, top/bottom, left/right
    Problem p;
    p.in = {5, 6, 7};
    p.kernel = {2, 3, 2};
    p.stride = {1, 2, 1};
    p.dilation = {1, 1, 2};
    p.lo = {1, 0, 2};
    p.hi = {0, 1, 0};
    ProblemPlan plan;
    CHECK(refusal(p, kMac15_1, &plan).empty());
    CHECK(plan.graph_rank == 3 && plan.data_layout == GraphLayout::kNCDHW &&
          plan.weights_layout == GraphLayout::kOIDHW);
    CHECK(plan.pad_lo[0] == 1 && plan.pad_hi[0] == 0 && plan.pad_lo[2] == 2 && plan.pad_hi[1] == 1);
  }
  {  // groups and depthwise pass through
    Problem p;
    p.c = 6;
    p.k = 6;
    p.groups = 6;
    ProblemPlan plan;
    CHECK(refusal(p, kMac13_0, &plan).empty() && plan.groups == 6);
    CHECK((plan.w.shape == std::vector<int64_t>{6, 1, 3, 3}));
  }
}

void test_layouts() {
  Problem p;
  p.x_channels_last = true;
  ProblemPlan plan;
  // Channels-last x: native NHWC from macOS 15, NCHW (a transpose in the graph) before.
  CHECK(refusal(p, kMac15_0, &plan).empty() && plan.data_layout == GraphLayout::kNHWC);
  CHECK(is_channels_last(plan.x) && plan.x.dense);
  CHECK((plan.x.memory_order == std::vector<int>{0, 2, 3, 1}));
  CHECK((plan.x.memory_shape() == std::vector<int64_t>{2, 9, 8, 4}));
  // memory_to_logical takes (N, H, W, C) back to (N, C, H, W): dim i of the result is dim
  // perm[i] of the memory-order tensor.
  CHECK((plan.x.memory_to_logical() == std::vector<int>{0, 3, 1, 2}));
  CHECK(refusal(p, kMac14, &plan).empty() && plan.data_layout == GraphLayout::kNCHW);
  // A contiguous x stays NCHW everywhere.
  Problem q;
  CHECK(refusal(q, kMac15_1, &plan).empty() && plan.data_layout == GraphLayout::kNCHW);
  // The gradient ops run in NCHW on every macOS, as PyTorch's do, whatever the layouts.
  for (int32_t op : {FDNN_CONV_BACKWARD_DATA, FDNN_CONV_BACKWARD_WEIGHT}) {
    Problem r;
    r.op = op;
    r.x_channels_last = true;
    FDNN_Conv_Plan_Create_Args& a = r.build();
    r.y.strides = dense_strides(r.y.shape, channels_last(4));  // dy channels-last too
    a.y = r.y.get();
    bool nchw = false;
    try {
      plan = plan_problem(a, kMac15_1);
      nchw = plan.data_layout == GraphLayout::kNCHW && is_channels_last(plan.y) && is_channels_last(plan.x);
    } catch (const fdnn_shim::Failure& f) {
      std::printf("FAIL unexpected refusal: %s\n", f.what());
    }
    CHECK(nchw);
  }
  // C == 1: channels-last and contiguous are the same bytes; stays NCHW.
  Problem s;
  s.c = 1;
  s.x_channels_last = true;
  CHECK(refusal(s, kMac15_1, &plan).empty() && plan.data_layout == GraphLayout::kNCHW);
}

// Gapped and permuted strides: the gather index of every logical element, by brute force.
void test_gather_index() {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 50; ++trial) {
    Problem p;
    p.n = 1 + rng() % 3;
    p.c = 1 + rng() % 4;
    p.in = {static_cast<int64_t>(3 + rng() % 4), static_cast<int64_t>(3 + rng() % 4)};
    p.kernel = {1, 1};
    p.lo = p.hi = {0, 0};
    FDNN_Conv_Plan_Create_Args& a = p.build();
    // x: a slice of a larger buffer in a random dim order, with a random gap per dim.
    std::vector<int> order = iota(4);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int64_t> padded = p.x.shape;
    const bool gaps = trial % 2 == 1;
    if (gaps)
      for (auto& v : padded) v += rng() % 2;
    p.x.strides = dense_strides(padded, order);
    a.x = p.x.get();
    ProblemPlan plan;
    try {
      plan = plan_problem(a, kMac15_1);
    } catch (const fdnn_shim::Failure& f) {
      std::printf("FAIL unexpected refusal: %s\n", f.what());
      ++failures;
      continue;
    }
    const TensorPlan& t = plan.x;
    int64_t expect_span = 1;
    for (int i = 0; i < 4; ++i) expect_span += (p.x.shape[i] - 1) * p.x.strides[i];
    CHECK(t.span == expect_span);
    CHECK(t.count == p.n * p.c * p.in[0] * p.in[1]);
    if (t.dense) {
      CHECK(t.span == t.count);
      CHECK(t.gather_index.empty());
      // The memory-order shape, row-major, lays the elements where the strides put them.
      const auto ms = t.memory_shape();
      int64_t step = 1;
      for (int pos = 3; pos >= 0; --pos) {
        const int d = t.memory_order[pos];
        CHECK(p.x.shape[d] == 1 || p.x.strides[d] == step);
        step *= ms[pos];
      }
    } else {
      CHECK(static_cast<int64_t>(t.gather_index.size()) == t.count);
      size_t e = 0;
      for (int64_t i0 = 0; i0 < p.x.shape[0]; ++i0)
        for (int64_t i1 = 0; i1 < p.x.shape[1]; ++i1)
          for (int64_t i2 = 0; i2 < p.x.shape[2]; ++i2)
            for (int64_t i3 = 0; i3 < p.x.shape[3]; ++i3, ++e) {
              const int64_t off = i0 * p.x.strides[0] + i1 * p.x.strides[1] +
                                  i2 * p.x.strides[2] + i3 * p.x.strides[3];
              if (t.gather_index[e] != off) {
                ++failures;
                std::printf("FAIL gather index %zu: %d != %lld\n", e, t.gather_index[e],
                            static_cast<long long>(off));
                e = t.gather_index.size();
                i0 = p.x.shape[0];
                i1 = p.x.shape[1];
                i2 = p.x.shape[2];
                break;
              }
            }
      ++checks;
    }
    if (!gaps) CHECK(t.dense);
  }
  {  // a strided bias (every other element) is gathered; a broadcast input (stride 0) too
    Problem p;
    p.with_bias = true;
    FDNN_Conv_Plan_Create_Args& a = p.build();
    p.bias.strides = {2};
    a.bias = p.bias.get();
    ProblemPlan plan = plan_problem(a, kMac15_1);
    CHECK(!plan.bias.dense && plan.bias.span == 2 * p.k - 1);
    CHECK(plan.bias.gather_index.size() == static_cast<size_t>(p.k) && plan.bias.gather_index[2] == 4);
  }
  {  // an output whose elements alias (stride 0) is refused
    Problem p;
    FDNN_Conv_Plan_Create_Args& a = p.build();
    p.y.strides[0] = 0;
    a.y = p.y.get();
    bool refused = false;
    try {
      plan_problem(a, kMac15_1);
    } catch (const fdnn_shim::Failure& f) {
      refused = f.code() == FDNN_ERROR_UNSUPPORTED && contains(f.what(), "alias");
    }
    CHECK(refused);
  }
}

void test_bindings_and_staging() {
  CHECK(binding_for(0, false, kMac14) == Binding::kDirect);
  CHECK(binding_for(0, true, kMac15_1) == Binding::kDirect);
  CHECK(binding_for(256, false, kMac14) == Binding::kStaged);
  CHECK(binding_for(256, false, kMac15_0) == Binding::kView);
  // Weights are never viewed, on any OS.
  CHECK(binding_for(256, true, kMac15_1) == Binding::kStaged);
  {  // Written tensors: a dw at an offset is staged; a dy/y at an offset is viewed from 15.
    Problem bw;
    bw.op = FDNN_CONV_BACKWARD_WEIGHT;
    ProblemPlan plan;
    CHECK(refusal(bw, kMac15_1, &plan).empty());
    CHECK(output_binding(plan, plan.w, 0, kMac15_1) == Binding::kDirect);
    CHECK(output_binding(plan, plan.w, 64, kMac15_1) == Binding::kStaged);
    Problem fw;
    CHECK(refusal(fw, kMac15_1, &plan).empty());
    CHECK(output_binding(plan, plan.y, 64, kMac15_1) == Binding::kView);
    CHECK(output_binding(plan, plan.y, 64, kMac14) == Binding::kStaged);
    fw.beta = 1.f;  // the graph reads the old y: staged even at offset 0
    CHECK(refusal(fw, kMac15_1, &plan).empty());
    CHECK(output_binding(plan, plan.y, 0, kMac15_1) == Binding::kStaged);
  }

  Problem p;
  p.with_bias = true;
  ProblemPlan plan;
  CHECK(refusal(p, kMac14, &plan).empty());
  const size_t es = 4;
  const size_t x = span_bytes(plan.x, es), w = span_bytes(plan.w, es), y = span_bytes(plan.y, es),
               b = span_bytes(plan.bias, es);
  // Before macOS 15: every input may be staged, and the result.
  CHECK(max_staging_bytes(plan, kMac14) == x + w + b + y);
  // From 15: only weights among the inputs.
  CHECK(max_staging_bytes(plan, kMac15_1) == w + y);
  // beta != 0 reads the old output too.
  Problem q;
  q.beta = 0.5f;
  CHECK(refusal(q, kMac14, &plan).empty() && plan.reads_old(plan.y));
  CHECK(max_staging_bytes(plan, kMac14) == x + w + 2 * y);
  // Backward-weight with a bias gradient writes two tensors.
  Problem r;
  r.op = FDNN_CONV_BACKWARD_WEIGHT;
  r.with_bias = true;
  CHECK(refusal(r, kMac15_1, &plan).empty() && plan.writes_bias_gradient());
  CHECK(&plan.written() == &plan.w);
  CHECK(max_staging_bytes(plan, kMac15_1) == w + b);
}

}  // namespace

// Ranges over 4 GiB never reach an MPSNDArray: MPS aborts the process on those.
void test_ndarray_size_limit() {
  Problem p;  // float32 y of 2^30 + 32768 elements: 4 GiB and 128 KiB
  p.n = 1;
  p.c = 1;
  p.k = 1;
  p.in = {32768, 32769};
  p.kernel = {1, 1};
  p.lo = p.hi = {0, 0};
  ProblemPlan plan;
  CHECK(refusal(p, kMac15_1, &plan).empty());  // beta 0: y may still be bound directly
  const char* name = "y";
  auto refused = [&](Binding b) {
    try {
      check_ndarray_size(name, plan.y, 4, b);
    } catch (const fdnn_shim::Failure& f) {
      return f.code() == FDNN_ERROR_UNSUPPORTED && contains(f.what(), "4295098368 bytes");
    }
    return false;
  };
  CHECK(!refused(Binding::kDirect));
  CHECK(refused(Binding::kView) && refused(Binding::kStaged));
  // Exactly 4 GiB passes: the assertion is "> 2**32".
  TensorPlan four_gib;
  four_gib.span = int64_t{1} << 30;
  bool passed = true;
  try {
    check_ndarray_size("x", four_gib, 4, Binding::kStaged);
  } catch (const fdnn_shim::Failure&) {
    passed = false;
  }
  CHECK(passed);
  // beta != 0 always stages y: refused at plan time, naming the size.
  p.beta = 1.f;
  const std::string r = refusal(p, kMac15_1);
  CHECK(contains(r, "UNSUPPORTED") && contains(r, "4 GiB") && contains(r, "4295098368"));
  // float16 of the same shape is 2 GiB: served.
  p.dtype = kF16;
  CHECK(refusal(p, kMac15_1).empty());
}

// PyTorch's device rule: no low-power GPU, MTLGPUFamilyMac2 required; no virtual GPU.
void test_device_choice() {
  const DeviceTraits intel{"Intel(R) UHD Graphics 630", true, true};
  const DeviceTraits m2{"Apple M2 Pro", false, true};
  const DeviceTraits virt{"Apple Paravirtual device", false, true};
  const DeviceTraits old{"AMD Radeon Pro 555", false, false};
  CHECK(choose_device({m2}).index == 0);
  CHECK(choose_device({intel, m2}).index == 1);
  const DeviceChoice none = choose_device({intel, virt, old});
  CHECK(none.index == -1 && contains(none.reason, "low power") && contains(none.reason, "virtual") &&
        contains(none.reason, "MTLGPUFamilyMac2") && contains(none.reason, "Apple Paravirtual device"));
  const DeviceChoice empty = choose_device({});
  CHECK(empty.index == -1 && contains(empty.reason, "MTLCopyAllDevices"));
}

int main() {
  test_capabilities_by_os();
  test_refusals();
  test_float32_convolution();
  test_ndarray_size_limit();
  test_device_choice();
  test_geometry();
  test_layouts();
  test_gather_index();
  test_bindings_and_staging();
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
