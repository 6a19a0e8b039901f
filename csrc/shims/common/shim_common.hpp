// Helpers every shim shares: the FDNN_Error object, exception-to-error translation at the
// ABI boundary, struct_size checks and descriptor reading. No vendor code lives here.
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
  FDNN_ErrorCode code;
  std::string message;
};

namespace fdnn_shim {

// Thrown inside a shim; turned into an FDNN_Error at the ABI boundary by `guarded`.
class Failure : public std::runtime_error {
 public:
  Failure(FDNN_ErrorCode code, std::string message)
      : std::runtime_error(std::move(message)), code_(code) {}
  FDNN_ErrorCode code() const { return code_; }

 private:
  FDNN_ErrorCode code_;
};

[[noreturn]] inline void fail(FDNN_ErrorCode code, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
[[noreturn]] inline void fail(FDNN_ErrorCode code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  throw Failure(code, buf);
}

inline FDNN_Error* make_error(FDNN_ErrorCode code, std::string message) noexcept {
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

inline bool has_tensor(const FDNN_DLTensor* t) { return t != nullptr && t->ndim > 0; }

// "op=forward x=[16,3,224,224]/s[...] ..." for vendor error messages: the conv parameters.
std::string describe_problem(const FDNN_Conv_Plan_Create_Args& a);

const char* op_name(FDNN_ConvOp op);

// The rules of the header that every shim checks alike, before any vendor call: a known op,
// activation and algorithm policy; x, w, y (and bias) present with shapes, strides and
// non-empty dims, on `device_type`, of one dtype; channels that fit the groups; output sizes
// that follow from stride, dilation and padding; bias (K,) and only where the op takes one.
// Fails with FDNN_ERROR_INVALID_ARGUMENT naming the rule and the problem. What a vendor
// computes (dtypes, accumulation types, its algorithm ids) each shim checks after this.
void check_conv_problem(const FDNN_Conv_Plan_Create_Args& a, int32_t device_type);

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
const char* dtype_name(FDNN_DLDataType t);

}  // namespace fdnn_shim
