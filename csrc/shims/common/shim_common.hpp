// Helpers every shim shares: the FDNN_Error object, exception-to-error translation at the
// ABI boundary, struct_size checks, the header's rules for a convolution (one check for every
// shim) and the capabilities answer with the check that a problem lies within it. No vendor
// code lives here.
//
// Extensions: the one extension type (2.1, FDNN_Buffer_Offsets) is for devices whose tensor
// data is an object (Metal); every other extension a caller chains to extension_start is one
// these shims do not know, and the header says to skip those: no shim but the MPS shim reads
// extension_start.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "flux_dnn/flux_dnn.h"

struct FDNN_Error {
  int32_t code;  // FDNN_ERROR_*
  std::string message;
};

namespace fdnn_shim {

// Thrown inside a shim; turned into an FDNN_Error at the ABI boundary by `guarded`.
class Failure : public std::runtime_error {
 public:
  Failure(int32_t code, std::string message)
      : std::runtime_error(std::move(message)), code_(code) {}
  int32_t code() const { return code_; }

 private:
  int32_t code_;  // FDNN_ERROR_*
};

[[noreturn]] inline void fail(int32_t code, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
[[noreturn]] inline void fail(int32_t code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  throw Failure(code, buf);
}

inline FDNN_Error* make_error(int32_t code, std::string message) noexcept {
  try {
    return new FDNN_Error{code, std::move(message)};
  } catch (...) {
    // Out of memory while reporting an error: a static error the caller must not free
    // would break the ownership rule, so give the smallest allocation one more chance.
    return new (std::nothrow) FDNN_Error{FDNN_ERROR_OUT_OF_MEMORY, {}};
  }
}

// Runs `body` and converts anything it throws into an FDNN_Error: no exception crosses the ABI.
template <class Body>
FDNN_Error* guarded(Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const Failure& f) {
    return make_error(f.code(), f.what());
  } catch (const std::bad_alloc&) {
    return make_error(FDNN_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return make_error(FDNN_ERROR_INTERNAL, e.what());
  } catch (...) {
    return make_error(FDNN_ERROR_INTERNAL, "unknown C++ exception in shim");
  }
}

template <class Args>
void check_struct_size(const Args* args, size_t known, const char* name) {
  if (args == nullptr) fail(FDNN_ERROR_INVALID_ARGUMENT, "%s: args is NULL", name);
  if (args->struct_size < known)
    fail(FDNN_ERROR_INVALID_ARGUMENT, "%s: struct_size %zu is smaller than %zu", name,
         args->struct_size, known);
}

// The two functions every shim's table shares verbatim.
inline void error_destroy(FDNN_Error_Destroy_Args* args) {
  if (args != nullptr) delete args->error;
}

inline void error_describe(FDNN_Error_Describe_Args* args) {
  const FDNN_Error* e = args->error;
  args->code = e->code;
  args->message = e->message.c_str();
  args->message_size = e->message.size();
}

// The extension of `type` in a caller's chain (FDNN_Extension_Base), or NULL when absent.
// One shorter than `known_size` (an older caller's) is INVALID_ARGUMENT naming `function`;
// the walk stops after 64 links so that a chain that loops is refused, not followed forever.
const FDNN_Extension_Base* find_extension(const FDNN_Extension_Base* chain, int32_t type,
                                          size_t known_size, const char* function);

inline bool has_tensor(const FDNN_DLTensor* t) { return t != nullptr && t->ndim > 0; }

// Bytes of one element of `t` (at least 1).
inline size_t element_bytes(FDNN_DLDataType t) { return t.bits >= 8 ? t.bits / 8u : 1u; }

// "op=forward x=[16,3,224,224]/s[...] ..." for vendor error messages: the conv parameters.
std::string describe_problem(const FDNN_Conv_Plan_Create_Args& a);

const char* op_name(int32_t op);          // "forward", ...; "unknown" outside FDNN_CONV_*
const char* activation_name(int32_t act);  // "relu", ...; "unknown" outside FDNN_ACTIVATION_*
const char* dtype_name(FDNN_DLDataType t);

// The rules of the header that every shim checks alike, cheaply and before any vendor call
// (FDNN_ERROR_INVALID_ARGUMENT with a message naming the field, its value and the rule): op,
// activation and algo_policy inside their enums; spatial_rank 1 to 3; x, w, y and bias
// descriptors present (bias ndim 0 for none), shape and strides not NULL, non-empty dims,
// strides >= 0, all on one device of `device_type` with a device_id in 0..num_devices-1
// (num_devices < 0: not known here, the shim checks it), of one dtype with lanes 1 and whole
// bytes, data + byte_offset (when data is given) aligned to the element size; every size and
// extent in bytes within INT64_MAX (overflow-checked, as is every product and sum below);
// compute_type the default or of a dtype's form; stride >= 1, dilation >= 1, padding >= 0
// (checked before any division by a stride); channels that fit the groups; output sizes that
// follow from stride, dilation and padding; bias (K,) and only where the op takes one; an
// activation on forward only; written tensors whose elements do not overlap. What a shim
// computes is checked after this, by check_covered, check_vendor_int_range and the shim.
void check_conv_problem(const FDNN_Conv_Plan_Create_Args& a, int32_t device_type,
                        int32_t num_devices);
void check_conv_problem(const FDNN_Conv_Plan_Create_Args& a, int32_t device_type);

// The first dim (by index) of t whose stride makes elements overlap, else -1: its dims of
// size > 1, ordered by stride, must each step past all elements of the dims inside them (a
// zero stride on such a dim overlaps). Valid on a tensor the op only reads (a broadcast, a
// sliding window); check_conv_problem refuses it on a tensor the op writes. Needs shape and
// strides checked (check_conv_problem does).
int overlapping_dim(const FDNN_DLTensor& t);

// Overflow-checked arithmetic: true when the exact result does not fit (then *out is
// unspecified).
bool checked_mul(int64_t a, int64_t b, int64_t* out);
bool checked_add(int64_t a, int64_t b, int64_t* out);
bool checked_add(uint64_t a, uint64_t b, uint64_t* out);

// A tensor's size: elements (product of the shape), span (elements from the first to one
// past the last, by strides), and both in bytes. INVALID_ARGUMENT, naming `name`, when any of
// them exceeds INT64_MAX. Needs shape and strides checked (check_conv_problem does).
struct Extent {
  int64_t elements = 1;
  int64_t span = 1;
  int64_t bytes = 0;
  int64_t span_bytes = 0;
};
Extent tensor_extent(const FDNN_DLTensor& t, const char* name);

// Spatial dim i of a convolution: the padded input x + padding_lo + padding_hi, the dilated
// kernel dilation * (kernel - 1) + 1, and the output size they give (0 when the kernel does not
// fit). INVALID_ARGUMENT when an intermediate exceeds INT64_MAX.
struct SpatialDim {
  int64_t padded = 0;
  int64_t kernel_extent = 0;
  int64_t output = 0;
};
SpatialDim spatial_dim(const FDNN_Conv_Plan_Create_Args& a, int i);

// A vendor's integer range (after check_conv_problem): FDNN_ERROR_UNSUPPORTED, naming `shim`
// and the value, when a tensor's element count or span, a stride, dilation, padding, padded
// size, dilated kernel or groups exceeds `most` (INT32_MAX for a vendor that indexes in int).
void check_vendor_int_range(const FDNN_Conv_Plan_Create_Args& a, int64_t most, const char* shim);

// Bytes of the buffers a benchmark (FDNN_ALGO_BENCHMARK on a CPU) allocates to time a
// candidate: the span of every tensor given, in bytes (each fits int64: tensor_extent).
// Candidates are timed only when this, with the largest workspace, stays within
// kMostBenchmarkBytes; beyond it the policy falls back to the heuristic's choice, so that no
// description makes a shim allocate and touch gigabytes to time it.
constexpr int64_t kMostBenchmarkBytes = int64_t{1} << 30;
bool benchmark_fits(const FDNN_Conv_Plan_Create_Args& a, size_t workspace);
size_t span_bytes(const FDNN_DLTensor* t);  // 0 for no tensor (bias of ndim 0)

// FDNN_ERROR_UNSUPPORTED when a plan about to be returned needs more than workspace_limit (the
// header: workspace_size <= workspace_limit), whichever way the shim found it.
void check_workspace_within_limit(size_t workspace_size, const FDNN_Conv_Plan_Create_Args& a,
                                  const char* shim);

// UNSUPPORTED, naming `shim`, unless compute_type is the default or the accumulation type
// every CPU shim computes in: float64 for float64 inputs, float32 otherwise. (Its form --
// lanes 1, whole bytes -- is check_conv_problem's: INVALID_ARGUMENT.) A shim that accumulates
// in more types (cuDNN: float16 for float16) checks its own list instead.
void check_compute_type_served(const FDNN_Conv_Plan_Create_Args& a, const char* shim);

// FDNN_ALGO_GIVEN with an algo_id that names none of this shim's algorithms (outside its
// ids; for a vendor's own ids, one naming no engine or solution the vendor offers for this
// problem: stale or foreign): the caller broke the header's rule, INVALID_ARGUMENT.
[[noreturn]] void fail_unknown_algo(const FDNN_Conv_Plan_Create_Args& a, const char* shim,
                                    const char* why);

// FDNN_ALGO_GIVEN with an algo_id naming one of this shim's algorithms that cannot compute
// this problem here: UNSUPPORTED, as for any valid problem a shim cannot serve, so that a
// caller with several shims passes it on (flux_dnn's core does, with a user's algorithm id).
[[noreturn]] void fail_algo_cannot_compute(const FDNN_Conv_Plan_Create_Args& a,
                                           const char* shim, const char* why);

// ------------------------------------------------------------------------------------------
// Capabilities

// What one shim computes for one device, op and dtype: the answer of Conv_Capabilities and
// what check_covered holds a problem to, so the two cannot disagree.
struct Capabilities {
  int32_t support = FDNN_SUPPORT_NONE;  // FDNN_SUPPORT_*
  uint32_t spatial_ranks = 0;           // bit (1 << r) per rank r served
  uint32_t activations = 0;             // bit (1 << a) per FDNN_ACTIVATION_* fused
  uint32_t features = 0;                // FDNN_FEATURE_* bits
  const char* detail = "";              // static storage
};

constexpr uint32_t kRanks1To3 = (1u << 1) | (1u << 2) | (1u << 3);
constexpr uint32_t kEveryActivation = (1u << FDNN_NUM_ACTIVATIONS) - 1u;

// The activations bits the header asks for: those fused on FORWARD, only NONE elsewhere.
inline uint32_t activations_of_op(int32_t op, uint32_t fused_on_forward) {
  return op == FDNN_CONV_FORWARD ? fused_on_forward : 1u << FDNN_ACTIVATION_NONE;
}

// A dtype this shim does not compute, with why not.
inline Capabilities not_computed(const char* why) {
  Capabilities c;
  c.detail = why;
  return c;
}

// Conv_Capabilities for a shim: checks struct_size and op (INVALID_ARGUMENT), asks
// `answer(device_id, op, dtype)` (which checks the device id) and writes the result; all
// out fields but detail are 0 when support is NONE.
template <class Answer>
FDNN_Error* conv_capabilities(FDNN_Conv_Capabilities_Args* args, Answer&& answer) noexcept;

// FDNN_ERROR_UNSUPPORTED, naming what is missing, when the problem (already through
// check_conv_problem) asks for something outside `caps`: a dtype not computed, a spatial
// rank, an activation, groups, dilation, alpha/beta, a bias gradient, or a deterministic
// result that the shim does not report. `shim` names the shim in the message.
void check_covered(const FDNN_Conv_Plan_Create_Args& a, const Capabilities& caps,
                   const char* shim);

// ------------------------------------------------------------------------------------------
// Execute and pack

// The plan of Conv_Plan_Execute / Conv_Plan_Pack_Weights, INVALID_ARGUMENT when NULL.
template <class Plan>
const Plan& plan_of(const FDNN_Plan* plan, const char* function) {
  if (plan == nullptr) fail(FDNN_ERROR_INVALID_ARGUMENT, "%s: plan is NULL", function);
  return *reinterpret_cast<const Plan*>(plan);
}

// INVALID_ARGUMENT, naming `function` and `name`, unless `p` is aligned to the element size
// (the header's rule for every data pointer; NULL passes: a shim decides which it needs).
void check_aligned(const void* p, size_t element_size, const char* function, const char* name);

// check_aligned for each of Conv_Plan_Execute's x, w, y and bias.
void check_execute_alignment(const FDNN_Conv_Plan_Execute_Args& a, size_t element_size);

// The data pointers a plan reads or writes at execute: a NULL one of them is INVALID_ARGUMENT.
// (The oneDNN shim checks its own, operand by operand, and passes none.)
struct NeededPointers {
  bool x = false, w = false, y = false, bias = false;
};

// The header's alignment of a workspace (Conv_Plan_Execute_Args.workspace).
constexpr size_t kWorkspaceAlignment = 64;

// Conv_Plan_Execute's own arguments after plan_of: the needed data pointers not NULL, every
// data pointer aligned to the element size, a workspace of at least `workspace_needed` bytes,
// not NULL and kWorkspaceAlignment-aligned when that is above 0 (a plan that needs none
// ignores the pointer, whatever it is).
void check_execute_args(const FDNN_Conv_Plan_Execute_Args& a, size_t element_size,
                        size_t workspace_needed, NeededPointers needed = {});

// Conv_Plan_Pack_Weights' own arguments after plan_of, for a plan of `op`: a FORWARD plan
// only (packing another is INVALID_ARGUMENT: the header's "a FORWARD plan of this shim"), w
// not NULL and aligned to the element size.
void check_pack_args(const FDNN_Conv_Plan_Pack_Weights_Args& a, int32_t op, size_t element_size);

// Whether this process is a child made by fork() after the shim was loaded.
bool in_forked_child();

// Runs `body` on the calling thread, or, in a child made by fork(), on a new thread. GNU
// libgomp's thread pool does not survive a fork: the forking thread's pool still lists the
// parent's threads, and its next parallel region waits for them forever (oneDNN primitives
// fix their team size when they are created, so a smaller team is no way out). A new thread
// has no pool yet and starts one of its own. Exceptions reach the caller.
template <class Body>
void on_fork_safe_thread(Body&& body) {
  if (!in_forked_child()) {
    body();
    return;
  }
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
}

template <class Answer>
FDNN_Error* conv_capabilities(FDNN_Conv_Capabilities_Args* args, Answer&& answer) noexcept {
  return guarded([&] {
    check_struct_size(args, FDNN_Conv_Capabilities_Args_STRUCT_SIZE, "Conv_Capabilities");
    if (args->op < 0 || args->op >= FDNN_NUM_CONV_OPS)
      fail(FDNN_ERROR_INVALID_ARGUMENT,
           "Conv_Capabilities: op %d is not an FDNN_CONV_* value (0 forward, 1 backward_data, "
           "2 backward_weight)",
           static_cast<int>(args->op));
    const Capabilities c = answer(args->device_id, args->op, args->dtype);
    const bool none = c.support == FDNN_SUPPORT_NONE;
    args->support = c.support;
    args->spatial_ranks = none ? 0 : c.spatial_ranks;
    args->activations = none ? 0 : c.activations;
    args->features = none ? 0 : c.features;
    args->detail = c.detail;
  });
}

}  // namespace fdnn_shim
