"""The convolution ops: argument rules, dispatch to the shims of the arrays' device, and the
per-call fast path.

One path serves every array library: its provider (flux_dnn.providers) reads the arrays,
allocates outputs and names the streams; nothing here names a library. Every argument is
checked here, before any vendor call, and a bad one raises ValueError or TypeError naming
the argument, its value and the rule. A validated call pattern (shapes, dtypes, devices,
layout, geometry, options) is remembered, so a repeated call costs one dict lookup, an
output allocation and one call into the core, whose plan cache holds the vendor plan.
Forward patterns without keyword options whose arrays the core reads and makes itself (a
provider's ``core_memo``: NumPy's, torch's through DLPack's exchange API) are also handed to
the core (_Memo.hand_to_core), which answers the next such call with no Python frame of ours
(_api tries it first); this memo stays the one that validates, and forgets the core's copy
with its own. The keyword options of a call arrive as one ConvOptions (see _options)."""

from __future__ import annotations

from typing import NamedTuple

from . import _core, _progress
from ._discovery import REGISTRY, device_name
from ._geometry import (
    KERNEL,
    SPATIAL,
    Geometry,
    as_groups,
    as_int,
    equivalent_convolution,
    geometry,
    is_channels_last,
    kept_rows,
    output_padding,
    output_sizes,
    transposed_output_sizes,
)
from ._options import ACTIVATIONS, ConvOptions
from ._options import DEFAULT as DEFAULT_OPTIONS
from .providers import _BY_TYPE
from .providers import provider_for as adapter_for

__all__ = ["ACTIVATIONS", "BACKWARD_DATA", "BACKWARD_WEIGHT", "FORWARD", "ConvPlan"]

FORWARD = _core.CONV_FORWARD
BACKWARD_DATA = _core.CONV_BACKWARD_DATA
BACKWARD_WEIGHT = _core.CONV_BACKWARD_WEIGHT
_TRANSPOSE = "transpose"  # the memo's tag for conv_transpose, which runs as BACKWARD_DATA

_MEMO_LIMIT = 4096


class _Memo(dict):
    """call pattern -> _Prepared (or _Transposed): the one memo of validated call patterns,
    for every provider. The core keeps a copy of the forward patterns whose arrays it reads
    and allocates itself (a provider's ``core_memo``: NumPy's, and torch's through DLPack's
    exchange API), so that it answers their next call
    with no Python frame (_core.remembered_forward, tried first by _api); this class is the
    only writer of that copy: it hands patterns over and forgets them with its own."""

    def hand_to_core(self, nd, x, w, bias, stride, padding, dilation, groups, served, out) -> None:
        """Remember in the core a forward pattern just served into out, without keyword
        options, when x's provider lets it (core_memo: the core reads such arrays and makes
        their outputs itself; it declines, returning False, a pattern it cannot hold)."""
        if _BY_TYPE[type(x)].core_memo:
            _core.remember_forward(nd, x, w, bias, stride, padding, dilation, groups, served.shim, served.spec, out)

    def clear(self):
        _core.forget_forwards()
        super().clear()


_memo = _Memo()


# ------------------------------------------------------------------------------------------
# Shims


def _default_flags(shim, device_id: int) -> int:
    """The FDNN_CONV_* flags the shim asks for on this device when the caller has no
    preference (TF32 on NVIDIA as in PyTorch, 0 on CPUs): ABI 2.0 Device_Describe."""
    return shim.device_info(device_id)["default_flags"]


def _candidates(problem) -> list:
    """The usable shims (discovery entries) for the problem's device that compute its dtype
    and op, in the order they are asked; the first is REGISTRY.shim_for's. Raises as shim_for
    does when there is none."""
    (device_type, device_id), dtype, argument = problem.device, problem.dtype, problem.argument
    return list(REGISTRY.candidates(device_type, dtype, device_id, argument, problem.op))


# ------------------------------------------------------------------------------------------
# Operands


class _Operand(NamedTuple):
    """What we need of one array argument (slow path only)."""

    name: str
    array: object
    adapter: object
    shape: tuple
    dtype: str
    device: tuple


def _operand(array, name: str) -> _Operand:
    adapter = adapter_for(array, name)
    return _Operand(name, array, adapter, adapter.shape(array), adapter.dtype_name(array, name), adapter.device(array))


def _device_text(device: tuple) -> str:
    return f"{device_name(device[0])}:{device[1]}"


def _check_same(ops: list) -> None:
    """Same dtype and device for every operand (out included)."""
    first = ops[0]
    for op in ops[1:]:
        if op.device != first.device:
            raise ValueError(
                f"{op.name} is on {_device_text(op.device)} but {first.name} is on "
                f"{_device_text(first.device)}; all arrays must be on one device"
            )
        if op.dtype != first.dtype:
            raise TypeError(
                f"{op.name}: dtype {op.dtype} differs from {first.name}'s dtype {first.dtype}; "
                "all arrays of a convolution must share one dtype"
            )


def _check_rank(op: _Operand, nd: int, what: str) -> None:
    if len(op.shape) != nd + 2:
        raise ValueError(f"{op.name}: a {nd}-D convolution expects a {nd + 2}-D array ({what}), got shape {op.shape}")
    if any(s < 1 for s in op.shape[1:]):
        raise ValueError(f"{op.name}: every dimension but N must be >= 1, got shape {op.shape}")


def _check_channels(C: int, w_shape: tuple, groups: int, x_name: str, w_name: str, x_shape: tuple) -> None:
    K = w_shape[0]
    if C % groups:
        raise ValueError(f"groups: {groups} does not divide the {C} channels of {x_name} (shape {x_shape})")
    if K % groups:
        raise ValueError(
            f"groups: {groups} does not divide the {K} output channels (w.shape[0]) of {w_name} (shape {w_shape})"
        )
    if w_shape[1] * groups != C:
        raise ValueError(
            f"{w_name}: shape {w_shape} has C/groups = {w_shape[1]}, but {x_name} has C = {C} "
            f"with groups = {groups}, so {w_name}.shape[1] must be {C // groups}"
        )


def _check_bias(bo: _Operand | None, channels: int) -> None:
    if bo is not None and bo.shape != (channels,):
        raise ValueError(f"bias: expected shape ({channels},) (one value per output channel), got {bo.shape}")


def _shape_arg(shape, nd: int, name: str, what: str) -> tuple:
    if not isinstance(shape, (list, tuple)) or len(shape) != nd + 2:
        raise ValueError(f"{name}: expected {nd + 2} ints ({what}) for a {nd}-D convolution, got {shape!r}")
    out = tuple(as_int(s, name) for s in shape)
    if any(s < 1 for s in out[1:]) or out[0] < 0:
        raise ValueError(f"{name}: every size must be >= 1 (N >= 0), got {shape!r}")
    return out


def _check_output_of(nd, x_shape, w_shape, dy_shape, geo: Geometry, x_name: str, w_name: str) -> None:
    """x, w and dy shapes are one convolution (the backward ops)."""
    _check_channels(x_shape[1], w_shape, geo.groups, x_name, w_name, x_shape)
    expected = (x_shape[0], w_shape[0], *output_sizes(x_shape[2:], w_shape[2:], geo, x_name))
    if tuple(dy_shape) != expected:
        raise ValueError(
            f"dy: shape {tuple(dy_shape)} is not the output shape {expected} of the convolution of "
            f"{x_name} {x_shape} with {w_name} {w_shape} (stride {geo.stride}, padding {geo.padding()}, "
            f"dilation {geo.dilation}, groups {geo.groups})"
        )


# ------------------------------------------------------------------------------------------
# Prepared call patterns


class _Problem(NamedTuple):
    """A checked convolution, before a shim is chosen (holds no array)."""

    op: int
    nd: int
    geometry: Geometry
    options: ConvOptions
    device: tuple
    dtype: str
    argument: str  # the operand named when no shim computes the dtype


class _Prepared(NamedTuple):
    """A checked call pattern with the shim that serves it."""

    shim: object  # _core.Shim
    spec: object  # _core.ConvSpec
    out_shape: tuple
    channels_last: bool  # outputs flux_dnn allocates are channels-last
    bias_out_shape: tuple | None  # backward-weight's bias gradient, when asked for
    gpu: bool  # the arrays are on a device whose work is ordered on a stream
    # a CPU pattern whose arrays are handed to the core as they are (NumPy's, not torch's)
    direct: bool
    empty: object  # allocates outputs: the adapter's empty(like, shape, channels_last)
    problem: _Problem
    outs: dict  # adapter key of an out= array already checked -> whether it is handed over as it is


def _spec(problem: _Problem, shim) -> object:
    geo, options = problem.geometry, problem.options
    activation, activation_alpha, activation_beta = options.activation_code()
    policy, algo_id = options.algorithm_policy()
    return _core.ConvSpec(
        problem.op,
        problem.nd,
        list(geo.stride),
        list(geo.dilation),
        list(geo.lo),
        list(geo.hi),
        geo.groups,
        options.alpha,
        options.beta,
        activation,
        activation_alpha,
        activation_beta,
        options.flags(_default_flags(shim, problem.device[1])),
        policy,
        algo_id,
        options.workspace_limit,
    )


def _prepare(problem: _Problem, inputs: list, out_shape: tuple, channels_last: bool, bias_out_shape=None):
    """The pattern served by the first shim for the problem's device and dtype; inputs: the
    operands read, the first of which owns the outputs flux_dnn allocates."""
    shim = _candidates(problem)[0].shim
    gpu = problem.device[0] != _core.DEVICE_CPU
    direct = not gpu and all(op.adapter.exports_itself for op in inputs)
    return _Prepared(
        shim,
        _spec(problem, shim),
        out_shape,
        channels_last,
        bias_out_shape,
        gpu,
        direct,
        inputs[0].adapter.empty,
        problem,
        {},
    )


def _remember(key, prepared):
    """(key, prepared), remembered unless key cannot be (an unhashable argument such as a
    list, then validated on every call; key None)."""
    try:
        hash(key)
    except TypeError:
        return None, prepared
    if len(_memo) >= _MEMO_LIMIT:
        _memo.clear()
    _memo[key] = prepared
    return key, prepared


def _key(a, name: str):
    """The memo key of an array argument (None for None)."""
    return None if a is None else (_BY_TYPE.get(type(a)) or adapter_for(a, name)).key(a)


def _export(a, name: str = "out"):
    """What the core receives for an array: the array itself, or a DLPack capsule made by its
    library's fast exporter (torch). A capsule is consumed by one call."""
    if a is None:
        return None
    return (_BY_TYPE.get(type(a)) or adapter_for(a, name)).export(a)


def _check_out(prepared: _Prepared, out, name: str, shape: tuple, like, like_name: str) -> bool:
    """out fits the pattern: its shape, and the dtype and device of `like`. Checked once per
    kind of out array (its adapter key) and pattern, then a dict lookup. Returns whether out
    is handed to the core as it is."""
    adapter = _BY_TYPE.get(type(out))
    try:
        return prepared.outs[adapter.key(out)]
    except (AttributeError, KeyError, TypeError):  # no adapter yet, not seen, or unhashable
        pass
    op = _operand(out, name)
    if op.shape != shape:
        raise ValueError(f"{name}: shape {op.shape} does not match the result's shape {shape}")
    _check_same([_operand(like, like_name), op])
    direct = op.adapter.exports_itself
    try:
        prepared.outs[op.adapter.key(out)] = direct
    except TypeError:
        pass
    return direct


def _execute(prepared: _Prepared, direct: bool, x, w, y, bias, like) -> _Prepared | None:
    """Runs the pattern on the ABI's x, w, y and bias (the caller's arrays, bias maybe None);
    like: the array whose library owns the work (its stream and workspace allocator); direct:
    every array goes to the core as it is. Returns None, or the pattern served by another
    shim when the pattern's own refused it."""
    try:
        if direct:
            _core.run_conv(prepared.shim, prepared.spec, x, w, y, bias, None, None)
        else:
            _run_exported(prepared, x, w, y, bias, like)
    except _core.UnsupportedError as refusal:
        return _call_elsewhere(prepared, refusal, x, w, y, bias, like)
    return None


def _run_exported(prepared: _Prepared, x, w, y, bias, like) -> None:
    """The core call with each array exported by its library, on like's stream on GPUs."""
    if prepared.gpu:
        adapter = _BY_TYPE[type(like)]
        stream, workspace = adapter.streams(like), lambda n: adapter.workspace(like, n)
    else:
        stream = workspace = None
    x, w, y, bias = _export(x), _export(w), _export(y), _export(bias, "bias")
    _core.run_conv(prepared.shim, prepared.spec, x, w, y, bias, stream, workspace)


def _call_elsewhere(prepared: _Prepared, refusal, x, w, y, bias, like) -> _Prepared:
    """The pattern's shim refused the problem when making its plan (FDNN_ERROR_UNSUPPORTED;
    nothing was written): ask the device's next shims in order and return the pattern with
    the first that takes it. UnsupportedError with what each shim said when none does."""
    problem = prepared.problem
    said = [f"shim {prepared.shim.name!r}: {refusal}"]
    for entry in _candidates(problem):
        if entry.shim is prepared.shim:
            continue
        attempt = prepared._replace(shim=entry.shim, spec=_spec(problem, entry.shim), outs={})
        try:
            _run_exported(attempt, x, w, y, bias, like)
        except _core.UnsupportedError as another:
            said.append(f"shim {entry.shim.name!r}: {another}")
            continue
        return attempt
    raise _core.UnsupportedError(_refusals(problem.device[0], said)) from refusal


def _refusals(device_type: int, said: list) -> str:
    return f"no shim for {device_name(device_type)} arrays can compute this convolution:\n  " + "\n  ".join(said)


_OP_NAMES = {FORWARD: "forward", BACKWARD_DATA: "backward-data", BACKWARD_WEIGHT: "backward-weight"}


def _watched(prepared: _Prepared | None, options: ConvOptions) -> bool:
    """Whether the first run of a new pattern goes under _progress.tuning: a tuning policy,
    a shim to tune, and no report already around it (the call made again inside it)."""
    return prepared is not None and prepared.shim is not None and _progress.tunes(options) and _progress.wanted()


def _described(prepared: _Prepared, **arrays) -> str:
    """The layer a tuning line names: op, dtype, operand shapes, device and shim."""
    p = prepared.problem
    shapes = " ".join(f"{name} {tuple(a.shape)}" for name, a in arrays.items())
    return f"{_OP_NAMES[p.op]} {p.dtype} {shapes} on {_device_text(p.device)} ({prepared.shim.name})"


# ------------------------------------------------------------------------------------------
# Forward
#
# Each op first tries its memo: the key is made of the arrays' adapter keys and the other
# arguments as given, so a repeated call validates nothing. A KeyError (a new pattern, or an
# array type not seen yet) or a TypeError (an unhashable argument, such as a list) leads to
# the checks, which raise the errors users see.


def forward(nd: int, x, w, bias, stride, padding, dilation, groups, options: ConvOptions, out=None):
    try:
        kb = None if bias is None else _BY_TYPE[type(bias)].key(bias)
        key = (FORWARD, nd, _BY_TYPE[type(x)].key(x), _BY_TYPE[type(w)].key(w), kb, stride, padding, dilation,
               groups, options)  # fmt: skip
        prepared = _memo[key]
    except (KeyError, TypeError):
        key, prepared = _new_forward(nd, x, w, bias, stride, padding, dilation, groups, options)
        if _watched(prepared, options):  # its first run times the candidates: report it
            with _progress.tuning(lambda: _described(prepared, x=x, w=w)):
                return forward(nd, x, w, bias, stride, padding, dilation, groups, options, out)
    core_may_remember = out is None and options is DEFAULT_OPTIONS
    if out is None:
        out = prepared.empty(x, prepared.out_shape, prepared.channels_last)
        direct = prepared.direct
    else:
        direct = _check_out(prepared, out, "out", prepared.out_shape, x, "x") and prepared.direct
    if prepared.out_shape[0] == 0:
        return out
    if direct:  # _execute's direct case, inlined: a Python frame is a tenth of a tiny call
        try:
            _core.run_conv(prepared.shim, prepared.spec, x, w, out, bias, None, None)
            moved = None
        except _core.UnsupportedError as refusal:
            moved = _call_elsewhere(prepared, refusal, x, w, out, bias, x)
    else:
        moved = _execute(prepared, False, x, w, out, bias, x)
    if moved is not None:
        _remember(key, moved)
    if core_may_remember and direct:
        _memo.hand_to_core(nd, x, w, bias, stride, padding, dilation, groups, moved or prepared, out)
    return out


def _new_forward(nd, x, w, bias, stride, padding, dilation, groups, options) -> tuple:
    xo, wo = _operand(x, "x"), _operand(w, "w")
    bo = None if bias is None else _operand(bias, "bias")
    prepared = _prepare_forward(nd, xo, wo, bo, stride, padding, dilation, groups, options)
    key = (FORWARD, nd, xo.adapter.key(x), wo.adapter.key(w), _key(bias, "bias"), stride, padding, dilation,
           groups, options)  # fmt: skip
    return _remember(key, prepared)


class _Shape(NamedTuple):
    """An argument known by its shape only (what the shape checks read of an _Operand)."""

    name: str
    shape: tuple


def forward_shape(nd, x_shape, w_shape, stride, padding, dilation, groups) -> tuple:
    """(the output shape, the Geometry) of a forward convolution, its shape arguments
    checked as conv() checks them, without asking any shim (flux_dnn.jax traces with it)."""
    _check_rank(_Shape("x", tuple(x_shape)), nd, f"N, C, {SPATIAL[nd]}")
    _check_rank(_Shape("w", tuple(w_shape)), nd, f"K, C/groups, {KERNEL[nd]}")
    geo = geometry(nd, w_shape[2:], stride, padding, dilation, groups)
    _check_channels(x_shape[1], tuple(w_shape), geo.groups, "x", "w", tuple(x_shape))
    return (x_shape[0], w_shape[0], *output_sizes(x_shape[2:], w_shape[2:], geo)), geo


def _prepare_forward(nd, xo, wo, bo, stride, padding, dilation, groups, options) -> _Prepared:
    out_shape, geo = forward_shape(nd, xo.shape, wo.shape, stride, padding, dilation, groups)
    _check_bias(bo, wo.shape[0])
    operands = [xo, wo] if bo is None else [xo, wo, bo]
    _check_same(operands)
    problem = _Problem(FORWARD, nd, geo, options, xo.device, xo.dtype, "x")
    return _prepare(problem, operands, out_shape, is_channels_last(xo.shape, xo.adapter.strides(xo.array)))


# ------------------------------------------------------------------------------------------
# Backward data, backward weight


def backward_data(nd: int, dy, w, input_shape, stride, padding, dilation, groups, options: ConvOptions, out=None):
    if type(input_shape) is list:  # hashable, for the memo
        input_shape = tuple(input_shape)
    try:
        key = (BACKWARD_DATA, nd, _BY_TYPE[type(dy)].key(dy), _BY_TYPE[type(w)].key(w), input_shape, stride,
               padding, dilation, groups, options)  # fmt: skip
        prepared = _memo[key]
    except (KeyError, TypeError):
        key, prepared = _new_backward_data(nd, dy, w, input_shape, stride, padding, dilation, groups, options)
        if _watched(prepared, options):
            with _progress.tuning(lambda: _described(prepared, dy=dy, w=w)):
                return backward_data(nd, dy, w, input_shape, stride, padding, dilation, groups, options, out)
    if out is None:
        out = prepared.empty(dy, prepared.out_shape, prepared.channels_last)
        direct = prepared.direct
    else:
        direct = _check_out(prepared, out, "out", prepared.out_shape, dy, "dy") and prepared.direct
    if prepared.out_shape[0] != 0 and (moved := _execute(prepared, direct, out, w, dy, None, dy)) is not None:
        _remember(key, moved)
    return out


def _new_backward_data(nd, dy, w, input_shape, stride, padding, dilation, groups, options) -> tuple:
    x_shape = _shape_arg(input_shape, nd, "input_shape", f"N, C, {SPATIAL[nd]}")
    dyo, wo = _operand(dy, "dy"), _operand(w, "w")
    _check_rank(dyo, nd, f"N, K, {SPATIAL[nd]}")
    _check_rank(wo, nd, f"K, C/groups, {KERNEL[nd]}")
    geo = geometry(nd, wo.shape[2:], stride, padding, dilation, groups)
    prepared = _prepare_backward_data(nd, dyo, wo, x_shape, geo, options)
    key = (BACKWARD_DATA, nd, dyo.adapter.key(dy), wo.adapter.key(w), input_shape, stride, padding, dilation,
           groups, options)  # fmt: skip
    return _remember(key, prepared)


def _prepare_backward_data(nd, dyo, wo, x_shape, geo, options, x_name="input_shape") -> _Prepared:
    _check_output_of(nd, x_shape, wo.shape, dyo.shape, geo, x_name, "w")
    _check_same([dyo, wo])
    problem = _Problem(BACKWARD_DATA, nd, geo, options, dyo.device, dyo.dtype, "dy")
    return _prepare(problem, [dyo, wo], x_shape, is_channels_last(dyo.shape, dyo.adapter.strides(dyo.array)))


def backward_weight(nd: int, x, dy, weight_shape, stride, padding, dilation, groups, options: ConvOptions, out=None):
    if type(weight_shape) is list:  # hashable, for the memo
        weight_shape = tuple(weight_shape)
    try:
        key = (BACKWARD_WEIGHT, nd, _BY_TYPE[type(x)].key(x), _BY_TYPE[type(dy)].key(dy), weight_shape, stride,
               padding, dilation, groups, options)  # fmt: skip
        prepared = _memo[key]
    except (KeyError, TypeError):
        key, prepared = _new_backward_weight(nd, x, dy, weight_shape, stride, padding, dilation, groups, options)
        if _watched(prepared, options):
            with _progress.tuning(lambda: _described(prepared, x=x, dy=dy)):
                return backward_weight(nd, x, dy, weight_shape, stride, padding, dilation, groups, options, out)
    dw_out, db_out = out, None
    if options.bias_grad and out is not None:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ValueError("out: with bias_grad=True, out must be a (dw, db) pair")
        dw_out, db_out = out
    direct = prepared.direct
    if dw_out is None:
        dw = prepared.empty(x, prepared.out_shape, False)
    else:
        dw = dw_out
        direct = _check_out(prepared, dw, "out", prepared.out_shape, x, "x") and direct
    db = None
    if options.bias_grad:
        if db_out is None:
            db = prepared.empty(x, prepared.bias_out_shape, False)
        else:
            db = db_out
            direct = _check_out(prepared, db, "out[1]", prepared.bias_out_shape, x, "x") and direct
    if x.shape[0] == 0:  # no samples: the gradient is zero (or out unchanged when accumulating)
        for a in (dw, db):
            if a is not None:
                a[...] = a * options.beta if options.beta != 0.0 else 0
    elif (moved := _execute(prepared, direct, x, dw, dy, db, x)) is not None:
        _remember(key, moved)
    return (dw, db) if options.bias_grad else dw


def _new_backward_weight(nd, x, dy, weight_shape, stride, padding, dilation, groups, options) -> tuple:
    w_shape = _shape_arg(weight_shape, nd, "weight_shape", f"K, C/groups, {KERNEL[nd]}")
    if w_shape[0] < 1:
        raise ValueError(f"weight_shape: K must be >= 1, got {weight_shape!r}")
    xo, dyo = _operand(x, "x"), _operand(dy, "dy")
    _check_rank(xo, nd, f"N, C, {SPATIAL[nd]}")
    _check_rank(dyo, nd, f"N, K, {SPATIAL[nd]}")
    geo = geometry(nd, w_shape[2:], stride, padding, dilation, groups)
    _check_output_of(nd, xo.shape, w_shape, dyo.shape, geo, "x", "weight_shape")
    _check_same([xo, dyo])
    problem = _Problem(BACKWARD_WEIGHT, nd, geo, options, xo.device, xo.dtype, "x")
    prepared = _prepare(problem, [xo, dyo], w_shape, False, (w_shape[0],) if options.bias_grad else None)
    key = (BACKWARD_WEIGHT, nd, xo.adapter.key(x), dyo.adapter.key(dy), weight_shape, stride, padding, dilation,
           groups, options)  # fmt: skip
    return _remember(key, prepared)


# ------------------------------------------------------------------------------------------
# Transposed convolution


class _Transposed(NamedTuple):
    """A checked conv_transpose pattern: the backward-data op of the equivalent convolution,
    which writes all of the output but `trim` trailing rows per dim (rows no window reaches)."""

    prepared: _Prepared  # shim None when no row is within reach (output_padding's rows only)
    out_shape: tuple
    trim: tuple | None  # None: nothing trimmed


def transpose(nd: int, x, w, bias, stride, padding, out_padding, groups, dilation, options: ConvOptions, out=None):
    """conv_transpose = backward-data of the convolution whose weights are w (C_in, C_out/g, *k)."""
    try:
        kb = None if bias is None else _BY_TYPE[type(bias)].key(bias)
        key = (_TRANSPOSE, nd, _BY_TYPE[type(x)].key(x), _BY_TYPE[type(w)].key(w), kb, stride, padding,
               out_padding, groups, dilation, options)  # fmt: skip
        pattern = _memo[key]
    except (KeyError, TypeError):
        key, pattern = _new_transpose(nd, x, w, bias, stride, padding, out_padding, groups, dilation, options)
        if _watched(pattern.prepared, options):
            with _progress.tuning(lambda: _described(pattern.prepared, x=x, w=w)):
                return transpose(nd, x, w, bias, stride, padding, out_padding, groups, dilation, options, out)
    prepared = pattern.prepared
    if out is None:
        y = prepared.empty(x, pattern.out_shape, prepared.channels_last)
        direct = prepared.direct
    else:
        y = out
        direct = _check_out(prepared, y, "out", pattern.out_shape, x, "x") and prepared.direct
    moved = None
    if pattern.trim is None:
        if pattern.out_shape[0] != 0:
            moved = _execute(prepared, direct, y, w, x, None, x)
    elif out is None and not _BY_TYPE[type(x)].has_views:
        y, moved = _transpose_without_views(pattern, x, w, direct)
    else:
        kept = kept_rows(pattern.out_shape[2:], pattern.trim)
        if pattern.out_shape[0] != 0 and prepared.shim is not None:
            moved = _execute(prepared, direct, y[(slice(None), slice(None), *kept)], w, x, None, x)
        for i, t in enumerate(pattern.trim):  # the rows no window reaches, as disjoint blocks
            if t:
                block = y[(slice(None), slice(None), *kept[:i], slice(pattern.out_shape[2 + i] - t, None))]
                block[...] = 0 if options.beta == 0.0 else block * options.beta
    if moved is not None:
        _remember(key, pattern._replace(prepared=moved))
    if bias is not None:  # the ABI's backward-data has no bias epilogue: the library adds it
        # (by indexing, not .reshape: dpctl's usm_ndarray has no such method)
        y += bias[(None, slice(None)) + (None,) * nd] * options.alpha
    return y


def _transpose_without_views(pattern, x, w, direct) -> tuple:
    """The trimmed transposed convolution for a library whose slices are copies (JAX): the
    reachable rows are computed into an array of their own, and the rows no window reaches
    are appended as zeros. Returns (output, the pattern served by another shim or None)."""
    prepared, moved = pattern.prepared, None
    computed = prepared.empty(x, prepared.out_shape, prepared.channels_last)
    if pattern.out_shape[0] != 0 and prepared.shim is not None:
        moved = _execute(prepared, direct, computed, w, x, None, x)
    xp = _BY_TYPE[type(x)].namespace(x)
    concat = getattr(xp, "concat", None) or xp.concatenate
    y = computed
    for i, t in enumerate(pattern.trim):
        if t:
            zeros_shape = (*y.shape[: 2 + i], t, *y.shape[3 + i :])
            y = concat([y, xp.zeros(zeros_shape, dtype=y.dtype)], axis=2 + i)
    return y, moved


def transpose_shape(nd, x_shape, w_shape, stride, padding, out_padding, groups, dilation) -> tuple:
    """(the output shape, the Geometry) of a transposed convolution, checked as
    conv_transpose() checks its shape arguments, without asking any shim."""
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    _check_rank(_Shape("x", x_shape), nd, f"N, C_in, {SPATIAL[nd]}")
    _check_rank(_Shape("w", w_shape), nd, f"C_in, C_out/groups, {KERNEL[nd]}")
    groups_checked = as_groups(groups)
    if x_shape[1] != w_shape[0]:
        raise ValueError(
            f"w: a transposed convolution's w is (C_in, C_out/groups, ...) = ({x_shape[1]}, ...), "
            f"but w has shape {w_shape} for x of shape {x_shape}"
        )
    geo = geometry(nd, w_shape[2:], stride, padding, dilation, groups_checked, transposed=True)
    out_sp = transposed_output_sizes(x_shape[2:], w_shape[2:], geo, output_padding(out_padding, nd, geo))
    if any(s < 1 for s in out_sp):
        raise ValueError(f"padding: {padding!r} leaves an output of size {out_sp} for x {x_shape} and w {w_shape}")
    return (x_shape[0], w_shape[1] * groups_checked, *out_sp), geo


def _new_transpose(nd, x, w, bias, stride, padding, out_padding, groups, dilation, options) -> tuple:
    xo, wo = _operand(x, "x"), _operand(w, "w")
    out_shape, geo = transpose_shape(nd, xo.shape, wo.shape, stride, padding, out_padding, groups, dilation)
    kernel, out_sp = wo.shape[2:], out_shape[2:]
    bo = None if bias is None else _operand(bias, "bias")
    _check_bias(bo, out_shape[1])
    _check_same([xo, wo] if bo is None else [xo, wo, bo])
    conv_geo, trim = equivalent_convolution(out_sp, kernel, xo.shape[2:], geo)
    computed = (*out_shape[:2], *(n - t for n, t in zip(out_sp, trim)))
    if 0 not in computed[2:]:
        prepared = _prepare_backward_data(nd, xo, wo, computed, conv_geo, options, x_name="the output")
    else:  # nothing to compute: the output is zeros (its allocation and out= rules still hold)
        channels_last = is_channels_last(xo.shape, xo.adapter.strides(x))
        prepared = _Prepared(None, None, computed, channels_last, None, False, False, xo.adapter.empty, None, {})
    key = (_TRANSPOSE, nd, xo.adapter.key(x), wo.adapter.key(w), _key(bias, "bias"), stride, padding, out_padding,
           groups, dilation, options)  # fmt: skip
    return _remember(key, _Transposed(prepared, out_shape, trim if any(trim) else None))


# ------------------------------------------------------------------------------------------
# Reusable plans with packed weights


class ConvPlan(_core.PlanCall):
    """A forward convolution fixed for one input shape, dtype, layout and device, with its
    weights packed once into the layout the vendor computes in (when the shim can pack, which
    the oneDNN shim does). Calling it skips argument checking, the plan cache and the weight
    reorder; an input of another shape, dtype, layout or device raises ValueError or TypeError.
    Later changes to the weights are not seen: make a new plan. Made by ``flux_dnn.conv_plan``;
    ``plan.shim`` names the shim that serves it, ``plan.algorithm`` the vendor's implementation.

    ``plan(x)`` on the CPU, where the core makes the output itself (NumPy arrays; compact
    outputs of torch tensors, through DLPack's exchange API), runs in the core with no Python
    frame (_core.PlanCall's call slot); every other call goes to ``_call``."""

    def __init__(self, nd, x, w, bias, stride, padding, dilation, groups, options: ConvOptions):
        xo, wo = _operand(x, "x"), _operand(w, "w")
        bo = None if bias is None else _operand(bias, "bias")
        prepared = _prepare_forward(nd, xo, wo, bo, stride, padding, dilation, groups, options)
        if prepared.out_shape[0] == 0:
            raise ValueError(f"x: a convolution plan needs a batch of at least 1, got shape {xo.shape}")
        sample = prepared.empty(x, prepared.out_shape, prepared.channels_last)
        if _watched(prepared, options):  # packing makes the vendor plan: the tuning is here
            with _progress.tuning(lambda: _described(prepared, x=x, w=w)):
                self._packed, self.shim = self._pack(prepared, x, w, bias, sample)
        else:
            self._packed, self.shim = self._pack(prepared, x, w, bias, sample)
        self._run = self._packed.run
        self._type, self._empty, self._adapter = type(x), prepared.empty, xo.adapter
        self._out_shape, self._channels_last = prepared.out_shape, prepared.channels_last
        self._bias = bias  # exported on every call: a capsule is consumed once
        # and so are the weights of a shim that cannot pack them (cuDNN, MIOpen), given as a
        # capsule (torch's fast exporter) to a GPU plan
        self._w = None if self._packed.packed else w
        self._gpu, self._direct = prepared.gpu, prepared.direct
        if prepared.direct and self._core_makes_outputs(xo.adapter, prepared):
            self._bind_fast(self._packed, bias, type(x))
        self.input_shape, self.output_shape, self.dtype = xo.shape, prepared.out_shape, xo.dtype

    @staticmethod
    def _core_makes_outputs(provider, prepared: _Prepared) -> bool:
        """Whether the core makes this plan's outputs itself, so that plan(x) runs with no
        Python frame (_core.PlanCall): NumPy's in any layout (core_native), a core_memo
        provider's (DLPack's exchange API) when compact."""
        return provider.core_native or (provider.core_memo and not prepared.channels_last)

    @staticmethod
    def _pack(prepared: _Prepared, x, w, bias, sample):
        """The packed plan of the first shim that takes the problem (as _call_elsewhere), and
        that shim's name (``plan.shim``: what serves every call of the plan)."""
        problem = prepared.problem
        adapter = _BY_TYPE[type(x)]
        stream = adapter.streams(x) if prepared.gpu else None
        said = []
        for entry in _candidates(problem):
            spec = prepared.spec if entry.shim is prepared.shim else _spec(problem, entry.shim)
            try:
                packed = _core.PackedConv(
                    entry.shim, spec, _export(x), _export(w), _export(sample), _export(bias), stream
                )
                return packed, entry.shim.name
            except _core.UnsupportedError as refusal:
                said.append(f"shim {entry.shim.name!r}: {refusal}")
        raise _core.UnsupportedError(_refusals(problem.device[0], said))

    @property
    def algorithm(self) -> str:
        """The vendor implementation this plan runs."""
        return self._packed.algo_name

    @property
    def weights_packed(self) -> bool:
        return self._packed.packed

    def _call(self, x, *, out=None):
        """plan(x) or plan(x, out=out), for what the core's call slot does not take itself."""
        if type(x) is not self._type:
            raise TypeError(
                f"x: this plan was made for {self._type.__module__}.{self._type.__qualname__} arrays, "
                f"got {type(x).__module__}.{type(x).__qualname__}"
            )
        if out is None:
            out = self._empty(x, self._out_shape, self._channels_last)
        elif type(out) is not self._type:  # the core compares it with the plan
            return self._call_exported(x, out)
        if self._direct:
            self._run(x, out, self._bias, None, None)
            return out
        return self._call_exported(x, out)

    def _call_exported(self, x, out):
        adapter = self._adapter
        if self._gpu:
            stream, workspace = adapter.streams(x), lambda n: adapter.workspace(x, n)
        else:
            stream = workspace = None
        args = (adapter.export(x), _export(out), _export(self._bias, "bias"), stream, workspace)
        if self._w is None:
            self._run(*args)
        else:
            self._packed.run_with_weights(*args, _export(self._w, "w"))
        return out

    def __repr__(self):
        return f"ConvPlan(input {self.input_shape} {self.dtype} -> output {self.output_shape}, {self.algorithm})"
