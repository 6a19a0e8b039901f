"""The geometry of a convolution, written once for flux_dnn, flux_dnn.torch and flux_dnn.jax.

The rules for stride, dilation and padding arguments, output sizes, the convolution that a
transposed convolution is the backward-data op of, and memory formats (compact strides,
channels-last). Every rule raises ValueError or TypeError naming the argument, its value and
what is allowed.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

SPATIAL = {1: "W", 2: "H, W", 3: "D, H, W"}  # names of the spatial dims, for messages
KERNEL = {1: "S", 2: "R, S", 3: "T, R, S"}


# ------------------------------------------------------------------------------------------
# Arguments


def as_int(value, name: str) -> int:
    """An integer (not a bool, not a float); TypeError naming the argument otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {value!r}") from None


def as_ints(value, nd: int, name: str, minimum: int) -> tuple:
    """An int or a sequence of nd ints, each >= minimum, as nd ints."""
    if isinstance(value, (list, tuple)):
        if len(value) != nd:
            raise ValueError(f"{name}: expected an int or {nd} ints for a {nd}-D convolution, got {value!r}")
        out = tuple(as_int(v, name) for v in value)
    else:
        out = (as_int(value, name),) * nd
    if any(v < minimum for v in out):
        raise ValueError(f"{name}: every value must be >= {minimum}, got {value!r}")
    return out


def as_groups(groups) -> int:
    groups = as_int(groups, "groups")
    if groups < 1:
        raise ValueError(f"groups: must be >= 1, got {groups}")
    return groups


def padding_lo_hi(padding, nd: int, stride: tuple, dilation: tuple, kernel: tuple) -> tuple:
    """(lo, hi) per spatial dim from an int, nd ints, nd (lo, hi) pairs, 'same' or 'valid'."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * nd, (0,) * nd
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"padding: 'same' needs stride 1 (as in PyTorch), got stride {stride}")
            total = [d * (k - 1) for d, k in zip(dilation, kernel)]
            lo = tuple(t // 2 for t in total)
            return lo, tuple(t - low for t, low in zip(total, lo))
        raise ValueError(f"padding: expected an int, a tuple, per-side pairs, 'same' or 'valid', got {padding!r}")
    if isinstance(padding, (list, tuple)) and padding and all(isinstance(p, (list, tuple)) for p in padding):
        if len(padding) != nd or any(len(p) != 2 for p in padding):
            raise ValueError(f"padding: per-side padding needs {nd} (lo, hi) pairs, got {padding!r}")
        lo = tuple(as_int(p[0], "padding") for p in padding)
        hi = tuple(as_int(p[1], "padding") for p in padding)
    else:
        lo = hi = as_ints(padding, nd, "padding", minimum=-(1 << 62))
    if any(v < 0 for v in lo + hi):
        raise ValueError(f"padding: must be >= 0, got {padding!r}")
    return lo, hi


class Geometry(NamedTuple):
    """Stride, padding, dilation and groups of one convolution, checked and per spatial dim
    (hashable: a static argument under jax.jit)."""

    stride: tuple
    lo: tuple
    hi: tuple
    dilation: tuple
    groups: int

    def padding(self) -> tuple:
        """The (lo, hi) pairs flux_dnn takes as padding."""
        return tuple(zip(self.lo, self.hi))


def geometry(nd: int, kernel: tuple, stride, padding, dilation, groups, transposed: bool = False) -> Geometry:
    """The checked geometry of an nd-D convolution with a kernel of spatial sizes `kernel`
    from the user's arguments. A transposed convolution takes no 'same' or 'valid'."""
    if transposed and isinstance(padding, str):
        raise ValueError(f"padding: a transposed convolution takes ints or (lo, hi) pairs, not {padding!r}")
    stride = as_ints(stride, nd, "stride", 1)
    dilation = as_ints(dilation, nd, "dilation", 1)
    lo, hi = padding_lo_hi(padding, nd, stride, dilation, tuple(kernel))
    return Geometry(stride, lo, hi, dilation, as_groups(groups))


def output_padding(value, nd: int, geo: Geometry) -> tuple:
    """A transposed convolution's output_padding: each below stride or dilation (as PyTorch)."""
    out = as_ints(value, nd, "output_padding", 0)
    if any(p >= s and p >= d for p, s, d in zip(out, geo.stride, geo.dilation)):
        raise ValueError(
            f"output_padding: {out} must be smaller than stride {geo.stride} "
            f"or dilation {geo.dilation} in every dim (as in PyTorch)"
        )
    return out


# ------------------------------------------------------------------------------------------
# Sizes


def output_size(size: int, kernel: int, stride: int, dilation: int, lo: int, hi: int) -> int:
    """One spatial size of a convolution's output."""
    return (size + lo + hi - dilation * (kernel - 1) - 1) // stride + 1


def output_sizes(in_sp: tuple, kernel: tuple, geo: Geometry, x_name: str = "x") -> tuple:
    """The spatial sizes of a convolution's output; ValueError when a dilated kernel does not
    fit the padded input."""
    out = []
    for i, (size, k) in enumerate(zip(in_sp, kernel)):
        extent = geo.dilation[i] * (k - 1) + 1
        padded = size + geo.lo[i] + geo.hi[i]
        if padded < extent:
            raise ValueError(
                f"w: the effective kernel size {extent} (kernel {k}, dilation {geo.dilation[i]}) "
                f"of spatial dim {i} is larger than the padded input size {padded} "
                f"({x_name} size {size} + padding {geo.lo[i]} + {geo.hi[i]})"
            )
        out.append(output_size(size, k, geo.stride[i], geo.dilation[i], geo.lo[i], geo.hi[i]))
    return tuple(out)


def transposed_output_sizes(in_sp: tuple, kernel: tuple, geo: Geometry, out_padding: tuple) -> tuple:
    """The spatial sizes of a transposed convolution's output (may be < 1: the caller says
    which argument is wrong)."""
    return tuple(
        (n - 1) * s - lo - hi + d * (k - 1) + p + 1
        for n, k, s, d, lo, hi, p in zip(in_sp, kernel, geo.stride, geo.dilation, geo.lo, geo.hi, out_padding)
    )


def equivalent_convolution(out_sp: tuple, kernel: tuple, in_sp: tuple, geo: Geometry) -> tuple:
    """(geometry, trim) of the convolution that maps a transposed convolution's output
    (spatial sizes out_sp) back onto its input (in_sp); the transposed convolution is that
    convolution's backward-data op, and its gradients are that convolution and its
    backward-weight op.

    It has the same geometry, except where output_padding >= stride (allowed when it is below
    dilation) added whole strides past the last window: no window reads them, so the high
    padding shrinks by them, and where it would go below zero those trailing output rows
    (`trim` per dim) are left out of the convolution instead: they receive nothing.
    """
    hi, trim = list(geo.hi), [0] * len(out_sp)
    for i, (n, k, s, d, lo) in enumerate(zip(out_sp, kernel, geo.stride, geo.dilation, geo.lo)):
        while output_size(n, k, s, d, lo, hi[i]) > in_sp[i]:
            hi[i] -= s
        if hi[i] < 0:
            trim[i], hi[i] = -hi[i], 0
    return geo._replace(hi=tuple(hi)), tuple(trim)


def kept_rows(sizes: tuple, trim: tuple) -> tuple:
    """The slices of the rows equivalent_convolution keeps (all but `trim` at the high end)."""
    return tuple(slice(0, n - t) for n, t in zip(sizes, trim))


# ------------------------------------------------------------------------------------------
# Memory formats


def compact_strides(shape: tuple, order) -> tuple:
    """Element strides of a dense array whose dims are laid out in `order`, outermost first."""
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def channels_last_order(ndim: int) -> list:
    """N, *spatial, C: the dim order of a channels-last array, outermost first."""
    return [0, *range(2, ndim), 1]


def is_channels_last(shape: tuple, strides) -> bool:
    """Whether element strides are channels-last (N, *spatial, C) rather than contiguous. The
    strides of size-1 dims never matter; an array that is both (C = 1) counts as contiguous."""
    if strides is None or len(shape) < 3:
        return False

    def same(a, b):
        return all(n == 1 or x == y for n, x, y in zip(shape, a, b))

    channels_last = compact_strides(shape, channels_last_order(len(shape)))
    return same(strides, channels_last) and not same(strides, compact_strides(shape, range(len(shape))))
