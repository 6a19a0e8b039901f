// flux_dnn._core: the one compiled Python extension. Binds the client library (shim loading,
// plan cache, autotune store) to Python, takes arrays in through DLPack and raises Python
// errors. Vendor-free.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <optional>
#include <vector>

#include "client/autotune.hpp"
#include "client/error.hpp"
#include "client/plan.hpp"
#include "client/shim.hpp"
#include "conv_call.hpp"
#include "dlpack_intake.hpp"
#include "errors.hpp"
#include "fastcall.hpp"
#include "forward_memo.hpp"
#include "plan_call.hpp"
#include "flux_dnn/flux_dnn.h"
// Generated from the header, so after it: add_abi_constants(module).
#include "abi_constants.inc"

namespace py = pybind11;
using namespace fdnn_core;
using fdnn_client::ErrorKind;

namespace fdnn_core {

ExceptionTypes& exception_types() {
  static auto* types = new ExceptionTypes();  // outlives the interpreter's teardown
  return *types;
}

PyObject* exception_type(ErrorKind kind) {
  const ExceptionTypes& t = exception_types();
  switch (kind) {
    case ErrorKind::kShimLoad: return t.shim_load_error.ptr();
    case ErrorKind::kInvalidArgument: return PyExc_ValueError;
    case ErrorKind::kUnsupported: return t.unsupported_error.ptr();
    case ErrorKind::kUnavailable: return t.unavailable_error.ptr();
    case ErrorKind::kOutOfMemory: return PyExc_MemoryError;
    case ErrorKind::kVendor: return t.vendor_error.ptr();
    case ErrorKind::kInternal: break;
  }
  return PyExc_RuntimeError;
}

void set_python_error() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const fdnn_client::Error& e) {
    PyErr_SetString(exception_type(e.kind()), e.what());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

}  // namespace fdnn_core

namespace {

py::object make_exception(py::module_& m, const char* name, PyObject* base, const char* doc) {
  std::string qualified = std::string("flux_dnn.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (type == nullptr) throw py::error_already_set();
  auto object = py::reinterpret_steal<py::object>(type);
  m.attr(name) = object;
  return object;
}

void register_exceptions(py::module_& m) {
  ExceptionTypes& t = exception_types();
  t.shim_load_error = make_exception(m, "ShimLoadError", PyExc_ImportError,
                                     "A shim library could not be loaded or speaks another ABI.");
  t.unavailable_error = make_exception(m, "DeviceUnavailableError", PyExc_RuntimeError,
                                       "The shim for an array's device cannot run here.");
  t.unsupported_error =
      make_exception(m, "UnsupportedError", PyExc_NotImplementedError,
                     "A valid request that this vendor or device cannot do (dtype, ISA).");
  t.vendor_error = make_exception(m, "VendorError", PyExc_RuntimeError,
                                  "The vendor library failed; the message has its status.");
  // Every error of the client library becomes the Python exception of its kind.
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const fdnn_client::Error& e) {
      PyErr_SetString(exception_type(e.kind()), e.what());
    }
  });
}

// The client's warnings (a stale autotune entry, a corrupt autotune file) as Python
// RuntimeWarnings. Called with or without the GIL; raises when warnings are errors.
void warn_in_python(const std::string& message) {
  py::gil_scoped_acquire gil;
  if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) throw py::error_already_set();
}

py::str text(const char* s) { return py::str(s ? s : ""); }

py::dict shim_info(const Shim& shim) {
  FDNN_Shim_Info_Args info = shim.info();
  py::dict d;
  d["name"] = text(info.shim_name);
  d["vendor"] = text(info.vendor_name);
  d["vendor_version_built"] = text(info.vendor_version_built);
  d["vendor_version_runtime"] = text(info.vendor_version_runtime);
  d["shim_version"] = text(info.shim_version);
  d["device_type"] = info.device_type;
  d["num_devices"] = info.num_devices;
  d["priority"] = info.priority;
  d["unavailable_reason"] = info.unavailable_reason ? py::object(py::str(info.unavailable_reason))
                                                    : py::object(py::none());
  d["path"] = shim.path();
  d["abi"] = py::make_tuple(shim.api().abi_major, shim.api().abi_minor);
  return d;
}

py::dict device_info(const Shim& shim, int32_t device_id) {
  FDNN_Device_Describe_Args device = shim.describe_device(device_id);
  py::dict d;
  d["name"] = text(device.name);
  d["default_flags"] = device.default_flags;
  return d;
}

// The floating dtypes of the ABI by their array-library names.
FDNN_DLDataType dtype_of_name(const std::string& name) {
  if (name == "float64") return {FDNN_DTYPE_FLOAT, 64, 1};
  if (name == "float32") return {FDNN_DTYPE_FLOAT, 32, 1};
  if (name == "float16") return {FDNN_DTYPE_FLOAT, 16, 1};
  if (name == "bfloat16") return {FDNN_DTYPE_BFLOAT, 16, 1};
  throw py::value_error("dtype: expected 'float64', 'float32', 'float16' or 'bfloat16', got '" +
                        name + "'");
}

py::dict capabilities(const Shim& shim, int op, const std::string& dtype, int32_t device_id) {
  FDNN_Conv_Capabilities_Args caps = shim.capabilities(device_id, op, dtype_of_name(dtype));
  py::list ranks;
  for (int rank = 1; rank <= FDNN_MAX_SPATIAL_DIMS; ++rank)
    if (caps.spatial_ranks & (1u << rank)) ranks.append(rank);
  py::dict d;
  d["support"] = caps.support;
  d["spatial_ranks"] = py::tuple(ranks);
  d["activations"] = caps.activations;
  d["features"] = caps.features;
  d["detail"] = text(caps.detail);
  return d;
}

template <size_t N>
void copy_dims(int64_t (&dst)[N], const std::vector<int64_t>& src, const char* name) {
  if (src.size() > N) throw py::value_error(std::string(name) + ": at most 3 spatial dims");
  for (size_t i = 0; i < src.size(); ++i) dst[i] = src[i];
}

ConvSpec make_spec(int op, int spatial_rank, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& dilation, const std::vector<int64_t>& padding_lo,
                   const std::vector<int64_t>& padding_hi, int64_t groups, float alpha,
                   float beta, int activation, float activation_alpha, float activation_beta,
                   uint32_t flags, int algo_policy, int64_t algo_id,
                   std::optional<size_t> workspace_limit) {
  if (op < FDNN_CONV_FORWARD || op > FDNN_CONV_BACKWARD_WEIGHT)
    throw py::value_error("op: unknown convolution op " + std::to_string(op));
  if (spatial_rank < 1 || spatial_rank > FDNN_MAX_SPATIAL_DIMS)
    throw py::value_error("spatial_rank must be 1, 2 or 3");
  ConvSpec s;
  fdnn_client::ConvParams& p = s.params;
  p.op = op;
  p.spatial_rank = spatial_rank;
  copy_dims(p.stride, stride, "stride");
  copy_dims(p.dilation, dilation, "dilation");
  copy_dims(p.padding_lo, padding_lo, "padding");
  copy_dims(p.padding_hi, padding_hi, "padding");
  p.groups = groups;
  p.alpha = alpha;
  p.beta = beta;
  p.activation = activation;
  p.activation_alpha = activation_alpha;
  p.activation_beta = activation_beta;
  p.flags = flags;
  p.algo_policy = algo_policy;
  p.algo_id = algo_id;
  p.workspace_limit = workspace_limit.value_or(SIZE_MAX);
  s.finish();
  return s;
}

// What the intake makes of an array (tests and debugging): the ABI descriptor's fields.
py::dict describe_intake(py::handle array, const std::string& argname) {
  BorrowedTensor t(array, argname.c_str(), py::none());
  const FDNN_DLTensor& d = t.desc();
  py::dict out;
  out["data"] = reinterpret_cast<uintptr_t>(d.data);
  out["byte_offset"] = d.byte_offset;
  out["device"] = py::make_tuple(d.device.device_type, d.device.device_id);
  out["dtype"] = py::make_tuple(d.dtype.code, d.dtype.bits, d.dtype.lanes);
  out["shape"] = py::tuple(py::cast(std::vector<int64_t>(d.shape, d.shape + d.ndim)));
  out["strides"] = py::tuple(py::cast(std::vector<int64_t>(d.strides, d.strides + d.ndim)));
  out["read_only"] = t.read_only();
  return out;
}

void bind_shim(py::module_& m) {
  py::class_<Shim, std::unique_ptr<Shim, py::nodelete>>(m, "Shim")
      .def_property_readonly("name", &Shim::name)
      .def_property_readonly("path", &Shim::path)
      .def_property_readonly("device_type", &Shim::device_type)
      .def("info", &shim_info,
           "Shim_Info: name, vendor, versions, shim_version, device_type, num_devices, priority, "
           "unavailable_reason, and the library's path and ABI.")
      .def("device_info", &device_info, py::arg("device_id") = 0,
           "Device_Describe: {'name': str, 'default_flags': int}.")
      .def("capabilities", &capabilities, py::arg("op"), py::arg("dtype"), py::arg("device_id") = 0,
           "Conv_Capabilities for op (CONV_*) and dtype ('float64', 'float32', 'float16', "
           "'bfloat16'): {'support': SUPPORT_*, 'spatial_ranks': tuple, 'activations': bits "
           "1 << ACTIVATION_*, 'features': FEATURE_* bits, 'detail': str}.");
  m.def("load_shim", &Shim::load, py::return_value_policy::reference, py::arg("path"),
        "Load (once) and check the shim library at path; raises ShimLoadError.");
}

void bind_conv(py::module_& m) {
  py::class_<ConvSpec>(m, "ConvSpec")
      .def(py::init(&make_spec), py::arg("op"), py::arg("spatial_rank"), py::arg("stride"),
           py::arg("dilation"), py::arg("padding_lo"), py::arg("padding_hi"), py::arg("groups"),
           py::arg("alpha") = 1.f, py::arg("beta") = 0.f, py::arg("activation") = 0,
           py::arg("activation_alpha") = 0.f, py::arg("activation_beta") = 0.f,
           py::arg("flags") = 0u, py::arg("algo_policy") = 0, py::arg("algo_id") = 0,
           py::arg("workspace_limit") = py::none())
      .def_property_readonly("op", [](const ConvSpec& s) { return s.params.op; })
      .def_property_readonly("beta", [](const ConvSpec& s) { return s.params.beta; })
      .def_property_readonly("flags", [](const ConvSpec& s) { return s.params.flags; });

  add_fast_run_conv(m);
  bind_forward_memo(m);  // NumPy call patterns answered in the core
  add_plan_call_type(m);  // ConvPlan's base: NumPy plan calls without a Python frame  // vectorcall: pybind11's dispatcher would allocate per call
  m.def("plan_info", &plan_info, py::arg("shim"), py::arg("spec"), py::arg("x"), py::arg("w"),
        py::arg("y"), py::arg("bias"), py::arg("stream") = py::none(),
        "The plan run_conv would run (made and cached, not executed): {'workspace_size', "
        "'algo_id', 'algo_name'}.");

  py::class_<PackedConv>(m, "PackedConv")
      .def(py::init<const Shim&, const ConvSpec&, py::handle, py::handle, py::handle, py::handle,
                    py::handle>(),
           py::arg("shim"), py::arg("spec"), py::arg("x"), py::arg("w"), py::arg("y"),
           py::arg("bias"), py::arg("stream"), py::keep_alive<1, 2>())
      // Two bindings, not one with a default w: beyond five arguments (and self) pybind11
      // allocates its argument vector on every call, and run is the allocation-free path.
      .def(
          "run",
          [](const PackedConv& p, py::handle x, py::handle y, py::handle bias, py::handle stream,
             py::handle workspace_alloc) {
            return p.run(x, y, bias, stream, workspace_alloc, py::none());
          },
          py::arg("x"), py::arg("y"), py::arg("bias"), py::arg("stream"),
          py::arg("workspace_alloc"))
      .def("run_with_weights", &PackedConv::run, py::arg("x"), py::arg("y"), py::arg("bias"),
           py::arg("stream"), py::arg("workspace_alloc"), py::arg("w"))
      .def_property_readonly("packed", &PackedConv::packed)
      .def_property_readonly("algo_name", &PackedConv::algo_name);
}

void bind_caches(py::module_& m) {
  m.def("plan_cache_info", [] {
    fdnn_client::PlanCacheStats s = fdnn_client::plan_cache().stats();
    py::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["evictions"] = s.evictions;
    d["size"] = s.size;
    d["capacity"] = s.capacity;
    return d;
  });
  // Without the GIL: evicted plans are destroyed here, through their vendor.
  m.def("set_plan_cache_capacity", [](size_t n) { fdnn_client::plan_cache().set_capacity(n); },
        py::arg("capacity"), py::call_guard<py::gil_scoped_release>());
  m.def("clear_plan_cache", [] { fdnn_client::plan_cache().clear(); },
        py::call_guard<py::gil_scoped_release>());
  m.def("set_autotune_path", [](const std::string& p) { fdnn_client::autotune_store().set_path(p); },
        py::arg("path"));
  m.def("autotune_path", [] { return fdnn_client::autotune_store().path(); });
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "flux_dnn core: shim loading, plan cache, DLPack intake (no vendor code)";
  m.attr("ABI_VERSION") = py::make_tuple(FDNN_ABI_MAJOR, FDNN_ABI_MINOR);
  m.attr("__version__") = FLUX_DNN_VERSION_STRING;
  add_abi_constants(m);
  register_exceptions(m);
  fdnn_client::set_warning_handler(&warn_in_python);
  bind_shim(m);
  bind_conv(m);
  m.def("set_export_fallback", &set_export_fallback, py::arg("fallback"),
        "fallback(array, argname) -> None or (exportable, dtype_code, dtype_bits), called only "
        "when array.__dlpack__ raises BufferError.");
  m.def("describe_intake", &describe_intake, py::arg("array"), py::arg("argname") = "x",
        "The DLPack descriptor the core takes from array (CPU arrays; for tests).");
  bind_caches(m);
}
