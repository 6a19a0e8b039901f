#include "conv_call.hpp"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>

#include "autotune.hpp"
#include "dlpack_intake.hpp"
#include "errors.hpp"
#include "plan_cache.hpp"
#include "shim_library.hpp"

namespace py = pybind11;

namespace fdnn_core {

namespace {

// The user-facing names of the ABI's x, w, y, bias for each op, and which ones it writes.
struct Roles {
  const char* x;
  const char* w;
  const char* y;
  const char* bias;
  bool writes_x, writes_w, writes_y, writes_bias;
};

const Roles& roles_of(FDNN_ConvOp op) {
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

template <class T>
void append(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// The alignment of the first element, a power of two up to 16 bytes. It is part of the
// problem: GPU shims choose kernels that assume it (cuDNN's vectorised loads), so an offset
// view of the same shape must not reuse a plan made for an aligned array.
uint8_t data_alignment(const FDNN_DLTensor& t) {
  uintptr_t address = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
  uint8_t alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

void append_tensor(std::string& key, const FDNN_DLTensor& t) {
  append(key, t.ndim);
  append(key, t.dtype);
  key.append(reinterpret_cast<const char*>(t.shape), sizeof(int64_t) * std::max(t.ndim, 0));
  key.append(reinterpret_cast<const char*>(t.strides), sizeof(int64_t) * std::max(t.ndim, 0));
  append(key, data_alignment(t));
}

std::string device_text(const FDNN_DLDevice& d) {
  return "device type " + std::to_string(d.device_type) + " id " + std::to_string(d.device_id);
}

void check_memory(const BorrowedTensor* all[4], const char* const names[4], const bool written[4]);

// Checks what the ABI promises the shim: same device and dtype everywhere, the shim's
// device type, ranks, and writable outputs. The Python layer has said all this with better
// words already; this is the last line, so that no caller of the core can break a shim.
void check_operands(const ShimLibrary& shim, const ConvSpec& spec, const Roles& r,
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
    int want_ndim = i == 3 ? 1 : spec.spatial_rank + 2;
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

// [first byte, one past the last byte] an array touches.
std::pair<uintptr_t, uintptr_t> byte_extent(const BorrowedTensor& t) {
  const FDNN_DLTensor& d = t.desc();
  uintptr_t first = reinterpret_cast<uintptr_t>(t.first_element());
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
      auto [other_lo, other_hi] = byte_extent(*all[j]);
      if (lo < other_hi && other_lo < hi)
        throw py::value_error(std::string(names[i]) + " shares memory with " + names[j] +
                              "; the result must go to memory no operand uses");
    }
  }
}

// The plan key, written into this thread's buffer: the per-call path allocates nothing for
// it once the buffer has grown (the cache copies a key only when it inserts a plan).
const std::string& plan_key(const ShimLibrary& shim, const ConvSpec& spec,
                            const BorrowedTensor& x, const BorrowedTensor& w,
                            const BorrowedTensor& y, const BorrowedTensor& bias) {
  thread_local std::string key;
  key.clear();
  append(key, &shim);
  append(key, x.desc().device.device_id);
  key += spec.key;
  append_tensor(key, x.desc());
  append_tensor(key, w.desc());
  append_tensor(key, y.desc());
  if (bias.present()) append_tensor(key, bias.desc());
  return key;
}

// The part of the key that names the same problem in another process (no pointers).
std::string autotune_key(const ShimLibrary& shim, const std::string& plan_key_bytes,
                         int32_t device_id) {
  FDNN_Shim_Info_Args info = shim.info();
  std::string key = shim.name() + '|' + (info.vendor_version_runtime ? info.vendor_version_runtime : "") +
                    '|' + shim.device_name(device_id) + '|';
  key.append(plan_key_bytes, sizeof(const ShimLibrary*), std::string::npos);
  return key;
}

std::shared_ptr<Plan> create_plan(const ShimLibrary& shim, const ConvSpec& spec,
                                  const BorrowedTensor& x, const BorrowedTensor& w,
                                  const BorrowedTensor& y, const BorrowedTensor& bias,
                                  const std::string& key, py::handle stream) {
  static const FDNN_DLTensor no_tensor{};
  FDNN_Conv_Plan_Create_Args a{};
  a.struct_size = FDNN_Conv_Plan_Create_Args_STRUCT_SIZE;
  a.op = spec.op;
  a.spatial_rank = spec.spatial_rank;
  a.x = &x.desc();
  a.w = &w.desc();
  a.y = &y.desc();
  a.bias = bias.present() ? &bias.desc() : &no_tensor;
  for (int i = 0; i < FDNN_MAX_SPATIAL_DIMS; ++i) {
    a.stride[i] = spec.stride[i];
    a.dilation[i] = spec.dilation[i];
    a.padding_lo[i] = spec.padding_lo[i];
    a.padding_hi[i] = spec.padding_hi[i];
  }
  a.groups = spec.groups;
  a.alpha = spec.alpha;
  a.beta = spec.beta;
  a.activation = spec.activation;
  a.activation_alpha = spec.activation_alpha;
  a.activation_beta = spec.activation_beta;
  a.flags = spec.flags;
  a.algo_policy = spec.algo_policy;
  a.algo_id = spec.algo_id;
  a.workspace_limit = spec.workspace_limit;
  a.stream = stream.is_none() ? nullptr : reinterpret_cast<void*>(stream.cast<uintptr_t>());

  std::string tune_key;
  if (spec.algo_policy == FDNN_ALGO_BENCHMARK) {
    tune_key = autotune_key(shim, key, x.desc().device.device_id);
    if (auto known = autotune_store().lookup(tune_key)) {
      a.algo_policy = FDNN_ALGO_GIVEN;
      a.algo_id = *known;
    }
  }
  auto create = [&] {
    py::gil_scoped_release no_gil;
    return shim.api().Conv_Plan_Create(&a);
  };
  FDNN_Error* error = create();
  if (error != nullptr && !tune_key.empty() && a.algo_policy == FDNN_ALGO_GIVEN) {
    // A remembered choice this shim no longer accepts (another vendor build, say): search again.
    shim.discard(error);
    warn("flux_dnn: an autotune entry no longer fits shim '" + shim.name() +
         "'; benchmarking this convolution again");
    a.algo_policy = FDNN_ALGO_BENCHMARK;
    a.algo_id = spec.algo_id;
    error = create();
  }
  shim.check(error, "creating a plan");
  auto plan = std::make_shared<Plan>(&shim, a);
  if (spec.algo_policy == FDNN_ALGO_BENCHMARK && a.algo_policy == FDNN_ALGO_BENCHMARK)
    autotune_store().record(tune_key, plan->algo_id);
  return plan;
}

// A per-thread, grow-only scratch buffer for CPU shims: no call allocates once warm.
void* cpu_workspace(size_t bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (bytes > buffer.size) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* fresh = std::aligned_alloc(64, rounded);
    if (fresh == nullptr) throw std::bad_alloc();
    std::free(buffer.data);
    buffer.data = fresh;
    buffer.size = rounded;
  }
  return buffer.data;
}

// The array library's allocator could not give a plan its workspace.
struct WorkspaceRefused {
  size_t bytes;
  std::string reason;
};

// Executes a plan on first-element pointers, with a workspace from the per-thread CPU buffer
// or, on GPUs, from the array library's allocator.
void execute(const Plan& plan, void* x, void* w, void* y, void* bias, py::handle stream,
             py::handle workspace_alloc) {
  FDNN_Conv_Plan_Execute_Args e{};
  e.struct_size = FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE;
  e.plan = plan.handle;
  e.x = x;
  e.w = w;
  e.y = y;
  e.bias = bias;
  e.workspace_size = plan.workspace_size;
  e.stream = stream.is_none() ? nullptr : reinterpret_cast<void*>(stream.cast<uintptr_t>());
  py::object workspace_array;  // keeps a GPU workspace alive until the work is enqueued
  std::optional<BorrowedTensor> workspace;
  if (plan.workspace_size > 0) {
    if (workspace_alloc.is_none()) {
      e.workspace = cpu_workspace(plan.workspace_size);
    } else {
      try {
        workspace_array = workspace_alloc(plan.workspace_size);
      } catch (py::error_already_set& refused) {
        throw WorkspaceRefused{plan.workspace_size, std::string(py::str(refused.value()))};
      }
      workspace.emplace(workspace_array, "workspace", stream);
      e.workspace = workspace->first_element();
    }
  }
  FDNN_Error* error;
  {
    py::gil_scoped_release no_gil;
    error = plan.shim->api().Conv_Plan_Execute(&e);
  }
  plan.shim->check(error, "executing " + plan.algo_name);
}

}  // namespace

void ConvSpec::finish() {
  key.clear();
  append(key, op);
  append(key, spatial_rank);
  append(key, stride);
  append(key, dilation);
  append(key, padding_lo);
  append(key, padding_hi);
  append(key, groups);
  append(key, alpha);
  append(key, beta);
  append(key, activation);
  append(key, activation_alpha);
  append(key, activation_beta);
  append(key, flags);
  append(key, algo_policy);
  append(key, algo_id);
  append(key, workspace_limit);
}

ConvResult run_conv(const ShimLibrary& shim, const ConvSpec& spec, py::handle x_array,
                    py::handle w_array, py::handle y_array, py::handle bias_array,
                    py::handle stream, py::handle workspace_alloc) {
  const Roles& r = roles_of(spec.op);
  BorrowedTensor x(x_array, r.x, stream), w(w_array, r.w, stream), y(y_array, r.y, stream);
  BorrowedTensor bias(bias_array, r.bias, stream);  // None: not present
  check_operands(shim, spec, r, x, w, y, bias);

  auto planned = [&](const ConvSpec& s) {
    const std::string& key = plan_key(shim, s, x, w, y, bias);
    std::shared_ptr<Plan> plan = plan_cache().find(key);
    return plan ? plan : plan_cache().insert(key, create_plan(shim, s, x, w, y, bias, key, stream));
  };
  auto run = [&](const Plan& plan) {
    execute(plan, x.first_element(), w.first_element(), y.first_element(),
            bias.present() ? bias.first_element() : nullptr, stream, workspace_alloc);
    return ConvResult{plan.workspace_size, plan.algo_id, plan.algo_name};
  };
  std::shared_ptr<Plan> plan = planned(spec);
  try {
    return run(*plan);
  } catch (const WorkspaceRefused& refused) {
    // The allocator (or its cap) refused: use a plan that needs no workspace, and say so once.
    ConvSpec lean = spec;
    lean.workspace_limit = 0;
    lean.finish();
    std::shared_ptr<Plan> fallback = planned(lean);
    static std::once_flag warned;
    std::call_once(warned, [&] {
      warn("flux_dnn: the array library refused " + std::to_string(refused.bytes) +
           " bytes of convolution workspace (" + refused.reason + "); using algorithms that need "
           "none, which may be slower. This warning is shown once.");
    });
    try {
      return run(*fallback);
    } catch (const WorkspaceRefused& again) {
      throw std::bad_alloc();  // even the leanest plan needs workspace the allocator refuses
    }
  }
}

namespace {

// What of an array a PackedConv holds it to: shape, strides, dtype, alignment, device.
void write_signature(std::string& key, const BorrowedTensor& t) {
  key.clear();
  if (t.present()) {
    append_tensor(key, t.desc());
    append(key, t.desc().device);
  }
}

std::string signature(const BorrowedTensor& t) {
  std::string key;
  write_signature(key, t);
  return key;
}

// Whether t fits a planned signature, built in this thread's buffer: a call allocates nothing.
bool fits(const BorrowedTensor& t, const std::string& planned) {
  thread_local std::string key;
  write_signature(key, t);
  return key == planned;
}

std::string dims_text(const int64_t* v, int n) {
  std::string out = "(";
  for (int i = 0; i < n; ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + (n == 1 ? ",)" : ")");
}

// Names what differs between an array and the one a PackedConv was made for.
[[noreturn]] void mismatch(const char* name, const BorrowedTensor& t, const std::string& planned) {
  std::string what = "its shape, layout, dtype or device";
  if (!t.present() || planned.empty()) {
    what = t.present() ? "it was made without one" : "it was made with one";
  } else {
    int32_t ndim;
    std::memcpy(&ndim, planned.data(), sizeof ndim);
    const size_t shape_at = sizeof(int32_t) + sizeof(FDNN_DLDataType);
    const auto* shape = reinterpret_cast<const int64_t*>(planned.data() + shape_at);
    if (ndim != t.desc().ndim || std::memcmp(shape, t.desc().shape, sizeof(int64_t) * ndim) != 0)
      what = "shape " + dims_text(t.desc().shape, t.desc().ndim) + " is not the planned " +
             dims_text(shape, ndim);
    else if (std::memcmp(planned.data() + sizeof(int32_t), &t.desc().dtype, sizeof(FDNN_DLDataType)))
      throw py::type_error(std::string(name) + ": does not fit this convolution plan: its dtype (" +
                           std::to_string(t.desc().dtype.bits) + "-bit, DLPack code " +
                           std::to_string(t.desc().dtype.code) + ") is not the planned one");
    else if (std::memcmp(shape + ndim, t.desc().strides, sizeof(int64_t) * ndim) != 0)
      what = "strides " + dims_text(t.desc().strides, ndim) + " are not the planned layout " +
             dims_text(shape + ndim, ndim);
    else if (static_cast<uint8_t>(planned[shape_at + 2 * sizeof(int64_t) * ndim]) != data_alignment(t.desc()))
      what = "its data is " + std::to_string(data_alignment(t.desc())) + "-byte aligned, the planned " +
             std::to_string(static_cast<uint8_t>(planned[shape_at + 2 * sizeof(int64_t) * ndim])) + "-byte";
    else
      what = "device differs from the planned one";
  }
  throw py::value_error(std::string(name) + ": does not fit this convolution plan: " + what);
}

}  // namespace

PackedConv::PackedConv(const ShimLibrary& shim, const ConvSpec& spec, py::handle x_array,
                       py::handle w_array, py::handle y_array, py::handle bias_array,
                       py::handle stream) {
  if (spec.op != FDNN_CONV_FORWARD) throw py::value_error("a packed plan is a forward convolution");
  const Roles& r = roles_of(spec.op);
  BorrowedTensor x(x_array, r.x, stream), w(w_array, r.w, stream), y(y_array, r.y, stream);
  BorrowedTensor bias(bias_array, r.bias, stream);
  check_operands(shim, spec, r, x, w, y, bias);
  const std::string& key = plan_key(shim, spec, x, w, y, bias);
  std::shared_ptr<Plan> plan = plan_cache().find(key);
  if (!plan) plan = plan_cache().insert(key, create_plan(shim, spec, x, w, y, bias, key, stream));
  x_signature_ = signature(x);
  y_signature_ = signature(y);
  bias_signature_ = signature(bias);
  keep_w_ = py::none();
  FDNN_Conv_Plan_Pack_Weights* pack = shim.pack_weights_fn();
  if (pack == nullptr) {  // an ABI 1.0 shim: keep the caller's weights and pass them each call
    plan_ = plan;
    keep_w_ = py::reinterpret_borrow<py::object>(w_array);
    return;
  }
  FDNN_Conv_Plan_Pack_Weights_Args a{};
  a.struct_size = FDNN_Conv_Plan_Pack_Weights_Args_STRUCT_SIZE;
  a.plan = plan->handle;
  a.w = w.first_element();
  a.stream = stream.is_none() ? nullptr : reinterpret_cast<void*>(stream.cast<uintptr_t>());
  FDNN_Error* error;
  {
    py::gil_scoped_release no_gil;
    error = pack(&a);
  }
  shim.check(error, "packing weights");
  FDNN_Conv_Plan_Create_Args created{};
  created.plan = a.packed_plan;
  created.workspace_size = a.workspace_size;
  created.chosen_algo_id = plan->algo_id;
  created.algo_name = nullptr;
  plan_ = std::make_shared<Plan>(&shim, created);
  plan_->algo_name = plan->algo_name + " [packed weights]";
}

ConvResult PackedConv::run(py::handle x_array, py::handle y_array, py::handle bias_array,
                           py::handle stream, py::handle workspace_alloc) const {
  BorrowedTensor x(x_array, "x", stream), y(y_array, "out", stream), bias(bias_array, "bias", stream);
  if (!fits(x, x_signature_)) mismatch("x", x, x_signature_);
  if (!fits(y, y_signature_)) mismatch("out", y, y_signature_);
  if (!fits(bias, bias_signature_)) mismatch("bias", bias, bias_signature_);
  if (y.read_only()) throw py::value_error("out: the array is read-only");
  BorrowedTensor no_w(py::none(), "w", stream);
  const BorrowedTensor* all[4] = {&x, &no_w, &y, &bias};
  const char* const names[4] = {"x", "w", "out", "bias"};
  const bool written[4] = {false, false, true, false};
  check_memory(all, names, written);
  std::optional<BorrowedTensor> w;
  if (!keep_w_.is_none()) w.emplace(keep_w_, "w", stream);
  execute(*plan_, x.first_element(), w ? w->first_element() : nullptr, y.first_element(),
          bias.present() ? bias.first_element() : nullptr, stream, workspace_alloc);
  return ConvResult{plan_->workspace_size, plan_->algo_id, plan_->algo_name};
}

std::string PackedConv::algo_name() const { return plan_->algo_name; }

}  // namespace fdnn_core
