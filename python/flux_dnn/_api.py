"""Public convolution functions (thin, documented wrappers over _conv)."""

from __future__ import annotations

from . import _conv, _core

_COMMON_DOC = """
    Arguments follow ``torch.nn.functional.conv{nd}d``: x ``(N, C, {sp})``, w
    ``(K, C/groups, {k})``, bias ``(K,)``; cross-correlation. ``stride`` and ``dilation``
    take an int or {nd} ints; ``padding`` an int, {nd} ints, {nd} ``(lo, hi)`` pairs
    (asymmetric padding, passed to the vendor as it is), ``"same"`` or ``"valid"``.

    Keyword-only:
      activation: None, a name (``"relu"``, ``"sigmoid"``, ``"tanh"``, ``"gelu"``,
        ``"gelu_tanh"``, ``"silu"``) or ``("leaky_relu", slope)`` / ``("clip", lo, hi)``,
        fused into the vendor primitive after bias and alpha.
      out: an existing array to write (same library, device, dtype, and the result's shape).
      alpha, beta: ``out = alpha * act(conv + bias) ... + beta * out``; beta needs ``out``.
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


def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, **kwargs):
    """N-D convolution; the spatial rank (1, 2 or 3) comes from ``x.ndim - 2``."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) not in (3, 4, 5):
        raise ValueError(f"x: conv expects a 3-D, 4-D or 5-D array (N, C, *spatial), got shape {shape}")
    return _conv.forward(len(shape) - 2, x, w, bias, stride, padding, dilation, groups, **kwargs)


def conv1d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, **kwargs):
    return _conv.forward(1, x, w, bias, stride, padding, dilation, groups, **kwargs)


def conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, **kwargs):
    return _conv.forward(2, x, w, bias, stride, padding, dilation, groups, **kwargs)


def conv3d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, **kwargs):
    return _conv.forward(3, x, w, bias, stride, padding, dilation, groups, **kwargs)


for _nd, _f in ((1, conv1d), (2, conv2d), (3, conv3d)):
    _f.__doc__ = f"{_nd}-D convolution.\n" + _COMMON_DOC.format(nd=_nd, sp=_conv._SPATIAL[_nd], k=_conv._KERNEL[_nd])
conv.__doc__ += "\n" + _COMMON_DOC.format(nd="N", sp="*spatial", k="*kernel")


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
