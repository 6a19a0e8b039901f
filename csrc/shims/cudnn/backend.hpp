// RAII and typed helpers over cuDNN's backend descriptor API (cudnnBackend*), so the code
// that builds graphs reads as "set this attribute to that" and every failure names the
// attribute that cuDNN refused.
#pragma once

#include <memory>
#include <vector>

#include "cudnn_lib.hpp"

namespace fdnn_cudnn {

class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type);
  ~Desc();
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* values);
  void set_int64(cudnnBackendAttributeName_t name, int64_t value) {
    set(name, CUDNN_TYPE_INT64, 1, &value);
  }
  void set_int64s(cudnnBackendAttributeName_t name, const std::vector<int64_t>& values) {
    set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(values.size()), values.data());
  }
  void set_dtype(cudnnBackendAttributeName_t name, cudnnDataType_t value) {
    set(name, CUDNN_TYPE_DATA_TYPE, 1, &value);
  }
  void set_desc(cudnnBackendAttributeName_t name, const Desc& value) {
    cudnnBackendDescriptor_t raw = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  void set_handle(cudnnBackendAttributeName_t name, cudnnHandle_t handle) {
    set(name, CUDNN_TYPE_HANDLE, 1, &handle);
  }
  // A scaling factor: cuDNN wants double for double compute, float otherwise.
  void set_scale(cudnnBackendAttributeName_t name, double value, bool as_double);

  // Throws on failure.
  void finalize(const char* what);
  // Returns the status instead, for candidates that may legitimately be refused.
  cudnnStatus_t try_finalize();

  // Reads up to `capacity` elements into `values`; returns how many were written (at most
  // `capacity`), or, with `values` NULL, how many there are.
  int64_t get(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
              int64_t capacity, void* values) const;
  int64_t get_int64(cudnnBackendAttributeName_t name) const;

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

using DescPtr = std::shared_ptr<Desc>;

inline DescPtr make_desc(cudnnBackendDescriptorType_t type) {
  return std::make_shared<Desc>(type);
}

}  // namespace fdnn_cudnn
