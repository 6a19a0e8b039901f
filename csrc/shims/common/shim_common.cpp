#include "shim_common.hpp"

#if !defined(_WIN32)
#include <pthread.h>
#endif

#include <atomic>
#include <sstream>

namespace fdnn_shim {

namespace {
std::atomic<bool> forked_child{false};
[[maybe_unused]] void mark_forked_child() { forked_child.store(true, std::memory_order_relaxed); }
// Registered when the shim is loaded (a static initialiser of this translation unit, which
// every shim links through in_forked_child).
#if defined(_WIN32)
const int fork_handler_registered = 0;  // no fork() on Windows
#else
const int fork_handler_registered = pthread_atfork(nullptr, nullptr, mark_forked_child);
#endif
}  // namespace

bool in_forked_child() {
  (void)fork_handler_registered;
  return forked_child.load(std::memory_order_relaxed);
}

const char* op_name(FDNN_ConvOp op) {
  switch (op) {
    case FDNN_CONV_FORWARD: return "forward";
    case FDNN_CONV_BACKWARD_DATA: return "backward_data";
    case FDNN_CONV_BACKWARD_WEIGHT: return "backward_weight";
  }
  return "unknown";
}

const char* dtype_name(FDNN_DLDataType t) {
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 16) return "float16";
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 32) return "float32";
  if (t.code == FDNN_DTYPE_FLOAT && t.bits == 64) return "float64";
  if (t.code == FDNN_DTYPE_BFLOAT && t.bits == 16) return "bfloat16";
  return "unsupported-dtype";
}

static void put_tensor(std::ostringstream& os, const char* name, const FDNN_DLTensor* t) {
  if (!has_tensor(t)) return;
  os << ' ' << name << "=[";
  for (int i = 0; i < t->ndim; ++i) os << (i ? "," : "") << t->shape[i];
  os << "]/strides[";
  for (int i = 0; i < t->ndim; ++i) os << (i ? "," : "") << t->strides[i];
  os << "]/" << dtype_name(t->dtype);
}

static void put_dims(std::ostringstream& os, const char* name, const int64_t* v, int n) {
  os << ' ' << name << "=(";
  for (int i = 0; i < n; ++i) os << (i ? "," : "") << v[i];
  os << ')';
}

std::string describe_problem(const FDNN_Conv_Plan_Create_Args& a) {
  std::ostringstream os;
  os << "conv" << a.spatial_rank << "d " << op_name(a.op);
  put_tensor(os, "x", a.x);
  put_tensor(os, "w", a.w);
  put_tensor(os, "y", a.y);
  put_tensor(os, "bias", a.bias);
  int n = a.spatial_rank;
  put_dims(os, "stride", a.stride, n);
  put_dims(os, "dilation", a.dilation, n);
  put_dims(os, "padding_lo", a.padding_lo, n);
  put_dims(os, "padding_hi", a.padding_hi, n);
  os << " groups=" << a.groups;
  return os.str();
}

}  // namespace fdnn_shim
