"""The convolution API: argument rules, output shapes, dispatch to the shim of the arrays'
device, and the per-call fast path.

Every argument is checked here, before any vendor call, and a bad one raises ValueError or
TypeError naming the argument, its value and the rule. A validated call pattern (shapes,
dtypes, devices, layout, parameters) is remembered, so a repeated call costs a dict lookup,
an output allocation and one call into the core, whose plan cache holds the vendor plan.
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Optional

from . import _core
from ._adapters import _BY_TYPE, adapter_for, is_channels_last
from ._discovery import REGISTRY, device_name

FORWARD, BACKWARD_DATA, BACKWARD_WEIGHT = 0, 1, 2
_SPATIAL = {1: "W", 2: "H, W", 3: "D, H, W"}
_KERNEL = {1: "S", 2: "R, S", 3: "T, R, S"}

ACTIVATIONS = {
    # name: (ABI code, number of parameters)
    "relu": (1, 0),
    "leaky_relu": (2, 1),  # ("leaky_relu", negative_slope)
    "clip": (3, 2),  # ("clip", lo, hi); ("clip", 0, 6) is relu6
    "sigmoid": (4, 0),
    "tanh": (5, 0),
    "gelu_tanh": (6, 0),
    "gelu": (7, 0),  # exact (erf)
    "silu": (8, 0),
}

_ALGORITHMS = {"heuristic": 0, "benchmark": 1}
_DETERMINISTIC, _REDUCED_PRECISION = 1, 2
# Reduced precision by default where PyTorch allows it for convolutions by default
# (torch.backends.cudnn.allow_tf32 is True: TF32 on NVIDIA); never on CPUs.
_REDUCED_PRECISION_DEFAULT = {2: True}

_MEMO_LIMIT = 4096
_memo: dict = {}


# ------------------------------------------------------------------------------------------
# Argument rules


def _int(value, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {value!r}") from None


def _ints(value, nd: int, name: str, minimum: int) -> tuple:
    """An int or a sequence of nd ints, each >= minimum."""
    if isinstance(value, (list, tuple)):
        if len(value) != nd:
            raise ValueError(f"{name}: expected an int or {nd} ints for a {nd}-D convolution, got {value!r}")
        out = tuple(_int(v, name) for v in value)
    else:
        out = (_int(value, name),) * nd
    if any(v < minimum for v in out):
        raise ValueError(f"{name}: every value must be >= {minimum}, got {value!r}")
    return out


def _padding(padding, nd: int, stride: tuple, dilation: tuple, kernel: tuple) -> tuple:
    """(lo, hi) per spatial dim from an int, nd ints, nd (lo, hi) pairs, 'same' or 'valid'."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * nd, (0,) * nd
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"padding: 'same' needs stride 1 (as in PyTorch), got stride {stride}")
            total = [d * (k - 1) for d, k in zip(dilation, kernel)]
            lo = tuple(t // 2 for t in total)
            return lo, tuple(t - l for t, l in zip(total, lo))
        raise ValueError(f"padding: expected an int, a tuple, per-side pairs, 'same' or 'valid', got {padding!r}")
    if isinstance(padding, (list, tuple)) and padding and all(isinstance(p, (list, tuple)) for p in padding):
        if len(padding) != nd or any(len(p) != 2 for p in padding):
            raise ValueError(f"padding: per-side padding needs {nd} (lo, hi) pairs, got {padding!r}")
        lo = tuple(_int(p[0], "padding") for p in padding)
        hi = tuple(_int(p[1], "padding") for p in padding)
    else:
        lo = hi = _ints(padding, nd, "padding", minimum=-(1 << 62))
    if any(v < 0 for v in lo + hi):
        raise ValueError(f"padding: must be >= 0, got {padding!r}")
    return lo, hi


def _activation(activation) -> tuple:
    """(code, alpha, beta) from None, a name, or (name, *params)."""
    if activation is None:
        return 0, 0.0, 0.0
    name, params = (activation, ()) if isinstance(activation, str) else (activation[0], tuple(activation[1:]))
    if name not in ACTIVATIONS:
        raise ValueError(f"activation: unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    code, count = ACTIVATIONS[name]
    if len(params) not in ((count,) if name != "leaky_relu" else (0, 1)):
        raise ValueError(f"activation: {name!r} takes {count} parameter(s), got {activation!r}")
    if name == "leaky_relu" and not params:
        params = (0.01,)  # PyTorch's default negative_slope
    values = [float(p) for p in params] + [0.0, 0.0]
    return code, values[0], values[1]


def _flags(deterministic, allow_reduced_precision, device_type: int) -> int:
    if allow_reduced_precision is None:
        allow_reduced_precision = _REDUCED_PRECISION_DEFAULT.get(device_type, False)
    return (_DETERMINISTIC if deterministic else 0) | (_REDUCED_PRECISION if allow_reduced_precision else 0)


def _algorithm(algorithm) -> tuple:
    if isinstance(algorithm, str):
        if algorithm not in _ALGORITHMS:
            raise ValueError(f"algorithm: expected 'heuristic', 'benchmark' or an algorithm id, got {algorithm!r}")
        return _ALGORITHMS[algorithm], 0
    return 2, _int(algorithm, "algorithm")


def conv_output_size(size: int, kernel: int, stride: int, dilation: int, lo: int, hi: int) -> int:
    return (size + lo + hi - dilation * (kernel - 1) - 1) // stride + 1


# ------------------------------------------------------------------------------------------
# Operands


class _Operand(NamedTuple):
    """What we need of one array argument."""

    name: str
    array: object
    adapter: object
    shape: tuple
    dtype: str
    device: tuple


def _operand(array, name: str) -> _Operand:
    adapter = adapter_for(array, name)
    return _Operand(name, array, adapter, adapter.shape(array), adapter.dtype_name(array, name),
                    adapter.device(array))


def _device_text(device: tuple) -> str:
    return f"{device_name(device[0])}:{device[1]}"


def _check_same(ops: list) -> None:
    """Same dtype and device for every operand (out included)."""
    first = ops[0]
    for op in ops[1:]:
        if op.device != first.device:
            raise ValueError(f"{op.name} is on {_device_text(op.device)} but {first.name} is on "
                             f"{_device_text(first.device)}; all arrays must be on one device")
        if op.dtype != first.dtype:
            raise TypeError(f"{op.name}: dtype {op.dtype} differs from {first.name}'s dtype {first.dtype}; "
                            "all arrays of a convolution must share one dtype")


def _check_rank(op: _Operand, nd: int, what: str) -> None:
    if len(op.shape) != nd + 2:
        raise ValueError(f"{op.name}: a {nd}-D convolution expects a {nd + 2}-D array ({what}), got shape {op.shape}")
    if any(s < 1 for s in op.shape[1:]):
        raise ValueError(f"{op.name}: every dimension but N must be >= 1, got shape {op.shape}")


def _check_channels(C: int, K: int, wshape: tuple, groups: int, x_name: str, w_name: str, xshape: tuple) -> None:
    if C % groups:
        raise ValueError(f"groups: {groups} does not divide the {C} channels of {x_name} (shape {xshape})")
    if K % groups:
        raise ValueError(f"groups: {groups} does not divide the {K} output channels (w.shape[0]) of {w_name} (shape {wshape})")
    if wshape[1] * groups != C:
        raise ValueError(f"{w_name}: shape {wshape} has C/groups = {wshape[1]}, but {x_name} has C = {C} "
                         f"with groups = {groups}, so {w_name}.shape[1] must be {C // groups}")


def _spatial_out(nd: int, in_sp: tuple, kernel: tuple, stride, dilation, lo, hi, x_name: str) -> tuple:
    out = []
    for i in range(nd):
        extent = dilation[i] * (kernel[i] - 1) + 1
        padded = in_sp[i] + lo[i] + hi[i]
        if padded < extent:
            raise ValueError(f"w: the effective kernel size {extent} (kernel {kernel[i]}, dilation {dilation[i]}) "
                             f"of spatial dim {i} is larger than the padded input size {padded} "
                             f"({x_name} size {in_sp[i]} + padding {lo[i]} + {hi[i]})")
        out.append(conv_output_size(in_sp[i], kernel[i], stride[i], dilation[i], lo[i], hi[i]))
    return tuple(out)


def _shim_for(first: _Operand):
    """The first shim of the arrays' device that computes their dtype here, as the shims
    report it; TypeError naming the dtype and what each shim computes otherwise."""
    return REGISTRY.shim_for(first.device[0], first.dtype, first.device[1], first.name)


_outs_checked: set = set()


def _check_out_once(call_key, out, name: str, shape: tuple, like_array, like_name: str) -> None:
    """_check_out, skipped for an out array of a kind (adapter key) already checked for this
    call pattern: repeated out= calls then cost a set lookup, not a validation."""
    try:
        seen = (call_key, _sig(out, name)[1])
        if seen in _outs_checked:
            return
    except TypeError:
        seen = None
    _check_out(out, name, shape, _operand(like_array, like_name))
    if seen is not None:
        if len(_outs_checked) >= _MEMO_LIMIT:
            _outs_checked.clear()
        _outs_checked.add(seen)


def _check_out(out, name: str, shape: tuple, like: _Operand) -> _Operand:
    op = _operand(out, name)
    if op.shape != shape:
        raise ValueError(f"{name}: shape {op.shape} does not match the result's shape {shape}")
    _check_same([like, op])
    return op


# ------------------------------------------------------------------------------------------
# Prepared call patterns


class _Prepared(NamedTuple):
    shim: object  # _core.Shim
    spec: object  # _core.ConvSpec
    out_shape: tuple
    channels_last: bool
    bias_out_shape: Optional[tuple]  # backward-weight's bias gradient, when asked for
    gpu: bool  # the arrays are on a device whose work is ordered on a stream


def _remember(key, prepared: _Prepared) -> _Prepared:
    try:
        hash(key)
    except TypeError:
        return prepared
    if len(_memo) >= _MEMO_LIMIT:
        _memo.clear()
    _memo[key] = prepared
    return prepared


def _make_spec(op, nd, stride, dilation, lo, hi, groups, alpha, beta, activation, flags, algorithm, workspace_limit):
    policy, algo_id = _algorithm(algorithm)
    act, act_a, act_b = _activation(activation)
    return _core.ConvSpec(op, nd, list(stride), list(dilation), list(lo), list(hi), groups,
                          float(alpha), float(beta), act, act_a, act_b, flags, policy, algo_id,
                          None if workspace_limit is None else _int(workspace_limit, "workspace_limit"))


def _check_beta(beta, out) -> None:
    if beta != 0.0 and out is None:
        raise ValueError(f"beta: beta={beta!r} accumulates into an existing output, so it needs out=")


def _adapter(a, name: str):
    return _BY_TYPE.get(type(a)) or adapter_for(a, name)


def _sig(a, name: str) -> tuple:
    """(adapter, memo key) of an array argument; None gives (None, None)."""
    if a is None:
        return None, None
    ad = _adapter(a, name)
    return ad, ad.key(a)


def _export(a, name: str):
    """What the core receives for an array: the array itself, or a DLPack capsule made by its
    library's fast exporter (torch)."""
    return _adapter(a, name).export(a)


def _lookup(key):
    """The prepared call for a memo key, or None (also for unhashable arguments, such as
    lists, which are then validated on every call)."""
    try:
        return _memo.get(key)
    except TypeError:
        return None


def _execute(prepared: _Prepared, x, w, y, bias, ad, like) -> None:
    """Run the prepared call; ad/like: the adapter and array whose library owns the work."""
    if prepared.gpu:
        _core.run_conv(prepared.shim, prepared.spec, x, w, y, bias, ad.stream(like), lambda n: ad.workspace(like, n))
    else:
        _core.run_conv(prepared.shim, prepared.spec, x, w, y, bias, None, None)


# ------------------------------------------------------------------------------------------
# Forward


def forward(nd, x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *, activation=None,
            out=None, alpha=1.0, beta=0.0, deterministic=False, allow_reduced_precision=None,
            algorithm="heuristic", workspace_limit=None):
    _check_beta(beta, out)
    ax, kx = _sig(x, "x")
    aw, kw = _sig(w, "w")
    ab, kb = _sig(bias, "bias")
    key = (FORWARD, nd, kx, kw, kb, stride, padding, dilation, groups, activation, alpha, beta,
           deterministic, allow_reduced_precision, algorithm, workspace_limit)
    prepared = _lookup(key)
    if prepared is None:
        prepared = _remember(key, _prepare_forward(
            nd, _operand(x, "x"), _operand(w, "w"), None if bias is None else _operand(bias, "bias"),
            stride, padding, dilation, groups, activation, alpha, beta, deterministic,
            allow_reduced_precision, algorithm, workspace_limit))
    if out is None:
        out = ax.empty(x, prepared.out_shape, prepared.channels_last)
    else:
        _check_out_once(key, out, "out", prepared.out_shape, x, "x")
    if prepared.out_shape[0] == 0:
        return out
    _execute(prepared, ax.export(x), aw.export(w), _export(out, "out"), None if bias is None else ab.export(bias),
             ax, x)
    return out


def _prepare_forward(nd, xo, wo, bo, stride, padding, dilation, groups, activation, alpha, beta,
                     deterministic, allow_reduced_precision, algorithm, workspace_limit) -> _Prepared:
    _check_rank(xo, nd, f"N, C, {_SPATIAL[nd]}")
    _check_rank(wo, nd, f"K, C/groups, {_KERNEL[nd]}")
    groups = _int(groups, "groups")
    if groups < 1:
        raise ValueError(f"groups: must be >= 1, got {groups}")
    N, C, K = xo.shape[0], xo.shape[1], wo.shape[0]
    _check_channels(C, K, wo.shape, groups, "x", "w", xo.shape)
    stride = _ints(stride, nd, "stride", 1)
    dilation = _ints(dilation, nd, "dilation", 1)
    kernel = wo.shape[2:]
    lo, hi = _padding(padding, nd, stride, dilation, kernel)
    out_sp = _spatial_out(nd, xo.shape[2:], kernel, stride, dilation, lo, hi, "x")
    operands = [xo, wo]
    if bo is not None:
        if bo.shape != (K,):
            raise ValueError(f"bias: expected shape ({K},) (one value per output channel), got {bo.shape}")
        operands.append(bo)
    _check_same(operands)
    entry = _shim_for(xo)
    flags = _flags(deterministic, allow_reduced_precision, xo.device[0])
    spec = _make_spec(FORWARD, nd, stride, dilation, lo, hi, groups, alpha, beta, activation, flags,
                      algorithm, workspace_limit)
    channels_last = is_channels_last(xo.shape, xo.adapter.strides(xo.array))
    return _Prepared(entry.shim, spec, (N, K, *out_sp), channels_last, None, xo.device[0] != 1)


# ------------------------------------------------------------------------------------------
# Backward data, backward weight, transposed


def _shape_arg(shape, nd: int, name: str, what: str) -> tuple:
    if not isinstance(shape, (list, tuple)) or len(shape) != nd + 2:
        raise ValueError(f"{name}: expected {nd + 2} ints ({what}) for a {nd}-D convolution, got {shape!r}")
    out = tuple(_int(s, name) for s in shape)
    if any(s < 1 for s in out[1:]) or out[0] < 0:
        raise ValueError(f"{name}: every size must be >= 1 (N >= 0), got {shape!r}")
    return out


def _geometry(nd, x_shape, w_shape, dy_shape, stride, padding, dilation, groups, x_name, w_name):
    """Checks that x, w and dy shapes are one convolution; returns (stride, dilation, lo, hi)."""
    groups = _int(groups, "groups")
    if groups < 1:
        raise ValueError(f"groups: must be >= 1, got {groups}")
    _check_channels(x_shape[1], w_shape[0], w_shape, groups, x_name, w_name, x_shape)
    stride = _ints(stride, nd, "stride", 1)
    dilation = _ints(dilation, nd, "dilation", 1)
    lo, hi = _padding(padding, nd, stride, dilation, w_shape[2:])
    out_sp = _spatial_out(nd, x_shape[2:], w_shape[2:], stride, dilation, lo, hi, x_name)
    expected = (x_shape[0], w_shape[0], *out_sp)
    if tuple(dy_shape) != expected:
        raise ValueError(f"dy: shape {tuple(dy_shape)} is not the output shape {expected} of the convolution of "
                         f"{x_name} {x_shape} with {w_name} {w_shape} (stride {stride}, padding {tuple(zip(lo, hi))}, "
                         f"dilation {dilation}, groups {groups})")
    return stride, dilation, lo, hi, groups


def _backward_spec(op, nd, geometry, alpha, beta, deterministic, allow_reduced_precision, algorithm,
                   workspace_limit, device_type):
    stride, dilation, lo, hi, groups = geometry
    flags = _flags(deterministic, allow_reduced_precision, device_type)
    return _make_spec(op, nd, stride, dilation, lo, hi, groups, alpha, beta, None, flags, algorithm, workspace_limit)


def backward_data(nd, dy, w, input_shape, stride=1, padding=0, dilation=1, groups=1, *, out=None,
                  alpha=1.0, beta=0.0, deterministic=False, allow_reduced_precision=None,
                  algorithm="heuristic", workspace_limit=None):
    _check_beta(beta, out)
    ady, kdy = _sig(dy, "dy")
    aw, kw = _sig(w, "w")
    key = (BACKWARD_DATA, nd, kdy, kw, tuple(input_shape) if isinstance(input_shape, list) else input_shape,
           stride, padding, dilation, groups, alpha, beta, deterministic, allow_reduced_precision, algorithm,
           workspace_limit)
    prepared = _lookup(key)
    if prepared is None:
        dyo, wo = _operand(dy, "dy"), _operand(w, "w")
        _check_rank(dyo, nd, f"N, K, {_SPATIAL[nd]}")
        _check_rank(wo, nd, f"K, C/groups, {_KERNEL[nd]}")
        x_shape = _shape_arg(input_shape, nd, "input_shape", f"N, C, {_SPATIAL[nd]}")
        geometry = _geometry(nd, x_shape, wo.shape, dyo.shape, stride, padding, dilation, groups, "input_shape", "w")
        _check_same([dyo, wo])
        entry = _shim_for(dyo)
        spec = _backward_spec(BACKWARD_DATA, nd, geometry, alpha, beta, deterministic, allow_reduced_precision,
                              algorithm, workspace_limit, dyo.device[0])
        prepared = _remember(key, _Prepared(entry.shim, spec, x_shape,
                                            is_channels_last(dyo.shape, dyo.adapter.strides(dy)), None,
                                            dyo.device[0] != 1))
    if out is None:
        out = ady.empty(dy, prepared.out_shape, prepared.channels_last)
    else:
        _check_out_once(key, out, "out", prepared.out_shape, dy, "dy")
    if prepared.out_shape[0] == 0:
        return out
    _execute(prepared, _export(out, "out"), aw.export(w), ady.export(dy), None, ady, dy)
    return out


def backward_weight(nd, x, dy, weight_shape, stride=1, padding=0, dilation=1, groups=1, *, bias_grad=False,
                    out=None, alpha=1.0, beta=0.0, deterministic=False, allow_reduced_precision=None,
                    algorithm="heuristic", workspace_limit=None):
    _check_beta(beta, out)
    ax, kx = _sig(x, "x")
    ady, kdy = _sig(dy, "dy")
    key = (BACKWARD_WEIGHT, nd, kx, kdy, tuple(weight_shape) if isinstance(weight_shape, list) else weight_shape,
           bool(bias_grad), stride, padding, dilation, groups, alpha, beta, deterministic, allow_reduced_precision,
           algorithm, workspace_limit)
    prepared = _lookup(key)
    if prepared is None:
        xo, dyo = _operand(x, "x"), _operand(dy, "dy")
        _check_rank(xo, nd, f"N, C, {_SPATIAL[nd]}")
        _check_rank(dyo, nd, f"N, K, {_SPATIAL[nd]}")
        w_shape = _shape_arg(weight_shape, nd, "weight_shape", f"K, C/groups, {_KERNEL[nd]}")
        if w_shape[0] < 1:
            raise ValueError(f"weight_shape: K must be >= 1, got {weight_shape!r}")
        geometry = _geometry(nd, xo.shape, w_shape, dyo.shape, stride, padding, dilation, groups, "x", "weight_shape")
        _check_same([xo, dyo])
        entry = _shim_for(xo)
        spec = _backward_spec(BACKWARD_WEIGHT, nd, geometry, alpha, beta, deterministic, allow_reduced_precision,
                              algorithm, workspace_limit, xo.device[0])
        prepared = _remember(key, _Prepared(entry.shim, spec, w_shape, False, (w_shape[0],) if bias_grad else None,
                                            xo.device[0] != 1))
    dw_out, db_out = out, None
    if bias_grad and out is not None:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ValueError("out: with bias_grad=True, out must be a (dw, db) pair")
        dw_out, db_out = out
    if dw_out is None:
        dw = ax.empty(x, prepared.out_shape, False)
    else:
        dw = dw_out
        _check_out_once(key, dw, "out", prepared.out_shape, x, "x")
    db = None
    if bias_grad:
        db = ax.empty(x, prepared.bias_out_shape, False) if db_out is None else db_out
        if db_out is not None:
            _check_out_once(key, db, "out[1]", prepared.bias_out_shape, x, "x")
    if x.shape[0] == 0:  # no samples: the gradient is zero (or out unchanged when accumulating)
        for a in (dw, db):
            if a is not None:
                a[...] = a * beta if beta != 0.0 else 0
        return (dw, db) if bias_grad else dw
    _execute(prepared, ax.export(x), _export(dw, "out"), ady.export(dy), None if db is None else _export(db, "out"),
             ax, x)
    return (dw, db) if bias_grad else dw


def transpose(nd, x, w, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *,
              out=None, alpha=1.0, beta=0.0, deterministic=False, allow_reduced_precision=None,
              algorithm="heuristic", workspace_limit=None):
    """conv_transpose = backward-data of the convolution whose weights are w (C_in, C_out/g, *k)."""
    xo, wo = _operand(x, "x"), _operand(w, "w")
    _check_rank(xo, nd, f"N, C_in, {_SPATIAL[nd]}")
    _check_rank(wo, nd, f"C_in, C_out/groups, {_KERNEL[nd]}")
    g = _int(groups, "groups")
    if g < 1:
        raise ValueError(f"groups: must be >= 1, got {g}")
    if xo.shape[1] != wo.shape[0]:
        raise ValueError(f"w: a transposed convolution's w is (C_in, C_out/groups, ...) = ({xo.shape[1]}, ...), "
                         f"but w has shape {wo.shape} for x of shape {xo.shape}")
    stride_t = _ints(stride, nd, "stride", 1)
    dilation_t = _ints(dilation, nd, "dilation", 1)
    output_padding = _ints(output_padding, nd, "output_padding", 0)
    for op, s, d in zip(output_padding, stride_t, dilation_t):
        if op >= s and op >= d:
            raise ValueError(f"output_padding: {output_padding} must be smaller than stride {stride_t} "
                             f"or dilation {dilation_t} in every dim (as in PyTorch)")
    if isinstance(padding, str):
        raise ValueError(f"padding: a transposed convolution takes ints or (lo, hi) pairs, not {padding!r}")
    lo, hi = _padding(padding, nd, stride_t, dilation_t, wo.shape[2:])
    kernel = wo.shape[2:]
    out_sp = tuple((xo.shape[2 + i] - 1) * stride_t[i] - lo[i] - hi[i] + dilation_t[i] * (kernel[i] - 1)
                   + output_padding[i] + 1 for i in range(nd))
    if any(s < 1 for s in out_sp):
        raise ValueError(f"padding: {padding!r} leaves an output of size {out_sp} for x {xo.shape} and w {wo.shape}")
    # The equivalent convolution maps out_sp back to x's size. Whole strides that
    # output_padding adds beyond the last window (output_padding >= stride, allowed when it is
    # < dilation) are read by no window: its high padding shrinks by them, and where that
    # would go below zero those trailing output rows are cut off the vendor call instead and
    # receive no contribution.
    hi_conv, trim = list(hi), [0] * nd
    for i in range(nd):
        while conv_output_size(out_sp[i], kernel[i], stride_t[i], dilation_t[i], lo[i], hi_conv[i]) > xo.shape[2 + i]:
            hi_conv[i] -= stride_t[i]
        if hi_conv[i] < 0:
            trim[i], hi_conv[i] = -hi_conv[i], 0
    full_shape = (xo.shape[0], wo.shape[1] * g, *out_sp)
    if bias is not None:
        bo = _operand(bias, "bias")
        if bo.shape != (full_shape[1],):
            raise ValueError(f"bias: expected shape ({full_shape[1]},) (one value per output channel), got {bo.shape}")
        _check_same([xo, bo])
    kwargs = dict(alpha=alpha, beta=beta, deterministic=deterministic, allow_reduced_precision=allow_reduced_precision,
                  algorithm=algorithm, workspace_limit=workspace_limit)
    geometry = (stride_t, tuple(zip(lo, hi_conv)), dilation_t, g)
    if not any(trim):
        y = backward_data(nd, x, w, full_shape, *geometry, out=out, **kwargs)
    else:
        y = xo.adapter.empty(x, full_shape, is_channels_last(xo.shape, xo.adapter.strides(x))) if out is None else out
        if out is not None:
            _check_out(out, "out", full_shape, xo)
        kept = tuple(slice(0, n - t) for n, t in zip(out_sp, trim))
        view = y[(slice(None), slice(None)) + kept]
        backward_data(nd, x, w, (*full_shape[:2], *(n - t for n, t in zip(out_sp, trim))), *geometry, out=view, **kwargs)
        for i in range(nd):  # the cut-off rows, as disjoint blocks
            if trim[i]:
                block = y[(slice(None), slice(None)) + kept[:i] + (slice(out_sp[i] - trim[i], None),)]
                block[...] = 0 if beta == 0.0 else block * beta
    if bias is not None:  # the ABI's backward-data has no bias epilogue: the library adds it
        y += bias.reshape((1, -1) + (1,) * nd) * alpha
    return y


# ------------------------------------------------------------------------------------------
# Reusable plans with packed weights


class ConvPlan:
    """A forward convolution fixed for one input shape, dtype, layout and device, with its
    weights packed once into the layout the vendor computes in (when the shim can pack, which
    the oneDNN shim does). Calling it skips argument checking, the plan cache and the weight
    reorder; an input of another shape, dtype, layout or device raises ValueError or TypeError.
    Later changes to the weights are not seen: make a new plan. Made by ``flux_dnn.conv_plan``."""

    def __init__(self, nd, x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *, activation=None,
                 alpha=1.0, deterministic=False, allow_reduced_precision=None, algorithm="heuristic",
                 workspace_limit=None):
        xo, wo = _operand(x, "x"), _operand(w, "w")
        bo = None if bias is None else _operand(bias, "bias")
        prepared = _prepare_forward(nd, xo, wo, bo, stride, padding, dilation, groups, activation, alpha, 0.0,
                                    deterministic, allow_reduced_precision, algorithm, workspace_limit)
        if prepared.out_shape[0] == 0:
            raise ValueError(f"x: a convolution plan needs a batch of at least 1, got shape {xo.shape}")
        self._type, self._adapter, self._like = type(x), xo.adapter, xo
        self._out_shape, self._channels_last = prepared.out_shape, prepared.channels_last
        self._bias = bias  # exported on every call: a capsule is consumed once
        sample = xo.adapter.empty(x, prepared.out_shape, prepared.channels_last)
        stream = xo.adapter.stream(x)
        self._packed = _core.PackedConv(prepared.shim, prepared.spec, xo.adapter.export(x), wo.adapter.export(w),
                                        _export(sample, "out"), None if bias is None else _export(bias, "bias"),
                                        stream)
        self._gpu = xo.device[0] != 1
        self.input_shape, self.output_shape, self.dtype = xo.shape, prepared.out_shape, xo.dtype

    @property
    def algorithm(self) -> str:
        """The vendor implementation this plan runs."""
        return self._packed.algo_name

    @property
    def weights_packed(self) -> bool:
        return self._packed.packed

    def __call__(self, x, *, out=None):
        if type(x) is not self._type:
            raise TypeError(f"x: this plan was made for {self._type.__module__}.{self._type.__qualname__} arrays, "
                            f"got {type(x).__module__}.{type(x).__qualname__}")
        ad = self._adapter
        if out is None:
            out = ad.empty(x, self._out_shape, self._channels_last)
        stream = ad.stream(x) if self._gpu else None
        workspace = (lambda n: ad.workspace(x, n)) if self._gpu else None
        bias = None if self._bias is None else _export(self._bias, "bias")
        self._packed.run(ad.export(x), _export(out, "out"), bias, stream, workspace)
        return out

    def __repr__(self):
        return (f"ConvPlan(input {self.input_shape} {self.dtype} -> output {self.output_shape}, "
                f"{self.algorithm})")
