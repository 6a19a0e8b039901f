"""flux_dnn convolutions for JAX arrays, under ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

``conv`` / ``conv_transpose`` follow ``torch.nn.functional`` (NC[D]HW, weights K, C/groups,
*kernel); ``conv_general_dilated`` follows ``jax.lax.conv_general_dilated`` (any dimension
numbers, "SAME"/"VALID" or explicit padding, rhs_dilation, feature_group_count).

Gradients are a ``jax.custom_vjp`` whose backward pass runs flux_dnn's backward-data and
backward-weight ops; under ``vmap`` a batched call stays one custom call (the vmapped axis is
folded into the batch when the weights are shared).

Two ways into flux_dnn, same semantics:
- the XLA FFI handler ``libflux_dnn_jax_ffi.so`` (built with flux_dnn when jaxlib's FFI headers
  are found at build time): XLA passes its own buffers, no copies, and the handler calls the
  shim through the ABI. Registered for CPU (the oneDNN shim) and, when JAX has a CUDA
  backend, for CUDA (the cuDNN shim, on JAX's stream with XLA's scratch memory as workspace);
  float32, float16, bfloat16.
- otherwise ``jax.pure_callback`` on host (NumPy) views of the arrays; float32 and float16;
  CPU arrays only (CUDA arrays raise DeviceUnavailableError rather than silently copying).

Argument errors are raised when the function is traced, as ValueError/TypeError from
flux_dnn's own checks; an error inside the vendor call at run time reaches the caller as
``jax.errors.JaxRuntimeError`` carrying flux_dnn's message.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

import flux_dnn
from flux_dnn import _conv, _core
from flux_dnn._conv import BACKWARD_DATA, BACKWARD_WEIGHT, FORWARD
from flux_dnn._discovery import DTYPES, REGISTRY
from flux_dnn._geometry import as_ints, equivalent_convolution, geometry, kept_rows

__all__ = ["conv", "conv1d", "conv2d", "conv3d", "conv_transpose", "conv_general_dilated"]

_DTYPES = DTYPES  # float64 needs jax_enable_x64
_SHIM_DEVICE = {"cpu": _core.DEVICE_CPU, "cuda": _core.DEVICE_CUDA}  # JAX platform -> its shims' device type


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
    weight array and whose result is a data array (conv, backward-data, transposed conv)."""
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


def _host_conv(nd, geo, x, w):
    def run(x, w, groups):
        return flux_dnn.conv(x, w, None, geo.stride, geo.padding(), geo.dilation, groups)

    return _host_data_weight(run, nd, geo, x, w)


def _host_backward_data(nd, geo, input_shape, dy, w):
    def run(dy, w, groups, shape):
        return flux_dnn.conv_backward_data(dy, w, shape, geo.stride, geo.padding(), geo.dilation, groups)

    return _host_data_weight(run, nd, geo, dy, w, tuple(input_shape))


def _host_backward_weight(nd, geo, weight_shape, x, dy):
    lead = np.broadcast_shapes(_lead(x, nd), _lead(dy, nd))
    if not lead:
        return flux_dnn.conv_backward_weight(x, dy, weight_shape, geo.stride, geo.padding(), geo.dilation, geo.groups)
    B = int(np.prod(lead))
    shape = (weight_shape[0] * B, *weight_shape[1:])
    dw = flux_dnn.conv_backward_weight(
        _fold_data(x, lead), _fold_data(dy, lead), shape, geo.stride, geo.padding(), geo.dilation, geo.groups * B
    )
    return dw.reshape(*lead, *weight_shape)


_HOST = {FORWARD: _host_conv, BACKWARD_DATA: _host_backward_data, BACKWARD_WEIGHT: _host_backward_weight}


# ------------------------------------------------------------------------------------------
# The XLA FFI handler (libflux_dnn_jax_ffi.so, built when jaxlib's FFI headers were found at
# build time): XLA passes its own buffers, the handler calls the shim through the ABI.

_FFI_TARGET = "flux_dnn_conv"


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
    backend, under one target name: XLA picks the registration of the platform it lowers for."""
    if "ok" not in _ffi_state:
        try:
            lib = ctypes.CDLL(_FFI_LIBRARY)
            jax.ffi.register_ffi_target(_FFI_TARGET, jax.ffi.pycapsule(lib.FluxDnnConv), platform="cpu")
            _ffi_state.update(ok=True, lib=lib, platforms=["cpu"])
        except (OSError, AttributeError) as exc:
            _ffi_state.update(ok=False, reason=f"{_FFI_LIBRARY}: {exc}")
            return False
        if _cuda_devices():
            try:  # an older handler library has no CUDA symbol: CPU still works
                capsule = jax.ffi.pycapsule(lib.FluxDnnConvCuda)
                jax.ffi.register_ffi_target(_FFI_TARGET, capsule, platform="CUDA")
                _ffi_state["platforms"].append("cuda")
            except AttributeError as exc:
                _ffi_state["cuda_reason"] = f"{_FFI_LIBRARY} has no CUDA handler: {exc}"
    return _ffi_state["ok"]


# "ffi" or "callback"; None picks the FFI handler when it is available. Tests set it.
_BACKEND = None


def _use_ffi() -> bool:
    return _BACKEND == "ffi" or (_BACKEND is None and ffi_available())


def _shim_path(platform, dtype) -> str:
    """The shim serving `platform`'s arrays of `dtype` (on the CPU: oneDNN, or the BLAS shim
    for float64); loads it (and checks its ABI) if needed, raises DeviceUnavailableError with
    the reason when it cannot work here, TypeError when no shim there computes the dtype."""
    return REGISTRY.shim_for(_SHIM_DEVICE[platform], str(dtype)).shim.path


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


def _ffi_run(out, a, b, attrs):
    """The FFI call, with the shim path of the platform it runs on (an attribute, so fixed
    when traced). Under jit the arrays are tracers: with handlers for several platforms, a
    jax.lax.platform_dependent branch per platform lets the lowering pick the right shim
    (jax.default_backend() would be wrong for arrays committed to another platform's
    device). A branch whose shim cannot work here is left out unless it is the default
    platform's, whose error (the reason the shim is missing) is the one a user must see."""
    if not ffi_available():
        raise flux_dnn.DeviceUnavailableError(f"the flux_dnn XLA FFI handler is not available: {_ffi_state['reason']}")
    call = jax.ffi.ffi_call(_FFI_TARGET, out, vmap_method="expand_dims")

    def on(platform):
        shim = _shim_path(platform, a.dtype)
        return lambda a, b: call(a, b, shim=shim, **attrs)

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


def _run(op, geo, out_shape, dtype, a, b):
    """One flux_dnn convolution op on JAX arrays: forward (x, w), backward-data (dy, w) or
    backward-weight (x, dy), with the result's (unbatched) shape known."""
    out = jax.ShapeDtypeStruct(tuple(out_shape), dtype)
    if 0 in (*a.shape, *b.shape, *out_shape):
        # Nothing to compute, and every output element sums over nothing: zeros (the CUDA
        # handler cannot clear device memory itself).
        return jnp.zeros(out.shape, dtype)
    # Kept as written until the ABI 2.0 merge sets flags=-1 (the device's default, resolved
    # by the core as flux_dnn.conv resolves it); then ruff may format it.
    if _use_ffi():
        i64 = functools.partial(np.asarray, dtype=np.int64)
        attrs = dict(
            op=np.int64(op),
            stride=i64(geo.stride),
            padding_lo=i64(geo.lo),
            padding_hi=i64(geo.hi),
            dilation=i64(geo.dilation),
            groups=np.int64(geo.groups),
            flags=np.int64(-1),
        )  # -1: the device's default flags, as flux_dnn.conv uses
        return _ffi_run(out, a, b, attrs)
    # Traced arrays: judged by the default platform (jit's choice for uncommitted arrays).
    if (_platform(a, b) or _default_platform()) != "cpu":
        raise flux_dnn.DeviceUnavailableError(
            "flux_dnn.jax runs GPU arrays through its XLA FFI handler only (the pure_callback fallback "
            f"is CPU-only), and it is not available: {_ffi_state.get('reason', 'flux_dnn.jax._BACKEND is callback')}"
        )
    nd = len(geo.stride)
    host = _HOST[op]
    fn = functools.partial(host, nd, geo) if op == FORWARD else functools.partial(host, nd, geo, tuple(out_shape))
    return jax.pure_callback(fn, out, a, b, vmap_method="expand_dims")


# ------------------------------------------------------------------------------------------
# Trace side: shapes and validation come from flux_dnn's own shape checks (the ones conv()
# and conv_transpose() run first), from shapes alone.


def _check_dtype(*arrays):
    # The dtypes of the ABI; which shim computes one (oneDNN, or the BLAS shim for float64)
    # is dispatch's choice, from what the shims report.
    for name, a in arrays:
        if str(a.dtype) not in _DTYPES:
            raise TypeError(f"{name}: flux_dnn.jax supports {', '.join(_DTYPES)} arrays, got {a.dtype}")


@functools.lru_cache(maxsize=1024)
def _probe(kind, x_shape, w_shape, geo, output_padding=None):
    # The checks and output shape of flux_dnn.conv / conv_transpose, from shapes alone: no
    # shim is asked (a GPU-only install has no CPU shim, and tracing computes nothing).
    nd = len(x_shape) - 2
    if kind == "conv":
        shape, _ = _conv.forward_shape(nd, x_shape, w_shape, geo.stride, geo.padding(), geo.dilation, geo.groups)
    else:
        shape, _ = _conv.transpose_shape(
            nd, x_shape, w_shape, geo.stride, geo.padding(), output_padding, geo.groups, geo.dilation
        )
    return shape


def _nd(x):
    return x.ndim - 2


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv_p(x, w, geo):
    shape = _probe("conv", x.shape, w.shape, geo)
    return _run(FORWARD, geo, shape, x.dtype, x, w)


def _conv_fwd(x, w, geo):
    return _conv_p(x, w, geo), (x, w)


def _conv_bwd(geo, res, dy):
    x, w = res
    return _run(BACKWARD_DATA, geo, x.shape, x.dtype, dy, w), _run(BACKWARD_WEIGHT, geo, w.shape, w.dtype, x, dy)


_conv_p.defvjp(_conv_fwd, _conv_bwd)


# A transposed convolution y = conv_transpose(x, w) is the backward-data op of the equivalent
# convolution from y's shape to x's (flux_dnn's rule, _geometry.equivalent_convolution): x's
# gradient is that convolution of dy, and w's gradient its backward-weight with input dy and
# output gradient x. Trailing rows of y that no window reaches (`trim`) are zeros in y and
# take no part in the gradients.


def _trimmed(a, trim):
    return a[(slice(None), slice(None), *kept_rows(a.shape[2:], trim))] if any(trim) else a


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _transpose_p(x, w, geo, output_padding):
    shape = _probe("transpose", x.shape, w.shape, geo, output_padding)
    cg, trim = equivalent_convolution(shape[2:], w.shape[2:], x.shape[2:], geo)
    computed = (*shape[:2], *(n - t for n, t in zip(shape[2:], trim)))
    y = _run(BACKWARD_DATA, cg, computed, x.dtype, x, w)
    return jnp.pad(y, [(0, 0), (0, 0), *((0, t) for t in trim)]) if any(trim) else y


def _transpose_fwd(x, w, geo, output_padding):
    return _transpose_p(x, w, geo, output_padding), (x, w)


def _transpose_bwd(geo, output_padding, res, dy):
    x, w = res
    cg, trim = equivalent_convolution(dy.shape[2:], w.shape[2:], x.shape[2:], geo)
    dy = _trimmed(dy, trim)
    return _run(FORWARD, cg, x.shape, x.dtype, dy, w), _run(BACKWARD_WEIGHT, cg, w.shape, w.dtype, dy, x)


_transpose_p.defvjp(_transpose_fwd, _transpose_bwd)


# ------------------------------------------------------------------------------------------
# Public entry points


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


def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Convolution of JAX arrays with ``torch.nn.functional.conv{1,2,3}d`` semantics: x
    ``(N, C, *spatial)``, w ``(K, C/groups, *kernel)``, padding an int, ints, (lo, hi) pairs,
    ``"same"`` or ``"valid"``. Differentiable in x, w and bias."""
    x, w = _arrays(x, w)
    geo = geometry(x.ndim - 2, w.shape[2:], stride, padding, dilation, groups)
    return _add_bias(_conv_p(x, w, geo), bias)


def _ranked(nd, name):
    def f(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if jnp.ndim(x) != nd + 2:
            raise ValueError(f"x: {name} expects a {nd + 2}-D array (N, C, *spatial), got shape {jnp.shape(x)}")
        return conv(x, w, bias, stride, padding, dilation, groups)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"{nd}-D :func:`conv`."
    return f


conv1d, conv2d, conv3d = (_ranked(nd, f"conv{nd}d") for nd in (1, 2, 3))


def conv_transpose(x, w, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Transposed convolution with ``torch.nn.functional.conv_transpose{1,2,3}d`` semantics:
    w ``(C_in, C_out/groups, *kernel)``. Differentiable in x, w and bias."""
    x, w = _arrays(x, w)
    nd = x.ndim - 2
    geo = geometry(nd, w.shape[2:], stride, padding, dilation, groups, transposed=True)
    output_padding = as_ints(output_padding, nd, "output_padding", 0)
    return _add_bias(_transpose_p(x, w, geo, output_padding), bias)


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
):
    """``jax.lax.conv_general_dilated`` computed by flux_dnn (lhs_dilation and
    batch_group_count other than 1 are not supported: use :func:`conv_transpose` for
    fractionally strided convolutions). ``precision`` is ignored: flux_dnn computes float32
    in float32 on CPUs."""
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    nd = lhs.ndim - 2
    if lhs_dilation is not None and any(d != 1 for d in lhs_dilation):
        raise ValueError(f"lhs_dilation: {lhs_dilation} is not supported; use flux_dnn.jax.conv_transpose")
    if batch_group_count != 1:
        raise ValueError(f"batch_group_count: only 1 is supported, got {batch_group_count}")
    if preferred_element_type is not None and jnp.dtype(preferred_element_type) != lhs.dtype:
        raise ValueError(
            f"preferred_element_type: only the input dtype {lhs.dtype} is supported, got {preferred_element_type}"
        )
    dn = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    x = jnp.transpose(lhs, dn.lhs_spec)  # to N, C, *spatial
    w = jnp.transpose(rhs, dn.rhs_spec)  # to K, C/groups, *kernel
    dilation = tuple(rhs_dilation) if rhs_dilation is not None else (1,) * nd
    if isinstance(padding, str):
        window = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], dilation)]
        padding = jax.lax.padtype_to_pads(x.shape[2:], window, window_strides, padding)
    y = conv(x, w, None, tuple(window_strides), tuple(tuple(p) for p in padding), dilation, feature_group_count)
    return jnp.transpose(y, np.argsort(dn.out_spec))
