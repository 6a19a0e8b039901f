#include "plan_call.hpp"

#include "client/error.hpp"
#include "conv_call.hpp"
#include "errors.hpp"

namespace py = pybind11;

namespace fdnn_core {

namespace {

// The fields start zeroed (tp_alloc): unbound, every call goes to _call.
struct PlanCallObject {
  PyObject_HEAD
  PyObject* packed;       // the _core.PackedConv (owned), NULL until _bind_fast
  const PackedConv* run;  // its C++ object
  PyObject* bias;         // owned; Py_None without a bias
  PyObject* array_type;   // owned: the type whose arrays take the fast path
};

void plan_call_dealloc(PyObject* self) {
  auto* p = reinterpret_cast<PlanCallObject*>(self);
  Py_CLEAR(p->packed);
  Py_CLEAR(p->bias);
  Py_CLEAR(p->array_type);
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);  // instances of a heap type hold a reference to it
}

PyObject* plan_call_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* p = reinterpret_cast<PlanCallObject*>(self);
  const bool fast = p->run != nullptr && PyTuple_GET_SIZE(args) == 1 &&
                    (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0) &&
                    reinterpret_cast<PyObject*>(Py_TYPE(PyTuple_GET_ITEM(args, 0))) == p->array_type;
  if (!fast) {
    static PyObject* name = PyUnicode_InternFromString("_call");
    PyObject* method = PyObject_GetAttr(self, name);
    if (method == nullptr) return nullptr;
    PyObject* result = PyObject_Call(method, args, kwargs);
    Py_DECREF(method);
    return result;
  }
  try {
    py::object y = p->run->run(PyTuple_GET_ITEM(args, 0), py::none(), p->bias, py::none(),
                               py::none(), py::none());
    return y.release().ptr();
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

// _bind_fast(packed, bias, array_type): calls with one array of array_type run packed.
PyObject* plan_call_bind_fast(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "_bind_fast(packed, bias, array_type) takes 3 arguments");
    return nullptr;
  }
  auto* p = reinterpret_cast<PlanCallObject*>(self);
  try {
    p->run = &unwrap<PackedConv>(args[0], "packed", "PackedConv");
  } catch (...) {
    set_python_error();
    return nullptr;
  }
  Py_INCREF(args[0]);
  Py_INCREF(args[1]);
  Py_INCREF(args[2]);
  Py_XSETREF(p->packed, args[0]);
  Py_XSETREF(p->bias, args[1]);
  Py_XSETREF(p->array_type, args[2]);
  Py_RETURN_NONE;
}

PyMethodDef plan_call_methods[] = {
    {"_bind_fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&plan_call_bind_fast)),
     METH_FASTCALL,
     "_bind_fast(packed, bias, array_type): a call with one array of array_type runs packed "
     "(a _core.PackedConv that makes its output) with bias."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot plan_call_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(&plan_call_dealloc)},
    {Py_tp_call, reinterpret_cast<void*>(&plan_call_call)},
    {Py_tp_methods, plan_call_methods},
    {Py_tp_doc, const_cast<char*>("Base of flux_dnn.ConvPlan: its call slot runs NumPy plans in C++.")},
    {0, nullptr}};

PyType_Spec plan_call_spec = {"flux_dnn._core.PlanCall", sizeof(PlanCallObject), 0,
                              Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, plan_call_slots};

}  // namespace

void add_plan_call_type(py::module_& m) {
  PyObject* type = PyType_FromSpec(&plan_call_spec);
  if (type == nullptr) throw py::error_already_set();
  m.attr("PlanCall") = py::reinterpret_steal<py::object>(type);
}

}  // namespace fdnn_core
