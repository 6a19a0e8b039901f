"""flux_dnn's providers for the SYCL array libraries: dpctl (``dpctl.tensor.usm_ndarray``) and
dpnp (``dpnp.ndarray``), registered through the entry-point group ``flux_dnn.providers``.

Their arrays live in USM memory of a SYCL queue (``a.sycl_queue``) and export DLPack as
(kDLOneAPI = 14, device id). For a call, the shim's stream is that queue's ``sycl::queue*``
(``SyclQueue.addressof_ref()``), so the convolution runs on the array's own queue, in its
context; ``__dlpack__`` gets no stream (dpctl's ``stream=`` takes a SyclQueue to order a
producer's work for a *different* queue; here the consumer's queue is the array's own). Outputs
and workspaces are allocated by the library itself on the same queue and of the same USM
kind. dpctl's queues are out of order by default: the onednn_sycl shim then waits for the
queue's earlier work before it runs and for its own before it returns (its README), so the
output is ready whatever the library's own ordering of later work."""

from __future__ import annotations

from flux_dnn.providers import Provider, Streams, channels_last_empty

__all__ = ["DpctlProvider", "DpnpProvider"]


def _dpt():
    """dpctl.tensor, imported without its DeprecationWarning (dpctl 0.21 deprecates it in favour
    of dpnp.tensor, not in dpnp 0.19 yet): a test run with warnings as errors would fail on it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import dpctl.tensor

    return dpctl.tensor


#: The alignment flux_dnn asks of device buffers it borrows (FDNN_Device_Allocator: 256 bytes);
#: SYCL's USM allocations on the OpenCL CPU device are aligned less (measured: 64).
_ALIGN = 256


def _aligned(buf, nbytes):
    """The first nbytes of buf from its first 256-byte boundary (a view: buf stays alive)."""
    ptr = buf.__sycl_usm_array_interface__["data"][0]
    start = -ptr % _ALIGN
    return buf[start : start + nbytes]


def _dpnp():
    """dpnp (which imports dpctl.tensor), likewise."""
    _dpt()
    import dpnp

    return dpnp


class DpctlProvider(Provider):
    """``dpctl.tensor.usm_ndarray``."""

    name = "dpctl"
    has_views = True

    def key(self, a):
        return (type(a), a.shape, a.dtype, a.strides, a.sycl_queue, a.usm_type)

    def device(self, a):
        dev = a.__dlpack_device__()
        return (int(dev[0]), int(dev[1]))

    def dtype_name(self, a, argname="array"):
        return str(a.dtype)

    def strides(self, a):
        return tuple(a.strides)  # in elements

    def namespace(self, a):
        return _dpt()

    def empty(self, like, shape, channels_last):
        dpt = _dpt()

        kw = dict(dtype=like.dtype, sycl_queue=like.sycl_queue, usm_type=like.usm_type)
        if channels_last:
            buf, perm = channels_last_empty(dpt.empty, shape, **kw)
            return dpt.permute_dims(buf, perm)
        return dpt.empty(shape, **kw)

    def workspace(self, like, nbytes):
        dpt = _dpt()

        return _aligned(dpt.empty((nbytes + _ALIGN,), dtype=dpt.uint8, sycl_queue=like.sycl_queue), nbytes)

    def sum_over(self, a, axes):
        dpt = _dpt()

        return dpt.sum(a, axis=axes, dtype=a.dtype)

    def streams(self, like):
        return Streams(like.sycl_queue.addressof_ref(), None)


class DpnpProvider(DpctlProvider):
    """``dpnp.ndarray`` (a NumPy-like array over a ``usm_ndarray``)."""

    name = "dpnp"

    def namespace(self, a):
        dpnp = _dpnp()

        return dpnp

    def empty(self, like, shape, channels_last):
        dpnp = _dpnp()

        kw = dict(dtype=like.dtype, sycl_queue=like.sycl_queue, usm_type=like.usm_type)
        if channels_last:
            buf, perm = channels_last_empty(dpnp.empty, shape, **kw)
            return buf.transpose(perm)
        return dpnp.empty(shape, **kw)

    def workspace(self, like, nbytes):
        dpnp = _dpnp()

        return _aligned(dpnp.empty((nbytes + _ALIGN,), dtype=dpnp.uint8, sycl_queue=like.sycl_queue), nbytes)

    def sum_over(self, a, axes):
        dpnp = _dpnp()

        return dpnp.sum(a, axis=axes, dtype=a.dtype)
