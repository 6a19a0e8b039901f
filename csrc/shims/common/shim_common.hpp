// Helpers every shim shares: the FDNN_Error object, exception-to-error translation at the
// ABI boundary, struct_size checks and descriptor reading. No vendor code lives here.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>

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

// Whether this process is a child made by fork() after the shim was loaded. GNU libgomp's
// thread team does not survive a fork: a child that enters a parallel region of more than one
// thread waits forever for threads that exist only in the parent. CPU shims run on the
// calling thread alone there.
bool in_forked_child();
const char* dtype_name(FDNN_DLDataType t);

}  // namespace fdnn_shim
