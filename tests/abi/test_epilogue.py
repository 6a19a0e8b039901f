"""The epilogue of the header (issue 23), on every shim library through ctypes:

  - the benchmark policy computes what the heuristic computes: with alpha != 1 every float32
    backward-data and backward-weight plan the oneDNN shim timed scaled its result by a float
    read from freed memory (the timed candidate's alpha, bound before the plan moved);
  - out = alpha * act(conv + bias) + beta * out, one meaning on every shim, checked with
    activations that do not commute with scaling and negative or fractional alpha.

Inputs are fresh random values per run (the `rng` fixture prints the seed), outputs are
poisoned with NaN unless beta reads them, and the float64 reference is computed here."""

from __future__ import annotations

import math

import numpy as np
import pytest

import reference as ref

from .fdnn_ctypes import ABI
from .problems import OPS, Problem, plan
from .test_abi import FEATURES, on_cpu, served


def _seed(rng) -> int:
    return int(rng.integers(2**31))


def _execute(shim, p, handle, size):
    assert shim.call("Conv_Plan_Execute", p.execute_args(handle, size)) is None


def _assert_close(got, expected, dtype, what):
    tol = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    assert not np.isnan(got).any(), f"{what}: unwritten (NaN) elements"
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * max(1.0, np.abs(expected).max()), err_msg=what)


# ---------------------------------------------------------------------------------------------
# The benchmark policy x alpha


def _plain_result(p) -> np.ndarray:
    """The op's result before the epilogue, in float64 (no activation: backward ops)."""
    v, g = p.values, dict(p.geo)
    if p.op == ABI.CONV_BACKWARD_DATA:
        return ref.conv_backward_data(v["y"], v["w"], v["x"].shape, **g)
    if p.op == ABI.CONV_BACKWARD_WEIGHT:
        return ref.conv_backward_weight(v["x"], v["y"], v["w"].shape, **g)
    return ref.conv_forward(v["x"], v["w"], v.get("bias"), **g)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("alpha, beta", [(0.5, 0.0), (-1.5, 0.0), (0.5, 1.0), (-1.5, 1.0)])
def test_benchmark_policy_applies_alpha_and_beta_as_the_heuristic_does(shim, rng, op, dtype, alpha, beta):
    """Planned with FDNN_ALGO_BENCHMARK, executed twice into a poisoned (or old, with beta)
    output: alpha * result + beta * old each time, the bias gradient included."""
    on_cpu(shim)
    caps = served(shim, OPS[op], dtype)
    if not caps.features & FEATURES["ALPHA_BETA"]:
        pytest.skip(f"{dtype} {op}: no ALPHA_BETA reported")
    bias = op != "backward_data" and (op == "forward" or bool(caps.features & FEATURES["BIAS_GRADIENT"]))
    p = Problem(shim, op=op, dtype=dtype, alpha=alpha, beta=beta, bias=bias, policy=ABI.ALGO_BENCHMARK, seed=_seed(rng))
    old = {name: a.copy() for name, a in p.arrays.items()}
    expected = alpha * _plain_result(p) + beta * p.values[p.out]
    sum_axes = (0, *range(2, p.rank + 2))
    expected_db = alpha * p.values["y"].sum(axis=sum_axes) + beta * p.values["bias"] if p.writes_bias else None
    handle, size = plan(shim, p)
    try:
        for run in range(2):
            for name, a in old.items():  # the old output again: the second run reads it too
                p.arrays[name][...] = a
            _execute(shim, p, handle, size)
            _assert_close(p.result(), expected, dtype, f"{op}, run {run + 1}")
            if expected_db is not None:
                _assert_close(p.result("bias"), expected_db, dtype, f"{op} bias gradient, run {run + 1}")
    finally:
        shim.destroy(handle)


# ---------------------------------------------------------------------------------------------
# out = alpha * act(conv + bias) + beta * out


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


#: Activations that do not commute with scaling: act(alpha * v) != alpha * act(v).
NON_COMMUTING = {
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
    "gelu_erf": lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
    "silu": lambda v: v * _sigmoid(v),
    "relu": lambda v: np.maximum(v, 0),  # commutes with positive alpha only
}


@pytest.mark.parametrize("activation", sorted(NON_COMMUTING))
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("alpha, beta", [(-1.5, 0.0), (0.5, 0.0), (-0.75, 1.0), (0.25, 1.0)])
@pytest.mark.parametrize("policy", ["heuristic", "benchmark"])
def test_alpha_scales_the_activated_result(shim, rng, activation, dtype, alpha, beta, policy):
    """y = alpha * act(conv(x, w) + bias) + beta * y, never act(alpha * (conv + bias))."""
    on_cpu(shim)
    caps = served(shim, ABI.CONV_FORWARD, dtype)
    if not caps.features & FEATURES["ALPHA_BETA"]:
        pytest.skip(f"{dtype}: no ALPHA_BETA reported")
    if not caps.activations & (1 << ABI.group("ACTIVATION_")[activation.upper()]):
        pytest.skip(f"{activation} is not fused in {dtype}")
    algo = ABI.ALGO_BENCHMARK if policy == "benchmark" else ABI.ALGO_HEURISTIC
    kw = dict(dtype=dtype, alpha=alpha, beta=beta, bias=True, activation=activation, policy=algo)
    p = Problem(shim, **kw, seed=_seed(rng))
    v = p.values
    expected = alpha * NON_COMMUTING[activation](ref.conv_forward(v["x"], v["w"], v["bias"], **p.geo))
    expected = expected + beta * v["y"]
    handle, size = plan(shim, p)
    try:
        _execute(shim, p, handle, size)
    finally:
        shim.destroy(handle)
    _assert_close(p.result(), expected, dtype, f"alpha {alpha} * {activation}(conv + bias) + {beta} * y")
