// cuDNN handles: one per (device, thread), leased from a per-device pool. A handle is not
// safe to use from two threads at once, and creating one costs milliseconds, so each thread
// keeps its own for every device it touched and gives them back to the pool when it exits;
// the next thread reuses them. Handles are never destroyed (at process exit the driver may
// already be gone, and destroying then can crash).
#pragma once

#include "cudnn_lib.hpp"

namespace fdnn_cudnn {

// This thread's handle for `device`, bound to `stream`. The caller has made `device`
// current (DeviceGuard).
cudnnHandle_t thread_handle(int device, cudaStream_t stream);

}  // namespace fdnn_cudnn
