"""Every op x 1/2/3-D x dtype x layout on every backend, then each feature and each fused
activation on its own, against the float64 reference; outputs poisoned with NaN first.

The axes that decide whether a case can run here (op, rank, dtype, layout) are parametrised;
the rest is drawn afresh per test (geometry: groups, depthwise, dilation, stride, kernel and
sizes; bias, activation, alpha/beta, out=), and the padding form cycles so that every op on
every backend meets every form. The seed of a failing test is printed with it
(FLUX_DNN_TEST_SEED=<seed> replays it)."""

import math

import numpy as np
import pytest

import flux_dnn
import reference as ref

from . import problems as P
from .conftest import DTYPES, OPS, RANKS
from .libraries import LAYOUTS

ACTIVATIONS = ("relu", "leaky_relu", "clip", "sigmoid", "tanh", "gelu_tanh", "gelu", "silu")


def padding_form(op, dtype, nd, layout) -> str:
    """The padding form of one matrix case: cycles over the forms across the cases of an op."""
    forms = P.TRANSPOSED_PADDING_FORMS if op == "transposed" else P.PADDING_FORMS
    index = (DTYPES.index(dtype) * len(RANKS) + nd - 1) * len(LAYOUTS) + LAYOUTS.index(layout)
    return forms[index % len(forms)]


@pytest.mark.matrix(op=OPS, dtype=DTYPES, nd=RANKS, layout=LAYOUTS)
def test_op(backend, rng, op, dtype, nd, layout):
    cap = backend.require(
        op, dtype, nd, layout=layout, features=("bias_gradient",) if op == "backward_weight_bias" else ()
    )
    g = P.draw(op, rng, nd, padding_form(op, dtype, nd, layout), cap, backend.lib, layout)
    e = P.draw_epilogue(rng, op, cap, backend.lib.writable)
    P.run_op(op, backend, rng, dtype, layout, g, e)


@pytest.mark.matrix(
    op=("forward", "backward_data", "backward_weight", "transposed"),
    feature=("groups", "depthwise", "dilation", "alpha_beta"),
)
def test_feature(backend, rng, op, feature):
    """Each feature forced on, in a dtype, rank and layout the backend takes (drawn)."""
    dtype = backend.some_dtype(op, rng)
    nd = int(rng.choice(sorted(backend.capability(op, dtype).ranks) or [2]))
    layout = str(rng.choice(backend.layouts()))
    abi_feature = "groups" if feature == "depthwise" else feature
    cap = backend.require(op, dtype, nd, layout=layout, features=(abi_feature,))
    forms = P.TRANSPOSED_PADDING_FORMS if op == "transposed" else P.PADDING_FORMS
    kinds = {
        "groups": dict(grouped="force", depthwise=False),
        "depthwise": dict(grouped="force", depthwise=True),
        "dilation": dict(dilated="force"),
    }.get(feature, {})
    g = P.draw(op, rng, nd, str(rng.choice(forms)), cap, backend.lib, layout, **kinds)
    e = P.draw_epilogue(rng, op, cap, backend.lib.writable, activation=None)
    if feature == "alpha_beta":
        e.alpha = -1.5
        if backend.lib.writable:
            e.beta, e.use_out = 0.5, True
    P.run_op(op, backend, rng, dtype, layout, g, e)


@pytest.mark.matrix(activation=ACTIVATIONS, dtype=DTYPES)
def test_activation(backend, rng, activation, dtype):
    """A fused activation after bias, in the shape vendors fuse (alpha 1, beta 0, into a
    poisoned output; timed candidates too for relu), then with alpha and beta accumulation."""
    cap = backend.require("forward", dtype, activation=activation)
    nd = int(rng.choice(sorted(cap.ranks)))
    layout = str(rng.choice(backend.layouts()))
    backend.require("forward", dtype, nd, activation=activation, layout=layout)
    g = P.draw("forward", rng, nd, str(rng.choice(P.PADDING_FORMS)), cap, backend.lib, layout)
    fused = P.Epilogue(bias=True, activation=activation, use_out=backend.lib.writable)
    for algorithm in ("heuristic", "benchmark") if activation == "relu" else ("heuristic",):
        P.run_op("forward", backend, rng, dtype, layout, g, fused, algorithm=algorithm)
    if "alpha_beta" in cap.features:
        writable = backend.lib.writable
        scaled = P.Epilogue(
            bias=True, activation=activation, alpha=0.75, beta=0.5 if writable else 0.0, use_out=writable
        )
        P.run_op("forward", backend, rng, dtype, layout, g, scaled, allow_reduced_precision=False)


@pytest.mark.matrix(libraries="first")
def test_plan_reports_packing_as_claimed(backend, rng):
    """A plan packs its weights exactly when the shim claims packing (ABI 2.0 reports it)."""
    dtype = backend.some_dtype("plan", rng)
    cap = backend.require("plan", dtype)
    g = P.draw("plan", rng, int(rng.choice(sorted(cap.ranks))), "int", cap)
    plan = P.RUNNERS["plan"](backend.lib, rng, dtype, "contiguous", g, P.Epilogue(), {}, repr(backend))
    assert plan.weights_packed == ("pack_weights" in cap.features)


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


#: Activations that do not commute with scaling (act(alpha * v) != alpha * act(v)), in
#: float64, written here rather than taken from reference.py (whose epilogue they check).
NON_COMMUTING = {
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
    "gelu": lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
    "silu": lambda v: v * _sigmoid(v),
}


@pytest.mark.matrix(activation=tuple(NON_COMMUTING), alpha=(-1.5, 0.5), beta=(0.0, 1.0))
def test_alpha_scales_the_activated_result(backend, rng, activation, alpha, beta):
    """Issue 23: every shim computes the header's y = alpha * act(conv + bias) + beta * y,
    never act(alpha * (conv + bias)); into a NaN-poisoned out= (beta 0) or onto old values."""
    dtype = backend.some_dtype("forward", rng, prefer="float32")
    cap = backend.require("forward", dtype, activation=activation, features=("alpha_beta",))
    if beta and not backend.lib.writable:
        pytest.skip(f"{backend.lib.name} arrays cannot be written: beta needs out=")
    nd = int(rng.choice(sorted(cap.ranks)))
    layout = str(rng.choice(backend.layouts()))
    backend.require("forward", dtype, nd, activation=activation, layout=layout)
    g = P.draw("forward", rng, nd, "int", cap, backend.lib, layout)
    x, w, b, old = (P.grid(rng, s) for s in (g.x_shape, g.w_shape, (g.K,), g.y_shape))
    expected = alpha * NON_COMMUTING[activation](ref.conv_forward(x, w, b, *g.ref())) + beta * old
    lib = backend.lib
    out = None
    if lib.writable:
        out = lib.array(old, dtype, layout) if beta else lib.nan(g.y_shape, dtype, layout)
    result = flux_dnn.conv(
        lib.array(x, dtype, layout),
        lib.array(w, dtype),
        lib.array(b, dtype),
        **g.kwargs(),
        activation=activation,
        alpha=alpha,
        beta=beta,
        out=out,
        allow_reduced_precision=False,
    )
    P.assert_close(lib, result, expected, dtype, f"alpha * {activation}(conv + bias) + beta * y", repr(backend))
