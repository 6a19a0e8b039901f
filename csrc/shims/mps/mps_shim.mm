// The MPS shim (libflux_dnn_mps.dylib): convolution on Apple GPUs through MPSGraph, behind
// flux_dnn's ABI. Tensors are DLPack kDLMetal (8): `data` is an id<MTLBuffer>, and the byte
// offsets come apart in FDNN_Buffer_Offsets (ABI 2.1), never as pointer arithmetic on the
// object. A plan is one compiled MPSGraphExecutable; the caller caches plans (no second cache
// here). Execute returns when the GPU has finished. Decisions that need no Apple SDK live in
// mps_problem.cpp (tested on Linux); this file only speaks Metal.
#include "mps_graph.hpp"

#include <cstring>
#include <memory>

namespace fdnn_mps {
namespace {

using fdnn_shim::fail;
using fdnn_shim::guarded;

const char* kShimName = "mps";

std::string text_of(NSString* s) {
  const char* utf8 = s.UTF8String;
  return utf8 != nullptr ? utf8 : "?";
}

// The device PyTorch would use (choose_device, mps_problem.cpp) among all of them.
// MTLCopyAllDevices rather than MTLCreateSystemDefaultDevice: Apple documents that the latter
// needs CoreGraphics linked on macOS (command-line tools may get nil), and it would return
// the virtual GPU of a hosted CI runner, where MPS is not supported.
void pick_device(MetalEnv& env) {
  NSArray<id<MTLDevice>>* devices = MTLCopyAllDevices();
  std::vector<DeviceTraits> traits;
  for (id<MTLDevice> d in devices)
    traits.push_back({text_of(d.name), static_cast<bool>(d.isLowPower),
                      static_cast<bool>([d supportsFamily:MTLGPUFamilyMac2])});
  const DeviceChoice choice = choose_device(traits);
  if (choice.index < 0) {
    env.unavailable = choice.reason;
    return;
  }
  env.device = devices[static_cast<NSUInteger>(choice.index)];
}

MetalEnv make_env() {
  MetalEnv env;
  @autoreleasepool {
    NSOperatingSystemVersion v = [[NSProcessInfo processInfo] operatingSystemVersion];
    env.os = OsVersion{static_cast<int>(v.majorVersion), static_cast<int>(v.minorVersion)};
    env.os_text = "macOS " + std::to_string(v.majorVersion) + "." + std::to_string(v.minorVersion);
    if (const char* why = os_unavailable_reason(env.os)) {
      env.unavailable = why;
      return env;
    }
    pick_device(env);
    if (env.device == nil) return env;
    env.queue = [env.device newCommandQueue];
    if (env.queue == nil) {
      env.unavailable = "Metal made no command queue";
      env.device = nil;
      return env;
    }
    env.device_name = text_of(env.device.name) + " (" + env.os_text + ")";
  }
  return env;
}

int32_t num_devices(const MetalEnv& env) { return env.reason() == nullptr ? 1 : 0; }

void check_device(int32_t device_id, const char* function) {
  const MetalEnv& env = metal_env();
  if (device_id < 0 || device_id >= num_devices(env))
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s: device_id %d is out of range (%d Metal device%s%s%s)",
         function, static_cast<int>(device_id), static_cast<int>(num_devices(env)),
         num_devices(env) == 1 ? "" : "s", env.reason() ? ": " : "", env.reason() ? env.reason() : "");
}

// ------------------------------------------------------------------------------------------
// Table functions

FDNN_Error* shim_info(FDNN_Shim_Info_Args* args) {
  return guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Shim_Info_Args_STRUCT_SIZE, "Shim_Info");
    const MetalEnv& env = metal_env();
    args->shim_name = kShimName;
    args->vendor_name = "MetalPerformanceShadersGraph";
    args->vendor_version_built = "macOS SDK";
    args->vendor_version_runtime = env.os_text.c_str();
    args->shim_version = FLUX_DNN_VERSION_STRING;
    args->device_type = FDNN_DEVICE_METAL;
    args->num_devices = num_devices(env);
    args->priority = FDNN_PRIORITY_VENDOR;
    args->unavailable_reason = env.reason();
  });
}

FDNN_Error* device_describe(FDNN_Device_Describe_Args* args) {
  return guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Device_Describe_Args_STRUCT_SIZE, "Device_Describe");
    check_device(args->device_id, "Device_Describe");
    args->default_flags = 0;  // MPSGraph offers no reduced-precision switch for float32
    args->name = metal_env().device_name.c_str();
  });
}

FDNN_Error* conv_capabilities(FDNN_Conv_Capabilities_Args* args) {
  return fdnn_shim::conv_capabilities(args, [](int32_t device_id, int32_t op, FDNN_DLDataType dtype) {
    check_device(device_id, "Conv_Capabilities");
    return capabilities(metal_env().os, op, dtype);
  });
}

void check_policy(const FDNN_Conv_Plan_Create_Args& a) {
  // MPSGraph picks its kernels itself: one algorithm, id 0, whatever the policy.
  if (a.algo_policy == FDNN_ALGO_GIVEN && a.algo_id != 0)
    fdnn_shim::fail_unknown_algo(a, "the MPS shim", "MPSGraph has one algorithm, 0");
}

FDNN_Error* plan_create(FDNN_Conv_Plan_Create_Args* args) {
  return guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Create_Args_STRUCT_SIZE, "Conv_Plan_Create");
    const FDNN_Conv_Plan_Create_Args& a = *args;
    fdnn_shim::check_conv_problem(a, FDNN_DEVICE_METAL);
    check_device(a.x->device.device_id, "Conv_Plan_Create");
    check_policy(a);
    auto plan = std::make_unique<MpsPlan>();
    plan->problem = plan_problem(a, metal_env().os);
    if (@available(macOS 13.0, *)) {
      build_plan(*plan);
    } else {
      fail(FDNN_ERROR_UNAVAILABLE, "%s", os_unavailable_reason(metal_env().os));
    }
    args->workspace_size = 0;  // staging arrays belong to the plan
    args->chosen_algo_id = 0;
    args->algo_name = plan->algo_name.c_str();
    args->plan = reinterpret_cast<FDNN_Plan*>(plan.release());
  });
}

// The byte offsets of a Metal call (ABI 2.1): required, since `data` is an object.
const FDNN_Buffer_Offsets& offsets_of(const FDNN_Extension_Base* chain, const char* function) {
  for (const FDNN_Extension_Base* e = chain; e != nullptr; e = e->next)
    if (e->type == FDNN_EXTENSION_BUFFER_OFFSETS) {
      if (e->struct_size < FDNN_Buffer_Offsets_STRUCT_SIZE)
        fail(FDNN_ERROR_INVALID_ARGUMENT, "%s: FDNN_Buffer_Offsets struct_size %zu is smaller than %zu",
             function, e->struct_size, static_cast<size_t>(FDNN_Buffer_Offsets_STRUCT_SIZE));
      return *reinterpret_cast<const FDNN_Buffer_Offsets*>(e);
    }
  fail(FDNN_ERROR_INVALID_ARGUMENT,
       "%s: Metal tensors need their byte offsets in an FDNN_Buffer_Offsets extension (ABI 2.1): "
       "x, w, y and bias are id<MTLBuffer> objects, not addresses",
       function);
}

Buffers buffers_of(const FDNN_Conv_Plan_Execute_Args& a, const ProblemPlan& p) {
  const FDNN_Buffer_Offsets& o = offsets_of(a.extension_start, "Conv_Plan_Execute");
  Buffers b{};
  void* const data[] = {a.x, a.w, a.y, a.bias};
  const uint64_t offsets[] = {o.x_offset, o.w_offset, o.y_offset, o.bias_offset};
  static const char* const names[] = {"x", "w", "y", "bias"};
  for (int i = 0; i < static_cast<int>(Role::kNumRoles); ++i) {
    b.buffer[i] = (__bridge id<MTLBuffer>)data[i];
    b.offset[i] = offsets[i];
    if (offsets[i] % p.element_size != 0)
      fail(FDNN_ERROR_INVALID_ARGUMENT,
           "Conv_Plan_Execute: %s's byte offset %llu is not a multiple of its element size (%zu)",
           names[i], static_cast<unsigned long long>(offsets[i]), p.element_size);
  }
  return b;
}

FDNN_Error* plan_execute(FDNN_Conv_Plan_Execute_Args* args) {
  return guarded([&] {
    fdnn_shim::check_struct_size(args, FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE, "Conv_Plan_Execute");
    MpsPlan& plan = const_cast<MpsPlan&>(fdnn_shim::plan_of<MpsPlan>(args->plan, "Conv_Plan_Execute"));
    // The shared rules: every buffer the op reads or writes given. Element size 1: `data` is
    // an object here, its offset's alignment is buffers_of's; no workspace is ever needed.
    fdnn_shim::check_execute_args(*args, 1, 0, {true, true, true, plan.problem.bias.present});
    const Buffers buffers = buffers_of(*args, plan.problem);
    // The caller's MTLCommandQueue when it gives one, else the shim's own.
    id<MTLCommandQueue> queue =
        args->stream != nullptr ? (__bridge id<MTLCommandQueue>)args->stream : metal_env().queue;
    if (@available(macOS 13.0, *)) {
      run_plan(plan, buffers, queue);
    } else {
      fail(FDNN_ERROR_UNAVAILABLE, "%s", os_unavailable_reason(metal_env().os));
    }
  });
}

void plan_destroy(FDNN_Plan_Destroy_Args* args) {
  if (args == nullptr || args->plan == nullptr) return;
  delete reinterpret_cast<MpsPlan*>(args->plan);
}

FDNN_Api make_api() {
  FDNN_Api api{};
  api.struct_size = FDNN_Api_STRUCT_SIZE;
  api.abi_major = FDNN_ABI_MAJOR;
  api.abi_minor = FDNN_ABI_MINOR;
  api.extension_start = nullptr;
  api.Error_Destroy = fdnn_shim::error_destroy;
  api.Error_Describe = fdnn_shim::error_describe;
  api.Shim_Info = shim_info;
  api.Device_Describe = device_describe;
  api.Conv_Capabilities = conv_capabilities;
  api.Conv_Plan_Create = plan_create;
  api.Conv_Plan_Execute = plan_execute;
  api.Plan_Destroy = plan_destroy;
  api.Conv_Plan_Pack_Weights = nullptr;  // MPSGraph keeps no packed weights of ours
  return api;
}

}  // namespace

const MetalEnv& metal_env() {
  static const MetalEnv env = make_env();  // (thread-safe initialisation)
  return env;
}

}  // namespace fdnn_mps

extern "C" FDNN_EXPORT const FDNN_Api* fdnn_get_api(void) {
  static const FDNN_Api api = fdnn_mps::make_api();
  return &api;
}
