"""Random convolution problems, the calls of every op through flux_dnn's public API on a
backend's arrays, and the comparison with the float64 reference.

Values are quarters in [-1, 1] (``grid``): exact in every dtype under test, with products and
float32 sums exact, so a result differs from the float64 reference only by its own rounding
(and by a fused activation's arithmetic)."""

from __future__ import annotations

import dataclasses

import numpy as np

import flux_dnn
import reference as ref

#: Relative tolerance per dtype, against max(1, |expected|): a float32 result of exact
#: inputs is exact up to activations; a 16-bit one is rounded once or twice.
TOLERANCE = {"float64": 1e-12, "float32": 2e-4, "float16": 2e-3, "bfloat16": 1e-2}
PADDING_FORMS = ("int", "tuple", "pairs", "same", "valid")
TRANSPOSED_PADDING_FORMS = ("int", "tuple", "pairs")  # conv_transpose takes no strings
#: Parameters for the activations that take them (exact in every dtype).
ACTIVATION_ARGS = {"leaky_relu": ("leaky_relu", 0.25), "clip": ("clip", -0.5, 0.75)}


def grid(rng, shape) -> np.ndarray:
    """float64 quarters in [-1, 1]: exact in every dtype under test."""
    return rng.integers(-4, 5, shape) / 4


def activation_arg(name: str | None):
    """What flux_dnn takes for an activation name (with parameters where it has them)."""
    return ACTIVATION_ARGS.get(name, name)


# ------------------------------------------------------------------------------------------
# Geometry


@dataclasses.dataclass
class Geometry:
    """One convolution y = conv(x, w): x (N, C, *spatial), w (K, C/groups, *kernel). For a
    transposed convolution, x (N, C_in, *spatial) and w (C_in, C_out/groups, *kernel) with C
    the input's channels and K = C_out; output_padding is then set."""

    nd: int
    N: int
    C: int
    K: int
    groups: int
    kernel: tuple
    stride: tuple
    dilation: tuple
    lo: tuple
    hi: tuple
    spatial: tuple
    padding: object  # the argument as passed to flux_dnn (its form)
    form: str
    output_padding: tuple | None = None

    @property
    def x_shape(self):
        return (self.N, self.C, *self.spatial)

    @property
    def w_shape(self):
        if self.output_padding is not None:
            return (self.C, self.K // self.groups, *self.kernel)
        return (self.K, self.C // self.groups, *self.kernel)

    @property
    def y_shape(self):
        if self.output_padding is not None:
            out = [
                (self.spatial[i] - 1) * self.stride[i]
                - self.lo[i]
                - self.hi[i]
                + self.dilation[i] * (self.kernel[i] - 1)
                + self.output_padding[i]
                + 1
                for i in range(self.nd)
            ]
        else:
            out = [
                ref.out_size(self.spatial[i], self.kernel[i], self.stride[i], self.dilation[i], self.lo[i], self.hi[i])
                for i in range(self.nd)
            ]
        return (self.N, self.K, *out)

    def kwargs(self) -> dict:
        """The geometry arguments of flux_dnn.conv and the backward ops."""
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups)

    def ref(self) -> tuple:
        """The geometry arguments of reference.conv_* after x/w/dy."""
        return (self.stride, self.lo, self.hi, self.dilation, self.groups)


def _ints(rng, low, high, n) -> tuple:
    return tuple(int(v) for v in rng.integers(low, high, n))


def _channels(rng, groups, depthwise):
    """(input channels per group, outputs per group)."""
    if depthwise:
        return 1, int(rng.integers(1, 3))  # a depth multiplier of 1 or 2
    return int(rng.integers(1, 4)), int(rng.integers(1, 4))


def _groups(rng, grouped, depthwise):
    if depthwise or grouped == "force":
        return int(rng.choice([2, 3, 4]))
    return int(rng.choice([1, 1, 2, 3])) if grouped else 1


def _dilation(rng, nd, dilated):
    dilation = _ints(rng, 1, 3, nd) if dilated else (1,) * nd
    if dilated == "force" and max(dilation) == 1:
        dilation = tuple(2 if i == int(rng.integers(nd)) else 1 for i in range(nd))
    return dilation


def draw_geometry(rng, nd: int, form: str, grouped=True, depthwise=None, dilated=True, N=None) -> Geometry:
    """A random convolution with its padding given in `form`; grouped / dilated: True (maybe),
    False (never) or "force"; depthwise: None (maybe, when grouped), True or False."""
    if depthwise is None:
        depthwise = bool(grouped) and rng.random() < 0.25
    groups = _groups(rng, grouped, depthwise)
    cg, kg = _channels(rng, groups, depthwise)
    kernel = _ints(rng, 1, 4, nd)
    dilation = _dilation(rng, nd, dilated)
    stride = (1,) * nd if form == "same" else _ints(rng, 1, 3, nd)
    size = 6 if nd == 3 else 11
    spatial = tuple(max(int(v), d * (k - 1) + 1) for v, d, k in zip(rng.integers(3, size, nd), dilation, kernel))
    lo, hi, padding = _padding(rng, nd, form, dilation, kernel)
    return Geometry(
        nd,
        int(rng.choice([1, 2, 3])) if N is None else N,
        cg * groups,
        kg * groups,
        groups,
        kernel,
        stride,
        dilation,
        lo,
        hi,
        spatial,
        padding,
        form,
    )


def _padding(rng, nd, form, dilation, kernel):
    """(lo, hi, the argument) for a padding form."""
    if form == "int":
        p = int(rng.integers(0, 3))
        return (p,) * nd, (p,) * nd, p
    if form == "tuple":
        p = _ints(rng, 0, 3, nd)
        return p, p, p
    if form == "pairs":
        lo, hi = _ints(rng, 0, 3, nd), _ints(rng, 0, 3, nd)
        return lo, hi, tuple(zip(lo, hi))
    if form == "same":  # PyTorch's split: the odd element of the total goes to the end
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        lo = tuple(t // 2 for t in total)
        return lo, tuple(t - low for t, low in zip(total, lo)), "same"
    assert form == "valid", form
    return (0,) * nd, (0,) * nd, "valid"


def draw_transposed(
    rng, nd: int, form: str, grouped=True, depthwise=None, dilated=True, beyond_stride=True
) -> Geometry:
    """A random transposed convolution; output_padding below stride or dilation (the rule),
    reaching beyond the stride where the dilation allows (unless beyond_stride is False)."""
    if depthwise is None:
        depthwise = bool(grouped) and rng.random() < 0.25
    groups = _groups(rng, grouped, depthwise)
    cg, kg = _channels(rng, groups, depthwise)
    kernel = _ints(rng, 1, 4, nd)
    stride = _ints(rng, 1, 3, nd)
    dilation = _dilation(rng, nd, dilated)
    limit = [d * (k - 1) // 2 + 1 for d, k in zip(dilation, kernel)]
    lo = tuple(int(rng.integers(0, m)) for m in limit)
    hi = tuple(int(rng.integers(0, m)) for m in limit) if form == "pairs" else lo
    if form == "int":
        lo = hi = (min(lo),) * nd
    padding = tuple(zip(lo, hi)) if form == "pairs" else (lo[0] if form == "int" else lo)
    output_padding = tuple(int(rng.integers(0, max(s, d) if beyond_stride else s)) for s, d in zip(stride, dilation))
    spatial = _ints(rng, 2, 5 if nd == 3 else 7, nd)
    return Geometry(
        nd,
        int(rng.choice([1, 2])),
        cg * groups,
        kg * groups,
        groups,
        kernel,
        stride,
        dilation,
        lo,
        hi,
        spatial,
        padding,
        form,
        output_padding,
    )


# ------------------------------------------------------------------------------------------
# Epilogue: bias, activation, alpha, beta, out=


@dataclasses.dataclass
class Epilogue:
    bias: bool = False
    activation: str | None = None  # a name; activation_arg() gives what flux_dnn takes
    alpha: float = 1.0
    beta: float = 0.0
    use_out: bool = False  # into a given array (poisoned unless beta accumulates into it)

    @property
    def act(self):
        return activation_arg(self.activation)


def draw_epilogue(rng, op: str, cap, writable: bool, activation="draw") -> Epilogue:
    """A random epilogue within what the shim claims (cap) and the library allows."""
    e = Epilogue()
    if op in ("forward", "plan", "transposed"):
        e.bias = bool(rng.random() < 0.5)
    if op in ("forward", "plan"):
        if activation == "draw":
            choices = [None, None, *sorted(cap.activations)]
            activation = choices[int(rng.integers(len(choices)))]
        e.activation = activation
    if "alpha_beta" in cap.features:
        e.alpha = float(rng.choice([1.0, 1.0, 0.5, -1.5]))
        if writable and op != "plan":
            e.beta = float(rng.choice([0.0, 0.0, 1.0, 0.5]))
    e.use_out = writable and (e.beta != 0.0 or rng.random() < 0.6)
    return e


# ------------------------------------------------------------------------------------------
# Comparing


def assert_close(lib, got, expected, dtype: str, what: str, context) -> None:
    values = lib.numpy(got)
    assert values.shape == expected.shape, f"{what}: shape {values.shape}, expected {expected.shape} ({context})"
    assert not np.isnan(values).any(), f"{what}: unwritten (NaN) elements remain ({context})"
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(
        values,
        expected,
        rtol=tol,
        atol=tol * max(1.0, float(np.abs(expected).max(initial=0))),
        err_msg=f"{what} ({context})",
    )


def check_result(lib, result, out, dtype: str, layout: str | None, what: str) -> None:
    """result is out when out was given; else a new array of the library and dtype, in
    `layout` unless that is None."""
    if out is not None:
        assert result is out, f"{what}: the result is not the out= array"
        return
    assert lib.is_array(result), f"{what}: a {type(result).__module__}.{type(result).__name__}, not a {lib.name} array"
    assert lib.dtype_name(result) == dtype, f"{what}: dtype {lib.dtype_name(result)}, not {dtype}"
    if layout is not None:
        assert lib.has_layout(result, layout), f"{what}: the result is not {layout} like its input"


def result_layout(lib, x, layout: str) -> str:
    """The layout of a result made from x: channels-last in, channels-last out, where x's
    strides are channels-last only (when they are also contiguous, as with one channel, the
    result is contiguous)."""
    return "channels_last" if layout == "channels_last" and not lib.has_layout(x, "contiguous") else "contiguous"


def _output(lib, shape, dtype, layout, e: Epilogue, old):
    """The out= array: poisoned, or the old values beta accumulates onto; None when fresh."""
    if not e.use_out:
        return None
    return lib.nan(shape, dtype, layout) if e.beta == 0.0 else lib.array(old, dtype, layout)


# ------------------------------------------------------------------------------------------
# The ops


def run_op(op: str, backend, rng, dtype: str, layout: str, g: Geometry, e: Epilogue, **options) -> None:
    """One call of op on the backend's arrays, checked against the reference. options go to
    flux_dnn as they are (deterministic, algorithm, allow_reduced_precision, ...)."""
    context = f"{backend!r}, {op}, {dtype}, {layout}, {g}, {e}, {options}"
    RUNNERS[op](backend.lib, rng, dtype, layout, g, e, options, context)


def _forward(lib, rng, dtype, layout, g, e, options, context):
    x, w = grid(rng, g.x_shape), grid(rng, g.w_shape)
    b = grid(rng, (g.K,)) if e.bias else None
    old = grid(rng, g.y_shape)
    expected = ref.epilogue(ref.conv_forward(x, w, b, *g.ref()), e.alpha, e.beta, old, e.act)
    xd = lib.array(x, dtype, layout)
    out = _output(lib, g.y_shape, dtype, layout, e, old)
    result = flux_dnn.conv(
        xd,
        lib.array(w, dtype),
        None if b is None else lib.array(b, dtype),
        **g.kwargs(),
        activation=e.act,
        alpha=e.alpha,
        beta=e.beta,
        out=out,
        **options,
    )
    check_result(lib, result, out, dtype, result_layout(lib, xd, layout), "conv")
    assert_close(lib, result, expected, dtype, "conv", context)


def _plan(lib, rng, dtype, layout, g, e, options, context):
    """A plan made on one input and run on it and on another of its kind."""
    x1, x2, w = grid(rng, g.x_shape), grid(rng, g.x_shape), grid(rng, g.w_shape)
    b = grid(rng, (g.K,)) if e.bias else None
    plan = flux_dnn.conv_plan(
        lib.array(x1, dtype, layout),
        lib.array(w, dtype),
        None if b is None else lib.array(b, dtype),
        **g.kwargs(),
        activation=e.act,
        alpha=e.alpha,
        **options,
    )
    assert tuple(plan.output_shape) == g.y_shape, (plan.output_shape, context)
    for x in (x1, x2):
        expected = ref.epilogue(ref.conv_forward(x, w, b, *g.ref()), e.alpha, activation=e.act)
        xd = lib.array(x, dtype, layout)
        out_layout = result_layout(lib, xd, layout)  # a plan takes out= in its result's layout only
        out = _output(lib, g.y_shape, dtype, out_layout, e, None)
        result = plan(xd) if out is None else plan(xd, out=out)
        check_result(lib, result, out, dtype, out_layout, "plan")
        assert_close(lib, result, expected, dtype, "plan", context)
    return plan


def _backward_data(lib, rng, dtype, layout, g, e, options, context):
    dy, w = grid(rng, g.y_shape), grid(rng, g.w_shape)
    old = grid(rng, g.x_shape)
    expected = ref.epilogue(ref.conv_backward_data(dy, w, g.x_shape, *g.ref()), e.alpha, e.beta, old)
    out = _output(lib, g.x_shape, dtype, layout, e, old)
    result = flux_dnn.conv_backward_data(
        lib.array(dy, dtype, layout),
        lib.array(w, dtype),
        g.x_shape,
        **g.kwargs(),
        alpha=e.alpha,
        beta=e.beta,
        out=out,
        **options,
    )
    check_result(lib, result, out, dtype, None, "conv_backward_data")
    assert_close(lib, result, expected, dtype, "conv_backward_data", context)


def _backward_weight(lib, rng, dtype, layout, g, e, options, context, bias_grad=False):
    x, dy = grid(rng, g.x_shape), grid(rng, g.y_shape)
    old_w, old_b = grid(rng, g.w_shape), grid(rng, (g.K,))
    expected_w = ref.epilogue(ref.conv_backward_weight(x, dy, g.w_shape, *g.ref()), e.alpha, e.beta, old_w)
    db_sum = dy.sum(axis=(0, *range(2, g.nd + 2)))
    expected_b = ref.epilogue(db_sum, e.alpha, e.beta, old_b)
    dw_out = _output(lib, g.w_shape, dtype, "contiguous", e, old_w)
    db_out = _output(lib, (g.K,), dtype, "contiguous", e, old_b) if bias_grad else None
    xd, dyd = lib.array(x, dtype, layout), lib.array(dy, dtype, layout)
    result = flux_dnn.conv_backward_weight(
        xd,
        dyd,
        g.w_shape,
        **g.kwargs(),
        bias_grad=bias_grad,
        alpha=e.alpha,
        beta=e.beta,
        out=(dw_out, db_out) if bias_grad and e.use_out else dw_out,
        **options,
    )
    if not bias_grad:
        check_result(lib, result, dw_out, dtype, None, "conv_backward_weight")
        assert_close(lib, result, expected_w, dtype, "conv_backward_weight", context)
        return
    dw, db = result
    check_result(lib, dw, dw_out, dtype, None, "conv_backward_weight dw")
    check_result(lib, db, db_out, dtype, None, "conv_backward_weight db")
    assert_close(lib, dw, expected_w, dtype, "conv_backward_weight dw", context)
    assert_close(lib, db, expected_b, dtype, "conv_backward_weight db", context)
    summed = flux_dnn.conv_backward_bias(dyd)  # the array library's own sum
    check_result(lib, summed, None, dtype, None, "conv_backward_bias")
    assert_close(lib, summed, db_sum, dtype, "conv_backward_bias", context)


def _backward_weight_bias(*args):
    _backward_weight(*args, bias_grad=True)


def _transposed(lib, rng, dtype, layout, g, e, options, context):
    x, w = grid(rng, g.x_shape), grid(rng, g.w_shape)
    b = grid(rng, (g.K,)) if e.bias else None
    old = grid(rng, g.y_shape)
    plain = ref.conv_transpose(x, w, b, g.stride, tuple(zip(g.lo, g.hi)), g.output_padding, g.dilation, g.groups)
    expected = ref.epilogue(plain, e.alpha, e.beta, old)
    xd = lib.array(x, dtype, layout)
    out = _output(lib, g.y_shape, dtype, layout, e, old)
    result = flux_dnn.conv_transpose(
        xd,
        lib.array(w, dtype),
        None if b is None else lib.array(b, dtype),
        stride=g.stride,
        padding=g.padding,
        output_padding=g.output_padding,
        groups=g.groups,
        dilation=g.dilation,
        alpha=e.alpha,
        beta=e.beta,
        out=out,
        **options,
    )
    check_result(lib, result, out, dtype, result_layout(lib, xd, layout), "conv_transpose")
    assert_close(lib, result, expected, dtype, "conv_transpose", context)


RUNNERS = {
    "forward": _forward,
    "plan": _plan,
    "backward_data": _backward_data,
    "backward_weight": _backward_weight,
    "backward_weight_bias": _backward_weight_bias,
    "transposed": _transposed,
}


# Defects of flux_dnn itself that this suite found. Each has a strict xfail test in
# test_known_defects.py, and the random draws keep clear of it, so that the matrix stays a
# check of the shims. When a defect is fixed its xfail passes, which fails the run: then
# delete the test's mark and the avoidance here.
# None is open now.
KNOWN_DEFECTS: set = set()


def draw(op: str, rng, nd: int, form: str, cap, lib=None, layout="contiguous", **kinds) -> Geometry:
    """A geometry for op, with only the features the shim claims (kinds may force some),
    clear of the known defects for the array library lib and the layout (a defect may
    depend on either; none now depends on the layout)."""
    kinds.setdefault("grouped", "groups" in cap.features)
    kinds.setdefault("dilated", "dilation" in cap.features)
    if op == "transposed":
        return draw_transposed(rng, nd, form, **kinds)
    return draw_geometry(rng, nd, form, **kinds)
