#include "forward_memo.hpp"

#include <cstdint>
#include <cstring>
#include <unordered_map>

#include "client/error.hpp"
#include "conv_call.hpp"
#include "dlpack_exchange.hpp"
#include "errors.hpp"
#include "numpy_arrays.hpp"

namespace py = pybind11;

namespace fdnn_core {

namespace {

constexpr int kMaxRank = 5;        // N, C and up to 3 spatial dims
constexpr int kMaxGeometry = 48;   // int64 words for stride, padding, dilation and groups
constexpr size_t kMemoLimit = 4096;  // as the Python memo: forget all beyond it

// One array of the pattern as the Python memo's key sees it: its type (so its library, so
// its provider), shape, strides (NumPy's in bytes, an exchange-API array's in elements: the
// type tells which), dtype.
struct ArrayKey {
  int32_t present;
  int32_t ndim;
  FDNN_DLDataType dtype;
  int32_t unused;
  uint64_t type;  // the PyTypeObject*
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];
};

// A pattern; zero-filled before it is written, so that equal patterns are equal bytes.
struct PatternKey {
  int64_t nd;
  int64_t geometry_words;
  int64_t geometry[kMaxGeometry];  // the four arguments, each as encode() writes it
  ArrayKey x, w, bias;
};

bool operator==(const PatternKey& a, const PatternKey& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

struct PatternHash {
  size_t operator()(const PatternKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the key's 64-bit words
    const auto* words = reinterpret_cast<const uint64_t*>(&k);
    for (size_t i = 0; i < sizeof k / 8; ++i) h = (h ^ words[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};
static_assert(sizeof(PatternKey) % 8 == 0, "PatternKey is hashed as 64-bit words");

struct Remembered {
  py::object shim_object, spec_object;  // keep shim and spec alive
  const Shim* shim;
  const ConvSpec* spec;
  const ExchangeApi* api;  // makes the output (exchange-API arrays); nullptr: NumPy
  FDNN_DLTensor like;      // the output's dtype and device, for api
  int32_t out_ndim, out_itemsize;
  int64_t out_shape[kMaxRank];
  int64_t out_strides[kMaxRank];  // in elements
};

std::unordered_map<PatternKey, Remembered, PatternHash>& memo() {
  static auto* patterns = new std::unordered_map<PatternKey, Remembered, PatternHash>();
  return *patterns;  // outlives the interpreter's teardown, as the objects it holds
}

// Writes an int, or a tuple of ints or of such tuples, as words: an int as (-1, value), a
// tuple as (-2 - length, items...). False for anything else (a string, a list, a float, a
// bool: the Python path decides what those mean) or when the words run out.
bool encode(PyObject* value, PatternKey& key, int depth = 0) {
  auto push = [&](int64_t word) {
    if (key.geometry_words == kMaxGeometry) return false;
    key.geometry[key.geometry_words++] = word;
    return true;
  };
  if (PyLong_CheckExact(value)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    return push(-1) && push(v);
  }
  if (!PyTuple_CheckExact(value) || depth > 1) return false;
  const Py_ssize_t n = PyTuple_GET_SIZE(value);
  if (!push(-2 - n)) return false;
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!encode(PyTuple_GET_ITEM(value, i), key, depth + 1)) return false;
  return true;
}

// A CPU array of an exchange-API type (torch's) as the memo keys it; false when it is none.
// Devices with streams stay on the Python path, which asks the provider for the stream and
// the workspace allocator.
bool describe_exchanged(PyObject* array, ArrayKey& key) {
  const ExchangeApi* api = exchange_api_of(array);
  if (api == nullptr) return false;
  FDNN_DLTensor t{};
  int64_t shape[kMaxDims], strides[kMaxDims];
  if (!exchange_describe(api, array, t, shape, strides, kMaxDims)) {
    PyErr_Clear();  // the Python path raises it in its own words
    return false;
  }
  if (t.device.device_type != FDNN_DEVICE_CPU || t.ndim > kMaxRank) return false;
  key.ndim = t.ndim;
  key.dtype = t.dtype;
  for (int i = 0; i < t.ndim; ++i) {
    key.shape[i] = shape[i];
    key.strides[i] = strides[i];
  }
  return true;
}

bool describe(PyObject* array, ArrayKey& key, bool optional) {
  if (optional && array == Py_None) return true;  // present stays 0
  key.present = 1;
  key.type = reinterpret_cast<uintptr_t>(Py_TYPE(array));
  NumpyView view;
  if (!is_numpy_array(array)) return describe_exchanged(array, key);
  if (!read_numpy(array, view) || view.ndim > kMaxRank) return false;
  key.ndim = view.ndim;
  key.dtype = view.dtype;
  for (int i = 0; i < view.ndim; ++i) {
    key.shape[i] = view.shape[i];
    key.strides[i] = view.strides[i];
  }
  return true;
}

// The output of a remembered pattern: NumPy's with the remembered layout, or a compact one
// of x's library through its exchange API. A new reference, or nullptr with an error set.
PyObject* make_output(const Remembered& r, PyObject* x) {
  if (r.api == nullptr) return numpy_empty(x, r.out_itemsize, r.out_ndim, r.out_shape, r.out_strides);
  return exchange_empty(r.api, r.like, r.out_ndim, r.out_shape);
}

// The pattern of (nd, x, w, bias, stride, padding, dilation, groups); false when this memo
// cannot hold it.
bool pattern_of(PyObject* const* args, PatternKey& key) {
  std::memset(&key, 0, sizeof key);
  if (!PyLong_CheckExact(args[0])) return false;
  key.nd = PyLong_AsLong(args[0]);
  if (!describe(args[1], key.x, false) || !describe(args[2], key.w, false) ||
      !describe(args[3], key.bias, true))
    return false;
  for (int i = 4; i < 8; ++i)
    if (!encode(args[i], key)) return false;
  return true;
}

PyObject* remembered_forward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8) {
    PyErr_Format(PyExc_TypeError, "remembered_forward() takes 8 arguments (%zd given)", nargs);
    return nullptr;
  }
  PatternKey key;
  if (!pattern_of(args, key)) Py_RETURN_NONE;
  auto found = memo().find(key);
  if (found == memo().end()) Py_RETURN_NONE;
  const Remembered& r = found->second;
  PyObject* made = make_output(r, args[1]);
  if (made == nullptr) return nullptr;
  const auto y = py::reinterpret_steal<py::object>(made);
  // Another thread may forget the entry while this one runs without the GIL: hold the shim
  // and spec here, and do not touch the entry (or its iterator) after the run.
  const py::object shim_object = r.shim_object, spec_object = r.spec_object;
  const Shim& shim = *r.shim;
  const ConvSpec& spec = *r.spec;
  try {
    run_conv(shim, spec, args[1], args[2], y, args[3], py::none(), py::none());
    return y.inc_ref().ptr();
  } catch (const fdnn_client::Error& e) {
    if (e.kind() != fdnn_client::ErrorKind::kUnsupported) {
      set_python_error();
      return nullptr;
    }
    memo().erase(key);  // the shim refused the plan (nothing ran): the Python path asks
    Py_RETURN_NONE;     // the next shims and remembers the one that takes it
  } catch (...) {
    set_python_error();
  }
  return nullptr;
}

PyMethodDef remembered_forward_def = {
    "remembered_forward",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&remembered_forward)), METH_FASTCALL,
    "remembered_forward(nd, x, w, bias, stride, padding, dilation, groups) -> array or None\n\n"
    "The result of a remembered call pattern (NumPy arrays, or CPU arrays of a type with DLPack's "
    "exchange API), or None: not remembered."};

// What a remembered pattern needs to make its output like y (the output the Python path made
// for x's type): NumPy's layout as it is; an exchange-API array only when compact (its
// allocator makes compact arrays). False when the core cannot make such outputs.
bool output_of(PyObject* y, PyTypeObject* x_type, Remembered& r) {
  if (Py_TYPE(y) != x_type) return false;
  if (is_numpy_array(y)) {
    NumpyView v;
    if (!read_numpy(y, v) || v.ndim > kMaxRank) return false;
    r.api = nullptr;
    r.out_ndim = v.ndim;
    r.out_itemsize = v.itemsize;
    for (int i = 0; i < v.ndim; ++i) {
      if (v.strides[i] % v.itemsize != 0) return false;
      r.out_shape[i] = v.shape[i];
      r.out_strides[i] = v.strides[i] / v.itemsize;
    }
    return true;
  }
  r.api = exchange_api_of(y);
  int64_t shape[kMaxDims], strides[kMaxDims];
  if (r.api == nullptr || !exchange_describe(r.api, y, r.like, shape, strides, kMaxDims)) {
    PyErr_Clear();
    return false;
  }
  if (r.like.device.device_type != FDNN_DEVICE_CPU || r.like.ndim > kMaxRank) return false;
  r.out_ndim = r.like.ndim;
  r.out_itemsize = (r.like.dtype.bits + 7) / 8;
  int64_t compact = 1;
  for (int i = r.out_ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != compact) return false;  // channels-last: the Python path
    r.out_shape[i] = shape[i];
    r.out_strides[i] = compact;
    compact *= shape[i];
  }
  r.like.shape = r.like.strides = nullptr;  // only dtype and device are kept
  r.like.data = nullptr;
  return true;
}

bool remember_forward(py::args a) {
  if (a.size() != 11) throw py::type_error("remember_forward() takes 11 arguments");
  PyObject* args[8];
  for (int i = 0; i < 8; ++i) args[i] = a[i].ptr();
  PatternKey key;
  if (!pattern_of(args, key)) return false;
  Remembered r;
  if (!output_of(a[10].ptr(), Py_TYPE(args[1]), r)) return false;
  r.shim_object = py::reinterpret_borrow<py::object>(a[8]);
  r.spec_object = py::reinterpret_borrow<py::object>(a[9]);
  r.shim = &unwrap<Shim>(a[8].ptr(), "shim", "Shim");
  r.spec = &unwrap<ConvSpec>(a[9].ptr(), "spec", "ConvSpec");
  if (memo().size() >= kMemoLimit) memo().clear();
  memo().insert_or_assign(key, std::move(r));
  return true;
}

}  // namespace

void bind_forward_memo(py::module_& m) {
  PyObject* function = PyCFunction_NewEx(&remembered_forward_def, nullptr, m.attr("__name__").ptr());
  if (function == nullptr) throw py::error_already_set();
  m.attr("remembered_forward") = py::reinterpret_steal<py::object>(function);
  m.def("remember_forward", &remember_forward,
        "remember_forward(nd, x, w, bias, stride, padding, dilation, groups, shim, spec, y) -> bool\n\n"
        "Remembers the call pattern the Python path has just served into y; False when the core "
        "cannot read such arrays or make such outputs.");
  m.def("forget_forwards", [] { memo().clear(); }, "Forgets every remembered call pattern.");
  m.def("remembered_forward_count", [] { return memo().size(); });
}

}  // namespace fdnn_core
