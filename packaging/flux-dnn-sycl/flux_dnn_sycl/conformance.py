"""The conformance suite's view of the SYCL array libraries (entry-point group
``flux_dnn.conformance_libraries``): dpnp and dpctl arrays on SYCL device 0 (kDLOneAPI).
Neither has bfloat16; float16 and float64 exist where the device has the aspect."""

from __future__ import annotations

import importlib.util

import numpy as np

from flux_dnn.conformance import ONEAPI, ArrayLibrary, _channels_last_perm


def _dpt():
    """dpctl.tensor, imported without its DeprecationWarning (dpctl 0.21 deprecates it in favour
    of dpnp.tensor, not in dpnp 0.19 yet): a test run with warnings as errors would fail on it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import dpctl.tensor

    return dpctl.tensor


def _dpnp():
    """dpnp (which imports dpctl.tensor), likewise."""
    _dpt()
    import dpnp

    return dpnp


class _SyclLibrary(ArrayLibrary):
    device_type = ONEAPI
    _queue = None

    def unavailable(self):
        if importlib.util.find_spec(self.name) is None:
            return f"{self.name} is not installed"
        import dpctl

        import flux_dnn_sycl  # noqa: F401 -- OCL_ICD_FILENAMES before dpctl lists devices

        if dpctl.get_num_devices() == 0:
            return "the SYCL runtime lists no device here"
        return None

    def load(self):
        if self.module is None:
            self.module = _dpnp() if self.name == "dpnp" else _dpt()
        return self

    def queue(self):
        if _SyclLibrary._queue is None:
            import dpctl

            _SyclLibrary._queue = dpctl.SyclQueue(dpctl.get_devices()[0])
        return _SyclLibrary._queue

    def missing_dtype(self, dtype):
        if dtype == "bfloat16":
            return f"{self.name} has no bfloat16 arrays"
        dev = self.queue().sycl_device
        if dtype == "float16" and not dev.has_aspect_fp16:
            return f"{dev.name} has no float16 (SYCL aspect fp16)"
        if dtype == "float64" and not dev.has_aspect_fp64:
            return f"{dev.name} has no float64 (SYCL aspect fp64)"
        return None

    def _host(self, values, dtype, layout):
        a = np.asarray(values).astype(dtype)
        if layout == "channels_last":
            return np.ascontiguousarray(a.transpose(_channels_last_perm(a.ndim)[0])), True
        return np.ascontiguousarray(a), False

    def dtype_name(self, a):
        return str(a.dtype)

    def element_strides(self, a):
        return tuple(a.strides)

    def synchronize(self):
        self.queue().wait()


class DpctlLibrary(_SyclLibrary):
    name = "dpctl"

    def array(self, values, dtype, layout="contiguous"):
        dpt = _dpt()

        host, permuted = self._host(values, dtype, layout)
        a = dpt.asarray(host, sycl_queue=self.queue())
        return dpt.permute_dims(a, _channels_last_perm(host.ndim)[1]) if permuted else a

    def numpy(self, a):
        dpt = _dpt()

        return dpt.asnumpy(a).astype(np.float64)

    def is_array(self, a):
        dpt = _dpt()

        return isinstance(a, dpt.usm_ndarray)

    def reshape(self, a, shape):
        return _dpt().reshape(a, shape)  # (usm_ndarray has no .reshape method: the array API's function)

    def source(self, shape, dtype):
        return f"__import__('dpctl.tensor', fromlist=['ones']).ones({shape!r}, dtype={dtype!r})"

    def repeated(self, a, shape):
        return _dpt().broadcast_to(a, shape)  # a view with stride 0 where a has size 1


class DpnpLibrary(_SyclLibrary):
    name = "dpnp"

    def array(self, values, dtype, layout="contiguous"):
        dpnp = _dpnp()

        host, permuted = self._host(values, dtype, layout)
        a = dpnp.asarray(host, sycl_queue=self.queue())
        return a.transpose(_channels_last_perm(host.ndim)[1]) if permuted else a

    def numpy(self, a):
        dpnp = _dpnp()

        return dpnp.asnumpy(a).astype(np.float64)

    def is_array(self, a):
        dpnp = _dpnp()

        return isinstance(a, dpnp.ndarray)

    def source(self, shape, dtype):
        return f"__import__('dpnp').ones({shape!r}, dtype={dtype!r})"

    def repeated(self, a, shape):
        return _dpnp().broadcast_to(a, shape)  # a view with stride 0 where a has size 1


def libraries() -> list:
    """The entry point: dpnp arrays and dpctl's usm_ndarray (dpctl.tensor) on SYCL devices,
    dpnp first (the suite's tests whose subject is not the array library run on the first
    library of each shim only)."""
    return [DpnpLibrary(), DpctlLibrary()]
