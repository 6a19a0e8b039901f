"""Float64 NumPy reference convolutions (direct sums over kernel offsets), written for the
tests. Semantics are torch.nn.functional's: cross-correlation, x (N, C, *sp),
w (K, C/groups, *k), per-side padding lo/hi."""

from __future__ import annotations

import itertools
import math

import numpy as np


def _windows(nd, kidx, out_sp, stride, dilation):
    """Slices of the padded input that kernel offset kidx reads for every output position."""
    return tuple(
        slice(kidx[i] * dilation[i], kidx[i] * dilation[i] + (out_sp[i] - 1) * stride[i] + 1, stride[i])
        for i in range(nd)
    )


def out_size(n, k, s, d, lo, hi):
    return (n + lo + hi - d * (k - 1) - 1) // s + 1


def conv_forward(x, w, bias=None, stride=None, lo=None, hi=None, dilation=None, groups=1):
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    nd = x.ndim - 2
    stride, dilation = stride or (1,) * nd, dilation or (1,) * nd
    lo, hi = lo or (0,) * nd, hi or (0,) * nd
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(lo, hi)))
    N, C = x.shape[:2]
    K, ks = w.shape[0], w.shape[2:]
    out_sp = [out_size(x.shape[2 + i], ks[i], stride[i], dilation[i], lo[i], hi[i]) for i in range(nd)]
    y = np.zeros((N, K, *out_sp))
    cg, kg = C // groups, K // groups
    for g in range(groups):
        xg, wg = xp[:, g * cg : (g + 1) * cg], w[g * kg : (g + 1) * kg]
        for kidx in itertools.product(*map(range, ks)):
            patch = xg[(slice(None), slice(None)) + _windows(nd, kidx, out_sp, stride, dilation)]
            y[:, g * kg : (g + 1) * kg] += np.einsum("nc...,kc->nk...", patch, wg[(slice(None), slice(None)) + kidx])
    if bias is not None:
        y += np.asarray(bias, dtype=np.float64).reshape(1, K, *([1] * nd))
    return y


def conv_backward_data(dy, w, input_shape, stride=None, lo=None, hi=None, dilation=None, groups=1):
    """dx = the adjoint of conv_forward in x (its vector-Jacobian product with dy)."""
    dy = np.asarray(dy, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    nd = dy.ndim - 2
    stride, dilation = stride or (1,) * nd, dilation or (1,) * nd
    lo, hi = lo or (0,) * nd, hi or (0,) * nd
    N, C = input_shape[:2]
    K, ks = w.shape[0], w.shape[2:]
    padded = [input_shape[2 + i] + lo[i] + hi[i] for i in range(nd)]
    out_sp = dy.shape[2:]
    dxp = np.zeros((N, C, *padded))
    cg, kg = C // groups, K // groups
    for g in range(groups):
        wg, dyg = w[g * kg : (g + 1) * kg], dy[:, g * kg : (g + 1) * kg]
        for kidx in itertools.product(*map(range, ks)):
            sl = (slice(None), slice(g * cg, (g + 1) * cg)) + _windows(nd, kidx, out_sp, stride, dilation)
            dxp[sl] += np.einsum("nk...,kc->nc...", dyg, wg[(slice(None), slice(None)) + kidx])
    crop = tuple(slice(lo[i], lo[i] + input_shape[2 + i]) for i in range(nd))
    return dxp[(slice(None), slice(None)) + crop]


def conv_backward_weight(x, dy, weight_shape, stride=None, lo=None, hi=None, dilation=None, groups=1):
    """dw = the adjoint of conv_forward in w."""
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    nd = x.ndim - 2
    stride, dilation = stride or (1,) * nd, dilation or (1,) * nd
    lo, hi = lo or (0,) * nd, hi or (0,) * nd
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(lo, hi)))
    C, K, ks = x.shape[1], weight_shape[0], weight_shape[2:]
    out_sp = dy.shape[2:]
    dw = np.zeros(weight_shape)
    cg, kg = C // groups, K // groups
    sp = "uvw"[:nd]
    for g in range(groups):
        xg, dyg = xp[:, g * cg : (g + 1) * cg], dy[:, g * kg : (g + 1) * kg]
        for kidx in itertools.product(*map(range, ks)):
            patch = xg[(slice(None), slice(None)) + _windows(nd, kidx, out_sp, stride, dilation)]
            dw[(slice(g * kg, (g + 1) * kg), slice(None)) + kidx] = np.einsum(f"nc{sp},nk{sp}->kc", patch, dyg)
    return dw


def channels_last(a):
    """The same values in a channels-last (N, *spatial, C) memory layout."""
    nd = a.ndim
    perm = (0, *range(2, nd), 1)
    inverse = (0, nd - 1, *range(1, nd - 1))
    return np.ascontiguousarray(a.transpose(perm)).transpose(inverse)


def poisoned_like(shape, dtype, channels_last_layout=False):
    """An output array full of NaN, so any element the call fails to write shows."""
    out = np.full(shape, np.nan, dtype=dtype)
    return channels_last(out) if channels_last_layout else out


def conv_transpose(x, w, bias, stride, padding, output_padding, dilation, groups=1):
    """torch.nn.functional.conv_transpose*d by its definition: every input element scatters
    w-weighted copies into the output; w is (C_in, C_out/groups, *k). padding holds an int
    (both sides) or a (lo, hi) pair per spatial dim: lo rows are cut off the start of the
    scattered result, hi off its end (before output_padding adds rows there)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    nd = x.ndim - 2
    N, cin = x.shape[:2]
    cout_g, ks = w.shape[1], w.shape[2:]
    in_sp = x.shape[2:]
    lo = [p[0] if isinstance(p, (tuple, list)) else p for p in padding]
    hi = [p[1] if isinstance(p, (tuple, list)) else p for p in padding]
    full = [(in_sp[i] - 1) * stride[i] + dilation[i] * (ks[i] - 1) + 1 + output_padding[i] for i in range(nd)]
    buf = np.zeros((N, cout_g * groups, *full))
    cin_g = cin // groups
    for g in range(groups):
        xg, wg = x[:, g * cin_g : (g + 1) * cin_g], w[g * cin_g : (g + 1) * cin_g]
        for kidx in itertools.product(*map(range, ks)):
            sl = (slice(None), slice(g * cout_g, (g + 1) * cout_g)) + _windows(nd, kidx, in_sp, stride, dilation)
            buf[sl] += np.einsum("nc...,co->no...", xg, wg[(slice(None), slice(None)) + kidx])
    out_sp = [
        (in_sp[i] - 1) * stride[i] - lo[i] - hi[i] + dilation[i] * (ks[i] - 1) + output_padding[i] + 1
        for i in range(nd)
    ]
    y = buf[(slice(None), slice(None)) + tuple(slice(lo[i], lo[i] + out_sp[i]) for i in range(nd))]
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64).reshape(1, -1, *([1] * nd))
    return y


def _erf(v):
    return np.vectorize(math.erf, otypes=[np.float64])(v)


#: The fused activations of flux_dnn.h, by flux_dnn's names, in float64.
ACTIVATIONS = {
    "relu": lambda v: np.maximum(v, 0),
    "leaky_relu": lambda v, slope=0.01: np.where(v >= 0, v, slope * v),
    "clip": lambda v, lo, hi: np.clip(v, lo, hi),
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "tanh": np.tanh,
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
    "gelu": lambda v: 0.5 * v * (1 + _erf(v / math.sqrt(2))),
    "silu": lambda v: v / (1 + np.exp(-v)),
}


def activate(v, activation):
    """activation (None, a name, or (name, *params)) applied to v."""
    if activation is None:
        return v
    name, params = (activation, ()) if isinstance(activation, str) else (activation[0], activation[1:])
    return ACTIVATIONS[name](v, *params)


def epilogue(result, alpha=1.0, beta=0.0, old=None, activation=None):
    """The header's epilogue: out = alpha * act(result) + beta * out_old (result includes the
    bias; the activation, forward only, before alpha)."""
    out = alpha * activate(np.asarray(result, dtype=np.float64), activation)
    if beta != 0.0:
        out = out + beta * np.asarray(old, dtype=np.float64)
    return out
