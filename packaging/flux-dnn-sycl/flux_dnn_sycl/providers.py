"""flux_dnn's providers for the SYCL array libraries: dpctl (``dpctl.tensor.usm_ndarray``) and
dpnp (``dpnp.ndarray``), registered through the entry-point group ``flux_dnn.providers``.

Their arrays live in USM memory of a SYCL queue (``a.sycl_queue``) and export DLPack as
(kDLOneAPI = 14, device id). For a call, the shim's stream is that queue's ``sycl::queue*``
(``SyclQueue.addressof_ref()``), so the convolution runs on the array's own queue, in its
context; ``__dlpack__`` gets no stream (dpctl's ``stream=`` takes a SyclQueue to order a
producer's work for a *different* queue; here the consumer's queue is the array's own). Outputs
and workspaces are USM memory of the library's own kind (dpctl's memory objects) on the same
queue and of the same USM kind; outputs' memory is reused from dropped outputs of the same size
(:class:`_OutputPool`: fresh USM memory faults in every page on each call), workspaces are
carved from one buffer per queue.

The onednn_sycl shim returns once a call's work is queued, ordered after the queue's earlier
work (the shim's README). On an in-order queue the queue orders the library's later work after
it. On an out-of-order queue (dpnp's default) dpctl.tensor and dpnp order their operations by
the events of dpctl's order manager (``dpctl.utils.SequentialOrderManager``), not by queue
barriers: after each call the providers submit a barrier (it completes after the call's work)
and add its event there, so the library's next operations on the queue depend on the call.
The arrays a call reads and writes must
then outlive the work, which dpctl's allocations do not do by themselves (freeing USM memory
does not wait for work that uses it): a dropped temporary input, e.g. ``conv2d(dpnp.asarray(x),
w)``, would be freed under the running convolution. So the providers keep every array of a call
(and its workspace) referenced until a barrier submitted after the call has completed
(:class:`_Keeper`), as dpctl's own operations keep theirs alive with host tasks: the core
receives each array wrapped (:class:`_Held`, its DLPack methods); when the core lets go of the
last of them, the call has returned and its work is queued."""

from __future__ import annotations

import collections
import math
import os
import sys
import threading
import weakref

from flux_dnn.providers import Provider, Streams, channels_last_empty

__all__ = ["DpctlProvider", "DpnpProvider", "release_output_pool"]


_MODULES: dict = {}  # "dpt", "dpnp", "dpnp_array", "usm_memory": imported once, on first use


def _dpt():
    """dpctl.tensor, imported without its DeprecationWarning (dpctl 0.21 deprecates it in favour
    of dpnp.tensor, not in dpnp 0.19 yet): a test run with warnings as errors would fail on it."""
    try:
        return _MODULES["dpt"]
    except KeyError:
        pass
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import dpctl.tensor

    _MODULES["dpt"] = dpctl.tensor
    return dpctl.tensor


#: The alignment flux_dnn asks of device buffers it borrows (FDNN_Device_Allocator: 256 bytes);
#: SYCL's USM allocations on the OpenCL CPU device are aligned less (measured: 64).
_ALIGN = 256


def _aligned(buf, nbytes):
    """The first nbytes of buf from its first 256-byte boundary (a view: buf stays alive)."""
    ptr = buf.__sycl_usm_array_interface__["data"][0]
    start = -ptr % _ALIGN
    return buf[start : start + nbytes]


class _Held:
    """What the core receives for an array of a call: the array, through its DLPack methods,
    and the call it belongs to (alive while the core holds any array of the call)."""

    __slots__ = ("array", "call")

    def __init__(self, array, call):
        self.array = array
        self.call = call

    def __dlpack__(self, *args, **kwargs):
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class _Call:
    """The arrays of one call on one queue. When the core has let go of all of them (the call
    has returned: its work is queued), a barrier is submitted on the queue and the arrays are
    kept, with the barrier's event, until that event has completed (_Keeper.close)."""

    __slots__ = ("keeper", "queue", "arrays", "used", "__weakref__")

    def __init__(self, keeper, queue):
        self.keeper, self.queue, self.arrays = keeper, queue, []
        self.used = 0  # bytes of the queue's reused workspace buffer given to this call

    def __del__(self):
        try:
            self.keeper.close(self.queue, self.arrays)
        except Exception:  # at interpreter exit, or a queue in error: nothing left to order
            pass


class _Keeper:
    """Per queue, the arrays of calls whose work may still run, oldest first, each batch with
    the event of a barrier submitted after its call. A queue's barriers complete in submission
    order, so each close releases the completed batches from the front (one status query per
    batch released, plus one). And per queue one workspace buffer, reused by its calls."""

    #: Workspaces up to this many bytes come from the queue's reused buffer (kept for the
    #: queue's life, as an array library's pool keeps its blocks).
    REUSED = 64 << 20

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = {}  # queue address -> deque of (SyclEvent, arrays)
        self._current = threading.local()  # .call: weakref to this thread's _Call being made
        self._workspaces = {}  # queue address -> its reused workspace buffer (uint8, aligned)

    def reset(self):
        """A call begins (the provider's streams): its first export makes its record."""
        self._current.call = None

    def current(self):
        ref = getattr(self._current, "call", None)
        return None if ref is None else ref()

    def hold(self, a):
        """a, as the core receives it in this thread's current call (_Held)."""
        call = self.current()
        if call is None:
            call = _Call(self, a.sycl_queue)
            self._current.call = weakref.ref(call)
        call.arrays.append(a)
        return _Held(a, call)

    def close(self, queue, arrays):
        event = queue.submit_barrier()  # completes after the call's work (and all before it)
        if not queue.is_in_order:
            # dpctl.tensor's and dpnp's operations on an out-of-order queue depend on the events
            # of dpctl's order manager, not on queue barriers (measured: a dpnp kernel submitted
            # after the shim's trailing barrier ran before the convolution): the call's barrier
            # joins them, so the library's next operations on the queue wait for the call.
            _order_manager()[queue].add_event_pair(event, event)
        with self._lock:
            batches = self._pending.setdefault(queue.addressof_ref(), collections.deque())
            _drop_completed(batches)
            batches.append((event, arrays))

    def drop_completed(self):
        """Lets go of the arrays of every call whose work has run, on every queue."""
        with self._lock:
            for batches in self._pending.values():
                _drop_completed(batches)

    def workspace(self, like, nbytes):
        """nbytes of workspace for the current call on like's queue: the next free bytes of
        the queue's reused buffer (the calls on one queue run one after the other there, so
        each call carves its requests from the start: execute's workspace, and the buffers a
        benchmarking plan borrows at once). Up to REUSED bytes a call; beyond, a buffer of its
        own, kept with the call's arrays."""
        queue = like.sycl_queue
        call = self.current()
        start = call.used if call is not None else 0
        end = start + (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        if call is None or end > self.REUSED:
            buf = _aligned(_usm_empty((nbytes + _ALIGN,), "u1", "device", queue), nbytes)
            if call is not None:
                call.arrays.append(buf)
            return buf
        call.used = end
        key = queue.addressof_ref()
        with self._lock:
            buf = self._workspaces.get(key)
            if buf is None or buf.shape[0] < end:
                if buf is not None:  # earlier calls may still use it: kept with this one
                    call.arrays.append(buf)
                size = max(end, 1 << 16, 0 if buf is None else 2 * buf.shape[0])
                size = min(size, self.REUSED) if end <= self.REUSED else end
                # A fresh buffer: this call's earlier requests (in the old one) stay apart.
                buf = _aligned(_usm_empty((size + _ALIGN,), "u1", "device", queue), size)
                self._workspaces[key] = buf
                start, call.used = 0, end - start
        return buf[start : start + nbytes]


def _drop_completed(batches):
    complete = _complete()
    while batches and batches[0][0].execution_status == complete:
        batches.popleft()


_KEEPER = _Keeper()


_COMPLETE = None
_MANAGER = None


def _order_manager():
    """dpctl.utils.SequentialOrderManager (per thread, per queue: the events that dpctl.tensor
    and dpnp operations depend on)."""
    global _MANAGER
    if _MANAGER is None:
        from dpctl.utils import SequentialOrderManager

        _MANAGER = SequentialOrderManager
    return _MANAGER


def _complete():
    """dpctl.event_status_type.complete (dpctl is imported once the first array is seen)."""
    global _COMPLETE
    if _COMPLETE is None:
        import dpctl

        _COMPLETE = dpctl.event_status_type.complete
    return _COMPLETE


def _dpnp():
    """dpnp (which imports dpctl.tensor), likewise."""
    try:
        return _MODULES["dpnp"]
    except KeyError:
        pass
    _dpt()
    import dpnp
    from dpnp.dpnp_array import dpnp_array

    _MODULES["dpnp_array"] = dpnp_array
    _MODULES["dpnp"] = dpnp
    return dpnp


class _Lease:
    """One pooled block, as the arrays made on it see it: an object exposing the block's
    ``__sycl_usm_array_interface__`` and holding dpctl's memory object that owns it.

    The outputs' memory object of the block is made from the lease (``MemoryUSMDevice(lease)``:
    dpctl's memory "from another object", which references it), never the owner itself, once
    per block: the pool keeps it and every output made on the block is an array over it. That
    matters for when the block is free. dpctl's operations keep their arguments' memory alive
    until their work has run (dpctl4pybind11.hpp, ``keep_args_alive``): memory that dpctl
    allocated itself through a C++ shared_ptr, invisible to Python (measured: an array dropped
    while a ``dpt.sin`` on it was queued, its memory object's count fell at once), memory made
    from another object by holding the array's Python object (the count of the memory made
    from the lease stayed up until the work had run). Arrays, views, DLPack exports and dpnp
    arrays hold that memory object too. So a block whose memory object only the pool references
    is used by no array, view, DLPack export, dpctl or dpnp operation, and no call of the
    providers (_Keeper)."""

    __slots__ = ("owner", "__sycl_usm_array_interface__")

    def __init__(self, owner):
        self.owner = owner
        self.__sycl_usm_array_interface__ = owner.__sycl_usm_array_interface__


class _OutputPool:
    """Outputs' USM memory, reused. A new USM allocation on the OpenCL CPU device is fresh
    pages (the runtime maps them for each allocation and unmaps them when it is freed) that
    fault on first touch, every call (measured: a (1, 64, 112, 112) float32 output, 784 minor
    faults and 1.6 ms to allocate and fill against 0.7 ms in reused memory; NumPy's reused
    heap faults none). So the providers keep outputs' blocks and give one to a later output of
    the same size, queue and USM kind once nothing uses it (_Lease says how that is known).
    Each block's memory object is made once and kept with it: making one from the lease asks
    the SYCL runtime for the pointer's USM kind, 4 us alone and 30-40 us a call while the
    runtime's threads run the previous call's work (measured, dw 3x3 256 @28, N=1).

    Outputs under ``MIN_BYTES`` are allocated as before: a few pages fault in less time than
    the pool's bookkeeping takes. Blocks are kept up to ``FLUX_DNN_SYCL_OUTPUT_POOL_BYTES``
    bytes in all, in use or idle (default 1 GiB; 0 turns the pool off), idle ones of the
    least recently used sizes dropped first to make room; an output that still does not fit
    is allocated outside the pool. :func:`flux_dnn_sycl.release_output_pool` frees idle
    blocks."""

    MIN_BYTES = 1 << 16

    def __init__(self, limit):
        self.limit = limit
        self._lock = threading.Lock()
        # (queue, usm_type, nbytes) -> [the block's memory object, made from its _Lease]
        self._blocks = collections.OrderedDict()
        self._bytes = 0
        self._idle_refs = None  # sys.getrefcount of a block only the pool holds, in _take

    def pooled(self, nbytes):
        return self.MIN_BYTES <= nbytes <= self.limit

    def memory(self, nbytes, usm_type, queue):
        """A dpctl memory object of nbytes on queue, of usm_type, on a free pooled block or
        a new one."""
        key = (queue, usm_type, nbytes)
        with self._lock:
            memory = self._take(key)  # this reference marks it taken for other threads
        if memory is None:
            kind = _usm_memory(usm_type)
            memory = kind(_Lease(kind(nbytes, queue=queue)))
            with self._lock:
                if self._make_room(nbytes):
                    self._blocks.setdefault(key, []).append(memory)
                    self._bytes += nbytes
        return memory

    def _take(self, key):
        blocks = self._blocks.get(key)
        if not blocks:
            return None
        self._blocks.move_to_end(key)
        idle = self._idle()
        for memory in blocks:
            if sys.getrefcount(memory) <= idle:
                return memory
        return None

    def _idle(self):
        """The reference count getrefcount reports, in _take's loop, for a block that only
        the pool holds (measured once: interpreters count a loop's references differently)."""
        if self._idle_refs is None:
            probe = [object()]
            for obj in probe:
                self._idle_refs = sys.getrefcount(obj)
        return self._idle_refs

    def _make_room(self, nbytes):
        """Drop idle blocks, least recently used first, until nbytes more fit in the limit."""
        if self._bytes + nbytes <= self.limit:
            return True
        idle = self._idle()
        for key in list(self._blocks):
            kept = []
            for memory in self._blocks[key]:
                if self._bytes + nbytes > self.limit and sys.getrefcount(memory) <= idle:
                    self._bytes -= key[2]
                else:
                    kept.append(memory)
            if kept:
                self._blocks[key] = kept
            else:
                del self._blocks[key]
            if self._bytes + nbytes <= self.limit:
                return True
        return False

    def release(self):
        """Frees the idle blocks, and those of finished calls; returns how many bytes."""
        _KEEPER.drop_completed()
        with self._lock:
            before = self._bytes
            limit, self.limit = self.limit, 0
            self._make_room(0)
            self.limit = limit
            return before - self._bytes


def _pool_limit():
    """FLUX_DNN_SYCL_OUTPUT_POOL_BYTES, checked (read when the providers load)."""
    value = os.environ.get("FLUX_DNN_SYCL_OUTPUT_POOL_BYTES", "").strip()
    if not value:
        return 1 << 30
    if not value.isdigit():
        raise ValueError(
            f"FLUX_DNN_SYCL_OUTPUT_POOL_BYTES={value!r}: expected a whole number of bytes, "
            "0 or more (0 turns the output pool off)"
        )
    return int(value)


_POOL = _OutputPool(_pool_limit())


def release_output_pool() -> int:
    """Frees the USM memory the SYCL providers keep for reuse by later outputs (the blocks no
    array uses now); returns the number of bytes freed."""
    return _POOL.release()


def _usm_memory(usm_type):
    """dpctl's memory class of a USM kind (the mapping made once, on the first output)."""
    kinds = _MODULES.get("usm_memory")
    if kinds is None:
        import dpctl.memory

        kinds = _MODULES["usm_memory"] = {
            "device": dpctl.memory.MemoryUSMDevice,
            "shared": dpctl.memory.MemoryUSMShared,
            "host": dpctl.memory.MemoryUSMHost,
        }
    return kinds[usm_type]


def _pooled_empty(shape, dtype, usm_type, queue):
    """An uninitialised usm_ndarray in pooled memory (_OutputPool)."""
    dpt = _dpt()
    nbytes = math.prod(shape) * dpt.dtype(dtype).itemsize
    if not _POOL.pooled(nbytes):
        return _usm_empty(shape, dtype, usm_type, queue)
    return dpt.usm_ndarray(shape, dtype=dtype, buffer=_POOL.memory(nbytes, usm_type, queue))


def _usm_empty(shape, dtype, usm_type, queue):
    """An uninitialised usm_ndarray: its constructor, without dpt.empty's argument handling
    (half the time of a tiny call's allocation)."""
    return _dpt().usm_ndarray(shape, dtype=dtype, buffer=usm_type, buffer_ctor_kwargs={"queue": queue})


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
        if channels_last:
            dpt = _dpt()
            kw = dict(dtype=like.dtype, usm_type=like.usm_type, queue=like.sycl_queue)
            buf, perm = channels_last_empty(_pooled_empty, shape, **kw)
            return dpt.permute_dims(buf, perm)
        return _pooled_empty(shape, like.dtype, like.usm_type, like.sycl_queue)

    def export(self, a):
        return _KEEPER.hold(a)

    def workspace(self, like, nbytes):
        return _KEEPER.workspace(like, nbytes)

    def sum_over(self, a, axes):
        dpt = _dpt()

        return dpt.sum(a, axis=axes, dtype=a.dtype)

    def streams(self, like):
        # Called first in each call on the device, then export for each array of the call,
        # then workspace: a new record begins at the first export.
        _KEEPER.reset()
        return Streams(like.sycl_queue.addressof_ref(), None)


class DpnpProvider(DpctlProvider):
    """``dpnp.ndarray`` (a NumPy-like array over a ``usm_ndarray``)."""

    name = "dpnp"

    def namespace(self, a):
        dpnp = _dpnp()

        return dpnp

    def empty(self, like, shape, channels_last):
        _dpnp()  # imported, and _MODULES["dpnp_array"] set
        a = like.get_array()  # the usm_ndarray: its attributes are cheaper than dpnp's
        if channels_last:
            kw = dict(dtype=a.dtype, usm_type=a.usm_type, queue=a.sycl_queue)
            buf, perm = channels_last_empty(_pooled_empty, shape, **kw)
            return _MODULES["dpnp_array"]._create_from_usm_ndarray(buf).transpose(perm)
        out = _pooled_empty(shape, a.dtype, a.usm_type, a.sycl_queue)
        return _MODULES["dpnp_array"]._create_from_usm_ndarray(out)

    def sum_over(self, a, axes):
        dpnp = _dpnp()

        return dpnp.sum(a, axis=axes, dtype=a.dtype)
