// The call patterns of conv1d/2d/3d on NumPy arrays without keyword options, remembered in
// the core: a repeated call is answered here (key, output, plan, execute) without a Python
// frame of flux_dnn's own. The Python memo (_conv._memo) stays the one that validates: it
// adds a pattern here after serving it, and forgets this memo whenever it forgets its own.
#pragma once

#include <pybind11/pybind11.h>

namespace fdnn_core {

// Adds, to the module:
//   remembered_forward(nd, x, w, bias, stride, padding, dilation, groups) -> array or None
//     (vectorcall, positional) the result of a remembered pattern, or None when the pattern
//     is not remembered (or its shim now refuses it): the caller then takes the Python path.
//   remember_forward(nd, x, w, bias, stride, padding, dilation, groups, shim, spec, y) -> bool
//     remembers the pattern the Python path has just served into y (false: not one this memo
//     can hold: another array type, dtype, or a geometry other than ints and tuples of ints).
//   forget_forwards() -> None
//   remembered_forward_count() -> int
void bind_forward_memo(pybind11::module_& m);

}  // namespace fdnn_core
