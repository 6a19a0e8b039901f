// Errors of the client library: what went wrong, as a kind that each binding turns into its
// own error (a Python exception in _core, an XLA FFI error code in the JAX handler), and the
// message for the user (the shim's own words, prefixed with the shim and what was asked).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace fdnn_client {

enum class ErrorKind {
  kShimLoad,         // a library could not be loaded, is no shim, or speaks another ABI
  kInvalidArgument,  // FDNN_ERROR_INVALID_ARGUMENT: a rule of the header was broken
  kUnsupported,      // FDNN_ERROR_UNSUPPORTED: valid, but this shim cannot do it here
  kUnavailable,      // FDNN_ERROR_UNAVAILABLE: no driver, no device, vendor library missing
  kOutOfMemory,      // FDNN_ERROR_OUT_OF_MEMORY
  kVendor,           // FDNN_ERROR_VENDOR: the vendor library failed
  kInternal,         // FDNN_ERROR_INTERNAL, or a code this client does not know
};

// The kind of an FDNN_ERROR_* code; an unknown code (a newer shim's) is kInternal.
ErrorKind kind_of_code(int32_t code);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace fdnn_client
