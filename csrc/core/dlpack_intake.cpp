#include "dlpack_intake.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>

#include "dlpack_exchange.hpp"
#include "errors.hpp"
#include "numpy_arrays.hpp"

namespace py = pybind11;

namespace fdnn_core {

namespace {

// DLPack's managed tensors (dlpack.h), the one definition the intake reads. The tensor part
// is FDNN_DLTensor, which the ABI header checks against DLTensor's layout.
struct DLManagedTensor {  // capsule "dltensor": DLPack before 1.0, and 1.x producers asked so
  FDNN_DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

// Capsule "dltensor_versioned" (DLPack >= 1.0). DLPack keeps version, manager_ctx and
// deleter where they are in every major version, so that a consumer can read the version
// and release a tensor it does not understand; nothing after them may be read before the
// major is known.
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  FDNN_DLTensor dl_tensor;
};

// DLPack's published layout, checked where the header checks DLTensor's (64-bit targets).
static_assert(sizeof(DLPackVersion) == 8 && offsetof(DLPackVersion, minor) == 4,
              "DLPackVersion must have DLPack's layout");
#if UINTPTR_MAX == UINT64_MAX
static_assert(offsetof(DLManagedTensor, dl_tensor) == 0 &&
                  offsetof(DLManagedTensor, manager_ctx) == 48 &&
                  offsetof(DLManagedTensor, deleter) == 56 && sizeof(DLManagedTensor) == 64,
              "DLManagedTensor must have DLPack's layout");
static_assert(offsetof(DLManagedTensorVersioned, version) == 0 &&
                  offsetof(DLManagedTensorVersioned, manager_ctx) == 8 &&
                  offsetof(DLManagedTensorVersioned, deleter) == 16 &&
                  offsetof(DLManagedTensorVersioned, flags) == 24 &&
                  offsetof(DLManagedTensorVersioned, dl_tensor) == 32 &&
                  sizeof(DLManagedTensorVersioned) == 80,
              "DLManagedTensorVersioned must have DLPack's layout");
#endif

// The DLPack major version whose DLManagedTensorVersioned the intake reads; any minor of it
// is compatible (DLPack's rule).
constexpr uint32_t kDLPackMajor = 1;

std::string version_refusal(const char* argname, DLPackVersion version) {
  return std::string(argname) + ": the array was exported as DLPack " + std::to_string(version.major) +
         "." + std::to_string(version.minor) + ", a major version flux_dnn cannot read (it reads DLPack " +
         std::to_string(kDLPackMajor) + ".x); the tensor was released unread";
}

constexpr uint64_t kFlagReadOnly = 1ull << 0;
constexpr const char* kCapsule = "dltensor";
constexpr const char* kCapsuleVersioned = "dltensor_versioned";

// Whether a type's __dlpack__ accepts max_version (DLPack >= 1.0 producers), learnt once per
// type so the per-call path does not pay for a failed call.
std::unordered_map<PyTypeObject*, bool>& versioned_support() {
  static auto* known = new std::unordered_map<PyTypeObject*, bool>();
  return *known;
}

PyObject* interned(const char* text) {
  PyObject* s = PyUnicode_InternFromString(text);
  if (s == nullptr) throw py::error_already_set();
  return s;  // leaked on purpose: lives as long as the process
}

// array.__dlpack__(stream=..., max_version=(1, 0)) through vectorcall: no bound method, no
// keyword dict. The keywords sent: stream only when given (CPU producers refuse others),
// max_version only to producers that take it.
PyObject* vectorcall_dlpack(py::handle array, py::handle stream, bool versioned) {
  static PyObject* method = interned("__dlpack__");
  static PyObject* max_version = py::make_tuple(1, 0).release().ptr();
  static PyObject* kw_version = py::make_tuple(py::str("max_version")).release().ptr();
  static PyObject* kw_stream = py::make_tuple(py::str("stream")).release().ptr();
  static PyObject* kw_both = py::make_tuple(py::str("stream"), py::str("max_version")).release().ptr();
  PyObject* args[3] = {array.ptr(), nullptr, nullptr};
  PyObject* kwnames = nullptr;
  if (!stream.is_none()) {
    args[1] = stream.ptr();
    if (versioned) args[2] = max_version;
    kwnames = versioned ? kw_both : kw_stream;
  } else if (versioned) {
    args[1] = max_version;
    kwnames = kw_version;
  }
  return PyObject_VectorcallMethod(method, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
}

// The capsule of array.__dlpack__(). With refusal_pending, a BufferError (the producer cannot
// export this array) is left pending and a null object returned, so that the intake can ask
// the export fallback without the cost of a C++ exception; other errors throw.
py::object call_dlpack(py::handle array, const char* argname, py::handle stream, bool refusal_pending = false) {
  auto& known = versioned_support();
  PyTypeObject* type = Py_TYPE(array.ptr());
  auto it = known.find(type);
  const bool try_versioned = it == known.end() || it->second;
  PyObject* capsule = vectorcall_dlpack(array, stream, try_versioned);
  if (capsule == nullptr && try_versioned && PyErr_ExceptionMatches(PyExc_TypeError)) {
    PyErr_Clear();  // a pre-1.0 producer: no max_version keyword
    known[type] = false;
    capsule = vectorcall_dlpack(array, stream, false);
  } else if (capsule != nullptr && it == known.end()) {
    known[type] = true;
  }
  if (capsule == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError) && !PyObject_HasAttrString(array.ptr(), "__dlpack__")) {
      PyErr_Clear();
      throw py::type_error(std::string(argname) + ": object of type " +
                           std::string(py::str(py::type::handle_of(array).attr("__qualname__"))) +
                           " does not support DLPack (it has no __dlpack__ method)");
    }
    if (refusal_pending && PyErr_ExceptionMatches(PyExc_BufferError)) return py::object();
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

py::object& export_fallback() {
  static auto* fallback = new py::object();  // outlives the interpreter's teardown
  return *fallback;
}

// The capsule of the fallback's stand-in for an array whose __dlpack__ raised BufferError,
// still pending; sets code and bits to the dtype the capsule is to be read as.
py::object fallback_capsule(py::handle array, const char* argname, py::handle stream, uint8_t& code,
                            uint8_t& bits) {
  py::error_already_set refused;  // takes the pending BufferError
  const std::string name(argname);
  py::object alt = export_fallback() ? export_fallback()(array, name) : py::object(py::none());
  if (alt.is_none())
    throw py::value_error(name + ": the array cannot be exported through DLPack: " +
                          std::string(py::str(refused.value())));
  if (!PyTuple_Check(alt.ptr()) || PyTuple_GET_SIZE(alt.ptr()) != 3)
    throw py::type_error(name + ": the DLPack fallback must return None or (exportable, code, bits)");
  auto given = py::reinterpret_borrow<py::tuple>(alt);
  const int c = given[1].cast<int>(), b = given[2].cast<int>();
  if (c < 0 || c > 255 || b <= 0 || b > 255)
    throw py::value_error(name + ": the DLPack fallback gave an invalid dtype (code " + std::to_string(c) +
                          ", bits " + std::to_string(b) + ")");
  code = static_cast<uint8_t>(c);
  bits = static_cast<uint8_t>(b);
  try {
    return call_dlpack(given[0], argname, stream);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_BufferError)) throw;
    throw py::value_error(name + ": the array cannot be exported through DLPack: " + std::string(py::str(e.value())));
  }
}

}  // namespace

void set_export_fallback(py::object fallback) { export_fallback() = std::move(fallback); }

BorrowedTensor::BorrowedTensor(py::handle array, const char* argname, py::handle stream) {
  if (array.is_none()) return;  // an absent optional operand
  if (stream.is_none() && is_numpy_array(array.ptr()) && take_numpy_array(array)) return;
  // A type with DLPack's exchange API is read by one C call, no capsule (dlpack_exchange.hpp;
  // no stream handshake: the call runs on the library's current stream, see there).
  if (const ExchangeApi* api = exchange_api_of(array.ptr())) {
    if (!exchange_describe(api, array.ptr(), desc_, shape_, strides_, kMaxDims)) {
      py::error_already_set refused;
      throw py::value_error(std::string(argname) + ": the array cannot be read through DLPack: " +
                            std::string(py::str(refused.value())));
    }
    present_ = true;  // writable: the exchange API has no read-only flag
    return;
  }
  py::object capsule;
  uint8_t override_code = 0, override_bits = 0;  // bits 0: the capsule's own dtype stands
  // An adapter may hand over a capsule it made through its library's fast exporter.
  capsule = PyCapsule_CheckExact(array.ptr()) ? py::reinterpret_borrow<py::object>(array)
                                              : call_dlpack(array, argname, stream, /*refusal_pending=*/true);
  // Only arrays whose dtype their library cannot export get here: the fast path pays nothing.
  if (!capsule) capsule = fallback_capsule(array, argname, stream, override_code, override_bits);
  PyObject* cap = capsule.ptr();
  const FDNN_DLTensor* t = nullptr;
  if (PyCapsule_IsValid(cap, kCapsuleVersioned)) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kCapsuleVersioned));
    PyCapsule_SetName(cap, "used_dltensor_versioned");
    managed_ = m;
    deleter_ = reinterpret_cast<void (*)(void*)>(m->deleter);
    if (m->version.major != kDLPackMajor) {
      const DLPackVersion version = m->version;  // read before the deleter frees it
      release();  // the capsule is ours now ("used_..."): its deleter is all we may call
      throw py::buffer_error(version_refusal(argname, version));
    }
    read_only_ = (m->flags & kFlagReadOnly) != 0;
    t = &m->dl_tensor;
  } else if (PyCapsule_IsValid(cap, kCapsule)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kCapsule));
    PyCapsule_SetName(cap, "used_dltensor");
    managed_ = m;
    deleter_ = reinterpret_cast<void (*)(void*)>(m->deleter);
    t = &m->dl_tensor;
  } else {
    throw py::type_error(std::string(argname) + ": __dlpack__ did not return a DLPack capsule");
  }
  if (t->ndim < 0 || t->ndim > kMaxDims) {
    release();
    throw py::value_error(std::string(argname) + ": arrays of " + std::to_string(t->ndim) +
                          " dimensions are not supported (at most " + std::to_string(kMaxDims) + ")");
  }
  desc_ = *t;
  if (override_bits != 0) {
    if (t->dtype.bits != override_bits || t->dtype.lanes != 1) {
      const int have = t->dtype.bits;
      release();
      throw py::type_error(std::string(argname) + ": the DLPack fallback's stand-in has " + std::to_string(have) +
                           "-bit elements, not the " + std::to_string(override_bits) + " bits of its dtype");
    }
    desc_.dtype.code = override_code;  // our copy: the producer's tensor is left as it made it
  }
  desc_.shape = shape_;
  desc_.strides = strides_;
  // NULL strides mean compact row-major (DLPack); the ABI wants them spelt out.
  int64_t compact = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    shape_[i] = t->shape[i];
    strides_[i] = t->strides ? t->strides[i] : compact;
    compact *= t->shape[i];
  }
  present_ = true;
}

// Describes a NumPy array from its own fields: true when taken; false (nothing held, no error
// pending) for what DLPack is to take or refuse in its own words: another dtype, byte order
// or rank beyond kMaxDims, strides that are not whole elements. The caller's reference keeps
// the array alive for the call; NumPy refuses to resize an array others refer to.
bool BorrowedTensor::take_numpy_array(py::handle array) {
  NumpyView view;
  if (!read_numpy(array.ptr(), view) || view.ndim > kMaxDims) return false;
  for (int i = 0; i < view.ndim; ++i)
    if (view.strides[i] % view.itemsize != 0) return false;
  read_only_ = !view.writable;
  desc_.data = view.data;
  desc_.device = FDNN_DLDevice{FDNN_DEVICE_CPU, 0};
  desc_.ndim = view.ndim;
  desc_.dtype = view.dtype;
  desc_.shape = shape_;
  desc_.strides = strides_;
  desc_.byte_offset = 0;
  for (int i = 0; i < view.ndim; ++i) {
    shape_[i] = view.shape[i];
    strides_[i] = view.strides[i] / view.itemsize;
  }
  present_ = true;
  return true;
}

void BorrowedTensor::release() {
  if (managed_ != nullptr && deleter_ != nullptr) deleter_(managed_);
  managed_ = nullptr;
}

BorrowedTensor::~BorrowedTensor() { release(); }

}  // namespace fdnn_core
