#include "fastcall.hpp"

#include <new>
#include <string>

#include "client/error.hpp"
#include "conv_call.hpp"
#include "errors.hpp"

namespace py = pybind11;

namespace fdnn_core {

namespace {

// Fills out[0..count) from a vectorcall's positional and keyword arguments, by the names
// given. Returns false with a TypeError set, as Python words it, when they do not fit.
bool parse_arguments(const char* function, const char* const* names, Py_ssize_t count,
                     PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out) {
  if (nargs > count) {
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", function, count, nargs);
    return false;
  }
  for (Py_ssize_t i = 0; i < count; ++i) out[i] = i < nargs ? args[i] : nullptr;
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    Py_ssize_t i = 0;
    while (i < count && PyUnicode_CompareWithASCIIString(name, names[i]) != 0) ++i;
    if (i == count) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", function, name);
      return false;
    }
    if (out[i] != nullptr) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", function, names[i]);
      return false;
    }
    out[i] = args[nargs + k];
  }
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (out[i] == nullptr) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", function, names[i]);
      return false;
    }
  }
  return true;
}

// Runs body; a C++ exception becomes the Python exception pybind11's bindings would raise.
template <class Body>
PyObject* guarded(Body&& body) {
  try {
    body();
    Py_RETURN_NONE;
  } catch (...) {
    set_python_error();
  }
  return nullptr;
}

PyObject* run_conv_vectorcall(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  static const char* const names[] = {"shim", "spec", "x", "w", "y", "bias", "stream", "workspace_alloc"};
  PyObject* a[8];
  if (!parse_arguments("run_conv", names, 8, args, nargs, kwnames, a)) return nullptr;
  return guarded([&] {
    run_conv(unwrap<Shim>(a[0], "shim", "Shim"), unwrap<ConvSpec>(a[1], "spec", "ConvSpec"), a[2],
             a[3], a[4], a[5], a[6], a[7]);
  });
}

PyMethodDef run_conv_def = {
    "run_conv", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&run_conv_vectorcall)),
    METH_FASTCALL | METH_KEYWORDS,
    "run_conv(shim, spec, x, w, y, bias, stream, workspace_alloc) -> None\n\n"
    "Run spec on DLPack arrays; the written array must exist. Once its plan is cached, a call "
    "allocates nothing in C++."};

}  // namespace

void add_fast_run_conv(py::module_& m) {
  PyObject* function = PyCFunction_NewEx(&run_conv_def, nullptr, m.attr("__name__").ptr());
  if (function == nullptr) throw py::error_already_set();
  m.attr("run_conv") = py::reinterpret_steal<py::object>(function);
}

}  // namespace fdnn_core
