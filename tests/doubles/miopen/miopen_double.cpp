// Test double of MIOpen (libMIOpen.so.1) for the MIOpen shim: the functions the shim declares
// (csrc/shims/miopen/miopen_api.hpp), on host memory, with a naive reference convolution in
// double accumulation. It reproduces what MIOpen's own source does, including where that is
// not what a caller would guess, so that a shim passing here keeps to MIOpen as it is. Each
// behaviour names its source; "MIOpen@2d1fd997" is ROCm/MIOpen at commit 2d1fd997a6fc
// (2024-10-24, MIOpen 3.3.0), whose files are named from the repository root:
//  - tensor descriptors: strides must be > 0 (src/tensor.cpp "Strides must be > 0");
//  - miopenOpTensor follows MIOpen's kernel choice (src/ocl/tensorocl.cpp OpTensor4d,
//    OpTensorOther; src/kernels/MIOpenTensorKernels.cl): packed operands with a full-size B
//    are processed flat, strides ignored (Op4dTensorLite); a (1, K, 1, 1) or one-element B takes
//    the bias kernel, which indexes C (and A) as NCHW (OpTensorFwdBias, ROCm/MIOpen#2860); the
//    generic kernels take no stride for the last dim and assume 1 (Op4dTensorGeneric,
//    Op5dTensorGeneric); alpha/beta are read as float; no bfloat16 (the kernels define no
//    bfloat16 type; docs/reference/datatypes.rst: bfloat16 is for convolutions, tensor set
//    and copy); min/max are `a < b ? a : b` / `a > b ? a : b` (NaN in A is not propagated);
//  - miopenSetTensor / miopenScaleTensor read alpha in the tensor's own type (tensorocl.cpp
//    SetTensor, ScaleTensor: `*as_float(alpha)`, src/include/miopen/visit_float.hpp), are fully
//    strided, and ScaleTensor refuses bfloat16 ("ScaleTensor: unsupported data type");
//  - miopenActivationForward: bfloat16 NotImplemented (src/activ_api.cpp), only alpha = 1,
//    beta = 0 (src/ocl/activ_ocl.cpp), packed tensors processed flat (src/solver/activ/fwd_0.cpp),
//    RELU is x * (x > 0) and POWER is 0 where alpha + beta x <= EPSILON (1e-6 float32, 1e-4
//    float16; src/kernels/activation_functions.h, src/kernels/MIOpenNeuron.cl);
//  - immediate mode: GetSolution lists the find-db record's solutions when there is one, else
//    the fallback's (src/ocl/convolutionocl.cpp GetSolutions/GetSolutionsFallback); any id
//    applicable to the problem is accepted by GetSolutionWorkspaceSize, CompileSolution and
//    Immediate, listed or not (convolutionocl.cpp: `sol.IsApplicable(ctx, problem)` else BadParm
//    "is not applicable"); fdnn_double_set_find_record() makes a record appear;
//  - grouped + dilated convolutions are served (src/problem.cpp ValidateGroupCount has no
//    dilation test; the naive solvers take both);
//  - MIOPEN_CONVOLUTION_ATTRIB_DETERMINISTIC exists from MIOpen 2.18 on (commit 95716c2ed,
//    ROCm/MIOpen#1551); before, setting it is BadParm. FLUX_DNN_MIOPEN_DOUBLE_VERSION (e.g.
//    "2.17.0") makes the double report an older MIOpen;
//  - the bias gradient (MIOpenConvBwdB, convolutionocl.cpp ConvolutionBackwardBias) reads dy
//    with its N and C strides and each channel's map contiguous (NCHW), writes db contiguously
//    whatever db's strides, takes only alpha = 1, beta = 0, and no bfloat16
//    (src/convolution_api.cpp);
//  - the workspace must be at least the solution's size (and is scribbled on, so a shim that
//    keeps data there shows); outputs of beta = 0 calls are not read.
// Beliefs kept from before, not from a source: x, w, y in one layout; symmetric padding (one
// pad per spatial dim, as the descriptor has); no float64 convolution (datatypes.rst).
// It checks plumbing only; it says nothing about AMD GPUs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "fp16.hpp"
#include "miopen_api.hpp"

#define EXPORT extern "C" __attribute__((visibility("default")))

struct miopenHandle {
  hipStream_t stream = nullptr;
};
struct miopenTensorDescriptor {
  bool set = false;
  miopenDataType_t type = miopenFloat;
  std::vector<int> dims, strides;
};
struct miopenConvolutionDescriptor {
  bool set = false;
  int spatial = 0;
  std::vector<int> pads, strides, dilations;
  int groups = 1;
  bool deterministic = false;
  int fp16_alt_impl = -1;  // -1: MIOpen's default
};
struct miopenActivationDescriptor {
  miopenActivationMode_t mode = miopenActivationPASTHRU;
  double alpha = 0, beta = 0, gamma = 0;
};

namespace {

using Desc = miopenTensorDescriptor;

// Whether a find-db record exists (for every problem): GetSolution then lists its solutions.
std::atomic<bool> find_record{false};

float load(const Desc& d, const void* base, int64_t i) {
  switch (d.type) {
    case miopenHalf: return fdnn_shim::half_to_float(static_cast<const uint16_t*>(base)[i]);
    case miopenBFloat16: return fdnn_shim::bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

// v rounded to float by round-to-odd: a later rounding to a 16-bit type is then the one
// correct rounding of v (double rounding through float would not be).
float to_float_odd(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) == v || !std::isfinite(f)) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= 1u;
  std::memcpy(&f, &bits, 4);
  return f;
}

void store(const Desc& d, void* base, int64_t i, double v) {
  const float f = d.type == miopenFloat ? static_cast<float>(v) : to_float_odd(v);
  switch (d.type) {
    case miopenHalf: static_cast<uint16_t*>(base)[i] = fdnn_shim::float_to_half(f); break;
    case miopenBFloat16: static_cast<uint16_t*>(base)[i] = fdnn_shim::float_to_bf16(f); break;
    default: static_cast<float*>(base)[i] = f; break;
  }
}

int64_t count(const Desc& d) {
  int64_t n = 1;
  for (int v : d.dims) n *= v;
  return n;
}

// The offset of the i-th element in row-major logical order.
int64_t offset_of(const Desc& d, int64_t i) {
  int64_t off = 0;
  for (size_t k = d.dims.size(); k-- > 0;) {
    off += (i % d.dims[k]) * d.strides[k];
    i /= d.dims[k];
  }
  return off;
}

// Whether d's strides order its dims as `order` (outermost first), size-1 dims free.
bool ordered(const Desc& d, const std::vector<size_t>& order) {
  int64_t inner_span = 0;
  for (size_t k = order.size(); k-- > 0;) {
    size_t dim = order[k];
    if (d.dims[dim] == 1) continue;
    if (d.strides[dim] < inner_span) return false;
    inner_span = static_cast<int64_t>(d.strides[dim]) * d.dims[dim];
  }
  return true;
}

std::vector<size_t> order_of(size_t nd, bool nhwc) {
  std::vector<size_t> o{0};
  if (!nhwc) o.push_back(1);
  for (size_t k = 2; k < nd; ++k) o.push_back(k);
  if (nhwc) o.push_back(1);
  return o;
}

// Bit 1: NCHW order holds; bit 2: NHWC order holds.
int layouts(const Desc& d) {
  return (ordered(d, order_of(d.dims.size(), false)) ? 1 : 0) |
         (ordered(d, order_of(d.dims.size(), true)) ? 2 : 0);
}

// One convolution problem in forward terms: x, w, y.
struct Problem {
  const Desc *x, *w, *y;
  const miopenConvolutionDescriptor* conv;
};

miopenStatus_t check_problem(const Desc* x, const Desc* w, const Desc* y,
                             const miopenConvolutionDescriptor* c, Problem* p) {
  if (!x || !w || !y || !c || !x->set || !w->set || !y->set || !c->set) return miopenStatusBadParm;
  const size_t nd = static_cast<size_t>(c->spatial) + 2;
  if (x->dims.size() != nd || w->dims.size() != nd || y->dims.size() != nd) return miopenStatusBadParm;
  if (x->type != w->type || x->type != y->type) return miopenStatusBadParm;
  if (x->type == miopenDouble) return miopenStatusNotImplemented;  // no float64 convolution
  if (!(layouts(*x) & layouts(*w) & layouts(*y))) return miopenStatusNotImplemented;
  const int G = c->groups;
  if (x->dims[1] != w->dims[1] * G || w->dims[0] % G != 0 || y->dims[1] != w->dims[0] ||
      x->dims[0] != y->dims[0])
    return miopenStatusBadParm;
  for (int s = 0; s < c->spatial; ++s) {
    const int64_t in = x->dims[2 + s], k = w->dims[2 + s];
    const int64_t out = (in + 2 * c->pads[s] - c->dilations[s] * (k - 1) - 1) / c->strides[s] + 1;
    if (out != y->dims[2 + s]) return miopenStatusBadParm;
  }
  p->x = x, p->w = w, p->y = y, p->conv = c;
  return miopenStatusSuccess;
}

// (a, b, c) of the direction back to (x, w, y).
miopenStatus_t problem_of(int direction, const Desc* a, const Desc* b,
                          const miopenConvolutionDescriptor* c, const Desc* out, Problem* p) {
  if (direction == 0) return check_problem(b, a, out, c, p);  // (w, x, conv, y)
  if (direction == 1) return check_problem(out, b, a, c, p);  // (dy, w, conv, dx)
  return check_problem(b, out, a, c, p);                     // (dy, x, conv, dw)
}

// The solutions the double knows: 1 "Direct" (no workspace), 2 "GEMM" (workspace; not
// deterministic), 3 "ImplicitGEMM" (no workspace). All apply to every problem the double
// takes, but a deterministic descriptor excludes GEMM.
const miopenConvSolution_t kSolutions[] = {
    {2.0f, 0, 1, miopenConvolutionAlgoDirect},
    {1.0f, 0, 2, miopenConvolutionAlgoGEMM},  // workspace filled in per problem
    {1.5f, 0, 3, miopenConvolutionAlgoImplicitGEMM},
};

bool applicable(const Problem& p, uint64_t id) {
  if (id == 2) return !p.conv->deterministic;
  return id == 1 || id == 3;
}

miopenConvSolution_t solution(const Problem& p, uint64_t id) {
  miopenConvSolution_t s = kSolutions[id - 1];
  if (id == 2) s.workspace_size = static_cast<size_t>(count(*p.y)) * 4 + 64;
  return s;
}

// What GetSolution lists, best first: the fallback's heuristic order (GEMM, Direct) without a
// find-db record; the record's (ImplicitGEMM, Direct) once there is one
// (convolutionocl.cpp GetSolutions: the record when not empty, else GetSolutionsFallback).
std::vector<miopenConvSolution_t> solutions_of(const Problem& p) {
  std::vector<miopenConvSolution_t> s;
  const uint64_t order[2][2] = {{2, 1}, {3, 1}};
  for (uint64_t id : order[find_record ? 1 : 0])
    if (applicable(p, id)) s.push_back(solution(p, id));
  return s;
}

// Logical index helpers over (N, C, D, H, W) with D = 1 for 2-D.
struct View {
  const Desc* d;
  int64_t n[5], s[5];
  explicit View(const Desc& desc) : d(&desc) {
    const size_t nd = desc.dims.size();
    size_t k = 0;
    for (size_t i = 0; i < 5; ++i) {
      const bool fake_depth = nd == 4 && i == 2;
      n[i] = fake_depth ? 1 : desc.dims[k];
      s[i] = fake_depth ? 0 : desc.strides[k];
      if (!fake_depth) ++k;
    }
  }
  int64_t at(int64_t a, int64_t b, int64_t z, int64_t y, int64_t x) const {
    return a * s[0] + b * s[1] + z * s[2] + y * s[3] + x * s[4];
  }
};

struct Geometry {
  int64_t pad[3] = {0, 0, 0}, stride[3] = {1, 1, 1}, dil[3] = {1, 1, 1};
  explicit Geometry(const miopenConvolutionDescriptor& c) {
    const int off = 3 - c.spatial;
    for (int s = 0; s < c.spatial; ++s)
      pad[off + s] = c.pads[s], stride[off + s] = c.strides[s], dil[off + s] = c.dilations[s];
  }
};

// Visits every (n, k, output position, c, kernel position) term of the convolution with its
// x, w, y offsets (x offset -1 where padding).
template <class Visit>
void for_each_term(const Problem& p, Visit&& visit) {
  View X(*p.x), Wt(*p.w), Y(*p.y);
  Geometry g(*p.conv);
  const int64_t G = p.conv->groups, Kg = Wt.n[0] / G, Cg = Wt.n[1];
  for (int64_t n = 0; n < Y.n[0]; ++n)
    for (int64_t k = 0; k < Y.n[1]; ++k)
      for (int64_t oz = 0; oz < Y.n[2]; ++oz)
        for (int64_t oy = 0; oy < Y.n[3]; ++oy)
          for (int64_t ox = 0; ox < Y.n[4]; ++ox) {
            const int64_t yo = Y.at(n, k, oz, oy, ox);
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t kz = 0; kz < Wt.n[2]; ++kz)
                for (int64_t ky = 0; ky < Wt.n[3]; ++ky)
                  for (int64_t kx = 0; kx < Wt.n[4]; ++kx) {
                    const int64_t iz = oz * g.stride[0] - g.pad[0] + kz * g.dil[0];
                    const int64_t iy = oy * g.stride[1] - g.pad[1] + ky * g.dil[1];
                    const int64_t ix = ox * g.stride[2] - g.pad[2] + kx * g.dil[2];
                    if (iz < 0 || iy < 0 || ix < 0 || iz >= X.n[2] || iy >= X.n[3] || ix >= X.n[4])
                      continue;
                    const int64_t ci = (k / Kg) * Cg + c;
                    visit(X.at(n, ci, iz, iy, ix), Wt.at(k, c, kz, ky, kx), yo);
                  }
          }
}

void convolve(int direction, const Problem& p, const void* x, const void* w, const void* y,
              void* out) {
  const Desc& od = direction == 0 ? *p.y : direction == 1 ? *p.x : *p.w;
  View O(od);
  // Accumulate by the output's memory offsets, then store every element once.
  int64_t span = 1;
  for (size_t i = 0; i < od.dims.size(); ++i) span += (od.dims[i] - 1) * int64_t{od.strides[i]};
  std::vector<double> acc(static_cast<size_t>(span), 0.0);
  for_each_term(p, [&](int64_t xo, int64_t wo, int64_t yo) {
    if (direction == 0)
      acc[static_cast<size_t>(yo)] += double(load(*p.x, x, xo)) * load(*p.w, w, wo);
    else if (direction == 1)
      acc[static_cast<size_t>(xo)] += double(load(*p.y, y, yo)) * load(*p.w, w, wo);
    else
      acc[static_cast<size_t>(wo)] += double(load(*p.y, y, yo)) * load(*p.x, x, xo);
  });
  for (int64_t i = 0; i < count(od); ++i) {
    const int64_t off = offset_of(od, i);
    store(od, out, off, acc[static_cast<size_t>(off)]);
  }
  (void)O;
}


}  // namespace

// ---- handle, descriptors -------------------------------------------------------------------

namespace {
// The MIOpen version the double reports: 3.1.0, or FLUX_DNN_MIOPEN_DOUBLE_VERSION ("2.17.0").
void version(size_t v[3]) {
  v[0] = 3, v[1] = 1, v[2] = 0;
  if (const char* e = std::getenv("FLUX_DNN_MIOPEN_DOUBLE_VERSION"); e && *e) {
    char* end = nullptr;
    v[0] = std::strtoul(e, &end, 10);
    v[1] = *end == '.' ? std::strtoul(end + 1, &end, 10) : 0;
    v[2] = *end == '.' ? std::strtoul(end + 1, &end, 10) : 0;
  }
}
}  // namespace

EXPORT miopenStatus_t miopenGetVersion(size_t* major, size_t* minor, size_t* patch) {
  size_t v[3];
  version(v);
  if (major) *major = v[0];
  if (minor) *minor = v[1];
  if (patch) *patch = v[2];
  return miopenStatusSuccess;
}
// Not MIOpen's: makes a find-db record appear (1) or go (0) for every problem, as a Find on
// the same problem (PyTorch's benchmark mode, a new system db) would.
EXPORT void fdnn_double_set_find_record(int present) { find_record = present != 0; }
EXPORT const char* miopenGetErrorString(miopenStatus_t s) {
  switch (s) {
    case miopenStatusSuccess: return "miopenStatusSuccess";
    case miopenStatusBadParm: return "miopenStatusBadParm";
    case miopenStatusNotImplemented: return "miopenStatusNotImplemented";
    default: return "miopenStatusUnknownError";
  }
}
EXPORT miopenStatus_t miopenCreate(miopenHandle_t* h) {
  *h = new miopenHandle();
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenDestroy(miopenHandle_t h) {
  delete h;
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenSetStream(miopenHandle_t h, miopenAcceleratorQueue_t q) {
  if (!h) return miopenStatusBadParm;
  h->stream = q;
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenCreateTensorDescriptor(miopenTensorDescriptor_t* d) {
  *d = new miopenTensorDescriptor();
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenSetTensorDescriptor(miopenTensorDescriptor_t d, miopenDataType_t t,
                                                int nb, const int* dims, const int* strides) {
  if (!d || nb < 1 || nb > 5 || !dims) return miopenStatusBadParm;
  if (t != miopenHalf && t != miopenFloat && t != miopenBFloat16 && t != miopenDouble)
    return miopenStatusBadParm;
  d->type = t;
  d->dims.assign(dims, dims + nb);
  d->strides.resize(static_cast<size_t>(nb));
  int64_t step = 1;
  for (int i = nb; i-- > 0;) {
    if (dims[i] <= 0) return miopenStatusBadParm;
    d->strides[static_cast<size_t>(i)] = strides ? strides[i] : static_cast<int>(step);
    // "Strides must be > 0" (MIOpen@2d1fd997 src/tensor.cpp CheckArgsAndInit)
    if (d->strides[static_cast<size_t>(i)] <= 0) return miopenStatusBadParm;
    step *= dims[i];
  }
  d->set = true;
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenDestroyTensorDescriptor(miopenTensorDescriptor_t d) {
  delete d;
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenCreateConvolutionDescriptor(miopenConvolutionDescriptor_t* c) {
  *c = new miopenConvolutionDescriptor();
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenInitConvolutionNdDescriptor(miopenConvolutionDescriptor_t c, int n,
                                                        const int* pads, const int* strides,
                                                        const int* dilations,
                                                        miopenConvolutionMode_t mode) {
  if (!c || n < 2 || n > 3 || mode != miopenConvolution) return miopenStatusBadParm;
  for (int i = 0; i < n; ++i)
    if (pads[i] < 0 || strides[i] < 1 || dilations[i] < 1) return miopenStatusBadParm;
  c->spatial = n;
  c->pads.assign(pads, pads + n);
  c->strides.assign(strides, strides + n);
  c->dilations.assign(dilations, dilations + n);
  c->set = true;
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenSetConvolutionGroupCount(miopenConvolutionDescriptor_t c, int g) {
  if (!c || g < 1) return miopenStatusBadParm;
  c->groups = g;
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenSetConvolutionAttribute(miopenConvolutionDescriptor_t c,
                                                    miopenConvolutionAttrib_t attr, int value) {
  if (!c) return miopenStatusBadParm;
  size_t v[3];
  version(v);
  if (attr == MIOPEN_CONVOLUTION_ATTRIB_FP16_ALT_IMPL) {  // since 2.16 (commit 3ddeaaad5)
    if (value < -1 || value > 1) return miopenStatusBadParm;
    c->fp16_alt_impl = value;
    return miopenStatusSuccess;
  }
  // DETERMINISTIC since 2.18 (commit 95716c2ed); before: "Attribute [1] does not exist"
  if (attr != MIOPEN_CONVOLUTION_ATTRIB_DETERMINISTIC || v[0] * 100 + v[1] < 218)
    return miopenStatusBadParm;
  c->deterministic = value != 0;
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenDestroyConvolutionDescriptor(miopenConvolutionDescriptor_t c) {
  delete c;
  return miopenStatusSuccess;
}

// ---- immediate mode ------------------------------------------------------------------------

namespace {

miopenStatus_t get_count(int dir, const Desc* a, const Desc* b,
                         const miopenConvolutionDescriptor* c, const Desc* out, size_t* n) {
  Problem p;
  if (miopenStatus_t s = problem_of(dir, a, b, c, out, &p)) return s;
  *n = solutions_of(p).size();
  return miopenStatusSuccess;
}

miopenStatus_t get_solutions(int dir, const Desc* a, const Desc* b,
                             const miopenConvolutionDescriptor* c, const Desc* out, size_t max,
                             size_t* n, miopenConvSolution_t* sol) {
  Problem p;
  if (miopenStatus_t s = problem_of(dir, a, b, c, out, &p)) return s;
  std::vector<miopenConvSolution_t> all = solutions_of(p);
  *n = std::min(max, all.size());
  for (size_t i = 0; i < *n; ++i) sol[i] = all[i];
  return miopenStatusSuccess;
}

miopenStatus_t workspace_size(int dir, const Desc* a, const Desc* b,
                              const miopenConvolutionDescriptor* c, const Desc* out,
                              uint64_t id, size_t* bytes) {
  Problem p;
  if (miopenStatus_t s = problem_of(dir, a, b, c, out, &p)) return s;
  if (!applicable(p, id)) return miopenStatusBadParm;  // "is not applicable to the problem"
  *bytes = solution(p, id).workspace_size;
  return miopenStatusSuccess;
}

miopenStatus_t compile(int dir, const Desc* a, const Desc* b,
                       const miopenConvolutionDescriptor* c, const Desc* out, uint64_t id) {
  Problem p;
  if (miopenStatus_t s = problem_of(dir, a, b, c, out, &p)) return s;
  return applicable(p, id) ? miopenStatusSuccess : miopenStatusBadParm;
}

miopenStatus_t immediate(int dir, miopenHandle_t h, const Desc* ad, const void* a,
                         const Desc* bd, const void* b, const miopenConvolutionDescriptor* c,
                         const Desc* od, void* out, void* ws, size_t ws_size, uint64_t id) {
  Problem p;
  if (!h) return miopenStatusBadParm;
  if (miopenStatus_t s = problem_of(dir, ad, bd, c, od, &p)) return s;
  if (!a || !b || !out) return miopenStatusBadParm;
  // Any applicable id, listed now or not (convolutionocl.cpp ConvolutionForwardImmediate).
  if (!applicable(p, id)) return miopenStatusBadParm;
  const size_t needed = solution(p, id).workspace_size;
  if (needed > 0) {
    if (!ws || ws_size < needed) return miopenStatusBadParm;
    std::memset(ws, 0xff, needed);  // scribble: the shim must not keep data there
  }
  if (dir == 0) convolve(0, p, b, a, nullptr, out);
  else if (dir == 1) convolve(1, p, nullptr, b, a, out);
  else convolve(2, p, b, nullptr, a, out);
  return miopenStatusSuccess;
}

}  // namespace

#define FDNN_DIRECTION(Prefix, dir)                                                              \
  EXPORT miopenStatus_t Prefix##GetSolutionCount(miopenHandle_t, miopenTensorDescriptor_t a,     \
                                                 miopenTensorDescriptor_t b,                     \
                                                 miopenConvolutionDescriptor_t c,                \
                                                 miopenTensorDescriptor_t o, size_t* n) {        \
    return get_count(dir, a, b, c, o, n);                                                        \
  }                                                                                              \
  EXPORT miopenStatus_t Prefix##GetSolution(                                                     \
      miopenHandle_t, miopenTensorDescriptor_t a, miopenTensorDescriptor_t b,                    \
      miopenConvolutionDescriptor_t c, miopenTensorDescriptor_t o, size_t max, size_t* n,        \
      miopenConvSolution_t* s) {                                                                 \
    return get_solutions(dir, a, b, c, o, max, n, s);                                            \
  }                                                                                              \
  EXPORT miopenStatus_t Prefix##GetSolutionWorkspaceSize(                                        \
      miopenHandle_t, miopenTensorDescriptor_t a, miopenTensorDescriptor_t b,                    \
      miopenConvolutionDescriptor_t c, miopenTensorDescriptor_t o, uint64_t id, size_t* bytes) { \
    return workspace_size(dir, a, b, c, o, id, bytes);                                           \
  }                                                                                              \
  EXPORT miopenStatus_t Prefix##CompileSolution(miopenHandle_t, miopenTensorDescriptor_t a,      \
                                                miopenTensorDescriptor_t b,                      \
                                                miopenConvolutionDescriptor_t c,                 \
                                                miopenTensorDescriptor_t o, uint64_t id) {       \
    return compile(dir, a, b, c, o, id);                                                         \
  }                                                                                              \
  EXPORT miopenStatus_t Prefix##Immediate(                                                       \
      miopenHandle_t h, miopenTensorDescriptor_t ad, const void* a, miopenTensorDescriptor_t bd, \
      const void* b, miopenConvolutionDescriptor_t c, miopenTensorDescriptor_t od, void* o,      \
      void* ws, size_t wss, uint64_t id) {                                                       \
    return immediate(dir, h, ad, a, bd, b, c, od, o, ws, wss, id);                               \
  }

FDNN_DIRECTION(miopenConvolutionForward, 0)
FDNN_DIRECTION(miopenConvolutionBackwardData, 1)
FDNN_DIRECTION(miopenConvolutionBackwardWeights, 2)

// ---- tensor ops ----------------------------------------------------------------------------

namespace {

int64_t element_space(const Desc& d) {
  int64_t span = 1;
  for (size_t k = 0; k < d.dims.size(); ++k) span += int64_t{d.dims[k] - 1} * d.strides[k];
  return span;
}

// MIOpen's IsPacked: the element space equals the element count (any memory order).
bool is_packed(const Desc& d) { return element_space(d) == count(d); }

// C's logical index of element i (row-major), into idx[0..nd).
void unravel(const Desc& c, int64_t i, int64_t* idx) {
  for (size_t k = c.dims.size(); k-- > 0;) {
    idx[k] = i % c.dims[k];
    i /= c.dims[k];
  }
}

// The offset of idx in d with every stride (broadcast dims of size 1 at index 0).
int64_t strided(const Desc& d, const int64_t* idx) {
  int64_t off = 0;
  for (size_t k = 0; k < d.dims.size(); ++k)
    if (d.dims[k] != 1) off += idx[k] * d.strides[k];
  return off;
}

// As MIOpen's generic tensor kernels index: no stride is passed for the last dim, so it is
// taken as 1 (Op4dTensorGeneric, Op5dTensorGeneric, OpTensorFwdBiasGeneric,
// OpTensorLeadingOnesGeneric in MIOpen@2d1fd997 src/kernels/MIOpenTensorKernels.cl).
int64_t last_stride_one(const Desc& d, const int64_t* idx) {
  const size_t last = d.dims.size() - 1;
  int64_t off = d.dims[last] != 1 ? idx[last] : 0;
  for (size_t k = 0; k < last; ++k)
    if (d.dims[k] != 1) off += idx[k] * d.strides[k];
  return off;
}

// Which kernel MIOpen's OpTensor runs (tensorocl.cpp OpTensor4d / OpTensorOther).
enum class Kernel { kFlat, kFwdBias, kLeadingOnes, kLastStrideOne, kStrided, kNotModelled };

Kernel choose_kernel(const Desc& a, const Desc& b, const Desc& c) {
  const size_t nd = c.dims.size();
  if (nd == 1 || nd == 2) return Kernel::kStrided;  // Op1d/Op2dTensorGeneric take every stride
  if (nd == 5) return Kernel::kLastStrideOne;        // Op5dTensorGeneric, always
  if (nd != 4) return Kernel::kNotModelled;          // OpTensor3d: the shim must not need it
  // bitmap: bit (3 - k) set where B's dim k is not 1; a one-element B counts as (1, K, 1, 1).
  unsigned bitmap = 0;
  size_t last_not_one = 0;
  for (size_t k = 0; k < 4; ++k)
    if (b.dims[k] != 1) bitmap |= 1u << (3 - k), last_not_one = k;
  if (count(b) == 1) bitmap = 4;
  const bool packed = is_packed(a) && is_packed(b) && is_packed(c);
  if (bitmap == 4) {  // "Forward Convolution Bias specialization"
    if (packed) return Kernel::kFwdBias;
    return count(b) == 1 ? Kernel::kNotModelled : Kernel::kLastStrideOne;
  }
  if (packed && count(b) == count(c)) return Kernel::kFlat;  // Op4dTensorLite
  bool leading_ones = true;  // B's dims other than 1 are a prefix (IsBitmapLeadingOnes)
  for (size_t k = 0; k < last_not_one; ++k) leading_ones &= b.dims[k] != 1;
  if (leading_ones && packed) return Kernel::kLeadingOnes;
  return Kernel::kLastStrideOne;
}

// Offsets of A, B and C for C's element i under the kernel's indexing.
void kernel_offsets(Kernel k, const Desc& a, const Desc& b, const Desc& c, int64_t i,
                    int64_t out[3]) {
  int64_t idx[5] = {0, 0, 0, 0, 0};
  unravel(c, i, idx);
  switch (k) {
    case Kernel::kFlat: out[0] = out[1] = out[2] = i; return;  // strides ignored
    case Kernel::kFwdBias: {
      // index = n * c_nstride + k * c_cstride + hw: each channel's H*W taken as contiguous
      // (NCHW), A read at C's index, B at its channel (ROCm/MIOpen#2860).
      const int64_t per_n = count(c) / c.dims[0], b_c = b.dims[1];
      const int64_t ch = b_c == 1 ? 0 : idx[1];
      const int64_t within = b_c == 1 ? i % per_n : (idx[2] * c.dims[3] + idx[3]);
      out[2] = out[0] = idx[0] * c.strides[0] + ch * c.strides[1] + within;
      out[1] = ch;
      return;
    }
    case Kernel::kLeadingOnes: {
      // index = n * c_nstride + c * c_cstride + h * c_w + w (+ the inner run): H's stride
      // taken as W's size, A read at C's index, B flat.
      out[2] = out[0] = idx[0] * c.strides[0] + idx[1] * c.strides[1] + idx[2] * c.dims[3] + idx[3];
      int64_t bflat = 0;
      for (size_t d = 0; d < 4; ++d) bflat = bflat * b.dims[d] + (b.dims[d] == 1 ? 0 : idx[d]);
      out[1] = bflat;
      return;
    }
    case Kernel::kLastStrideOne:
      out[0] = last_stride_one(a, idx), out[1] = last_stride_one(b, idx);
      out[2] = last_stride_one(c, idx);
      return;
    default: out[0] = strided(a, idx), out[1] = strided(b, idx), out[2] = strided(c, idx);
  }
}

// miopenMin/miopenMax of MIOpenTensorKernels.cl: `a < b ? a : b`, `a > b ? a : b`.
double tensor_op(miopenTensorOp_t op, double a, double b) {
  switch (op) {
    case miopenTensorOpAdd: return a + b;
    case miopenTensorOpMul: return a * b;
    case miopenTensorOpMin: return a < b ? a : b;
    default: return a > b ? a : b;
  }
}

// A host scalar in the tensor's own type, as SetTensor and ScaleTensor read it
// (visit_float's as_float<T> is a static_cast of the pointer).
double native_scalar(miopenDataType_t t, const void* p) {
  switch (t) {
    case miopenHalf: return fdnn_shim::half_to_float(*static_cast<const uint16_t*>(p));
    case miopenBFloat16: return fdnn_shim::bf16_to_float(*static_cast<const uint16_t*>(p));
    case miopenDouble: return *static_cast<const double*>(p);
    default: return *static_cast<const float*>(p);
  }
}

}  // namespace

EXPORT miopenStatus_t miopenConvolutionBackwardBias(miopenHandle_t h, const void* alpha,
                                                    miopenTensorDescriptor_t dy, const void* dyp,
                                                    const void* beta, miopenTensorDescriptor_t db,
                                                    void* dbp) {
  if (!h || !dy || !db || !dyp || !dbp || !dy->set || !db->set) return miopenStatusBadParm;
  // "bfloat16 not supported" (src/convolution_api.cpp)
  if (dy->type == miopenBFloat16 || dy->type == miopenDouble) return miopenStatusNotImplemented;
  if (db->dims.size() < 2 || dy->dims.size() < 2 || db->dims[1] != dy->dims[1])
    return miopenStatusBadParm;
  // "Only alpha=1 and beta=0 is supported" (MIOPEN_THROW: unknown error)
  if (*static_cast<const float*>(alpha) != 1.f || *static_cast<const float*>(beta) != 0.f)
    return miopenStatusUnknownError;
  // MIOpenConvBwdB gets dy's N and C strides only: each channel's map is read as contiguous,
  // and db is written contiguously, whatever its strides (convolutionocl.cpp).
  const int64_t N = dy->dims[0], K = dy->dims[1], map = count(*dy) / (N * K);
  for (int64_t k = 0; k < K; ++k) {
    double sum = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < map; ++i) sum += load(*dy, dyp, n * dy->strides[0] + k * dy->strides[1] + i);
    store(*db, dbp, k, sum);
  }
  return miopenStatusSuccess;
}

EXPORT miopenStatus_t miopenOpTensor(miopenHandle_t h, miopenTensorOp_t op, const void* alpha1,
                                     miopenTensorDescriptor_t ad, const void* A,
                                     const void* alpha2, miopenTensorDescriptor_t bd,
                                     const void* B, const void* beta,
                                     miopenTensorDescriptor_t cd, void* C) {
  if (!h || !ad || !bd || !cd || !A || !B || !C) return miopenStatusBadParm;
  // OpTensor's checks: A and C of one element count, B and C of one type and rank, B's dims 1
  // or C's, at most 5 dims.
  if (count(*ad) != count(*cd) || bd->type != cd->type || bd->dims.size() != cd->dims.size())
    return miopenStatusBadParm;
  for (size_t k = 0; k < cd->dims.size(); ++k)
    if (bd->dims[k] != 1 && bd->dims[k] != cd->dims[k]) return miopenStatusBadParm;
  // No bfloat16 type in MIOpenTensorKernels.cl: the kernel does not build (status unverified).
  if (cd->type == miopenBFloat16) return miopenStatusUnknownError;
  const Kernel kernel = choose_kernel(*ad, *bd, *cd);
  if (kernel == Kernel::kNotModelled) return miopenStatusNotImplemented;
  // alpha1, alpha2 and beta are read as float (`*(static_cast<const float*>(alpha0))`).
  const float a1 = *static_cast<const float*>(alpha1), a2 = *static_cast<const float*>(alpha2);
  const float be = *static_cast<const float*>(beta);
  for (int64_t i = 0; i < count(*cd); ++i) {
    int64_t off[3];
    kernel_offsets(kernel, *ad, *bd, *cd, i, off);
    double r = tensor_op(op, double(a1) * load(*ad, A, off[0]), double(a2) * load(*bd, B, off[1]));
    if (be != 0.f) r += double(be) * load(*cd, C, off[2]);  // beta = 0: C is not read
    store(*cd, C, off[2], r);
  }
  return miopenStatusSuccess;
}

// SetTensor and ScaleTensor: every stride, alpha in the tensor's type.
EXPORT miopenStatus_t miopenSetTensor(miopenHandle_t h, miopenTensorDescriptor_t d, void* y,
                                      const void* alpha) {
  if (!h || !d || !y || !alpha) return miopenStatusBadParm;
  const double v = native_scalar(d->type, alpha);
  for (int64_t i = 0; i < count(*d); ++i) store(*d, y, offset_of(*d, i), v);
  return miopenStatusSuccess;
}

EXPORT miopenStatus_t miopenScaleTensor(miopenHandle_t h, miopenTensorDescriptor_t d, void* y,
                                        const void* alpha) {
  if (!h || !d || !y || !alpha) return miopenStatusBadParm;
  // "ScaleTensor: unsupported data type" for anything but half, float, int32, double
  if (d->type == miopenBFloat16) return miopenStatusBadParm;
  const double v = native_scalar(d->type, alpha);
  for (int64_t i = 0; i < count(*d); ++i) {
    const int64_t o = offset_of(*d, i);
    store(*d, y, o, v * load(*d, y, o));
  }
  return miopenStatusSuccess;
}

EXPORT miopenStatus_t miopenCreateActivationDescriptor(miopenActivationDescriptor_t* d) {
  *d = new miopenActivationDescriptor();
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenSetActivationDescriptor(miopenActivationDescriptor_t d,
                                                    miopenActivationMode_t mode, double a,
                                                    double b, double g) {
  if (!d || mode < 0 || mode > miopenActivationELU) return miopenStatusBadParm;
  d->mode = mode, d->alpha = a, d->beta = b, d->gamma = g;
  return miopenStatusSuccess;
}
EXPORT miopenStatus_t miopenDestroyActivationDescriptor(miopenActivationDescriptor_t d) {
  delete d;
  return miopenStatusSuccess;
}

namespace {
// MIOpenNeuron.cl / activation_functions.h, computed in double here.
double activation(const miopenActivationDescriptor& d, double x, double epsilon) {
  switch (d.mode) {
    case miopenActivationLOGISTIC: return 1.0 / (1.0 + std::exp(-x));
    case miopenActivationTANH: return d.beta * std::tanh(d.alpha * x);
    case miopenActivationRELU: return x * (x > 0 ? 1.0 : 0.0);  // data * (data > 0)
    case miopenActivationSOFTRELU: return std::log1p(std::exp(x));
    case miopenActivationABS: return std::fabs(x);
    case miopenActivationPOWER: {  // arg <= EPSILON ? 0 : pow(arg, gamma)
      const double arg = d.alpha + d.beta * x;
      return arg <= epsilon ? 0.0 : std::pow(arg, d.gamma);
    }
    case miopenActivationCLIPPEDRELU: return std::fmin(d.alpha, std::fmax(0.0, x));
    case miopenActivationLEAKYRELU: return x * (x > 0 ? 1.0 : d.alpha);
    case miopenActivationELU: return x > 0 ? x : d.alpha * std::expm1(x);
    default: return x;
  }
}
}  // namespace

EXPORT miopenStatus_t miopenActivationForward(miopenHandle_t h, miopenActivationDescriptor_t d,
                                              const void* alpha, miopenTensorDescriptor_t xd,
                                              const void* x, const void* beta,
                                              miopenTensorDescriptor_t yd, void* y) {
  if (!h || !d || !xd || !yd || !x || !y || count(*xd) != count(*yd)) return miopenStatusBadParm;
  // "bfloat16 not supported for activation operation" (src/activ_api.cpp)
  if (xd->type == miopenBFloat16 || yd->type == miopenBFloat16) return miopenStatusNotImplemented;
  // "Only alpha=1 and beta=0 is supported" (src/ocl/activ_ocl.cpp)
  if (*static_cast<const float*>(alpha) != 1.f || *static_cast<const float*>(beta) != 0.f)
    return miopenStatusUnknownError;
  const double epsilon = yd->type == miopenHalf ? 1e-4 : 1e-6;
  // Packed x and y: one flat pass, strides ignored (src/solver/activ/fwd_0.cpp).
  const bool flat = is_packed(*xd) && is_packed(*yd);
  for (int64_t i = 0; i < count(*yd); ++i) {
    const int64_t xo = flat ? i : offset_of(*xd, i), yo = flat ? i : offset_of(*yd, i);
    store(*yd, y, yo, activation(*d, load(*xd, x, xo), epsilon));
  }
  return miopenStatusSuccess;
}
