/* A shim with no vendor behind it, for testing what the core and the dispatcher do with a
 * shim: load checks, what it reports (info, device, capabilities), error kinds, plan caching
 * and destruction, the flags and alignment a plan is made with. It computes nothing: a
 * FORWARD float32 plan writes 42 into y's first element, so a test sees which pointer it got.
 *
 * Built by tests/test_shims.py with -D options:
 *   FAKE_NAME "fake"   FAKE_PRIORITY 1   FAKE_DEVICE_TYPE FDNN_DEVICE_CPU
 *   FAKE_FLOAT16       also computes float16 (converted)
 *   FAKE_UNAVAILABLE   "why": loads, but reports itself unusable
 *   FAKE_NULL_CAPABILITIES / FAKE_NULL_EXECUTE   leave that function out of the table
 *   FAKE_SHORT_TABLE   a table that ends before Conv_Plan_Pack_Weights
 * Conv_Plan_Create fails with error code (groups - 1000) when groups > 1000.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "flux_dnn/flux_dnn.h"

#ifndef FAKE_NAME
#define FAKE_NAME "fake"
#endif
#ifndef FAKE_PRIORITY
#define FAKE_PRIORITY 1
#endif
#ifndef FAKE_DEVICE_TYPE
#define FAKE_DEVICE_TYPE FDNN_DEVICE_CPU
#endif

/* What the tests read through ctypes. */
FDNN_EXPORT int fake_plans_created = 0;
FDNN_EXPORT int fake_plans_destroyed = 0;
FDNN_EXPORT int fake_executions = 0;
FDNN_EXPORT uint32_t fake_last_flags = 0;
FDNN_EXPORT uintptr_t fake_last_x_address = 0; /* data + byte_offset of x at plan time */

struct FDNN_Error {
  int32_t code;
  char message[160];
};

struct FDNN_Plan {
  int32_t op;
  uint8_t bits;
};

static FDNN_Error* make_error(int32_t code, const char* what, int value) {
  FDNN_Error* e = (FDNN_Error*)malloc(sizeof *e);
  if (e == NULL) return NULL; /* the caller sees success; a test machine has memory */
  e->code = code;
  snprintf(e->message, sizeof e->message, "%s %d", what, value);
  return e;
}

static void Error_Destroy(FDNN_Error_Destroy_Args* args) { free(args->error); }

static void Error_Describe(FDNN_Error_Describe_Args* args) {
  size_t n = 0;
  while (args->error->message[n] != '\0') ++n;
  args->code = args->error->code;
  args->message = args->error->message;
  args->message_size = n;
}

static FDNN_Error* Shim_Info(FDNN_Shim_Info_Args* args) {
  if (args->struct_size < FDNN_Shim_Info_Args_STRUCT_SIZE)
    return make_error(FDNN_ERROR_INVALID_ARGUMENT, "Shim_Info struct_size", (int)args->struct_size);
  args->shim_name = FAKE_NAME;
  args->vendor_name = "FakeVendor";
  args->vendor_version_built = "1.0";
  args->vendor_version_runtime = "1.0";
  args->shim_version = "9.9.9";
  args->device_type = FAKE_DEVICE_TYPE;
  args->num_devices = 1;
  args->priority = FAKE_PRIORITY;
#ifdef FAKE_UNAVAILABLE
  args->unavailable_reason = FAKE_UNAVAILABLE;
#else
  args->unavailable_reason = NULL;
#endif
  return NULL;
}

static FDNN_Error* Device_Describe(FDNN_Device_Describe_Args* args) {
  if (args->device_id != 0)
    return make_error(FDNN_ERROR_INVALID_ARGUMENT, "no such device", args->device_id);
  args->default_flags = FDNN_CONV_ALLOW_REDUCED_PRECISION;
  args->name = "fake device 0";
  return NULL;
}

static FDNN_Error* Conv_Capabilities(FDNN_Conv_Capabilities_Args* args) {
  if (args->op < FDNN_CONV_FORWARD || args->op > FDNN_CONV_BACKWARD_WEIGHT)
    return make_error(FDNN_ERROR_INVALID_ARGUMENT, "no such op", args->op);
  if (args->device_id != 0)
    return make_error(FDNN_ERROR_INVALID_ARGUMENT, "no such device", args->device_id);
  const FDNN_DLDataType t = args->dtype;
  const int is_float32 = t.code == FDNN_DTYPE_FLOAT && t.bits == 32 && t.lanes == 1;
  int is_float16 = 0;
#ifdef FAKE_FLOAT16
  is_float16 = t.code == FDNN_DTYPE_FLOAT && t.bits == 16 && t.lanes == 1;
#endif
  args->support = is_float32 ? FDNN_SUPPORT_NATIVE : is_float16 ? FDNN_SUPPORT_CONVERTED : FDNN_SUPPORT_NONE;
  if (args->support == FDNN_SUPPORT_NONE) {
    args->spatial_ranks = args->activations = args->features = 0;
    args->detail = "fake computes float32 only";
    return NULL;
  }
  args->spatial_ranks = 1u << 2;
  args->activations = args->op == FDNN_CONV_FORWARD
                          ? (1u << FDNN_ACTIVATION_NONE) | (1u << FDNN_ACTIVATION_RELU)
                          : 1u << FDNN_ACTIVATION_NONE;
  args->features = FDNN_FEATURE_GROUPS | FDNN_FEATURE_ALPHA_BETA;
  args->detail = is_float32 ? "fake float32 kernels" : "fake: computed in float32";
  return NULL;
}

static FDNN_Error* Conv_Plan_Create(FDNN_Conv_Plan_Create_Args* args) {
  if (args->struct_size < FDNN_Conv_Plan_Create_Args_STRUCT_SIZE)
    return make_error(FDNN_ERROR_INVALID_ARGUMENT, "Conv_Plan_Create struct_size", (int)args->struct_size);
  if (args->groups > 1000)
    return make_error((int32_t)(args->groups - 1000), "fake failure code", (int)(args->groups - 1000));
  FDNN_Plan* plan = (FDNN_Plan*)malloc(sizeof *plan);
  if (plan == NULL) return make_error(FDNN_ERROR_OUT_OF_MEMORY, "plan", 0);
  plan->op = args->op;
  plan->bits = args->x->dtype.bits;
  fake_last_flags = args->flags;
  fake_last_x_address = (uintptr_t)args->x->data + (uintptr_t)args->x->byte_offset;
  ++fake_plans_created;
  args->plan = plan;
  args->workspace_size = 0;
  args->chosen_algo_id = 7;
  args->algo_name = "fake algorithm";
  return NULL;
}

static FDNN_Error* Conv_Plan_Execute(FDNN_Conv_Plan_Execute_Args* args) {
  ++fake_executions;
  if (args->plan->op == FDNN_CONV_FORWARD && args->plan->bits == 32) *(float*)args->y = 42.0f;
  return NULL;
}

static void Plan_Destroy(FDNN_Plan_Destroy_Args* args) {
  if (args->plan == NULL) return;
  ++fake_plans_destroyed;
  free(args->plan);
}

static FDNN_Api api;

FDNN_EXPORT const FDNN_Api* fdnn_get_api(void) {
  api.struct_size = FDNN_Api_STRUCT_SIZE;
#ifdef FAKE_SHORT_TABLE
  api.struct_size = FDNN_STRUCT_SIZE(FDNN_Api, Plan_Destroy);
#endif
  api.abi_major = FDNN_ABI_MAJOR;
  api.abi_minor = FDNN_ABI_MINOR;
  api.Error_Destroy = Error_Destroy;
  api.Error_Describe = Error_Describe;
  api.Shim_Info = Shim_Info;
  api.Device_Describe = Device_Describe;
  api.Conv_Capabilities = Conv_Capabilities;
  api.Conv_Plan_Create = Conv_Plan_Create;
  api.Conv_Plan_Execute = Conv_Plan_Execute;
  api.Plan_Destroy = Plan_Destroy;
#ifdef FAKE_NULL_CAPABILITIES
  api.Conv_Capabilities = NULL;
#endif
#ifdef FAKE_NULL_EXECUTE
  api.Conv_Plan_Execute = NULL;
#endif
  api.Conv_Plan_Pack_Weights = NULL;
  return &api;
}
