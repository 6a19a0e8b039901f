// Test double of MIOpen (libMIOpen.so.1) for the MIOpen shim: the functions the shim declares
// (csrc/shims/miopen/miopen_api.hpp), on host memory, with a naive reference convolution in
// double accumulation. It is strict about MIOpen's documented contracts, so that the shim's
// plumbing is checked against them:
//  - immediate mode: a solution id must have been returned by GetSolution for the same
//    problem before CompileSolution or Immediate; the workspace must be at least the size the
//    solution reported (and it is scribbled on, so a shim that keeps data there shows);
//  - layouts are read from strides: x, w and y must be in one layout (NCHW or NHWC order);
//  - symmetric padding only (one pad per spatial dim, as MIOpen's descriptor has);
//  - no grouped convolution with dilation; no float64 convolution;
//  - no bias gradient for bfloat16 or NHWC, and alpha/beta other than (1, 0) refused there;
//  - outputs of beta = 0 calls are not read (NaN-poisoned outputs stay harmless).
// It checks plumbing only; it says nothing about AMD GPUs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
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
};
struct miopenActivationDescriptor {
  miopenActivationMode_t mode = miopenActivationPASTHRU;
  double alpha = 0, beta = 0, gamma = 0;
};

namespace {

using Desc = miopenTensorDescriptor;

std::mutex registry_mutex;
std::set<std::string> returned_solutions;  // "problem|id" pairs GetSolution handed out

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

std::string key_of(const Desc& d) {
  std::string k = std::to_string(d.type) + ":";
  for (size_t i = 0; i < d.dims.size(); ++i)
    k += std::to_string(d.dims[i]) + "/" + std::to_string(d.strides[i]) + ",";
  return k;
}

// One convolution problem in forward terms: x, w, y.
struct Problem {
  const Desc *x, *w, *y;
  const miopenConvolutionDescriptor* conv;
  std::string key;
};

miopenStatus_t check_problem(int direction, const Desc* x, const Desc* w, const Desc* y,
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
    if (G > 1 && c->dilations[s] != 1) return miopenStatusNotImplemented;
    const int64_t in = x->dims[2 + s], k = w->dims[2 + s];
    const int64_t out = (in + 2 * c->pads[s] - c->dilations[s] * (k - 1) - 1) / c->strides[s] + 1;
    if (out != y->dims[2 + s]) return miopenStatusBadParm;
  }
  p->x = x, p->w = w, p->y = y, p->conv = c;
  p->key = std::to_string(direction) + "|" + key_of(*x) + key_of(*w) + key_of(*y) + "|g" +
           std::to_string(G);
  for (int s = 0; s < c->spatial; ++s)
    p->key += "|" + std::to_string(c->pads[s]) + "," + std::to_string(c->strides[s]) + "," +
              std::to_string(c->dilations[s]);
  return miopenStatusSuccess;
}

// (a, b, c) of the direction back to (x, w, y).
miopenStatus_t problem_of(int direction, const Desc* a, const Desc* b,
                          const miopenConvolutionDescriptor* c, const Desc* out, Problem* p) {
  if (direction == 0) return check_problem(0, b, a, out, c, p);  // (w, x, conv, y)
  if (direction == 1) return check_problem(1, out, b, a, c, p);  // (dy, w, conv, dx)
  return check_problem(2, b, out, a, c, p);                      // (dy, x, conv, dw)
}

// Two solutions: a "GEMM" one that needs workspace (first: MIOpen's heuristic order), and a
// "Direct" one without. Deterministic descriptors get only the direct one.
std::vector<miopenConvSolution_t> solutions_of(const Problem& p) {
  std::vector<miopenConvSolution_t> s;
  const size_t gemm_ws = static_cast<size_t>(count(*p.y)) * 4 + 64;
  if (!p.conv->deterministic) s.push_back({1.0f, gemm_ws, 2, miopenConvolutionAlgoGEMM});
  s.push_back({2.0f, 0, 1, miopenConvolutionAlgoDirect});
  return s;
}

const miopenConvSolution_t* find_solution(const Problem& p, uint64_t id,
                                          std::vector<miopenConvSolution_t>* all) {
  *all = solutions_of(p);
  for (const auto& s : *all)
    if (s.solution_id == id) return &s;
  return nullptr;
}

bool was_returned(const Problem& p, uint64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return returned_solutions.count(p.key + "#" + std::to_string(id)) > 0;
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

bool same_dims(const Desc& a, const Desc& b) { return a.dims == b.dims && a.type == b.type; }

}  // namespace

// ---- handle, descriptors -------------------------------------------------------------------

EXPORT miopenStatus_t miopenGetVersion(size_t* major, size_t* minor, size_t* patch) {
  if (major) *major = 3;
  if (minor) *minor = 1;
  if (patch) *patch = 0;
  return miopenStatusSuccess;
}
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
    if (d->strides[static_cast<size_t>(i)] < 0) return miopenStatusBadParm;
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
  if (!c || attr != MIOPEN_CONVOLUTION_ATTRIB_DETERMINISTIC) return miopenStatusBadParm;
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
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (size_t i = 0; i < *n; ++i) {
    sol[i] = all[i];
    returned_solutions.insert(p.key + "#" + std::to_string(all[i].solution_id));
  }
  return miopenStatusSuccess;
}

miopenStatus_t workspace_size(int dir, const Desc* a, const Desc* b,
                              const miopenConvolutionDescriptor* c, const Desc* out,
                              uint64_t id, size_t* bytes) {
  Problem p;
  if (miopenStatus_t s = problem_of(dir, a, b, c, out, &p)) return s;
  std::vector<miopenConvSolution_t> all;
  const miopenConvSolution_t* s = find_solution(p, id, &all);
  if (!s) return miopenStatusBadParm;
  *bytes = s->workspace_size;
  return miopenStatusSuccess;
}

miopenStatus_t compile(int dir, const Desc* a, const Desc* b,
                       const miopenConvolutionDescriptor* c, const Desc* out, uint64_t id) {
  Problem p;
  if (miopenStatus_t s = problem_of(dir, a, b, c, out, &p)) return s;
  return was_returned(p, id) ? miopenStatusSuccess : miopenStatusBadParm;
}

miopenStatus_t immediate(int dir, miopenHandle_t h, const Desc* ad, const void* a,
                         const Desc* bd, const void* b, const miopenConvolutionDescriptor* c,
                         const Desc* od, void* out, void* ws, size_t ws_size, uint64_t id) {
  Problem p;
  if (!h) return miopenStatusBadParm;
  if (miopenStatus_t s = problem_of(dir, ad, bd, c, od, &p)) return s;
  if (!a || !b || !out) return miopenStatusBadParm;
  // Call order: the id must come from GetSolution for this very problem.
  if (!was_returned(p, id)) return miopenStatusBadParm;
  std::vector<miopenConvSolution_t> all;
  const miopenConvSolution_t* s = find_solution(p, id, &all);
  if (!s) return miopenStatusBadParm;
  if (s->workspace_size > 0) {
    if (!ws || ws_size < s->workspace_size) return miopenStatusBadParm;
    std::memset(ws, 0xff, s->workspace_size);  // scribble: the shim must not keep data there
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

EXPORT miopenStatus_t miopenConvolutionBackwardBias(miopenHandle_t h, const void* alpha,
                                                    miopenTensorDescriptor_t dy, const void* dyp,
                                                    const void* beta, miopenTensorDescriptor_t db,
                                                    void* dbp) {
  if (!h || !dy || !db || !dyp || !dbp || !dy->set || !db->set) return miopenStatusBadParm;
  if (dy->type == miopenBFloat16 || dy->type == miopenDouble) return miopenStatusNotImplemented;
  if (!(layouts(*dy) & 1)) return miopenStatusNotImplemented;  // NCHW only
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  if (a != 1.f || b != 0.f) return miopenStatusNotImplemented;
  if (db->type != dy->type || db->dims.size() != dy->dims.size() || db->dims[1] != dy->dims[1])
    return miopenStatusBadParm;
  View Y(*dy);
  for (int64_t k = 0; k < Y.n[1]; ++k) {
    double sum = 0;
    for (int64_t n = 0; n < Y.n[0]; ++n)
      for (int64_t z = 0; z < Y.n[2]; ++z)
        for (int64_t y = 0; y < Y.n[3]; ++y)
          for (int64_t x = 0; x < Y.n[4]; ++x) sum += load(*dy, dyp, Y.at(n, k, z, y, x));
    store(*db, dbp, k * db->strides[1], sum);
  }
  return miopenStatusSuccess;
}

EXPORT miopenStatus_t miopenOpTensor(miopenHandle_t h, miopenTensorOp_t op, const void* alpha1,
                                     miopenTensorDescriptor_t ad, const void* A,
                                     const void* alpha2, miopenTensorDescriptor_t bd,
                                     const void* B, const void* beta,
                                     miopenTensorDescriptor_t cd, void* C) {
  if (!h || !ad || !bd || !cd || !A || !B || !C || !same_dims(*ad, *cd)) return miopenStatusBadParm;
  if (bd->type != cd->type || bd->dims.size() != cd->dims.size()) return miopenStatusBadParm;
  for (size_t k = 0; k < cd->dims.size(); ++k)
    if (bd->dims[k] != 1 && bd->dims[k] != cd->dims[k]) return miopenStatusBadParm;
  const float a1 = *static_cast<const float*>(alpha1), a2 = *static_cast<const float*>(alpha2);
  const float be = *static_cast<const float*>(beta);
  for (int64_t i = 0; i < count(*cd); ++i) {
    int64_t bo = 0, rest = i;
    for (size_t k = cd->dims.size(); k-- > 0;) {
      const int64_t idx = rest % cd->dims[k];
      rest /= cd->dims[k];
      if (bd->dims[k] != 1) bo += idx * bd->strides[k];
    }
    const double av = double(a1) * load(*ad, A, offset_of(*ad, i));
    const double bv = double(a2) * load(*bd, B, bo);
    double r = op == miopenTensorOpAdd ? av + bv
               : op == miopenTensorOpMul ? av * bv
               : op == miopenTensorOpMin ? std::fmin(av, bv)
                                         : std::fmax(av, bv);
    const int64_t co = offset_of(*cd, i);
    if (be != 0.f) r += double(be) * load(*cd, C, co);  // beta = 0: C is not read
    store(*cd, C, co, r);
  }
  return miopenStatusSuccess;
}

EXPORT miopenStatus_t miopenSetTensor(miopenHandle_t h, miopenTensorDescriptor_t d, void* y,
                                      const void* alpha) {
  if (!h || !d || !y) return miopenStatusBadParm;
  const float v = *static_cast<const float*>(alpha);
  for (int64_t i = 0; i < count(*d); ++i) store(*d, y, offset_of(*d, i), v);
  return miopenStatusSuccess;
}

EXPORT miopenStatus_t miopenScaleTensor(miopenHandle_t h, miopenTensorDescriptor_t d, void* y,
                                        const void* alpha) {
  if (!h || !d || !y) return miopenStatusBadParm;
  const float v = *static_cast<const float*>(alpha);
  for (int64_t i = 0; i < count(*d); ++i) {
    const int64_t o = offset_of(*d, i);
    store(*d, y, o, double(v) * load(*d, y, o));
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
double activation(const miopenActivationDescriptor& d, double x) {
  switch (d.mode) {
    case miopenActivationLOGISTIC: return 1.0 / (1.0 + std::exp(-x));
    case miopenActivationTANH: return d.beta * std::tanh(d.alpha * x);
    case miopenActivationRELU: return x > 0 ? x : 0;
    case miopenActivationSOFTRELU: return std::log1p(std::exp(x));
    case miopenActivationABS: return std::fabs(x);
    case miopenActivationPOWER: return std::pow(d.alpha + d.beta * x, d.gamma);
    case miopenActivationCLIPPEDRELU: return std::fmin(d.alpha, std::fmax(0.0, x));
    case miopenActivationLEAKYRELU: return x > 0 ? x : d.alpha * x;
    case miopenActivationELU: return x > 0 ? x : d.alpha * std::expm1(x);
    default: return x;
  }
}
}  // namespace

EXPORT miopenStatus_t miopenActivationForward(miopenHandle_t h, miopenActivationDescriptor_t d,
                                              const void* alpha, miopenTensorDescriptor_t xd,
                                              const void* x, const void* beta,
                                              miopenTensorDescriptor_t yd, void* y) {
  if (!h || !d || !xd || !yd || !x || !y || !same_dims(*xd, *yd)) return miopenStatusBadParm;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  for (int64_t i = 0; i < count(*yd); ++i) {
    const int64_t yo = offset_of(*yd, i);
    double r = double(a) * activation(*d, load(*xd, x, offset_of(*xd, i)));
    if (b != 0.f) r += double(b) * load(*yd, y, yo);
    store(*yd, y, yo, r);
  }
  return miopenStatusSuccess;
}
