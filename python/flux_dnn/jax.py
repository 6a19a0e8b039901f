"""flux_dnn convolutions for JAX arrays, under ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

``conv`` / ``conv_transpose`` follow ``torch.nn.functional`` (NC[D]HW, weights K, C/groups,
*kernel); ``conv_general_dilated`` is a drop-in for ``jax.lax.conv_general_dilated``: every
parameter of it (any dimension numbers, "SAME"/"VALID" or explicit padding, negative padding,
lhs and rhs dilation, feature and batch groups, precision, preferred_element_type), zero-size
arrays, and the same results, so Flax's ``Conv(conv_general_dilated=...)`` can take it.

Every call is one of the ABI's three ops on arrays in their own dim order (the shim reads
them through strides: no transpose is inserted): a forward convolution, its backward-data op
(lhs dilation: a fractionally strided convolution is a transposed one) or its
backward-weight op (batch groups: the weight-gradient form). Each is a ``jax.custom_vjp``
whose gradients are the other two ops, so ``jax.grad`` of any order stays on flux_dnn;
under ``vmap`` a batched call stays one custom call (the vmapped axis is folded into the
batch when the weights are shared).

Two ways into flux_dnn, same semantics:
- the XLA FFI handler (the ``flux-dnn-jax`` wheel, or ``libflux_dnn_jax_ffi.so`` built with
  flux_dnn when jaxlib's FFI headers are found at build time): XLA passes its own buffers,
  no copies, and the handler calls the shim through the ABI. Registered for CPU (oneDNN, or
  the BLAS shim for float64) and, when JAX has a CUDA backend, for CUDA (the cuDNN shim, on
  JAX's stream with XLA's scratch memory as workspace). The program names the shim by its
  registered name and ABI major, never by a path, so ``jax.export`` output runs on any
  install that has that shim.
- otherwise ``jax.pure_callback`` on host (NumPy) views of the arrays; CPU arrays only (CUDA
  arrays raise DeviceUnavailableError rather than silently copying).

Options of every function (keyword-only): ``algorithm`` ("heuristic", "benchmark" or an
algorithm id), ``deterministic`` and ``allow_reduced_precision`` (None: the device's default,
TF32 on NVIDIA, float32 math on CPUs), as flux_dnn.conv takes them.

Argument errors are raised when the function is traced, as ValueError/TypeError (lax's own,
for conv_general_dilated); an error inside the vendor call at run time reaches the caller as
``jax.errors.JaxRuntimeError`` carrying flux_dnn's message.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import flux_dnn
from flux_dnn import _conv, _core
from flux_dnn._conv import BACKWARD_DATA, BACKWARD_WEIGHT, FORWARD
from flux_dnn._discovery import DTYPES, REGISTRY
from flux_dnn._geometry import Geometry, equivalent_convolution
from flux_dnn._options import ConvOptions

__all__ = [
    "conv",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose",
    "conv_general_dilated",
    "ffi_available",
    "EXPORT_CHECKS",
]

_DTYPES = DTYPES  # float64 needs jax_enable_x64
_SHIM_DEVICE = {"cpu": _core.DEVICE_CPU, "cuda": _core.DEVICE_CUDA}  # JAX platform -> its shims' device type


# ------------------------------------------------------------------------------------------
# One convolution, as its three ops see it. x (N, C, *sp), w (K, C/g, *k) and y (N, K, *out)
# are each held in a dim order of their own: spec[i] is the dim of the array that holds the
# i-th of those dims (jax.lax's dimension numbers). Each op reads two of the arrays and makes
# the third (ROLES: the indices into (x, w, y) of its operands a, b and its result).

ROLES = {FORWARD: (0, 1, 2), BACKWARD_DATA: (2, 1, 0), BACKWARD_WEIGHT: (0, 2, 1)}


class _Conv(NamedTuple):
    """A checked convolution (hashable: a static argument under jit)."""

    geo: Geometry
    shapes: tuple  # of x, w and y, each in its own dim order (no vmapped dims)
    specs: tuple  # of x, w and y
    options: ConvOptions

    def canonical(self, role: int) -> tuple:
        """The shape of x, w or y in the order (N, C, *sp) / (K, C/g, *k) / (N, K, *out)."""
        return tuple(self.shapes[role][d] for d in self.specs[role])


def _identity(nd: int) -> tuple:
    return tuple(range(nd + 2))


def _plain(x_shape, w_shape, y_shape, geo, options) -> _Conv:
    """A convolution whose arrays are all in the order (N, C, *sp), (K, C/g, *k)."""
    ident = _identity(len(geo.stride))
    return _Conv(geo, (tuple(x_shape), tuple(w_shape), tuple(y_shape)), (ident, ident, ident), options)


# ------------------------------------------------------------------------------------------
# Host side: NumPy arrays in, flux_dnn call, NumPy array out. Under vmap (vmap_method
# "expand_dims") every operand carries the same number of leading batch dims, of size 1 where
# that operand is not batched.


def _lead(a, nd):
    return a.shape[: a.ndim - nd - 2]


def _fold_data(a, lead):
    """(*lead, N, C, *sp) -> (N, B*C, *sp): the vmapped axis becomes a block of channels."""
    a = np.broadcast_to(a, lead + a.shape[len(lead) :])
    B = int(np.prod(lead))
    n, c, sp = a.shape[len(lead)], a.shape[len(lead) + 1], a.shape[len(lead) + 2 :]
    a = a.reshape(B, n, c, *sp).swapaxes(0, 1)
    return np.ascontiguousarray(a.reshape(n, B * c, *sp))


def _unfold_data(a, lead):
    n, bc, sp = a.shape[0], a.shape[1], a.shape[2:]
    B = int(np.prod(lead))
    return np.ascontiguousarray(a.reshape(n, B, bc // B, *sp).swapaxes(0, 1)).reshape(*lead, n, bc // B, *sp)


def _fold_weight(a, lead):
    """(*lead, K, Cg, *k) -> (B*K, Cg, *k): one group block per vmapped element."""
    a = np.broadcast_to(a, lead + a.shape[len(lead) :])
    return np.ascontiguousarray(a.reshape(-1, *a.shape[len(lead) + 1 :]))


def _host_data_weight(fn, nd, geo, data, weight, *shape_arg):
    """Run fn(data, weight, groups, *shape_arg) for an op whose inputs are a data array and a
    weight array and whose result is a data array (conv, backward-data)."""
    lead = np.broadcast_shapes(_lead(data, nd), _lead(weight, nd))
    if not lead:
        return fn(data, weight, geo.groups, *shape_arg)
    B = int(np.prod(lead))
    if int(np.prod(_lead(weight, nd))) == 1:  # shared weights: the vmapped axis joins N
        d = np.broadcast_to(data, lead + data.shape[len(lead) :])
        d = np.ascontiguousarray(d.reshape(-1, *d.shape[len(lead) + 1 :]))
        w = weight.reshape(weight.shape[len(_lead(weight, nd)) :])
        shape = [(shape_arg[0][0] * B, *shape_arg[0][1:])] if shape_arg else []
        y = fn(d, w, geo.groups, *shape)
        return y.reshape(*lead, -1, *y.shape[1:])
    shape = [(shape_arg[0][0], shape_arg[0][1] * B, *shape_arg[0][2:])] if shape_arg else []
    y = fn(_fold_data(data, lead), _fold_weight(weight, lead), geo.groups * B, *shape)
    return _unfold_data(y, lead)


def _host_conv(nd, geo, kwargs, _shape, x, w):
    def run(x, w, groups):
        return flux_dnn.conv(x, w, None, geo.stride, geo.padding(), geo.dilation, groups, **kwargs)

    return _host_data_weight(run, nd, geo, x, w)


def _host_backward_data(nd, geo, kwargs, input_shape, dy, w):
    def run(dy, w, groups, shape):
        return flux_dnn.conv_backward_data(dy, w, shape, geo.stride, geo.padding(), geo.dilation, groups, **kwargs)

    return _host_data_weight(run, nd, geo, dy, w, tuple(input_shape))


def _host_backward_weight(nd, geo, kwargs, weight_shape, x, dy):
    lead = np.broadcast_shapes(_lead(x, nd), _lead(dy, nd))
    pads = geo.padding()
    if not lead:
        return flux_dnn.conv_backward_weight(x, dy, weight_shape, geo.stride, pads, geo.dilation, geo.groups, **kwargs)
    B = int(np.prod(lead))
    shape = (weight_shape[0] * B, *weight_shape[1:])
    x, dy = _fold_data(x, lead), _fold_data(dy, lead)
    dw = flux_dnn.conv_backward_weight(x, dy, shape, geo.stride, pads, geo.dilation, geo.groups * B, **kwargs)
    return dw.reshape(*lead, *weight_shape)


_HOST = {FORWARD: _host_conv, BACKWARD_DATA: _host_backward_data, BACKWARD_WEIGHT: _host_backward_weight}


def _in_order(a, spec, nd):
    """A view of an operand (vmapped dims first) with its dims in the order of `spec`."""
    lead = a.ndim - nd - 2
    return a.transpose(*range(lead), *(lead + d for d in spec))


def _host(op, conv: _Conv, a, b):
    """The pure_callback body: one op on NumPy arrays in their own dim orders (under vmap
    with leading batch dims); the result in the dim order of the op's result."""
    nd = len(conv.geo.stride)
    ia, ib, io = ROLES[op]
    a, b = _in_order(a, conv.specs[ia], nd), _in_order(b, conv.specs[ib], nd)
    y = _HOST[op](nd, conv.geo, _keywords(conv.options), conv.canonical(io), a, b)
    return np.ascontiguousarray(_in_order(y, np.argsort(conv.specs[io]), nd))


def _keywords(options: ConvOptions) -> dict:
    """The keyword options flux_dnn's ops take, as far as they differ from the defaults."""
    given = {
        "algorithm": options.algorithm,
        "deterministic": options.deterministic,
        "allow_reduced_precision": options.allow_reduced_precision,
    }
    return {k: v for k, v in given.items() if v != getattr(_DEFAULT_OPTIONS, k)}


_DEFAULT_OPTIONS = ConvOptions()


# ------------------------------------------------------------------------------------------
# The XLA FFI handler (libflux_dnn_jax_ffi.so): XLA passes its own buffers, the handler calls
# the shim through the ABI.

# The target and symbols of the handler's attribute set (shim by name, specs, algorithm); a
# handler library older than it lacks the symbols, and the callback path serves instead.
_FFI_TARGET = "flux_dnn_conv_general"
_FFI_SYMBOLS = {"cpu": "FluxDnnConvGeneral", "cuda": "FluxDnnConvGeneralCuda"}

#: What ``jax.export.export(fn, disabled_checks=flux_dnn.jax.EXPORT_CHECKS)`` needs to save a
#: program that calls flux_dnn: jax.export refuses custom calls it does not know to be stable.
#: flux_dnn keeps this one stable: its attributes change only with a new target name, and the
#: shim is named by registered name and ABI major, resolved where the program runs (a process
#: that runs it imports flux_dnn.jax and calls ffi_available(), which registers the handler).
EXPORT_CHECKS = (jax.export.DisabledSafetyCheck.custom_call(_FFI_TARGET),)


def _ffi_library() -> str:
    """FLUX_DNN_JAX_FFI, else the handler built into flux_dnn, else the flux-dnn-jax wheel's."""
    explicit = os.environ.get("FLUX_DNN_JAX_FFI")
    if explicit:
        return explicit
    built_in = os.path.join(os.path.dirname(flux_dnn.__file__), "libflux_dnn_jax_ffi.so")
    if os.path.exists(built_in):
        return built_in
    try:
        from flux_dnn_jax_ffi import LIBRARY
    except ImportError:
        return built_in  # absent: ffi_available() reports it
    return str(LIBRARY)


_FFI_LIBRARY = _ffi_library()
_ffi_state: dict = {}


def _cuda_devices():
    try:
        return jax.devices("cuda")
    except RuntimeError:  # no CUDA backend in this JAX
        return []


def ffi_available() -> bool:
    """Whether the XLA FFI handler is built and registered (else calls go through
    jax.pure_callback). Registers the CPU handler, and the CUDA one when JAX has a CUDA
    backend, under one target name: XLA picks the registration of the platform it lowers for.
    Also tells the handler where every installed shim lies (a program names shims by name)."""
    if "ok" not in _ffi_state:
        try:
            lib = ctypes.CDLL(_FFI_LIBRARY)
            capsule = jax.ffi.pycapsule(getattr(lib, _FFI_SYMBOLS["cpu"]))
            lib.FluxDnnJaxRegisterShim.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
            jax.ffi.register_ffi_target(_FFI_TARGET, capsule, platform="cpu")
            _ffi_state.update(ok=True, lib=lib, platforms=["cpu"])
        except (OSError, AttributeError) as exc:
            _ffi_state.update(ok=False, reason=f"{_FFI_LIBRARY}: {exc} (a flux-dnn-jax older than flux_dnn?)")
            return False
        if _cuda_devices():
            try:  # a handler library built without CUDA support: CPU still works
                capsule = jax.ffi.pycapsule(getattr(lib, _FFI_SYMBOLS["cuda"]))
                jax.ffi.register_ffi_target(_FFI_TARGET, capsule, platform="CUDA")
                _ffi_state["platforms"].append("cuda")
            except AttributeError as exc:
                _ffi_state["cuda_reason"] = f"{_FFI_LIBRARY} has no CUDA handler: {exc}"
        _register_shims()
    return _ffi_state["ok"]


def _register_shims() -> None:
    """Loads the shims of the handler's platforms (each with its vendor library's preload,
    which a bare dlopen by the handler would miss) and tells the handler where they lie: a
    program deserialized from jax.export names them without ever tracing here."""
    for platform in _ffi_state["platforms"]:
        usable, _ = REGISTRY.usable_for(_SHIM_DEVICE[platform], loud=False)
        _register(usable)


def _register(entries) -> None:
    """name -> library path of loaded shims, for the handler (which keeps a name's first path)."""
    for entry in entries:
        _ffi_state["lib"].FluxDnnJaxRegisterShim(entry.name.encode(), os.fsencode(entry.path))


# "ffi" or "callback"; None picks the FFI handler when it is available. Tests set it.
_BACKEND = None


def _use_ffi() -> bool:
    return _BACKEND == "ffi" or (_BACKEND is None and ffi_available())


def _shim_name(platform, dtype) -> str:
    """The registered name of the shim serving `platform`'s arrays of `dtype` (on the CPU:
    oneDNN, or the BLAS shim for float64); loads it (and checks its ABI) if needed, raises
    DeviceUnavailableError with the reason when it cannot work here, TypeError when no shim
    there computes the dtype."""
    entry = REGISTRY.shim_for(_SHIM_DEVICE[platform], str(dtype))
    _register([entry])
    return entry.name


def _platform(*arrays):
    """The platform ("cpu" or "cuda") of arrays placed on devices; None for tracers, whose
    platform is known only when XLA lowers the program."""
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        return None
    devices = set().union(*(a.devices() for a in arrays))
    if all(d.platform == "cpu" for d in devices):
        return "cpu"
    if devices <= set(_cuda_devices()):
        return "cuda"
    raise flux_dnn.DeviceUnavailableError(f"flux_dnn.jax serves CPU and CUDA arrays, not arrays on {devices}")


def _default_platform():
    """The platform jit runs uncommitted arrays on: jax.default_device's, else the default
    backend's."""
    device = jax.config.jax_default_device
    platform = getattr(device, "platform", device) or jax.default_backend()
    return "cuda" if platform == "gpu" else platform


def _ffi_attrs(op, conv: _Conv, platform, dtype) -> dict:
    """The custom call's attributes: the op, its geometry, the shim by name and ABI major,
    and the flags and algorithm of the options (flags -1: the device's defaults)."""
    i64 = functools.partial(np.asarray, dtype=np.int64)
    geo, options = conv.geo, conv.options
    shim = _shim_name(platform, dtype)
    flags = -1
    if options.deterministic or options.allow_reduced_precision is not None:
        flags = options.flags(REGISTRY.shim_for(_SHIM_DEVICE[platform], str(dtype)).default_flags())
    policy, algo_id = options.algorithm_policy()
    ia, ib, io = ROLES[op]
    return dict(
        shim=shim,
        abi_major=np.int64(_core.ABI_MAJOR),
        op=np.int64(op),
        stride=i64(geo.stride),
        padding_lo=i64(geo.lo),
        padding_hi=i64(geo.hi),
        dilation=i64(geo.dilation),
        groups=np.int64(geo.groups),
        flags=np.int64(flags),
        algo_policy=np.int64(policy),
        algo_id=np.int64(algo_id),
        a_spec=i64(conv.specs[ia]),
        b_spec=i64(conv.specs[ib]),
        out_spec=i64(conv.specs[io]),
    )


def _ffi_run(op, conv: _Conv, out, a, b):
    """The FFI call, with the attributes of the platform it runs on (fixed when traced).
    Under jit the arrays are tracers: with handlers for several platforms, a
    jax.lax.platform_dependent branch per platform lets the lowering pick the right shim
    (jax.default_backend() would be wrong for arrays committed to another platform's
    device). A branch whose shim cannot work here is left out unless it is the default
    platform's, whose error (the reason the shim is missing) is the one a user must see."""
    if not ffi_available():
        raise flux_dnn.DeviceUnavailableError(f"the flux_dnn XLA FFI handler is not available: {_ffi_state['reason']}")
    call = jax.ffi.ffi_call(_FFI_TARGET, out, vmap_method="expand_dims")

    def on(platform):
        attrs = _ffi_attrs(op, conv, platform, a.dtype)
        return lambda a, b: call(a, b, **attrs)

    platform, default = _platform(a, b), _default_platform()
    if (platform or default) not in _ffi_state["platforms"]:
        why = _ffi_state.get("cuda_reason", "not built for it")
        raise flux_dnn.DeviceUnavailableError(f"flux_dnn.jax has no {platform or default} FFI handler: {why}")
    if platform is not None or len(_ffi_state["platforms"]) == 1:
        return on(platform or "cpu")(a, b)
    branches = {}
    for p in _ffi_state["platforms"]:
        try:
            branches[p] = on(p)
        except flux_dnn.DeviceUnavailableError:
            if p == default:
                raise
    return jax.lax.platform_dependent(a, b, **branches)


def _run(op, conv: _Conv, a, b):
    """One flux_dnn op on JAX arrays: forward (x, w), backward-data (dy, w) or
    backward-weight (x, dy); the result in its own dim order (conv.shapes)."""
    out = jax.ShapeDtypeStruct(conv.shapes[ROLES[op][2]], a.dtype)
    if any(0 in shape for shape in conv.shapes):
        # Nothing to compute, and every output element sums over nothing: zeros (the CUDA
        # handler cannot clear device memory itself).
        return jnp.zeros(out.shape, out.dtype)
    if _use_ffi():
        return _ffi_run(op, conv, out, a, b)
    # Traced arrays: judged by the default platform (jit's choice for uncommitted arrays).
    if (_platform(a, b) or _default_platform()) != "cpu":
        raise flux_dnn.DeviceUnavailableError(
            "flux_dnn.jax runs GPU arrays through its XLA FFI handler only (the pure_callback fallback "
            f"is CPU-only), and it is not available: {_ffi_state.get('reason', 'flux_dnn.jax._BACKEND is callback')}"
        )
    return jax.pure_callback(functools.partial(_host, op, conv), out, a, b, vmap_method="expand_dims")


# Each op is differentiable, its gradients being the other two ops of the same convolution
# (the cotangent of an op's result has that result's shape and dim order): forward
# y = F(x, w) has dx = BD(dy, w), dw = BW(x, dy); backward-data dx = BD(dy, w) has
# d(dy) = F(g, w), dw = BW(g, dy); backward-weight dw = BW(x, dy) has dx = BD(dy, g),
# d(dy) = F(x, g). The rules call _apply itself, so gradients of gradients stay on flux_dnn.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _apply(op, conv: _Conv, a, b):
    return _run(op, conv, a, b)


def _apply_fwd(op, conv, a, b):
    return _apply(op, conv, a, b), (a, b)


def _apply_bwd(op, conv, residuals, g):
    a, b = residuals
    if op == FORWARD:
        return _apply(BACKWARD_DATA, conv, g, b), _apply(BACKWARD_WEIGHT, conv, a, g)
    if op == BACKWARD_DATA:
        return _apply(FORWARD, conv, g, b), _apply(BACKWARD_WEIGHT, conv, g, a)
    return _apply(BACKWARD_DATA, conv, b, g), _apply(FORWARD, conv, a, g)


_apply.defvjp(_apply_fwd, _apply_bwd)


# ------------------------------------------------------------------------------------------
# torch.nn.functional semantics: shapes and validation come from flux_dnn's own shape checks
# (the ones conv() and conv_transpose() run first), from shapes alone: no shim is asked (a
# GPU-only install has no CPU shim, and tracing computes nothing).


def _check_dtype(*arrays):
    # The dtypes of the ABI; which shim computes one (oneDNN, or the BLAS shim for float64)
    # is dispatch's choice, from what the shims report.
    for name, a in arrays:
        if str(a.dtype) not in _DTYPES:
            raise TypeError(f"{name}: flux_dnn.jax supports {', '.join(_DTYPES)} arrays, got {a.dtype}")


def _options(algorithm, deterministic, allow_reduced_precision) -> ConvOptions:
    return ConvOptions(
        algorithm=algorithm, deterministic=deterministic, allow_reduced_precision=allow_reduced_precision
    )


def _add_bias(y, bias):
    if bias is None:
        return y
    bias = jnp.asarray(bias)
    if bias.shape != (y.shape[1],):
        raise ValueError(f"bias: expected shape ({y.shape[1]},) (one value per output channel), got {bias.shape}")
    return y + bias.astype(y.dtype).reshape((1, -1) + (1,) * (y.ndim - 2))


def _arrays(x, w):
    x, w = jnp.asarray(x), jnp.asarray(w)
    if x.ndim not in (3, 4, 5) or w.ndim != x.ndim:
        raise ValueError(
            f"x, w: expected x (N, C, *spatial) and w (K, C/groups, *kernel) of the same rank "
            f"3, 4 or 5, got shapes {x.shape} and {w.shape}"
        )
    _check_dtype(("x", x), ("w", w))
    if x.dtype != w.dtype:
        raise TypeError(f"w: dtype {w.dtype} differs from x's dtype {x.dtype}")
    return x, w


def conv(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    *,
    algorithm="heuristic",
    deterministic=False,
    allow_reduced_precision=None,
):
    """Convolution of JAX arrays with ``torch.nn.functional.conv{1,2,3}d`` semantics: x
    ``(N, C, *spatial)``, w ``(K, C/groups, *kernel)``, padding an int, ints, (lo, hi) pairs,
    ``"same"`` or ``"valid"``. Differentiable in x, w and bias. The keyword options are
    flux_dnn.conv's."""
    x, w = _arrays(x, w)
    options = _options(algorithm, deterministic, allow_reduced_precision)
    y_shape, geo = _conv.forward_shape(x.ndim - 2, x.shape, w.shape, stride, padding, dilation, groups)
    y = _apply(FORWARD, _plain(x.shape, w.shape, y_shape, geo, options), x, w)
    return _add_bias(y, bias)


def _ranked(nd, name):
    def f(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, **options):
        if jnp.ndim(x) != nd + 2:
            raise ValueError(f"x: {name} expects a {nd + 2}-D array (N, C, *spatial), got shape {jnp.shape(x)}")
        return conv(x, w, bias, stride, padding, dilation, groups, **options)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"{nd}-D :func:`conv`."
    return f


conv1d, conv2d, conv3d = (_ranked(nd, f"conv{nd}d") for nd in (1, 2, 3))


def conv_transpose(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    output_padding=0,
    groups=1,
    dilation=1,
    *,
    algorithm="heuristic",
    deterministic=False,
    allow_reduced_precision=None,
):
    """Transposed convolution with ``torch.nn.functional.conv_transpose{1,2,3}d`` semantics:
    w ``(C_in, C_out/groups, *kernel)``. Differentiable in x, w and bias.

    It is the backward-data op of the convolution that maps its output back onto x
    (_geometry.equivalent_convolution); trailing output rows that no window reaches (`trim`,
    from an output_padding past the last window) are zeros."""
    x, w = _arrays(x, w)
    nd = x.ndim - 2
    options = _options(algorithm, deterministic, allow_reduced_precision)
    y_shape, geo = _conv.transpose_shape(nd, x.shape, w.shape, stride, padding, output_padding, groups, dilation)
    cg, trim = equivalent_convolution(y_shape[2:], w.shape[2:], x.shape[2:], geo)
    computed = (*y_shape[:2], *(n - t for n, t in zip(y_shape[2:], trim)))
    y = _apply(BACKWARD_DATA, _plain(computed, w.shape, x.shape, cg, options), x, w)
    if any(trim):
        y = jnp.pad(y, [(0, 0), (0, 0), *((0, t) for t in trim)])
    return _add_bias(y, bias)


# ------------------------------------------------------------------------------------------
# jax.lax.conv_general_dilated. lax checks the arguments and gives the result's shape and
# dtype (jax.eval_shape, so its errors are the ones users know); the problem is then one of
# flux_dnn's ops on the arrays as they are laid out:
#   - negative padding crops the input (the rows it removes are never read);
#   - no lhs dilation and no batch groups: a forward convolution;
#   - batch groups: the weight-gradient form (lhs batch and features exchanged, the rhs's O
#     and I exchanged, the result's N and C exchanged): a backward-weight op with stride
#     rhs_dilation, dilation window_strides and groups batch_group_count;
#   - lhs dilation: a fractionally strided convolution, the backward-data op of the
#     convolution with stride lhs_dilation from the result back onto lhs, with the kernel
#     flipped and its channel roles exchanged per group (window strides as well: computed at
#     stride 1 and subsampled).


def _lax_result(lhs, rhs, kwargs: dict):
    """lax's own checks and its result's ShapeDtypeStruct."""
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (lhs, rhs)]
    return jax.eval_shape(lambda a, b: jax.lax.conv_general_dilated(a, b, **kwargs), *structs)


def _precision_allows_reduced(precision) -> bool | None:
    """allow_reduced_precision from lax's precision (or jax.default_matmul_precision when it
    is None): HIGHEST (or "highest"/"float32") asks for full float32 math, False; anything
    else is the device's default, None: TF32 on NVIDIA as XLA's DEFAULT, and float32 math on
    CPUs, which is what XLA:CPU computes at every precision."""
    if precision is None:
        precision = jax.config.jax_default_matmul_precision
        if precision is None:
            return None
    pair = precision if isinstance(precision, (tuple, list)) else (precision,)
    highest = ("highest", "float32", jax.lax.Precision.HIGHEST)
    return False if any(p in highest or str(p).lower() in highest for p in pair if p is not None) else None


def _compute_dtype(in_dtype, out_dtype):
    """The dtype flux_dnn computes in for lax's preferred_element_type: the input's when the
    result has it; float64 for a float64 result; float32 for a wider or other 16-bit one
    (each input converts exactly, and the result is rounded once)."""
    if out_dtype == in_dtype:
        return in_dtype
    return jnp.dtype("float64") if out_dtype == jnp.float64 else jnp.dtype("float32")


def conv_general_dilated(
    lhs,
    rhs,
    window_strides: Sequence[int],
    padding,
    lhs_dilation=None,
    rhs_dilation=None,
    dimension_numbers=None,
    feature_group_count=1,
    batch_group_count=1,
    precision=None,
    preferred_element_type=None,
    out_sharding=None,
    *,
    algorithm="heuristic",
    deterministic=False,
    allow_reduced_precision=None,
):
    """``jax.lax.conv_general_dilated`` computed by flux_dnn: same arguments, same result
    (shape, dtype, values to the dtype's rounding), same errors, differentiable to any order
    and under vmap; a drop-in for Flax's ``Conv(conv_general_dilated=...)``.

    ``precision``: HIGHEST (or ``jax.default_matmul_precision("highest")`` / "float32")
    asks for full float32 math (``allow_reduced_precision=False``); other values keep the
    device's default, TF32 on NVIDIA GPUs (as XLA's DEFAULT) and float32 math on CPUs (as
    XLA:CPU at every precision). An explicit ``allow_reduced_precision`` wins.
    ``preferred_element_type``: a wider float result is accumulated in float32 (float64 for
    float64) from the exactly converted inputs and rounded once. Inputs flux_dnn does not
    compute (integers, complex, float8) raise TypeError; convolutions of 1 to 3 spatial dims
    are computed (0-D as 1-D of size 1); ``out_sharding`` is not supported."""
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    if out_sharding is not None:
        raise ValueError(f"out_sharding: flux_dnn.jax.conv_general_dilated takes None, got {out_sharding!r}")
    kwargs = dict(
        window_strides=window_strides,
        padding=padding,
        lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers,
        feature_group_count=feature_group_count,
        batch_group_count=batch_group_count,
        preferred_element_type=preferred_element_type,
    )
    result = _lax_result(lhs, rhs, kwargs)
    if str(lhs.dtype) not in _DTYPES:
        raise TypeError(
            f"lhs: flux_dnn.jax computes {', '.join(_DTYPES)} convolutions, got {lhs.dtype} "
            "(jax.lax.conv_general_dilated computes it)"
        )
    if allow_reduced_precision is None:
        allow_reduced_precision = _precision_allows_reduced(precision)
    options = _options(algorithm, deterministic, allow_reduced_precision)
    dn = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    nd = lhs.ndim - 2
    if not 0 <= nd <= 3:
        raise ValueError(f"lhs: flux_dnn computes convolutions of 1 to 3 spatial dims, got {nd} (shape {lhs.shape})")
    if result.size == 0 or lhs.size == 0 or rhs.size == 0:  # nothing to compute, or sums over nothing
        return jnp.zeros(result.shape, result.dtype)
    compute = _compute_dtype(lhs.dtype, result.dtype)
    lhs, rhs = lhs.astype(compute), rhs.astype(compute)
    rhs_sp = [rhs.shape[d] for d in dn.rhs_spec[2:]]
    ones = (1,) * nd
    l_dil = tuple(lhs_dilation) if lhs_dilation is not None else ones
    r_dil = tuple(rhs_dilation) if rhs_dilation is not None else ones
    if isinstance(padding, str):
        window = [(k - 1) * r + 1 for k, r in zip(rhs_sp, r_dil)]
        padding = jax.lax.padtype_to_pads([lhs.shape[d] for d in dn.lhs_spec[2:]], window, window_strides, padding)
    problem = _Lax(
        tuple(dn.lhs_spec),
        tuple(dn.rhs_spec),
        tuple(dn.out_spec),
        tuple(window_strides),
        tuple((int(lo), int(hi)) for lo, hi in padding),
        l_dil,
        r_dil,
        feature_group_count,
        batch_group_count,
        options,
    )
    if nd == 0:  # as 1-D of size 1: a trailing dim on every array
        y = _general(lhs[..., None], rhs[..., None], result.shape + (1,), problem.as_1d())[..., 0]
    else:
        y = _general(lhs, rhs, result.shape, problem)
    return y.astype(result.dtype)


class _Lax(NamedTuple):
    """conv_general_dilated's parameters, normalised: specs from the dimension numbers,
    padding as (lo, hi) pairs."""

    lhs_spec: tuple
    rhs_spec: tuple
    out_spec: tuple
    strides: tuple
    padding: tuple
    lhs_dilation: tuple
    rhs_dilation: tuple
    feature_groups: int
    batch_groups: int
    options: ConvOptions

    def as_1d(self):
        """The 0-D problem as a 1-D one over a new trailing dim of size 1."""
        new = len(self.lhs_spec)
        return self._replace(
            lhs_spec=(*self.lhs_spec, new),
            rhs_spec=(*self.rhs_spec, new),
            out_spec=(*self.out_spec, new),
            strides=(1,),
            padding=((0, 0),),
            lhs_dilation=(1,),
            rhs_dilation=(1,),
        )


def _general(lhs, rhs, out_shape: tuple, p: _Lax):
    """conv_general_dilated of non-empty arrays whose result (out_shape) is not empty."""
    lhs, p = _crop_negative_padding(lhs, p)
    if lhs is None:  # every row read is padding
        return jnp.zeros(out_shape, rhs.dtype)
    if p.batch_groups > 1:
        if any(d > 1 for d in p.lhs_dilation):  # the zeros between rows, made real
            lhs, p = _dilated(lhs, p)
        return _batch_grouped(lhs, rhs, out_shape, p)
    if any(d > 1 for d in p.lhs_dilation):
        if any(s > 1 for s in p.strides):
            return _subsampled(lhs, rhs, out_shape, p)
        return _fractionally_strided(lhs, rhs, out_shape, p)
    geo = Geometry(p.strides, *zip(*p.padding), p.rhs_dilation, p.feature_groups)
    conv = _Conv(geo, (lhs.shape, rhs.shape, out_shape), (p.lhs_spec, p.rhs_spec, p.out_spec), p.options)
    return _apply(FORWARD, conv, lhs, rhs)


def _crop_negative_padding(lhs, p: _Lax):
    """(lhs, p) without negative padding: a negative padding c of the lhs-dilated input drops
    its first (last) c rows, which no window reads; that is the first (last) ceil(c / l) rows
    of lhs, leaving a padding of ceil(c / l) * l - c. (None, p) when no row is left."""
    if all(lo >= 0 and hi >= 0 for lo, hi in p.padding):
        return lhs, p
    padding = []
    for i, ((lo, hi), dil) in enumerate(zip(p.padding, p.lhs_dilation)):
        axis = p.lhs_spec[2 + i]
        cut_lo, cut_hi = -(lo // dil) if lo < 0 else 0, -(hi // dil) if hi < 0 else 0  # ceil(-lo / dil)
        n = lhs.shape[axis]
        if cut_lo + cut_hi >= n:
            return None, p
        if cut_lo or cut_hi:
            lhs = jax.lax.slice_in_dim(lhs, cut_lo, n - cut_hi, axis=axis)
        padding.append((lo + cut_lo * dil, hi + cut_hi * dil))
    return lhs, p._replace(padding=tuple(padding))


def _dilated(lhs, p: _Lax):
    """lhs with its dilation made real (dil - 1 zeros between rows), and p without it."""
    config = [(0, 0, 0)] * lhs.ndim
    for i, dil in enumerate(p.lhs_dilation):
        config[p.lhs_spec[2 + i]] = (0, 0, dil - 1)
    lhs = jax.lax.pad(lhs, jnp.zeros((), lhs.dtype), config)
    return lhs, p._replace(lhs_dilation=(1,) * len(p.lhs_dilation))


def _swapped(spec: tuple) -> tuple:
    return (spec[1], spec[0], *spec[2:])


def _batch_grouped(lhs, rhs, out_shape, p: _Lax):
    """The weight-gradient form: out[n, o] = sum over c, k of lhs[g*N' + n, c] rhs[o, c] with
    g = o // (O / batch_groups) is backward-weight with x = lhs (batch and feature exchanged),
    dy = rhs (O and I exchanged) and dw = out (N and C exchanged). Its rule that dy be the
    forward output of x needs the rows past the last window gone: the high padding shrinks
    by them, and the input is cropped where that goes below zero."""
    hi = []
    for i, (lo, high) in enumerate(p.padding):
        axis = p.lhs_spec[2 + i]
        n, k, r, s = lhs.shape[axis], rhs.shape[p.rhs_spec[2 + i]], p.rhs_dilation[i], p.strides[i]
        y = out_shape[p.out_spec[2 + i]]
        unread = n + lo + high - (k - 1) * r - 1 - s * (y - 1)
        high -= unread
        if high < 0:
            lhs = jax.lax.slice_in_dim(lhs, 0, n + high, axis=axis)
            high = 0
        hi.append(high)
    lo = tuple(lo for lo, _ in p.padding)
    geo = Geometry(p.rhs_dilation, lo, tuple(hi), p.strides, p.batch_groups)
    specs = (_swapped(p.lhs_spec), _swapped(p.out_spec), _swapped(p.rhs_spec))
    conv = _Conv(geo, (lhs.shape, out_shape, rhs.shape), specs, p.options)
    return _apply(BACKWARD_WEIGHT, conv, lhs, rhs)


def _subsampled(lhs, rhs, out_shape, p: _Lax):
    """lhs dilation with window strides: the stride-1 result's rows 0, s, 2s, ... (the rows
    past the last one kept are not computed: the high padding shrinks by them)."""
    full_shape, padding = list(out_shape), []
    for i, ((lo, hi), s) in enumerate(zip(p.padding, p.strides)):
        axis = p.out_spec[2 + i]
        rows = (out_shape[axis] - 1) * s + 1
        n = lhs.shape[p.lhs_spec[2 + i]]
        full = (n - 1) * p.lhs_dilation[i] + 1 + lo + hi - (rhs.shape[p.rhs_spec[2 + i]] - 1) * p.rhs_dilation[i]
        padding.append((lo, hi - (full - rows)))
        full_shape[axis] = rows
    unit = p._replace(strides=(1,) * len(p.strides), padding=tuple(padding))
    y = _general(lhs, rhs, tuple(full_shape), unit)
    strides = [1] * y.ndim
    for i, s in enumerate(p.strides):
        strides[p.out_spec[2 + i]] = s
    return jax.lax.slice(y, (0,) * y.ndim, y.shape, strides)


def _fractionally_strided(lhs, rhs, out_shape, p: _Lax):
    """lhs dilation l, window stride 1, padding >= 0: out[o] = sum over t, k with
    t*l = o + k*r - lo of lhs[t] rhs[k], which is backward-data of the convolution with
    stride l, dilation r and padding (k-1)*r - lo, (k-1)*r - hi from out back onto lhs,
    whose weights are rhs flipped with its channel roles exchanged per group. Where that
    padding is negative (lo or hi beyond the kernel's reach), the out rows there receive
    nothing: zeros around the computed rows."""
    w, w_spec = _transposed_kernel(rhs, p)
    lo, hi, zeros, computed = [], [], [], list(out_shape)
    for i, (plo, phi) in enumerate(p.padding):
        reach = (rhs.shape[p.rhs_spec[2 + i]] - 1) * p.rhs_dilation[i]
        zlo, zhi = max(plo - reach, 0), max(phi - reach, 0)
        lo.append(reach - plo + zlo)
        hi.append(reach - phi + zhi)
        zeros.append((zlo, zhi))
        computed[p.out_spec[2 + i]] -= zlo + zhi
    geo = Geometry(p.lhs_dilation, tuple(lo), tuple(hi), p.rhs_dilation, p.feature_groups)
    conv = _Conv(geo, (tuple(computed), w.shape, lhs.shape), (p.out_spec, w_spec, p.lhs_spec), p.options)
    y = _apply(BACKWARD_DATA, conv, lhs, w)
    if any(z != (0, 0) for z in zeros):
        widths = [(0, 0)] * y.ndim
        for i, z in enumerate(zeros):
            widths[p.out_spec[2 + i]] = z
        y = jnp.pad(y, widths)
    return y


def _transposed_kernel(rhs, p: _Lax):
    """(w, its spec): rhs (O, I, *k) as the weights (C, O/groups, *k) of the convolution from
    the result back onto lhs, spatially flipped. One group: rhs itself, O and I exchanged (a
    spec, no copy but the flip); more: (g, O/g, I) regrouped as (g, I, O/g)."""
    spatial = p.rhs_spec[2:]
    w = jnp.flip(rhs, spatial)
    g = p.feature_groups
    if g == 1:
        return w, _swapped(p.rhs_spec)
    w = jnp.transpose(w, p.rhs_spec)  # (O, I, *k)
    o, i, *k = w.shape
    w = w.reshape(g, o // g, i, *k).swapaxes(1, 2).reshape(g * i, o // g, *k)
    return w, _identity(len(k))
