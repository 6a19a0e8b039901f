"""Public convolution functions (thin, documented wrappers over _conv)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _conv, _core
from ._adapters import adapter_for
from ._geometry import KERNEL, SPATIAL
from ._options import DEFAULT, options

_NO_KEYWORDS = (DEFAULT, None)  # (options, out) of a call without keyword arguments
_remembered_forward = _core.remembered_forward

_COMMON_DOC = """
    Arguments follow ``torch.nn.functional.conv{nd}d``: x ``(N, C, {sp})``, w
    ``(K, C/groups, {k})``, bias ``(K,)``; cross-correlation. ``stride`` and ``dilation``
    take an int or {nd} ints; ``padding`` an int, {nd} ints, {nd} ``(lo, hi)`` pairs
    (asymmetric padding, passed to the vendor as it is), ``"same"`` or ``"valid"``.

    Keyword-only:
      activation: None, a name (``"relu"``, ``"sigmoid"``, ``"tanh"``, ``"gelu"``,
        ``"gelu_tanh"``, ``"silu"``) or ``("leaky_relu", slope)`` / ``("clip", lo, hi)``,
        fused into the vendor primitive after bias, before alpha.
      out: an existing array to write (same library, device, dtype, and the result's shape).
      alpha, beta: ``out = alpha * act(conv + bias) + beta * out`` (alpha scales the
        activated value); beta needs ``out``.
      deterministic: bitwise reproducible algorithms only (matters on GPUs; oneDNN's CPU
        convolutions are deterministic for a fixed thread count).
      allow_reduced_precision: None for the device's default (TF32 on NVIDIA as in PyTorch,
        off on CPUs); True lets oneDNN compute float32 in bfloat16 where the CPU has it.
      algorithm: ``"heuristic"`` (default), ``"benchmark"`` (time candidates once, remember
        the winner on disk), or an algorithm id reported earlier.
      workspace_limit: most bytes of scratch the vendor may use (None: no limit).

    Returns an array of x's library on x's device, in x's memory format (channels-last in,
    channels-last out), or ``out``.
"""


def _convolution_of_rank(nd: int) -> Callable[..., Any]:
    """conv{nd}d. A NumPy call pattern seen before, without keyword options, is answered by the
    core alone (_core.remembered_forward); the rest takes the Python path, which validates."""

    def convolution(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, **kwargs):
        if not kwargs:
            y = _remembered_forward(nd, x, w, bias, stride, padding, dilation, groups)
            if y is not None:
                return y
        opts, out = options("conv", kwargs) if kwargs else _NO_KEYWORDS
        return _conv.forward(nd, x, w, bias, stride, padding, dilation, groups, opts, out)

    convolution.__name__ = convolution.__qualname__ = f"conv{nd}d"
    convolution.__doc__ = f"{nd}-D convolution.\n" + _COMMON_DOC.format(nd=nd, sp=SPATIAL[nd], k=KERNEL[nd])
    return convolution


conv1d, conv2d, conv3d = (_convolution_of_rank(nd) for nd in (1, 2, 3))
_BY_RANK = {1: conv1d, 2: conv2d, 3: conv3d}


def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, **kwargs):
    """N-D convolution; the spatial rank (1, 2 or 3) comes from ``x.ndim - 2``."""
    nd = _rank_of(getattr(x, "shape", None), "x")
    return _BY_RANK[nd](x, w, bias, stride, padding, dilation, groups, **kwargs)


conv.__doc__ += "\n" + _COMMON_DOC.format(nd="N", sp="*spatial", k="*kernel")


def _rank_of(shape, name: str) -> int:
    if shape is None or len(shape) not in (3, 4, 5):
        raise ValueError(f"{name}: expected a 3-D, 4-D or 5-D array (N, C, *spatial), got shape {shape}")
    return len(shape) - 2


def conv_backward_data(dy, w, input_shape, stride=1, padding=0, dilation=1, groups=1, **kwargs):
    """Gradient of a convolution with respect to its input x (``torch.nn.grad.conv*d_input``).

    dy ``(N, K, *out)`` is the gradient of the convolution's output, w its weights
    ``(K, C/groups, *kernel)``, input_shape x's shape ``(N, C, *spatial)``; stride, padding,
    dilation and groups those of the forward convolution. Keyword-only: out, alpha, beta
    (``beta=1`` with ``out`` accumulates a gradient), deterministic, allow_reduced_precision,
    algorithm, workspace_limit as in :func:`conv2d`. Runs the vendor's backward-data primitive.
    """
    nd = _rank_of(getattr(dy, "shape", None), "dy")
    opts, out = options("conv_backward_data", kwargs) if kwargs else _NO_KEYWORDS
    return _conv.backward_data(nd, dy, w, input_shape, stride, padding, dilation, groups, opts, out)


def conv_backward_weight(x, dy, weight_shape, stride=1, padding=0, dilation=1, groups=1, *, bias_grad=False, **kwargs):
    """Gradient of a convolution with respect to its weights (``torch.nn.grad.conv*d_weight``).

    x ``(N, C, *spatial)`` is the forward input, dy ``(N, K, *out)`` the output gradient,
    weight_shape ``(K, C/groups, *kernel)``. With ``bias_grad=True`` also the bias gradient
    (dy summed over N and space) from the same vendor primitive, returned as ``(dw, db)``;
    ``out`` is then a ``(dw, db)`` pair. Other keywords as in :func:`conv_backward_data`.
    """
    nd = _rank_of(getattr(x, "shape", None), "x")
    if bias_grad:
        kwargs["bias_grad"] = bias_grad
    opts, out = options("conv_backward_weight", kwargs) if kwargs else _NO_KEYWORDS
    return _conv.backward_weight(nd, x, dy, weight_shape, stride, padding, dilation, groups, opts, out)


def conv_backward_bias(dy):
    """Gradient of a convolution's bias: dy summed over N and every spatial dim, by dy's own
    library. (``conv_backward_weight(..., bias_grad=True)`` gets it from the vendor primitive
    together with the weight gradient.)"""
    nd = _rank_of(getattr(dy, "shape", None), "dy")
    return adapter_for(dy, "dy").sum_over(dy, (0, *range(2, nd + 2)))


def conv_transpose(x, w, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, **kwargs):
    """N-D transposed convolution (``torch.nn.functional.conv_transpose*d``); rank from x.

    x ``(N, C_in, *spatial)``, w ``(C_in, C_out/groups, *kernel)``, bias ``(C_out,)``.
    ``padding`` is ints or (lo, hi) pairs; ``output_padding`` (< stride or < dilation) adds
    rows at the high end of each dim. Runs as the vendor's backward-data primitive of the
    equivalent convolution. Keywords as in :func:`conv_backward_data`.
    """
    nd = _rank_of(getattr(x, "shape", None), "x")
    return _transpose(nd, x, w, bias, stride, padding, output_padding, groups, dilation, kwargs)


def conv_transpose1d(x, w, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, **kwargs):
    return _transpose(1, x, w, bias, stride, padding, output_padding, groups, dilation, kwargs)


def conv_transpose2d(x, w, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, **kwargs):
    return _transpose(2, x, w, bias, stride, padding, output_padding, groups, dilation, kwargs)


def conv_transpose3d(x, w, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, **kwargs):
    return _transpose(3, x, w, bias, stride, padding, output_padding, groups, dilation, kwargs)


def _transpose(nd, x, w, bias, stride, padding, output_padding, groups, dilation, kwargs):
    opts, out = options("conv_transpose", kwargs) if kwargs else _NO_KEYWORDS
    return _conv.transpose(nd, x, w, bias, stride, padding, output_padding, groups, dilation, opts, out)


for _nd, _f in ((1, conv_transpose1d), (2, conv_transpose2d), (3, conv_transpose3d)):
    _f.__doc__ = f"{_nd}-D transposed convolution; see :func:`conv_transpose`."


def conv_plan(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, **kwargs) -> _conv.ConvPlan:
    """A reusable forward convolution for inputs like x (same shape, dtype, layout, device):
    the arguments are checked and the weights packed into the vendor's layout once, so each
    ``plan(x)`` (or ``plan(x, out=y)``) is a single vendor call. Arguments as in
    :func:`conv`, without ``out`` and ``beta``. The rank comes from x."""
    nd = _rank_of(getattr(x, "shape", None), "x")
    return _conv.ConvPlan(nd, x, w, bias, stride, padding, dilation, groups, options("conv_plan", kwargs)[0])


def plan_cache_info() -> dict:
    """Hits, misses, evictions, size and capacity of the plan cache shared by all shims."""
    return _core.plan_cache_info()


def set_plan_cache_capacity(capacity: int) -> None:
    """Bound the plan cache (0 turns caching off); evicts least recently used plans."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity: expected an int >= 0, got {capacity!r}")
    _core.set_plan_cache_capacity(capacity)


def clear_plan_cache() -> None:
    """Drop every cached plan (statistics are kept)."""
    _core.clear_plan_cache()
