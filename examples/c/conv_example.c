/*
 * conv_example.c -- one convolution through a flux_dnn shim, in plain C11, with nothing but
 * the ABI header: load the library, check its ABI, ask what it can do, plan, execute, and
 * check every output against a direct loop in double.
 *
 *   conv_example /path/to/libflux_dnn_blas.so
 *
 * Build and run it against the CPU shims of the installed flux_dnn: `make run` (Makefile).
 * Exits 0 when every output matches, 1 on a mismatch or an error (its message printed), 2 on
 * a bad command line.
 */
#define _POSIX_C_SOURCE 200809L /* dlopen, dlsym, dlerror under -std=c11 */

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flux_dnn/flux_dnn.h"

/* The problem: y = conv(x, w) + bias, stride 1, padding 1 ("same"), float32, NCHW. */
enum { N = 1, C = 2, H = 6, W = 6, K = 3, R = 3, S = 3, PAD = 1 };
enum { P = H + 2 * PAD - R + 1, Q = W + 2 * PAD - S + 1 }; /* output height and width */

/* ---------------------------------------------------------------------------------------- */
/* Errors                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static const char* error_code_name(int32_t code) {
  switch (code) {
    case FDNN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FDNN_ERROR_UNSUPPORTED: return "unsupported";
    case FDNN_ERROR_UNAVAILABLE: return "unavailable";
    case FDNN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case FDNN_ERROR_VENDOR: return "vendor library error";
    case FDNN_ERROR_INTERNAL: return "internal error";
    default: return "unknown error code";
  }
}

/* When a call returned an error: prints `what` and the shim's message, frees the error (the
 * caller owns it) and returns 1. Returns 0 for NULL, which is success. */
static int failed(const FDNN_Api* api, FDNN_Error* error, const char* what) {
  if (error == NULL) return 0;
  FDNN_Error_Describe_Args describe = {.struct_size = FDNN_Error_Describe_Args_STRUCT_SIZE,
                                       .error = error};
  api->Error_Describe(&describe);
  fprintf(stderr, "%s failed: %s (code %d): %.*s\n", what, error_code_name(describe.code),
          (int)describe.code, (int)describe.message_size, describe.message);
  FDNN_Error_Destroy_Args destroy = {.struct_size = FDNN_Error_Destroy_Args_STRUCT_SIZE,
                                     .error = error};
  api->Error_Destroy(&destroy);
  return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Loading and describing the shim                                                          */
/* ---------------------------------------------------------------------------------------- */

/* dlopens the shim and returns its table, or NULL (reason printed). The one exported symbol
 * is fdnn_get_api; a caller refuses a table of another ABI major. */
static const FDNN_Api* load_shim(const char* path, void** library) {
  *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (*library == NULL) {
    fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
    return NULL;
  }
  void* symbol = dlsym(*library, FDNN_GET_API_SYMBOL);
  if (symbol == NULL) {
    fprintf(stderr, "%s is not a flux_dnn shim: no %s\n", path, FDNN_GET_API_SYMBOL);
    return NULL;
  }
  /* ISO C has no cast from an object pointer to a function pointer; POSIX guarantees that
   * dlsym's result is one, so copy its bytes. */
  FDNN_GetApiFn* get_api;
  _Static_assert(sizeof get_api == sizeof symbol, "function and object pointers differ in size");
  memcpy(&get_api, &symbol, sizeof get_api);
  const FDNN_Api* api = get_api();
  if (api->abi_major != FDNN_ABI_MAJOR) {
    fprintf(stderr, "%s speaks flux_dnn ABI %d.%d; this program was built for ABI %d.%d\n", path,
            (int)api->abi_major, (int)api->abi_minor, FDNN_ABI_MAJOR, FDNN_ABI_MINOR);
    return NULL;
  }
  return api;
}

static const char* text(const char* s) { return s != NULL ? s : "(null)"; }

/* Prints Shim_Info; returns 1 when the call fails or the shim cannot run here. */
static int print_shim_info(const FDNN_Api* api) {
  FDNN_Shim_Info_Args info = {.struct_size = FDNN_Shim_Info_Args_STRUCT_SIZE};
  if (failed(api, api->Shim_Info(&info), "Shim_Info")) return 1;
  printf("shim %s %s (ABI %d.%d): %s %s, built against %s; DLPack device type %d, %d device(s), "
         "priority %d\n",
         text(info.shim_name), text(info.shim_version), (int)api->abi_major, (int)api->abi_minor,
         text(info.vendor_name), text(info.vendor_version_runtime),
         text(info.vendor_version_built), (int)info.device_type, (int)info.num_devices,
         (int)info.priority);
  if (info.unavailable_reason != NULL) {
    fprintf(stderr, "the shim cannot run here: %s\n", info.unavailable_reason);
    return 1;
  }
  return 0;
}

/* Prints device 0's name; *default_flags gets the flags to plan with when the caller has no
 * preference (TF32 on NVIDIA, 0 on CPUs). */
static int describe_device(const FDNN_Api* api, uint32_t* default_flags) {
  FDNN_Device_Describe_Args device = {.struct_size = FDNN_Device_Describe_Args_STRUCT_SIZE,
                                      .device_id = 0};
  if (failed(api, api->Device_Describe(&device), "Device_Describe")) return 1;
  printf("device 0: %s, default flags 0x%x\n", text(device.name), (unsigned)device.default_flags);
  *default_flags = device.default_flags;
  return 0;
}

/* Asks whether the shim computes a float32 2-D forward convolution on device 0. */
static int check_capabilities(const FDNN_Api* api) {
  FDNN_Conv_Capabilities_Args caps = {.struct_size = FDNN_Conv_Capabilities_Args_STRUCT_SIZE,
                                      .device_id = 0,
                                      .op = FDNN_CONV_FORWARD,
                                      .dtype = {FDNN_DTYPE_FLOAT, 32, 1}};
  if (failed(api, api->Conv_Capabilities(&caps), "Conv_Capabilities")) return 1;
  static const char* const how[] = {"not computed", "native", "converted"};
  printf("float32 forward: %s, spatial ranks 0x%x, activations 0x%x, features 0x%x%s%s\n",
         caps.support >= 0 && caps.support <= 2 ? how[caps.support] : "unknown",
         (unsigned)caps.spatial_ranks, (unsigned)caps.activations, (unsigned)caps.features,
         caps.detail != NULL && caps.detail[0] != '\0' ? ": " : "", caps.detail ? caps.detail : "");
  if (caps.support == FDNN_SUPPORT_NONE || !(caps.spatial_ranks & (1u << 2))) {
    fprintf(stderr, "the shim does not compute a float32 2-D forward convolution here\n");
    return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The convolution                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* A DLPack descriptor with its own shape and (compact, in elements) strides. It points into
 * itself, so it stays where it was filled. */
typedef struct {
  int64_t shape[4];
  int64_t strides[4];
  FDNN_DLTensor desc;
} Tensor;

static void describe_tensor(Tensor* t, float* data, int32_t ndim, const int64_t* shape) {
  int64_t stride = 1;
  for (int32_t d = ndim - 1; d >= 0; --d) {
    t->shape[d] = shape[d];
    t->strides[d] = stride;
    stride *= shape[d];
  }
  t->desc = (FDNN_DLTensor){.data = data,
                            .device = {FDNN_DEVICE_CPU, 0},
                            .ndim = ndim,
                            .dtype = {FDNN_DTYPE_FLOAT, 32, 1},
                            .shape = t->shape,
                            .strides = t->strides,
                            .byte_offset = 0};
}

/* Deterministic values in [-1, 1). */
static void fill(float* values, size_t count, uint32_t seed) {
  for (size_t i = 0; i < count; ++i) {
    seed = seed * 1664525u + 1013904223u;
    values[i] = (float)((seed >> 8) * (2.0 / 16777216.0) - 1.0);
  }
}

/* Compares each y with the sum in double. A float32 sum of n products may be off by about n
 * roundings of the sum of their magnitudes, in whatever order the shim adds them. */
static int compare_with_reference(const float* x, const float* w, const float* bias,
                                  const float* y) {
  const int terms = C * R * S + 1;
  int mismatches = 0;
  double worst = 0.0;
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k)
      for (int p = 0; p < P; ++p)
        for (int q = 0; q < Q; ++q) {
          double sum = bias[k], magnitude = fabs((double)bias[k]);
          for (int c = 0; c < C; ++c)
            for (int r = 0; r < R; ++r)
              for (int s = 0; s < S; ++s) {
                const int h = p + r - PAD, v = q + s - PAD;
                if (h < 0 || h >= H || v < 0 || v >= W) continue; /* zero padding */
                const double product =
                    (double)x[((n * C + c) * H + h) * W + v] * w[((k * C + c) * R + r) * S + s];
                sum += product;
                magnitude += fabs(product);
              }
          const double got = y[((n * K + k) * P + p) * Q + q];
          const double error = fabs(got - sum), tolerance = terms * FLT_EPSILON * magnitude;
          if (!(error <= tolerance)) { /* also catches NaN: the poison left unwritten */
            if (mismatches++ < 5)
              fprintf(stderr, "y[%d,%d,%d,%d] = %.9g, expected %.9g (tolerance %.3g)\n", n, k, p,
                      q, got, sum, tolerance);
          }
          if (error > worst) worst = error;
        }
  if (mismatches > 0) {
    fprintf(stderr, "%d of %d outputs differ from the float64 reference\n", mismatches,
            N * K * P * Q);
    return 1;
  }
  printf("all %d outputs match the float64 reference (max |error| %.3g)\n", N * K * P * Q, worst);
  return 0;
}

/* Executes the plan with the workspace it asks for (64-byte aligned, as the header asks),
 * then checks y. */
static int execute_plan(const FDNN_Api* api, const FDNN_Plan* plan, size_t workspace_size,
                        float* x, float* w, float* bias, float* y) {
  void* workspace = NULL;
  if (workspace_size > 0) {
    workspace = aligned_alloc(64, (workspace_size + 63) / 64 * 64);
    if (workspace == NULL) {
      fprintf(stderr, "out of memory for a workspace of %zu bytes\n", workspace_size);
      return 1;
    }
  }
  FDNN_Conv_Plan_Execute_Args execute = {.struct_size = FDNN_Conv_Plan_Execute_Args_STRUCT_SIZE,
                                         .plan = plan,
                                         .x = x,
                                         .w = w,
                                         .y = y,
                                         .bias = bias,
                                         .workspace = workspace,
                                         .workspace_size = workspace_size};
  int status = failed(api, api->Conv_Plan_Execute(&execute), "Conv_Plan_Execute") ||
               compare_with_reference(x, w, bias, y);
  free(workspace);
  return status;
}

/* Plans y = conv(x, w) + bias for these buffers, executes and checks it, destroys the plan. */
static int convolve(const FDNN_Api* api, uint32_t flags, float* x, float* w, float* bias,
                    float* y) {
  /* The descriptors carry the data pointers too: a plan may depend on their alignment. */
  Tensor xt, wt, yt, bt;
  describe_tensor(&xt, x, 4, (const int64_t[]){N, C, H, W});
  describe_tensor(&wt, w, 4, (const int64_t[]){K, C, R, S});
  describe_tensor(&yt, y, 4, (const int64_t[]){N, K, P, Q});
  describe_tensor(&bt, bias, 1, (const int64_t[]){K});

  FDNN_Conv_Plan_Create_Args create = {.struct_size = FDNN_Conv_Plan_Create_Args_STRUCT_SIZE,
                                       .op = FDNN_CONV_FORWARD,
                                       .spatial_rank = 2,
                                       .x = &xt.desc,
                                       .w = &wt.desc,
                                       .y = &yt.desc,
                                       .bias = &bt.desc,
                                       .stride = {1, 1},
                                       .dilation = {1, 1},
                                       .padding_lo = {PAD, PAD},
                                       .padding_hi = {PAD, PAD},
                                       .groups = 1,
                                       .alpha = 1.0f,
                                       .beta = 0.0f,
                                       .activation = FDNN_ACTIVATION_NONE,
                                       .flags = flags,
                                       .algo_policy = FDNN_ALGO_HEURISTIC,
                                       .workspace_limit = SIZE_MAX};
  if (failed(api, api->Conv_Plan_Create(&create), "Conv_Plan_Create")) return 1;
  printf("plan: algorithm %s, workspace %zu bytes\n", text(create.algo_name),
         create.workspace_size);
  int status = execute_plan(api, create.plan, create.workspace_size, x, w, bias, y);
  FDNN_Plan_Destroy_Args destroy = {.struct_size = FDNN_Plan_Destroy_Args_STRUCT_SIZE,
                                    .plan = create.plan};
  api->Plan_Destroy(&destroy);
  return status;
}

/* Fills x, w and bias, poisons y (every element must be written), convolves, frees. */
static int run_convolution(const FDNN_Api* api, uint32_t flags) {
  float* x = malloc(sizeof(float) * N * C * H * W);
  float* w = malloc(sizeof(float) * K * C * R * S);
  float* bias = malloc(sizeof(float) * K);
  float* y = malloc(sizeof(float) * N * K * P * Q);
  int status = 1;
  if (x == NULL || w == NULL || bias == NULL || y == NULL) {
    fprintf(stderr, "out of memory\n");
  } else {
    fill(x, (size_t)N * C * H * W, 1);
    fill(w, (size_t)K * C * R * S, 2);
    fill(bias, K, 3);
    for (size_t i = 0; i < (size_t)N * K * P * Q; ++i) y[i] = NAN;
    status = convolve(api, flags, x, w, bias, y);
  }
  free(y);
  free(bias);
  free(w);
  free(x);
  return status;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SHIM_LIBRARY   (e.g. .../site-packages/flux_dnn/libflux_dnn_blas.so)\n",
            argv[0]);
    return 2;
  }
  void* library = NULL;
  const FDNN_Api* api = load_shim(argv[1], &library);
  uint32_t default_flags = 0;
  int status = api == NULL || print_shim_info(api) || describe_device(api, &default_flags) ||
               check_capabilities(api) || run_convolution(api, default_flags);
  if (library != NULL) dlclose(library);
  return status;
}
