"""flux_dnn as PyTorch's convolution backend.

``flux_dnn.torch.conv2d(x, w)`` and friends are PyTorch custom operators (``torch.ops.flux_dnn``)
with autograd through flux_dnn's own backward ops and fake implementations, so they work in
eager mode, under ``torch.no_grad``/``inference_mode``, and inside ``torch.compile``. (Eager
calls skip the custom-op dispatcher through an equivalent ``torch.autograd.Function`` with the
same kernels and gradient formulas: the dispatcher's Python costs as much as a small conv.)
``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d`` are drop-in ``torch.nn`` modules, and
``convert(model)`` switches a model's convolutions to flux_dnn in place.

Every tensor goes through flux_dnn's device dispatch: CPU tensors to the oneDNN shim, CUDA
tensors to the cuDNN shim (on torch's current stream); nothing here is vendor-specific.

Not supported: second derivatives through these ops (they raise) and torch.func transforms.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

import flux_dnn
from flux_dnn import _conv
from flux_dnn._geometry import (
    Geometry,
    as_int,
    as_ints,
    channels_last_order,
    compact_strides,
    equivalent_convolution,
    geometry,
    is_channels_last,
    kept_rows,
    output_size,
    transposed_output_sizes,
)
from flux_dnn._options import options

__all__ = [
    "conv",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "convert",
]

# ------------------------------------------------------------------------------------------
# Layout helpers shared by the real and the fake implementations, so both agree on strides.


def _dense(t: Tensor | None) -> Tensor | None:
    """t itself if flux_dnn can take its strides (contiguous or channels-last), else a copy.
    Gradients arriving from autograd are often expanded (stride 0) views."""
    if t is None or t.is_contiguous() or is_channels_last(tuple(t.shape), t.stride()):
        return t
    return t.contiguous()


def _empty_like_layout(like: Tensor, shape) -> Tensor:
    """An uninitialised tensor of ``shape`` in ``like``'s memory format (channels-last or not),
    the same rule flux_dnn uses for the outputs it allocates."""
    shape = list(shape)
    if is_channels_last(tuple(like.shape), like.stride()) and len(shape) >= 3:
        strides = compact_strides(shape, channels_last_order(len(shape)))
        return torch.empty_strided(shape, strides, dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _pairs(lo, hi):
    return tuple(zip(lo, hi))  # hashable, like every argument below: flux_dnn then memoises the call


# ------------------------------------------------------------------------------------------
# Options. A call's flux_dnn options travel through the kernels (and the custom operators'
# schemas) as one int, `policy`: DETERMINISTIC | BENCHMARK | REDUCED_OFF or REDUCED_ON (neither:
# the device's default). They come from the explicit options of the function or module, else
# from PyTorch's own flags, read at each call (a few attribute reads):
#   CUDA and ROCm tensors: torch.backends.cudnn.benchmark (algorithm="benchmark"),
#     .deterministic or torch.use_deterministic_algorithms (deterministic=True), and on CUDA
#     .allow_tf32 = False (allow_reduced_precision=False; PyTorch applies the cudnn flags to
#     MIOpen too, and TF32 has no ROCm meaning);
#   CPU tensors: torch.use_deterministic_algorithms or torch.backends.mkldnn.deterministic,
#     and torch.backends.mkldnn.conv.fp32_precision = "bf16" (or inherited from
#     mkldnn.fp32_precision / torch.backends.fp32_precision), which lets oneDNN compute float32
#     convolutions in bfloat16 (allow_reduced_precision=True). torch.set_float32_matmul_precision
#     governs matmuls only, in PyTorch as here;
#   XPU tensors (Intel GPUs, oneDNN in PyTorch too): the mkldnn flags as on the CPU, with
#     fp32_precision "tf32" also lowering float32 (unverified: no XPU here).
# Under torch.compile the flags are read when the graph is compiled.

DETERMINISTIC, BENCHMARK, REDUCED_OFF, REDUCED_ON = 1, 2, 4, 8


def _options_of(policy: int, bias_grad: bool):
    reduced = {REDUCED_OFF: False, REDUCED_ON: True}.get(policy & (REDUCED_OFF | REDUCED_ON))
    kwargs = {
        "deterministic": bool(policy & DETERMINISTIC),
        "algorithm": "benchmark" if policy & BENCHMARK else "heuristic",
        "allow_reduced_precision": reduced,
        "bias_grad": bias_grad,
    }
    return options("conv_backward_weight", kwargs)[0]


# The kernels' flux_dnn options by (policy, bias_grad), made once (not per call).
_OPTIONS = {
    (d | b | r, bias_grad): _options_of(d | b | r, bias_grad)
    for d in (0, DETERMINISTIC)
    for b in (0, BENCHMARK)
    for r in (0, REDUCED_OFF, REDUCED_ON)
    for bias_grad in (False, True)
}


def _cpu_fp32_precision() -> str:
    """The float32 precision PyTorch's oneDNN convolutions use: mkldnn.conv's, else inherited."""
    backends = torch.backends
    for level in (backends.mkldnn.conv, backends.mkldnn, backends):
        value = getattr(level, "fp32_precision", "none")
        if value != "none":
            return value
    return "none"


@torch.compiler.assume_constant_result  # torch.compile reads the flags when it compiles
def _flags(device_type: str) -> tuple:
    """(deterministic, benchmark, allow_reduced_precision) as PyTorch's flags set them for a
    device type."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    if device_type == "cpu":
        reduced = True if _cpu_fp32_precision() == "bf16" else None
        return deterministic or torch.backends.mkldnn.deterministic, False, reduced
    if device_type == "xpu":
        # PyTorch's XPU convolutions are oneDNN's, governed by the mkldnn flags (deterministic
        # since pytorch/pytorch#127277; fp32_precision "bf16" or "tf32" lowers float32). From
        # PyTorch's sources and docs; not run here (no XPU).
        reduced = True if _cpu_fp32_precision() in ("bf16", "tf32") else None
        return deterministic or torch.backends.mkldnn.deterministic, False, reduced
    cudnn = torch.backends.cudnn
    reduced = None if (torch.version.hip or cudnn.allow_tf32) else False
    return deterministic or cudnn.deterministic, cudnn.benchmark, reduced


def _policy(x: Tensor, explicit: tuple) -> int:
    """The policy of a call on x's device: explicit (algorithm, deterministic,
    allow_reduced_precision), each None to follow PyTorch's flags."""
    algorithm, deterministic, reduced = explicit
    flag_det, flag_bench, flag_reduced = _flags(x.device.type)
    if deterministic is None:
        deterministic = flag_det
    if algorithm is None:
        algorithm = "benchmark" if flag_bench else "heuristic"
    if reduced is None:
        reduced = flag_reduced
    policy = (DETERMINISTIC if deterministic else 0) | (BENCHMARK if algorithm == "benchmark" else 0)
    return policy | ({False: REDUCED_OFF, True: REDUCED_ON}[reduced] if reduced is not None else 0)


_FOLLOW = (None, None, None)  # every option from PyTorch's flags


def _explicit(algorithm=None, deterministic=None, allow_reduced_precision=None) -> tuple:
    """The explicit options, checked: each None (follow PyTorch's flags) or flux_dnn's value."""
    if algorithm is None and deterministic is None and allow_reduced_precision is None:
        return _FOLLOW
    if algorithm not in (None, "heuristic", "benchmark"):
        raise ValueError(f"algorithm: expected None (PyTorch's flags), 'heuristic' or 'benchmark', got {algorithm!r}")
    for name, value in (("deterministic", deterministic), ("allow_reduced_precision", allow_reduced_precision)):
        if value not in (None, True, False):
            raise TypeError(f"{name}: expected None (PyTorch's flags), True or False, got {value!r}")
    as_bool = lambda v: None if v is None else bool(v)  # noqa: E731
    found = (algorithm, as_bool(deterministic), as_bool(allow_reduced_precision))
    return _FOLLOW if found == _FOLLOW else found


# ------------------------------------------------------------------------------------------
# Kernels: plain functions calling flux_dnn, each registered below as a custom operator with a
# fake implementation. Parameters arrive normalised (lists of ints, padding as lo/hi lists).
# flux_dnn allocates the results in x's (dy's) memory format, the rule the fake
# implementations follow; opcheck in the tests compares their strides.


def _conv_impl(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding_lo: list[int],
    padding_hi: list[int],
    dilation: list[int],
    groups: int,
    policy: int,
) -> Tensor:
    x, w, bias = _dense(x), _dense(w), _dense(bias)
    padding = _pairs(padding_lo, padding_hi)
    options = _OPTIONS[policy, False]
    return _conv.forward(x.dim() - 2, x, w, bias, tuple(stride), padding, tuple(dilation), groups, options)


def _conv_op_fake(x, w, bias, stride, padding_lo, padding_hi, dilation, groups, policy):
    sp = [
        output_size(x.shape[i + 2], w.shape[i + 2], stride[i], dilation[i], padding_lo[i], padding_hi[i])
        for i in range(x.dim() - 2)
    ]
    return _empty_like_layout(_dense(x), [x.shape[0], w.shape[0], *sp])


def _bwd_data_impl(
    dy: Tensor,
    w: Tensor,
    input_shape: list[int],
    stride: list[int],
    padding_lo: list[int],
    padding_hi: list[int],
    dilation: list[int],
    groups: int,
    policy: int,
) -> Tensor:
    dy, w = _dense(dy), _dense(w)
    padding = _pairs(padding_lo, padding_hi)
    options = _OPTIONS[policy, False]
    return _conv.backward_data(
        dy.dim() - 2, dy, w, tuple(input_shape), tuple(stride), padding, tuple(dilation), groups, options
    )


def _bwd_data_fake(dy, w, input_shape, stride, padding_lo, padding_hi, dilation, groups, policy):
    return _empty_like_layout(_dense(dy), input_shape)


def _bwd_weight_impl(
    x: Tensor,
    dy: Tensor,
    weight_shape: list[int],
    stride: list[int],
    padding_lo: list[int],
    padding_hi: list[int],
    dilation: list[int],
    groups: int,
    bias_grad: bool,
    policy: int,
) -> tuple[Tensor, Tensor]:
    """(dw, db); db is an empty tensor unless bias_grad (an op returns a fixed number of tensors)."""
    x, dy = _dense(x), _dense(dy)
    # flux_dnn allocates dw (and db) contiguous, as the fake implementation below does.
    padding = _pairs(padding_lo, padding_hi)
    options = _OPTIONS[policy, bias_grad]
    res = _conv.backward_weight(
        x.dim() - 2, x, dy, tuple(weight_shape), tuple(stride), padding, tuple(dilation), groups, options
    )
    return (res[0], res[1]) if bias_grad else (res, dy.new_empty(0))


def _bwd_weight_fake(x, dy, weight_shape, stride, padding_lo, padding_hi, dilation, groups, bias_grad, policy):
    db = dy.new_empty(weight_shape[0] if bias_grad else 0)
    return x.new_empty(weight_shape), db


def _bwd_bias_impl(dy: Tensor) -> Tensor:
    return flux_dnn.conv_backward_bias(_dense(dy))


def _bwd_bias_fake(dy):
    return dy.new_empty(dy.shape[1])


def _conv_transpose_impl(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    output_padding: list[int],
    dilation: list[int],
    groups: int,
    policy: int,
) -> Tensor:
    x, w, bias = _dense(x), _dense(w), _dense(bias)
    options = _OPTIONS[policy, False]
    return _conv.transpose(
        x.dim() - 2, x, w, bias, tuple(stride), tuple(padding), tuple(output_padding), groups, tuple(dilation), options
    )


def _conv_transpose_fake(x, w, bias, stride, padding, output_padding, dilation, groups, policy):
    geo = Geometry(tuple(stride), tuple(padding), tuple(padding), tuple(dilation), groups)
    sp = transposed_output_sizes(x.shape[2:], w.shape[2:], geo, output_padding)
    return _empty_like_layout(_dense(x), [x.shape[0], w.shape[1] * groups, *sp])


def _custom_op(name, impl, fake):
    op = torch.library.custom_op(f"flux_dnn::{name}", impl, mutates_args=())
    op.register_fake(fake)
    return op


_conv_op = _custom_op("conv", _conv_impl, _conv_op_fake)
_bwd_data_op = _custom_op("conv_backward_data", _bwd_data_impl, _bwd_data_fake)
_bwd_weight_op = _custom_op("conv_backward_weight", _bwd_weight_impl, _bwd_weight_fake)
_bwd_bias_op = _custom_op("conv_backward_bias", _bwd_bias_impl, _bwd_bias_fake)
_conv_transpose_op = _custom_op("conv_transpose", _conv_transpose_impl, _conv_transpose_fake)


class _Kernels(NamedTuple):
    conv: object
    bwd_data: object
    bwd_weight: object
    bwd_bias: object
    conv_transpose: object


# What the gradient formulas call: the custom operators while torch.compile traces (they have
# fake implementations), the plain kernels in eager mode, where the custom-op machinery would
# add a few hundred microseconds of Python per call (as much as a small convolution).
_OPS = _Kernels(_conv_op, _bwd_data_op, _bwd_weight_op, _bwd_bias_op, _conv_transpose_op)
_EAGER = _Kernels(_conv_impl, _bwd_data_impl, _bwd_weight_impl, _bwd_bias_impl, _conv_transpose_impl)


# ------------------------------------------------------------------------------------------
# Autograd: the gradients of a convolution are flux_dnn's backward-data / backward-weight ops;
# those of a transposed convolution are a forward convolution and backward-weight with the
# roles of input and output exchanged.


def _conv_setup(ctx, inputs, output):
    x, w, bias, *params = inputs
    ctx.save_for_backward(x, w)
    ctx.params = params  # stride, padding_lo, padding_hi, dilation, groups, policy


def _conv_grads(k: _Kernels, ctx, dy):
    x, w = ctx.saved_tensors
    stride, lo, hi, dilation, groups, det = ctx.params
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx = dw = db = None
    if need_x:
        dx = k.bwd_data(dy, w, list(x.shape), stride, lo, hi, dilation, groups, det)
    if need_w or need_b:
        dw, db = k.bwd_weight(x, dy, list(w.shape), stride, lo, hi, dilation, groups, need_b, det)
    return dx, (dw if need_w else None), (db if need_b else None), None, None, None, None, None, None


_conv_op.register_autograd(lambda ctx, dy: _conv_grads(_OPS, ctx, dy), setup_context=_conv_setup)


def _transpose_setup(ctx, inputs, output):
    x, w, bias, *params = inputs
    ctx.save_for_backward(x, w)
    ctx.params = params  # stride, padding, output_padding, dilation, groups, policy


def _transpose_grads(k: _Kernels, ctx, dy):
    x, w = ctx.saved_tensors
    stride, padding, _, dilation, groups, det = ctx.params
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx = dw = None
    db = k.bwd_bias(dy) if need_b else None  # every row of y has the bias, trimmed ones too
    # y = conv_transpose(x, w) is backward-data of the equivalent convolution from y's shape
    # to x's (flux_dnn's rule), which reads no row it trims off y.
    geo = Geometry(tuple(stride), tuple(padding), tuple(padding), tuple(dilation), groups)
    conv_geo, trim = equivalent_convolution(dy.shape[2:], w.shape[2:], x.shape[2:], geo)
    if any(trim):
        dy = dy[(slice(None), slice(None), *kept_rows(dy.shape[2:], trim))]
        if 0 in dy.shape[2:]:  # no row of y is within a window's reach: y is zeros
            return (
                (x.new_zeros(x.shape) if need_x else None),
                (w.new_zeros(w.shape) if need_w else None),
                db,
                *[None] * 6,
            )
    lo, hi = list(conv_geo.lo), list(conv_geo.hi)
    if need_x:
        dx = k.conv(dy, w, None, stride, lo, hi, dilation, groups, det)
    if need_w:  # that convolution's backward-weight, with input dy and output gradient x
        dw, _ = k.bwd_weight(dy, x, list(w.shape), stride, lo, hi, dilation, groups, False, det)
    return dx, dw, db, None, None, None, None, None, None


_conv_transpose_op.register_autograd(lambda ctx, dy: _transpose_grads(_OPS, ctx, dy), setup_context=_transpose_setup)


# Eager mode: the same kernels and gradient formulas without the custom-op dispatch. The
# forward takes ctx itself (no separate setup_context) because Function.apply binds the
# arguments of a setup_context-style forward through inspect.signature on every call.
# The backward ops have no gradients of their own: once_differentiable makes a second
# derivative (create_graph=True) raise instead of silently missing these terms.


class _ConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, *params):
        _conv_setup(ctx, (x, w, bias, *params), None)
        return _conv_impl(x, w, bias, *params)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return _conv_grads(_EAGER, ctx, dy)


class _ConvTransposeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, *params):
        _transpose_setup(ctx, (x, w, bias, *params), None)
        return _conv_transpose_impl(x, w, bias, *params)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return _transpose_grads(_EAGER, ctx, dy)


# Tests set this to run eager calls through the custom operators as well.
_EAGER_CUSTOM_OPS = False


def _use_custom_ops() -> bool:
    # torch.func transforms (grad, vmap) are not supported by either path: flux_dnn needs
    # tensors with storage, which functorch's wrapped tensors lack.
    return _EAGER_CUSTOM_OPS or torch.compiler.is_compiling()


def _run_conv(*args):
    return _conv_op(*args) if _use_custom_ops() else _ConvFunction.apply(*args)


def _run_conv_transpose(*args):
    return _conv_transpose_op(*args) if _use_custom_ops() else _ConvTransposeFunction.apply(*args)


# ------------------------------------------------------------------------------------------
# Functional API (torch.nn.functional signatures)


def _autocast(device_type: str, *tensors):
    """Cast floating tensors to the autocast dtype when autocast is on: autocast does not know
    our operators, and torch.nn.functional convolutions run in the lower precision there."""
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def _batched(x: Tensor, nd: int, name: str):
    """(x with a batch dim, whether one was added): torch.nn accepts unbatched (C, *spatial)."""
    if x.dim() == nd + 1:
        return x.unsqueeze(0), True
    if x.dim() != nd + 2:
        raise ValueError(
            f"{name}: a {nd}-D convolution expects a {nd + 1}-D (unbatched) or {nd + 2}-D "
            f"(batched) tensor, got shape {tuple(x.shape)}"
        )
    return x, False


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def _conv_nd(nd, x, w, bias, stride, padding, dilation, groups, explicit=_FOLLOW):
    _check_tensor(x, "x")
    _check_tensor(w, "w")
    x, unbatched = _batched(x, nd, "x")
    if w.dim() != nd + 2:
        raise ValueError(
            f"w: a {nd}-D convolution expects a {nd + 2}-D weight (K, C/groups, *kernel), got shape {tuple(w.shape)}"
        )
    params = _conv_params(nd, w.shape[2:], stride, padding, dilation, groups)
    x, w, bias = _autocast(x.device.type, x, w, bias)
    y = _run_conv(x, w, bias, *params, _policy(x, explicit))
    return y.squeeze(0) if unbatched else y


_params: dict = {}


def _conv_params(nd, kernel, stride, padding, dilation, groups) -> tuple:
    """(stride, padding_lo, padding_hi, dilation, groups) of the conv kernel from the user's
    arguments, checked; remembered for hashable arguments (the lists are shared: read only)."""
    key = (nd, kernel, stride, padding, dilation, groups)
    try:
        return _params[key]
    except KeyError:
        pass
    except TypeError:  # a list argument
        key = None
    geo = geometry(nd, tuple(kernel), stride, padding, dilation, groups)
    params = (list(geo.stride), list(geo.lo), list(geo.hi), list(geo.dilation), geo.groups)
    if key is not None:
        if len(_params) >= 1024:
            _params.clear()
        _params[key] = params
    return params


def conv(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    *,
    algorithm=None,
    deterministic=None,
    allow_reduced_precision=None,
):
    """N-D convolution with autograd; the spatial rank comes from w (``w.dim() - 2``).

    The keyword options, each None to follow PyTorch's flags at the call (see the module's
    notes on options): algorithm ("heuristic" or "benchmark"), deterministic and
    allow_reduced_precision, as flux_dnn.conv takes them."""
    _check_tensor(w, "w")
    return _conv_nd(
        w.dim() - 2,
        x,
        w,
        bias,
        stride,
        padding,
        dilation,
        groups,
        _explicit(algorithm, deterministic, allow_reduced_precision),
    )


def conv1d(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    *,
    algorithm=None,
    deterministic=None,
    allow_reduced_precision=None,
):
    """``torch.nn.functional.conv1d`` on flux_dnn, with autograd (options: :func:`conv`)."""
    return _conv_nd(
        1, x, w, bias, stride, padding, dilation, groups, _explicit(algorithm, deterministic, allow_reduced_precision)
    )


def conv2d(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    *,
    algorithm=None,
    deterministic=None,
    allow_reduced_precision=None,
):
    """``torch.nn.functional.conv2d`` on flux_dnn, with autograd (options: :func:`conv`)."""
    return _conv_nd(
        2, x, w, bias, stride, padding, dilation, groups, _explicit(algorithm, deterministic, allow_reduced_precision)
    )


def conv3d(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    *,
    algorithm=None,
    deterministic=None,
    allow_reduced_precision=None,
):
    """``torch.nn.functional.conv3d`` on flux_dnn, with autograd (options: :func:`conv`)."""
    return _conv_nd(
        3, x, w, bias, stride, padding, dilation, groups, _explicit(algorithm, deterministic, allow_reduced_precision)
    )


def _conv_transpose_nd(nd, x, w, bias, stride, padding, output_padding, groups, dilation, explicit=_FOLLOW):
    _check_tensor(x, "x")
    _check_tensor(w, "w")
    x, unbatched = _batched(x, nd, "x")
    if w.dim() != nd + 2:
        raise ValueError(
            f"w: a {nd}-D transposed convolution expects a {nd + 2}-D weight "
            f"(C_in, C_out/groups, *kernel), got shape {tuple(w.shape)}"
        )
    stride = list(as_ints(stride, nd, "stride", 1))
    dilation = list(as_ints(dilation, nd, "dilation", 1))
    padding = list(as_ints(padding, nd, "padding", 0))
    output_padding = list(as_ints(output_padding, nd, "output_padding", 0))
    x, w, bias = _autocast(x.device.type, x, w, bias)
    y = _run_conv_transpose(
        x, w, bias, stride, padding, output_padding, dilation, as_int(groups, "groups"), _policy(x, explicit)
    )
    return y.squeeze(0) if unbatched else y


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
    algorithm=None,
    deterministic=None,
    allow_reduced_precision=None,
):
    """N-D transposed convolution with autograd; the spatial rank comes from w (options: :func:`conv`)."""
    _check_tensor(w, "w")
    return _conv_transpose_nd(
        w.dim() - 2,
        x,
        w,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        _explicit(algorithm, deterministic, allow_reduced_precision),
    )


def conv_transpose1d(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    output_padding=0,
    groups=1,
    dilation=1,
    *,
    algorithm=None,
    deterministic=None,
    allow_reduced_precision=None,
):
    """``torch.nn.functional.conv_transpose1d`` on flux_dnn, with autograd (options: :func:`conv`)."""
    return _conv_transpose_nd(
        1,
        x,
        w,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        _explicit(algorithm, deterministic, allow_reduced_precision),
    )


def conv_transpose2d(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    output_padding=0,
    groups=1,
    dilation=1,
    *,
    algorithm=None,
    deterministic=None,
    allow_reduced_precision=None,
):
    """``torch.nn.functional.conv_transpose2d`` on flux_dnn, with autograd (options: :func:`conv`)."""
    return _conv_transpose_nd(
        2,
        x,
        w,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        _explicit(algorithm, deterministic, allow_reduced_precision),
    )


def conv_transpose3d(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    output_padding=0,
    groups=1,
    dilation=1,
    *,
    algorithm=None,
    deterministic=None,
    allow_reduced_precision=None,
):
    """``torch.nn.functional.conv_transpose3d`` on flux_dnn, with autograd (options: :func:`conv`)."""
    return _conv_transpose_nd(
        3,
        x,
        w,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        _explicit(algorithm, deterministic, allow_reduced_precision),
    )


# ------------------------------------------------------------------------------------------
# Modules: subclasses of the torch.nn ones, so constructor, parameters, state_dict keys,
# repr and padding_mode are torch's own; only the convolution call changes.


class _FluxOptions:
    """The explicit flux_dnn options of a module (constructor keywords, or convert()'s):
    (algorithm, deterministic, allow_reduced_precision), each None to follow PyTorch's flags."""

    flux_options = _FOLLOW  # a module made by convert() without options

    def __init__(self, *args, algorithm=None, deterministic=None, allow_reduced_precision=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.flux_options = _explicit(algorithm, deterministic, allow_reduced_precision)


class _FluxConv(_FluxOptions):
    _nd: int

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        opts = self.flux_options
        if self.padding_mode != "zeros":  # as torch does: pad explicitly, then convolve unpadded
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return _conv_nd(self._nd, input, weight, bias, self.stride, 0, self.dilation, self.groups, opts)
        return _conv_nd(self._nd, input, weight, bias, self.stride, self.padding, self.dilation, self.groups, opts)


class Conv1d(_FluxConv, torch.nn.Conv1d):
    """``torch.nn.Conv1d`` computed by flux_dnn."""

    _nd = 1


class Conv2d(_FluxConv, torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by flux_dnn."""

    _nd = 2


class Conv3d(_FluxConv, torch.nn.Conv3d):
    """``torch.nn.Conv3d`` computed by flux_dnn."""

    _nd = 3


class _FluxConvTranspose(_FluxOptions):
    _nd: int

    def forward(self, input: Tensor, output_size: list[int] | None = None) -> Tensor:
        if self.padding_mode != "zeros":
            raise ValueError(f"Only `zeros` padding mode is supported for {type(self).__name__}")
        output_padding = self._output_padding(
            input, output_size, self.stride, self.padding, self.kernel_size, self._nd, self.dilation
        )
        return _conv_transpose_nd(
            self._nd,
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            output_padding,
            self.groups,
            self.dilation,
            self.flux_options,
        )


class ConvTranspose1d(_FluxConvTranspose, torch.nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` computed by flux_dnn."""

    _nd = 1


class ConvTranspose2d(_FluxConvTranspose, torch.nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` computed by flux_dnn."""

    _nd = 2


class ConvTranspose3d(_FluxConvTranspose, torch.nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` computed by flux_dnn."""

    _nd = 3


_SWAP = {
    torch.nn.Conv1d: Conv1d,
    torch.nn.Conv2d: Conv2d,
    torch.nn.Conv3d: Conv3d,
    torch.nn.ConvTranspose1d: ConvTranspose1d,
    torch.nn.ConvTranspose2d: ConvTranspose2d,
    torch.nn.ConvTranspose3d: ConvTranspose3d,
}


def convert(
    model: torch.nn.Module, *, algorithm=None, deterministic=None, allow_reduced_precision=None
) -> torch.nn.Module:
    """Make every ``torch.nn.Conv*``/``ConvTranspose*`` in ``model`` (itself included) compute with
    flux_dnn, in place, and return ``model``.

    Only the class changes: parameters, buffers, hooks and device stay the very same objects,
    so an optimizer built before ``convert`` keeps working. Subclasses of the torch modules
    (user layers with their own forward) are left alone. The options (as :func:`conv`'s), when
    given, hold for every converted module; None follows PyTorch's flags at each call.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    explicit = _explicit(algorithm, deterministic, allow_reduced_precision)
    for module in model.modules():
        flux_class = _SWAP.get(type(module))
        if flux_class is not None:
            module.__class__ = flux_class
            if explicit != _FOLLOW:
                module.flux_options = explicit
    return model
