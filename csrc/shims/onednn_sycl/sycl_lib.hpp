// The two libraries the onednn_sycl shim drives, both loaded at run time (dlopen), never
// linked: oneDNN's SYCL build (libdnnl.so.3.N of the `onednn` wheel) and Intel's SYCL
// runtime (libsycl.so.8 of `intel-sycl-rt`). The shim builds with g++ and no SYCL compiler:
// it includes oneDNN's C headers for declarations only and declares the few SYCL runtime
// entry points it calls itself (sycl_lib.cpp says which, and the ABI facts they rest on).
//
// Why no DT_NEEDED on libdnnl.so.3: the CPU shim links oneDNN 3.2 (onednn-cpu-gomp), whose
// soname is also libdnnl.so.3. glibc answers a by-name lookup with the first loaded object
// of that soname, so a second oneDNN loaded by name would be the first one. The SYCL oneDNN is
// therefore opened by full path with RTLD_LOCAL | RTLD_DEEPBIND (its own references bind to
// itself even when the CPU oneDNN is global) and called through the table below.
#pragma once

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_sycl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fdnn_sycl {

// oneDNN's C functions the shim calls, each resolved by dlsym in the SYCL oneDNN.
#define FDNN_SYCL_DNNL_FUNCTIONS(X)            \
  X(dnnl_version)                              \
  X(dnnl_sycl_interop_engine_create)           \
  X(dnnl_sycl_interop_stream_create)           \
  X(dnnl_sycl_interop_memory_create)           \
  X(dnnl_engine_destroy)                       \
  X(dnnl_stream_wait)                          \
  X(dnnl_stream_destroy)                       \
  X(dnnl_memory_desc_create_with_strides)      \
  X(dnnl_memory_desc_create_with_tag)          \
  X(dnnl_memory_desc_clone)                    \
  X(dnnl_memory_desc_destroy)                  \
  X(dnnl_memory_desc_equal)                    \
  X(dnnl_memory_desc_get_size)                 \
  X(dnnl_memory_destroy)                       \
  X(dnnl_memory_map_data)                      \
  X(dnnl_memory_unmap_data)                    \
  X(dnnl_memory_get_data_handle)               \
  X(dnnl_primitive_attr_create)                \
  X(dnnl_primitive_attr_destroy)               \
  X(dnnl_primitive_attr_set_scratchpad_mode)   \
  X(dnnl_primitive_attr_set_fpmath_mode)       \
  X(dnnl_primitive_attr_set_post_ops)          \
  X(dnnl_primitive_attr_set_scales_mask)       \
  X(dnnl_post_ops_create)                      \
  X(dnnl_post_ops_destroy)                     \
  X(dnnl_post_ops_append_eltwise)              \
  X(dnnl_post_ops_append_sum)                  \
  X(dnnl_convolution_forward_primitive_desc_create)         \
  X(dnnl_convolution_backward_data_primitive_desc_create)   \
  X(dnnl_convolution_backward_weights_primitive_desc_create) \
  X(dnnl_reorder_primitive_desc_create)        \
  X(dnnl_primitive_desc_next_impl)             \
  X(dnnl_primitive_desc_clone)                 \
  X(dnnl_primitive_desc_destroy)               \
  X(dnnl_primitive_desc_query)                 \
  X(dnnl_primitive_desc_query_md)              \
  X(dnnl_primitive_create)                     \
  X(dnnl_primitive_destroy)                    \
  X(dnnl_primitive_execute)                    \
  X(dnnl_sycl_interop_primitive_execute)

struct Dnnl {
#define FDNN_SYCL_MEMBER(name) decltype(&::name) name = nullptr;
  FDNN_SYCL_DNNL_FUNCTIONS(FDNN_SYCL_MEMBER)
#undef FDNN_SYCL_MEMBER
};

// A sycl::device, sycl::context, sycl::queue or sycl::event as libsycl.so.8 lays it out: one std::shared_ptr to its
// impl (16 bytes), copied and destroyed like one. `impl()` identifies the device/context.
struct SyclObject {
  std::shared_ptr<void> impl;
  const void* id() const { return impl.get(); }
};

// The SYCL runtime calls (libsycl.so.8): a queue's device and context, the devices, names.
struct Sycl {
  int abi = 0;  // libsycl's soname major (8)
  void (*queue_get_device)(SyclObject* out, const void* queue) = nullptr;
  void (*queue_get_context)(SyclObject* out, const void* queue) = nullptr;
  bool (*queue_is_in_order)(const void* queue) = nullptr;
  void (*queue_wait)(void* queue, const void* code_location) = nullptr;
  // queue::ext_oneapi_submit_barrier(): an event of a barrier after every command submitted
  // to the queue before it (host tasks included: intel/llvm queue_impl makes a barrier depend
  // on the queue's host tasks not yet run and on an earlier barrier still blocked by one);
  // with a wait list, after those events.
  void (*queue_barrier)(SyclObject* event, void* queue, const void* code_location) = nullptr;
  void (*queue_barrier_after)(SyclObject* event, void* queue, const std::vector<SyclObject>* wait_list,
                              const void* code_location) = nullptr;
  void (*event_wait)(SyclObject* event) = nullptr;
  // event::get_info<info::event::command_execution_status>(): info::event_command_status,
  // an int enum (submitted 0, running 1, complete 2).
  int32_t (*event_status)(const SyclObject* event) = nullptr;
  void (*get_devices)(std::vector<SyclObject>* out, uint32_t device_type) = nullptr;
  void (*device_get_platform)(SyclObject* out, const SyclObject* device) = nullptr;
  void (*platform_default_context)(SyclObject* out, const SyclObject* platform) = nullptr;
  bool (*device_is_gpu)(const SyclObject* device) = nullptr;
  bool (*device_is_cpu)(const SyclObject* device) = nullptr;
  // sycl::detail::string, returned by value: one char* allocated with new[].
  void (*device_name)(char** out, const SyclObject* device) = nullptr;
};

// Both libraries, loaded once. `error` is empty when usable, else why not (for a user).
struct Libraries {
  Dnnl dnnl;
  Sycl sycl;
  std::string dnnl_path;  // the file loaded
  std::string error;
  bool usable() const { return error.empty(); }
};
const Libraries& libraries();

// The devices the SYCL runtime lists (sycl::device::get_devices(all)), in its order: the
// order dpctl's DLPack device ids count in.
struct DeviceEntry {
  SyclObject device;
  SyclObject context;  // the platform's default context (the one dpctl and torch XPU use)
  std::string name;
  bool gpu = false;
};
const std::vector<DeviceEntry>& devices();

}  // namespace fdnn_sycl
