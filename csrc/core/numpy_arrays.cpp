#include "numpy_arrays.hpp"

#include <cstddef>
#include <cstring>
#include <initializer_list>

namespace fdnn_core {

namespace {

// NumPy's PyArrayObject_fields, the start of every ndarray (ndarraytypes.h).
struct NumpyArrayFields {
  PyObject_HEAD
  char* data;
  int nd;
  Py_ssize_t* dimensions;
  Py_ssize_t* strides;
  PyObject* base;
  PyObject* descr;
  int flags;
};

// The start of NumPy's PyArray_Descr, where NumPy 1.x and 2.x agree (2.x changed what follows
// type_num: the element size is taken from the type number instead).
struct NumpyDescrHead {
  PyObject_HEAD
  PyTypeObject* typeobj;
  char kind;
  char type;
  char byteorder;  // '=' native, '<' / '>' explicit, '|' not applicable
  char flags_in_numpy1;
  int type_num;
};

constexpr int kNpyFloat = 11, kNpyDouble = 12, kNpyHalf = 23;  // NPY_TYPES
constexpr int kNpyArrayWriteable = 0x0400;                     // NPY_ARRAY_WRITEABLE

// Slots of NumPy's C-API table (numpy_api.py), stable across NumPy 1.x and 2.x.
constexpr int kApiArrayType = 2, kApiNewFromDescr = 94;
constexpr int kMaxNumpyDims = 64;  // NPY_MAXDIMS in NumPy 2 (32 in NumPy 1)
using NewFromDescr = PyObject* (*)(PyTypeObject*, PyObject*, int, const Py_ssize_t*,
                                   const Py_ssize_t*, void*, int, PyObject*);

bool native_byte_order(char byteorder) {
  if (byteorder == '=' || byteorder == '|') return true;
  const uint16_t probe = 1;
  const bool little = *reinterpret_cast<const uint8_t*>(&probe) == 1;
  return byteorder == (little ? '<' : '>');
}

// NumPy's C-API table, from the _ARRAY_API capsule of numpy._core.multiarray (NumPy 2) or
// numpy.core.multiarray (NumPy 1); NULL with a Python error set when neither imports.
void** numpy_api() {
  static void** api = nullptr;
  if (api != nullptr) return api;
  for (const char* name : {"numpy._core.multiarray", "numpy.core.multiarray"}) {
    PyObject* module = PyImport_ImportModule(name);
    if (module == nullptr) {
      PyErr_Clear();
      continue;
    }
    PyObject* capsule = PyObject_GetAttrString(module, "_ARRAY_API");
    Py_DECREF(module);
    if (capsule == nullptr) {
      PyErr_Clear();
      continue;
    }
    api = static_cast<void**>(PyCapsule_GetPointer(capsule, nullptr));
    Py_DECREF(capsule);  // the table lives as long as NumPy's module, loaded for good
    if (api != nullptr) return api;
    PyErr_Clear();
  }
  PyErr_SetString(PyExc_ImportError, "flux_dnn: cannot read NumPy's C-API table (_ARRAY_API)");
  return nullptr;
}

}  // namespace

bool is_numpy_array(PyObject* object) {
  static PyTypeObject* ndarray = nullptr;
  PyTypeObject* type = Py_TYPE(object);
  if (type == ndarray) return true;
  if (ndarray != nullptr || std::strcmp(type->tp_name, "numpy.ndarray") != 0) return false;
  ndarray = type;  // found by name on first sight, so that the core does not import NumPy
  return true;
}

bool read_numpy(PyObject* array, NumpyView& view) {
  const auto* a = reinterpret_cast<const NumpyArrayFields*>(array);
  const auto* d = reinterpret_cast<const NumpyDescrHead*>(a->descr);
  if (!native_byte_order(d->byteorder)) return false;
  switch (d->type_num) {
    case kNpyFloat: view.itemsize = 4; break;
    case kNpyDouble: view.itemsize = 8; break;
    case kNpyHalf: view.itemsize = 2; break;
    default: return false;
  }
  view.dtype = FDNN_DLDataType{2 /* kDLFloat */, static_cast<uint8_t>(view.itemsize * 8), 1};
  view.data = a->data;
  view.ndim = a->nd;
  view.shape = a->dimensions;
  view.strides = a->strides;
  view.writable = (a->flags & kNpyArrayWriteable) != 0;
  return true;
}

PyObject* numpy_empty(PyObject* like, int itemsize, int ndim, const int64_t* shape,
                      const int64_t* strides) {
  void** api = numpy_api();
  if (api == nullptr) return nullptr;
  if (ndim < 0 || ndim > kMaxNumpyDims) {
    PyErr_SetString(PyExc_ValueError, "flux_dnn: numpy_empty: too many dimensions");
    return nullptr;
  }
  Py_ssize_t dims[kMaxNumpyDims], byte_strides[kMaxNumpyDims];
  // C order (strides of size-1 dims reach no element and do not count) is asked for without
  // strides: NumPy then sets its flags directly instead of deriving them from the strides.
  bool c_order = true;
  int64_t dense = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    dims[i] = static_cast<Py_ssize_t>(shape[i]);
    byte_strides[i] = static_cast<Py_ssize_t>(strides[i]) * itemsize;
    if (shape[i] != 1 && strides[i] != dense) c_order = false;
    dense *= shape[i];
  }
  PyObject* descr = reinterpret_cast<const NumpyArrayFields*>(like)->descr;
  Py_INCREF(descr);  // NewFromDescr steals a reference to the dtype
  auto make = reinterpret_cast<NewFromDescr>(api[kApiNewFromDescr]);
  return make(static_cast<PyTypeObject*>(api[kApiArrayType]), descr, ndim, dims, c_order ? nullptr : byte_strides,
              nullptr, 0, nullptr);
}

}  // namespace fdnn_core
