// Python exception types of flux_dnn, created by the module and raised by the core.
#pragma once

#include <pybind11/pybind11.h>

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

}  // namespace fdnn_core
