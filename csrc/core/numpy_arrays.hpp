// NumPy arrays read and made without the buffer protocol or a Python call: the per-call path
// of a tiny convolution cannot afford either (PyObject_GetBuffer costs about 1,300
// instructions per array, numpy.empty about 0.3 us). The array and dtype structs and the
// C-API table are NumPy's public ABI, the same in NumPy 1.x and 2.x; they are declared here
// (as pybind11's numpy.h declares them) so that the core builds without NumPy's headers and
// imports NumPy only when a NumPy array is met.
#pragma once

#include <Python.h>

#include <cstdint>

#include "flux_dnn/flux_dnn.h"

namespace fdnn_core {

// numpy.ndarray itself (not a subclass: those keep their own __dlpack__).
bool is_numpy_array(PyObject* object);

// What the core reads of a NumPy array of float16, float32 or float64 in native byte order.
struct NumpyView {
  void* data;             // the first element
  int ndim;
  const Py_ssize_t* shape;
  const Py_ssize_t* strides;  // in bytes
  FDNN_DLDataType dtype;
  int itemsize;
  bool writable;
};

// Reads an exact numpy.ndarray; false for another dtype or byte order (the DLPack path then
// takes or refuses it in its own words). Needs the GIL.
bool read_numpy(PyObject* array, NumpyView& view);

// A new uninitialised NumPy array of like's dtype (any dtype: ml_dtypes' bfloat16 too) with
// the given shape and strides (in elements of itemsize bytes, a permutation of a compact
// layout, such as channels-last), or NULL with a Python error set. like must be an exact
// numpy.ndarray. Needs the GIL.
PyObject* numpy_empty(PyObject* like, int itemsize, int ndim, const int64_t* shape,
                      const int64_t* strides);

}  // namespace fdnn_core
