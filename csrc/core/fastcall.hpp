// Per-call functions bound with CPython's vectorcall protocol instead of pybind11's
// dispatcher, which allocates its argument vectors on the heap for more than six arguments:
// with these, a warm convolution allocates nothing in C++.
#pragma once

#include <pybind11/pybind11.h>

namespace fdnn_core {

// Adds run_conv(shim, spec, x, w, y, bias, stream, workspace_alloc) -> None to the module:
// arguments by position or keyword, errors as the pybind11 bindings raise them.
void add_fast_run_conv(pybind11::module_& m);

}  // namespace fdnn_core
