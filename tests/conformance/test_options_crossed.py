"""The options of every op crossed (issue 23): algorithm policy x alpha x beta, on every
backend, against a float64 reference written here; outputs poisoned with NaN first.

Each option has its own test elsewhere; a wrong answer can hide in their product (benchmark
mode once scaled float32 backward results wrongly while heuristic plans and alpha = 1 were
exact). The product is too large to enumerate in CI, so it is split:

- parametrised, per backend: op (forward, backward-data, backward-weight, transposed) x
  algorithm policy (heuristic, benchmark, given) x alpha (1, a fraction, a negative) x beta
  (0, 1). "given" runs the op once for every algorithm id the shim reports for the drawn
  problem: the ids its heuristic and benchmark plans choose, and each small id (0-15) it
  takes back as given (``_core.plan_info``, planned only);
- drawn per test from the ``rng`` fixture (its seed is printed; FLUX_DNN_TEST_SEED=<seed>
  replays it): the dtype and the layout among those the shim claims and the array library
  holds, the rank, the geometry (groups, dilation, stride, padding form, sizes), bias, and
  on forward the fused activation, weighted towards those that do not commute with scaling
  (sigmoid, tanh, gelu, silu); a forward case with beta = 0 runs through ``conv_plan`` too.
- test_activation_scaled crosses each of those four activations with a fractional and a
  negative alpha and both betas explicitly, the policy drawn.

The epilogue is the one meaning the project settles on (issue 23): the written tensor gets
``out = alpha * act(result + bias) + beta * out`` (activation and bias on forward only;
transposed convolution's bias inside the scaled part). ``epilogue`` below is its float64
reference."""

from __future__ import annotations

import numpy as np
import pytest

import flux_dnn
import reference as ref
from flux_dnn import _core

from . import problems as P
from .conftest import ABI_OP, ACTIVATION_CODES

OPS = ("forward", "backward_data", "backward_weight", "transposed")
POLICIES = ("heuristic", "benchmark", "given")
ALPHAS = (1.0, 0.375, -1.5)
BETAS = (0.0, 1.0)
#: Activations whose value changes when alpha is applied before rather than after them.
NOT_COMMUTING = ("sigmoid", "tanh", "gelu", "silu")
#: The small algorithm ids asked for as given (the CPU shims number theirs 0-8).
PROBED_IDS = range(16)


def epilogue(result, alpha: float, beta: float = 0.0, old=None, activation=None) -> np.ndarray:
    """out = alpha * act(result) + beta * out_old in float64 (result includes the bias)."""
    out = alpha * ref.activate(np.asarray(result, dtype=np.float64), activation)
    if beta != 0.0:
        out = out + beta * np.asarray(old, dtype=np.float64)
    return out


class Case:
    """One crossed case: the options and what was drawn for it."""

    def __init__(self, op, dtype, layout, g, alpha, beta, bias=False, activation=None):
        self.op, self.dtype, self.layout, self.g = op, dtype, layout, g
        self.alpha, self.beta, self.bias, self.activation = alpha, beta, bias, activation

    @property
    def act(self):
        """The activation as flux_dnn takes it (with its parameters, where it has them)."""
        return P.activation_arg(self.activation)

    def __repr__(self):
        return (
            f"{self.op} {self.dtype} {self.layout} alpha={self.alpha} beta={self.beta} bias={self.bias} "
            f"activation={self.activation} {self.g}"
        )


# ------------------------------------------------------------------------------------------
# Running one case through flux_dnn's public API


def _out(lib, shape, dtype, layout, beta, old):
    """The out= array: NaN unless beta reads it (then the old values); None where the library
    cannot be written into (beta is 0 there)."""
    if not lib.writable:
        return None
    return lib.nan(shape, dtype, layout) if beta == 0.0 else lib.array(old, dtype, layout)


def _forward(lib, rng, c: Case, algorithm, context, fresh_store):
    g = c.g
    x, w = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape)
    b = P.grid(rng, (g.K,)) if c.bias else None
    old = P.grid(rng, g.y_shape)
    expected = epilogue(ref.conv_forward(x, w, b, *g.ref()), c.alpha, c.beta, old, c.act)
    xd, wd = lib.array(x, c.dtype, c.layout), lib.array(w, c.dtype)
    bd = None if b is None else lib.array(b, c.dtype)
    out = _out(lib, g.y_shape, c.dtype, c.layout, c.beta, old)
    fresh_store()
    result = flux_dnn.conv(
        xd, wd, bd, **g.kwargs(), activation=c.act, alpha=c.alpha, beta=c.beta, out=out, algorithm=algorithm
    )
    P.check_result(lib, result, out, c.dtype, P.result_layout(lib, xd, c.layout), "conv")
    P.assert_close(lib, result, expected, c.dtype, "conv", context)
    if c.beta != 0.0:
        return  # a plan takes no beta
    fresh_store()  # (so that benchmark mode times candidates again, not the choice just stored)
    plan = flux_dnn.conv_plan(xd, wd, bd, **g.kwargs(), activation=c.act, alpha=c.alpha, algorithm=algorithm)
    x2 = P.grid(rng, g.x_shape)
    expected = epilogue(ref.conv_forward(x2, w, b, *g.ref()), c.alpha, activation=c.act)
    x2d = lib.array(x2, c.dtype, c.layout)
    out_layout = P.result_layout(lib, x2d, c.layout)
    out = _out(lib, g.y_shape, c.dtype, out_layout, 0.0, None)
    result = plan(x2d) if out is None else plan(x2d, out=out)
    P.check_result(lib, result, out, c.dtype, out_layout, "plan")
    P.assert_close(lib, result, expected, c.dtype, "plan", context)


def _backward_data(lib, rng, c: Case, algorithm, context, fresh_store):
    g = c.g
    dy, w = P.grid(rng, g.y_shape), P.grid(rng, g.w_shape)
    old = P.grid(rng, g.x_shape)
    expected = epilogue(ref.conv_backward_data(dy, w, g.x_shape, *g.ref()), c.alpha, c.beta, old)
    out = _out(lib, g.x_shape, c.dtype, c.layout, c.beta, old)
    fresh_store()
    result = flux_dnn.conv_backward_data(
        lib.array(dy, c.dtype, c.layout),
        lib.array(w, c.dtype),
        g.x_shape,
        **g.kwargs(),
        alpha=c.alpha,
        beta=c.beta,
        out=out,
        algorithm=algorithm,
    )
    P.check_result(lib, result, out, c.dtype, None, "conv_backward_data")
    P.assert_close(lib, result, expected, c.dtype, "conv_backward_data", context)


def _backward_weight(lib, rng, c: Case, algorithm, context, fresh_store):
    g = c.g
    x, dy = P.grid(rng, g.x_shape), P.grid(rng, g.y_shape)
    old = P.grid(rng, g.w_shape)
    expected = epilogue(ref.conv_backward_weight(x, dy, g.w_shape, *g.ref()), c.alpha, c.beta, old)
    out = _out(lib, g.w_shape, c.dtype, "contiguous", c.beta, old)
    fresh_store()
    result = flux_dnn.conv_backward_weight(
        lib.array(x, c.dtype, c.layout),
        lib.array(dy, c.dtype, c.layout),
        g.w_shape,
        **g.kwargs(),
        alpha=c.alpha,
        beta=c.beta,
        out=out,
        algorithm=algorithm,
    )
    P.check_result(lib, result, out, c.dtype, None, "conv_backward_weight")
    P.assert_close(lib, result, expected, c.dtype, "conv_backward_weight", context)


def _transposed(lib, rng, c: Case, algorithm, context, fresh_store):
    g = c.g
    x, w = P.grid(rng, g.x_shape), P.grid(rng, g.w_shape)
    b = P.grid(rng, (g.K,)) if c.bias else None
    old = P.grid(rng, g.y_shape)
    plain = ref.conv_transpose(x, w, b, g.stride, tuple(zip(g.lo, g.hi)), g.output_padding, g.dilation, g.groups)
    expected = epilogue(plain, c.alpha, c.beta, old)
    xd = lib.array(x, c.dtype, c.layout)
    out = _out(lib, g.y_shape, c.dtype, c.layout, c.beta, old)
    fresh_store()
    result = flux_dnn.conv_transpose(
        xd,
        lib.array(w, c.dtype),
        None if b is None else lib.array(b, c.dtype),
        stride=g.stride,
        padding=g.padding,
        output_padding=g.output_padding,
        groups=g.groups,
        dilation=g.dilation,
        alpha=c.alpha,
        beta=c.beta,
        out=out,
        algorithm=algorithm,
    )
    P.check_result(lib, result, out, c.dtype, P.result_layout(lib, xd, c.layout), "conv_transpose")
    P.assert_close(lib, result, expected, c.dtype, "conv_transpose", context)


RUNNERS = {
    "forward": _forward,
    "backward_data": _backward_data,
    "backward_weight": _backward_weight,
    "transposed": _transposed,
}


# ------------------------------------------------------------------------------------------
# The algorithm ids a shim reports for a problem


def _abi_problem(c: Case):
    """(x, w, y, bias shapes and layouts, padding lo, hi) of the case as the ABI names its
    tensors (backward-data writes x; a transposed convolution is the backward-data of the
    convolution from its output to its input, drawn with output_padding below the stride so
    that this convolution has the same geometry)."""
    g = c.g
    if c.op == "transposed":
        assert all(p < s for p, s in zip(g.output_padding, g.stride)), g
        return (g.y_shape, c.layout), (g.w_shape, "contiguous"), (g.x_shape, c.layout), None
    bias = ((g.K,), "contiguous") if c.op == "forward" and c.bias else None
    return (g.x_shape, c.layout), (g.w_shape, "contiguous"), (g.y_shape, c.layout), bias


def reported_ids(backend, c: Case) -> list:
    """Every algorithm id the shim reports for the case: the ids its heuristic and (where it
    claims benchmarking) benchmark plans choose, and the id it reports back for each small id
    it takes as given. Plans only (``_core.plan_info``), on zero arrays of the case's layouts."""
    lib, g = backend.lib, c.g
    shapes = _abi_problem(c)
    arrays = [None if s is None else lib.array(np.zeros(s[0]), c.dtype, s[1]) for s in shapes]
    code, act_alpha, act_beta = 0, 0.0, 0.0
    if c.activation is not None:
        code = ACTIVATION_CODES[c.activation]
        params = list(c.act[1:]) if isinstance(c.act, tuple) else []
        act_alpha, act_beta = (params + [0.0, 0.0])[:2]
    shim = _core.load_shim(backend.status.path)

    def plan(policy: int, algo_id: int = 0) -> int:
        spec = _core.ConvSpec(
            ABI_OP[c.op],
            g.nd,
            list(g.stride),
            list(g.dilation),
            list(g.lo),
            list(g.hi),
            g.groups,
            c.alpha,
            c.beta,
            code,
            act_alpha,
            act_beta,
            backend.status.default_flags,
            policy,
            algo_id,
        )
        return _core.plan_info(shim, spec, *arrays)["algo_id"]

    ids = {plan(_core.ALGO_HEURISTIC)}
    if "benchmark" in backend.capability(c.op, c.dtype).features:
        ids.add(plan(_core.ALGO_BENCHMARK))
    for algo in PROBED_IDS:
        try:
            ids.add(plan(_core.ALGO_GIVEN, algo))
        except (ValueError, flux_dnn.UnsupportedError):
            continue  # not an id of this shim, or not one for this problem
    return sorted(ids)


# ------------------------------------------------------------------------------------------
# The tests


@pytest.fixture
def fresh_store(tmp_path):
    """A function that points the autotune store at a new empty file and empties the plan
    cache, so that algorithm="benchmark" times its candidates in the shim rather than replaying
    a choice stored by an earlier call (the client turns a stored choice into a given id)."""
    saved = _core.autotune_path()
    count = [0]

    def fresh():
        count[0] += 1
        _core.set_autotune_path(str(tmp_path / f"autotune{count[0]}.txt"))
        flux_dnn.clear_plan_cache()

    yield fresh
    _core.set_autotune_path(saved)
    flux_dnn.clear_plan_cache()


def _draw_activation(rng, cap) -> str | None:
    """None, or a claimed activation, those that do not commute with scaling twice as likely."""
    claimed = sorted(cap.activations)
    choices = [None, None, *claimed, *(a for a in claimed if a in NOT_COMMUTING)]
    return choices[int(rng.integers(len(choices)))]


def _require_options(backend, op, dtype, policy, alpha, beta):
    features = []
    if alpha != 1.0 or beta != 0.0:
        features.append("alpha_beta")
    if policy == "benchmark":
        features.append("benchmark")
    if beta != 0.0 and not backend.lib.writable:
        pytest.skip(f"{backend.lib.name} arrays cannot be written into: no out= for beta to accumulate into")
    return backend.require(op, dtype, features=features)


def _draw_case(backend, rng, op, policy, alpha, beta, activation="draw", dtype=None) -> Case:
    dtype = dtype or backend.some_dtype(op, rng)
    cap = _require_options(backend, op, dtype, policy, alpha, beta)
    nd = int(rng.choice(sorted(cap.ranks)))
    layout = str(rng.choice(backend.layouts()))
    cap = backend.require(op, dtype, nd, layout=layout)
    forms = P.TRANSPOSED_PADDING_FORMS if op == "transposed" else P.PADDING_FORMS
    kinds = {"beyond_stride": False} if op == "transposed" and policy == "given" else {}
    g = P.draw(op, rng, nd, str(rng.choice(forms)), cap, backend.lib, layout, **kinds)
    bias = op in ("forward", "transposed") and bool(rng.random() < 0.5)
    if op == "forward" and activation == "draw":
        activation = _draw_activation(rng, cap)
    elif op != "forward":
        activation = None
    if activation is not None:
        backend.require(op, dtype, nd, activation=activation, layout=layout)
    return Case(op, dtype, layout, g, alpha, beta, bias, activation)


def _run(backend, rng, c: Case, policy, fresh_store):
    runner = RUNNERS[c.op]
    if policy != "given":
        context = f"{backend!r}, {c}, algorithm={policy!r}"
        runner(backend.lib, rng, c, policy, context, fresh_store)
        return
    ids = reported_ids(backend, c)
    assert ids, f"the shim reported no algorithm id for {c}"
    for algo in ids:
        context = f"{backend!r}, {c}, algorithm={algo} (ids reported: {ids})"
        runner(backend.lib, rng, c, algo, context, fresh_store)


@pytest.mark.matrix(op=OPS, policy=POLICIES, alpha=ALPHAS, beta=BETAS)
def test_crossed(backend, rng, fresh_store, op, policy, alpha, beta):
    """One op with one algorithm policy, alpha and beta, in a drawn dtype, layout, rank and
    geometry (and on forward a drawn activation); given: every id the shim reports."""
    c = _draw_case(backend, rng, op, policy, alpha, beta)
    _run(backend, rng, c, policy, fresh_store)


@pytest.mark.matrix(activation=NOT_COMMUTING, alpha=ALPHAS[1:], beta=BETAS)
def test_activation_scaled(backend, rng, fresh_store, activation, alpha, beta):
    """A fused activation that does not commute with scaling, with a fractional or a negative
    alpha, with bias: alpha * act(conv + bias) + beta * out, not act(alpha * (conv + bias))."""
    policy = str(rng.choice(POLICIES))
    dtype = backend.some_dtype("forward", rng)
    backend.require("forward", dtype, activation=activation)
    c = _draw_case(backend, rng, "forward", policy, alpha, beta, activation=activation, dtype=dtype)
    c.bias = True
    _run(backend, rng, c, policy, fresh_store)
