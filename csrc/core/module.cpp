// flux_dnn._core: the one compiled Python extension. Loads shims, owns the plan cache and the
// autotune store, takes arrays in through DLPack and raises Python errors. Vendor-free.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>

#include <cstddef>

#include "flux_dnn/flux_dnn.h"
#include "abi_constants.inc"  // generated: add_abi_constants(module)
#include "autotune.hpp"
#include "conv_call.hpp"
#include "dlpack_intake.hpp"
#include "errors.hpp"
#include "plan_cache.hpp"
#include "shim_library.hpp"

namespace py = pybind11;
using namespace fdnn_core;

namespace fdnn_core {

ExceptionTypes& exception_types() {
  static auto* types = new ExceptionTypes();  // outlives the interpreter's teardown
  return *types;
}

void raise(const py::object& type, const std::string& message) {
  PyErr_SetString(type.ptr(), message.c_str());
  throw py::error_already_set();
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
}

py::dict shim_info(const ShimLibrary& shim) {
  FDNN_Shim_Info_Args info = shim.info();
  py::dict d;
  auto text = [](const char* s) { return s ? py::str(s) : py::str(""); };
  d["name"] = text(info.shim_name);
  d["vendor"] = text(info.vendor_name);
  d["vendor_version_built"] = text(info.vendor_version_built);
  d["vendor_version_runtime"] = text(info.vendor_version_runtime);
  d["device_type"] = info.device_type;
  d["num_devices"] = info.num_devices;
  d["unavailable_reason"] = info.unavailable_reason ? py::object(py::str(info.unavailable_reason))
                                                    : py::object(py::none());
  d["path"] = shim.path();
  d["abi"] = py::make_tuple(shim.api().abi_major, shim.api().abi_minor);
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
  s.op = static_cast<FDNN_ConvOp>(op);
  s.spatial_rank = spatial_rank;
  copy_dims(s.stride, stride, "stride");
  copy_dims(s.dilation, dilation, "dilation");
  copy_dims(s.padding_lo, padding_lo, "padding");
  copy_dims(s.padding_hi, padding_hi, "padding");
  s.groups = groups;
  s.alpha = alpha;
  s.beta = beta;
  s.activation = static_cast<FDNN_Activation>(activation);
  s.activation_alpha = activation_alpha;
  s.activation_beta = activation_beta;
  s.flags = flags;
  s.algo_policy = static_cast<FDNN_AlgoPolicy>(algo_policy);
  s.algo_id = algo_id;
  s.workspace_limit = workspace_limit.value_or(SIZE_MAX);
  s.finish();
  return s;
}

// The floating dtypes of the ABI by their array-library names.
FDNN_DLDataType dtype_of_name(const std::string& name) {
  if (name == "float64") return {FDNN_DTYPE_FLOAT, 64, 1};
  if (name == "float32") return {FDNN_DTYPE_FLOAT, 32, 1};
  if (name == "float16") return {FDNN_DTYPE_FLOAT, 16, 1};
  if (name == "bfloat16") return {FDNN_DTYPE_BFLOAT, 16, 1};
  throw py::value_error("dtype: expected float64, float32, float16 or bfloat16, got " + name);
}

py::tuple dtype_support(const ShimLibrary& shim, const std::string& dtype, int32_t device_id) {
  auto [support, detail] = shim.dtype_support(device_id, dtype_of_name(dtype));
  return py::make_tuple(support, detail);
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

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "flux_dnn core: shim loading, plan cache, DLPack intake (no vendor code)";
  m.attr("ABI_VERSION") = py::make_tuple(FDNN_ABI_MAJOR, FDNN_ABI_MINOR);
  add_abi_constants(m);
  register_exceptions(m);

  py::class_<ShimLibrary, std::unique_ptr<ShimLibrary, py::nodelete>>(m, "Shim")
      .def_property_readonly("name", &ShimLibrary::name)
      .def_property_readonly("path", &ShimLibrary::path)
      .def_property_readonly("device_type", &ShimLibrary::device_type)
      .def("info", &shim_info)
      .def("device_name", &ShimLibrary::device_name, py::arg("device_id") = 0)
      .def("dtype_support", &dtype_support, py::arg("dtype"), py::arg("device_id") = 0,
           "(support, detail): support is DTYPE_SUPPORT_NONE, _NATIVE or _CONVERTED, or -1 "
           "when the shim predates ABI 1.2 and does not say");
  m.def("load_shim", &ShimLibrary::load, py::return_value_policy::reference, py::arg("path"),
        "Load (once) and check the shim library at path; raises ShimLoadError.");

  py::class_<ConvSpec>(m, "ConvSpec")
      .def(py::init(&make_spec), py::arg("op"), py::arg("spatial_rank"), py::arg("stride"),
           py::arg("dilation"), py::arg("padding_lo"), py::arg("padding_hi"), py::arg("groups"),
           py::arg("alpha") = 1.f, py::arg("beta") = 0.f, py::arg("activation") = 0,
           py::arg("activation_alpha") = 0.f, py::arg("activation_beta") = 0.f,
           py::arg("flags") = 0u, py::arg("algo_policy") = 0, py::arg("algo_id") = 0,
           py::arg("workspace_limit") = py::none())
      .def_readonly("op", &ConvSpec::op)
      .def_readonly("beta", &ConvSpec::beta);

  py::class_<ConvResult>(m, "ConvResult")
      .def_readonly("workspace_size", &ConvResult::workspace_size)
      .def_readonly("algo_id", &ConvResult::algo_id)
      .def_readonly("algo_name", &ConvResult::algo_name);

  m.def("run_conv", &run_conv, py::arg("shim"), py::arg("spec"), py::arg("x"), py::arg("w"),
        py::arg("y"), py::arg("bias"), py::arg("stream"), py::arg("workspace_alloc"),
        "Run spec on DLPack arrays; the written array must exist. Returns the plan's facts.");

  m.def("set_export_fallback", &set_export_fallback, py::arg("fallback"),
        "fallback(array, argname) -> None or (exportable, dtype_code, dtype_bits), called only "
        "when array.__dlpack__ raises BufferError.");
  m.def("describe_intake", &describe_intake, py::arg("array"), py::arg("argname") = "x",
        "The DLPack descriptor the core takes from array (CPU arrays; for tests).");

  py::class_<PackedConv>(m, "PackedConv")
      .def(py::init<const ShimLibrary&, const ConvSpec&, py::handle, py::handle, py::handle,
                    py::handle, py::handle>(),
           py::arg("shim"), py::arg("spec"), py::arg("x"), py::arg("w"), py::arg("y"),
           py::arg("bias"), py::arg("stream"), py::keep_alive<1, 2>())
      .def("run", &PackedConv::run, py::arg("x"), py::arg("y"), py::arg("bias"),
           py::arg("stream"), py::arg("workspace_alloc"))
      .def_property_readonly("packed", &PackedConv::packed)
      .def_property_readonly("algo_name", &PackedConv::algo_name);

  m.def("plan_cache_info", [] {
    PlanCacheStats s = plan_cache().stats();
    py::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["evictions"] = s.evictions;
    d["size"] = s.size;
    d["capacity"] = s.capacity;
    return d;
  });
  m.def("set_plan_cache_capacity", [](size_t n) { plan_cache().set_capacity(n); },
        py::arg("capacity"));
  m.def("clear_plan_cache", [] { plan_cache().clear(); });
  m.def("set_autotune_path", [](const std::string& p) { autotune_store().set_path(p); },
        py::arg("path"));
  m.def("autotune_path", [] { return autotune_store().path(); });
}
