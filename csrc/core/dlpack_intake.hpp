// Taking arrays in through DLPack: an array's __dlpack__ capsule becomes an FDNN_DLTensor that
// points at the array's own memory (no copy). The capsule is consumed the way the DLPack
// protocol says: renamed to "used_..." and its deleter called when we are done.
// NumPy arrays of float32, float64 and float16 in native byte order are read from their own
// fields instead (numpy_arrays.hpp: no capsule, no buffer); anything else goes the DLPack
// way, which keeps its errors.
#pragma once

#include <pybind11/pybind11.h>

#include "flux_dnn/flux_dnn.h"

namespace fdnn_core {

constexpr int kMaxDims = 8;

// For arrays whose library cannot export their dtype through DLPack (NumPy refuses
// ml_dtypes' bfloat16): a Python callable fallback(array, argname) that the intake calls only
// when array.__dlpack__ raised BufferError. It returns None (the BufferError stands, as a
// ValueError naming the argument), raises an error of its own, or returns
// (exportable, dtype_code, dtype_bits): exportable's capsule is taken with its dtype read as
// (code, bits), which must have exportable's element size (a uint16 view of bfloat16 memory,
// taken as DLPack code 4, 16 bits). Arrays that export never reach it.
void set_export_fallback(pybind11::object fallback);

class BorrowedTensor {
 public:
  BorrowedTensor() = default;
  // None gives an absent tensor. `argname` names the argument in errors. `stream` is passed to __dlpack__(stream=...)
  // when it is not None (GPU arrays; the producer orders its work before that stream).
  BorrowedTensor(pybind11::handle array, const char* argname, pybind11::handle stream);
  BorrowedTensor(const BorrowedTensor&) = delete;
  BorrowedTensor& operator=(const BorrowedTensor&) = delete;
  ~BorrowedTensor();  // needs the GIL: the deleter may release a Python object

  bool present() const { return present_; }
  bool read_only() const { return read_only_; }
  const FDNN_DLTensor& desc() const { return desc_; }
  // First element: data + byte_offset.
  void* first_element() const {
    return static_cast<char*>(desc_.data) + desc_.byte_offset;
  }

 private:
  bool take_numpy_array(pybind11::handle array);
  void release();
  FDNN_DLTensor desc_{};
  int64_t shape_[kMaxDims] = {};
  int64_t strides_[kMaxDims] = {};
  bool read_only_ = false;
  bool present_ = false;
  void* managed_ = nullptr;                // DLManagedTensor[Versioned]*
  void (*deleter_)(void* managed) = nullptr;  // its deleter, type-erased
};

}  // namespace fdnn_core
