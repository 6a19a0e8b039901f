#include "dlpack_exchange.hpp"

#include <cstring>
#include <string>
#include <unordered_map>

namespace fdnn_core {

namespace {

// dlpack.h 1.3's exchange table, field for field (the core includes no dlpack.h: the ABI
// header's FDNN_DLTensor is DLTensor's layout, checked there). Only what the core calls is
// typed; the rest are kept as pointers to hold the layout.
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  DLPackExchangeAPIHeader* prev_api;
};

using SetError = void (*)(void* error_ctx, const char* kind, const char* message);
using ManagedTensorAllocator = int (*)(FDNN_DLTensor* prototype, void** out, void* error_ctx, SetError set_error);
using ManagedTensorToPyObject = int (*)(void* managed_tensor_versioned, void** out_py_object);
using DLTensorFromPyObject = int (*)(void* py_object, FDNN_DLTensor* out);

struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  ManagedTensorAllocator managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  ManagedTensorToPyObject managed_tensor_to_py_object_no_sync;
  DLTensorFromPyObject dltensor_from_py_object_no_sync;  // may be NULL
  void* current_work_stream;
};

constexpr uint32_t kExchangeMajor = 1;
constexpr const char* kAttribute = "__dlpack_c_exchange_api__";
constexpr const char* kCapsuleName = "dlpack_exchange_api";

const DLPackExchangeAPI* read_api(PyTypeObject* type) {
  PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), kAttribute);
  if (capsule == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  const auto* api = PyCapsule_IsValid(capsule, kCapsuleName)
                        ? static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(capsule, kCapsuleName))
                        : nullptr;
  Py_DECREF(capsule);  // the table lives as long as the process (dlpack.h's rule)
  if (api == nullptr || api->header.version.major != kExchangeMajor ||
      api->dltensor_from_py_object_no_sync == nullptr || api->managed_tensor_allocator == nullptr ||
      api->managed_tensor_to_py_object_no_sync == nullptr)
    return nullptr;
  return api;
}

void set_allocation_error(void* error_ctx, const char* kind, const char* message) {
  *static_cast<std::string*>(error_ctx) = std::string(kind ? kind : "Error") + ": " + (message ? message : "");
}

}  // namespace

struct ExchangeApi : DLPackExchangeAPI {};

const ExchangeApi* exchange_api_of(PyObject* object) {
  static auto* known = new std::unordered_map<PyTypeObject*, const DLPackExchangeAPI*>();
  PyTypeObject* type = Py_TYPE(object);
  auto it = known->find(type);
  if (it == known->end()) it = known->emplace(type, read_api(type)).first;
  return static_cast<const ExchangeApi*>(it->second);
}

bool exchange_describe(const ExchangeApi* api, PyObject* object, FDNN_DLTensor& desc, int64_t* shape,
                       int64_t* strides, int max_dims) {
  FDNN_DLTensor t{};
  if (api->dltensor_from_py_object_no_sync(object, &t) != 0) return false;  // error set by the producer
  if (t.ndim < 0 || t.ndim > max_dims) {
    PyErr_Format(PyExc_ValueError, "arrays of %d dimensions are not supported (at most %d)", t.ndim, max_dims);
    return false;
  }
  // The producer's shape and strides live only until control returns to it: copied now.
  int64_t compact = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    shape[i] = t.shape[i];
    strides[i] = t.strides ? t.strides[i] : compact;
    compact *= t.shape[i];
  }
  desc = t;
  desc.shape = shape;
  desc.strides = strides;
  return true;
}

PyObject* exchange_empty(const ExchangeApi* api, const FDNN_DLTensor& like, int ndim, const int64_t* shape) {
  FDNN_DLTensor prototype{};
  prototype.device = like.device;
  prototype.dtype = like.dtype;
  prototype.ndim = ndim;
  prototype.shape = const_cast<int64_t*>(shape);  // read only (dlpack.h: dtype, ndim, shape, device)
  void* managed = nullptr;
  std::string error;
  if (api->managed_tensor_allocator(&prototype, &managed, &error, &set_allocation_error) != 0 || managed == nullptr) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_MemoryError, ("the array library could not allocate the output: " + error).c_str());
    return nullptr;
  }
  void* made = nullptr;
  if (api->managed_tensor_to_py_object_no_sync(managed, &made) != 0) return nullptr;  // owns managed either way
  return static_cast<PyObject*>(made);
}

}  // namespace fdnn_core
