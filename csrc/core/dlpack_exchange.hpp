// DLPack's exchange API (dlpack.h 1.3: a type's `__dlpack_c_exchange_api__`, a capsule
// "dlpack_exchange_api" holding a table of C functions; PyTorch >= 2.11 has it). Where an
// array's type has it, the core reads the array's DLTensor by one C call (no capsule, no
// Python frame) and can make a new array of the same library in C, so that one call path,
// and the core's memo of call patterns, serve such a library as they serve NumPy.
//
// The table's functions do no stream synchronisation ("no_sync"): the consumer is to run on
// the producer's current work stream. The core meets that because a provider's streams()
// give the library's current stream (flux_dnn/providers.py); on the CPU there is none.
#pragma once

#include <Python.h>

#include <cstdint>

#include "flux_dnn/flux_dnn.h"

namespace fdnn_core {

struct ExchangeApi;  // DLPackExchangeAPI, declared in dlpack_exchange.cpp

// The exchange API of the object's type, or nullptr: no such attribute, not a capsule of
// that name, a DLPack major the core does not read, or no dltensor_from_py_object_no_sync.
// Learnt once per type (a hash lookup afterwards). Needs the GIL.
const ExchangeApi* exchange_api_of(PyObject* object);

// Describes object (whose type's API is `api`) in `desc`, its shape and strides copied into
// the caller's arrays of max_dims (NULL strides spelt out compact), data + byte_offset as
// given. False with a Python error set when the producer refuses or ndim > max_dims.
bool exchange_describe(const ExchangeApi* api, PyObject* object, FDNN_DLTensor& desc, int64_t* shape,
                       int64_t* strides, int max_dims);

// A new compact (row-major) array of the API's library with `like`'s dtype and device and the
// given shape, or nullptr with a Python error set.
PyObject* exchange_empty(const ExchangeApi* api, const FDNN_DLTensor& like, int ndim, const int64_t* shape);

}  // namespace fdnn_core
