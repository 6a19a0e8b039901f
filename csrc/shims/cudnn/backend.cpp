#include "backend.hpp"

#include <string>

namespace fdnn_cudnn {

Desc::Desc(cudnnBackendDescriptorType_t type) {
  check_cudnn(cudnn().BackendCreateDescriptor(type, &desc_), "cudnnBackendCreateDescriptor");
}

Desc::~Desc() {
  if (desc_ != nullptr) cudnn().BackendDestroyDescriptor(desc_);
}

void Desc::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
               int64_t count, const void* values) {
  cudnnStatus_t status = cudnn().BackendSetAttribute(desc_, name, type, count, values);
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::string call = "cudnnBackendSetAttribute(attribute " +
                     std::to_string(static_cast<int>(name)) + ")";
  fail_cudnn(status, call.c_str());
}

void Desc::set_scale(cudnnBackendAttributeName_t name, double value, bool as_double) {
  if (as_double) {
    set(name, CUDNN_TYPE_DOUBLE, 1, &value);
  } else {
    float f = static_cast<float>(value);
    set(name, CUDNN_TYPE_FLOAT, 1, &f);
  }
}

void Desc::finalize(const char* what) {
  cudnnStatus_t status = try_finalize();
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::string call = std::string("cudnnBackendFinalize(") + what + ")";
  fail_cudnn(status, call.c_str());
}

cudnnStatus_t Desc::try_finalize() { return cudnn().BackendFinalize(desc_); }

int64_t Desc::get(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  int64_t capacity, void* values) const {
  int64_t count = 0;
  cudnnStatus_t status =
      cudnn().BackendGetAttribute(desc_, name, type, capacity, &count, values);
  if (status != CUDNN_STATUS_SUCCESS) {
    std::string call = "cudnnBackendGetAttribute(attribute " +
                       std::to_string(static_cast<int>(name)) + ")";
    fail_cudnn(status, call.c_str());
  }
  // cuDNN reports how many elements there are, which a newer runtime than our headers may
  // make more than we asked for: never let a caller read past what was written.
  if (values != nullptr && count > capacity) return capacity;
  return count;
}

int64_t Desc::get_int64(cudnnBackendAttributeName_t name) const {
  int64_t value = 0;
  get(name, CUDNN_TYPE_INT64, 1, &value);
  return value;
}

}  // namespace fdnn_cudnn
