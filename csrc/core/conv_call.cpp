#include "conv_call.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>

#include "dlpack_exchange.hpp"
#include "dlpack_intake.hpp"
#include "errors.hpp"
#include "numpy_arrays.hpp"

namespace py = pybind11;

namespace fdnn_core {

using fdnn_client::Plan;
using fdnn_client::plan_cache;

namespace {

// The user-facing names of the ABI's x, w, y, bias for each op, and which ones it writes.
struct Roles {
  const char* x;
  const char* w;
  const char* y;
  const char* bias;
  bool writes_x, writes_w, writes_y, writes_bias;
};

const Roles& roles_of(int32_t op) {
  static const Roles forward{"x", "w", "out", "bias", false, false, true, false};
  static const Roles backward_data{"out", "w", "dy", "bias", true, false, false, false};
  static const Roles backward_weight{"x", "out", "dy", "bias_out", false, true, false, true};
  if (op == FDNN_CONV_BACKWARD_DATA) return backward_data;
  if (op == FDNN_CONV_BACKWARD_WEIGHT) return backward_weight;
  return forward;
}

void warn(const std::string& message) {
  if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) throw py::error_already_set();
}

std::string device_text(const FDNN_DLDevice& d) {
  return "device type " + std::to_string(d.device_type) + " id " + std::to_string(d.device_id);
}

void check_memory(const BorrowedTensor* all[4], const char* const names[4], const bool written[4]);

// Checks what the ABI promises the shim: same device and dtype everywhere, the shim's
// device type, ranks, and writable outputs. The Python layer has said all this with better
// words already; this is the last line, so that no caller of the core can break a shim.
void check_operands(const Shim& shim, const ConvSpec& spec, const Roles& r,
                    const BorrowedTensor& x, const BorrowedTensor& w, const BorrowedTensor& y,
                    const BorrowedTensor& bias) {
  const BorrowedTensor* all[] = {&x, &w, &y, &bias};
  const char* names[] = {r.x, r.w, r.y, r.bias};
  const bool written[] = {r.writes_x, r.writes_w, r.writes_y, r.writes_bias};
  const FDNN_DLDevice device = x.desc().device;
  if (device.device_type != shim.device_type())
    throw py::value_error(std::string(r.x) + ": array is on " + device_text(device) +
                          ", but shim '" + shim.name() + "' serves device type " +
                          std::to_string(shim.device_type()));
  for (int i = 0; i < 4; ++i) {
    if (!all[i]->present()) continue;
    const FDNN_DLTensor& t = all[i]->desc();
    int want_ndim = i == 3 ? 1 : spec.params.spatial_rank + 2;
    if (t.ndim != want_ndim)
      throw py::value_error(std::string(names[i]) + ": expected " + std::to_string(want_ndim) +
                            " dimensions, got " + std::to_string(t.ndim));
    if (t.device.device_type != device.device_type || t.device.device_id != device.device_id)
      throw py::value_error(std::string(names[i]) + " is on " + device_text(t.device) + " but " +
                            r.x + " is on " + device_text(device));
    if (std::memcmp(&t.dtype, &x.desc().dtype, sizeof t.dtype) != 0)
      throw py::type_error(std::string(names[i]) + " and " + r.x + " have different dtypes");
    if (written[i] && all[i]->read_only())
      throw py::value_error(std::string(names[i]) + ": the array is read-only");
  }
  check_memory(all, names, written);
}

// Whether the array's `data` is an object, not an address (Metal: an id<MTLBuffer>): then
// data + byte_offset means nothing, and a shim takes data and offset apart (ABI 2.1's
// FDNN_Buffer_Offsets).
bool data_is_object(const BorrowedTensor& t) {
  return t.desc().device.device_type == FDNN_DEVICE_METAL;
}

// What Conv_Plan_Execute gets for an array: its first element, or on Metal its buffer.
void* execute_pointer(const BorrowedTensor& t) {
  if (!t.present()) return nullptr;
  return data_is_object(t) ? t.desc().data : t.first_element();
}

uint64_t offset_of(const BorrowedTensor& t) {
  return t.present() && data_is_object(t) ? t.desc().byte_offset : 0;
}

// [first byte, one past the last byte] an array touches; on Metal, bytes into its buffer
// (arrays of two buffers never overlap: check_memory compares the buffers first).
std::pair<uintptr_t, uintptr_t> byte_extent(const BorrowedTensor& t) {
  const FDNN_DLTensor& d = t.desc();
  uintptr_t first = data_is_object(t) ? static_cast<uintptr_t>(d.byte_offset)
                                      : reinterpret_cast<uintptr_t>(t.first_element());
  uint64_t span = 1;
  for (int i = 0; i < d.ndim; ++i) span += static_cast<uint64_t>(d.shape[i] - 1) * d.strides[i];
  return {first, first + span * ((d.dtype.bits + 7) / 8)};
}

// Layout rules no vendor can serve: negative strides anywhere; a written array whose
// elements overlap (a zero stride); a written array that shares memory with an operand.
void check_memory(const BorrowedTensor* all[4], const char* const names[4], const bool written[4]) {
  for (int i = 0; i < 4; ++i) {
    if (!all[i]->present()) continue;
    const FDNN_DLTensor& d = all[i]->desc();
    for (int k = 0; k < d.ndim; ++k) {
      if (d.strides[k] < 0)
        throw py::value_error(std::string(names[i]) + ": negative strides are not supported "
                              "(pass a copy, e.g. numpy.ascontiguousarray)");
      if (written[i] && d.strides[k] == 0 && d.shape[k] > 1)
        throw py::value_error(std::string(names[i]) + ": the output has overlapping elements "
                              "(a zero stride, as from broadcasting)");
    }
  }
  for (int i = 0; i < 4; ++i) {
    if (!written[i] || !all[i]->present()) continue;
    auto [lo, hi] = byte_extent(*all[i]);
    for (int j = 0; j < 4; ++j) {
      if (j == i || !all[j]->present()) continue;
      if (data_is_object(*all[i]) && all[i]->desc().data != all[j]->desc().data) continue;
      auto [other_lo, other_hi] = byte_extent(*all[j]);
      if (lo < other_hi && other_lo < hi)
        throw py::value_error(std::string(names[i]) + " shares memory with " + names[j] +
                              "; the result must go to memory no operand uses");
    }
  }
}

void* stream_pointer(py::handle stream) {
  if (stream.is_none()) return nullptr;
  if (!PyLong_Check(stream.ptr()))
    throw py::type_error("stream: the shim's stream must be an int (a pointer) or None, got " +
                         std::string(py::str(py::type::handle_of(stream).attr("__name__"))));
  return reinterpret_cast<void*>(stream.cast<uintptr_t>());
}

// The array library's allocator could not give a plan its workspace.
struct WorkspaceRefused {
  size_t bytes;
  std::string reason;
};

// The one warning for memory the array library refused (execute's workspace, or the buffers
// a benchmark times on), whichever comes first in the process.
void warn_refused_once(const WorkspaceRefused& refused, const char* what_now) {
  static std::once_flag warned;
  std::call_once(warned, [&] {
    warn("flux_dnn: the array library refused " + std::to_string(refused.bytes) +
         " bytes of convolution workspace (" + refused.reason + "); " + what_now +
         ". This warning is shown once.");
  });
}

// ABI 2.2's FDNN_Device_Allocator over the array library's allocator (workspace_alloc, the
// same that gives execute its workspace), so that a benchmarking shim takes its scratch from
// the library's pool. The shim calls it on this thread without the GIL; each buffer is an
// array kept alive here until the shim releases it (the pool reuses it in stream order).
// Destroyed with the GIL held (declared before the GIL is released).
class PlanAllocator {
 public:
  PlanAllocator(py::handle workspace_alloc, const CallStream& stream)
      : workspace_alloc_(workspace_alloc), stream_(stream.dlpack) {
    ext_.struct_size = FDNN_Device_Allocator_STRUCT_SIZE;
    ext_.type = FDNN_EXTENSION_DEVICE_ALLOCATOR;
    ext_.context = this;
    ext_.allocate = &PlanAllocator::allocate;
    ext_.release = &PlanAllocator::release;
  }
  FDNN_Extension_Base* chain() { return reinterpret_cast<FDNN_Extension_Base*>(&ext_); }
  const std::optional<WorkspaceRefused>& refused() const { return refused_; }

 private:
  static void* allocate(void* context, size_t bytes, void* /*stream*/) {
    auto* self = static_cast<PlanAllocator*>(context);
    py::gil_scoped_acquire gil;
    try {
      py::object array = self->workspace_alloc_(bytes);
      BorrowedTensor buffer(array, "workspace", self->stream_);
      void* first = buffer.first_element();
      if (reinterpret_cast<uintptr_t>(first) % 256 != 0) {
        self->refused_ = WorkspaceRefused{bytes, "its buffer is not aligned to 256 bytes"};
        return nullptr;
      }
      self->held_.emplace_back(first, std::move(array));
      return first;
    } catch (py::error_already_set& e) {
      self->refused_ = WorkspaceRefused{bytes, std::string(py::str(e.value()))};
    } catch (const std::exception& e) {
      self->refused_ = WorkspaceRefused{bytes, e.what()};
    }
    return nullptr;
  }
  static void release(void* context, void* pointer, void* /*stream*/) {
    auto* self = static_cast<PlanAllocator*>(context);
    py::gil_scoped_acquire gil;
    auto& held = self->held_;
    for (auto it = held.begin(); it != held.end(); ++it)
      if (it->first == pointer) {
        held.erase(it);
        return;
      }
  }

  FDNN_Device_Allocator ext_{};
  py::handle workspace_alloc_, stream_;  // stream_: what the workspace's __dlpack__ takes
  std::vector<std::pair<void*, py::object>> held_;  // a benchmark holds five at most
  std::optional<WorkspaceRefused> refused_;
};

// The cached plan for spec on these tensors, made (without the GIL) on a miss. The key is
// written into this thread's buffer: a hit allocates nothing once the buffer has grown (the
// cache copies a key only when it inserts a plan). On GPUs (workspace_alloc given), the
// buffers a benchmark times on come from the array library's allocator.
std::shared_ptr<Plan> cached_plan(const Shim& shim, const ConvSpec& spec, const BorrowedTensor& x,
                                  const BorrowedTensor& w, const BorrowedTensor& y,
                                  const BorrowedTensor& bias, const CallStream& stream,
                                  py::handle workspace_alloc = py::none()) {
  thread_local std::string key;
  const FDNN_DLTensor* bias_desc = bias.present() ? &bias.desc() : nullptr;
  fdnn_client::write_plan_key(key, shim, x.desc().device.device_id, spec.key, x.desc(), w.desc(),
                              y.desc(), bias_desc);
  if (std::shared_ptr<Plan> plan = plan_cache().find(key)) return plan;
  FDNN_Conv_Plan_Create_Args args = fdnn_client::plan_create_args(
      spec.params, x.desc(), w.desc(), y.desc(), bias_desc, stream.shim);
  std::optional<PlanAllocator> allocator;
  if (!workspace_alloc.is_none() && spec.params.algo_policy == FDNN_ALGO_BENCHMARK) {
    allocator.emplace(workspace_alloc, stream);
    args.extension_start = allocator->chain();
  }
  std::shared_ptr<Plan> plan;
  {
    py::gil_scoped_release no_gil;  // the vendor plans; evicted plans are destroyed
    plan = plan_cache().insert(key, fdnn_client::create_plan(shim, args, key));
  }
  if (allocator && allocator->refused())
    warn_refused_once(*allocator->refused(), "benchmarking with less memory, or not at all");
  return plan;
}

// Whether a convolution is small enough to run with the GIL held: CPU work of at most 2^15
// multiply-adds (a few microseconds at most), where releasing and taking back the GIL would
// cost a tenth of the call, as NumPy keeps it for short loops. y is the op's y (K channels),
// so the count is y's elements times a filter's, for every op.
bool keeps_gil(const FDNN_DLTensor& x, const FDNN_DLTensor& w, const FDNN_DLTensor& y) {
  constexpr double kSmallMacs = 1 << 15;
  if (x.device.device_type != FDNN_DEVICE_CPU || w.ndim < 1 || w.shape[0] < 1) return false;
  double macs = 1;
  for (int i = 0; i < y.ndim; ++i) macs *= static_cast<double>(y.shape[i]);
  for (int i = 1; i < w.ndim; ++i) macs *= static_cast<double>(w.shape[i]);
  return macs <= kSmallMacs;
}

// Executes a plan on first-element pointers, with a workspace from the per-thread CPU buffer
// or, on GPUs, from the array library's allocator; without the GIL unless keep_gil.
// `offsets` is chained when the arrays' data are objects (Metal), else NULL.
void execute(const Plan& plan, void* x, void* w, void* y, void* bias, const CallStream& stream,
             py::handle workspace_alloc, FDNN_Buffer_Offsets* offsets = nullptr,
             bool keep_gil = false) {
  FDNN_Conv_Plan_Execute_Args e{};
  e.x = x;
  e.w = w;
  e.y = y;
  e.bias = bias;
  e.extension_start = reinterpret_cast<FDNN_Extension_Base*>(offsets);
  e.workspace_size = plan.workspace_size;
  e.stream = stream.shim;
  py::object workspace_array;  // keeps a GPU workspace alive until the work is enqueued
  std::optional<BorrowedTensor> workspace;
  if (plan.workspace_size > 0) {
    if (workspace_alloc.is_none()) {
      e.workspace = fdnn_client::host_workspace(plan.workspace_size);
    } else {
      try {
        workspace_array = workspace_alloc(plan.workspace_size);
      } catch (py::error_already_set& refused) {
        throw WorkspaceRefused{plan.workspace_size, std::string(py::str(refused.value()))};
      }
      workspace.emplace(workspace_array, "workspace", stream.dlpack);
      e.workspace = execute_pointer(*workspace);
      if (offsets != nullptr) offsets->workspace_offset = offset_of(*workspace);
    }
  }
  if (keep_gil) {
    fdnn_client::execute_plan(plan, e);
    return;
  }
  py::gil_scoped_release no_gil;
  fdnn_client::execute_plan(plan, e);
}

}  // namespace

CallStream CallStream::of(py::handle stream) {
  CallStream s;
  if (stream.is_none()) {
    s.dlpack = stream;
  } else if (PyTuple_Check(stream.ptr())) {
    if (PyTuple_GET_SIZE(stream.ptr()) != 2)
      throw py::type_error("stream: expected None, an int, or a pair (shim stream pointer, "
                           "__dlpack__ stream argument); got a tuple of " +
                           std::to_string(PyTuple_GET_SIZE(stream.ptr())));
    s.shim = stream_pointer(PyTuple_GET_ITEM(stream.ptr(), 0));
    s.dlpack = PyTuple_GET_ITEM(stream.ptr(), 1);
  } else {
    s.shim = stream_pointer(stream);  // CUDA, ROCm: DLPack's stream int is the shim's pointer
    s.dlpack = stream;
  }
  return s;
}

void ConvSpec::finish() {
  key.clear();
  fdnn_client::append_params(key, params);
}

void run_conv(const Shim& shim, const ConvSpec& spec, py::handle x_array, py::handle w_array,
              py::handle y_array, py::handle bias_array, py::handle stream_arg,
              py::handle workspace_alloc) {
  const Roles& r = roles_of(spec.params.op);
  const CallStream stream = CallStream::of(stream_arg);
  const py::handle producer_stream = stream.dlpack;
  BorrowedTensor x(x_array, r.x, producer_stream), w(w_array, r.w, producer_stream);
  BorrowedTensor y(y_array, r.y, producer_stream);
  BorrowedTensor bias(bias_array, r.bias, producer_stream);  // None: not present
  check_operands(shim, spec, r, x, w, y, bias);
  FDNN_Buffer_Offsets offsets{FDNN_Buffer_Offsets_STRUCT_SIZE, FDNN_EXTENSION_BUFFER_OFFSETS,
                              nullptr, offset_of(x), offset_of(w), offset_of(y), offset_of(bias),
                              0};
  const bool keep_gil = keeps_gil(x.desc(), w.desc(), y.desc());
  auto run = [&](const Plan& plan) {
    execute(plan, execute_pointer(x), execute_pointer(w), execute_pointer(y),
            execute_pointer(bias), stream, workspace_alloc,
            data_is_object(x) ? &offsets : nullptr, keep_gil);
  };
  std::shared_ptr<Plan> plan = cached_plan(shim, spec, x, w, y, bias, stream, workspace_alloc);
  try {
    run(*plan);
  } catch (const WorkspaceRefused& refused) {
    // The allocator (or its cap) refused: use a plan that needs no workspace, and say so once.
    ConvSpec lean = spec;
    lean.params.workspace_limit = 0;
    lean.finish();
    std::shared_ptr<Plan> fallback = cached_plan(shim, lean, x, w, y, bias, stream, workspace_alloc);
    warn_refused_once(refused, "using algorithms that need none, which may be slower");
    try {
      run(*fallback);
    } catch (const WorkspaceRefused&) {
      throw std::bad_alloc();  // even the leanest plan needs workspace the allocator refuses
    }
  }
}

py::dict plan_info(const Shim& shim, const ConvSpec& spec, py::handle x_array, py::handle w_array,
                   py::handle y_array, py::handle bias_array, py::handle stream_arg) {
  const Roles& r = roles_of(spec.params.op);
  const CallStream stream = CallStream::of(stream_arg);
  const py::handle producer_stream = stream.dlpack;
  BorrowedTensor x(x_array, r.x, producer_stream), w(w_array, r.w, producer_stream);
  BorrowedTensor y(y_array, r.y, producer_stream);
  BorrowedTensor bias(bias_array, r.bias, producer_stream);
  check_operands(shim, spec, r, x, w, y, bias);
  std::shared_ptr<Plan> plan = cached_plan(shim, spec, x, w, y, bias, stream);
  py::dict info;
  info["workspace_size"] = plan->workspace_size;
  info["algo_id"] = plan->algo_id;
  info["algo_name"] = plan->algo_name;
  return info;
}

namespace {

std::string dims_text(const int64_t* v, int n) {
  std::string out = "(";
  for (int i = 0; i < n; ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + (n == 1 ? ",)" : ")");
}

}  // namespace

TensorSignature TensorSignature::of(const BorrowedTensor& t) {
  TensorSignature s;
  s.present = t.present();
  if (!s.present) return s;
  const FDNN_DLTensor& d = t.desc();
  s.ndim = d.ndim;
  s.dtype = d.dtype;
  std::copy(d.shape, d.shape + d.ndim, s.shape);
  std::copy(d.strides, d.strides + d.ndim, s.strides);
  s.alignment = fdnn_client::data_alignment(d);
  s.device = d.device;
  return s;
}

// Strides are compared where they reach an element: a dim of size 1 is only ever indexed 0,
// so its stride is no part of the layout (NumPy and torch leave it arbitrary, and
// np.ascontiguousarray keeps a source's), as the ABI's shims read layouts too.
bool TensorSignature::same_strides(const TensorSignature& o) const {
  for (int i = 0; i < ndim; ++i)
    if (shape[i] != 1 && strides[i] != o.strides[i]) return false;
  return true;
}

// What differs from the planned signature, in words; "" when the array fits it (an empty
// string: a call that fits allocates nothing).
std::string TensorSignature::mismatch(const TensorSignature& planned) const {
  if (present != planned.present) return present ? "it was made without one" : "it was made with one";
  if (!present) return "";
  if (ndim != planned.ndim || !std::equal(shape, shape + ndim, planned.shape))
    return "shape " + dims_text(shape, ndim) + " is not the planned " + dims_text(planned.shape, planned.ndim);
  if (std::memcmp(&dtype, &planned.dtype, sizeof dtype) != 0)
    return "its dtype (" + std::to_string(dtype.bits) + "-bit, DLPack code " + std::to_string(dtype.code) +
           ") is not the planned one";
  if (!same_strides(planned))
    return "strides " + dims_text(strides, ndim) + " are not the planned layout " + dims_text(planned.strides, ndim);
  if (alignment != planned.alignment)
    return "its data is " + std::to_string(alignment) + "-byte aligned, the planned " +
           std::to_string(planned.alignment) + "-byte";
  if (device.device_type != planned.device.device_type || device.device_id != planned.device.device_id)
    return "device differs from the planned one";
  return "";
}

// Whether t matches this signature: what mismatch() would find nothing in.
bool TensorSignature::fits(const BorrowedTensor& t) const {
  if (t.present() != present) return false;
  if (!present) return true;
  const FDNN_DLTensor& d = t.desc();
  if (d.ndim != ndim || std::memcmp(&d.dtype, &dtype, sizeof dtype) != 0) return false;
  for (int i = 0; i < ndim; ++i)
    if (d.shape[i] != shape[i] || (shape[i] != 1 && d.strides[i] != strides[i])) return false;
  return fdnn_client::data_alignment(d) == alignment && d.device.device_type == device.device_type &&
         d.device.device_id == device.device_id;
}

namespace {

// Checks an array against the one a PackedConv was made for; raises naming what differs.
// The comparison is made in place: a signature (and its words) only for an array that differs.
void check_fits(const char* name, const BorrowedTensor& t, const TensorSignature& planned) {
  if (planned.fits(t)) return;
  const std::string what = TensorSignature::of(t).mismatch(planned);
  const std::string message = std::string(name) + ": does not fit this convolution plan: " + what;
  if (what.rfind("its dtype", 0) == 0) throw py::type_error(message);  // a dtype is a type
  throw py::value_error(message);
}

}  // namespace

PackedConv::PackedConv(const Shim& shim, const ConvSpec& spec, py::handle x_array,
                       py::handle w_array, py::handle y_array, py::handle bias_array,
                       py::handle stream_arg) {
  if (spec.params.op != FDNN_CONV_FORWARD)
    throw py::value_error("a packed plan is a forward convolution");
  const Roles& r = roles_of(spec.params.op);
  const CallStream stream = CallStream::of(stream_arg);
  const py::handle producer_stream = stream.dlpack;
  BorrowedTensor x(x_array, r.x, producer_stream), w(w_array, r.w, producer_stream);
  BorrowedTensor y(y_array, r.y, producer_stream);
  BorrowedTensor bias(bias_array, r.bias, producer_stream);
  check_operands(shim, spec, r, x, w, y, bias);
  std::shared_ptr<Plan> plan = cached_plan(shim, spec, x, w, y, bias, stream);
  keep_gil_ = keeps_gil(x.desc(), w.desc(), y.desc());
  x_signature_ = TensorSignature::of(x);
  y_signature_ = TensorSignature::of(y);
  bias_signature_ = TensorSignature::of(bias);
  keep_w_ = py::none();
  FDNN_Conv_Plan_Pack_Weights* pack = shim.pack_weights_fn();
  if (pack == nullptr) {  // the shim cannot pack: keep the caller's weights, pass them each call
    plan_ = plan;
    // A DLPack capsule (torch's fast exporter) is consumed by the plan above: such a plan
    // needs w exported again on every run (run's w_array), and says so if it is not.
    keep_w_ = PyCapsule_CheckExact(w_array.ptr()) ? py::str("a consumed capsule")
                                                  : py::reinterpret_borrow<py::object>(w_array);
    return;
  }
  FDNN_Conv_Plan_Pack_Weights_Args a{};
  a.struct_size = FDNN_Conv_Plan_Pack_Weights_Args_STRUCT_SIZE;
  a.plan = plan->handle;
  a.w = execute_pointer(w);
  FDNN_Buffer_Offsets offsets{FDNN_Buffer_Offsets_STRUCT_SIZE, FDNN_EXTENSION_BUFFER_OFFSETS,
                              nullptr, 0, offset_of(w), 0, 0, 0};
  if (data_is_object(w)) a.extension_start = reinterpret_cast<FDNN_Extension_Base*>(&offsets);
  a.stream = stream.shim;
  FDNN_Error* error;
  {
    py::gil_scoped_release no_gil;
    error = pack(&a);
  }
  shim.check(error, "packing weights");
  plan_ = std::make_shared<Plan>(shim, a.packed_plan, a.workspace_size, plan->algo_id,
                                 plan->algo_name + " [packed weights]");
}

py::object PackedConv::run(py::handle x_array, py::handle y_array, py::handle bias_array,
                           py::handle stream_arg, py::handle workspace_alloc,
                           py::handle w_array) const {
  const CallStream stream = CallStream::of(stream_arg);
  BorrowedTensor x(x_array, "x", stream.dlpack), bias(bias_array, "bias", stream.dlpack);
  check_fits("x", x, x_signature_);
  check_fits("bias", bias, bias_signature_);
  const bool made_here = y_array.is_none();
  py::object result = allocated_output(x_array, y_array);
  BorrowedTensor y(result, "out", stream.dlpack);
  // An output made here has the planned shape, strides and dtype, is writeable and shares no
  // memory with x or bias; only its alignment depends on NumPy's allocator (which may be
  // replaced), and a plan runs on data at least as aligned as planned. A caller's out= is
  // checked in full.
  if (made_here) {
    if (fdnn_client::data_alignment(y.desc()) < y_signature_.alignment) check_fits("out", y, y_signature_);
  } else {
    check_fits("out", y, y_signature_);
    if (y.read_only()) throw py::value_error("out: the array is read-only");
    BorrowedTensor no_w(py::none(), "w", stream.dlpack);
    const BorrowedTensor* all[4] = {&x, &no_w, &y, &bias};
    const char* const names[4] = {"x", "w", "out", "bias"};
    const bool written[4] = {false, false, true, false};
    check_memory(all, names, written);
  }
  std::optional<BorrowedTensor> w;
  if (!packed()) w.emplace(unpacked_weights(w_array), "w", stream.dlpack);
  FDNN_Buffer_Offsets offsets{FDNN_Buffer_Offsets_STRUCT_SIZE, FDNN_EXTENSION_BUFFER_OFFSETS,
                              nullptr, offset_of(x), w ? offset_of(*w) : 0, offset_of(y),
                              offset_of(bias), 0};
  execute(*plan_, execute_pointer(x), w ? execute_pointer(*w) : nullptr, execute_pointer(y),
          execute_pointer(bias), stream, workspace_alloc, data_is_object(x) ? &offsets : nullptr,
          keep_gil_);
  return result;
}

// The weights of a plan whose shim cannot pack them: this run's export of them, else the
// array kept at planning (a capsule, consumed then, cannot be kept).
py::handle PackedConv::unpacked_weights(py::handle w_array) const {
  if (!w_array.is_none()) return w_array;
  if (py::isinstance<py::str>(keep_w_))
    throw py::type_error("w: this plan's weights were given as a DLPack capsule, which its "
                         "planning consumed; pass them (exported again) to every run");
  return keep_w_;
}

namespace {

// Whether the planned output is compact row-major (what an exchange API's allocator makes).
bool compact(const TensorSignature& s) {
  int64_t step = 1;
  for (int i = s.ndim - 1; i >= 0; --i) {
    if (s.shape[i] != 1 && s.strides[i] != step) return false;
    step *= s.shape[i];
  }
  return true;
}

}  // namespace

// y as given; for None, a new array of x's library with the planned output's layout: NumPy's
// (any layout), or, through DLPack's exchange API, a compact one of x's library.
py::object PackedConv::allocated_output(py::handle x_array, py::handle y_array) const {
  if (!y_array.is_none()) return py::reinterpret_borrow<py::object>(y_array);
  PyObject* made = nullptr;
  if (is_numpy_array(x_array.ptr())) {
    made = numpy_empty(x_array.ptr(), y_signature_.dtype.bits / 8, y_signature_.ndim, y_signature_.shape,
                       y_signature_.strides);
  } else if (const ExchangeApi* api = exchange_api_of(x_array.ptr()); api != nullptr && compact(y_signature_)) {
    FDNN_DLTensor like{};
    like.dtype = y_signature_.dtype;
    like.device = y_signature_.device;
    made = exchange_empty(api, like, y_signature_.ndim, y_signature_.shape);
  } else {
    throw py::type_error("out: a plan makes its output itself only for NumPy arrays and compact outputs of "
                         "arrays with DLPack's exchange API; pass out=");
  }
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(made);
}

}  // namespace fdnn_core
