// _core.PlanCall: the base class of flux_dnn.ConvPlan whose call slot runs a NumPy plan with
// no Python frame: plan(x), with x of the planned array type, goes straight to
// PackedConv::run (which makes the output); every other call (out=, another type, a
// keyword) goes to the subclass's Python method _call(x, out=None), where the rules and
// their error messages live.
#pragma once

#include <pybind11/pybind11.h>

namespace fdnn_core {

void add_plan_call_type(pybind11::module_& m);

}  // namespace fdnn_core
