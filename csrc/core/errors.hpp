// Python exception types of flux_dnn, created by the module and raised by the core.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "client/error.hpp"

namespace fdnn_core {

struct ExceptionTypes {
  pybind11::object shim_load_error;     // a shim library could not be loaded or is foreign
  pybind11::object unavailable_error;   // the device's shim cannot run here
  pybind11::object unsupported_error;   // valid request the vendor cannot do (dtype, ISA)
  pybind11::object vendor_error;        // the vendor library failed
};

// Set once at module init; valid for the life of the interpreter.
ExceptionTypes& exception_types();

// The Python exception of each client error kind: ShimLoadError, ValueError,
// UnsupportedError, DeviceUnavailableError, MemoryError, VendorError, RuntimeError.
PyObject* exception_type(fdnn_client::ErrorKind kind);

// In a catch block of a C-API entry point (vectorcall, tp_call): sets the exception being
// handled as the Python exception pybind11's bindings would raise for it.
void set_python_error();

// The C++ object a pybind11 instance holds, or a TypeError naming the argument.
template <class T>
const T& unwrap(PyObject* object, const char* argname, const char* type_name) {
  pybind11::handle h(object);
  if (!pybind11::isinstance<T>(h))
    throw pybind11::type_error(std::string(argname) + ": expected a flux_dnn._core." + type_name +
                               ", got " + Py_TYPE(object)->tp_name);
  return h.cast<const T&>();
}

}  // namespace fdnn_core
