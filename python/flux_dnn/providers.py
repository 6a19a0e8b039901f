"""Array-library providers: what flux_dnn needs of an array library, in one interface.

A *provider* serves the arrays of one array library (NumPy, PyTorch, CuPy, JAX, dpnp, ...).
flux_dnn reads arrays through DLPack; the provider adds what DLPack does not say:

- how to read an array's shape, dtype, strides and device cheaply, and a hashable ``key``
  for the call memo;
- how to allocate an output (and a workspace) of its own kind on the array's device;
- the call's streams, as two separate things (``streams``): the opaque pointer the shim
  enqueues its work on (a ``cudaStream_t``, a ``hipStream_t``, a ``sycl::queue*``, as an int),
  and what the producers' ``__dlpack__(stream=...)`` wants (DLPack's stream int on CUDA and
  ROCm; on oneAPI whatever the library documents, e.g. None or its own queue object). On
  CUDA and ROCm they are one value; on SYCL they differ.

Registration: the entry-point group ``flux_dnn.providers``. The entry point's **name** is the
top-level module of the array types it serves (``type(a).__module__.split(".")[0]``: "numpy",
"torch", "jaxlib", "dpctl", ...) and its value a zero-argument callable (usually the class)
returning a :class:`Provider`. An entry point is loaded only when an array of that module is
first seen, so a plug-in's provider module (and its array library) is never imported for
nothing. flux-dnn registers its own providers (NumPy, PyTorch, CuPy, JAX, MLX) the same way
as a plug-in package does; arrays of a module with no provider go through :class:`Provider`
itself, which uses the array API standard (``__array_namespace__``) and DLPack only.

A plug-in package (``pyproject.toml``)::

    [project.entry-points."flux_dnn.providers"]
    dpctl = "flux_dnn_sycl.providers:DpctlProvider"
    dpnp = "flux_dnn_sycl.providers:DpnpProvider"

Every method takes the arrays of the provider's own library only. Methods called on every
convolution (``key``, ``export``, ``empty``, ``streams`` on devices with streams) must be
cheap: no imports, no Python-level DLPack round trips.
"""

from __future__ import annotations

import importlib.metadata
import threading
from typing import NamedTuple

from . import _core

__all__ = ["ENTRY_POINT_GROUP", "Provider", "Streams", "channels_last_empty", "provider_for"]

ENTRY_POINT_GROUP = "flux_dnn.providers"


class Streams(NamedTuple):
    """The streams of one call on a device with streams (what :meth:`Provider.streams`
    returns; the core takes it as the pair it is)."""

    #: the shim's stream or queue, as an int (a pointer) or None for the device's default:
    #: a ``cudaStream_t`` (1: the legacy default stream), a ``hipStream_t``, a ``sycl::queue*``.
    #: The shim enqueues all of its work there.
    shim: int | None
    #: what each array's ``__dlpack__(stream=...)`` is given, so that its producer orders its
    #: pending work before that stream (DLPack's stream int on CUDA/ROCm; on oneAPI what the
    #: library documents). None: the keyword is not sent.
    dlpack: object


def channels_last_empty(empty, shape, **kw):
    """Allocate (N, *spatial, C) with ``empty`` and return it with the permutation that
    views it as (N, C, *spatial)."""
    n = len(shape)
    buf = empty((shape[0], *shape[2:], shape[1]), **kw)
    return buf, (0, n - 1, *range(1, n - 1))


class Provider:
    """The interface, and the provider of any array with ``__dlpack__``,
    ``__dlpack_device__`` and the array API (``__array_namespace__``)."""

    #: the provider's name (messages, ``flux_dnn`` internals)
    name = "array-api"
    #: a[slices] is a view that writes through, and a[...] = v assigns in place. The array API
    #: leaves both to the library (JAX arrays are immutable, their slices copies), so only the
    #: libraries known to have them say so.
    has_views = False
    #: export(a) is a itself: the core takes such arrays as they are (through __dlpack__)
    exports_itself = True
    #: The core reads these arrays and allocates their outputs in C++ without a Python call
    #: (csrc/core/numpy_arrays.cpp: NumPy's own memory layout), so a repeated CPU call pattern
    #: can be answered by the core's memo and a plan's call slot with no Python frame. Only a
    #: provider whose arrays the core knows natively may say True.
    core_native = False
    #: The core's memo may remember this library's CPU forward patterns and answer them with
    #: no Python frame (_core.remember_forward): the core reads the arrays and makes the
    #: outputs itself, natively (NumPy) or through DLPack's exchange API (torch >= 2.11).
    core_memo = False

    # -- reading arrays ------------------------------------------------------------------
    def export(self, a):
        """What the core receives for a: a itself, or a DLPack capsule made by a faster
        exporter of the library (then exports_itself is False; a capsule is consumed by one
        call). The core reads a itself through DLPack's exchange API when its type has one
        (``__dlpack_c_exchange_api__``, dlpack.h 1.3: one C call, no capsule), else through
        ``a.__dlpack__(stream=Streams.dlpack)``."""
        return a

    def key(self, a) -> tuple:
        """A cheap hashable summary (type, shape, dtype, layout, device) for the call memo:
        two arrays with equal keys need the same plan and give the same output allocation."""
        return (type(a), tuple(a.shape), str(a.dtype), self.device(a))

    def device(self, a) -> tuple:
        """(DLPack device type, device id)."""
        dev = a.__dlpack_device__()
        return (int(dev[0]), int(dev[1]))

    def shape(self, a) -> tuple:
        return tuple(a.shape)

    def dtype_name(self, a, argname: str = "array") -> str:
        """The dtype's name ("float32", "bfloat16", ...) for dispatch and dtype checks (once
        per call pattern); may refuse, naming argname, a dtype its library cannot hand over."""
        return str(a.dtype).rsplit(".", 1)[-1]

    def export_fallback(self, a, argname: str):
        """Called by the core only when a.__dlpack__ raised BufferError: None (that error
        stands), or (exportable, DLPack dtype code, bits) to take instead, zero-copy."""
        return None

    def strides(self, a):
        """Strides in elements, or None when unknown (outputs are then allocated contiguous)."""
        return None

    def namespace(self, a):
        """The array API namespace of a (concatenation and zeros for immutable libraries)."""
        return a.__array_namespace__()

    # -- making arrays -------------------------------------------------------------------
    def empty(self, like, shape, channels_last):
        """An uninitialised array of like's library, dtype and device: (N, C, *spatial)
        logically, laid out channels-last when asked."""
        xp = self.namespace(like)
        if channels_last:
            buf, perm = channels_last_empty(xp.empty, shape, dtype=like.dtype, device=like.device)
            return xp.permute_dims(buf, perm)
        return xp.empty(shape, dtype=like.dtype, device=like.device)

    def workspace(self, like, nbytes):
        """nbytes of scratch on like's device, from the library's allocator (its pool), as a
        uint8 array; called only on devices with streams."""
        xp = self.namespace(like)
        return xp.empty((nbytes,), dtype=xp.uint8, device=like.device)

    def sum_over(self, a, axes):
        """a summed over axes, in a's dtype (conv_backward_bias)."""
        return a.sum(axis=axes)

    # -- ordering work -------------------------------------------------------------------
    def streams(self, like):
        """The call's streams for arrays on like's device (called only off the CPU): a
        :class:`Streams` pair, or a single int or None that is both (CUDA and ROCm, where
        DLPack's stream int is the stream's pointer). A library with a stream of its own
        (torch, CuPy, dpctl) gives its *current* one: flux_dnn never makes a private stream.
        The default asks :meth:`stream`, the single-value form that older adapters define."""
        return self.stream(like)

    def stream(self, like):
        """The single-value form of :meth:`streams` (the shim's pointer and DLPack's stream
        argument at once). For a bare DLPack GPU array the legacy default stream (DLPack's
        stream=1) is the one both sides agree on without knowing each other. DLPack has no
        1 on ROCm: None there is the default stream, and the shim is handed the same (NULL).
        oneAPI: DLPack defines no stream value, so None (a SYCL library needs a provider of
        its own to name its queue)."""
        return None if self.device(like)[0] in _NO_DEFAULT_STREAM else 1


# Device types on which a bare DLPack array gets stream None rather than DLPack's 1.
_NO_DEFAULT_STREAM = (_core.DEVICE_CPU, _core.DEVICE_ROCM, _core.DEVICE_ONEAPI)

# ------------------------------------------------------------------------------------------
# Lookup

_GENERIC = Provider()
_BY_TYPE: dict = {}  # array type -> its provider, filled by provider_for
_BY_MODULE: dict = {}  # top-level module -> its provider, or None when none is registered
_lock = threading.Lock()
_entry_points: dict | None = None  # name -> EntryPoint of the group, read once


def _registered() -> dict:
    global _entry_points
    if _entry_points is None:
        _entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return _entry_points


def provider_of_module(root: str):
    """The provider registered for arrays of top-level module `root`, loaded on first use;
    None when none is registered. A provider that fails to load is an error naming its
    entry point (an array of its library cannot be served rightly by the generic provider)."""
    with _lock:
        if root in _BY_MODULE:
            return _BY_MODULE[root]
        ep = _registered().get(root)
        provider = None
        if ep is not None:
            try:
                provider = ep.load()()
            except Exception as exc:
                raise ImportError(
                    f"flux_dnn: the array provider for {root!r} arrays (entry point {ep.value!r} in group "
                    f"{ENTRY_POINT_GROUP!r}) failed to load: {type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(provider, Provider):
                raise TypeError(
                    f"flux_dnn: entry point {ep.value!r} in group {ENTRY_POINT_GROUP!r} returned "
                    f"{type(provider).__name__}, not a flux_dnn.providers.Provider"
                )
        _BY_MODULE[root] = provider
        return provider


def provider_for(a, argname: str) -> Provider:
    """The provider for an array's type; TypeError naming the argument if it has no DLPack."""
    t = type(a)
    provider = _BY_TYPE.get(t)
    if provider is not None:
        return provider
    if t is type(None):
        raise TypeError(f"{argname}: expected an array, got None")
    provider = provider_of_module(t.__module__.split(".", 1)[0])
    if provider is None:
        if not hasattr(a, "__dlpack__") or not hasattr(a, "__dlpack_device__"):
            raise TypeError(
                f"{argname}: expected an array that supports DLPack (__dlpack__ and "
                f"__dlpack_device__), such as a NumPy, CuPy, PyTorch or JAX array; got {t.__module__}.{t.__qualname__}"
            )
        provider = _GENERIC
    if not hasattr(a, "__dlpack__"):
        raise TypeError(f"{argname}: expected an array that supports DLPack, got {t.__module__}.{t.__qualname__}")
    _BY_TYPE[t] = provider
    return provider


def register(array_type: type, provider: Provider) -> None:
    """Serve array_type with provider in this process (tests, and arrays made by a library
    that cannot register an entry point); entry points are the way for packages."""
    if not isinstance(provider, Provider):
        raise TypeError(f"provider: expected a flux_dnn.providers.Provider, got {type(provider).__name__}")
    _BY_TYPE[array_type] = provider


def _export_fallback(a, argname: str):
    t = type(a)
    provider = _BY_TYPE.get(t) or provider_of_module(t.__module__.split(".", 1)[0])
    return None if provider is None else provider.export_fallback(a, argname)


_core.set_export_fallback(_export_fallback)
