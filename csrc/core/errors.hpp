// Python exception types of flux_dnn, created by the module and raised by the core.
#pragma once

#include <pybind11/pybind11.h>

namespace fdnn_core {

struct ExceptionTypes {
  pybind11::object shim_load_error;     // a shim library could not be loaded or is foreign
  pybind11::object unavailable_error;   // the device's shim cannot run here
  pybind11::object unsupported_error;   // valid request the vendor cannot do (dtype, ISA)
  pybind11::object vendor_error;        // the vendor library failed
};

// Set once at module init; valid for the life of the interpreter.
ExceptionTypes& exception_types();

[[noreturn]] void raise(const pybind11::object& type, const std::string& message);

}  // namespace fdnn_core
