"""The epilogue of the header (issue 23), on every shim library through ctypes:

  - the benchmark policy computes what the heuristic computes: with alpha != 1 every float32
    backward-data and backward-weight plan the oneDNN shim timed scaled its result by a float
    read from freed memory (the timed candidate's alpha, bound before the plan moved);
  - out = alpha * act(conv + bias) + beta * out, one meaning on every shim, checked with
    activations that do not commute with scaling and negative or fractional alpha.

Inputs are fresh random values per run (the `rng` fixture prints the seed), outputs are
poisoned with NaN unless beta reads them, and the float64 reference is computed here."""

from __future__ import annotations

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
